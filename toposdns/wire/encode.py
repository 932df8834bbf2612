"""Put an answer on the wire the way CoreDNS does (miekg/dns `Truncate`, CoreDNS `Scrub`).

Replies go out uncompressed when they fit. A reply larger than the client's buffer is compressed
and then cut record by record from the end, with TC set if anything was dropped (even only
additional records); the question is always kept. A UDP reply that fits but exceeds the
fragmentation limit (1480 bytes over IPv4, 1220 over IPv6) is compressed too. A reply
encoded elsewhere (an upstream's) is cut the same way by `truncate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from socket import AF_INET, AF_INET6, inet_pton
from struct import pack, unpack_from
from typing import cast

from toposdns.options import Plugin, Setting, integer, sets
from toposdns.wire.codes import (
    AA,
    AAAA,
    CNAME,
    COPIED_FLAGS,
    HINFO,
    NOERROR,
    NS,
    OPT,
    POINTER,
    PTR,
    QR,
    RCODE,
    TC,
    TXT,
    A,
    Name,
)
from toposdns.wire.decode import ECS_OPTION, HEADER_SIZE, ClientSubnet, Edns, Query, record_spans
from toposdns.wire.edns import echoed
from toposdns.wire.records import RR, Mx, Raw, Sections, Soa, Srv, Written

MIN_UDP_SIZE = 512
#: The largest UDP reply by default, whatever buffer a client announces (DNS Flag Day 2020: no
#: IP fragmentation on any path with an MTU of 1280 or more).
MAX_UDP_SIZE = 1232
MAX_TCP_SIZE = 65535
FRAGMENT_LIMIT_V4 = 1480
FRAGMENT_LIMIT_V6 = 1220
#: Types whose rdata is one name, compressed as miekg/dns does (MX and SOA are too).
_COMPRESSIBLE = (NS, CNAME, PTR)
#: Types whose rdata is character-strings (HINFO: CPU and OS, as CoreDNS's `any` writes it).
_STRINGS = (TXT, HINFO)


def udp_limit(edns: Edns | None) -> int:
    """How large a UDP reply may be: the client's EDNS buffer, and never under 512."""
    return max(MIN_UDP_SIZE, edns.udp_size) if edns is not None else MIN_UDP_SIZE


@dataclass(frozen=True, slots=True)
class BufsizeOptions:
    """CoreDNS's `bufsize SIZE` (`--max-udp-size`): the largest UDP reply."""

    size: int = MAX_UDP_SIZE


BUFSIZE: Plugin[BufsizeOptions] = Plugin(
    "bufsize",
    BufsizeOptions,
    (
        Setting(
            "",
            sets("size", integer(MIN_UDP_SIZE, MAX_TCP_SIZE, "1232")),
            "--max-udp-size",
            "BYTES",
            "largest UDP reply, whatever buffer a client announces; larger replies are cut, TC "
            "set, for the client to ask over TCP, as CoreDNS's `bufsize` (default {default}, "
            "DNS Flag Day 2020)",
            shows="size",
        ),
    ),
)


def bound_buffer(query: Query, max_udp_size: int) -> Query:
    """The query as CoreDNS's `bufsize` plugin passes it on: a buffer size over `max_udp_size`
    lowered to it. Replies fit that size, and their OPT records echo it."""
    edns = query.edns
    if edns is not None and edns.udp_size > max_udp_size:
        return query._replace(edns=edns._replace(udp_size=max_udp_size))
    return query


def reply_flags(query: Query, rcode: int, authoritative: bool, truncated: bool = False) -> int:
    """Header flags of a reply: QR, the query's opcode, RD and CD copied; RA and AD clear."""
    flags = QR | (query.flags & COPIED_FLAGS) | (rcode & RCODE)
    if authoritative:
        flags |= AA
    if truncated:
        flags |= TC
    return flags


def encode_opt(
    edns: Edns, rcode: int = 0, ecs: ClientSubnet | None = None, scope: int = 0
) -> bytes:
    """The reply's OPT: the client's buffer size, version 0, its DO bit, the echoable options.

    Unlike CoreDNS, a Client Subnet option is echoed (RFC 7871 §7.2.2) with SCOPE `scope`: the
    source prefix when the answer depended on it, else 0.
    """
    if not edns.options and ecs is None:
        return bare_opt(edns.udp_size, edns.ttl, rcode)
    options = echoed(edns.options)
    if ecs is not None:
        value = pack("!HBB", ecs.family, ecs.source_prefix, scope) + ecs.raw_address
        options += pack("!HH", ECS_OPTION, len(value)) + value
    return _opt(edns.udp_size, ((rcode >> 4) << 24) | (edns.ttl & 0xFF00), options)


def bare_opt(udp_size: int, flags: int, rcode: int = 0) -> bytes:
    """The reply's OPT record for a query's OPT without options (`flags`: its TTL field); most
    queries get one of a few, each made once."""
    key = (udp_size, flags & 0xFF00, rcode >> 4)
    opt = _bare_opts.get(key)
    if opt is None:
        opt = _bare_opts[key] = _opt(udp_size, key[1] | (key[2] << 24), b"")
    return opt


def _opt(udp_size: int, ttl: int, options: bytes) -> bytes:
    return b"\x00" + pack("!HHIH", OPT, udp_size, ttl, len(options)) + options


#: OPT records without options, by (buffer size, flags, extended rcode): 65536 x 2 x 2 at most.
_bare_opts: dict[tuple[int, int, int], bytes] = {}


def encode_reply(
    query: Query, answer: Sections, limit: int, fragment_limit: int = 0, ecs_scope: int = 0
) -> bytes:
    """Encode a reply to `query` within `limit` bytes; `fragment_limit` > 0 only for UDP."""
    opt = b""
    if query.edns is not None:
        opt = encode_opt(query.edns, answer.rcode, query.ecs, ecs_scope)
    return encode_with_opt(query, answer, opt, limit, fragment_limit)


def encode_with_opt(
    query: Query, answer: Sections, opt: bytes, limit: int, fragment_limit: int = 0
) -> bytes:
    """Encode a reply to `query` within `limit` bytes with `opt` as its OPT record (b"": none),
    as `encode_reply` does with the one it makes from the query's."""
    message = _uncompressed(query, answer, opt, limit)
    if message is not None:
        if fragment_limit and len(message) > fragment_limit:
            return _Writer(query, compress=True).finish(answer, opt, None)
        return message
    return _Writer(query, compress=True).finish(answer, opt, limit)


def encode_forms(query: Query, answer: Sections, compress_over: int) -> tuple[bytes, bytes | None]:
    """A reply to cache: uncompressed, and compressed too if the uncompressed one is larger
    than `compress_over` bytes, for the queries it would not fit whole (`fit` cuts either to a
    query's limit). A reply larger than any message uncompressed (65,535 bytes) goes whole to
    no query: it is cached compressed, cut to that size (TC set if records were left out), the
    same object in both places; each query's reply is that one, cut further."""
    opt = encode_opt(query.edns, answer.rcode) if query.edns is not None else b""
    message = _uncompressed(query, answer, opt, MAX_TCP_SIZE)
    if message is None:
        packed = _Writer(query, compress=True).finish(answer, opt, MAX_TCP_SIZE)
        return packed, packed
    if len(message) <= compress_over:
        return message, None
    return message, _Writer(query, compress=True).finish(answer, opt, None)


def _uncompressed(query: Query, answer: Sections, opt: bytes, limit: int) -> bytes | None:
    """The whole reply without name compression: what most replies are, built from the wire
    forms of its names and records, which repeat from reply to reply. None when it is larger
    than `limit` bytes: the records past it are not written."""
    question = query.question or name_wire(query.name) + pack("!HH", query.qtype, query.qclass)
    parts = [b"", question]
    size = HEADER_SIZE + len(question) + len(opt)
    for section in (answer.answer, answer.authority, answer.additional):
        for rr in section:
            wire = record_wire(rr)
            size += len(wire)
            if size > limit:
                return None
            parts.append(wire)
    parts[0] = pack(
        "!6H",
        query.id,
        reply_flags(query, answer.rcode, answer.authoritative),
        1,
        len(answer.answer),
        len(answer.authority),
        len(answer.additional) + (1 if opt else 0),
    )
    parts.append(opt)
    return b"".join(parts)


#: Wire forms of names and records already written, bounded by emptying them when full.
_names: dict[Name, bytes] = {}
_records: dict[RR, bytes] = {}
_REMEMBERED = 8192


def name_wire(name: Name) -> bytes:
    """A name in uncompressed wire form."""
    wire = _names.get(name)
    if wire is None:
        raw = [label.encode("latin-1") for label in name]
        wire = b"".join(bytes((len(label),)) + label for label in raw) + b"\x00"
        if len(_names) >= _REMEMBERED:
            _names.clear()
        _names[name] = wire
    return wire


def record_wire(rr: RR) -> bytes:
    """A record in uncompressed wire form (remembered: records repeat from reply to reply)."""
    wire = _records.get(rr)
    return _record_wire(rr) if wire is None else wire


def _record_wire(rr: RR) -> bytes:
    data = rr.rdata
    if rr.rtype == A and isinstance(data, str):
        rdata = inet_pton(AF_INET, data)
    elif rr.rtype == AAAA and isinstance(data, str):
        rdata = inet_pton(AF_INET6, data)
    elif isinstance(data, Srv):
        rdata = pack("!HHH", data.priority, data.weight, data.port) + name_wire(data.target)
    elif isinstance(data, Soa):
        numbers = pack("!5I", data.serial, data.refresh, data.retry, data.expire, data.minimum)
        rdata = name_wire(data.mname) + name_wire(data.rname) + numbers
    elif isinstance(data, Raw):
        header = pack("!HHIH", rr.rtype, data.rclass, rr.ttl, len(data.data))
        return name_wire(rr.name) + header + data.data
    elif rr.rtype in _STRINGS:
        texts = [text.encode() for text in cast(tuple[str, ...], data)]
        rdata = b"".join(bytes((len(text),)) + text for text in texts)
    elif rr.rtype in _COMPRESSIBLE:
        rdata = name_wire(cast(Name, data))
    elif isinstance(data, Mx):
        rdata = pack("!H", data.preference) + name_wire(data.exchange)
    else:
        raise TypeError(f"cannot encode {rr}")
    wire = name_wire(rr.name) + pack("!HHIH", rr.rtype, 1, rr.ttl, len(rdata)) + rdata
    if len(_records) >= _REMEMBERED:
        _records.clear()
    _records[rr] = wire
    return wire


def encode_minimal_any(query: Query) -> bytes:
    """RFC 8482's answer to ANY, as CoreDNS's `any` plugin gives it: one HINFO record, not
    authoritative."""
    hinfo = RR(query.name, HINFO, 8482, ("ANY obsoleted", "See RFC 8482"))
    answer = Written(NOERROR, answer=(hinfo,))
    return encode_reply(query, answer, MAX_TCP_SIZE)


def truncate(message: bytes, limit: int) -> bytes:
    """An encoded message cut to at most `limit` bytes as `encode_reply` cuts an answer: the
    header, the question, as many whole records as fit in order, then the OPT record; TC set
    if any record was dropped. A message that fits is returned as it is.

    Records are kept as they are (a reply from elsewhere may hold types this module cannot
    write); compression pointers stay valid, since they only point backwards.
    """
    if len(message) <= limit:
        return message
    spans = record_spans(message)
    opt = b""
    budget = limit
    for start, _, end, rtype, section in spans:
        if rtype == OPT and section == 2:
            opt = message[start:end]
            budget -= len(opt)
            break
    kept = [0, 0, 0]
    cut = spans[0][0] if spans else len(message)  # the question's end
    for _start, _, end, rtype, section in spans:
        if end > budget or (rtype == OPT and section == 2):
            break  # records after an OPT record are dropped with it moved to the end
        kept[section] += 1
        cut = end
    flags = message[2] | TC >> 8
    header = message[:2] + bytes((flags, message[3])) + message[4:6]
    counts = pack("!3H", kept[0], kept[1], kept[2] + (1 if opt else 0))
    return header + counts + message[HEADER_SIZE:cut] + opt


def fit(
    whole: bytes, compressed: bytes | None, opt: bytes, limit: int, fragment: int
) -> bytes | None:
    """A cached reply as one query gets it, as `encode_reply` would have written it for that
    query: `whole` (uncompressed) or `compressed`, both complete and ending in a cached OPT
    record (`opt` replaces it: the query's own) or in none (`opt` is b""), within `limit`
    bytes; `fragment` > 0 is the UDP fragmentation limit. Both forms start at the flags,
    without the ID; `limit` and `fragment` count the ID too. None when the reply needs the
    compressed form and there is none (the caller builds it anew). A compressed reply cut
    after a record is what the encoder writes for that limit, byte for byte: its names point
    back only. So is one cut already (`encode_forms`: `whole` is `compressed` then, and has TC
    set if records were left out), as long as it was cut for a limit no smaller than this one."""
    kept = len(opt) and 11  # the cached OPT record, without options
    size = len(whole) - kept + len(opt) + 2
    if size <= limit and (not fragment or size <= fragment):
        return whole[: len(whole) - kept] + opt if kept else whole
    if compressed is None:
        return None
    body = compressed[: len(compressed) - kept] if kept else compressed
    if len(body) + len(opt) + 2 <= limit:
        return body + opt
    return _cut(body, opt, limit - 2)


def _cut(body: bytes, opt: bytes, limit: int) -> bytes:
    """`truncate` for a reply of this module's (`fit`): `body` (after the ID, no OPT record)
    cut after its last whole record within `limit` bytes with `opt` after it, TC set. It reads
    the records up to the cut only: a cached reply of 64 KiB is cut to 1,232 bytes in a few
    steps. Names are skipped, not read: the encoder wrote them."""
    budget = limit - len(opt)
    ancount, nscount = unpack_from("!2H", body, 4)
    offset = _skip_name(body, HEADER_SIZE - 2) + 4  # past the question
    cut = offset
    kept = 0
    while offset < len(body):
        offset = _skip_name(body, offset) + 10
        offset += (body[offset - 2] << 8) | body[offset - 1]
        if offset > budget:
            break
        kept += 1
        cut = offset
    answers = min(kept, ancount)
    authority = min(kept - answers, nscount)
    additional = kept - answers - authority + (1 if opt else 0)
    header = bytes((body[0] | TC >> 8, body[1])) + body[2:4]
    return header + pack("!3H", answers, authority, additional) + body[HEADER_SIZE - 2 : cut] + opt


def _skip_name(message: bytes, offset: int) -> int:
    """The offset after a name written by this module (labels, then the root or a pointer)."""
    length = message[offset]
    while length:
        if length >= POINTER:
            return offset + 2
        offset += 1 + length
        length = message[offset]
    return offset + 1


def encode_bare(query: Query, rcode: int) -> bytes:
    """A reply with the question and no records, not authoritative (REFUSED, SERVFAIL, ...)."""
    opt = encode_opt(query.edns, rcode, query.ecs) if query.edns is not None else b""
    return _Writer(query, compress=False).finish(Written(rcode), opt, None)


def encode_badvers(query: Query) -> bytes:
    """BADVERS for EDNS versions other than 0: rcode 16 split between header and OPT.

    As CoreDNS's `edns.Version`, the OPT carries a zero buffer size and no options.
    """
    opt = b"\x00" + pack("!HHIH", OPT, 0, 1 << 24, 0)
    return _Writer(query, compress=False).finish(Written(0), opt, None)


def encode_rejection(data: bytes, rcode: int) -> bytes:
    """miekg/dns's reply to a packet it rejects: the header alone, ID and RD/CD copied."""
    flags = (data[2] << 8) | data[3]
    flags = QR | (flags & COPIED_FLAGS) | rcode
    return data[:2] + pack("!5H", flags, 0, 0, 0, 0)


class _Writer:
    """Writes one message; optionally compresses names and stops at a size limit."""

    def __init__(self, query: Query, compress: bool) -> None:
        self.query = query
        self.names: dict[Name, int] | None = {} if compress else None
        self.buf = bytearray()
        self.added: list[Name] = []  # suffixes the current record made known

    def finish(self, answer: Sections, opt: bytes, limit: int | None) -> bytes:
        """Header, question, as many records as fit under `limit`, then the OPT record."""
        query = self.query
        self.buf += b"\x00" * 12
        self.name(query.name)
        self.buf += pack("!HH", query.qtype, query.qclass)
        budget = None if limit is None else limit - len(opt)
        counts = []
        truncated = False
        for section in (answer.answer, answer.authority, answer.additional):
            written = 0
            if not truncated:
                for rr in section:
                    if not self.record(rr, budget):
                        truncated = True
                        break
                    written += 1
            truncated = truncated or written < len(section)
            counts.append(written)
        self.buf += opt
        flags = reply_flags(query, answer.rcode, answer.authoritative, truncated)
        counts[2] += 1 if opt else 0
        self.buf[:12] = pack("!6H", query.id, flags, 1, *counts)
        return bytes(self.buf)

    def record(self, rr: RR, budget: int | None) -> bool:
        """Append one record; undo it and return False if it would pass the budget."""
        start = len(self.buf)
        self.added = []
        self.name(rr.name)
        self.buf += pack("!HHI", rr.rtype, 1, rr.ttl)
        length_at = len(self.buf)
        self.buf += b"\x00\x00"
        self.rdata(rr)
        self.buf[length_at : length_at + 2] = pack("!H", len(self.buf) - length_at - 2)
        if budget is not None and len(self.buf) > budget:
            del self.buf[start:]
            if self.names is not None:
                for suffix in self.added:
                    del self.names[suffix]
            return False
        return True

    def rdata(self, rr: RR) -> None:
        data = rr.rdata
        if rr.rtype == A and isinstance(data, str):
            self.buf += inet_pton(AF_INET, data)
        elif rr.rtype == AAAA and isinstance(data, str):
            self.buf += inet_pton(AF_INET6, data)
        elif isinstance(data, Srv):
            self.buf += pack("!HHH", data.priority, data.weight, data.port)
            self.name(data.target, compress=False)  # never compressed (RFC 2782, RFC 3597 §4)
        elif isinstance(data, Soa):
            self.name(data.mname)
            self.name(data.rname)
            self.buf += pack(
                "!5I", data.serial, data.refresh, data.retry, data.expire, data.minimum
            )
        elif isinstance(data, Raw):
            # Its class, over the IN `record` wrote: type, class, TTL and length precede it.
            self.buf[-8:-6] = pack("!H", data.rclass)
            self.buf += data.data
        elif rr.rtype in _STRINGS:
            for text in cast(tuple[str, ...], data):
                raw = text.encode()
                self.buf += bytes((len(raw),)) + raw
        elif rr.rtype in _COMPRESSIBLE:
            self.name(cast(Name, data))
        elif isinstance(data, Mx):
            self.buf += pack("!H", data.preference)
            self.name(data.exchange)
        else:
            raise TypeError(f"cannot encode {rr}")

    def name(self, name: Name, compress: bool = True) -> None:
        """Write a name; when compressing, point at a suffix already written."""
        names = self.names if compress else None
        for i in range(len(name)):
            suffix = name[i:]
            if names is not None:
                pointer = names.get(suffix)
                if pointer is not None:
                    self.buf += pack("!H", (POINTER << 8) | pointer)
                    return
                if len(self.buf) < 0x4000:
                    names[suffix] = len(self.buf)
                    self.added.append(suffix)
            raw = name[i].encode("latin-1")
            self.buf += bytes((len(raw),)) + raw
        self.buf += b"\x00"
