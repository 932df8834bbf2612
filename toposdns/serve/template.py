"""CoreDNS's `template`: answers made from a query's name by regular expressions and Go
templates (plugin/template, as CoreDNS 1.14 has it).

    template CLASS TYPE [ZONE...] {
        match REGEX...
        answer RR
        additional RR
        authority RR
        rcode CODE
        ederror EXTENDED_ERROR_CODE [EXTRA_REASON]
        fallthrough [ZONE...]
    }

Each `template` directive is a template, tried in the order written. A query whose name is in
none of their zones (the server block's when a template names none) passes on. Otherwise each
template in turn: one whose zones do not hold the name, or whose class or type is not the
query's (ANY on either side matches), is skipped; else the first of its `match` regexes (none:
`.*`) that finds the name (lower case, in presentation form: `ip-10-1-2-3.example.`) answers
the query. When none finds it, the query goes on to the next template if `fallthrough` covers
the name (no zones: every name), else it is answered SERVFAIL. After the last template it goes
to the next plugin.

An answer has the template's `rcode` (NOERROR unless set; SERVFAIL is answered without records,
as CoreDNS's server writes it), AA set, and the records its `answer`, `additional` and
`authority` templates render, each read as one record in zone-file form (toposdns/wire/
zone_text.py). A template that fails to render, or renders no record, makes the reply SERVFAIL
and is counted in `coredns_template_template_failures_total` or
`coredns_template_rr_failures_total` (and logged once). A CNAME answer to an A or AAAA query is
followed through this server, as CoreDNS's `upstream` does, and what that gives appended (at
most `MAX_CHASE` deep: a template whose CNAME names itself stops there). `ederror` adds an
Extended DNS Error (RFC 8914) in an OPT record (4096 bytes, DO), as CoreDNS writes it.

The templates see CoreDNS's data: `.Zone`, `.Name`, `.Regex`, `.Match` (`index .Match 1`),
`.Group` (`.Group.name`, `index .Group "1"`), `.Class`, `.Type`, `.Message` (its header fields
and `.Question`), `.Question` (`.Name`, `.Qtype`, `.Qclass`), `.Remote`, and `.Meta "NAME"`,
always empty (toposdns has no `metadata` plugin). The language is the subset of Go's
text/template in serve/go_template.py; the regexes are RE2's, as Go's are (google-re2: matching
takes time linear in the name, whatever the pattern).

Differences: `var` and `expr`, which CoreDNS added after 1.14, are refused; printing `.Message`
whole fails the rendering (CoreDNS prints it as dig does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from struct import pack
from typing import Any, cast

from dnslib import QTYPE, DNSRecord

from toposdns.metrics import TEMPLATE_FAILURES, TEMPLATE_MATCHES, TEMPLATE_RR_FAILURES
from toposdns.options import Origin, Plugin, Setting, domain
from toposdns.serve.chain import Next, Reply, Request
from toposdns.serve.go_regex import PatternError, go_regex
from toposdns.serve.go_template import (
    Action,
    Branch,
    Chain,
    Field,
    Fields,
    Node,
    Pipe,
    RenderError,
    TemplateError,
    parse,
    render,
)
from toposdns.serve.transport import Transport
from toposdns.wire.codes import AAAA, ANY, CNAME, DO, NOERROR, OPT, SERVFAIL, TC, A, Name
from toposdns.wire.decode import HEADER_SIZE, Query, question_end
from toposdns.wire.encode import encode_bare, encode_reply, encode_with_opt, name_wire
from toposdns.wire.records import RR, Raw, Written, class_name, name_text
from toposdns.wire.zone_text import CLASSES, packed, read_record, record_of

log = logging.getLogger("toposdns")

#: CoreDNS's bound on a `match` pattern (plugin/template maxRegexpLen).
MAX_PATTERN = 10000
#: How deep CNAME answers are followed through the server (CoreDNS has no bound).
MAX_CHASE = 8
#: miekg/dns's StringToRcode: the rcodes a template may answer with.
RCODES = {
    "NOERROR": 0, "FORMERR": 1, "SERVFAIL": 2, "NXDOMAIN": 3, "NOTIMP": 4, "REFUSED": 5,
    "YXDOMAIN": 6, "YXRRSET": 7, "NXRRSET": 8, "NOTAUTH": 9, "NOTZONE": 10, "DSOTYPENI": 11,
    "BADSIG": 16, "BADKEY": 17, "BADTIME": 18, "BADMODE": 19, "BADNAME": 20, "BADALG": 21,
    "BADTRUNC": 22, "BADCOOKIE": 23,
}  # fmt: skip
#: miekg/dns's ClassToString.
CLASS_NAMES = {code: name for name, code in CLASSES.items()}
#: The EDNS option of an Extended DNS Error (RFC 8914).
EDE = 15
#: The sections a template renders, in the order CoreDNS renders them.
SECTIONS = ("answer", "additional", "authority")


@dataclass(frozen=True, slots=True)
class Template:
    """One `template` directive: what it matches and how it answers."""

    qclass: int
    qtype: int
    #: Its zones, lower case; none: the server block's.
    zones: tuple[Name, ...] = ()
    #: Its `match` regexes (RE2 syntax); none: `.*`.
    patterns: tuple[str, ...] = ()
    answer: tuple[str, ...] = ()
    additional: tuple[str, ...] = ()
    authority: tuple[str, ...] = ()
    rcode: int = NOERROR
    #: `ederror CODE [REASON]`.
    ederror: tuple[int, str] | None = None
    #: The zones whose names go on when no regex finds them; None: none (SERVFAIL).
    fallthrough: tuple[Name, ...] | None = None
    #: Where it is written (`file:line`), for messages.
    place: str = ""


@dataclass(frozen=True, slots=True)
class TemplateOptions:
    """Every `template` directive of a server block, in order (none: the plugin is off)."""

    templates: tuple[Template, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.templates)


def _start(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
    """`template CLASS TYPE [ZONE...]`: a new template."""
    if len(words) < 2:
        raise origin.error("expected CLASS TYPE [ZONE...], e.g. template IN A example.org")
    if words[0] not in CLASSES:
        raise origin.error(f"invalid query class {words[0]}; one of {', '.join(CLASSES)}")
    qtype = QTYPE.reverse.get(words[1]) if words[1] == words[1].upper() else None
    if qtype is None or words[1].startswith("TYPE"):
        raise origin.error(f"invalid RR type {words[1]}, e.g. A, AAAA, PTR or ANY")
    zones = tuple(dict.fromkeys(domain(word, origin) for word in words[2:]))
    template = Template(CLASSES[words[0]], int(qtype), zones, place=origin.place)
    return replace(options, templates=(*options.templates, template))


def _last(options: TemplateOptions, origin: Origin) -> Template:
    if not options.templates:
        raise origin.error("an option outside a template block")
    return options.templates[-1]


def _changed(options: TemplateOptions, template: Template) -> TemplateOptions:
    return replace(options, templates=(*options.templates[:-1], template))


def _match(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
    """`match REGEX...`: Go's RE2 syntax, checked as CoreDNS checks it."""
    if not words:
        raise origin.error('expected one or more regexes, e.g. match "^ip-(?P<a>[0-9]+)[.]"')
    for pattern in words:
        if len(pattern) > MAX_PATTERN:
            raise origin.error(f"regex pattern too long: {len(pattern)} > {MAX_PATTERN}")
        compile_pattern(pattern, origin)
    template = _last(options, origin)
    return _changed(options, replace(template, patterns=(*template.patterns, *words)))


def compile_pattern(pattern: str, origin: Origin) -> Any:
    """A `match` regex compiled; its error, in RE2's words, at `origin`."""
    try:
        return go_regex(pattern)
    except PatternError as exc:
        raise origin.error(f"could not parse regex {pattern!r}: {exc}") from None


def _section(name: str) -> Setting[TemplateOptions]:
    """`answer RR...`, `additional RR...`, `authority RR...`: Go templates, parsed now."""

    def apply(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
        if not words:
            raise origin.error(f'expected a record, e.g. {name} "{{{{ .Name }}}} 60 IN A 10.0.0.1"')
        for text in words:
            try:
                parse(text)
            except TemplateError as exc:
                raise origin.error(f"could not compile template {text!r}: {exc}") from None
        template = _last(options, origin)
        texts: tuple[str, ...] = (*getattr(template, name), *words)
        changed: Template = replace(template, **{name: texts})  # type: ignore[arg-type]
        return _changed(options, changed)

    return Setting(name, apply)


def _rcode(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
    if len(words) != 1:
        raise origin.error("expected one response code, e.g. rcode NXDOMAIN")
    if words[0] not in RCODES:
        raise origin.error(f"unknown rcode {words[0]}; one of {', '.join(RCODES)}")
    return _changed(options, replace(_last(options, origin), rcode=RCODES[words[0]]))


def _ederror(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
    if len(words) not in (1, 2):
        raise origin.error('expected CODE [REASON], e.g. ederror 21 "Blocked by policy"')
    if not words[0].isdigit() or not words[0].isascii() or int(words[0]) > 0xFFFF:
        raise origin.error(f"extended DNS error code {words[0]!r} is not a number 0-65535")
    ederror = (int(words[0]), words[1] if len(words) == 2 else "")
    return _changed(options, replace(_last(options, origin), ederror=ederror))


def _fallthrough(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
    zones = tuple(dict.fromkeys(domain(word, origin) for word in words)) or ((),)
    return _changed(options, replace(_last(options, origin), fallthrough=zones))


def _upstream(options: TemplateOptions, words: Sequence[str], origin: Origin) -> TemplateOptions:
    """`upstream`: read and ignored, as CoreDNS does (CNAMEs are always followed)."""
    _last(options, origin)
    return options


TEMPLATE: Plugin[TemplateOptions] = Plugin(
    "template",
    TemplateOptions,
    (
        Setting("", _start),
        Setting("match", _match),
        *(_section(name) for name in SECTIONS),
        Setting("rcode", _rcode),
        Setting("ederror", _ederror),
        Setting("fallthrough", _fallthrough),
        Setting("upstream", _upstream),
    ),
)

# ----- what a template sees


class QuestionData(Fields):
    """miekg/dns's Question: `.Name` (as asked), `.Qtype`, `.Qclass`."""

    type_name = "*dns.Question"

    def __init__(self, name: str, qtype: int, qclass: int, pointer: bool = True) -> None:
        self.values: dict[str, object] = {"Name": name, "Qtype": qtype, "Qclass": qclass}
        self.pointer = pointer

    def field(self, name: str) -> object:
        return self.values[name] if name in self.values else super().field(name)

    def text(self) -> str:
        name, qtype, qclass = self.values["Name"], self.values["Qtype"], self.values["Qclass"]
        assert isinstance(qtype, int) and isinstance(qclass, int)
        if not self.pointer:  # a value in a list: Go prints the struct's fields
            return f"{{{name} {qtype} {qclass}}}"
        return f";{name}\t{class_name(qclass)}\t {type_text(qtype)}"


class MessageData(Fields):
    """miekg/dns's Msg of the query: its header fields and `.Question`."""

    type_name = "*dns.Msg"

    def __init__(self, query: Query, asked: str) -> None:
        flags = query.flags
        self.values: dict[str, object] = {
            "Id": query.id,
            "Response": bool(flags & 0x8000),
            "Opcode": (flags >> 11) & 0xF,
            "Authoritative": bool(flags & 0x0400),
            "Truncated": bool(flags & 0x0200),
            "RecursionDesired": bool(flags & 0x0100),
            "RecursionAvailable": bool(flags & 0x0080),
            "Zero": bool(flags & 0x0040),
            "AuthenticatedData": bool(flags & 0x0020),
            "CheckingDisabled": bool(flags & 0x0010),
            "Rcode": flags & 0xF,
            "Question": [QuestionData(asked, query.qtype, query.qclass, pointer=False)],
        }

    def field(self, name: str) -> object:
        return self.values[name] if name in self.values else super().field(name)

    def text(self) -> str:
        raise RenderError("printing .Message whole is not supported here")


class TemplateData(Fields):
    """CoreDNS's templateData."""

    type_name = "*template.templateData"

    def __init__(self, values: dict[str, object]) -> None:
        self.values = values

    def field(self, name: str) -> object:
        return self.values[name] if name in self.values else super().field(name)

    def method(self, name: str) -> Callable[..., object] | None:
        return _meta if name == "Meta" else None


def _meta(name: object) -> str:
    """`.Meta "NAME"`: no metadata here, so always empty, as CoreDNS without `metadata`."""
    if not isinstance(name, str):
        raise RenderError("wrong type for value; expected string")
    return ""


#: The fields CoreDNS's templates may read, for the startup check.
DATA_FIELDS = (
    "Zone", "Name", "Regex", "Match", "Group", "Class", "Type", "Message", "Question", "Remote",
    "Meta",
)  # fmt: skip


def type_text(rtype: int) -> str:
    """miekg/dns's Type String()."""
    name: str = QTYPE.forward.get(rtype, f"TYPE{rtype}")
    return name


def presentation(name: Name) -> str:
    """A name in miekg/dns's presentation form, as CoreDNS's `state.Name()` gives it (before
    lower-casing): its special characters escaped with `\\`, others as `\\DDD`."""
    if not name:
        return "."
    out = []
    for label in name:
        chars = []
        for char in label:
            code = ord(char)
            if char in ". '@;()\"\\":
                chars.append("\\" + char)
            elif code < 0x20 or code > 0x7E:
                chars.append(f"\\{code:03d}")
            else:
                chars.append(char)
        out.append("".join(chars))
    return ".".join(out) + "."


# ----- the handler


class _Compiled:
    """A template ready to answer."""

    def __init__(self, template: Template, zones: tuple[Name, ...]) -> None:
        self.template = template
        self.zones = template.zones or zones
        self.qclass = template.qclass
        self.qtype = template.qtype
        origin = Origin("match", place=template.place)
        patterns = template.patterns or (".*",)
        self.regexes = [(compile_pattern(p, origin), p) for p in patterns]
        self.sections = {
            section: [(parse(text), text) for text in getattr(template, section)]
            for section in SECTIONS
        }
        self.fallthrough = template.fallthrough
        self.rcode = template.rcode
        self.ede = b""
        if template.ederror is not None:
            code, reason = template.ederror
            text = reason.encode()
            self.ede = pack("!HHH", EDE, 2 + len(text), code) + text

    def zone(self, lowered: Name) -> Name | None:
        """The longest of its zones that holds the name."""
        found: Name | None = None
        for zone in self.zones:
            if _under(lowered, zone) and (found is None or len(zone) > len(found)):
                found = zone
        return found


def _under(name: Name, zone: Name) -> bool:
    return not zone or name[len(name) - len(zone) :] == zone


class Templates:
    """The `template` directives of a server block, as one handler (CoreDNS's one Handler)."""

    name = "template"

    def __init__(
        self,
        options: TemplateOptions,
        zones: tuple[Name, ...],
        server: Callable[[], str] = lambda: "dns://:53",
        lookup: Callable[[bytes, Transport, str], Reply] | None = None,
    ) -> None:
        self.templates = [_Compiled(template, zones) for template in options.templates]
        #: Every template's zones: a name in none of them passes at once.
        self.zones = tuple(dict.fromkeys(z for t in self.templates for z in t.zones))
        #: The server's label for the metrics (known once its port is bound).
        self.server = server
        #: Asks this server a query (CoreDNS's upstream.Lookup): CNAME targets are followed.
        self.lookup = lookup
        #: How deep the CNAME lookups now running are.
        self.depth = 0
        #: The templates whose failure has been logged (one line each).
        self.failed: set[tuple[int, str, int]] = set()
        for template in self.templates:
            warn_unknown_fields(template)

    def serve(self, request: Request, next: Next) -> Reply:
        query = request.query
        lowered = tuple(label.lower() for label in query.name)
        if not any(_under(lowered, zone) for zone in self.zones):
            return next(request)
        text = ""
        for index, template in enumerate(self.templates):
            zone = template.zone(lowered)
            if zone is None:
                continue
            if template.qclass not in (ANY, query.qclass) and query.qclass != ANY:
                continue
            if template.qtype not in (ANY, query.qtype) and query.qtype != ANY:
                continue
            text = text or presentation(query.name).lower()
            for regex, pattern in template.regexes:
                found = regex.search(text)
                if found is not None:
                    return self.answer(index, zone, found, pattern, text, request)
            fall = template.fallthrough
            if fall is not None and any(_under(lowered, zone) for zone in fall):
                continue
            return encode_bare(query, SERVFAIL)
        return next(request)

    def answer(
        self, index: int, zone: Name, found: Any, pattern: str, text: str, request: Request
    ) -> Reply:
        """The reply of the template at `index`, whose regex `pattern` has `found` the name."""
        template = self.templates[index]
        query = request.query
        qclass = query.qclass if query.qclass != ANY else template.qclass
        qtype = query.qtype if query.qtype != ANY else template.qtype
        data = template_data(zone, text, pattern, found, qclass, qtype, request)
        labels = (self.server(), name_text(zone), "", data.values["Class"], data.values["Type"])
        TEMPLATE_MATCHES.labels(*labels).inc()
        if template.rcode == SERVFAIL:  # CoreDNS returns it for its server to write
            return encode_bare(query, SERVFAIL)
        sections: dict[str, list[RR]] = {section: [] for section in SECTIONS}
        chased: list[tuple[int, Reply]] = []
        for section in SECTIONS:
            for item, (nodes, source) in enumerate(template.sections[section]):
                record = self.rendered(index, section, item, nodes, source, data, labels)
                if record is None:
                    return encode_bare(query, SERVFAIL)
                sections[section].append(record)
                if (
                    section == "answer"
                    and record.rtype == CNAME
                    and query.qtype in (A, AAAA)
                    and not isinstance(record.rdata, Raw)  # another class: not followed
                ):
                    lookup = self.chase(record, request)
                    if lookup is not None:
                        chased.append((len(sections["answer"]), lookup))
        if any(isinstance(reply, Coroutine) for _, reply in chased):
            return self.completed(template, query, request, sections, chased)
        return self.reply(template, query, request, sections, chased)

    def rendered(
        self,
        index: int,
        section: str,
        item: int,
        nodes: Sequence[Node],
        source: str,
        data: TemplateData,
        labels: tuple[Any, ...],
    ) -> RR | None:
        """One record of a section; None (counted, logged once) when it fails."""
        tree = "".join(node.source() for node in nodes)
        try:
            text = render(nodes, data)
        except RenderError as exc:
            TEMPLATE_FAILURES.labels(*labels, section, tree).inc()
            self.fault(index, section, item, source, f"the template fails: {exc}")
            return None
        try:
            record = read_record(text)
            if record is None:
                raise ValueError("no record in it")
        except ValueError as exc:
            TEMPLATE_RR_FAILURES.labels(*labels, section, tree).inc()
            self.fault(index, section, item, source, f"{text!r} is not a record: {exc}")
            return None
        return record

    def fault(self, index: int, section: str, item: int, source: str, why: str) -> None:
        """Log a template's failure the first time it fails."""
        if (index, section, item) in self.failed:
            return
        self.failed.add((index, section, item))
        log.warning(
            "template at %s: %s %r: %s; the queries it matches get SERVFAIL",
            self.templates[index].template.place or "?",
            section,
            source,
            why,
        )

    def chase(self, record: RR, request: Request) -> Reply | None:
        """The server's reply to the CNAME's target, asked as the query was (CoreDNS's
        upstream.Lookup); None past MAX_CHASE lookups deep, or without a server to ask."""
        if self.lookup is None or self.depth >= MAX_CHASE:
            return None
        target = cast(Name, record.rdata)
        data = request.data
        end = question_end(data)
        question = name_wire(target) + data[end - 4 : end]  # the query's type and class
        message = data[:4] + b"\x00\x01" + data[6:HEADER_SIZE] + question + data[end:]
        self.depth += 1
        try:
            return self.lookup(message, request.transport, request.source)
        except Exception:  # a fault of the server's own is its to log: the CNAME stands alone
            return None
        finally:
            self.depth -= 1

    async def completed(
        self,
        template: _Compiled,
        query: Query,
        request: Request,
        sections: dict[str, list[RR]],
        chased: list[tuple[int, Reply]],
    ) -> bytes | None:
        """The reply once the CNAME targets have been answered."""
        done: list[tuple[int, bytes | None]] = []
        for at, reply in chased:
            if isinstance(reply, Coroutine):
                try:
                    reply = await reply
                except Exception:
                    reply = None
            done.append((at, reply if isinstance(reply, bytes) else None))
        return self.reply(template, query, request, sections, done)

    def reply(
        self,
        template: _Compiled,
        query: Query,
        request: Request,
        sections: dict[str, list[RR]],
        chased: Sequence[tuple[int, Reply]],
    ) -> bytes | None:
        """The reply's bytes: the sections, each CNAME's target's answers after it."""
        answer = sections["answer"]
        truncated = False
        for at, reply in reversed(chased):
            if not isinstance(reply, bytes):
                continue
            records, truncated_here = answers_of(reply)
            answer[at:at] = records
            truncated = truncated or truncated_here
        rcode = template.rcode
        written = Written(
            rcode,
            tuple(answer),
            tuple(sections["authority"]),
            tuple(sections["additional"]),
            authoritative=True,
        )
        if template.ede:
            size = query.edns.udp_size if query.edns is not None else 4096
            ttl = ((rcode >> 4) << 24) | DO
            opt = b"\x00" + pack("!HHIH", OPT, size, ttl, len(template.ede)) + template.ede
            message = encode_with_opt(
                query, written, opt, request.limit, request.transport.fragment_limit
            )
        elif rcode > 15 and query.edns is None:
            return None  # miekg/dns cannot write an extended rcode without OPT: no reply
        else:
            message = encode_reply(query, written, request.limit, request.transport.fragment_limit)
        if truncated:  # the last lookup's TC, as CoreDNS copies it
            message = message[:2] + bytes((message[2] | TC >> 8,)) + message[3:]
        return message


def answers_of(reply: bytes) -> tuple[list[RR], bool]:
    """The answer records of a reply this server gave, and its TC bit; none when it cannot
    be read."""
    try:
        parsed = DNSRecord.parse(reply)
        records = [
            record_of(
                tuple(label.decode("latin-1") for label in rr.rname.label),
                rr.rtype,
                rr.rclass,
                rr.ttl,
                packed(rr.rdata),
            )
            for rr in parsed.rr
        ]
    except Exception:  # an answer it cannot read is left out, as a failed lookup is
        return [], False
    return records, bool(parsed.header.tc)


def template_data(
    zone: Name, text: str, pattern: str, found: Any, qclass: int, qtype: int, request: Request
) -> TemplateData:
    """What CoreDNS gives a template that matched."""
    query = request.query
    groups = [found.group(0), *(value or "" for value in found.groups())]
    group: dict[str, object] = {str(index): value for index, value in enumerate(groups)}
    for name, index in sorted(found.re.groupindex.items(), key=lambda item: item[1]):
        group[name] = groups[index]
    asked = presentation(query.name)
    return TemplateData(
        {
            "Zone": name_text(zone),
            "Name": text,
            "Regex": pattern,
            "Match": list(groups),
            "Group": group,
            "Class": CLASS_NAMES.get(qclass, ""),
            "Type": QTYPE.forward.get(qtype, ""),
            "Message": MessageData(query, asked),
            "Question": QuestionData(asked, query.qtype, query.qclass),
            "Remote": request.source,
        }
    )


def warn_unknown_fields(template: _Compiled) -> None:
    """Say at startup, once, that a template reads a field CoreDNS's data does not have: it
    is accepted, as CoreDNS accepts it, but every query it matches fails."""

    def fields(nodes: Sequence[Node]) -> list[str]:
        found: list[str] = []
        for node in nodes:
            if isinstance(node, Action):
                found += pipe_fields(node.pipe)
            elif isinstance(node, Branch):
                found += pipe_fields(node.pipe) + fields(node.then) + fields(node.otherwise or ())
        return found

    def pipe_fields(pipe: Pipe) -> list[str]:
        found: list[str] = []
        for command in pipe.commands:
            for arg in command.args:
                if isinstance(arg, Field):
                    found.append(arg.names[0])
                elif isinstance(arg, Pipe):
                    found += pipe_fields(arg)
                elif isinstance(arg, Chain):
                    found += pipe_fields(arg.pipe)
        return found

    for section, items in template.sections.items():
        for nodes, source in items:
            unknown = sorted(set(fields(nodes)) - set(DATA_FIELDS))
            if unknown:
                log.warning(
                    "template at %s: %s %r reads %s, which a template's data does not have "
                    "(it has %s): the queries it matches will get SERVFAIL",
                    template.template.place or "?",
                    section,
                    source,
                    ", ".join("." + name for name in unknown),
                    ", ".join("." + name for name in DATA_FIELDS),
                )


def make_template(
    options: TemplateOptions,
    zones: tuple[Name, ...],
    server: Callable[[], str] = lambda: "dns://:53",
    lookup: Callable[[bytes, Transport, str], Reply] | None = None,
) -> Templates | None:
    """The handler of a server block's `template` directives (its zones: `zones` where a
    template names none); None without any. `server` gives the metrics' server label,
    `lookup` asks this server a query (CNAME targets are followed through it)."""
    if not options.enabled:
        return None
    return Templates(options, zones, server, lookup)
