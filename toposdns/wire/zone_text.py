"""One resource record read from its zone-file text (RFC 1035 section 5), as miekg/dns's
`NewRR` reads the records CoreDNS's `template` plugin renders.

    example. 60 IN SOA ns.example. hostmaster.example. (1 60 60 60 60)

The first record of the text counts (None when there is none: blanks and comments only). Its
owner and the names in its rdata are absolute, relative ones completed with the root; its TTL
(seconds, or `1h30m`) and class (IN by default) may come in either order; a missing TTL is
3600, as `NewRR` gives. Words are split as miekg/dns splits them: blanks, `"quoted strings"`,
`\\` escapes (`\\.`, `\\032`), `( ... )` over lines and `;` comments.

A, AAAA, NS, CNAME, PTR, MX, SRV and SOA become the encoder's own rdata (their names
compressed as CoreDNS compresses them); TXT and HINFO strings, the types dnslib parses (CAA, DS,
TLSA, SSHFP, NAPTR, ...), RFC 3597's `\\# LENGTH HEX` form of any type, and any record of a class
other than IN are written as they are (`Raw`). dnslib's own zone parser is not used for the
record itself: it takes neither `(` next to a word, as in the SOA above, nor escapes.

Errors are ValueError, saying what is wrong.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any

from dnslib import RDMAP, DNSBuffer, DNSLabel

from toposdns.wire.codes import (
    AAAA,
    CLASS_IN,
    CNAME,
    HINFO,
    MX,
    NS,
    PTR,
    SOA,
    SRV,
    TXT,
    A,
    Name,
)
from toposdns.wire.decode import read_name
from toposdns.wire.encode import name_wire, record_wire
from toposdns.wire.records import RR, Mx, Raw, Soa, Srv, type_code, type_name

#: The TTL of a record that gives none (miekg/dns's defaultTtl).
DEFAULT_TTL = 3600
#: Classes by mnemonic (miekg/dns's StringToClass).
CLASSES = {"IN": 1, "CS": 2, "CH": 3, "HS": 4, "NONE": 254, "ANY": 255}
_MAX_NAME_WIRE = 255
_MAX_LABEL = 63
_BLANKS = b" \t\r"


class _Word:
    """A word of the text: its bytes as written (escapes kept) and whether it was quoted."""

    __slots__ = ("raw", "quoted")

    def __init__(self, raw: bytes, quoted: bool) -> None:
        self.raw = raw
        self.quoted = quoted

    @property
    def text(self) -> str:
        return self.raw.decode("latin-1")


def read_record(text: str) -> RR | None:
    """The first record of `text`, or None when it holds none; ValueError when it is not a
    record miekg/dns would read."""
    words = _first_line(text.encode())
    if not words:
        return None
    if words[0] is _BLANK_OWNER:
        raise ValueError("no owner name: the record starts with a blank")
    owner = words[0]
    if owner.quoted or owner.raw.startswith(b"$"):
        raise ValueError(f"not an owner name: {owner.text!r}")
    name = parse_name(owner.raw)
    ttl: int | None = None
    rclass: int | None = None
    rtype: int | None = None
    at = 1
    while at < len(words):
        word = words[at]
        at += 1
        upper = word.text.upper()
        found_type = _type(upper)
        if found_type is not None and not word.quoted:
            rtype = found_type
            break
        found_class = _class(upper)
        if rclass is None and found_class is not None and not word.quoted:
            rclass = found_class
        elif ttl is None and not word.quoted and (seconds := ttl_value(word.text)) is not None:
            ttl = seconds
        else:
            raise ValueError(f"not a TTL, class or type: {word.text!r}")
    if rtype is None:
        raise ValueError("no record type")
    rdata = words[at:]
    ttl = DEFAULT_TTL if ttl is None else ttl
    rclass = CLASS_IN if rclass is None else rclass
    record = _record(name, rtype, ttl, rdata)
    if rclass != CLASS_IN:  # the encoder's forms are IN's: another class is written as it is
        return RR(name, rtype, ttl, Raw(_rdata_bytes(record), rclass))
    return record


class _Blank(_Word):
    """The mark of a line that starts with a blank (the previous owner, in a zone file)."""


_BLANK_OWNER = _Blank(b"", False)


def _first_line(data: bytes) -> list[_Word]:
    """The words of the first record: up to the end of its line, or of its parentheses."""
    words: list[_Word] = []
    depth = 0
    i, n = 0, len(data)
    line_start = True
    while i < n:
        char = data[i]
        if char == 0x0A:  # newline
            if depth == 0 and words:
                break
            line_start = True
            i += 1
            continue
        if data[i : i + 1] in (b" ", b"\t", b"\r"):
            if line_start and depth == 0 and not words:
                words.append(_BLANK_OWNER)
            i += 1
            line_start = False
            continue
        line_start = False
        if char == 0x3B:  # ; comment
            while i < n and data[i] != 0x0A:
                i += 1
        elif char == 0x28:  # (
            depth += 1
            i += 1
        elif char == 0x29:  # )
            if depth == 0:
                raise ValueError("a ) without its (")
            depth -= 1
            i += 1
        elif char == 0x22:  # "
            start = i + 1
            i = start
            while i < n and data[i] != 0x22:
                i += 2 if data[i] == 0x5C else 1
            if i >= n:
                raise ValueError("a quote that is never closed")
            words.append(_Word(data[start:i], True))
            i += 1
        else:
            start = i
            while i < n and data[i] not in b' \t\r\n;()"':
                i += 2 if data[i] == 0x5C else 1
            words.append(_Word(data[start : min(i, n)], False))
    if depth:
        raise ValueError("a ( that is never closed")
    if words and words[0] is _BLANK_OWNER and len(words) == 1:
        return []
    return words


def ttl_value(text: str) -> int | None:
    """Seconds from `3600` or `1h30m` (miekg/dns's stringToTTL, wrapping as its uint32 does);
    None when it is not a TTL."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    total = number = 0
    for char in text.lower():
        if char.isdigit() and char.isascii():
            number = (number * 10 + int(char)) & 0xFFFFFFFF
        elif char in units:
            total = (total + number * units[char]) & 0xFFFFFFFF
            number = 0
        else:
            return None
    return (total + number) & 0xFFFFFFFF


def _type(upper: str) -> int | None:
    try:
        return type_code(upper)
    except ValueError:
        return None


def _class(upper: str) -> int | None:
    if upper in CLASSES:
        return CLASSES[upper]
    if upper.startswith("CLASS") and upper[5:].isdigit() and int(upper[5:]) < 65536:
        return int(upper[5:])
    return None


def parse_name(raw: bytes) -> Name:
    """A name from its presentation form (`\\.` and `\\DDD` escapes), relative names completed
    with the root; `@` is the root."""
    if raw in (b"@", b"."):
        return ()
    labels: list[bytes] = []
    label = bytearray()
    i, n = 0, len(raw)
    while i < n:
        char = raw[i]
        if char == 0x5C:  # backslash
            digits = raw[i + 1 : i + 4]
            if len(digits) == 3 and digits.isdigit():
                value = int(digits)
                if value > 255:
                    raise ValueError(f"bad escape in name {raw.decode('latin-1')!r}")
                label.append(value)
                i += 4
            elif i + 1 < n:
                label.append(raw[i + 1])
                i += 2
            else:
                raise ValueError(f"bad escape in name {raw.decode('latin-1')!r}")
        elif char == 0x2E:  # .
            if not label:
                raise ValueError(f"empty label in name {raw.decode('latin-1')!r}")
            labels.append(bytes(label))
            label = bytearray()
            i += 1
        else:
            label.append(char)
            i += 1
    if label:
        labels.append(bytes(label))
    if any(len(part) > _MAX_LABEL for part in labels):
        raise ValueError(f"a label longer than {_MAX_LABEL} in {raw.decode('latin-1')!r}")
    if sum(len(part) + 1 for part in labels) + 1 > _MAX_NAME_WIRE:
        raise ValueError(f"name longer than {_MAX_NAME_WIRE} octets: {raw.decode('latin-1')!r}")
    return tuple(part.decode("latin-1") for part in labels)


def _strings(words: Sequence[_Word]) -> list[bytes]:
    """Character-strings (TXT, HINFO): each word, escapes read, cut in 255-octet pieces."""
    found: list[bytes] = []
    for word in words:
        value = _unescaped(word.raw)
        found.extend(value[start : start + 255] for start in range(0, len(value), 255))
        if not value:
            found.append(b"")
    return found


def _unescaped(raw: bytes) -> bytes:
    out = bytearray()
    i, n = 0, len(raw)
    while i < n:
        if raw[i] == 0x5C and i + 1 < n:
            digits = raw[i + 1 : i + 4]
            if len(digits) == 3 and digits.isdigit() and int(digits) < 256:
                out.append(int(digits))
                i += 4
            else:
                out.append(raw[i + 1])
                i += 2
        else:
            out.append(raw[i])
            i += 1
    return bytes(out)


def _number(word: _Word, bits: int, what: str) -> int:
    text = word.text
    if not text.isdigit() or not text.isascii() or int(text) >= 1 << bits:
        raise ValueError(f"bad {what}: {text!r}")
    return int(text)


def _count(words: Sequence[_Word], count: int, rtype: int) -> None:
    if len(words) != count:
        shown = " ".join(word.text for word in words)
        raise ValueError(f"{type_name(rtype)} takes {count} fields, not {shown!r}")


def _record(name: Name, rtype: int, ttl: int, words: Sequence[_Word]) -> RR:
    """The record of one type from its rdata words."""
    if words and words[0].raw == b"\\#" and not words[0].quoted:
        return _generic(name, rtype, ttl, words[1:])
    if rtype in (A, AAAA):
        _count(words, 1, rtype)
        text = words[0].text
        try:
            address = ipaddress.IPv4Address(text) if rtype == A else ipaddress.IPv6Address(text)
        except ValueError:
            raise ValueError(f"bad {type_name(rtype)} address: {text!r}") from None
        if "%" in text:
            raise ValueError(f"bad AAAA address: {text!r}")
        return RR(name, rtype, ttl, str(address))
    if rtype in (NS, CNAME, PTR):
        _count(words, 1, rtype)
        return RR(name, rtype, ttl, _name(words[0]))
    if rtype == MX:
        _count(words, 2, rtype)
        return RR(name, rtype, ttl, Mx(_number(words[0], 16, "MX preference"), _name(words[1])))
    if rtype == SRV:
        _count(words, 4, rtype)
        numbers = [_number(word, 16, "SRV field") for word in words[:3]]
        return RR(name, rtype, ttl, Srv(numbers[0], numbers[1], numbers[2], _name(words[3])))
    if rtype == SOA:
        _count(words, 7, rtype)
        serial = _number(words[2], 32, "SOA serial")
        times = []
        for word in words[3:]:
            seconds = None if word.quoted else ttl_value(word.text)
            if seconds is None:
                raise ValueError(f"bad SOA zone parameter: {word.text!r}")
            times.append(seconds)
        soa = Soa(_name(words[0]), _name(words[1]), serial, *times)
        return RR(name, rtype, ttl, soa)
    if rtype in (TXT, HINFO):
        strings = _strings(words)
        if rtype == HINFO:  # CPU and OS: a second string of the rest, as miekg/dns joins it
            if not strings:
                raise ValueError("HINFO takes a CPU and an OS")
            strings = [strings[0], b" ".join(strings[1:])]
        data = b"".join(bytes((len(s),)) + s for s in strings)
        return RR(name, rtype, ttl, Raw(data))
    return RR(name, rtype, ttl, Raw(_dnslib_rdata(rtype, words)))


def _name(word: _Word) -> Name:
    if word.quoted:
        raise ValueError(f"a name cannot be quoted: {word.text!r}")
    return parse_name(word.raw)


def _generic(name: Name, rtype: int, ttl: int, words: Sequence[_Word]) -> RR:
    """RFC 3597: `\\# LENGTH HEX...`."""
    if not words:
        raise ValueError("\\# without a length")
    length = _number(words[0], 16, "rdata length")
    try:
        data = bytes.fromhex("".join(word.text for word in words[1:]))
    except ValueError:
        raise ValueError("bad hex in \\# rdata") from None
    if len(data) != length:
        raise ValueError(f"\\# rdata of {len(data)} octets, not {length}")
    return record_of(name, rtype, CLASS_IN, ttl, data)


def record_of(name: Name, rtype: int, rclass: int, ttl: int, data: bytes) -> RR:
    """A record from its rdata in wire form (names uncompressed): in the encoder's own form
    where it has one (so that its names are compressed as CoreDNS compresses them), else as
    it is. ValueError when the rdata is not what its type holds."""
    if rclass != CLASS_IN:
        return RR(name, rtype, ttl, Raw(data, rclass))
    try:
        if rtype == A and len(data) == 4:
            return RR(name, rtype, ttl, str(ipaddress.IPv4Address(data)))
        if rtype == AAAA and len(data) == 16:
            return RR(name, rtype, ttl, str(ipaddress.IPv6Address(data)))
        if rtype in (NS, CNAME, PTR):
            return RR(name, rtype, ttl, _wire_name(data, 0, True))
        if rtype == MX:
            return RR(name, rtype, ttl, Mx(int.from_bytes(data[:2]), _wire_name(data, 2, True)))
        if rtype == SOA:
            mname = _wire_name(data, 0, False)
            at = len(name_wire(mname))
            rname = _wire_name(data, at, False)
            at += len(name_wire(rname))
            if len(data) - at != 20:
                raise ValueError("SOA rdata of the wrong length")
            times = [int.from_bytes(data[i : i + 4]) for i in range(at, at + 20, 4)]
            return RR(name, rtype, ttl, Soa(mname, rname, *times))
    except (IndexError, ValueError) as exc:
        raise ValueError(f"bad {type_name(rtype)} rdata: {exc}") from None
    if rtype in (A, AAAA):
        raise ValueError(f"bad {type_name(rtype)} rdata length {len(data)}")
    return RR(name, rtype, ttl, Raw(data))


def _wire_name(data: bytes, at: int, whole: bool) -> Name:
    if data[at:].startswith(b"\xc0") or any(b >= 0xC0 for b in data[at : at + 1]):
        raise ValueError("a compressed name")
    name, end = read_name(data, at)
    if whole and end != len(data):
        raise ValueError("octets after the name")
    return name


class _Uncompressed(dict[tuple[bytes, ...], int]):
    """dnslib's name table, kept empty: rdata written alone must not point elsewhere."""

    def __setitem__(self, key: tuple[bytes, ...], value: int) -> None:
        pass


def _dnslib_rdata(rtype: int, words: Sequence[_Word]) -> bytes:
    """The rdata of a type the encoder has no form for, parsed and written by dnslib."""
    kind = type_name(rtype)
    parser = RDMAP.get(kind)
    if parser is None:
        raise ValueError(f"{kind} records are not read here; write them as \\# LENGTH HEX")
    texts = [_unescaped(word.raw).decode("latin-1") if word.quoted else word.text for word in words]
    try:
        return packed(parser.fromZone(texts, DNSLabel(".")))
    except Exception as exc:  # dnslib raises what its parsers meet: any of them is bad rdata
        raise ValueError(f"bad {kind} rdata: {exc}") from None


def packed(rdata: Any) -> bytes:
    """A dnslib rdata in wire form, its names uncompressed (it is written on its own)."""
    buffer = DNSBuffer()
    buffer.names = _Uncompressed()
    rdata.pack(buffer)
    data: bytes = bytes(buffer.data)
    return data


def _rdata_bytes(record: RR) -> bytes:
    """A record's rdata in uncompressed wire form."""
    data = record.rdata
    if isinstance(data, Raw):
        return data.data
    return record_wire(record)[len(name_wire(record.name)) + 10 :]
