"""Resource records as the wire codec reads and writes them, and the sections of a reply.

Records are named tuples: made for every query that misses the cache, where a frozen
dataclass costs several times as much to build. Names are tuples of labels (the root is the
empty tuple), so a label is never confused with a dotted string and a query's letter case is
kept exactly as it was asked.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from dnslib import CLASS as CLASSES
from dnslib import QTYPE

from toposdns.wire.codes import CLASS_IN, TXT, Name


def type_name(rtype: int) -> str:
    """Mnemonic of an RR type, or RFC 3597's TYPEnnn."""
    name: str = QTYPE.forward.get(rtype, f"TYPE{rtype}")
    return name


def type_code(text: str) -> int:
    """RR type from its mnemonic or TYPEnnn form; ValueError if unknown."""
    upper = text.upper()
    if upper in QTYPE.reverse:
        return int(QTYPE.reverse[upper])
    if upper.startswith("TYPE") and upper[4:].isdigit() and int(upper[4:]) < 65536:
        return int(upper[4:])
    raise ValueError(f"unknown record type {text!r}")


def class_name(rclass: int) -> str:
    """Mnemonic of a class, or RFC 3597's CLASSnnn."""
    name: str = CLASSES.forward.get(rclass, f"CLASS{rclass}")
    return name


def name_text(name: Name) -> str:
    """Presentation form with a trailing dot, escaping dots and odd bytes inside labels."""
    if not name:
        return "."
    out = []
    for label in name:
        chars = []
        for ch in label:
            code = ord(ch)
            if ch in '.\\"()@;$':
                chars.append("\\" + ch)
            elif code <= 0x20 or code >= 0x7F:
                chars.append(f"\\{code:03d}")
            else:
                chars.append(ch)
        out.append("".join(chars))
    return ".".join(out) + "."


class Srv(NamedTuple):
    """SRV rdata (RFC 2782)."""

    priority: int
    weight: int
    port: int
    target: Name


class Soa(NamedTuple):
    """SOA rdata."""

    mname: Name
    rname: Name
    serial: int
    refresh: int
    retry: int
    expire: int
    minimum: int


class Mx(NamedTuple):
    """MX rdata (RFC 1035 section 3.3.9)."""

    preference: int
    exchange: Name


class Raw(NamedTuple):
    """Rdata written as it is given, uncompressed, in its class (RFC 3597): the records a
    `template` renders of types without a form here, of a class other than IN, or of strings
    (TXT, HINFO) given as bytes."""

    data: bytes
    rclass: int = CLASS_IN


#: A/AAAA rdata is the address text; PTR/CNAME/NS a Name; TXT a tuple of strings.
Rdata = str | Name | Srv | Soa | Mx | Raw


class RR(NamedTuple):
    """One resource record, of class IN unless its rdata is `Raw` in another."""

    name: Name
    rtype: int
    ttl: int
    rdata: Rdata

    def __str__(self) -> str:
        data = self.rdata
        rclass = class_name(data.rclass) if isinstance(data, Raw) else "IN"
        return (
            f"{name_text(self.name)}\t{self.ttl}\t{rclass}\t{type_name(self.rtype)}\t"
            f"{self.rdata_text()}"
        )

    def rdata_text(self) -> str:
        """The rdata in zone-file form."""
        data = self.rdata
        if isinstance(data, Srv):
            return f"{data.priority} {data.weight} {data.port} {name_text(data.target)}"
        if isinstance(data, Soa):
            return (
                f"{name_text(data.mname)} {name_text(data.rname)} {data.serial} "
                f"{data.refresh} {data.retry} {data.expire} {data.minimum}"
            )
        if isinstance(data, Mx):
            return f"{data.preference} {name_text(data.exchange)}"
        if isinstance(data, Raw):
            return f"\\# {len(data.data)} {data.data.hex().upper()}".rstrip()
        if isinstance(data, str):
            return data
        if self.rtype == TXT:
            return " ".join('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in data)
        return name_text(data)


class Sections(Protocol):
    """What the encoder writes of an answer: its rcode, its sections and its AA bit (the
    resolver's `Answer` is one, with what else it knows)."""

    @property
    def rcode(self) -> int: ...

    @property
    def answer(self) -> tuple[RR, ...]: ...

    @property
    def authority(self) -> tuple[RR, ...]: ...

    @property
    def additional(self) -> tuple[RR, ...]: ...

    @property
    def authoritative(self) -> bool: ...


class Written(NamedTuple):
    """Sections the server writes itself (an error, RFC 8482's HINFO): not authoritative."""

    rcode: int
    answer: tuple[RR, ...] = ()
    authority: tuple[RR, ...] = ()
    additional: tuple[RR, ...] = ()
    authoritative: bool = False
