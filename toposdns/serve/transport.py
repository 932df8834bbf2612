"""How a query arrived (UDP or TCP, over IPv4 or IPv6), which decides its reply's size limits,
and who sent it: an IPv4 client of an IPv6 socket is an IPv4 client again (`unmapped`)."""

from __future__ import annotations

from dataclasses import dataclass

from toposdns.wire.encode import FRAGMENT_LIMIT_V4, FRAGMENT_LIMIT_V6


@dataclass(frozen=True, slots=True, eq=False)  # one object per kind: hashed by identity
class Transport:
    """How a query arrived, which decides the reply's size limits."""

    name: str
    tcp: bool
    fragment_limit: int
    family: int  # 1 IPv4, 2 IPv6, as CoreDNS's metrics label it
    #: Its place in TRANSPORTS (a cached reply's hit counters are kept in that order).
    slot: int


UDP4 = Transport("udp4", False, FRAGMENT_LIMIT_V4, 1, 0)
UDP6 = Transport("udp6", False, FRAGMENT_LIMIT_V6, 2, 1)
TCP4 = Transport("tcp4", True, 0, 1, 2)
TCP6 = Transport("tcp6", True, 0, 2, 3)
TRANSPORTS = (UDP4, UDP6, TCP4, TCP6)


def unmapped(host: str) -> str:
    """A client's address as every address rule reads it (acl, --forward-allow, ECS trust,
    placement, the query log): an IPv6 socket bound to `::` gives IPv4 clients IPv4-mapped
    (`::ffff:10.0.0.7`, RFC 4291), which no IPv4 network holds. CoreDNS's Go sockets give them
    as IPv4 addresses."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host
