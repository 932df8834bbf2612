"""The subset of Go's text/template that `template` records are written in: what Go renders,
what it refuses when parsing, and what fails when it runs (each expectation is Go's)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from toposdns.serve.go_template import (
    MAX_OUTPUT,
    Fields,
    RenderError,
    TemplateError,
    parse,
    render,
)


class Data(Fields):
    """CoreDNS's templateData for ip-10-95-12-8.example. A, matched by
    `^ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$`."""

    type_name = "*template.templateData"
    values: dict[str, object] = {
        "Zone": "example.",
        "Name": "ip-10-95-12-8.example.",
        "Class": "IN",
        "Type": "A",
        "Match": ["ip-10-95-12-8.example.", "95", "12", "8"],
        "Group": {"0": "ip-10-95-12-8.example.", "1": "95", "2": "12", "3": "8", "b": "95"},
        "Remote": "10.240.0.1",
    }

    def field(self, name: str) -> object:
        return self.values[name] if name in self.values else super().field(name)

    def method(self, name: str) -> Callable[..., object] | None:
        return (lambda key: "") if name == "Meta" else None


# (template, what it renders)
RENDERS = [
    ("{{ .Name }} 60 IN A 10.{{ .Group.b }}", "ip-10-95-12-8.example. 60 IN A 10.95"),
    ('{{ index .Match 1 }}.{{ index .Group "2" }}', "95.12"),
    ("10.{{ parseInt .Group.b 16 8 }}", "10.149"),
    ('{{ parseInt "0x1f" 0 8 }} {{ parseInt "017" 0 8 }} {{ parseInt "z" 36 0 }}', "31 15 35"),
    ("{{ .Group.missing }}", "<no value>"),  # a missing map key read as a field
    ('[{{ index .Group "missing" }}]', "[]"),  # ... and by index: the zero value
    ('{{ .Meta "foo" }}{{ .Name }}', "ip-10-95-12-8.example."),
    ("{{ .Match }}", "[ip-10-95-12-8.example. 95 12 8]"),
    ("{{ len .Match }} {{ len .Name }}", "4 22"),
    ('{{ print 1 2 "a" 3 }}', "1 2a3"),
    ("{{ println .Class .Type }}", "IN A\n"),
    (
        '{{ printf "%03d|%-4s|%x|%X|%q|%v|%5.2s" 7 .Class 255 "ab" .Type true .Zone }}',
        '007|IN  |ff|6162|"A"|true|   ex',
    ),
    ('{{ printf "%d" .Name }}', "%!d(string=ip-10-95-12-8.example.)"),
    ('{{ printf "%s %s" .Name }}', "ip-10-95-12-8.example. %!s(MISSING)"),
    ('{{ .Name | printf "<%s>" }}', "<ip-10-95-12-8.example.>"),
    ('{{ if eq .Type "A" "AAAA" }}address{{ else }}other{{ end }}', "address"),
    ('{{ if ne .Type "A" }}x{{ else if eq .Class "IN" }}in{{ else }}y{{ end }}', "in"),
    ("{{ if and .Name (lt 1 2) (not false) }}yes{{ end }}", "yes"),
    ('{{ or .Group.missing "fallback" }}', "fallback"),
    (
        "{{ with .Group.b }}b={{ . }}{{ end }}{{ with .Group.none }}x{{ else }}none{{ end }}",
        "b=95none",
    ),
    ("{{ $.Zone }}", "example."),
    ('a  {{- " b " -}}  c {{/* a comment */}}d', "a b c d"),
    ("{{- /* trimmed */ -}} x", "x"),
    ('{{ `raw \\n` }}{{ "\\x41\\u00e9\\t" }}', "raw \\nAé\t"),
    ("{{ (index .Match 2) }}", "12"),
    ("{{ 0x10 }} {{ -3 }} {{ 1_000 }}", "16 -3 1000"),
    ('{{ "}}" }}', "}}"),
]


@pytest.mark.parametrize(("text", "rendered"), RENDERS)
def test_renders_as_go_does(text: str, rendered: str) -> None:
    assert render(parse(text), Data()) == rendered


# (template, the parse tree as Go prints it: the metrics' `template` label)
SOURCES = [
    ("{{ .Name }} 60 IN A 10.{{ .Group.b }}", "{{.Name}} 60 IN A 10.{{.Group.b}}"),
    ("{{  parseInt   .Group.b 16 8 }}", "{{parseInt .Group.b 16 8}}"),
    ('{{ .Name | printf "%s" }}', '{{.Name | printf "%s"}}'),
    ('{{ if eq .Type "A" }}a{{ else }}b{{ end }}', '{{if eq .Type "A"}}a{{else}}b{{end}}'),
    ("x {{- /* c */ -}} y", "x{{/* c */}}y"),
    ("{{ (index .Match 1) }}", "{{(index .Match 1)}}"),
]


@pytest.mark.parametrize(("text", "source"), SOURCES)
def test_the_tree_prints_as_go_prints_it(text: str, source: str) -> None:
    assert "".join(node.source() for node in parse(text)) == source


# (template, what parsing it says): Go's refusals, then what this subset leaves out
REFUSED = [
    ("{{", "unclosed action"),
    ("{{ .Name", "unclosed action"),
    ("{{ }}", "missing value for command"),
    ("{{ notAFunction }}", 'function "notAFunction" not defined'),
    ("{{ end }}", "unexpected {{end}}"),
    ("{{ else }}", "unexpected {{else}}"),
    ("{{ if .Name }}x", "unexpected EOF in if"),
    ('{{ .Name | "x" }}', "non executable command in pipeline stage 2"),
    ('{{ "abc }}', "unterminated quoted string"),
    ('{{ "\\q" }}', "invalid syntax"),
    ("{{/* open", "unclosed comment"),
    ("{{ # }}", "unrecognized character in action"),
    ("{{ range .Match }}{{ . }}{{ end }}", "{{range}} is not supported here"),
    ('{{ define "x" }}{{ end }}', "{{define}} is not supported here"),
    ('{{ template "x" }}', "{{template}} is not supported here"),
    ("{{ $x := .Name }}", "undefined variable '$x'"),
    ("{{ html .Name }}", "function 'html' is not supported here"),
    ("{{ 1.5 }}", "number 1.5 is not supported here"),
    ("{{ 'a' }}", "character constants ('a') are not supported here"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused_when_parsed(text: str, message: str) -> None:
    with pytest.raises(TemplateError) as error:
        parse(text)
    assert message in str(error.value)


# (template, what running it says): Go finds these only when it executes
FAILS = [
    ("{{ index .Match 4 }}", "index out of range: 4"),
    ("{{ .Grup.d }}", "can't evaluate field Grup in type *template.templateData"),
    ("{{ .Name.x }}", "can't evaluate field x in type string"),
    ('{{ parseInt "gg" 16 8 }}', 'parsing "gg": invalid syntax'),
    ('{{ parseInt "300" 10 8 }}', 'parsing "300": value out of range'),
    ('{{ parseInt "1" 1 8 }}', "invalid base 1"),
    ('{{ parseInt "1" 10 65 }}', "invalid bit size 65"),
    ("{{ parseInt }}", "wrong number of args for parseInt"),
    ("{{ parseInt .Group.missing 10 8 }}", "expected string"),
    ("{{ nil }}", "nil is not a command"),
    ("{{ .Name 1 }}", "Name has arguments but cannot be invoked as function"),
    ("{{ lt .Name 1 }}", "incompatible types for comparison"),
    ('{{ printf "%2000d" 1 }}', "over 1024"),
]


@pytest.mark.parametrize(("text", "message"), FAILS)
def test_fails_when_run(text: str, message: str) -> None:
    nodes = parse(text)
    with pytest.raises(RenderError) as error:
        render(nodes, Data())
    assert message in str(error.value)


def test_a_rendering_is_bounded() -> None:
    nodes = parse("{{ .Name }}" * (MAX_OUTPUT // 20 + 1))
    with pytest.raises(RenderError, match="renders more than"):
        render(nodes, Data())
