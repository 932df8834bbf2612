"""CoreDNS's `template` plugin: its own test tables (plugin/template/setup_test.go,
template_test.go, cname_test.go of CoreDNS 1.14) as data, through the Corefile reader and the
handler; then what toposdns adds (RE2 regexes, the Go template subset's bounds, the metrics).

The handler cases left out are listed in docs/coredns-compatibility.md ("template")."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import dnslib
import pytest

from tests.helpers import snapshot_of
from tests.objects import SHOP_WEB
from toposdns.config import ServeConfig
from toposdns.corefile import read_corefile
from toposdns.metrics import TEMPLATE_FAILURES, TEMPLATE_MATCHES, TEMPLATE_RR_FAILURES
from toposdns.options import ConfigError
from toposdns.serve.blocks import BlockConfig, block_chain
from toposdns.serve.chain import Reply, Request
from toposdns.serve.template import MAX_CHASE, TemplateOptions, Templates, make_template
from toposdns.serve.transport import UDP4, Transport
from toposdns.server import DnsServer
from toposdns.wire.decode import decode_query

#: setup_test.go's server block keys.
KEYS = "domain.com.:8053 dynamic.domain.com.:8053"

# setup_test.go, TestSetup and TestSetupParse: (the template directives, refused?)
SETUP = [
    ("template ANY ANY {\n rcode\n}", True),
    ("template ANY ANY {\n rcode NXDOMAIN\n}", False),
    ("template", True),
    ("template X", True),
    ("template ANY", True),
    ("template ANY X", True),
    ("template ANY ANY .* {\n notavailable\n}", True),
    ("template ANY ANY {\n answer\n}", True),
    ("template ANY ANY {\n additional\n}", True),
    ("template ANY ANY {\n rcode\n}", True),
    ("template ANY ANY {\n rcode UNDEFINED\n}", True),
    ('template ANY ANY {\n answer "{{"\n}', True),
    ('template ANY ANY {\n additional "{{"\n}', True),
    ('template ANY ANY {\n authority "{{"\n}', True),
    ('template ANY ANY {\n answer "{{ notAFunction }}"\n}', True),
    (
        'template ANY ANY {\n answer "{{ parseInt }}"\n additional "{{ parseInt }}"\n'
        ' authority "{{ parseInt }}"\n}',
        False,
    ),
    ("template ANY ANY (?P<x>", False),
    ("template ANY ANY {\n\n}", False),
    (
        "template ANY A example.com {\n"
        " match ip-(?P<a>[0-9]*)-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]com\n"
        ' answer "{{ .Name }} A {{ .Group.a }}.{{ .Group.b }}.{{ .Group.c }}.{{ .Grup.d }}."\n'
        " fallthrough\n}",
        False,
    ),
    (
        "template ANY AAAA example.com {\n"
        " match ip-(?P<a>[0-9]*)-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]com\n"
        ' authority "example.com 60 IN SOA ns.example.com hostmaster.example.com'
        ' (1 60 60 60 60)"\n'
        " fallthrough\n}",
        False,
    ),
    (
        "template IN ANY example.com {\n"
        ' match "[.](example[.]com[.]dc1[.]example[.]com[.])$"\n'
        " rcode NXDOMAIN\n"
        ' authority "{{ index .Match 1 }} 60 IN SOA ns.{{ index .Match 1 }}'
        ' hostmaster.example.com (1 60 60 60 60)"\n'
        " fallthrough example.com\n}",
        False,
    ),
    (
        "template IN A example {\n"
        " match ^ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$\n"
        ' answer "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"\n'
        "}\n"
        "template IN MX example. {\n"
        " match ^ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$\n"
        ' answer "{{ .Name }} 60 IN MX 10 {{ .Name }}"\n'
        ' additional "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"\n'
        "}",
        False,
    ),
    (
        "template IN A example {\n"
        " match ^ip0a(?P<b>[a-f0-9]{2})(?P<c>[a-f0-9]{2})(?P<d>[a-f0-9]{2})[.]example[.]$\n"
        ' answer "{{ .Name }} 3600 IN A 10.{{ parseInt .Group.b 16 8 }}.'
        '{{ parseInt .Group.c 16 8 }}.{{ parseInt .Group.d 16 8 }}"\n'
        "}",
        False,
    ),
    (
        "template IN MX example {\n"
        " match ^ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$\n"
        ' answer "{{ .Name }} 60 IN MX 10 {{ .Name }}"\n'
        ' additional "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"\n'
        ' authority  "example. 60 IN NS ns0.example."\n'
        ' authority  "example. 60 IN NS ns1.example."\n'
        ' additional "ns0.example. 60 IN A 203.0.113.8"\n'
        ' additional "ns1.example. 60 IN A 198.51.100.8"\n'
        "}",
        False,
    ),
    (
        "template ANY ANY invalid {\n"
        " rcode NXDOMAIN\n"
        ' authority "invalid. 60 {{ .Class }} SOA ns.invalid. hostmaster.invalid.'
        ' (1 60 60 60 60)"\n'
        ' ederror 21 "Blocked according to RFC2606"\n'
        "}",
        False,
    ),
    (
        "template ANY ANY invalid {\n"
        " rcode NXDOMAIN\n"
        ' authority "invalid. 60 {{ .Class }} SOA ns.invalid. hostmaster.invalid.'
        ' (1 60 60 60 60)"\n'
        ' ederror invalid "Blocked according to RFC2606"\n'
        "}",
        True,
    ),
    (
        "template ANY ANY invalid {\n"
        " rcode NXDOMAIN\n"
        ' authority "invalid. 60 {{ .Class }} SOA ns.invalid. hostmaster.invalid.'
        ' (1 60 60 60 60)"\n'
        " ederror too many arguments\n"
        "}",
        True,
    ),
    # TestSetupParseLargeRegex
    ("template ANY A example.com {\n match " + "a" * 10001 + "\n}", True),
]


def corefile(tmp_path: Path, directives: str, keys: str = KEYS) -> Path:
    path = tmp_path / "Corefile"
    path.write_text(f"{keys} {{\n kubernetes cluster.local\n{directives}\n}}\n")
    return path


def read(tmp_path: Path, directives: str, keys: str = KEYS) -> ServeConfig:
    return read_corefile(corefile(tmp_path, directives, keys)).done()


@pytest.mark.parametrize(("directives", "refused"), SETUP)
def test_coredns_setup_table(tmp_path: Path, directives: str, refused: bool) -> None:
    if not refused:
        assert read(tmp_path, directives).template.enabled
        return
    with pytest.raises(ConfigError) as error:
        read(tmp_path, directives)
    # Each refusal names the file and the line of the template's directive or option.
    assert str(error.value).startswith(f"{tmp_path / 'Corefile'}:")


def test_errors_say_what_is_wrong_and_where(tmp_path: Path) -> None:
    cases = {
        "template ANY ANY {\n rcode nxdomain\n}": ":4: rcode nxdomain: unknown rcode nxdomain",
        "template ANY ANY {\n match (a\n}": ":4: match (a: could not parse regex '(a': missing )",
        'template ANY ANY {\n answer "{{ .Name"\n}': "unclosed action",
        'template ANY ANY {\n answer "{{ range .Match }}{{ end }}"\n}': "{{range}} is not",
        "template ANY ANY {\n match " + "a" * 10001 + "\n}": "regex pattern too long: 10001",
        "template IN a": "invalid RR type a",
        "template ANY ANY {\n var ip 1\n}": "not an option of template; supported: additional",
    }
    for directives, message in cases.items():
        with pytest.raises(ConfigError) as error:
            read(tmp_path, directives)
        assert message in str(error.value), (directives, str(error.value))


def test_a_template_is_read_as_written(tmp_path: Path) -> None:
    config = read(
        tmp_path,
        "template IN ANY example.com Other.org {\n"
        ' match "^a[.]" "^b[.]"\n'
        " rcode NXDOMAIN\n"
        ' authority "example.com. 60 IN NS ns.example.com."\n'
        ' ederror 21 "Blocked"\n'
        " fallthrough example.com\n"
        "}\n"
        "template ANY A {\n}",
    )
    first, second = config.template.templates
    assert (first.qclass, first.qtype) == (1, 255)
    assert first.zones == (("example", "com"), ("other", "org"))
    assert first.patterns == ("^a[.]", "^b[.]")
    assert (first.rcode, first.ederror, first.fallthrough) == (
        3,
        (21, "Blocked"),
        (("example", "com"),),
    )
    assert first.authority == ("example.com. 60 IN NS ns.example.com.",)
    assert first.place.endswith("Corefile:3")
    assert (second.qclass, second.qtype, second.zones, second.fallthrough) == (255, 1, (), None)


# ----- template_test.go, TestHandler: each template alone, with `fallthrough`, for every zone

#: A template of TestHandler: its rules (a template block's lines) and CLASS TYPE.
EXAMPLE_A = (
    'match "(^|[.])ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$"\n'
    'answer "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"'
)
TEMPLATES = {
    "exampleDomainA": ("ANY ANY", EXAMPLE_A),
    "exampleDomainAParseInt": (
        "ANY ANY",
        'match "^ip0a(?P<b>[a-f0-9]{2})(?P<c>[a-f0-9]{2})(?P<d>[a-f0-9]{2})[.]example[.]$"\n'
        'answer "{{ .Name }} 60 IN A 10.{{ parseInt .Group.b 16 8 }}.'
        '{{ parseInt .Group.c 16 8 }}.{{ parseInt .Group.d 16 8 }}"',
    ),
    "exampleDomainIPA": ("IN A", 'match ".*"\nanswer "{{ .Name }} 60 IN A {{ .Remote }}"'),
    "exampleDomainANS": (
        "ANY ANY",
        EXAMPLE_A + '\nadditional "ns0.example. IN A 203.0.113.8"\n'
        'authority "example. IN NS ns0.example.com."',
    ),
    "exampleDomainMX": (
        "ANY ANY",
        'match "(^|[.])ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$"\n'
        'answer "{{ .Name }} 60 MX 10 {{ .Name }}"\n'
        'additional "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"',
    ),
    "invalidDomain": (
        "ANY ANY",
        'match "[.]invalid[.]$"\nrcode NXDOMAIN\n'
        'answer "invalid. 60 {{ .Class }} SOA a.invalid. b.invalid. (1 60 60 60 60)"',
    ),
    "rcodeServfail": ("ANY ANY", 'match ".*"\nrcode SERVFAIL'),
    "broken": (
        "ANY ANY",
        'match "[.]example[.]$"\nanswer "{{ .Name }} 60 IN TXT \\"{{ index .Match 2 }}\\""',
    ),
    "brokenParseInt": (
        "ANY ANY",
        'match "[.]example[.]$"\nanswer "{{ .Name }} 60 IN TXT \\"{{ parseInt \\"gg\\" 16 8 }}\\""',
    ),
    "nonRR": ("ANY ANY", 'match "[.]example[.]$"\nanswer "{{ .Name }}"'),
    "nonRRAdditional": ("ANY ANY", 'match "[.]example[.]$"\nadditional "{{ .Name }}"'),
    "nonRRAuthority": ("ANY ANY", 'match "[.]example[.]$"\nauthority "{{ .Name }}"'),
    "cname": (
        "ANY ANY",
        'match "example[.]net[.]"\nanswer "example.net 60 IN CNAME target.example.com"',
    ),
    "mdMissing": (
        "ANY ANY",
        'match "(^|[.])ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$"\n'
        'answer "{{ .Meta \\"foofoo\\" }}{{ .Name }} 60 IN A '
        '10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"',
    ),
    "templateWithEDE": (
        "ANY ANY",
        'match ".*"\nrcode NXDOMAIN\n'
        'authority "invalid. 60 {{ .Class }} SOA ns.invalid. hostmaster.invalid. (1 60 60 60 60)"\n'
        'ederror 21 "Blocked due to RFC2606"',
    ),
}

#: What the next plugin gives: CoreDNS's test uses rcode 3841 to tell a fall through.
PASSED_ON = b"passed on"

# (case, template, qname, qclass, qtype, expected: PASSED_ON, or (rcode, answer types,
# authority types, additional types), the failure metric the case counts)
HANDLER = [
    ("RcodeServFail", "rcodeServfail", "test.invalid.", 0, 0, (2, [], [], []), None),
    ("ExampleDomainNameMismatch", "exampleDomainA", "test.invalid.", 1, 1, PASSED_ON, None),
    ("BrokenTemplate", "broken", "test.example.", 1, 255, (2, [], [], []), "template"),
    ("NonRRTemplate", "nonRR", "test.example.", 1, 255, (2, [], [], []), "rr"),
    ("NonRRAdditionalTemplate", "nonRRAdditional", "test.example.", 1, 255, (2, [], [], []), "rr"),
    ("NonRRAuthorityTemplate", "nonRRAuthority", "test.example.", 1, 255, (2, [], [], []), "rr"),
    (
        "ExampleIPMatch",
        "exampleDomainIPA",
        "test.example.",
        1,
        1,
        (0, ["A 10.240.0.1"], [], []),
        None,
    ),
    (
        "ExampleDomainMatch",
        "exampleDomainA",
        "ip-10-95-12-8.example.",
        1,
        1,
        (0, ["A 10.95.12.8"], [], []),
        None,
    ),
    (
        "ExampleDomainMatchHexIp",
        "exampleDomainAParseInt",
        "ip0a5f0c09.example.",
        1,
        1,
        (0, ["A 10.95.12.9"], [], []),
        None,
    ),
    (
        "BrokenParseIntTemplate",
        "brokenParseInt",
        "test.example.",
        1,
        255,
        (2, [], [], []),
        "template",
    ),
    (
        "ExampleDomainMXMatch",
        "exampleDomainMX",
        "ip-10-95-12-8.example.",
        1,
        15,
        (0, ["MX 10 ip-10-95-12-8.example."], [], ["A 10.95.12.8"]),
        None,
    ),
    (
        "ExampleDomainANSMatch",
        "exampleDomainANS",
        "ip-10-95-12-8.example.",
        1,
        1,
        (0, ["A 10.95.12.8"], ["NS ns0.example.com."], ["A 203.0.113.8"]),
        None,
    ),
    (
        "ExampleInvalidNXDOMAIN",
        "invalidDomain",
        "test.invalid.",
        1,
        15,
        (3, ["SOA a.invalid. b.invalid. 1 60 60 60 60"], [], []),
        None,
    ),
    (
        "CNAMEWithoutUpstream",
        "cname",
        "example.net.",
        1,
        1,
        (0, ["CNAME target.example.com."], [], []),
        None,
    ),
    (
        "mdMissing",
        "mdMissing",
        "ip-10-95-12-8.example.",
        1,
        1,
        (0, ["A 10.95.12.8"], [], []),
        None,
    ),
    (
        "EDNS error",
        "templateWithEDE",
        "test.invalid.",
        1,
        1,
        (3, [], ["SOA ns.invalid. hostmaster.invalid. 1 60 60 60 60"], []),
        None,
    ),
]


def templates_of(tmp_path: Path, text: str, keys: str = ".:8053", **kw: Any) -> Templates:
    config = read(tmp_path, text, keys)
    handler = make_template(config.template, config.block_zones, **kw)
    assert handler is not None
    return handler


def handler_of(tmp_path: Path, template: str) -> Templates:
    """A TestHandler template alone, falling through for every name, as the Go test's."""
    header, rules = TEMPLATES[template]
    return templates_of(tmp_path, f"template {header} {{\n{rules}\nfallthrough\n}}")


def request_of(
    qname: str, qclass: int = 1, qtype: int = 1, edns: bool = False, source: str = "10.240.0.1"
) -> Request:
    record = dnslib.DNSRecord(q=dnslib.DNSQuestion(qname, qtype, qclass))
    if edns:
        record.add_ar(dnslib.EDNS0(udp_len=1232))
    data = bytes(record.pack())
    return Request(decode_query(data), data, UDP4, source)


def passed_on(request: Request) -> Reply:
    return PASSED_ON


def texts(records: list[Any]) -> list[str]:
    """Each record's type and rdata (the OPT record left out)."""
    return [f"{dnslib.QTYPE[rr.rtype]} {rr.rdata.toZone()}" for rr in records if rr.rtype != 41]


def counted(metric: Any, case: str) -> float:
    return sum(s.value for m in metric.collect() for s in m.samples if s.name.endswith("_total"))


@pytest.mark.parametrize(
    ("case", "template", "qname", "qclass", "qtype", "expected", "failure"),
    HANDLER,
    ids=[case[0] for case in HANDLER],
)
def test_coredns_handler_table(
    tmp_path: Path,
    case: str,
    template: str,
    qname: str,
    qclass: int,
    qtype: int,
    expected: Any,
    failure: str | None,
) -> None:
    handler = handler_of(tmp_path, template)
    metric = {"template": TEMPLATE_FAILURES, "rr": TEMPLATE_RR_FAILURES}.get(failure or "")
    before = counted(metric, case) if metric is not None else 0.0
    reply = handler.serve(request_of(qname, qclass, qtype), passed_on)
    if expected is PASSED_ON:
        assert reply == PASSED_ON
        return
    assert isinstance(reply, bytes)
    message = dnslib.DNSRecord.parse(reply)
    rcode, answer, authority, additional = expected
    assert message.header.rcode == rcode
    assert (texts(message.rr), texts(message.auth), texts(message.ar)) == (
        answer,
        authority,
        additional,
    )
    # CoreDNS's answers are authoritative; the SERVFAILs its server writes are not.
    assert message.header.aa == (rcode != 2)
    if metric is not None:
        assert counted(metric, case) == before + 1
    if case == "EDNS error":  # an OPT (4096, DO) with the Extended DNS Error 21 and its text
        (opt,) = [rr for rr in message.ar if rr.rtype == 41]
        assert (opt.rclass, opt.ttl) == (4096, 0x8000)
        assert [(o.code, o.data) for o in opt.rdata] == [(15, b"\x00\x15Blocked due to RFC2606")]
    elif message.ar:
        assert 41 not in [rr.rtype for rr in message.ar]  # the query had none


def test_the_names_in_an_answer_are_those_rendered(tmp_path: Path) -> None:
    handler = handler_of(tmp_path, "mdMissing")
    reply = handler.serve(request_of("IP-10-95-12-8.Example."), passed_on)
    assert isinstance(reply, bytes)
    (answer,) = dnslib.DNSRecord.parse(reply).rr
    # `.Name` is the name in lower case, as CoreDNS's state.Name() gives it.
    assert str(answer.rname) == "ip-10-95-12-8.example."


# ----- template_test.go, TestMultiSection: several templates in one block, for `test.`

MULTI_SECTION = """\
template IN A {
  rcode REFUSED
}
template IN TXT {
  match "$^"
  rcode SERVFAIL
  fallthrough
}
template CH TXT coredns.invalid {
  answer "{{ .Name }} 60 CH TXT \\"test\\""
}
template IN A example {
  match ^ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$
  answer "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"
  fallthrough
}
template IN MX example {
  match ^ip-10-(?P<b>[0-9]*)-(?P<c>[0-9]*)-(?P<d>[0-9]*)[.]example[.]$
  answer "{{ .Name }} 60 IN MX 10 {{ .Name }}"
  additional "{{ .Name }} 60 IN A 10.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"
}
"""

# (qname, qclass, qtype, PASSED_ON or (rcode, answer types))
MULTI = [
    ("some.test.", 1, 1, (5, [])),
    ("some.test.", 1, 16, PASSED_ON),
    ("coredns.invalid.", 3, 16, (0, ["TXT"])),
    ("ip-10-11-12-13.example.", 1, 1, (0, ["A"])),
    ("ip-10-11-12-13.example.", 1, 15, (0, ["MX"])),
    ("something.example.", 1, 1, PASSED_ON),
    ("something.example.", 1, 15, (2, [])),
]


@pytest.mark.parametrize(("qname", "qclass", "qtype", "expected"), MULTI)
def test_coredns_multi_section(
    tmp_path: Path, qname: str, qclass: int, qtype: int, expected: Any
) -> None:
    handler = templates_of(tmp_path, MULTI_SECTION, keys="test.:8053")
    reply = handler.serve(request_of(qname, qclass, qtype), passed_on)
    if expected is PASSED_ON:
        assert reply == PASSED_ON
        return
    assert isinstance(reply, bytes)
    message = dnslib.DNSRecord.parse(reply)
    assert (message.header.rcode, [dnslib.QTYPE[rr.rtype] for rr in message.rr]) == expected
    if qclass == 3:  # rendered in CH, written in CH
        assert message.rr[0].rclass == 3 and message.rr[0].rdata.toZone() == '"test"'


# ----- cname_test.go: a CNAME answer to A is followed through the server (a stand-in here)


def test_coredns_truncated_cname(tmp_path: Path) -> None:
    asked: list[tuple[str, int]] = []

    def lookup(data: bytes, transport: Transport, source: str) -> Reply:
        query = dnslib.DNSRecord.parse(data)
        asked.append((str(query.q.qname), query.q.qtype))
        reply = query.reply()
        reply.header.tc = 1
        reply.add_answer(*dnslib.RR.fromZone("test.up. 600 IN A 1.2.3.4"))
        return bytes(reply.pack())

    handler = templates_of(
        tmp_path,
        'template IN A test {\n match "^cname\\.test\\.$"\n'
        ' answer "cname.test. 600 IN CNAME test.up"\n}',
        lookup=lookup,
    )
    reply = handler.serve(request_of("cname.test."), passed_on)
    assert isinstance(reply, bytes)
    message = dnslib.DNSRecord.parse(reply)
    assert asked == [("test.up.", 1)]
    assert message.header.tc == 1
    assert [str(rr) for rr in message.rr] == [
        "cname.test.             600     IN      CNAME   test.up.",
        "test.up.                600     IN      A       1.2.3.4",
    ]


def test_a_cname_lookup_that_waits_for_an_upstream_completes_the_reply(tmp_path: Path) -> None:
    async def later(data: bytes) -> bytes:
        reply = dnslib.DNSRecord.parse(data).reply()
        reply.add_answer(*dnslib.RR.fromZone("test.up. 600 IN A 1.2.3.4"))
        return bytes(reply.pack())

    handler = templates_of(
        tmp_path,
        'template IN A test {\n answer "cname.test. 600 IN CNAME test.up"\n}',
        lookup=lambda data, transport, source: later(data),
    )
    pending = handler.serve(request_of("cname.test."), passed_on)
    assert isinstance(pending, Coroutine)
    try:
        pending.send(None)
    except StopIteration as done:
        reply = done.value
    message = dnslib.DNSRecord.parse(reply)
    assert [dnslib.QTYPE[rr.rtype] for rr in message.rr] == ["CNAME", "A"]
    assert message.header.tc == 0


def test_a_cname_to_itself_is_followed_a_bounded_number_of_times(tmp_path: Path) -> None:
    calls = []
    handler: Templates | None = None

    def lookup(data: bytes, transport: Transport, source: str) -> Reply:
        calls.append(1)
        assert handler is not None
        inner = Request(decode_query(data), data, transport, source)
        return handler.serve(inner, passed_on)

    handler = templates_of(
        tmp_path,
        'template IN A test {\n answer "{{ .Name }} 60 IN CNAME {{ .Name }}"\n}',
        lookup=lookup,
    )
    reply = handler.serve(request_of("loop.test."), passed_on)
    assert isinstance(reply, bytes)
    assert len(calls) == MAX_CHASE
    assert len(dnslib.DNSRecord.parse(reply).rr) == MAX_CHASE + 1


# ----- what toposdns adds


def test_matches_are_counted_with_coredns_labels(tmp_path: Path) -> None:
    handler = templates_of(
        tmp_path,
        "template ANY ANY reddog.microsoft.com {\n rcode NXDOMAIN\n}",
        server=lambda: "dns://:1053",
    )
    labels = ("dns://:1053", "reddog.microsoft.com.", "", "IN", "AAAA")
    before = TEMPLATE_MATCHES.labels(*labels)._value.get()
    reply = handler.serve(request_of("a.reddog.microsoft.com.", qtype=28), passed_on)
    assert isinstance(reply, bytes) and dnslib.DNSRecord.parse(reply).header.rcode == 3
    assert TEMPLATE_MATCHES.labels(*labels)._value.get() == before + 1


def test_a_failure_is_labelled_with_the_template_as_go_prints_it(tmp_path: Path) -> None:
    handler = templates_of(
        tmp_path,
        'template IN A fail.example {\n answer "{{  index   .Match 3 }} 60 IN A 10.0.0.1"\n}',
    )
    labels = (
        "dns://:53",
        "fail.example.",
        "",
        "IN",
        "A",
        "answer",
        "{{index .Match 3}} 60 IN A 10.0.0.1",
    )
    before = TEMPLATE_FAILURES.labels(*labels)._value.get()
    handler.serve(request_of("x.fail.example."), passed_on)
    assert TEMPLATE_FAILURES.labels(*labels)._value.get() == before + 1


AKS = """\
template ANY ANY internal.cloudapp.net {
  match "^(?:[^.]+\\.){4,}internal\\.cloudapp\\.net\\.$"
  rcode NXDOMAIN
  fallthrough
}
template ANY ANY reddog.microsoft.com {
  rcode NXDOMAIN
}
"""

# AKS's default templates: (name, PASSED_ON or the rcode)
AKS_NAMES = [
    ("a.b.c.d.internal.cloudapp.net.", 3),
    ("a.b.c.d.e.internal.cloudapp.net.", 3),
    ("A.B.C.D.Internal.CloudApp.Net.", 3),
    ("b.c.d.internal.cloudapp.net.", PASSED_ON),
    ("vm1.internal.cloudapp.net.", PASSED_ON),
    ("internal.cloudapp.net.", PASSED_ON),
    ("reddog.microsoft.com.", 3),
    ("x.y.reddog.microsoft.com.", 3),
    ("web.shop.svc.cluster.local.", PASSED_ON),
    ("example.org.", PASSED_ON),
]


@pytest.mark.parametrize(("name", "expected"), AKS_NAMES)
def test_aks_default_templates(tmp_path: Path, name: str, expected: Any) -> None:
    handler = templates_of(tmp_path, AKS)
    for edns in (False, True):
        reply = handler.serve(request_of(name, edns=edns), passed_on)
        if expected is PASSED_ON:
            assert reply == PASSED_ON
            continue
        assert isinstance(reply, bytes)
        message = dnslib.DNSRecord.parse(reply)
        assert (message.header.rcode, message.header.aa, message.rr, message.auth) == (
            expected,
            1,
            [],
            [],
        )
        # The query's OPT record is echoed, as CoreDNS's server writes every reply.
        assert [rr.rtype for rr in message.ar] == ([41] if edns else [])


def test_a_pathological_regex_takes_linear_time(tmp_path: Path) -> None:
    # (a+)+$ backtracks exponentially in Python's `re`; RE2 matches it in one pass.
    handler = templates_of(tmp_path, 'template IN A {\n match "^(a+)+$"\n fallthrough\n}')
    name = "a" * 60 + "." + "a" * 60 + "." + "a" * 60 + "." + "a" * 60 + "b."
    assert handler.serve(request_of(name), passed_on) == PASSED_ON


def test_odd_bytes_in_the_name_are_escaped_as_coredns_escapes_them(tmp_path: Path) -> None:
    handler = templates_of(
        tmp_path,
        'template IN TXT {\n answer "{{ .Name }} 60 IN TXT \\"{{ .Name }}\\""\n}',
    )
    record = dnslib.DNSRecord(q=dnslib.DNSQuestion("x.example.", 16))
    record.q.qname = dnslib.DNSLabel([b"a;b (c)", b"\x01", b"example"])
    data = bytes(record.pack())
    reply = handler.serve(Request(decode_query(data), data, UDP4, "10.0.0.1"), passed_on)
    assert isinstance(reply, bytes)
    (answer,) = dnslib.DNSRecord.parse(reply).rr
    assert answer.rname.label == (b"a;b (c)", b"\x01", b"example")
    # In the TXT's quotes the escapes are read back: the name's bytes again.
    assert answer.rdata.data == [b"a;b (c).\x01.example."]


def test_a_block_without_kubernetes_answers_from_its_templates(tmp_path: Path) -> None:
    path = tmp_path / "Corefile"
    path.write_text(
        ".:8053 {\n kubernetes cluster.local\n}\n"
        'example.org:8053 {\n template IN A {\n  answer "{{ .Name }} 60 IN A 192.0.2.1"\n }\n}\n'
    )
    config = read_corefile(path).done()
    (block,) = config.blocks
    assert isinstance(block, BlockConfig) and block.template.enabled
    link, handlers = block_chain(block, None)
    assert [handler.name for handler in handlers] == ["template"]
    reply = link(request_of("www.example.org."))
    assert isinstance(reply, bytes)
    assert texts(dnslib.DNSRecord.parse(reply).rr) == ["A 192.0.2.1"]
    # A name it does not match goes on: the end of the chain, SERVFAIL as CoreDNS's.
    other = link(request_of("www.example.org.", qtype=28))
    assert isinstance(other, bytes) and dnslib.DNSRecord.parse(other).header.rcode == 2


def test_a_field_the_data_lacks_is_accepted_and_named_once_at_startup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # setup_test.go accepts `.Grup.d` (Go finds it only when it runs): so does toposdns, and
    # says at startup that the queries it matches will fail.
    with caplog.at_level("WARNING", logger="toposdns"):
        handler = templates_of(
            tmp_path,
            'template IN A example {\n answer "{{ .Name }} 60 IN A {{ .Grup.d }}"\n}',
        )
    (line,) = [r.getMessage() for r in caplog.records if "Grup" in r.getMessage()]
    assert "Corefile:3" in line and "reads .Grup" in line
    caplog.clear()
    with caplog.at_level("WARNING", logger="toposdns"):
        for _ in range(3):
            reply = handler.serve(request_of("a.example."), passed_on)
            assert isinstance(reply, bytes) and dnslib.DNSRecord.parse(reply).header.rcode == 2
    # Its failure is logged once, not once per query.
    assert len([r for r in caplog.records if "SERVFAIL" in r.getMessage()]) == 1


def serve_corefile(tmp_path: Path, directives: str) -> DnsServer:
    """A DNS server (not bound) of a `.` block with kubernetes, from the Corefile's text."""
    config = read(tmp_path, directives, keys=".:8053")
    return DnsServer(config, config.kubernetes, snapshot_of(SHOP_WEB))


def ask(server: DnsServer, name: str, qtype: str = "A") -> dnslib.DNSRecord:
    data = bytes(dnslib.DNSRecord.question(name, qtype).pack())
    reply = server.responder.respond(data, UDP4, "127.0.0.1")
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


def test_the_kubernetes_blocks_templates_answer_before_it(tmp_path: Path) -> None:
    server = serve_corefile(
        tmp_path,
        "template IN A cluster.local {\n"
        ' match "^web[.]shop[.]svc[.]"\n'
        ' answer "{{ .Name }} 60 IN CNAME www.example.org."\n'
        " fallthrough\n}\n"
        'template IN A example.org {\n answer "{{ .Name }} 60 IN A 192.0.2.9"\n}\n'
        "cache 30",
    )
    # The CNAME is followed through the server: the second template answers its target, and
    # `cache 30` caps the TTLs of both, as CoreDNS's cache in front of template does.
    reply = ask(server, "web.shop.svc.cluster.local")
    assert [str(rr) for rr in reply.rr] == [
        "web.shop.svc.cluster.local. 30      IN      CNAME   www.example.org.",
        "www.example.org.        30      IN      A       192.0.2.9",
    ]
    # Names the templates pass on are the kubernetes plugin's.
    assert ask(server, "web.shop.svc.cluster.local", "AAAA").header.rcode == 0
    assert ask(server, "nothere.shop.svc.cluster.local").header.rcode == 3


def test_a_reload_replaces_the_templates(tmp_path: Path) -> None:
    server = serve_corefile(tmp_path, "template IN A example.org {\n rcode NXDOMAIN\n}")
    assert ask(server, "www.example.org").header.rcode == 3
    (before,) = [h for h in server.front_handlers if h.name == "template"]
    server.reconfigure(read(tmp_path, "template IN A example.org {\n rcode NXDOMAIN\n}", ".:8053"))
    assert before in server.front_handlers  # the same templates: kept
    changed = read(tmp_path, "template IN A example.org {\n rcode REFUSED\n}", ".:8053")
    server.reconfigure(changed)
    assert before not in server.front_handlers
    assert ask(server, "www.example.org").header.rcode == 5
    # A cache of its own changes how the front's replies are capped: the front is built anew.
    (current,) = [h for h in server.front_handlers if h.name == "template"]
    server.reconfigure(
        read(tmp_path, "template IN A example.org {\n rcode REFUSED\n}\ncache 5", ".:8053")
    )
    assert current not in server.front_handlers
    assert [h.name for h in server.front_handlers] == ["cache", "template"]


def test_no_template_no_handler() -> None:
    assert make_template(TemplateOptions(), ((),)) is None
