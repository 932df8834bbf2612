"""The reference path for differential tests: what the server must answer, with no cache at all.

`reference_reply` decodes, routes (serve/kubernetes.py `route`, the one first step of every
query), places the client (serve/placement.py's rule, with nothing remembered), resolves and
encodes, with the same primitives and in the same order as the kubernetes block's chain
(without a forwarder), but never through the Responder, so that every cache and fast path of
the real frontends can be checked against it byte for byte. `reference_relayed` does the same
for a server that forwards to a fake upstream of fixed records, with autopath and
fallthrough: what the zones alone answer is still owed byte for byte; where the upstream or
autopath had a hand, it models the reply (CoreDNS's autopath walk and cnamer rule) and
`relied_on` compares what a client relies on. The frontend harnesses below drive
the real UDP and TCP protocols with fake transports, the way the event loop does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import dnslib

from toposdns.resolve.answer import Answer
from toposdns.resolve.client import Network
from toposdns.resolve.resolver import ResolverConfig, match_zone, resolve
from toposdns.serve.blocks import Blocks
from toposdns.serve.chain import Next, Reply, Request
from toposdns.serve.kubernetes import BADVERS, REFUSE, UPSTREAMS, route
from toposdns.serve.placement import Placer
from toposdns.serve.responder import (
    TCP4,
    TCP6,
    UDP4,
    UDP6,
    Responder,
    Transport,
)
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.udp import UdpProtocol
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels
from toposdns.store.turns import TurnCounts
from toposdns.wire.codes import ANY, AXFR, CLASS_IN, IXFR, NXDOMAIN, REFUSED, A, Name
from toposdns.wire.decode import Dropped, Query, Rejected, decode_query
from toposdns.wire.encode import (
    FRAGMENT_LIMIT_V4,
    FRAGMENT_LIMIT_V6,
    MAX_TCP_SIZE,
    MAX_UDP_SIZE,
    bound_buffer,
    encode_badvers,
    encode_bare,
    encode_minimal_any,
    encode_rejection,
    encode_reply,
    udp_limit,
)
from toposdns.wire.records import RR

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
    blocks: Blocks | None = None,
    turns: TurnCounts | None = None,
) -> bytes | None:
    """The reply a server without a forwarder owes to `data` from `source`, or None for none;
    with `blocks`, a name of another server block's zone gets that block's reply, and one of
    no block's REFUSED.

    Where the server answers an internal error with SERVFAIL, this raises: that is a bug to see.

    `turns` holds where each rotation of topology weights stands: give the same one to every
    query the server is asked, in the order it is asked them.
    """
    routed = first_step(data, config, max_udp_size, forwarding=False, blocks=blocks)
    if not isinstance(routed, tuple):
        return routed
    query, where = routed
    if where is OTHER_BLOCK:
        assert blocks is not None
        found = blocks.find(query.name, query.qtype)
        if found is None:
            return encode_bare(query, REFUSED)
        assert found[1] is not None
        reply = found[1](Request(query, data, transport, source))
        assert isinstance(reply, bytes), "the test's blocks answer at once"
        return reply
    # The server's one placement rule, with nothing remembered: a new Placer per query.
    subnet = (query.ecs.address, query.ecs.source_prefix) if query.ecs is not None else None
    labels, via_ecs = Placer(tuple(ecs_trust), snapshot).place(source, subnet)
    answer = resolve(query.name, query.qtype, snapshot, config, labels, turns=turns)
    tcp, fragment_limit = LIMITS[transport]
    limit = MAX_TCP_SIZE if tcp else udp_limit(query.edns)
    # RFC 7871 §7.2.1: the scope is the source prefix only if the answer depended on it.
    scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
    return encode_reply(query, answer, limit, fragment_limit, scope)


#: Where `first_step` sends a query of another server block's zone, or of none's.
OTHER_BLOCK = "another block"


def first_step(
    data: bytes,
    config: ResolverConfig,
    max_udp_size: int,
    forwarding: bool,
    blocks: Blocks | None = None,
) -> tuple[Query, str] | bytes | None:
    """The query decoded (its buffer bounded as CoreDNS's `bufsize` bounds it) and where `route`
    sends it (with `blocks`, `OTHER_BLOCK` for a name the kubernetes block does not hold), or
    the reply it gets before any zone or upstream sees it (None: no reply)."""
    try:
        query = bound_buffer(decode_query(data), max_udp_size)
    except Dropped:
        return None
    except Rejected as rejected:
        return encode_rejection(rejected.data, rejected.rcode)
    where = route(query, config.zones, forwarding)
    if where is BADVERS:
        return encode_badvers(query)
    if blocks is not None and not blocks.mine(query.name, query.qtype):
        return query, OTHER_BLOCK
    if where is REFUSE:
        return encode_bare(query, REFUSED)
    return query, where


class FixedZone:
    """A server block beside the kubernetes one that answers from the names alone: A
    192.0.2.N (N the name's length in labels) for a name, NXDOMAIN for one that begins with
    `nope`, NODATA for other types."""

    name = "fixed"

    def serve(self, request: Request, next: Next) -> Reply:
        query = request.query
        if query.name and query.name[0].lower() == "nope":
            answer = Answer(NXDOMAIN)
        elif query.qtype == A:
            answer = Answer(0, (RR(query.name, A, 60, f"192.0.2.{len(query.name)}"),))
        else:
            answer = Answer(0)
        limit, fragment_limit = request.limit, request.transport.fragment_limit
        return encode_reply(query, answer, limit, fragment_limit, 0)


#: A fake upstream's table (tests/upstream.py): (name in lower case, type) -> zone lines.
UpstreamRecords = Mapping[tuple[str, str], list[str]]
#: How far from its size limit a reply may be and still be cut or not (a CNAME autopath adds,
#: compression): a reply that near its limit may be served either way.
TRUNCATION_MARGIN = 96


def reference_relayed(
    data: bytes,
    transport: Transport,
    source: str,
    snapshot: Snapshot,
    config: ResolverConfig,
    ecs_trust: Sequence[Network],
    upstream: UpstreamRecords,
    search: tuple[Name, ...],
    turns: TurnCounts | None = None,
) -> bytes | dnslib.DNSRecord | None:
    """The reply a server owes to `data` when it forwards to an upstream that answers from
    `upstream`, with `--autopath` (the node's search domains: `search`) and `--fallthrough`:
    bytes where the zones alone answer (compared byte for byte), or the whole message a client
    relies on where an upstream or autopath had a hand in it (compared with `relied_on`);
    `turns` as `reference_reply` takes it."""
    routed = first_step(data, config, MAX_UDP_SIZE, forwarding=True)
    if not isinstance(routed, tuple):
        return routed
    query, where = routed
    if where is UPSTREAMS:
        return forwarded(query, upstream)
    subnet = (query.ecs.address, query.ecs.source_prefix) if query.ecs is not None else None
    placer = Placer(tuple(ecs_trust), snapshot)
    locator, _ = placer.locate(source, subnet)
    if locator is not None and not locator.is_node and query.qclass == CLASS_IN:
        walked = autopath(
            query, locator.namespace, locator.labels, snapshot, config, upstream, search, turns
        )
        if walked is not None:
            return walked
    labels, via_ecs = placer.place(source, subnet)
    answer = resolve(query.name, query.qtype, snapshot, config, labels, turns=turns)
    if answer.fallthrough:
        return forwarded(query, upstream)
    if answer.chase is not None:
        return dnslib.DNSRecord.parse(chased(query, query.name, answer, upstream))
    tcp, fragment_limit = LIMITS[transport]
    limit = MAX_TCP_SIZE if tcp else udp_limit(query.edns)
    scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
    return encode_reply(query, answer, limit, fragment_limit, scope)


def forwarded(query: Query, upstream: UpstreamRecords) -> bytes | dnslib.DNSRecord:
    """What the upstream answers for the query, or RFC 8482's reply to ANY (CoreDNS's `any`)."""
    if query.qtype == ANY:
        return encode_minimal_any(query)
    return upstream_answer(query, query.name, upstream)


def upstream_answer(query: Query, name: Name, upstream: UpstreamRecords) -> dnslib.DNSRecord:
    """The upstream's reply to `query` asked for `name`: its records, else NXDOMAIN; recursion
    available, not authoritative, the client's RD kept."""
    asked = dnslib.DNSLabel([label.encode("latin-1") for label in name])
    header = dnslib.DNSHeader(qr=1, rd=(query.flags >> 8) & 1, ra=1)
    message = dnslib.DNSRecord(header, q=dnslib.DNSQuestion(asked, query.qtype, query.qclass))
    key = (".".join(name).lower(), dnslib.QTYPE.get(query.qtype))
    lines = upstream.get(key)
    if lines is None:
        message.header.rcode = NXDOMAIN
    for line in lines or ():
        message.add_answer(*dnslib.RR.fromZone(line))
    return message


def chased(query: Query, name: Name, answer: Answer, upstream: UpstreamRecords) -> bytes:
    """An answer ending in a CNAME out of the zones, the upstream's answer records appended."""
    assert answer.chase is not None
    target = query._replace(name=answer.chase.target, qtype=answer.chase.qtype)
    found = upstream_answer(target, target.name, upstream)
    answer = answer._replace(chase=None)
    reply = dnslib.DNSRecord.parse(encode_reply(query._replace(name=name), answer, MAX_TCP_SIZE))
    reply.rr += found.rr
    return bytes(reply.pack())


def autopath(
    query: Query,
    namespace: str,
    labels: Labels,
    snapshot: Snapshot,
    config: ResolverConfig,
    upstream: UpstreamRecords,
    search: tuple[Name, ...],
    turns: TurnCounts | None = None,
) -> dnslib.DNSRecord | None:
    """CoreDNS's `autopath @kubernetes` for a pod of `namespace`, or None when the name is not
    below its first search domain: try BASE.<domain> along the search path, then BASE; the
    first name that is not NXDOMAIN answers, its question the name asked and its answer led by
    a CNAME from that name to the owner of its first record named otherwise (cname.go);
    when none is found, the reply to the first name. The domains tried are in lower case, the
    base keeps the case asked. `turns`: as `reference_reply` takes it."""
    if query.qtype in (AXFR, IXFR):
        return None
    lower = tuple(label.lower() for label in query.name)
    zone_len = match_zone(lower, config.zones)
    if zone_len is None:
        return None
    zone = lower[len(lower) - zone_len :]
    first = (namespace, "svc", *zone)
    if len(lower) <= len(first) or lower[-len(first) :] != first:
        return None
    base = query.name[: -len(first)]
    path = [first, ("svc", *zone), zone, *search, ()]
    names = [
        base + suffix for suffix in path if sum(map(len, base + suffix)) + len(base + suffix) < 255
    ]
    replies = []
    for name in names:
        reply: dnslib.DNSRecord | None = None
        if match_zone(tuple(label.lower() for label in name), config.zones) is not None:
            answer = resolve(name, query.qtype, snapshot, config, labels)
            if not answer.fallthrough:
                lowered = str(dnslib.DNSLabel([lb.encode("latin-1") for lb in name])).lower()
                if (
                    name == query.name
                    and answer.rcode != NXDOMAIN
                    and all(".".join(rr.name).lower() + "." == lowered for rr in answer.answer)
                ):
                    # The name exists as asked, letter for letter, and its records (before an
                    # ExternalName is chased upstream) are all its own: the plain reply, which
                    # the server's reply cache shares with every client.
                    return None
                if turns is not None:  # a name the walk finds takes its turn
                    answer = resolve(name, query.qtype, snapshot, config, labels, turns=turns)
                renamed = query._replace(name=name)
                wire = (
                    chased(query, name, answer, upstream)
                    if answer.chase
                    else encode_reply(renamed, answer, MAX_TCP_SIZE)
                )
                reply = dnslib.DNSRecord.parse(wire)
        if reply is None:
            reply = upstream_answer(query, name, upstream)
        replies.append(reply)
        if reply.header.rcode != NXDOMAIN:
            break
    if replies[-1].header.rcode == NXDOMAIN:
        # None exists: the reply to the first name, for the client to walk the path itself; its
        # question is that name (the domains in lower case, as the server writes them).
        return replies[0]
    found = replies[-1]
    asked = dnslib.DNSLabel([label.encode("latin-1") for label in query.name])
    found.q.qname = asked
    owners = [str(rr.rname).lower() for rr in found.rr]
    other = next((i for i, owner in enumerate(owners) if owner != str(asked).lower()), None)
    if other is not None:  # CoreDNS's cnamer: a CNAME to the first record named otherwise
        target = found.rr[other]
        cname = dnslib.RR(
            asked, dnslib.QTYPE.CNAME, ttl=target.ttl, rdata=dnslib.CNAME(target.rname)
        )
        found.rr.insert(0, cname)
    return found


def relied_on(expected: dnslib.DNSRecord, served: bytes, limit: int) -> str:
    """What differs between a served reply and the expected one in what a client relies on:
    the rcode, QR RD RA TC, the question as asked (letter case kept), and the answer records
    (owner, type, rdata, names in any case; the TTL at most the expected one, as caches count
    down; in any order). A reply near its size limit may be truncated or not; a truncated one
    has no answer to compare. "" when nothing differs."""
    try:
        got = dnslib.DNSRecord.parse(served)
    except Exception as exc:  # malformed is a difference too
        return f"unreadable reply: {exc}"
    size = len(expected.pack())
    problems = []
    want_tc = size > limit + TRUNCATION_MARGIN
    if got.header.tc != want_tc and abs(size - limit) > TRUNCATION_MARGIN:
        problems.append(
            f"TC {got.header.tc}, expected {int(want_tc)} ({size} bytes, limit {limit})"
        )

    def head(m: dnslib.DNSRecord) -> tuple[object, ...]:
        h = m.header
        return (h.rcode, h.qr, h.rd, h.ra, [(str(q.qname), q.qtype, q.qclass) for q in m.questions])

    if head(got) != head(expected):
        problems.append(f"rcode, QR RD RA or question: {head(got)}, expected {head(expected)}")
    if not got.header.tc:

        def records(m: dnslib.DNSRecord) -> dict[tuple[str, int, str], int]:
            # Names in any case: an upstream compresses its records' names against the question.
            return {(str(rr.rname).lower(), rr.rtype, str(rr.rdata).lower()): rr.ttl for rr in m.rr}

        have, want = records(got), records(expected)
        if have.keys() != want.keys() or len(got.rr) != len(expected.rr):
            problems.append(f"answer {sorted(have)}, expected {sorted(want)}")
        elif any(have[key] > want[key] for key in want):
            problems.append(f"TTLs {have}, more than {want}")
    return "; ".join(problems)


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

    def get_write_buffer_size(self) -> int:
        return 0

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

    async def settled(self) -> None:
        """Wait until every reply that waits for an upstream is written (for at most a few
        seconds: a reply still missing then is a missing reply, which the comparison sees)."""
        for _ in range(3):
            pending = [task for protocol, _ in self.udp.values() for task in protocol.pending]
            pending += [task for protocol, _ in self.tcp.values() for task in protocol.pending]
            if not pending:
                return
            await asyncio.wait(pending, timeout=2)

    async def later_over_udp(
        self, kind: Transport, data: Sequence[bytes], source: str
    ) -> list[bytes]:
        """Every datagram sent back for `data` from `source`, those waiting for an upstream too."""
        protocol, transport = self.udp[kind]
        transport.sent.clear()
        addr = (source, 40000, 0, 0) if ":" in source else (source, 40000)
        for message in data:
            protocol.datagram_received(message, addr)
        await self.settled()
        assert all(to == addr for _, to in transport.sent), "a reply went to another address"
        return [sent for sent, _ in transport.sent]

    async def later_over_tcp(
        self, kind: Transport, chunks: Sequence[bytes], source: str
    ) -> list[bytes]:
        """`over_tcp`, waiting for the replies an upstream gives."""
        replies = self.over_tcp(kind, chunks, source)
        await self.settled()
        _, transport = self.tcp[(kind, source)]
        return replies + unframe(bytes(transport.written))[len(replies) :]

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
