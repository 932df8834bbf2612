"""CoreDNS's `rewrite`: a query changed on its way in, its reply changed back on its way out.

    rewrite [continue|stop] name [exact|prefix|suffix|substring|regex] FROM TO
            [answer auto|answer name FROM TO|answer value FROM TO]...
    rewrite [continue|stop] ttl [exact|prefix|suffix|substring|regex] NAME SECONDS|MIN-MAX
    rewrite [continue|stop] type FROM TO
    rewrite [continue|stop] class FROM TO
    rewrite [continue|stop] edns0 local|nsid|subnet set|replace|append|unset ... [revert]
    rewrite [continue|stop] {
        name regex FROM TO
        answer name FROM TO
    }

As CoreDNS 1.14's plugin/rewrite (rewrite.go, setup.go, name.go, ttl.go, type.go, class.go,
edns0.go, reverter.go):

- **Rules.** The `rewrite` directives of a server block make one list, in order; each is one
  rule (the block form too: its lines are the words of one rule). Each rule is tried on the
  question as the rules before it left it. One that applies (a name that matches, a type or
  class equal to FROM, an EDNS0 option written) ends the list when its mode is `stop`, the
  default; with `continue` the next ones are tried too.
- **Names** are matched in lower case, in presentation form with the final dot
  (`foo.example.com.`), by `exact` (the default), `prefix`, `suffix`, `substring` (FROM and TO
  lower-cased with a final dot added, CoreDNS's `plugin.Name.Normalize`: `prefix foo bar` turns
  `foo.` into `bar.`) or `regex` (Go's RE2 syntax, run by RE2 itself, found anywhere in the
  name; `{N}` in TO is its Nth group, TO lower-cased with a final dot). A rewritten name that is
  none (an empty label, a label over 63 octets) gets SERVFAIL.
- **The reply** gets the question back as asked, unless no `stop` rule applied and none that
  applied changes replies: then, as CoreDNS, it keeps the question as rewritten. Its records
  (answer, authority, additional; not the OPT record) are changed by the reply rules of each
  rule that applied, the last rule's first: `answer name FROM TO` gives an owner name that FROM
  (a regex) finds the name TO; `answer value FROM TO` does so to the name a CNAME, DNAME, NS,
  PTR, MX, SRV, NAPTR or SOA (its MNAME) holds; `answer auto` maps the name as rewritten, and
  the names below it, back to the name asked (in lower case), in owner names and values, and an
  `exact` rule always does; for a `suffix` rule, `answer auto` maps the suffix back; a `ttl`
  rule brings every record's TTL into [MIN, MAX].
- **EDNS0** options: `local CODE DATA` (DATA in hex after `0x`, else the word's bytes, or one
  of `{qname}`, `{qtype}`, `{client_ip}`, `{protocol}`), `nsid` (empty), and `subnet V4 V6`
  (the client's address cut to V4 or V6 bits, SCOPE 0; `client_subnet`, which
  tests/coredns_forwarder.py's CoreDNS stand-in plays too). `set` rewrites the first option of
  its code, or adds one; `replace` only rewrites; `append` adds one (for `subnet`, only when
  there is none); `unset` removes every one. A query without an OPT record gets one (buffer
  4096) as soon as an `edns0` rule is tried, whether it applies or not.

Left out (refused at startup, with the file and line): `cname` and `rcode` rules, and the
`{client_port}`, `{server_ip}`, `{server_port}` and metadata variables. A reply's OPT record is
the one the query as asked gets from the server block (its buffer size, DO bit and the options
it echoes): options a rule set are never echoed, so `revert` is accepted and changes nothing
(CoreDNS echoes, without `revert`, a `local` or `nsid` option a rule set in the replies its
own plugins write), and a client that sent no OPT record gets none. A reply is written again
as the server writes its own: uncompressed when it fits the client's buffer, else compressed
and cut, with TC.

**Caching.** In the kubernetes server block the rules run in its chain (after `cache`, before
`autopath`, `template`, `hosts` and `kubernetes`), on a reply-cache miss. A query that a rule
applies to, or that reaches an `edns0` rule, is answered by the chain after it each time: the
changed query goes down the rest of the chain, whose answer is neither cached nor looked up in
the caches (its question is not the one asked). A query that no rule touches is passed on
unchanged, and the kubernetes plugin's answer to it is cached as before. The cache is
consulted before the rules (a hit answers before any plugin runs), and that is sound: whether
a rule touches a query depends only on what the cache key holds (its name in lower case, its
type and class; every `edns0` rule is reached from the same rules before it), so the key of a
query a rule touches never has a reply stored.

**Cost.** A query no rule touches costs the match: its name in presentation form once (only
with `name` or `ttl` rules), a comparison or a regex search per rule. A query a rule touches is
written anew and decoded, answered, and its reply parsed (dnslib) and written again.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field, replace
from struct import pack
from typing import Any, Literal

import dnslib

from toposdns.options import Origin, Plugin, Setting
from toposdns.serve.chain import Next, Reply, Request
from toposdns.serve.go_regex import PatternError, go_regex
from toposdns.wire.codes import (
    CLIENT_SUBNET,
    CNAME,
    MX,
    NS,
    NSID,
    OPT,
    PTR,
    RCODE,
    SERVFAIL,
    SOA,
    SRV,
    Name,
)
from toposdns.wire.decode import HEADER_SIZE, Query, decode_query, read_name, record_spans
from toposdns.wire.encode import encode_bare, encode_opt, name_wire, truncate
from toposdns.wire.records import name_text, type_code

log = logging.getLogger("toposdns")

# Modes and the words of the rules.
Mode = Literal["stop", "continue"]
STOP: Mode = "stop"
CONTINUE: Mode = "continue"
EXACT, PREFIX, SUFFIX, SUBSTRING, REGEX = "exact", "prefix", "suffix", "substring", "regex"
MATCHES = (EXACT, PREFIX, SUFFIX, SUBSTRING, REGEX)
SET, REPLACE, APPEND, UNSET = "set", "replace", "append", "unset"

#: CoreDNS's bound on a regex (name.go maxRegexpLen): longer ones are refused.
MAX_PATTERN = 10_000
#: The buffer size of the OPT record an `edns0` rule gives a query that has none (miekg/dns
#: SetEdns0(4096, false), as CoreDNS's setupEdns0Opt).
ADDED_OPT_SIZE = 4096
#: The largest TTL an open `MIN-` range allows (ttl.go).
MAX_TTL = 2147483647
#: DNS classes by name (miekg/dns StringToClass).
CLASSES = {"IN": 1, "CS": 2, "CH": 3, "HS": 4, "NONE": 254, "ANY": 255}
#: EDNS option codes miekg/dns reads as options of their own: an `edns0 local` rule never
#: takes one of them for a local option of the same code.
TYPED_OPTIONS = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15})
#: `edns0 local` variables toposdns has, and those CoreDNS has that it does not.
VARIABLES = ("{qname}", "{qtype}", "{client_ip}", "{protocol}")
UNSUPPORTED_VARIABLES = ("{client_port}", "{server_ip}", "{server_port}")
#: The record types whose names `answer value` rewrites, and where dnslib keeps that name
#: (reverter.go getRecordValueForRewrite). DNAME and NAPTR have no constant in wire/codes.py.
DNAME, NAPTR = 39, 35
VALUE_FIELDS = {
    SRV: "target",
    MX: "label",
    CNAME: "label",
    NS: "label",
    DNAME: "label",
    NAPTR: "replacement",
    SOA: "mname",
    PTR: "label",
}
#: An example of each kind of rule, for messages.
EXAMPLES = {
    "name": "rewrite name suffix .corp.internal .svc.cluster.local answer auto",
    "ttl": "rewrite ttl suffix .svc.cluster.local 30-300",
    "type": "rewrite type ANY HINFO",
    "class": "rewrite class CH IN",
    "edns0": "rewrite edns0 subnet set 32 128",
}

#: A label in presentation form that needs no escape (miekg/dns escapes the others).
_SPECIAL = re.compile(r'[^!-~]|[.\\"()@;$]')


# ----- names in presentation form, as CoreDNS's rules see them


def presentation(name: Name) -> str:
    """A name in presentation form with the final dot, escaped as miekg/dns writes it."""
    if any(_SPECIAL.search(label) for label in name):
        return name_text(name)
    return ".".join(name) + "." if name else "."


def name_labels(text: str) -> Name | None:
    """The labels of a name in presentation form (`\\.` and `\\DDD` escapes read), or None when
    it is none: empty, with an empty label, a label over 63 octets, or over 255 in all (miekg/dns
    IsDomainName)."""
    if text == ".":
        return ()
    labels: list[bytes] = []
    label = bytearray()
    at, size = 0, len(text)
    if not text:
        return None
    while at < size:
        char = text[at]
        if char == "\\":
            digits = text[at + 1 : at + 4]
            if len(digits) == 3 and digits.isascii() and digits.isdigit():
                if int(digits) > 255:
                    return None
                label.append(int(digits))
                at += 4
                continue
            if at + 1 >= size:
                return None
            label += text[at + 1].encode()
            at += 2
        elif char == ".":
            if not label:
                return None
            labels.append(bytes(label))
            label = bytearray()
            at += 1
        else:
            label += char.encode()
            at += 1
    if label:
        labels.append(bytes(label))
    if any(len(part) > 63 for part in labels) or sum(len(p) + 1 for p in labels) + 1 > 255:
        return None
    return tuple(part.decode("latin-1") for part in labels)


def normalized(text: str) -> str:
    """CoreDNS's `plugin.Name(text).Normalize()`: lower case, with a final dot (miekg/dns Fqdn:
    a dot escaped by a backslash is no final dot)."""
    body = text[:-1] if text.endswith(".") else None
    if body is not None and (len(body) - len(body.rstrip("\\"))) % 2 == 0:
        return text.lower()
    return (text + ".").lower()


def groups_used(text: str) -> int:
    """How many of `{0}` to `{100}` a TO uses (name.go getSubExprUsage)."""
    return sum(1 for index in range(101) if f"{{{index}}}" in text)


def substituted(template: str, found: Any) -> str:
    """TO with `{N}` replaced by the Nth group a regex found, group 0 first (a group that took
    no part is empty), as name.go does."""
    text = template
    values = [found.group(0), *(value or "" for value in found.groups())]
    for index, value in enumerate(values):
        text = text.replace(f"{{{index}}}", value)
    return text


# ----- the reply rules


@dataclass(frozen=True, slots=True)
class RegexRewriter:
    """A name that `pattern` finds becomes `replacement`, its `{N}` groups filled."""

    pattern: str
    replacement: str

    def rewrite(self, name: str) -> str:
        found = go_regex(self.pattern).search(name)
        return name if found is None else substituted(self.replacement, found)


@dataclass(frozen=True, slots=True)
class SuffixRewriter:
    """A name ending in `suffix` gets `replacement` there instead."""

    suffix: str
    replacement: str

    def rewrite(self, name: str) -> str:
        if name.endswith(self.suffix):
            return name[: len(name) - len(self.suffix)] + self.replacement
        return name


@dataclass(frozen=True, slots=True)
class RemapRewriter:
    """`orig`, and every name below it, gets `replacement` there instead (`answer auto`)."""

    orig: str
    replacement: str

    def rewrite(self, name: str) -> str:
        if name == self.orig:
            return self.replacement
        cut = len(name) - len(self.orig)
        if cut > 0 and name[cut - 1] == "." and name[cut:] == self.orig:
            return name[:cut] + self.replacement
        return name


Rewriter = RegexRewriter | SuffixRewriter | RemapRewriter


@dataclass(frozen=True, slots=True)
class AnswerRule:
    """`answer name` (owner names) or `answer value` (the name a record holds)."""

    part: Literal["name", "value"]
    rewriter: Rewriter


@dataclass(frozen=True, slots=True)
class TtlClamp:
    """A `ttl` rule's reply rule: every TTL brought into [low, high]."""

    low: int
    high: int


ReplyRule = AnswerRule | TtlClamp
#: What a rule that does not apply gives.
IGNORED: tuple[bool, tuple[ReplyRule, ...]] = (False, ())


# ----- the query as the rules change it


class Asked:
    """A query's question and OPT record as the rules have left them so far (CoreDNS's rules
    change the request in place: this is that request)."""

    __slots__ = (
        "query",
        "source",
        "tcp",
        "labels",
        "renamed",
        "_name",
        "_lowered",
        "qtype",
        "qclass",
        "options",
        "udp_size",
        "flags",
    )

    def __init__(self, query: Query, source: str, tcp: bool) -> None:
        self.query = query
        self.source = source
        self.tcp = tcp
        self.labels: Name = query.name
        #: Whether a rule has written a new name (checked before it goes on).
        self.renamed = False
        self._name: str | None = None
        self._lowered: str | None = None
        self.qtype = query.qtype
        self.qclass = query.qclass
        #: The OPT record's options once an `edns0` rule has been tried (None before).
        self.options: list[tuple[int, bytes]] | None = None
        self.udp_size = 0
        self.flags = 0

    @property
    def name(self) -> str:
        """The question's name in presentation form, as written (CoreDNS's `QName()`)."""
        if self._name is None:
            self._name = presentation(self.labels)
        return self._name

    @property
    def lowered(self) -> str:
        """The name in lower case, as CoreDNS's rules match it (`state.Name()`)."""
        if self._lowered is None:
            self._lowered = self.name.lower()
        return self._lowered

    def rename(self, name: str) -> None:
        self._name, self._lowered, self.renamed = name, None, True

    def opt(self) -> list[tuple[int, bytes]]:
        """The OPT record's options, to change: CoreDNS's setupEdns0Opt gives the query an OPT
        record (buffer 4096, DO off) when it has none."""
        if self.options is None:
            edns = self.query.edns
            if edns is None:
                self.udp_size, self.flags, self.options = ADDED_OPT_SIZE, 0, []
            else:
                self.udp_size, self.flags, self.options = (
                    edns.udp_size,
                    edns.ttl,
                    list(edns.options),
                )
        return self.options

    def changed(self) -> bool:
        """Whether the query is another than the one asked."""
        query = self.query
        if self.labels != query.name or (self.qtype, self.qclass) != (query.qtype, query.qclass):
            return True
        if self.options is None:
            return False
        return query.edns is None or tuple(self.options) != query.edns.options

    def message(self, data: bytes) -> bytes:
        """The query as changed, in wire form: its ID and flags as asked, the new question, and
        its OPT record (other records are left out)."""
        options = self.options
        if options is None:
            edns = self.query.edns
            opt = b""
            if edns is not None:
                opt = _opt_record(edns.udp_size, edns.ttl, edns.options)
        else:
            opt = _opt_record(self.udp_size, self.flags, options)
        header = data[:4] + pack("!4H", 1, 0, 0, 1 if opt else 0)
        return header + name_wire(self.labels) + pack("!HH", self.qtype, self.qclass) + opt


def _opt_record(udp_size: int, ttl: int, options: Sequence[tuple[int, bytes]]) -> bytes:
    rdata = b"".join(pack("!HH", code, len(value)) + value for code, value in options)
    return b"\x00" + pack("!HHIH", OPT, udp_size, ttl, len(rdata)) + rdata


# ----- the rules


@dataclass(frozen=True, slots=True)
class NameRule:
    """`name [MATCH] FROM TO [answer ...]`."""

    mode: Mode
    match: str
    #: FROM, normalized (a regex as written).
    source: str
    #: TO, normalized.
    target: str
    #: `answer auto` (an `exact` rule always): map the rewritten name back in the reply.
    auto: bool = False
    #: The reply rules written after it (and a suffix rule's `answer auto`).
    answers: tuple[AnswerRule, ...] = ()

    def rewrite(self, asked: Asked) -> tuple[bool, tuple[ReplyRule, ...]]:
        name = asked.lowered
        match, source, target = self.match, self.source, self.target
        if match == EXACT:
            if name != source:
                return IGNORED
            new = target
        elif match == PREFIX:
            if not name.startswith(source):
                return IGNORED
            new = target + name[len(source) :]
        elif match == SUFFIX:
            if not name.endswith(source):
                return IGNORED
            new = name[: len(name) - len(source)] + target
        elif match == SUBSTRING:
            if source not in name:
                return IGNORED
            new = name.replace(source, target)
        else:
            found = go_regex(source).search(name)
            if found is None:
                return IGNORED
            new = substituted(target, found)
        asked.rename(new)
        if not self.auto:
            return True, self.answers
        back = RemapRewriter(new, name)
        return True, (AnswerRule("name", back), AnswerRule("value", back), *self.answers)


@dataclass(frozen=True, slots=True)
class TtlRule:
    """`ttl [MATCH] NAME SECONDS|MIN-MAX`."""

    mode: Mode
    match: str
    source: str
    low: int
    high: int

    def rewrite(self, asked: Asked) -> tuple[bool, tuple[ReplyRule, ...]]:
        name, source, match = asked.lowered, self.source, self.match
        if match == EXACT:
            found = name == source
        elif match == PREFIX:
            found = name.startswith(source)
        elif match == SUFFIX:
            found = name.endswith(source)
        elif match == SUBSTRING:
            found = source in name
        else:
            found = go_regex(source).search(name) is not None
        return (True, (TtlClamp(self.low, self.high),)) if found else IGNORED


@dataclass(frozen=True, slots=True)
class TypeRule:
    """`type FROM TO`."""

    mode: Mode
    source: int
    target: int

    def rewrite(self, asked: Asked) -> tuple[bool, tuple[ReplyRule, ...]]:
        if asked.qtype != self.source:
            return IGNORED
        asked.qtype = self.target
        return True, ()


@dataclass(frozen=True, slots=True)
class ClassRule:
    """`class FROM TO`."""

    mode: Mode
    source: int
    target: int

    def rewrite(self, asked: Asked) -> tuple[bool, tuple[ReplyRule, ...]]:
        if asked.qclass != self.source:
            return IGNORED
        asked.qclass = self.target
        return True, ()


@dataclass(frozen=True, slots=True)
class Edns0Rule:
    """`edns0 local|nsid|subnet ACTION ...`."""

    mode: Mode
    option: Literal["local", "nsid", "subnet"]
    action: str
    #: The option code (`local`), and its data or variable.
    code: int = 0
    data: bytes = b""
    variable: str = ""
    #: `subnet`'s prefix lengths.
    v4: int = 0
    v6: int = 0

    def rewrite(self, asked: Asked) -> tuple[bool, tuple[ReplyRule, ...]]:
        data = self.data
        if self.variable:  # edns0VariableRule reads its value first: none, no OPT record either
            found = variable_data(self.variable, asked)
            if found is None:
                return IGNORED
            data = found
        options = asked.opt()
        if self.option == "subnet":
            value = b""
            if self.action != UNSET:
                found = client_subnet(asked.source, self.v4, self.v6)
                if found is None:
                    return IGNORED
                value = found
            return (True, ()) if rewrite_subnet(options, self.action, value) else IGNORED
        code = NSID if self.option == "nsid" else self.code
        if self.action == UNSET:
            options[:] = [option for option in options if option[0] != code]
            return True, ()
        for index, (have, _) in enumerate(options):
            if have != code or (self.option == "local" and code in TYPED_OPTIONS):
                continue
            if self.action in (SET, REPLACE):
                options[index] = (code, data)
                return True, ()
            if self.variable:  # edns0VariableRule: an option of the code there already
                return IGNORED
        if self.action in (SET, APPEND):
            options.append((code, data))
            return True, ()
        return IGNORED


Rule = NameRule | TtlRule | TypeRule | ClassRule | Edns0Rule


def variable_data(variable: str, asked: Asked) -> bytes | None:
    """An `edns0 local` variable's value for this query (edns0.go ruleData, wire.go); None when
    there is none (a client address that is none)."""
    if variable == "{qname}":
        return asked.name.encode()
    if variable == "{qtype}":
        return pack("!H", asked.qtype)
    if variable == "{protocol}":
        return b"tcp" if asked.tcp else b"udp"
    address = _client_address(asked.source)
    return None if address is None else address.packed


def _client_address(source: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The client's address, an IPv4-mapped IPv6 one as IPv4 (Go's To4), or None."""
    try:
        address = ipaddress.ip_address(source.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def client_subnet(source: str, v4: int, v6: int) -> bytes | None:
    """The Client Subnet option CoreDNS's `edns0 subnet` rule writes for a query from `source`,
    with its V4 and V6 lengths: its family, the address cut to V4 or V6 bits, that length, SCOPE
    0, the address bytes the prefix covers (RFC 7871). None when `source` is no address."""
    address = _client_address(source)
    if address is None:
        return None
    family, length = (1, v4) if address.version == 4 else (2, v6)
    network = ipaddress.ip_network(f"{address}/{length}", strict=False)
    raw = network.network_address.packed[: (length + 7) // 8]
    return pack("!HBB", family, length, 0) + raw


def rewrite_subnet(options: list[tuple[int, bytes]], action: str, value: bytes) -> bool:
    """Rewrite a query's EDNS options, in order, as CoreDNS's `edns0 subnet ACTION` does with
    the option `value` (`client_subnet`): `unset` removes every Client Subnet option; `set` and
    `replace` overwrite the first one, `append` leaves it as it is (a later one is not looked
    at); without one, `set` and `append` add one. Whether the rule applied."""
    if action == UNSET:
        options[:] = [option for option in options if option[0] != CLIENT_SUBNET]
        return True
    for index, (code, _) in enumerate(options):
        if code == CLIENT_SUBNET:
            if action in (SET, REPLACE):
                options[index] = (CLIENT_SUBNET, value)
                return True
            return False
    if action in (SET, APPEND):
        options.append((CLIENT_SUBNET, value))
        return True
    return False


# ----- reading the rules (setup.go, rewrite.go newRule, and each rule's constructor)


def _error(origin: Origin, kind: str, message: str) -> Exception:
    example = EXAMPLES.get(kind, EXAMPLES["name"])
    return origin.error(f"{message}, e.g. {example}")


def checked_regex(pattern: str, target: str, origin: Origin, kind: str, what: str = "") -> None:
    """CoreDNS's isValidRegexPattern: the pattern short enough, RE2's, and with as many groups
    as `target` uses."""
    if len(pattern) > MAX_PATTERN:
        raise _error(origin, kind, f"{what}regex pattern too long: {len(pattern)} > {MAX_PATTERN}")
    try:
        compiled = go_regex(pattern)
    except PatternError as exc:
        message = f"{what}invalid regex matching pattern: {pattern} ({exc})"
        raise _error(origin, kind, message) from None
    if groups_used(target) > compiled.groups:
        raise _error(
            origin,
            kind,
            f"{what}the rewrite regex pattern ({target}) uses more subexpressions than its "
            f"corresponding matching regex pattern ({pattern})",
        )


def parse_rule(words: Sequence[str], origin: Origin) -> Rule:
    """One rule from its words (rewrite.go newRule)."""
    if not words:
        raise _error(origin, "name", "no rule type specified for rewrite")
    first = words[0].lower()
    mode: Mode = STOP
    args = list(words[1:])
    if first in (STOP, CONTINUE):
        if len(words) < 2:
            raise _error(origin, "name", f"{first} rule must begin with a rule type")
        mode = CONTINUE if first == CONTINUE else STOP
        kind, args = words[1].lower(), list(words[2:])
    else:
        kind = first
    if kind == "answer":
        raise _error(origin, "name", "response rewrites must begin with a name rule")
    if kind == "name":
        return _name_rule(mode, args, origin)
    if kind in ("type", "class"):
        if len(args) != 2:
            raise _error(origin, kind, f"{kind} rules must have exactly two arguments")
        source, target = (
            _type(arg, origin) if kind == "type" else _class(arg, origin) for arg in args
        )
        return TypeRule(mode, source, target) if kind == "type" else ClassRule(mode, source, target)
    if kind == "ttl":
        return _ttl_rule(mode, args, origin)
    if kind == "edns0":
        return _edns0_rule(mode, args, origin)
    if kind in ("cname", "rcode"):
        raise origin.error(
            f"{kind} rules are not supported by toposdns; supported: name, ttl, type, class, edns0"
        )
    raise _error(origin, "name", f"invalid rule type {kind!r}")


def _name_rule(mode: Mode, args: list[str], origin: Origin) -> NameRule:
    """name.go newNameRule."""
    if len(args) < 2:
        raise _error(origin, "name", "too few arguments for a name rule")
    if len(args) == 2:
        match, source, target = EXACT, normalized(args[0]), normalized(args[1])
    else:
        match = args[0].lower()
        if match == REGEX:
            source, target = args[1], args[2]
        else:
            source, target = normalized(args[1]), normalized(args[2])
    auto = False
    answers: tuple[AnswerRule, ...] = ()
    if len(args) > 3:
        auto, answers = _answers(match, args[3:], origin)
    if match == EXACT:
        checked_regex(target, source, origin, "name")  # name.go checks them so, swapped
        return NameRule(mode, match, source, target, True, answers)
    if match == SUFFIX:
        back: tuple[AnswerRule, ...] = ()
        if auto:  # the suffix mapped back, rather than the whole name
            rewriter = SuffixRewriter(target, source)
            back = (AnswerRule("name", rewriter), AnswerRule("value", rewriter))
        return NameRule(mode, match, source, target, False, back + answers)
    if match in (PREFIX, SUBSTRING):
        return NameRule(mode, match, source, target, auto, answers)
    if match == REGEX:
        checked_regex(source, target, origin, "name")
        return NameRule(mode, match, source, normalized(target), auto, answers)
    raise _error(
        origin,
        "name",
        "name rule supports only exact, prefix, suffix, substring, and regex name matching, "
        f"received: {match}",
    )


def _answers(match: str, args: list[str], origin: Origin) -> tuple[bool, tuple[AnswerRule, ...]]:
    """name.go parseAnswerRules: `answer auto`, `answer name FROM TO`, `answer value FROM TO`,
    the word `answer` optional after the first."""
    if len(args) < 2:
        raise _error(origin, "name", f"invalid arguments for {match} rule")
    auto, rules, names, last, at = False, [], 0, "", 0
    while at < len(args):
        if not last and args[at] != "answer":
            raise _error(
                origin,
                "name",
                f"exceeded the number of arguments for a non-answer rule argument for {match} rule",
            )
        if args[at] == "answer":
            at += 1
        if at == len(args):
            raise _error(origin, "name", f"type missing for answer rule for {match} rule")
        last = args[at]
        at += 1
        if last == "auto":
            auto = True
            continue
        if last not in ("name", "value"):
            raise _error(origin, "name", f"invalid type {last!r} for answer rule for {match} rule")
        what = f"{last} answer rule for {match} rule: "
        if len(args) - at < 2:
            raise _error(origin, "name", f"{what}2 arguments required")
        pattern, target = args[at], args[at + 1]
        checked_regex(pattern, target, origin, "name", what)
        part: Literal["name", "value"] = "name" if last == "name" else "value"
        rules.append(AnswerRule(part, RegexRewriter(pattern, normalized(target))))
        names += last == "name"
        at += 2
    if auto and names:
        raise _error(
            origin,
            "name",
            "auto name answer rule cannot be combined with explicit name answer rules",
        )
    return auto, tuple(rules)


def _ttl_rule(mode: Mode, args: list[str], origin: Origin) -> TtlRule:
    """ttl.go newTTLRule."""
    if len(args) < 2:
        raise _error(origin, "ttl", f"too few ({len(args)}) arguments for a ttl rule")
    text = args[1] if len(args) == 2 else args[2] if len(args) == 3 else ""
    bounds = ttl_range(text)
    if bounds is None:
        raise _error(origin, "ttl", f"invalid TTL {text!r} for a ttl rule")
    if len(args) > 3:
        raise _error(origin, "ttl", "too many arguments for a ttl rule")
    if len(args) == 2:
        return TtlRule(mode, EXACT, normalized(args[0]), *bounds)
    match = args[0].lower()
    if match == REGEX:
        pattern = args[1]
        if len(pattern) > MAX_PATTERN:
            raise _error(
                origin,
                "ttl",
                f"regex pattern too long in a ttl rule: {len(pattern)} > {MAX_PATTERN}",
            )
        try:
            go_regex(pattern)
        except PatternError:
            raise _error(origin, "ttl", f"invalid regex pattern in a ttl rule: {pattern}") from None
        return TtlRule(mode, REGEX, pattern, *bounds)
    if match not in MATCHES:
        raise _error(
            origin,
            "ttl",
            "ttl rule supports only exact, prefix, suffix, substring, and regex name matching",
        )
    return TtlRule(mode, match, normalized(args[1]), *bounds)


def ttl_range(text: str) -> tuple[int, int] | None:
    """`SECONDS`, `MIN-MAX`, `MIN-` or `-MAX` as [MIN, MAX] (ttl.go isValidTTL); None when it
    is none of them."""
    parts = text.split("-")
    if len(parts) == 1:
        value = _uint(parts[0], 10, 0xFFFFFFFF)
        return None if value is None else (value, value)
    if len(parts) != 2 or parts == ["", ""]:
        return None
    low = 0 if parts[0] == "" else _uint(parts[0], 10, 0xFFFFFFFF)
    high = MAX_TTL if parts[1] == "" else _uint(parts[1], 10, 0xFFFFFFFF)
    if low is None or high is None or low > high:
        return None
    return low, high


def _uint(text: str, base: int, limit: int) -> int | None:
    """Go's strconv.ParseUint(text, base, ...): base 0 reads a `0x`, `0o`, `0b` or `0` prefix;
    None for anything else, or above `limit`. (Go's `_` digit separators are not taken.)"""
    digits = text
    if base == 0:
        prefixes = {"0x": 16, "0X": 16, "0o": 8, "0O": 8, "0b": 2, "0B": 2}
        if text[:2] in prefixes:
            base, digits = prefixes[text[:2]], text[2:]
        elif len(text) > 1 and text[0] == "0":
            base, digits = 8, text[1:]
        else:
            base = 10
    allowed = "0123456789abcdef"[:base]
    if not digits or any(char not in allowed for char in digits.lower()):
        return None
    value = int(digits, base)
    return value if value <= limit else None


def _type(word: str, origin: Origin) -> int:
    upper = word.upper()
    try:
        if upper.startswith("TYPE") and upper[4:].isdigit():
            raise ValueError(upper)  # miekg/dns StringToType has the mnemonics only
        return type_code(upper)
    except ValueError:
        raise _error(origin, "type", f"invalid type {upper!r}") from None


def _class(word: str, origin: Origin) -> int:
    upper = word.upper()
    if upper not in CLASSES:
        raise _error(origin, "class", f"invalid class {upper!r}")
    return CLASSES[upper]


def _edns0_rule(mode: Mode, args: list[str], origin: Origin) -> Edns0Rule:
    """edns0.go newEdns0Rule (and newEdns0UnsetRule)."""
    if len(args) < 2:
        raise _error(origin, "edns0", "too few arguments for an EDNS0 rule")
    option, action = args[0].lower(), args[1].lower()
    if action not in (SET, REPLACE, APPEND, UNSET):
        raise _error(origin, "edns0", f"invalid action: {action!r}")
    if option not in ("local", "nsid", "subnet"):
        raise _error(origin, "edns0", f"invalid rule type {option!r}")
    kind: Literal["local", "nsid", "subnet"] = (
        "local" if option == "local" else "nsid" if option == "nsid" else "subnet"
    )
    if action == UNSET:
        wanted = "two arguments" if kind == "local" else "one argument"
        if len(args) != (3 if kind == "local" else 2):
            raise _error(origin, "edns0", f"{kind} unset action requires exactly {wanted}")
        code = _code(args[2], origin) if kind == "local" else 0
        return Edns0Rule(mode, kind, action, code=code)
    if args[-1] == "revert":  # the reply never echoes what a rule set (module docstring)
        args = args[:-1]
    if option == "nsid":
        if len(args) != 2:
            raise _error(origin, "edns0", "EDNS0 NSID rules can accept no more than one arg")
        return Edns0Rule(mode, "nsid", action)
    if len(args) != 4:
        raise _error(origin, "edns0", f"EDNS0 {option} rules require three or four args")
    if option == "subnet":
        v4, v6 = _uint(args[2], 0, 0xFFFF), _uint(args[3], 0, 0xFFFF)
        if v4 is None or v4 > 32:
            raise _error(origin, "edns0", f"invalid IPv4 bit mask length {args[2]}")
        if v6 is None or v6 > 128:
            raise _error(origin, "edns0", f"invalid IPv6 bit mask length {args[3]}")
        return Edns0Rule(mode, "subnet", action, v4=v4, v6=v6)
    code, data = _code(args[2], origin), args[3]
    if data.startswith("{") and data.endswith("}"):
        if data in UNSUPPORTED_VARIABLES or "/" in data:
            raise origin.error(
                f"{data}: not supported by toposdns; supported: {', '.join(VARIABLES)}"
            )
        if data not in VARIABLES:
            raise _error(origin, "edns0", f"unsupported variable name {data!r}")
        return Edns0Rule(mode, "local", action, code=code, variable=data)
    if data.startswith("0x"):
        try:
            return Edns0Rule(mode, "local", action, code=code, data=bytes.fromhex(data[2:]))
        except ValueError:
            raise _error(origin, "edns0", f"{data!r} is not hexadecimal after 0x") from None
    return Edns0Rule(mode, "local", action, code=code, data=data.encode())


def _code(word: str, origin: Origin) -> int:
    code = _uint(word, 0, 0xFFFF)
    if code is None:
        raise _error(origin, "edns0", f"{word!r} is not an EDNS0 option code (0 to 65535)")
    return code


# ----- options


@dataclass(frozen=True, slots=True)
class RewriteOptions:
    """CoreDNS's `rewrite`: the rules of every `rewrite` of a server block, in order."""

    #: True when the server block has `rewrite`.
    enabled: bool = False
    rules: tuple[Rule, ...] = ()
    #: A rule written as a block (`rewrite stop {`), while its lines are read: its words so far
    #: and where its directive is (None once it is read).
    pending: tuple[tuple[str, ...], Origin] | None = field(default=None, compare=False)


def _finished(options: RewriteOptions) -> RewriteOptions:
    """The options with a rule written as a block read, now that its lines are all there."""
    if options.pending is None:
        return options
    words, at = options.pending
    rule = parse_rule(words, Origin(at.option, " ".join(words), at.place))
    return replace(options, rules=(*options.rules, rule), pending=None)


def _directive(options: RewriteOptions, words: Sequence[str], origin: Origin) -> RewriteOptions:
    """`rewrite RULE`, or `rewrite [continue|stop] {` whose lines hold the rule (setup.go reads
    the block when the directive has fewer than two words)."""
    options = replace(_finished(options), enabled=True)
    if len(words) < 2:
        return replace(options, pending=(tuple(words), origin))
    return replace(options, rules=(*options.rules, parse_rule(words, origin)))


def _line(options: RewriteOptions, words: Sequence[str], origin: Origin) -> RewriteOptions:
    """A line of a rule written as a block: more of its words."""
    if options.pending is None:
        raise origin.error(
            "a rule given on its directive's line takes no block; write it on one line, or "
            "as `rewrite stop {` with the rule inside"
        )
    given, at = options.pending
    return replace(options, pending=((*given, *words), at))


def _check(options: RewriteOptions, origin: Origin) -> RewriteOptions:
    return _finished(options)


REWRITE: Plugin[RewriteOptions] = Plugin(
    "rewrite",
    RewriteOptions,
    (Setting("", _directive), Setting("*", _line)),
    check=_check,
)


# ----- the handler


class Rewrite:
    """The rules of a server block's `rewrite`s, as its chain's handler."""

    name = "rewrite"

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        #: Faults logged, so that each is logged once until it clears.
        self.failing: set[str] = set()
        for rule in self.rules:  # compiled once, now
            if isinstance(rule, (NameRule, TtlRule)) and rule.match == REGEX:
                go_regex(rule.source)

    def serve(self, request: Request, next: Next) -> Reply:
        asked = Asked(request.query, request.source, request.transport.tcp)
        answers: list[ReplyRule] = []
        touched = restore = False
        for rule in self.rules:
            if rule.__class__ is Edns0Rule:
                touched = True  # it gives the query an OPT record, applied or not
            applied, replies = rule.rewrite(asked)
            if not applied:
                continue
            touched = True
            if asked.renamed:
                labels = name_labels(asked.name)
                if labels is None:
                    asked_as = presentation(request.query.name)
                    self.fault(
                        "name",
                        f"a rule rewrote {asked_as} to {asked.name!r}, which is no name: such "
                        "queries get SERVFAIL",
                    )
                    return encode_bare(request.query, SERVFAIL)
                asked.labels, asked.renamed = labels, False
            answers += replies
            if rule.mode == STOP:
                restore = True
                break
        else:
            restore = bool(answers)
        if not touched:
            return next(request)
        # A request of its own, changed or not: what the rest answers it is not the answer to
        # the query as asked (serve/responder.py `fill` caches only that one).
        changed = replace(request)
        if asked.changed():
            data = asked.message(request.data)
            changed = replace(request, query=decode_query(data), data=data)
        reply = next(changed)
        if changed.written_by:  # the plugin that wrote the reply it changes back
            request.written_by = changed.written_by
        if reply is None or isinstance(reply, bytes):
            return None if reply is None else self.reverted(reply, request, restore, answers)
        return self.later(reply, request, restore, answers)

    async def later(
        self,
        pending: Coroutine[Any, Any, bytes | None],
        request: Request,
        restore: bool,
        answers: list[ReplyRule],
    ) -> bytes | None:
        """The reply, once an upstream has given it, changed back."""
        reply = await pending
        return None if reply is None else self.reverted(reply, request, restore, answers)

    def reverted(
        self, reply: bytes, request: Request, restore: bool, answers: Sequence[ReplyRule]
    ) -> bytes:
        """The reply to the query as asked (`reverted`); SERVFAIL when it cannot be read."""
        try:
            written = reverted(reply, request, restore, answers)
        except Exception as exc:  # a reply from an upstream is as hostile as any input
            self.fault(
                "reply",
                f"a reply to a rewritten query could not be read back ({exc}): such queries "
                "get SERVFAIL",
            )
            return encode_bare(request.query, SERVFAIL)
        if self.failing:
            self.failing.discard("reply")
        return written

    def fault(self, kind: str, message: str) -> None:
        """Log a fault once, until it clears."""
        if kind not in self.failing:
            self.failing.add(kind)
            log.warning("rewrite: %s", message)


def make_rewrite(options: RewriteOptions, zones: tuple[Name, ...]) -> Rewrite | None:
    """The server block's rewrite handler; None without `rewrite`. (It has no zones: its rules
    see every query of the block.)"""
    if not options.enabled or not options.rules:
        return None
    return Rewrite(options.rules)


# ----- the reply, changed back (reverter.go)


class _Uncompressed(dnslib.DNSBuffer):  # type: ignore[misc]
    """A buffer that writes every name whole, as the server writes a reply that fits."""

    def encode_name(self, name: Any) -> None:
        self.encode_name_nocompress(name)


def reverted(reply: bytes, request: Request, restore: bool, answers: Sequence[ReplyRule]) -> bytes:
    """`reply` (to the query as rewritten) as the client that asked `request` gets it: the
    question as asked (with `restore`), each record changed by the reply rules (the last
    rule's first), the OPT record the query as asked gets, and the whole fitted to its buffer.
    Exceptions for a reply that cannot be read or written."""
    message = dnslib.DNSRecord.parse(reply)
    query = request.query
    opt_rr = next((rr for rr in message.ar if rr.rtype == OPT), None)
    every = [*message.rr, *message.auth, *message.ar]
    if any(rr.rtype == DNAME for rr in every):
        # dnslib reads a DNAME's target as bytes, which may point into the message: read it
        # here, for `answer value` to rewrite.
        for rr, (_, at, _, _, _) in zip(every, record_spans(reply), strict=True):
            if rr.rtype == DNAME:
                target = read_name(reply, at + 6)[0]
                rr.rdata = dnslib.DNAME(tuple(label.encode("latin-1") for label in target))
    records = [rr for rr in every if rr.rtype != OPT]
    for rr in records:
        for rule in reversed(answers):
            _apply(rule, rr)
    flags = (reply[2] << 8) | reply[3]
    rcode = flags & RCODE
    scope = 0
    if opt_rr is not None:
        rcode |= (opt_rr.ttl >> 24) << 4
        scope = next(
            (
                opt.data[3]
                for opt in opt_rr.rdata
                if opt.code == CLIENT_SUBNET and len(opt.data) > 3
            ),
            0,
        )
    opt = b"" if query.edns is None else encode_opt(query.edns, rcode, query.ecs, scope)
    if restore:
        question = query.question or name_wire(query.name) + pack("!HH", query.qtype, query.qclass)
        asked: tuple[bytes, ...] = tuple(label.encode("latin-1") for label in query.name)
        questions = 1
    else:
        question, asked, questions = b"", (), len(message.questions)
    sections = (
        [rr for rr in message.rr if rr.rtype != OPT],
        [rr for rr in message.auth if rr.rtype != OPT],
        [rr for rr in message.ar if rr.rtype != OPT],
    )
    header = reply[:2] + pack(
        "!5H",
        flags,
        questions,
        len(sections[0]),
        len(sections[1]),
        len(sections[2]) + (1 if opt else 0),
    )

    def written(buffer: Any) -> bytes:
        buffer.append(header)
        if restore:
            at = HEADER_SIZE  # the question's name, for names to point to
            for index in range(len(asked)):
                buffer.names.setdefault(asked[index:], at)
                at += 1 + len(asked[index])
            buffer.append(question)
        else:
            for item in message.questions:
                item.pack(buffer)
        for section in sections:
            for rr in section:
                rr.pack(buffer)
        return bytes(buffer.data) + opt

    whole = written(_Uncompressed())
    limit, fragment = request.limit, request.transport.fragment_limit
    if len(whole) <= limit and not (fragment and len(whole) > fragment):
        return whole
    return truncate(written(dnslib.DNSBuffer()), limit)


def _apply(rule: ReplyRule, rr: Any) -> None:
    """One reply rule on one record (nameRewriterResponseRule, valueRewriterResponseRule,
    ttlResponseRule)."""
    if isinstance(rule, TtlClamp):
        rr.ttl = min(max(rr.ttl, rule.low), rule.high)
        return
    if rule.part == "name":
        rr.rname = _renamed(rule.rewriter, rr.rname)
        return
    attribute = VALUE_FIELDS.get(rr.rtype)
    if attribute is None:
        return
    if hasattr(rr.rdata, attribute):
        setattr(rr.rdata, attribute, _renamed(rule.rewriter, getattr(rr.rdata, attribute)))


def _renamed(rewriter: Rewriter, label: Any) -> Any:
    """A dnslib name as a rewriter leaves it (the same object when it does not change it);
    ValueError when what it gives is no name."""
    labels = tuple(part.decode("latin-1") for part in label.label)
    text = presentation(labels)
    new = rewriter.rewrite(text)
    if new == text:
        return label
    found = name_labels(new)
    if found is None:
        raise ValueError(f"a reply rule rewrote {text} to {new!r}, no name")
    return dnslib.DNSLabel(tuple(part.encode("latin-1") for part in found))
