"""Read a DNS query off the wire (RFC 1035, RFC 6891), by hand: this runs for every packet.

The header checks are those of miekg/dns's default accept function, which CoreDNS serves
through: responses are ignored, opcodes other than QUERY get NOTIMP, and a query whose section
counts no query can have gets FORMERR.
"""

from __future__ import annotations

import ipaddress
from struct import error as StructError
from struct import unpack_from
from typing import NamedTuple

from toposdns.wire.codes import (
    CLIENT_SUBNET,
    DO,
    FORMERR,
    NOTIMP,
    OPCODE,
    OPT,
    POINTER,
    QR,
    SOA,
    Name,
)

HEADER_SIZE = 12
MAX_NAME_WIRE = 255
ECS_OPTION = CLIENT_SUBNET


class Dropped(Exception):
    """Not worth an answer: shorter than a header, or a response."""


class Rejected(Exception):
    """Answered with a bare header carrying `rcode` (FORMERR or NOTIMP)."""

    def __init__(self, data: bytes, rcode: int, why: str) -> None:
        super().__init__(why)
        self.data = data
        self.rcode = rcode


class Edns(NamedTuple):
    """The query's OPT record."""

    udp_size: int
    #: The OPT TTL field: extended rcode, version, DO and Z bits.
    ttl: int
    options: tuple[tuple[int, bytes], ...] = ()

    @property
    def version(self) -> int:
        """EDNS version; only 0 exists."""
        return (self.ttl >> 16) & 0xFF


class ClientSubnet(NamedTuple):
    """An EDNS Client Subnet option (RFC 7871)."""

    family: int  # 1 IPv4, 2 IPv6
    source_prefix: int
    #: The address, zero-padded to full length (what identifies the client).
    address: str
    #: The option's address bytes as sent, truncated to the source prefix.
    raw_address: bytes


class Query(NamedTuple):
    """A decoded query: its header fields, its one question and its OPT record."""

    id: int
    flags: int
    name: Name
    qtype: int
    qclass: int
    edns: Edns | None = None
    ecs: ClientSubnet | None = None
    #: The question section as sent (name, type, class), when its name was not compressed:
    #: a reply repeats it byte for byte.
    question: bytes = b""


def decode_query(data: bytes) -> Query:
    """Decode a query; raise Dropped or Rejected when it cannot be answered normally."""
    if len(data) < HEADER_SIZE:
        raise Dropped("shorter than a DNS header")
    qid, flags, qdcount, ancount, nscount, arcount = unpack_from("!6H", data)
    if flags & QR:
        raise Dropped("a response, not a query")
    if flags & OPCODE:
        raise Rejected(data, NOTIMP, "opcode is not QUERY")
    if qdcount != 1 or ancount > 1 or nscount > 1 or arcount > 2:
        raise Rejected(data, FORMERR, "section counts no query can have")
    try:
        name, offset = read_name(data, HEADER_SIZE)
        qtype, qclass = unpack_from("!HH", data, offset)
        offset += 4
        question = data[HEADER_SIZE:offset]
        if data[offset - 6] != 0:  # the name ended in a compression pointer
            question = b""
        edns = None
        for index in range(ancount + nscount + arcount):
            _, offset = read_name(data, offset)
            rtype, rclass, ttl, rdlength = unpack_from("!HHIH", data, offset)
            offset += 10
            rdata = data[offset : offset + rdlength]
            if len(rdata) != rdlength:
                raise ValueError("record data runs past the end of the packet")
            offset += rdlength
            if rtype == OPT and index >= ancount + nscount:
                if edns is not None:
                    raise ValueError("more than one OPT record")
                edns = Edns(rclass, ttl, split_options(rdata))
        ecs = None
        if edns is not None:
            for code, value in edns.options:
                if code == ECS_OPTION:
                    found = read_client_subnet(value)
                    if ecs is None:  # the first counts, as wire/edns.py reads it
                        ecs = found
    except (ValueError, IndexError, StructError) as exc:
        raise Rejected(data, FORMERR, f"malformed query: {exc}") from None
    return Query(qid, flags, name, qtype, qclass, edns, ecs, question)


def decode_plain(data: bytes) -> Query:
    """Decode a plain query (one that wire/edns.py `split_query` cut) as if it carried no EDNS
    options: the query its cached reply answers. ValueError for a name over 255 octets."""
    name, offset = read_name(data, HEADER_SIZE)
    end = offset + 4  # the question's end; an OPT record may follow
    edns = None
    if end < len(data):  # root name, type, class (the buffer size), TTL (flags): 11 bytes in all
        edns = Edns((data[end + 3] << 8) | data[end + 4], int.from_bytes(data[end + 5 : end + 9]))
    return Query(
        (data[0] << 8) | data[1],
        (data[2] << 8) | data[3],
        name,
        (data[offset] << 8) | data[offset + 1],
        (data[offset + 2] << 8) | data[offset + 3],
        edns,
        None,
        data[HEADER_SIZE:end],
    )


def question_end(message: bytes) -> int:
    """The offset just after a message's question (its name, type and class), the one place
    that finds it by reading the name (a plain query's is read off its cache key:
    wire/edns.py `plain_question_end`). IndexError or ValueError when the message is cut short."""
    return read_name(message, HEADER_SIZE)[1] + 4


def dnssec_ok(message: bytes) -> bool:
    """Whether a query's OPT record sets the DO bit (CoreDNS's `request.Do`, which the
    `coredns_dns_do_requests_total` metric counts); False without an OPT record, or when the
    message ends before it. Each record read is at least 11 bytes of the message: the walk is
    bounded by its length."""
    if len(message) < HEADER_SIZE or not (message[10] or message[11]):
        return False
    try:
        questions, answers, authority, additional = unpack_from("!4H", message, 4)
        offset = HEADER_SIZE
        for _ in range(questions):
            offset = read_name(message, offset)[1] + 4
        before = answers + authority
        for index in range(before + additional):
            offset = read_name(message, offset)[1]
            rtype, _, ttl, length = unpack_from("!HHIH", message, offset)
            if rtype == OPT and index >= before:
                return bool(ttl & DO)
            offset += 10 + length
    except (IndexError, ValueError, StructError):
        return False
    return False


def read_name(data: bytes, offset: int) -> tuple[Name, int]:
    """Read a possibly compressed name; return its labels (latin-1) and the offset after it."""
    # Most names are not compressed: read them with as few steps as a label allows.
    start = offset
    labels: list[str] = []
    length = data[offset]
    while 0 < length < 64:
        end = offset + 1 + length
        labels.append(data[offset + 1 : end].decode("latin-1"))
        offset = end
        length = data[offset]  # IndexError past the end of the data
    if length == 0 and offset - start < MAX_NAME_WIRE:
        return tuple(labels), offset + 1
    return _read_compressed_name(data, start)


def _read_compressed_name(data: bytes, offset: int) -> tuple[Name, int]:
    labels: list[str] = []
    end = -1
    wire_length = 1
    jumps = 0
    while True:
        length = data[offset]
        if length == 0:
            offset += 1
            break
        if length & POINTER == POINTER:
            jumps += 1
            if jumps > 64:
                raise ValueError("compression pointer loop")
            if end < 0:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            continue
        if length & POINTER:
            raise ValueError("unknown label type")
        label = data[offset + 1 : offset + 1 + length]
        if len(label) != length:
            raise ValueError("label runs past the end of the packet")
        wire_length += length + 1
        if wire_length > MAX_NAME_WIRE:
            raise ValueError("name longer than 255 octets")
        labels.append(label.decode("latin-1"))
        offset += 1 + length
    return tuple(labels), (end if end >= 0 else offset)


def read_client_subnet(value: bytes) -> ClientSubnet:
    """Parse an ECS option; ValueError for what RFC 7871 §7.1.1 answers with FORMERR."""
    if len(value) < 4:
        raise ValueError("ECS option shorter than its family and prefix lengths")
    family, source_prefix, scope_prefix = unpack_from("!HBB", value)
    raw = value[4:]
    if family == 1:
        size = 4
    elif family == 2:
        size = 16
    else:
        raise ValueError(f"ECS family {family} is neither IPv4 (1) nor IPv6 (2)")
    if source_prefix > size * 8 or scope_prefix != 0:
        raise ValueError("ECS prefix lengths out of range")
    if len(raw) != (source_prefix + 7) // 8:
        raise ValueError("ECS address longer or shorter than its source prefix")
    if raw and source_prefix % 8 and raw[-1] & (0xFF >> (source_prefix % 8)):
        raise ValueError("ECS address has bits set past its source prefix")
    padded = raw + bytes(size - len(raw))
    address = str(ipaddress.ip_address(padded))
    return ClientSubnet(family, source_prefix, address, raw)


def split_options(rdata: bytes) -> tuple[tuple[int, bytes], ...]:
    """Split OPT rdata into (code, data) options."""
    options = []
    offset = 0
    while offset < len(rdata):
        if offset + 4 > len(rdata):
            raise ValueError("EDNS option shorter than its code and length")
        code, length = unpack_from("!HH", rdata, offset)
        value = rdata[offset + 4 : offset + 4 + length]
        if len(value) != length:
            raise ValueError("EDNS option runs past the end of the OPT record")
        options.append((code, value))
        offset += 4 + length
    return tuple(options)


def record_spans(message: bytes) -> list[tuple[int, int, int, int, int]]:
    """(start, TTL offset, end, type, section) of every record of a message, so that a cached
    reply's TTLs can be counted down and its OPT record swapped, in place."""
    qdcount, ancount, nscount, arcount = unpack_from("!4H", message, 4)
    offset = HEADER_SIZE
    for _ in range(qdcount):
        offset = read_name(message, offset)[1] + 4
    spans = []
    for index in range(ancount + nscount + arcount):
        start = offset
        offset = read_name(message, offset)[1]
        rtype, _, _, rdlength = unpack_from("!HHIH", message, offset)
        section = 0 if index < ancount else 1 if index < ancount + nscount else 2
        spans.append((start, offset + 4, offset + 10 + rdlength, rtype, section))
        offset += 10 + rdlength
    if offset > len(message):
        raise ValueError("records run past the end of the message")
    return spans


def serial_offset(message: bytes) -> int:
    """Where the serial of a message's SOA record is, so that a cached reply can be given a
    new serial in place; ValueError without one."""
    for _start, ttl_at, _end, rtype, _section in record_spans(message):
        if rtype == SOA:
            offset = ttl_at + 6  # past TTL and data length: the MNAME
            offset = read_name(message, offset)[1]
            return read_name(message, offset)[1]  # past the RNAME
    raise ValueError("no SOA record in the message")
