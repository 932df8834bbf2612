"""One query's way through the server: wire in, client placed, reply found or built, wire out.

`Responder.respond` reads top to bottom as that path:

1. **wire in**: `split_query` cuts a plain query into its cache key (the message after the ID,
   without EDNS options) and its EDNS options, without decoding it;
2. **client placed**, only when the answer depends on the client: `Placer` gives the labels of
   the node a PodLocator puts the source (or a trusted Client Subnet address) on;
3. **reply found** in the per-transport `ReplyCache`, or **built**: decoded in full, resolved
   (the pure resolver), encoded, and cached under the key with what it depended on;
4. **wire out**: the query's ID, and the query's own EDNS options spliced into the reply's OPT
   record (so options such as cookies and Client Subnet never defeat the cache).

Names outside the zones take their own branch to the forwarder, which returns a coroutine.
A new snapshot drops only the cached replies that read what it changed (`update`).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from toposdns.resolve.answer import Answer, name_text, type_name
from toposdns.resolve.client import NO_LABELS, Network
from toposdns.resolve.resolver import ResolverConfig, match_zone, resolve
from toposdns.serve.cache import ReplyCache, SerialReply, TopologyReplies
from toposdns.serve.forward import Forwarder, answer_records, build_query
from toposdns.serve.placement import Placer
from toposdns.serve.query_metrics import QueryMetrics, count_hit, labels_of
from toposdns.serve.topology_metrics import TopologyCounts
from toposdns.serve.topology_metrics import count as count_topology
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels
from toposdns.wire.codes import AA, CLASS_IN, NOERROR, RCODE, REFUSED, SERVFAIL, SOA, TC, Name
from toposdns.wire.decode import Dropped, Query, Rejected, decode_plain, decode_query
from toposdns.wire.edns import NO_OPTIONS, EchoedOptions, read_options, splice_options, split_query
from toposdns.wire.encode import (
    FRAGMENT_LIMIT_V4,
    FRAGMENT_LIMIT_V6,
    MAX_TCP_SIZE,
    MIN_UDP_SIZE,
    encode_badvers,
    encode_bare,
    encode_opt,
    encode_rejection,
    encode_reply,
    udp_limit,
)

log = logging.getLogger("toposdns")

#: Distinct EDNS option sets remembered (a forwarder's clients each send their own subnet).
REMEMBERED_OPTIONS = 16_384


@dataclass(frozen=True, slots=True)
class Transport:
    """How a query arrived, which decides the reply's size limits."""

    name: str
    tcp: bool
    fragment_limit: int
    family: int  # 1 IPv4, 2 IPv6, as CoreDNS's metrics label it


UDP4 = Transport("udp4", False, FRAGMENT_LIMIT_V4, 1)
UDP6 = Transport("udp6", False, FRAGMENT_LIMIT_V6, 2)
TCP4 = Transport("tcp4", True, 0, 1)
TCP6 = Transport("tcp6", True, 0, 2)
TRANSPORTS = (UDP4, UDP6, TCP4, TCP6)

#: What answering a query gives: the reply, no reply, or a reply that needs an upstream first.
Reply = bytes | None | Coroutine[Any, Any, bytes | None]


class Responder:
    """Answers raw queries from the current snapshot, and forwards the rest if it may."""

    def __init__(
        self,
        config: ResolverConfig,
        snapshot: Snapshot,
        ecs_trust: tuple[Network, ...] = (),
        forwarder: Forwarder | None = None,
        metrics: QueryMetrics | None = None,
    ) -> None:
        self.config = config
        self.snapshot = snapshot
        self.placer = Placer(ecs_trust)
        self.forwarder = forwarder
        self.metrics = metrics
        self.caches = {kind: ReplyCache() for kind in TRANSPORTS}
        #: Topology-filtered answers by policy and tier (counted with or without --http).
        self.topology_counts = TopologyCounts()
        #: Raw EDNS options -> what the reply echoes of them (most clients repeat theirs).
        self.options: dict[bytes, EchoedOptions] = {b"": NO_OPTIONS}

    def update(self, snapshot: Snapshot) -> None:
        """Serve from a new snapshot, dropping the cached replies it makes stale."""
        previous, self.snapshot = self.snapshot, snapshot
        if snapshot.follows(previous) and snapshot.synced == previous.synced:
            for cache in self.caches.values():
                cache.invalidate(snapshot.changes)
            return
        for cache in self.caches.values():
            cache.clear()
        if self.metrics is not None:
            self.metrics.retire()

    def respond(self, data: bytes, transport: Transport, source: str, started: float = 0) -> Reply:
        """The reply to one query message, None when it gets none, or a coroutine giving it
        when an upstream must be asked first. `started` (perf_counter) times it for metrics."""
        split = split_query(data)
        if split is None:  # not a plain query: decoded in full, never cached
            return self.decoded(data, transport, source, started)
        key, options = split
        echo = self.options.get(options)
        if echo is None:
            try:
                echo = self.remember_options(options)
            except ValueError:  # malformed options: the decoder's FORMERR
                return self.decoded(data, transport, source, started)
        reply = self.found(data, key, options, echo, transport, source)
        if reply is None:
            return self.built(data, key, options, echo, transport, source, started)
        if self.metrics is not None:
            if options:  # sizes differ from the cached reply's: counted in full
                self.counted(data, reply, transport, started, _qtype(key))
            else:
                count_hit(self.metrics, self.metrics.hits_for(transport), key, started)
        return reply

    def found(
        self,
        data: bytes,
        key: bytes,
        options: bytes,
        echo: EchoedOptions,
        transport: Transport,
        source: str,
    ) -> bytes | None:
        """A cached reply to the query, with its ID and OPT record, or None."""
        entry = self.caches[transport].table.get(key)
        if entry is None:
            return None
        via_ecs = False
        if entry.__class__ is bytes:
            reply: bytes = entry
        elif isinstance(entry, SerialReply):
            reply = entry.current(self.snapshot.serial)
        else:
            assert isinstance(entry, TopologyReplies)
            subnet = echo.subnet[0] if echo.subnet is not None else None
            labels, via_ecs = self.placer.place(self.snapshot.locators, source, subnet)
            found = entry.get(labels, self.snapshot.serial)
            if found is None:
                return None
            reply, row = found
            count_topology(row, labels is NO_LABELS)
        if not options:
            return data[:2] + reply
        spliced = data[:2] + splice_options(reply, echo.scoped if via_ecs else echo.plain)
        # Splicing is exact while the reply stays uncompressed and whole; else it is rebuilt.
        return spliced if len(spliced) <= _limit(key, transport) else None

    def built(
        self,
        data: bytes,
        key: bytes,
        options: bytes,
        echo: EchoedOptions,
        transport: Transport,
        source: str,
        started: float,
    ) -> Reply:
        """The reply to a plain query with none cached. What is cached answers the query
        without its EDNS options, and this query's own are spliced in, as on a hit. Anything
        but an answer from the zones (BADVERS, forwarding, another class, a failure) takes the
        decoder's path."""
        try:
            query = decode_plain(data)
        except ValueError:
            return self.decoded(data, transport, source, started)
        if not self.zones_answer(query):
            return self.decoded(data, transport, source, started)
        try:
            subnet = echo.subnet[0] if echo.subnet is not None else None
            labels, via_ecs = self.placer.place(self.snapshot.locators, source, subnet)
            answer = resolve(query.name, query.qtype, self.snapshot, self.config, labels)
            if self.forwarder is not None and (answer.chase or not answer.authoritative):
                # Outside the zones, or ending outside them: the upstream's to answer.
                return self.decoded(data, transport, source, started)
            plain = self.encoded(query, answer, transport, 0)
            row = None
            if answer.policy is not None:
                row = self.topology_counts.row(query.qtype, answer.policy, answer.tier)
                count_topology(row, labels is NO_LABELS)
            self.remember(key, answer, transport, labels, plain, row)
        except Exception:
            return self.decoded(data, transport, source, started)  # it says what failed
        if not options:  # the reply is the cached one: its later hits are counted there
            return self.counted(data, plain, transport, started, query.qtype, key)
        scoped = via_ecs and answer.policy is not None
        reply = data[:2] + splice_options(plain[2:], echo.scoped if scoped else echo.plain)
        if len(reply) > _limit(key, transport):  # compressed or truncated with its options
            whole = decode_query(data)
            scope = whole.ecs.source_prefix if whole.ecs is not None and scoped else 0
            reply = self.encoded(whole, answer, transport, scope)
        return self.counted(data, reply, transport, started, query.qtype)

    def decoded(self, data: bytes, transport: Transport, source: str, started: float) -> Reply:
        """Decode, place, resolve and encode a query in full; nothing is cached. Every query
        that is not plain, or not answered by the zones, comes this way."""
        try:
            query = decode_query(data)
        except Dropped:
            return None
        except Rejected as rejected:
            rejection = encode_rejection(rejected.data, rejected.rcode)
            return self.counted(data, rejection, transport, started, 0)
        qtype = query.qtype
        if query.edns is not None and query.edns.version != 0:
            # Checked by the server before any plugin sees the query, forwarded or not.
            return self.counted(data, encode_badvers(query), transport, started, qtype)
        if self.forwarder is not None and not self.in_zones(query.name):
            forwarded = self.forwarded(data, query, transport)
            return self.counted_later(forwarded, data, transport, started, qtype, "forward")
        if query.qclass != CLASS_IN and self.forwarder is None:
            # CoreDNS refuses other classes unless `forward` is loaded; then the zones answer
            # them with IN records.
            return self.counted(data, encode_bare(query, REFUSED), transport, started, qtype)
        try:
            subnet = query.ecs.address if query.ecs is not None else None
            labels, via_ecs = self.placer.place(self.snapshot.locators, source, subnet)
            answer = resolve(query.name, query.qtype, self.snapshot, self.config, labels)
            # The answer was tailored to the ECS prefix only if it depended on the client.
            scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
            if answer.chase is not None and self.forwarder is not None:
                chased = self.chased(query, answer, transport, scope)
                return self.counted_later(chased, data, transport, started, qtype, "kubernetes")
            reply = self.encoded(query, answer, transport, scope)
            if answer.policy is not None:
                row = self.topology_counts.row(qtype, answer.policy, answer.tier)
                count_topology(row, labels is NO_LABELS)
        except Exception:
            reply = self.failed(query)
        return self.counted(data, reply, transport, started, qtype)

    def zones_answer(self, query: Query) -> bool:
        """False if the server answers a query before the zones do: BADVERS, another class.
        (Names outside the zones are told by the resolver's bare REFUSED.)"""
        return (query.edns is None or query.edns.version == 0) and (
            query.qclass == CLASS_IN or self.forwarder is not None
        )

    def encoded(self, query: Query, answer: Answer, transport: Transport, scope: int) -> bytes:
        """The reply to a decoded query."""
        limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
        return encode_reply(query, answer, limit, transport.fragment_limit, scope)

    def remember(
        self,
        key: bytes,
        answer: Answer,
        transport: Transport,
        labels: Labels,
        plain: bytes,
        row: list[int] | None,
    ) -> None:
        """Cache a reply (`plain`: to the query without its EDNS options) under its key."""
        reply: bytes | SerialReply = plain[2:]
        if answer.authority or any(rr.rtype == SOA for rr in answer.answer):
            reply = SerialReply(plain[2:], self.snapshot.serial)
        cache = self.caches[transport]
        if cache.store(key, reply, answer.policy, labels, answer.depends, row) and self.metrics:
            self.metrics.retire(transport)

    def remember_options(self, options: bytes) -> EchoedOptions:
        """Read a query's EDNS options once; ValueError when malformed."""
        echo = read_options(options)
        if len(self.options) >= REMEMBERED_OPTIONS:
            self.options = {b"": NO_OPTIONS}
        self.options[options] = echo
        return echo

    def counted(
        self,
        data: bytes,
        reply: bytes,
        transport: Transport,
        started: float,
        qtype: int,
        key: bytes = b"",
        plugin: str = "",
    ) -> bytes:
        """Count a query and its reply (when metrics are on). With `key`, the reply is cached
        under the query's exact bytes, and its later hits are counted there."""
        metrics = self.metrics
        if metrics is not None:
            # Replies the zones wrote are the kubernetes plugin's; the server writes the others.
            plugin = plugin or ("kubernetes" if reply[2] & (AA >> 8) else "")
            labels = labels_of(transport.tcp, transport.family, qtype, reply[3] & RCODE, plugin)
            metrics.observe(transport, labels, started, len(data), len(reply), key)
        return reply

    async def counted_later(
        self,
        pending: Coroutine[Any, Any, bytes | None],
        data: bytes,
        transport: Transport,
        started: float,
        qtype: int,
        plugin: str,
    ) -> bytes | None:
        """Count a reply that needed an upstream once it is there."""
        reply = await pending
        if reply is not None:
            self.counted(data, reply, transport, started, qtype, plugin=plugin)
        return reply

    def failed(self, query: Query) -> bytes:
        """SERVFAIL for a bug, with the traceback in the log."""
        log.exception(
            "internal error answering %s %s; replied SERVFAIL",
            name_text(query.name),
            type_name(query.qtype),
        )
        return encode_bare(query, SERVFAIL)

    def in_zones(self, name: Name) -> bool:
        """True if a served zone holds the name."""
        return match_zone(tuple(label.lower() for label in name), self.config.zones) is not None

    async def forwarded(self, data: bytes, query: Query, transport: Transport) -> bytes:
        """A query outside the zones, relayed to an upstream (CoreDNS `forward`)."""
        assert self.forwarder is not None
        try:
            limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
            opt = encode_opt(query.edns) if query.edns is not None else b""
            reply = await self.forwarder.forward(data, transport.tcp, limit, opt)
        except Exception:
            return self.failed(query)
        # An rcode when no upstream gave a usable answer: SERVFAIL, REFUSED or FORMERR.
        return reply if isinstance(reply, bytes) else encode_bare(query, reply)

    async def chased(self, query: Query, answer: Answer, transport: Transport, scope: int) -> bytes:
        """An answer ending in an out-of-zone CNAME, completed with the upstream's answer."""
        assert self.forwarder is not None and answer.chase is not None
        chase = answer.chase
        truncated = False
        try:
            lookup = build_query(chase.target, chase.qtype)
            reply = await self.forwarder.forward(lookup, tcp=False, limit=MAX_TCP_SIZE)
            if isinstance(reply, int):
                # No message at all: CoreDNS drops the CNAME, which leaves NODATA.
                answer = Answer(NOERROR, authority=(chase.soa,), policy=answer.policy)
            else:
                records, truncated = answer_records(reply)
                answer = answer._replace(answer=answer.answer + records, chase=None)
            encoded = self.encoded(query, answer, transport, scope)
        except Exception:
            return self.failed(query)
        if truncated:  # CoreDNS copies the upstream's TC bit
            encoded = encoded[:2] + bytes((encoded[2] | (TC >> 8),)) + encoded[3:]
        return encoded


def _limit(key: bytes, transport: Transport) -> int:
    """The largest reply a plain query with EDNS options may get without being rebuilt: its
    buffer size (read from its key: the OPT record's class field) and, over UDP, the size past
    which replies are compressed."""
    if transport.tcp:
        return MAX_TCP_SIZE
    limit = max(MIN_UDP_SIZE, (key[-6] << 8) | key[-5])
    return min(limit, transport.fragment_limit)


def _qtype(key: bytes) -> int:
    """The qtype of a plain query with EDNS from its key (the OPT's 11 bytes end it, less the
    data length, which the key leaves out)."""
    return (key[-13] << 8) | key[-12]
