"""The reference path for differential tests: what the server must answer, with no cache at all.

`reference_reply` decodes, routes (serve/responder.py `route`, the one first step of every
query), places the client (serve/placement.py's rule, with nothing remembered), resolves and
encodes, with the same primitives and in the same order as serve/responder.py's `decoded()`
(without a forwarder), but never through the Responder, so that every cache and fast path of
the real frontends can be checked against it byte for byte. The frontend harnesses below drive
the real UDP and TCP protocols with fake transports, the way the event loop does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dnslib

from toposdns.resolve.client import Network
from toposdns.resolve.resolver import ResolverConfig, resolve
from toposdns.serve.placement import Placer
from toposdns.serve.responder import (
    BADVERS,
    REFUSE,
    TCP4,
    TCP6,
    UDP4,
    UDP6,
    Responder,
    Transport,
    route,
)
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.udp import UdpProtocol
from toposdns.store.snapshot import Snapshot
from toposdns.wire.codes import REFUSED
from toposdns.wire.decode import Dropped, Rejected, decode_query
from toposdns.wire.encode import (
    FRAGMENT_LIMIT_V4,
    FRAGMENT_LIMIT_V6,
    MAX_TCP_SIZE,
    MAX_UDP_SIZE,
    bound_buffer,
    encode_badvers,
    encode_bare,
    encode_rejection,
    encode_reply,
    udp_limit,
)

#: Per transport: is it TCP, and the UDP fragmentation limit (0: none). The oracle's own table,
#: so that it does not depend on how the Transport objects carry these.
LIMITS = {
    UDP4: (False, FRAGMENT_LIMIT_V4),
    UDP6: (False, FRAGMENT_LIMIT_V6),
    TCP4: (True, 0),
    TCP6: (True, 0),
}


def reference_reply(
    data: bytes,
    transport: Transport,
    source: str,
    snapshot: Snapshot,
    config: ResolverConfig,
    ecs_trust: Sequence[Network] = (),
    max_udp_size: int = MAX_UDP_SIZE,
) -> bytes | None:
    """The reply a server without a forwarder owes to `data` from `source`, or None for none.

    Where the server answers an internal error with SERVFAIL, this raises: that is a bug to see.
    """
    try:
        query = bound_buffer(decode_query(data), max_udp_size)  # CoreDNS's `bufsize`
    except Dropped:
        return None
    except Rejected as rejected:
        return encode_rejection(rejected.data, rejected.rcode)
    where = route(query, config.zones, forwarding=False)
    if where is BADVERS:
        return encode_badvers(query)
    if where is REFUSE:
        return encode_bare(query, REFUSED)
    # The server's one placement rule, with nothing remembered: a new Placer per query.
    subnet = (query.ecs.address, query.ecs.source_prefix) if query.ecs is not None else None
    labels, via_ecs = Placer(tuple(ecs_trust), snapshot).place(source, subnet)
    answer = resolve(query.name, query.qtype, snapshot, config, labels)
    tcp, fragment_limit = LIMITS[transport]
    limit = MAX_TCP_SIZE if tcp else udp_limit(query.edns)
    # RFC 7871 §7.2.1: the scope is the source prefix only if the answer depended on it.
    scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
    return encode_reply(query, answer, limit, fragment_limit, scope)


def render(message: bytes | None) -> str:
    """A message as hex and, when dnslib can read it, dig-like text."""
    if message is None:
        return "(no reply)"
    try:
        text = str(dnslib.DNSRecord.parse(message))
    except Exception as exc:  # malformed on purpose, or a bug: the hex says which
        text = f"(dnslib cannot parse it: {exc})"
    return f"{message.hex()}\n{text}"


class _DatagramTransport:
    """What UdpProtocol needs of a datagram transport: it records what is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []

    def sendto(self, data: bytes, addr: Any) -> None:
        self.sent.append((bytes(data), addr))


class _StreamTransport:
    """What TcpProtocol needs of a stream transport: it records what is written."""

    def __init__(self, peer: str) -> None:
        self.peer = (peer, 40000, 0, 0) if ":" in peer else (peer, 40000)
        self.written = bytearray()
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Frontends:
    """The real UDP and TCP protocols of one responder, one TCP connection per client kept
    open across snapshots. Needs a running event loop (TCP sets an idle timer)."""

    def __init__(self, responder: Responder) -> None:
        self.responder = responder
        self.udp: dict[Transport, tuple[UdpProtocol, _DatagramTransport]] = {}
        for kind in (UDP4, UDP6):
            protocol = UdpProtocol(responder, kind)
            transport = _DatagramTransport()
            protocol.connection_made(transport)  # type: ignore[arg-type]
            self.udp[kind] = (protocol, transport)
        self.limits = TcpLimits(max_connections=1000, idle_timeout=3600)
        self.tcp: dict[tuple[Transport, str], tuple[TcpProtocol, _StreamTransport]] = {}

    def over_udp(self, kind: Transport, data: bytes, source: str) -> list[bytes]:
        """Every datagram sent back for one datagram from `source`."""
        protocol, transport = self.udp[kind]
        transport.sent.clear()
        addr = (source, 40000, 0, 0) if ":" in source else (source, 40000)
        protocol.datagram_received(data, addr)
        assert all(to == addr for _, to in transport.sent), "a reply went to another address"
        return [sent for sent, _ in transport.sent]

    def over_tcp(self, kind: Transport, chunks: Sequence[bytes], source: str) -> list[bytes]:
        """Every reply written back, unframed, for a byte stream fed in `chunks`."""
        found = self.tcp.get((kind, source))
        if found is None:
            found = (TcpProtocol(self.responder, self.limits, kind), _StreamTransport(source))
            found[0].connection_made(found[1])  # type: ignore[arg-type]
            self.tcp[(kind, source)] = found
        protocol, transport = found
        transport.written.clear()
        for chunk in chunks:
            protocol.data_received(chunk)
        assert not transport.closing, "the server closed the connection"
        return unframe(bytes(transport.written))

    def close(self) -> None:
        """Close the TCP connections, which cancels their idle timers."""
        for protocol, _ in self.tcp.values():
            protocol.connection_lost(None)
        self.tcp.clear()


def frame(message: bytes) -> bytes:
    """A message with its 2-byte TCP length prefix (RFC 1035 §4.2.2)."""
    return len(message).to_bytes(2, "big") + message


def unframe(stream: bytes) -> list[bytes]:
    """Split a TCP byte stream into messages; it must end on a message boundary."""
    messages = []
    while stream:
        assert len(stream) >= 2, f"a stray byte after the last reply: {stream.hex()}"
        length = int.from_bytes(stream[:2], "big")
        assert len(stream) >= 2 + length, "a reply cut short"
        messages.append(stream[2 : 2 + length])
        stream = stream[2 + length :]
    return messages
