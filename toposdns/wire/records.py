"""Resource records as the wire codec reads and writes them, and the sections of a reply.

Records are named tuples: made for every query that misses the cache, where a frozen
dataclass costs several times as much to build. Names are tuples of labels (the root is the
empty tuple), so a label is never confused with a dotted string and a query's letter case is
kept exactly as it was asked.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from dnslib import QTYPE

from toposdns.wire.codes import TXT, Name


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


#: A/AAAA rdata is the address text; PTR/CNAME/NS a Name; TXT a tuple of strings.
Rdata = str | Name | Srv | Soa


class RR(NamedTuple):
    """One resource record of class IN."""

    name: Name
    rtype: int
    ttl: int
    rdata: Rdata

    def __str__(self) -> str:
        return (
            f"{name_text(self.name)}\t{self.ttl}\tIN\t{type_name(self.rtype)}\t{self.rdata_text()}"
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
