"""CoreDNS's `rewrite`: its own test tables (plugin/rewrite/setup_test.go, rewrite_test.go,
name_test.go, ttl_test.go, reverter_test.go and edns0_test.go at the commit
docs/coredns-compatibility.md names), as data: the rules through the Corefile reader, the
queries through the handler with a stub next plugin (CoreDNS's tests use `msgPrinter`, which
answers the request it gets with an A record of its name). CoreDNS's tests read the request the
next plugin got through the reply (`NoRevertPolicy`, `NoRestorePolicy`): here the stub keeps it.
Then what toposdns adds: the kubernetes block's caches, the chains, reloads, the reply's OPT
record and size."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import dnslib
import pytest

from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB, service
from toposdns.config import ServeConfig
from toposdns.corefile import read_corefile
from toposdns.options import ConfigError
from toposdns.serve.blocks import BlockConfig, block_chain, block_forwarder
from toposdns.serve.chain import Reply, Request
from toposdns.serve.forward import ForwardOptions, Upstream
from toposdns.serve.hosts import HostsOptions, Inline
from toposdns.serve.responder import TCP4, UDP4, UDP6
from toposdns.serve.rewrite import (
    AnswerRule,
    Edns0Rule,
    NameRule,
    RegexRewriter,
    RemapRewriter,
    Rewrite,
    RewriteOptions,
    Rule,
    SuffixRewriter,
    TtlRule,
    TypeRule,
    client_subnet,
    make_rewrite,
    name_labels,
    presentation,
)
from toposdns.serve.transport import Transport
from toposdns.server import DnsServer
from toposdns.wire.decode import decode_query, record_spans, split_options

#: The client CoreDNS's test.ResponseWriter and ResponseWriter6 play.
V4_CLIENT = "10.240.0.1"
V6_CLIENT = "fe80::42:ff:feca:4c65"
LOCAL = 0xFFEE
NSID, SUBNET, COOKIE = 3, 8, 10


def corefile_word(word: str) -> str:
    """A word as a Corefile line writes it (`#` would begin a comment)."""
    return f'"{word}"' if "#" in word or not word else word


def read(tmp_path: Path, *lines: str) -> ServeConfig:
    """The configuration of a kubernetes block holding `lines`."""
    corefile = tmp_path / "Corefile"
    body = "".join(f"    {line}\n" for line in lines)
    corefile.write_text(f".:53 {{\n    kubernetes cluster.local\n{body}}}\n")
    return read_corefile(corefile).done()


def rules_of(tmp_path: Path, *lines: str) -> tuple[Rule, ...]:
    return read(tmp_path, *lines).rewrite.rules


def rule_of(tmp_path: Path, words: Sequence[str]) -> Rule:
    (rule,) = rules_of(tmp_path, " ".join(["rewrite", *map(corefile_word, words)]))
    return rule


def kind(rule: Rule) -> str:
    """A rule as CoreDNS's tests name its type (`exactNameRule` is "name exact")."""
    if isinstance(rule, NameRule):
        return f"name {rule.match}"
    if isinstance(rule, TtlRule):
        return f"ttl {rule.match}"
    if isinstance(rule, Edns0Rule):
        return "edns0 variable" if rule.variable else f"edns0 {rule.option}"
    return "type" if isinstance(rule, TypeRule) else "class"


# ----- setup_test.go TestParse: the Corefile text -> accepted, or an error containing the text


PARSE = [
    ("rewrite", ""),
    ("rewrite name", ""),
    ("rewrite name a.com b.com", None),
    ("rewrite stop {\n    name regex foo bar\n    answer name bar foo\n}", None),
    ("rewrite stop name regex foo bar answer name bar foo", None),
    (
        "rewrite stop {\n    name regex foo bar\n    answer name bar foo\n    name baz\n}",
        "2 arguments required",
    ),
    (
        "rewrite stop {\n    answer name bar foo\n    name regex foo bar\n}",
        "must begin with a name rule",
    ),
    ("rewrite stop", ""),
    ("rewrite continue", ""),
    ("rewrite stop name regex [bad[ bar answer name bar foo", ""),
]


@pytest.mark.parametrize(("text", "error"), PARSE)
def test_parse(tmp_path: Path, text: str, error: str | None) -> None:
    if error is None:
        assert read(tmp_path, text).rewrite.enabled
    else:
        with pytest.raises(ConfigError, match=error or None):
            read(tmp_path, text)


def test_errors_name_the_file_line_and_what_is_right(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        read(tmp_path, "rewrite name a.com b.com", "rewrite name regex (a b.com")
    assert str(error.value).startswith(f"{tmp_path}/Corefile:4: rewrite name regex (a b.com: ")
    assert "invalid regex matching pattern: (a" in str(error.value)
    assert str(error.value).endswith(
        "e.g. rewrite name suffix .corp.internal .svc.cluster.local answer auto"
    )
    # A rule written as a block: the line of its directive, and the rule's words.
    with pytest.raises(ConfigError) as error:
        read(tmp_path, "rewrite stop {", "  name regex foo bar", "  answer bogus", "}")
    assert str(error.value).startswith(
        f"{tmp_path}/Corefile:3: rewrite stop name regex foo bar answer bogus: invalid type "
        "'bogus' for answer rule for regex rule"
    )
    # A rule on its directive's line takes no block (CoreDNS would read the block as the next).
    with pytest.raises(ConfigError, match=r"Corefile:4: rewrite answer auto: a rule given"):
        read(tmp_path, "rewrite name a.com b.com {", "  answer auto", "}")


# ----- rewrite_test.go TestNewRule: the rule's words -> the rule CoreDNS makes, or an error


NEW_RULE: list[tuple[list[str], str | None]] = [
    ([], None),
    (["foo"], None),
    (["name"], None),
    (["name", "a.com"], None),
    (["name", "a.com", "b.com", "c.com"], None),
    (["name", "a.com", "b.com"], "name exact"),
    (["name", "exact", "a.com", "b.com"], "name exact"),
    (["name", "prefix", "a.com", "b.com"], "name prefix"),
    (["name", "suffix", "a.com", "b.com"], "name suffix"),
    (["name", "substring", "a.com", "b.com"], "name substring"),
    (["name", "regex", "([a])\\.com", "new-{1}.com"], "name regex"),
    (["name", "regex", "([a]\\.com", "new-{1}.com"], None),
    (
        ["name", "regex", "(dns)\\.(core)\\.(rocks)", "{2}.{1}.{3}"]
        + ["answer", "name", "(core)\\.(dns)\\.(rocks)", "{2}.{1}.{3}"],
        "name regex",
    ),
    (
        ["name", "regex", "(adns)\\.(core)\\.(rocks)", "{2}.{1}.{3}"]
        + [
            "answer",
            "name",
            "(core)\\.(adns)\\.(rocks)",
            "{2}.{1}.{3}",
            "too.long",
            "way.too.long",
        ],
        None,
    ),
    (
        ["name", "regex", "(bdns)\\.(core)\\.(rocks)", "{2}.{1}.{3}"]
        + ["NoAnswer", "name", "(core)\\.(bdns)\\.(rocks)", "{2}.{1}.{3}"],
        None,
    ),
    (
        ["name", "regex", "(cdns)\\.(core)\\.(rocks)", "{2}.{1}.{3}"]
        + ["answer", "ttl", "(core)\\.(cdns)\\.(rocks)", "{2}.{1}.{3}"],
        None,
    ),
    (
        ["name", "substring", "fcore.dns.rocks", "dns.fcore.rocks"]
        + ["answer", "name", "(fcore)\\.(dns)\\.(rocks)", "{2}.{1}.{3}"],
        "name substring",
    ),
    (["name", "substring", "a.com", "b.com", "c.com"], None),
    (["type"], None),
    (["type", "a"], None),
    (["type", "any", "a", "a"], None),
    (["type", "any", "a"], "type"),
    (["type", "XY", "WV"], None),
    (["type", "ANY", "WV"], None),
    (["class"], None),
    (["class", "IN"], None),
    (["class", "ch", "in", "in"], None),
    (["class", "ch", "in"], "class"),
    (["class", "XY", "WV"], None),
    (["class", "IN", "WV"], None),
    (["edns0"], None),
    (["edns0", "unknown-rule-type", "set"], None),
    (["edns0", "unknown-rule-type", "unset"], None),
    (["edns0", "local"], None),
    (["edns0", "local", "set"], None),
    (["edns0", "local", "set", "0xffee"], None),
    (["edns0", "local", "set", "invalid-uint", "abcdefg"], None),
    (["edns0", "local", "set", "65518", "abcdefg"], "edns0 local"),
    (["edns0", "local", "set", "0xffee", "abcdefg"], "edns0 local"),
    (["edns0", "local", "set", "0xffee", "abcdefg", "revert"], "edns0 local"),
    (["edns0", "local", "append", "0xffee", "abcdefg"], "edns0 local"),
    (["edns0", "local", "append", "0xffee", "abcdefg", "revert"], "edns0 local"),
    (["edns0", "local", "replace", "0xffee", "abcdefg"], "edns0 local"),
    (["edns0", "local", "replace", "0xffee", "abcdefg", "revert"], "edns0 local"),
    (["edns0", "local", "unset", "0xffee"], "edns0 local"),
    (["edns0", "local", "unset", "0xffee", "abcdefg"], None),
    (["edns0", "local", "unset", "0xffee", "revert"], None),
    (["edns0", "local", "foo", "0xffee", "abcdefg"], None),
    (["edns0", "local", "set", "0xffee", "0xabcdefg"], None),
    (["edns0", "nsid", "set", "junk"], None),
    (["edns0", "nsid", "set"], "edns0 nsid"),
    (["edns0", "nsid", "set", "revert"], "edns0 nsid"),
    (["edns0", "nsid", "append"], "edns0 nsid"),
    (["edns0", "nsid", "append", "revert"], "edns0 nsid"),
    (["edns0", "nsid", "replace"], "edns0 nsid"),
    (["edns0", "nsid", "replace", "revert"], "edns0 nsid"),
    (["edns0", "nsid", "unset"], "edns0 nsid"),
    (["edns0", "nsid", "unset", "revert"], None),
    (["edns0", "nsid", "foo"], None),
    (["edns0", "local", "set", "invalid-uint", "{qname}"], None),
    *(
        (["edns0", "local", action, "0xffee", data, *revert], "edns0 variable")
        for action in ("set", "append", "replace")
        for data, revert in (
            ("{qname}", []),
            ("{qtype}", []),
            ("{client_ip}", []),
            ("{client_port}", []),
            ("{protocol}", []),
            ("{server_ip}", []),
            ("{server_port}", []),
            ("{server_port}", ["revert"]),
        )
    ),
    *(
        (["edns0", "local", action, "0xffee", "{dummy}"], None)
        for action in ("set", "append", "replace")
    ),
    (["edns0", "subnet", "set", "-1", "56"], None),
    (["edns0", "subnet", "set", "24", "-56"], None),
    (["edns0", "subnet", "set", "33", "56"], None),
    (["edns0", "subnet", "set", "24", "129"], None),
    (["edns0", "subnet", "set", "24", "56"], "edns0 subnet"),
    (["edns0", "subnet", "set", "24", "56", "revert"], "edns0 subnet"),
    (["edns0", "subnet", "append", "24", "56"], "edns0 subnet"),
    (["edns0", "subnet", "append", "24", "56", "72"], None),
    (["edns0", "subnet", "append", "24", "56", "revert"], "edns0 subnet"),
    (["edns0", "subnet", "replace", "24", "56"], "edns0 subnet"),
    (["edns0", "subnet", "replace", "24", "56", "revert"], "edns0 subnet"),
    (["edns0", "subnet", "unset"], "edns0 subnet"),
    (["edns0", "subnet", "unset", "24", "56"], None),
    (["edns0", "subnet", "unset", "revert"], None),
    (["unknown-action", "name", "a.com", "b.com"], None),
    (["stop", "name", "a.com", "b.com"], "name exact"),
    (["continue", "name", "a.com", "b.com"], "name exact"),
    (["unknown-action", "type", "any", "a"], None),
    (["stop", "type", "any", "a"], "type"),
    (["continue", "type", "any", "a"], "type"),
    (["unknown-action", "class", "ch", "in"], None),
    (["stop", "class", "ch", "in"], "class"),
    (["continue", "class", "ch", "in"], "class"),
    (["unknown-action", "edns0", "local", "set", "0xffee", "abcedef"], None),
    (["stop", "edns0", "local", "set", "0xffee", "abcdefg"], "edns0 local"),
    (["continue", "edns0", "local", "set", "0xffee", "abcdefg"], "edns0 local"),
    (["unknown-action", "edns0", "nsid", "set"], None),
    (["stop", "edns0", "nsid", "set"], "edns0 nsid"),
    (["continue", "edns0", "nsid", "set"], "edns0 nsid"),
    (["unknown-action", "edns0", "local", "set", "0xffee", "{qname}"], None),
    *(
        ([mode, "edns0", "local", "set", "0xffee", data], "edns0 variable")
        for mode in ("stop", "continue")
        for data in (
            "{qname}",
            "{qtype}",
            "{client_ip}",
            "{client_port}",
            "{protocol}",
            "{server_ip}",
            "{server_port}",
        )
    ),
    (["unknown-action", "edns0", "subnet", "set", "24", "64"], None),
    *(
        ([mode, "edns0", "subnet", *args], "edns0 subnet")
        for mode in ("stop", "continue")
        for args in (
            ["set", "24", "56"],
            ["append", "24", "56"],
            ["replace", "24", "56"],
            ["unset"],
        )
    ),
]
#: Variables CoreDNS has that toposdns refuses (docs/coredns-compatibility.md): the client's
#: port and the server's address are not known where the rules run.
NOT_HERE = ("{client_port}", "{server_ip}", "{server_port}")


@pytest.mark.parametrize(("words", "expected"), NEW_RULE)
def test_new_rule(tmp_path: Path, words: list[str], expected: str | None) -> None:
    if expected is not None and any(word in NOT_HERE for word in words):
        with pytest.raises(ConfigError, match="not supported by toposdns"):
            rule_of(tmp_path, words)
    elif expected is None:
        with pytest.raises(ConfigError):
            rule_of(tmp_path, words)
    else:
        assert kind(rule_of(tmp_path, words)) == expected


def test_a_regex_of_invalid_utf8_cannot_be_written(tmp_path: Path) -> None:
    # TestNewRule's "\xecore" and "\xedns" patterns, invalid UTF-8, which Go's regexp refuses:
    # a Corefile must be UTF-8 text, so toposdns refuses the whole file.
    corefile = tmp_path / "Corefile"
    corefile.write_bytes(b".:53 {\n kubernetes\n rewrite name regex \xedns\\.(core) {1}.x\n}\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_corefile(corefile)


# name_test.go TestNewNameRule: (mode, words after `name`, refused), through `rewrite MODE name`
NEW_NAME_RULE = [
    ("stop", ["exact", "srv3.coredns.rocks", "srv4.coredns.rocks"], False),
    ("stop", ["srv1.coredns.rocks", "srv2.coredns.rocks"], False),
    ("stop", ["suffix", "coredns.rocks", "coredns.rocks."], False),
    ("stop", ["suffix", "coredns.rocks.", "coredns.rocks"], False),
    ("stop", ["suffix", "coredns.rocks.", "coredns.rocks."], False),
    ("stop", ["regex", "srv1.coredns.rocks", "10"], False),
    ("stop", ["regex", "(.*).coredns.rocks", "10"], False),
    ("stop", ["regex", "(.*).coredns.rocks", "{1}.coredns.rocks"], False),
    ("stop", ["regex", "(.*).coredns.rocks", "{1}.{2}.coredns.rocks"], True),
    (
        "stop",
        ["regex", "staging.mydomain.com", "aws-loadbalancer-id.us-east-1.elb.amazonaws.com"],
        False,
    ),
    ("stop", ["suffix", "staging.mydomain.com", "coredns.rock", "answer"], True),
    ("stop", ["suffix", "staging.mydomain.com", "coredns.rock", "answer", "name"], True),
    ("stop", ["suffix", "staging.mydomain.com", "coredns.rock", "answer", "other"], True),
    ("stop", ["suffix", "staging.mydomain.com", "coredns.rock", "answer", "auto"], False),
    ("stop", ["regex", "staging.mydomain.com", "coredns.rock", "answer", "auto"], False),
    ("stop", ["regex", "staging.mydomain.com", "coredns.rock", "answer", "name"], True),
    (
        "stop",
        ["regex", "staging.mydomain.com", "coredns.rock"]
        + ["answer", "name", "coredns.rock", "staging.mydomain.com"],
        False,
    ),
    (
        "stop",
        ["regex", "staging.mydomain.com", "coredns.rock"]
        + ["answer", "name", "(.*).coredns.rock", "{1}.{2}.staging.mydomain.com"],
        True,
    ),
    *(
        (
            "stop",
            ["regex", "staging.mydomain.com", "coredns.rock"]
            + ["answer", "name", "(.*).coredns.rock", "{1}.staging.mydomain.com"]
            + then,
            refused,
        )
        for then, refused in (
            (["name", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["answer", "name", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["name", "(.*).coredns.rock"], True),
            (["value", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["answer", "value", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["value", "(.*).coredns.rock"], True),
        )
    ),
    *(
        (
            "stop",
            ["suffix", "staging.mydomain.com.", "coredns.rock."]
            + ["answer", "value", "(.*).coredns.rock", "{1}.staging.mydomain.com"]
            + then,
            refused,
        )
        for then, refused in (
            (["value", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["answer", "value", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["name", "(.*).coredns.rock", "{1}.staging.mydomain.com"], False),
            (["value", "(.*).coredns.rock"], True),
        )
    ),
]

# ttl_test.go TestNewTTLRule: (mode, words after `ttl`, refused)
NEW_TTL_RULE = [
    *(
        (mode, words, False)
        for mode in ("stop", "continue")
        for words in (
            ["srv1.coredns.rocks", "10"],
            ["exact", "srv1.coredns.rocks", "15"],
            ["prefix", "coredns.rocks", "20"],
            ["suffix", "srv1", "25"],
            ["substring", "coredns", "30"],
            ["regex", "(srv1)\\.(coredns)\\.(rocks)", "35"],
        )
    ),
    ("stop", ["srv1.coredns.rocks", "12345678901234567890"], True),
    ("stop", ["srv1.coredns.rocks", "coredns.rocks"], True),
    ("stop", ["srv1.coredns.rocks", "#1"], True),
    ("stop", ["range.coredns.rocks", "1-2"], False),
    ("stop", ["ceil.coredns.rocks", "-2"], False),
    ("stop", ["floor.coredns.rocks", "1-"], False),
    ("stop", ["range.coredns.rocks", "2-2"], False),
    ("stop", ["invalid.coredns.rocks", "-"], True),
    ("stop", ["invalid.coredns.rocks", "2-1"], True),
    ("stop", ["invalid.coredns.rocks", "5-10-20"], True),
]


@pytest.mark.parametrize(
    ("field", "mode", "words", "refused"),
    [("name", *case) for case in NEW_NAME_RULE] + [("ttl", *case) for case in NEW_TTL_RULE],
)
def test_new_name_and_ttl_rules(
    tmp_path: Path, field: str, mode: str, words: list[str], refused: bool
) -> None:
    if refused:
        with pytest.raises(ConfigError):
            rule_of(tmp_path, [mode, field, *words])
    else:
        rule = rule_of(tmp_path, [mode, field, *words])
        assert kind(rule).split()[0] == field and rule.mode == mode


@pytest.mark.parametrize("field", ["name", "ttl"])
def test_a_regex_too_long_is_refused(tmp_path: Path, field: str) -> None:
    # TestNewNameRuleLargeRegex, TestNewTTLRuleLargeRegex
    with pytest.raises(ConfigError, match="too long"):
        rule_of(tmp_path, [field, "regex", "a" * 10_001, "300" if field == "ttl" else "b"])


def test_what_the_rules_hold(tmp_path: Path) -> None:
    rules = rules_of(
        tmp_path,
        "rewrite name A.com b.COM",
        "rewrite continue name suffix .Corp.internal .svc.cluster.local answer auto",
        "rewrite name regex (.*)\\.x {1}.Y answer name (.*)\\.y {1}.X answer value a b",
        "rewrite ttl Example.com 30-",
        "rewrite edns0 local set 0xffee 0x61626364",
        "rewrite edns0 local set 65518 abcd",
    )
    back = SuffixRewriter(".svc.cluster.local.", ".corp.internal.")
    assert rules == (
        NameRule("stop", "exact", "a.com.", "b.com.", True),
        NameRule(
            "continue",
            "suffix",
            ".corp.internal.",
            ".svc.cluster.local.",
            False,
            (AnswerRule("name", back), AnswerRule("value", back)),
        ),
        NameRule(
            "stop",
            "regex",
            "(.*)\\.x",
            "{1}.y.",
            False,
            (
                AnswerRule("name", RegexRewriter("(.*)\\.y", "{1}.x.")),
                AnswerRule("value", RegexRewriter("a", "b.")),
            ),
        ),
        TtlRule("stop", "exact", "example.com.", 30, 2147483647),
        Edns0Rule("stop", "local", "set", code=LOCAL, data=b"abcd"),
        Edns0Rule("stop", "local", "set", code=LOCAL, data=b"abcd"),
    )
    with pytest.raises(ConfigError, match="invalid TTL"):
        rules_of(tmp_path, "rewrite ttl example.com -")


def test_rules_of_every_rewrite_make_one_list_and_blocks_hold_one_rule(tmp_path: Path) -> None:
    rules = rules_of(
        tmp_path,
        "rewrite continue {",
        "    name regex (.*)-(us-west-1)\\.example\\.org {1}.service.{2}.consul",
        "    answer name (.*)\\.service\\.(us-west-1)\\.consul {1}-{2}.example.org",
        "}",
        "rewrite type ANY HINFO",
        "rewrite {",
        "    class",
        "    CH IN",
        "}",
    )
    assert [kind(rule) for rule in rules] == ["name regex", "type", "class"]
    assert [rule.mode for rule in rules] == ["continue", "stop", "stop"]


def test_rules_left_out_are_refused_with_what_is_supported(tmp_path: Path) -> None:
    for words in ("cname exact a.com b.com", "rcode exact a.com SERVFAIL NOERROR"):
        with pytest.raises(ConfigError, match="not supported by toposdns; supported: name, ttl"):
            rules_of(tmp_path, f"rewrite {words}")
    with pytest.raises(ConfigError, match="metadata|not supported by toposdns"):
        rules_of(tmp_path, "rewrite edns0 local set 0xffee {test/label}")


# ----- the handler, with a stub next plugin


def rr_of(text: str) -> Any:
    """A record from its zone text (dnslib reads no HINFO nor DNAME: they are made here)."""
    words = text.split()
    if "DNAME" in words:
        return dnslib.RR(words[0], 39, ttl=int(words[1]), rdata=dnslib.DNAME(words[-1]))
    if "HINFO" in words:
        strings = [part for part in text.split('"') if part.strip()][1:]
        data = b"".join(bytes([len(s)]) + s.encode() for s in strings)
        return dnslib.RR(words[0], 13, ttl=int(words[1]), rdata=dnslib.RD(data))
    return dnslib.RR.fromZone(text)[0]


class Printer:
    """CoreDNS's msgPrinter: the request it gets, answered with `answer` (none given: an A
    record of its name, TTL 5, 10.0.0.1) and `extra`; the requests kept in `seen`."""

    def __init__(
        self,
        answer: Sequence[str] = (),
        extra: Sequence[str] = (),
        opt: bool = True,
        question: bool = True,
    ) -> None:
        self.answer, self.extra, self.opt, self.question = answer, extra, opt, question
        self.seen: list[Request] = []

    def __call__(self, request: Request) -> Reply:
        self.seen.append(request)
        message = dnslib.DNSRecord.parse(request.data)
        message.header.qr = 1
        if not self.opt:
            message.ar = []
        if not self.question:
            message.questions = []
        name = presentation(request.query.name)
        for text in self.answer or [f"{name} 5 IN A 10.0.0.1"]:
            message.add_answer(rr_of(text))
        for text in self.extra:
            message.add_ar(rr_of(text))
        return bytes(message.pack())

    @property
    def asked(self) -> tuple[str, int, int]:
        """The question the next plugin got: its name, type and class."""
        query = self.seen[-1].query
        return presentation(query.name), query.qtype, query.qclass

    @property
    def options(self) -> list[tuple[int, bytes]]:
        """The EDNS options the next plugin got (None: no OPT record)."""
        edns = self.seen[-1].query.edns
        assert edns is not None, "the next plugin got no OPT record"
        return list(edns.options)


def handler(tmp_path: Path, *lines: str) -> Rewrite:
    found = make_rewrite(read(tmp_path, *lines).rewrite, ((),))
    assert found is not None
    return found


def query_of(
    name: str,
    qtype: int | str = "A",
    qclass: int = 1,
    options: Sequence[tuple[int, bytes]] | None = None,
    do: bool = True,
) -> bytes:
    """A query; with `options` (even none) an OPT record, buffer 4096, DO as CoreDNS's tests
    set it (m.SetEdns0(4096, true))."""
    code = qtype if isinstance(qtype, int) else getattr(dnslib.QTYPE, qtype)
    message = dnslib.DNSRecord(q=dnslib.DNSQuestion(name, code, qclass))
    if options is not None:
        opts = [dnslib.EDNSOption(c, v) for c, v in options]
        message.add_ar(dnslib.EDNS0(udp_len=4096, flags="do" if do else "", opts=opts))
    return bytes(message.pack())


def ask_raw(
    rewrite: Rewrite,
    data: bytes,
    next: Printer | None = None,
    source: str = V4_CLIENT,
    transport: Transport = UDP4,
) -> bytes:
    reply = rewrite.serve(Request(decode_query(data), data, transport, source), next or Printer())
    assert isinstance(reply, bytes)
    return reply


def ask(
    rewrite: Rewrite,
    data: bytes,
    next: Printer | None = None,
    source: str = V4_CLIENT,
    transport: Transport = UDP4,
) -> dnslib.DNSRecord:
    return dnslib.DNSRecord.parse(ask_raw(rewrite, data, next, source, transport))


def opt_options(reply: bytes) -> list[tuple[int, bytes]] | None:
    """The options of a reply's OPT record, None without one (dnslib drops an empty last
    option: toposdns's own reader is used)."""
    for _start, at, end, rtype, _section in record_spans(reply):
        if rtype == 41:
            return list(split_options(reply[at + 6 : end]))
    return None


def answer_names(reply: dnslib.DNSRecord) -> list[str]:
    return [str(rr.rname) for rr in reply.rr]


def question_of(reply: dnslib.DNSRecord) -> tuple[str, int, int]:
    (question,) = reply.questions
    return str(question.qname), question.qtype, question.qclass


# rewrite_test.go TestRewriteDefaultRevertPolicy: (asked, the answer's name)
DEFAULT_REVERT_RULES = (
    "rewrite stop name prefix prefix to",
    "rewrite stop name suffix .suffix. .nl.",
    "rewrite stop name substring from.substring to",
    "rewrite stop name regex (f.*m)\\.regex\\.(nl) to.{2}",
)
DEFAULT_REVERT = [
    ("prefix.nl.", "to.nl."),
    ("to.suffix.", "to.nl."),
    ("from.substring.nl.", "to.nl."),
    ("from.regex.nl.", "to.nl."),
]


@pytest.mark.parametrize(("name", "answered"), DEFAULT_REVERT)
def test_default_revert_policy(tmp_path: Path, name: str, answered: str) -> None:
    reply = ask(handler(tmp_path, *DEFAULT_REVERT_RULES), query_of(name))
    assert question_of(reply) == (name, 1, 1)
    assert answer_names(reply) == [answered]


# rewrite_test.go TestRewrite: (asked name, type, class) -> what the next plugin gets
REWRITE_RULES = (
    "rewrite stop name from.nl. to.nl.",
    "rewrite stop name regex (core)\\.(dns)\\.(rocks)\\.(nl) {2}.{1}.{3}.{4} "
    "answer name (dns)\\.(core)\\.(rocks)\\.(nl) {2}.{1}.{3}.{4}",
    "rewrite stop name exact from.exact.nl. to.nl.",
    "rewrite stop name prefix prefix to",
    "rewrite stop name suffix .suffix. .nl.",
    "rewrite stop name substring from.substring to",
    "rewrite stop name regex (f.*m)\\.regex\\.(nl) to.{2}",
    "rewrite continue name regex consul\\.(rocks) core.dns.{1}",
    "rewrite stop name core.dns.rocks to.nl.",
    "rewrite continue class HS CH",
    "rewrite stop class CH IN",
    "rewrite stop type ANY HINFO",
)
A, ANY, HINFO, SRV, IN, CH = 1, 255, 13, 33, 1, 3
REWRITE = [
    (("from.nl.", A, IN), ("to.nl.", A, IN)),
    (("a.nl.", A, IN), ("a.nl.", A, IN)),
    (("a.nl.", A, CH), ("a.nl.", A, IN)),
    (("a.nl.", ANY, IN), ("a.nl.", HINFO, IN)),
    # name is rewritten, type is not.
    (("from.nl.", ANY, IN), ("to.nl.", ANY, IN)),
    (("from.exact.nl.", A, IN), ("to.nl.", A, IN)),
    (("prefix.nl.", A, IN), ("to.nl.", A, IN)),
    (("to.suffix.", A, IN), ("to.nl.", A, IN)),
    (("from.substring.nl.", A, IN), ("to.nl.", A, IN)),
    (("from.regex.nl.", A, IN), ("to.nl.", A, IN)),
    (("consul.rocks.", A, IN), ("to.nl.", A, IN)),
    # name is not, type is, but class is, because class is the 2nd rule.
    (("a.nl.", ANY, CH), ("a.nl.", ANY, IN)),
    # class gets rewritten twice because of continue/stop logic: HS to CH, CH to IN
    (("a.nl.", ANY, 4), ("a.nl.", ANY, IN)),
    (("core.dns.rocks.nl.", A, IN), ("dns.core.rocks.nl.", A, IN)),
]


@pytest.mark.parametrize(("asked", "passed"), REWRITE)
def test_rewrite(tmp_path: Path, asked: tuple[str, int, int], passed: tuple[str, int, int]) -> None:
    next = Printer()
    reply = ask(handler(tmp_path, *REWRITE_RULES), query_of(*asked), next)
    assert next.asked == passed
    assert question_of(reply) == asked  # restored, as by the default revert policy


def test_an_illegal_name_gets_servfail(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # name_test.go TestRewriteIllegalName
    next = Printer()
    rewrite = handler(tmp_path, "rewrite stop name example.org. example..org.")
    with caplog.at_level(logging.WARNING, "toposdns"):
        for _ in range(3):
            reply = ask(rewrite, query_of("example.org."), next)
            assert reply.header.rcode == 2 and question_of(reply) == ("example.org.", A, IN)
    assert not next.seen
    (line,) = [r.getMessage() for r in caplog.records]  # once, not per query
    assert "rewrote example.org. to 'example..org.', which is no name" in line


# name_test.go TestRewriteNamePrefixSuffix, ...NoRewrite, ...NoAutoAnswer, ...AutoAnswer,
# TestRewriteNameExactAnswer, TestRewriteNameRegexAnswer: (mode, words after `name`, asked,
# what the next plugin gets, the answer's name in the reply)
NAME_RULES = [
    ("stop", "prefix foo bar", "foo.example.com.", "bar.example.com.", "bar.example.com."),
    ("stop", "prefix foo. bar.", "foo.example.com.", "bar.example.com.", "bar.example.com."),
    ("stop", "suffix com org", "foo.example.com.", "foo.example.org.", "foo.example.org."),
    ("stop", "suffix .com .org", "foo.example.com.", "foo.example.org.", "foo.example.org."),
    ("stop", "prefix foo bar", "coredns.foo.", "coredns.foo.", "coredns.foo."),
    ("stop", "prefix foo bar.", "coredns.foo.", "coredns.foo.", "coredns.foo."),
    ("stop", "suffix com org", "com.coredns.", "com.coredns.", "com.coredns."),
    ("stop", "suffix com org.", "com.coredns.", "com.coredns.", "com.coredns."),
    ("stop", "substring service svc", "com.coredns.", "com.coredns.", "com.coredns."),
    (
        "stop",
        "suffix .ingress.coredns.rocks nginx.coredns.rocks",
        "coredns.ingress.coredns.rocks.",
        "corednsnginx.coredns.rocks.",
        "corednsnginx.coredns.rocks.",
    ),
    (
        "stop",
        "prefix foo bar answer auto",
        "foo.example.com.",
        "bar.example.com.",
        "foo.example.com.",
    ),
    (
        "stop",
        "prefix foo. bar. answer auto",
        "foo.example.com.",
        "bar.example.com.",
        "foo.example.com.",
    ),
    (
        "stop",
        "suffix com org answer auto",
        "foo.example.com.",
        "foo.example.org.",
        "foo.example.com.",
    ),
    (
        "stop",
        "suffix .com .org answer auto",
        "foo.example.com.",
        "foo.example.org.",
        "foo.example.com.",
    ),
    (
        "stop",
        "suffix .ingress.coredns.rocks nginx.coredns.rocks answer auto",
        "coredns.ingress.coredns.rocks.",
        "corednsnginx.coredns.rocks.",
        "coredns.ingress.coredns.rocks.",
    ),
    (
        "stop",
        "exact coredns.rocks service.consul answer auto",
        "coredns.rocks.",
        "service.consul.",
        "coredns.rocks.",
    ),
    (
        "stop",
        "exact coredns.rocks. service.consul. answer auto",
        "coredns.rocks.",
        "service.consul.",
        "coredns.rocks.",
    ),
    (
        "stop",
        "exact coredns.rocks service.consul",
        "coredns.rocks.",
        "service.consul.",
        "coredns.rocks.",
    ),
    (
        "stop",
        "exact coredns.rocks. service.consul.",
        "coredns.rocks.",
        "service.consul.",
        "coredns.rocks.",
    ),
    (
        "stop",
        "exact coredns.org. service.consul.",
        "coredns.rocks.",
        "coredns.rocks.",
        "coredns.rocks.",
    ),
    (
        "stop",
        "regex (.*).coredns.rocks {1}.coredns.maps answer auto",
        "foo.coredns.rocks.",
        "foo.coredns.maps.",
        "foo.coredns.rocks.",
    ),
    (
        "stop",
        "regex (.*).coredns.rocks {1}.coredns.maps answer name (.*).coredns.maps {1}.coredns.works",
        "foo.coredns.rocks.",
        "foo.coredns.maps.",
        "foo.coredns.works.",
    ),
    (
        "stop",
        "regex (.*).coredns.rocks {1}.coredns.maps",
        "foo.coredns.rocks.",
        "foo.coredns.maps.",
        "foo.coredns.maps.",
    ),
]


@pytest.mark.parametrize(("mode", "words", "asked", "passed", "answered"), NAME_RULES)
def test_name_rules(
    tmp_path: Path, mode: str, words: str, asked: str, passed: str, answered: str
) -> None:
    next = Printer()
    reply = ask(handler(tmp_path, f"rewrite {mode} name {words}"), query_of(asked), next)
    assert next.asked[0] == passed
    assert question_of(reply)[0] == asked
    assert answer_names(reply) == [answered]


# name_test.go TestRemapStringRewriter
REMAP = [
    ("example.com.", "example.org."),
    ("sub.example.com.", "sub.example.org."),
    ("a.b.example.com.", "a.b.example.org."),
    ("notexample.com.", "notexample.com."),
    (".example.com.", ".example.org."),
    ("example.net.", "example.net."),
    ("com.", "com."),
    ("", ""),
]


@pytest.mark.parametrize(("name", "mapped"), REMAP)
def test_remap_string_rewriter(name: str, mapped: str) -> None:
    assert RemapRewriter("example.com.", "example.org.").rewrite(name) == mapped


# ttl_test.go TestTtlRewrite: the rules, then (asked, type, the answer's records, its TTL)
TTL_RULES = (
    "rewrite stop ttl srv1.coredns.rocks 1",
    "rewrite stop ttl exact srv15.coredns.rocks 15",
    "rewrite stop ttl prefix srv30 30",
    "rewrite stop ttl suffix 45.coredns.rocks 45",
    "rewrite stop ttl substring rv50 50",
    "rewrite stop ttl regex (srv10)\\.(coredns)\\.(rocks) 10",
    "rewrite stop ttl regex (srv20)\\.(coredns)\\.(rocks) 20",
    "rewrite stop ttl range.example.com. 30-300",
    "rewrite stop ttl ceil.example.com. -11",
    "rewrite stop ttl floor.example.com. 5-",
)
TTL = [
    ("srv1.coredns.rocks.", A, ["srv1.coredns.rocks.  5   IN  A  10.0.0.1"], 1),
    ("srv15.coredns.rocks.", A, ["srv15.coredns.rocks.  5   IN  A  10.0.0.15"], 15),
    ("srv30.coredns.rocks.", A, ["srv30.coredns.rocks.  5   IN  A  10.0.0.30"], 30),
    ("srv45.coredns.rocks.", A, ["srv45.coredns.rocks.  5   IN  A  10.0.0.45"], 45),
    ("srv50.coredns.rocks.", A, ["srv50.coredns.rocks.  5   IN  A  10.0.0.50"], 50),
    ("srv10.coredns.rocks.", A, ["srv10.coredns.rocks.  5   IN  A  10.0.0.10"], 10),
    (
        "xmpp.coredns.rocks.",
        SRV,
        ["xmpp.coredns.rocks.  5  IN  SRV 0 100 100 srvxmpp.coredns.rocks."],
        5,
    ),
    ("srv15.coredns.rocks.", HINFO, ['srv15.coredns.rocks.  5  HINFO "INTEL-64" "RHEL 7.5"'], 15),
    (
        "srv20.coredns.rocks.",
        A,
        [
            "srv20.coredns.rocks.  5   IN  A  10.0.0.22",
            "srv20.coredns.rocks.  5   IN  A  10.0.0.23",
        ],
        20,
    ),
    ("range.example.com.", A, ["range.example.com.  5   IN  A  10.0.0.1"], 30),
    ("range.example.com.", A, ["range.example.com.  55   IN  A  10.0.0.1"], 55),
    ("range.example.com.", A, ["range.example.com.  500   IN  A  10.0.0.1"], 300),
    ("ceil.example.com.", A, ["ceil.example.com.  5   IN  A  10.0.0.1"], 5),
    ("ceil.example.com.", A, ["ceil.example.com.  15   IN  A  10.0.0.1"], 11),
    ("floor.example.com.", A, ["floor.example.com.  0   IN  A  10.0.0.1"], 5),
    ("floor.example.com.", A, ["floor.example.com.  30   IN  A  10.0.0.1"], 30),
]


@pytest.mark.parametrize(("name", "qtype", "answer", "ttl"), TTL)
def test_ttl_rewrite(tmp_path: Path, name: str, qtype: int, answer: list[str], ttl: int) -> None:
    reply = ask(handler(tmp_path, *TTL_RULES), query_of(name, qtype), Printer(answer))
    assert reply.rr and [rr.ttl for rr in reply.rr] == [ttl] * len(answer)


def test_ttl_rules_leave_the_opt_record_alone(tmp_path: Path) -> None:
    # CoreDNS's rule clamps the OPT record's TTL field too, its DO bit with it: not here.
    rewrite = handler(tmp_path, "rewrite ttl example.com. 30-300")
    reply = ask(rewrite, query_of("example.com.", options=[]), Printer())
    assert [rr.ttl for rr in reply.rr] == [30]
    (opt,) = reply.ar
    assert opt.rtype == 41 and opt.ttl == 0x8000  # DO, as asked


# reverter_test.go TestResponseReverter: (asked, type, the answer, reverted): the question
# gets back as asked, and is rewritten for the next plugin.
REVERTER_RULE = (
    "name regex (core)\\.(dns)\\.(rocks) {2}.{1}.{3} answer name (dns)\\.(core)\\.(rocks) "
    "{2}.{1}.{3}"
)
REVERTER = [
    ("core.dns.rocks.", A, ["dns.core.rocks.  5   IN  A  10.0.0.1"]),
    ("core.dns.rocks.", SRV, ["dns.core.rocks.  5  IN  SRV 0 100 100 srv1.dns.core.rocks."]),
    ("core.dns.rocks.", HINFO, ['core.dns.rocks.  5  HINFO "INTEL-64" "RHEL 7.4"']),
    (
        "core.dns.rocks.",
        A,
        ["dns.core.rocks.  5   IN  A  10.0.0.1", "dns.core.rocks.  5   IN  A  10.0.0.2"],
    ),
]


@pytest.mark.parametrize("mode", ["stop", "continue"])
@pytest.mark.parametrize(("name", "qtype", "answer"), REVERTER)
def test_response_reverter(
    tmp_path: Path, mode: str, name: str, qtype: int, answer: list[str]
) -> None:
    next = Printer(answer)
    reply = ask(handler(tmp_path, f"rewrite {mode} {REVERTER_RULE}"), query_of(name, qtype), next)
    assert next.asked == ("dns.core.rocks.", qtype, IN)
    assert question_of(reply) == (name, qtype, IN)
    if qtype != HINFO:  # `answer name` maps dns.core.rocks back
        assert set(answer_names(reply)) == {"core.dns.rocks."}


# reverter_test.go TestValueResponseReverter: (asked, type, answer, extra, what the next plugin
# gets, the answer's type and value and the additional record's name after the reply rules)
VALUE_RULES = {
    "stop": (
        "rewrite stop name regex (.*)\\.domain\\.uk {1}.cluster.local answer name "
        "(.*)\\.cluster\\.local {1}.domain.uk answer value (.*)\\.cluster\\.local {1}.domain.uk",
    ),
    "continue": (
        "rewrite continue name regex (.*)\\.domain\\.uk {1}.cluster.local answer name "
        "(.*)\\.cluster\\.local {1}.domain.uk answer value (.*)\\.cluster\\.local {1}.domain.uk",
    ),
    "suffix": (
        "rewrite stop name suffix .domain.uk .cluster.local answer auto answer value "
        "(.*)\\.cluster\\.local {1}.domain.uk",
    ),
    "suffix_multiple": (
        "rewrite continue name suffix .domain.uk .domain.us answer auto",
        "rewrite stop name suffix .domain.us .cluster.local answer auto",
    ),
}
VALUES = [
    (
        "my.domain.uk.",
        SRV,
        "my.cluster.local.  5  IN  SRV 0 100 100 srv1.my.cluster.local.",
        "srv1.my.cluster.local.  5   IN  A  10.0.0.1",
        "srv1.my.domain.uk.",
        "srv1.my.domain.uk.",
    ),
    (
        "my.domain.uk.",
        ANY,
        "my.cluster.local.  3600 IN CNAME cname.cluster.local.",
        "cname.cluster.local.  5   IN  A  10.0.0.1",
        "cname.domain.uk.",
        "cname.domain.uk.",
    ),
    (
        "my.domain.uk.",
        ANY,
        "my.cluster.local.  3600 IN DNAME dname.cluster.local.",
        "dname.cluster.local.  5   IN  A  10.0.0.1",
        "dname.domain.uk.",
        "dname.domain.uk.",
    ),
    (
        "my.domain.uk.",
        15,
        "my.cluster.local.	3600	IN	MX	1 mx1.cluster.local.",
        "mx1.cluster.local.  5   IN  A  10.0.0.1",
        "mx1.domain.uk.",
        "mx1.domain.uk.",
    ),
    (
        "my.domain.uk.",
        ANY,
        "my.cluster.local.	3600	IN	NS	ns1.cluster.local.",
        "ns1.cluster.local.  5   IN  A  10.0.0.1",
        "ns1.domain.uk.",
        "ns1.domain.uk.",
    ),
    (
        "my.domain.uk.",
        6,
        "my.cluster.local. 1800 IN SOA ns1.cluster.local. admin.cluster.local. 1502165581 "
        "14400 3600 604800 14400",
        "ns1.cluster.local.  5   IN  A  10.0.0.1",
        "ns1.domain.uk.",
        "ns1.domain.uk.",
    ),
    (
        "my.domain.uk.",
        35,
        'my.cluster.local.  100  IN NAPTR 100 10 "S" "SIP+D2U" '
        '"!^.*$!sip:customer-service@example.com!" _sip._udp.cluster.local.',
        "ns1.cluster.local.  5   IN  A  10.0.0.1",
        "_sip._udp.domain.uk.",
        "ns1.domain.uk.",
    ),
]
VALUE_OF = {
    33: "target",
    5: "label",
    39: "label",
    15: "label",
    2: "label",
    6: "mname",
    35: "replacement",
}


def value_of(rr: Any) -> str:
    if rr.rtype == 39 and isinstance(rr.rdata, dnslib.RD):  # dnslib reads DNAME as bytes
        return str(dnslib.DNSBuffer(bytes(rr.rdata.data)).decode_name())
    return str(getattr(rr.rdata, VALUE_OF[rr.rtype]))


@pytest.mark.parametrize("rules", list(VALUE_RULES))
@pytest.mark.parametrize(("name", "qtype", "answer", "extra", "value", "additional"), VALUES)
def test_value_response_reverter(
    tmp_path: Path,
    rules: str,
    name: str,
    qtype: int,
    answer: str,
    extra: str,
    value: str,
    additional: str,
) -> None:
    next = Printer([answer], [extra])
    reply = ask(handler(tmp_path, *VALUE_RULES[rules]), query_of(name, qtype), next)
    assert next.asked == ("my.cluster.local.", qtype, IN)
    assert question_of(reply) == (name, qtype, IN)
    assert reply.rr[0].rtype == rr_of(answer).rtype
    assert value_of(reply.rr[0]) == value
    extras = [rr for rr in reply.ar if rr.rtype != 41]
    assert extras[0].rtype == A and str(extras[0].rname) == additional


def test_the_question_comes_back_to_a_reply_without_one(tmp_path: Path) -> None:
    # reverter_test.go TestResponseReverterRestoresMissingQuestion
    rewrite = handler(tmp_path, "rewrite stop name suffix .example.org .example.net answer auto")
    next = Printer(["service.example.net. 60 IN A 127.0.0.1"], question=False)
    reply = ask(rewrite, query_of("service.example.org."), next)
    assert question_of(reply) == ("service.example.org.", A, IN)
    assert answer_names(reply) == ["service.example.org."]


def test_a_reply_without_opt_to_a_query_without_one(tmp_path: Path) -> None:
    # reverter_test.go TestEDNS0ResponseReverterNoOPT, local_set_revert: the next plugin gets
    # an OPT record with the option; the client, who sent none, gets none back.
    rewrite = handler(tmp_path, "rewrite edns0 local set 0xffee 0xabcdef revert")
    next = Printer(["example.org. 60 IN A 127.0.0.1"], opt=False)
    reply = ask(rewrite, query_of("example.org."), next)
    assert next.options == [(LOCAL, b"\xab\xcd\xef")]
    assert reply.header.rcode == 0 and len(reply.rr) == 1 and not reply.ar


# ----- EDNS0: the options the next plugin gets


# rewrite_test.go TestRewriteEDNS0Local: (words after `edns0`, options the next plugin gets)
EDNS0_LOCAL = [
    ("local set 0xffee 0xabcdef", [(LOCAL, b"\xab\xcd\xef")]),
    ("local append 0xffee abcdefghijklmnop", [(LOCAL, b"abcdefghijklmnop")]),
    ("local replace 0xffee abcdefghijklmnop", []),
    ("nsid set", [(NSID, b"")]),
    ("nsid append", [(NSID, b"")]),
    ("nsid replace", []),
]


@pytest.mark.parametrize(("words", "options"), EDNS0_LOCAL)
def test_edns0_local(tmp_path: Path, words: str, options: list[tuple[int, bytes]]) -> None:
    next = Printer()
    reply = ask(handler(tmp_path, f"rewrite edns0 {words}"), query_of("example.com."), next)
    edns = next.seen[-1].query.edns
    assert edns is not None and (edns.udp_size, edns.ttl) == (4096, 0)  # SetEdns0(4096, false)
    assert next.options == options
    assert not reply.ar  # the client sent no OPT record


SUBNET_ZERO = client_subnet("0.0.0.0", 0, 0)
SUBNET_32 = client_subnet(V4_CLIENT, 32, 0)

# rewrite_test.go TestEdns0MultiRule: (two rules, options asked (None: no OPT record), options
# the next plugin gets). The `revert` cases get what their twins without it get: `revert` only
# acts on the reply, whose OPT record here is the one the query as asked gets (below).
MULTI = [
    (["local replace 0xffee abcdef", "local set 0xffee fedcba"], None, [(LOCAL, b"fedcba")]),
    (
        ["local replace 0xffee abcdef", "local set 0xffee fedcba"],
        [(LOCAL, b"foobar")],
        [(LOCAL, b"abcdef")],
    ),
    (["local replace 0xffee {qname}", "local set 0xffee {qtype}"], None, [(LOCAL, b"\x00\x01")]),
    (
        ["local replace 0xffee {qname}", "local set 0xffee {qtype}"],
        [(LOCAL, b"foobar")],
        [(LOCAL, b"example.com.")],
    ),
    (["nsid replace", "nsid set"], None, [(NSID, b"")]),
    (["nsid replace", "nsid set"], [(LOCAL, b"foobar")], [(LOCAL, b"foobar"), (NSID, b"")]),
    (["nsid replace", "nsid set"], [(NSID, b"")], [(NSID, b"")]),
    (["subnet replace 32 56", "subnet set 0 56"], None, [(SUBNET, SUBNET_ZERO)]),
    (["subnet replace 32 56", "subnet set 0 56"], [(SUBNET, SUBNET_ZERO)], [(SUBNET, SUBNET_32)]),
]


@pytest.mark.parametrize("revert", ["", " revert"])
@pytest.mark.parametrize(("rules", "asked", "options"), MULTI)
def test_edns0_multi_rule(
    tmp_path: Path,
    revert: str,
    rules: list[str],
    asked: list[tuple[int, bytes]] | None,
    options: list[tuple[int, bytes]],
) -> None:
    next = Printer()
    rewrite = handler(tmp_path, *(f"rewrite stop edns0 {rule}{revert}" for rule in rules))
    reply = ask_raw(rewrite, query_of("example.com.", options=asked), next)
    assert next.options == options
    # The reply echoes what the query as asked gets echoed: its NSID and Client Subnet, not a
    # local option, nor what the rules set.
    if asked is None:
        assert opt_options(reply) is None
    else:
        echoed = [option for option in asked if option[0] == NSID]
        assert opt_options(reply) == echoed + [o for o in asked if o[0] == SUBNET][:1]


# rewrite_test.go TestRewriteEDNS0LocalVariable (the client 10.240.0.1, over UDP); the metadata
# ones are left out (toposdns has no metadata plugin), and the refused variables above.
VARIABLES = [
    ("{qname}", b"example.com."),
    ("{qtype}", b"\x00\x01"),
    ("{client_ip}", b"\x0a\xf0\x00\x01"),
    ("{protocol}", b"udp"),
]


@pytest.mark.parametrize(("variable", "data"), VARIABLES)
def test_edns0_local_variable(tmp_path: Path, variable: str, data: bytes) -> None:
    next = Printer()
    ask(
        handler(tmp_path, f"rewrite edns0 local set 0xffee {variable}"),
        query_of("example.com."),
        next,
    )
    assert next.options == [(LOCAL, data)]


def test_edns0_variables_of_another_query(tmp_path: Path) -> None:
    # {qname} is the name as the rules before left it, in its case; {protocol} and {client_ip}.
    rewrite = handler(
        tmp_path,
        "rewrite continue name exact Example.com. example.ORG",
        "rewrite continue edns0 local set 0xffee {qname}",
        "rewrite continue edns0 local set 0xffed {protocol}",
        "rewrite edns0 local set 0xffec {client_ip}",
    )
    next = Printer()
    ask(rewrite, query_of("Example.com."), next, source="::ffff:10.1.2.3", transport=TCP4)
    assert next.options == [
        (LOCAL, b"example.org."),
        (0xFFED, b"tcp"),
        (0xFFEC, b"\x0a\x01\x02\x03"),
    ]


# rewrite_test.go TestRewriteEDNS0Subnet: (client, words after `edns0`, the option's value:
# family, source prefix, scope, the address bytes the prefix covers)
SUBNETS = [
    (V4_CLIENT, "subnet set 24 56", b"\x00\x01\x18\x00\x0a\xf0\x00"),
    (V4_CLIENT, "subnet set 32 56", b"\x00\x01\x20\x00\x0a\xf0\x00\x01"),
    (V4_CLIENT, "subnet set 0 56", b"\x00\x01\x00\x00"),
    (V6_CLIENT, "subnet set 24 56", b"\x00\x02\x38\x00\xfe\x80\x00\x00\x00\x00\x00"),
    (
        V6_CLIENT,
        "subnet set 24 128",
        b"\x00\x02\x80\x00\xfe\x80\x00\x00\x00\x00\x00\x00\x00\x42\x00\xff\xfe\xca\x4c\x65",
    ),
    (V6_CLIENT, "subnet set 24 0", b"\x00\x02\x00\x00"),
]


@pytest.mark.parametrize(("client", "words", "value"), SUBNETS)
def test_edns0_subnet(tmp_path: Path, client: str, words: str, value: bytes) -> None:
    next = Printer()
    transport = UDP6 if ":" in client else UDP4
    ask(
        handler(tmp_path, f"rewrite edns0 {words}"),
        query_of("example.com."),
        next,
        client,
        transport,
    )
    assert next.options == [(SUBNET, value)]


# rewrite_test.go TestRewriteEDNS0Unset: (options asked, words after `edns0`, options passed)
UNSET = [
    ([], "local unset 0xffee", []),
    ([(LOCAL, b"\xab\xcd\xef")], "local unset 0xffee", []),
    ([(LOCAL, b"\xab\xcd\xef")], "local unset 0xffed", [(LOCAL, b"\xab\xcd\xef")]),
    ([(NSID, b"")], "nsid unset", []),
    ([], "nsid unset", []),
    ([(SUBNET, SUBNET_ZERO)], "subnet unset", []),
    ([], "subnet unset", []),
    ([(LOCAL, b"foobar"), (NSID, b"")], "nsid unset", [(LOCAL, b"foobar")]),
    ([(LOCAL, b"foobar"), (NSID, b"")], "local unset 0xffee", [(NSID, b"")]),
    (
        [(LOCAL, b"foobar"), (NSID, b"")],
        "subnet unset",
        [(LOCAL, b"foobar"), (NSID, b"")],
    ),
]


@pytest.mark.parametrize(("asked", "words", "options"), UNSET)
def test_edns0_unset(
    tmp_path: Path,
    asked: list[tuple[int, bytes]],
    words: str,
    options: list[tuple[int, bytes]],
) -> None:
    next = Printer()
    ask(handler(tmp_path, f"rewrite edns0 {words}"), query_of("example.com.", options=asked), next)
    assert next.options == options


def test_edns0_revert_leaves_no_option_in_the_reply(tmp_path: Path) -> None:
    # TestRewriteEDNS0RevertDoesNotLeakThroughScrubWriter, edns0_test.go
    # TestEdns0LocalSetRevertNoLeak: the upstream's reply echoes the option it got; the client
    # gets its own cookie back, not the option.
    cookie = (COOKIE, b"abcdef0123456789")
    for answer in ([], ["example.org. 3600 IN A 127.0.0.1"]):
        next = Printer(answer)
        rewrite = handler(tmp_path, "rewrite edns0 local set 0xffee 0xabcdef revert")
        reply = ask(rewrite, query_of("example.org.", options=[cookie], do=False), next)
        assert next.options == [cookie, (LOCAL, b"\xab\xcd\xef")]
        assert [(opt.code, opt.data) for rr in reply.ar for opt in rr.rdata] == [cookie]


def test_append_adds_another_local_option_as_coredns_does(tmp_path: Path) -> None:
    # edns0.go's edns0LocalRule appends whether or not the code is there (its README says
    # otherwise); the variable rule and `subnet` leave an option that is there.
    next = Printer()
    asked = [(LOCAL, b"old"), (SUBNET, SUBNET_ZERO)]
    rewrite = handler(
        tmp_path,
        "rewrite continue edns0 local append 0xffee new",
        "rewrite continue edns0 local append 0xffee {qtype}",
        "rewrite edns0 subnet append 32 128",
    )
    ask(rewrite, query_of("example.com.", options=asked), next)
    assert next.options == [(LOCAL, b"old"), (SUBNET, SUBNET_ZERO), (LOCAL, b"new")]


def test_subnet_rewrites_the_first_option_only() -> None:
    # As tests/coredns_forwarder.py's stand-in: the production function it plays.
    from toposdns.serve.rewrite import rewrite_subnet

    ours, theirs = client_subnet(V4_CLIENT, 24, 56), b"\x00\x01\x08\x00\x01"
    options = [(SUBNET, theirs), (SUBNET, theirs)]
    assert ours is not None and rewrite_subnet(options, "set", ours)
    assert options == [(SUBNET, ours), (SUBNET, theirs)]
    assert not rewrite_subnet(options, "append", ours) and not rewrite_subnet([], "replace", ours)
    assert rewrite_subnet(options, "unset", b"") and options == []


# ----- what toposdns adds: the reply as the server writes it


def test_the_stop_and_continue_quirk_of_the_question(tmp_path: Path) -> None:
    # rewrite.go: without a `stop` rule applied and without reply rules, the reply is written
    # as the next plugin wrote it: the question stays as rewritten, as CoreDNS leaves it.
    rewrite = handler(tmp_path, "rewrite continue type AAAA A")
    reply = ask(rewrite, query_of("example.com.", "AAAA"))
    assert question_of(reply) == ("example.com.", A, IN)
    rewrite = handler(tmp_path, "rewrite stop type AAAA A")
    assert question_of(ask(rewrite, query_of("example.com.", "AAAA"))) == ("example.com.", 28, IN)


def test_a_query_no_rule_touches_goes_on_as_it_is(tmp_path: Path) -> None:
    next = Printer()
    data = query_of("other.example.", options=[(COOKIE, b"12345678")])
    request = Request(decode_query(data), data, UDP4, V4_CLIENT)
    rewrite = handler(tmp_path, "rewrite name exact a.example. b.example.", "rewrite type MX A")
    rewrite.serve(request, next)
    assert next.seen == [request]  # the same request, untouched


def test_a_reply_renamed_longer_is_cut_to_the_clients_buffer(tmp_path: Path) -> None:
    # 40 addresses: 1,015 bytes for s.x, more under the name asked; a client without EDNS
    # takes 512, over UDP: cut after whole records, with TC, as the server cuts its own.
    long = "a-name-much-longer-than-the-one-it-was-rewritten-to.example.com."
    rewrite = handler(tmp_path, f"rewrite name exact {long} s.x")
    answer = [f"s.x. 5 IN A 10.0.0.{n}" for n in range(40)]
    reply = ask(rewrite, query_of(long), Printer(answer))
    assert reply.header.tc and 0 < len(reply.rr) < 40
    assert len(reply.pack()) <= 512
    assert set(answer_names(reply)) == {long}
    reply = ask(rewrite, query_of(long), Printer(answer), transport=TCP4)
    assert not reply.header.tc and len(reply.rr) == 40


def test_a_reply_that_cannot_be_read_gets_servfail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rewrite = handler(tmp_path, "rewrite name exact a.example. b.example.")
    data = query_of("a.example.")
    request = Request(decode_query(data), data, UDP4, V4_CLIENT)
    with caplog.at_level(logging.WARNING, "toposdns"):
        for _ in range(2):
            reply = rewrite.serve(request, lambda changed: changed.data[:2] + b"\x81\x00\x00\x01")
            assert isinstance(reply, bytes)
            assert dnslib.DNSRecord.parse(reply).header.rcode == 2
    assert len(caplog.records) == 1 and "could not be read back" in caplog.records[0].getMessage()


def test_a_reply_from_an_upstream_is_changed_back_once_it_is_there(tmp_path: Path) -> None:
    rewrite = handler(tmp_path, "rewrite name suffix .corp.internal .example.org answer auto")
    printer = Printer()

    async def upstream(request: Request) -> bytes | None:
        reply = printer(request)
        assert isinstance(reply, bytes)
        return reply

    data = query_of("web.corp.internal.")
    pending = rewrite.serve(Request(decode_query(data), data, UDP4, V4_CLIENT), upstream)
    assert not isinstance(pending, bytes) and pending is not None
    reply = asyncio.run(pending)  # type: ignore[arg-type]
    assert isinstance(reply, bytes)
    assert answer_names(dnslib.DNSRecord.parse(reply)) == ["web.corp.internal."]
    assert printer.asked == ("web.example.org.", A, IN)


def test_names_in_presentation_form() -> None:
    assert presentation(("a.b", "c")) == "a\\.b.c."
    assert name_labels("a\\.b.c.") == ("a.b", "c")
    assert name_labels("x\\065y.") == ("xAy",)
    assert name_labels(".") == () and name_labels("a") == ("a",)
    for bad in ("", "a..b.", ".a.", "x" * 64 + ".", ("a" * 63 + ".") * 4 + "b.", "a\\"):
        assert name_labels(bad) is None


# ----- the kubernetes server block: its caches, and the rest of its chain


def server_of(tmp_path: Path, *lines: str) -> DnsServer:
    config = read(tmp_path, *lines)
    objects = [*SHOP_WEB, service("api", "shop", cluster_ip="10.96.0.6")]
    return DnsServer(config, config_of(), snapshot_of(objects))


def respond(server: DnsServer, name: str, qtype: str = "A") -> dnslib.DNSRecord:
    reply = server.responder.respond(query_of(name, qtype), UDP4, "127.0.0.1")
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


def test_the_kubernetes_block_answers_a_rewritten_name_under_the_name_asked(
    tmp_path: Path,
) -> None:
    server = server_of(
        tmp_path,
        "rewrite name exact foo.example.com web.shop.svc.cluster.local",
        "rewrite name suffix .corp.internal .svc.cluster.local answer auto",
    )
    for name in ("foo.example.com.", "FOO.Example.com.", "web.shop.corp.internal."):
        for _ in range(2):
            reply = respond(server, name)
            assert question_of(reply) == (name, A, IN)
            assert [(str(rr.rname), str(rr.rdata)) for rr in reply.rr] == [
                (name.lower(), "10.96.0.5")
            ]
            assert reply.header.aa
    # Neither cached under the name asked nor under the name it was rewritten to.
    assert not server.responder.cache.table
    assert respond(server, "web.shop.svc.cluster.local.").rr  # asked as it is: cached
    assert len(server.responder.cache.table) == 1


def test_a_name_a_rule_matches_never_gets_a_cached_reply(tmp_path: Path) -> None:
    # web is rewritten to api; a.example to web (and stops there). a.example's answer is
    # web's, which must not then answer web itself from a cache: web is api.
    server = server_of(
        tmp_path,
        "rewrite name exact a.example web.shop.svc.cluster.local",
        "rewrite name exact web.shop.svc.cluster.local api.shop.svc.cluster.local",
    )
    for _ in range(2):
        assert [str(rr.rdata) for rr in respond(server, "a.example.").rr] == ["10.96.0.5"]
        assert [str(rr.rdata) for rr in respond(server, "web.shop.svc.cluster.local.").rr] == [
            "10.96.0.6"
        ]
        assert [str(rr.rdata) for rr in respond(server, "api.shop.svc.cluster.local.").rr] == [
            "10.96.0.6"
        ]
    assert len(server.responder.cache.table) == 1  # api, asked as it is


def test_an_edns0_rule_touches_every_query(tmp_path: Path) -> None:
    server = server_of(tmp_path, "rewrite edns0 local set 0xffee 0xab")
    for _ in range(2):
        reply = respond(server, "web.shop.svc.cluster.local.")
        assert [str(rr.rdata) for rr in reply.rr] == ["10.96.0.5"] and not reply.ar
    assert not server.responder.cache.table


def test_a_rewritten_name_the_block_does_not_hold_goes_to_its_forwarder(tmp_path: Path) -> None:
    # A rewritten query stays in its server block, as in CoreDNS: kubernetes passes it on to
    # forward (here none: REFUSED for a name outside the zones, as the block answers it).
    server = server_of(tmp_path, "rewrite name exact web.shop.svc.cluster.local example.org")
    reply = respond(server, "web.shop.svc.cluster.local.")
    assert reply.header.rcode == 5 and question_of(reply)[0] == "web.shop.svc.cluster.local."


def test_rewrite_runs_before_hosts_in_the_kubernetes_block(tmp_path: Path) -> None:
    server = server_of(
        tmp_path,
        "rewrite name suffix .lan .shop.svc.cluster.local answer auto",
        "hosts nothere {",
        "    192.0.2.7 node.shop.svc.cluster.local",
        "    fallthrough",
        "}",
    )
    assert [handler.name for handler in server.front_handlers] == ["rewrite", "hosts"]
    assert [str(rr.rdata) for rr in respond(server, "node.lan.").rr] == ["192.0.2.7"]
    assert [str(rr.rdata) for rr in respond(server, "web.lan.").rr] == ["10.96.0.5"]


def test_a_reloaded_corefile_replaces_the_rewrite_handler(tmp_path: Path) -> None:
    server = server_of(tmp_path, "rewrite name exact a.example web.shop.svc.cluster.local")
    (before,) = server.front_handlers
    server.reconfigure(replace(server.config, kubernetes=config_of(ttl=7)))
    assert server.front_handlers == [before]
    rules = read(tmp_path, "rewrite name exact a.example api.shop.svc.cluster.local").rewrite
    server.reconfigure(replace(server.config, rewrite=rules))
    (after,) = server.front_handlers
    assert after is not before
    assert [str(rr.rdata) for rr in respond(server, "a.example.").rr] == ["10.96.0.6"]
    server.reconfigure(replace(server.config, rewrite=RewriteOptions()))
    assert not server.front_handlers and respond(server, "a.example.").header.rcode == 5


# ----- a server block without kubernetes


def test_a_blocks_chain_runs_rewrite_before_hosts_before_forward(tmp_path: Path) -> None:
    corefile = tmp_path / "Corefile"
    corefile.write_text(
        ".:53 {\n  kubernetes cluster.local\n}\n"
        "corp.internal:53 {\n"
        "  rewrite name suffix .corp.internal .example.org answer auto\n"
        "  rewrite continue type AAAA A\n"
        "  hosts nothere example.org {\n    192.0.2.9 web.example.org\n    fallthrough\n  }\n"
        "  forward . 127.0.0.1:1\n"
        "}\n"
    )
    (block,) = read_corefile(corefile).done().blocks
    assert [kind(rule) for rule in block.rewrite.rules] == ["name suffix", "type"]
    assert block.hosts.inline == (Inline("192.0.2.9 web.example.org", block.hosts.inline[0].place),)
    forwarder = block_forwarder(block, 1 << 20)
    assert forwarder is not None
    link, handlers = block_chain(block, forwarder)
    assert [handler.name for handler in handlers] == ["rewrite", "hosts", "forward"]
    data = query_of("web.corp.internal.")
    reply = link(Request(decode_query(data), data, UDP4, "127.0.0.1"))
    assert isinstance(reply, bytes)
    found = dnslib.DNSRecord.parse(reply)
    assert question_of(found) == ("web.corp.internal.", A, IN)
    assert [(str(rr.rname), str(rr.rdata)) for rr in found.rr] == [
        ("web.corp.internal.", "192.0.2.9")
    ]


def test_a_block_without_forward_ends_in_servfail_under_the_name_asked(tmp_path: Path) -> None:
    options = RewriteOptions(
        True, (NameRule("stop", "suffix", ".corp.internal.", ".example.org.", False),)
    )
    config = BlockConfig((("corp", "internal"),), rewrite=options, hosts=HostsOptions())
    link, handlers = block_chain(config, None)
    assert [handler.name for handler in handlers] == ["rewrite"]
    data = query_of("web.corp.internal.")
    reply = link(Request(decode_query(data), data, UDP4, "127.0.0.1"))
    assert isinstance(reply, bytes)
    found = dnslib.DNSRecord.parse(reply)
    assert found.header.rcode == 2 and question_of(found)[0] == "web.corp.internal."


def test_a_changed_query_goes_down_the_rest_of_the_chain(tmp_path: Path) -> None:
    rewrite = handler(tmp_path, "rewrite name exact a.example b.example")
    data = query_of("a.example.")
    seen: list[Request] = []

    def rest(request: Request) -> Reply:
        seen.append(request)
        return Printer()(request)

    reply = rewrite.serve(Request(decode_query(data), data, UDP4, V4_CLIENT), rest)
    assert isinstance(reply, bytes) and [presentation(r.query.name) for r in seen] == ["b.example."]
    assert [str(rr.rname) for rr in dnslib.DNSRecord.parse(reply).rr] == ["a.example."]


def test_forward_options_are_kept_beside_rewrite(tmp_path: Path) -> None:
    corefile = tmp_path / "Corefile"
    corefile.write_text(
        ".:53 {\n  kubernetes cluster.local\n}\n"
        "example.org:53 {\n  rewrite name a.example.org b.example.org\n"
        "  forward . 127.0.0.1:5300\n}\n"
    )
    (block,) = read_corefile(corefile).done().blocks
    assert block.forward == replace(block.forward, upstreams=(Upstream("127.0.0.1", 5300),))
    assert isinstance(block.forward, ForwardOptions) and block.rewrite.enabled
    assert block.zones == (("example", "org"),)


def test_a_reply_is_counted_under_the_plugin_that_wrote_it(tmp_path: Path) -> None:
    # rewrite changes replies back; the `plugin` label is the one that wrote them.
    rewrite = handler(tmp_path, "rewrite name exact a.example b.example")
    data = query_of("a.example.")
    request = Request(decode_query(data), data, UDP4, V4_CLIENT)

    def hosts(changed: Request) -> Reply:
        changed.written_by = "hosts"
        return Printer()(changed)

    rewrite.serve(request, hosts)
    assert request.written_by == "hosts"
    server = server_of(tmp_path, "rewrite name exact a.example web.shop.svc.cluster.local")
    (front,) = server.front_handlers
    assert isinstance(front, Rewrite)
    request = Request(decode_query(data), data, UDP4, V4_CLIENT)
    server.responder.chain(request)  # the kubernetes block's chain: rewrite, then kubernetes
    assert request.written_by == "kubernetes"
