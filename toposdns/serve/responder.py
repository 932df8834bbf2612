"""One query's way through the server: wire in, client placed, reply found or built, wire out.

`Responder.respond` reads top to bottom as that path:

1. **wire in**: `split_query` cuts a plain query into its cache key (the message after the ID,
   without EDNS options) and its EDNS options, without decoding it;
2. **client placed**, only when the answer depends on the client: `Placer` gives the labels of
   the node a PodLocator puts the source (or a trusted Client Subnet address) on;
3. **reply found** in the per-transport `ReplyCache` (`found`), or **built** (`built`): from a
   template when the name certainly does not exist (`negative`, serve/negative.py), else
   decoded as far as its cached reply needs, resolved by the pure resolver and encoded
   (`made`); either way cached under the key with what its answer read;
4. **wire out**: the query's ID, and the query's own EDNS options spliced into the reply's OPT
   record (so options such as cookies and Client Subnet never defeat the cache).

Everything else takes `decoded`, the full decoder's path, never cached: messages that are not
plain queries, BADVERS, other classes, failures, and names for an upstream, which branch off
to the forwarder (a coroutine). A new snapshot drops only the cached replies that read what it
changed (`update`).
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from toposdns.metrics import AUTOPATH_SUCCESS, PANICS
from toposdns.resolve.answer import Answer, name_text, type_name
from toposdns.resolve.autopath import NO_AUTOPATH, AutopathOptions
from toposdns.resolve.client import NO_LABELS, Trust
from toposdns.resolve.resolver import ResolverConfig, match_zone, resolve
from toposdns.serve.autopath import AutoPath, Completion
from toposdns.serve.cache import Orderings, ReplyCache, SerialReply, TopologyReplies
from toposdns.serve.forward import Forwarder, answer_records, build_query
from toposdns.serve.negative import Negatives
from toposdns.serve.placement import Placer
from toposdns.serve.query_metrics import QueryMetrics, count_hit, labels_of
from toposdns.serve.topology_metrics import TopologyCounts
from toposdns.serve.topology_metrics import count as count_topology
from toposdns.serve.transport import TCP4 as TCP4
from toposdns.serve.transport import TCP6 as TCP6
from toposdns.serve.transport import TRANSPORTS
from toposdns.serve.transport import UDP4 as UDP4
from toposdns.serve.transport import UDP6 as UDP6
from toposdns.serve.transport import Transport as Transport
from toposdns.store.snapshot import Dependency, Snapshot
from toposdns.store.topology import Labels, Policy
from toposdns.wire.codes import AA, CLASS_IN, NOERROR, RCODE, REFUSED, SERVFAIL, SOA, TC, Name
from toposdns.wire.decode import Dropped, Query, Rejected, decode_plain, decode_query
from toposdns.wire.edns import (
    NO_OPTIONS,
    EchoedOptions,
    question_end,
    read_options,
    splice_options,
    split_query,
)
from toposdns.wire.encode import (
    MAX_TCP_SIZE,
    MIN_UDP_SIZE,
    encode_badvers,
    encode_bare,
    encode_opt,
    encode_rejection,
    encode_reply,
    udp_limit,
)
from toposdns.wire.shuffle import shuffle_reply

log = logging.getLogger("toposdns")

#: Distinct EDNS option sets remembered (a forwarder's clients each send their own subnet).
REMEMBERED_OPTIONS = 16_384


#: What answering a query gives: the reply, no reply, or a reply that needs an upstream first.
Reply = bytes | None | Coroutine[Any, Any, bytes | None]


class Responder:
    """Answers raw queries from the current snapshot, and forwards the rest if it may."""

    def __init__(
        self,
        config: ResolverConfig,
        snapshot: Snapshot,
        ecs_trust: tuple[Trust, ...] = (),
        forwarder: Forwarder | None = None,
        metrics: QueryMetrics | None = None,
        loadbalance: bool = False,
        autopath: AutopathOptions = NO_AUTOPATH,
    ) -> None:
        self.config = config
        self.snapshot = snapshot
        self.placer = Placer(ecs_trust, snapshot)
        self.forwarder = forwarder
        self.metrics = metrics
        #: `--loadbalance`: vary the order of address records (CoreDNS `loadbalance`).
        self.loadbalance = loadbalance
        self.autopath = (
            AutoPath(
                autopath,
                config,
                lambda: self.snapshot,
                self.placer,
                self if forwarder is not None else None,
                self.count_autopath,
            )
            if autopath.enabled
            else None
        )
        #: NXDOMAIN from templates; not with autopath, which completes names that do not exist.
        self.negatives = None if autopath.enabled else Negatives(config)
        self.caches = {kind: ReplyCache() for kind in TRANSPORTS}
        #: Topology-filtered answers by policy and tier (counted with or without --http).
        self.topology_counts = TopologyCounts()
        #: Raw EDNS options -> what the reply echoes of them (most clients repeat theirs).
        self.options: dict[bytes, EchoedOptions] = {b"": NO_OPTIONS}

    def update(self, snapshot: Snapshot) -> None:
        """Serve from a new snapshot, dropping the cached replies it makes stale."""
        previous, self.snapshot = self.snapshot, snapshot
        self.placer.update(snapshot)
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
                self.counted(data, reply, transport, started, _qtype(data, key))
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
        elif not isinstance(entry, TopologyReplies):
            reply = entry.current(self.snapshot.serial)  # type: ignore[union-attr]
        else:
            labels, via_ecs = self.placer.place(source, echo.subnet)
            found = entry.get(labels, self.snapshot.serial)
            if found is None:
                return None
            reply, row = found
            count_topology(row, labels is NO_LABELS)
        if not options:
            return data[:2] + reply
        spliced = data[:2] + splice_options(reply, echo.scoped if via_ecs else echo.plain)
        # Splicing is exact while the reply stays uncompressed and whole; else it is rebuilt.
        return spliced if len(spliced) <= _limit(data, key, transport) else None

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
        made = self.negative(data, key, transport) or self.made(data, key, echo, transport, source)
        if made is None:
            return self.decoded(data, transport, source, started)
        reply, qtype, scoped = made
        if not options:  # the reply is the cached one: its later hits are counted there
            return self.counted(data, reply, transport, started, qtype, key)
        spliced = data[:2] + splice_options(reply[2:], echo.scoped if scoped else echo.plain)
        if len(spliced) > _limit(data, key, transport):  # would be compressed or truncated
            return self.decoded(data, transport, source, started)
        return self.counted(data, spliced, transport, started, qtype)

    def negative(
        self, data: bytes, key: bytes, transport: Transport
    ) -> tuple[bytes, int, bool] | None:
        """NXDOMAIN from templates, for names that certainly do not exist (serve/negative.py),
        cached as any reply is; None when only the resolver can tell."""
        if self.negatives is None:
            return None
        found = self.negatives.reply(data, key, self.snapshot, _limit(data, key, transport))
        if found is None:
            return None
        reply, qtype, depends = found
        self.remember(key, transport, reply, depends, serial=True)
        return reply, qtype, False

    def made(
        self, data: bytes, key: bytes, echo: EchoedOptions, transport: Transport, source: str
    ) -> tuple[bytes, int, bool] | None:
        """(reply, qtype, whether it depends on the Client Subnet) for a plain query, made by
        the resolver and cached; None for the decoder's path."""
        try:
            query = decode_plain(data)
        except ValueError:
            return None
        if not self.zones_answer(query):
            return None
        try:
            labels, via_ecs = self.placer.place(source, echo.subnet)
            answer = resolve(query.name, query.qtype, self.snapshot, self.config, labels)
            if self.forwarder is not None and (answer.chase or not answer.authoritative):
                # Outside the zones, ending outside them, or falling through (--fallthrough):
                # the upstream's to answer.
                return None
            if self.autopath is not None and not self.autopath.shared(query, answer):
                # A pod of the namespace the name names gets another reply: never cached.
                return None
            plain = self.encoded(query, answer, transport, 0)
            row = None
            if answer.policy is not None:
                row = self.topology_counts.row(query.qtype, answer.policy, answer.tier)
                count_topology(row, labels is NO_LABELS)
            serial = bool(answer.authority) or any(rr.rtype == SOA for rr in answer.answer)
            first = self.remember(
                key, transport, plain, answer.depends, serial, answer.policy, labels, row
            )
        except Exception:
            return None  # the decoder's path says what failed
        return data[:2] + first, query.qtype, via_ecs and answer.policy is not None

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
            if self.autopath is not None:
                completion = self.autopath.complete(data, query, transport, source)
                if completion is not None:
                    return self.completed(completion, data, transport, started, qtype)
            subnet = (query.ecs.address, query.ecs.source_prefix) if query.ecs else None
            labels, via_ecs = self.placer.place(source, subnet)
            answer = resolve(query.name, query.qtype, self.snapshot, self.config, labels)
            if answer.fallthrough and self.forwarder is not None:
                forwarded = self.forwarded(data, query, transport)
                return self.counted_later(forwarded, data, transport, started, qtype, "forward")
            # The answer was tailored to the ECS prefix only if it depended on the client.
            scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
            if answer.chase is not None and self.forwarder is not None:
                chased = self.chased(query, answer, transport, scope)
                return self.counted_later(chased, data, transport, started, qtype, "kubernetes")
            reply = self.balanced(self.encoded(query, answer, transport, scope))
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
        transport: Transport,
        plain: bytes,
        depends: frozenset[Dependency],
        serial: bool = False,
        policy: Policy | None = None,
        labels: Labels = NO_LABELS,
        row: list[int] | None = None,
    ) -> bytes:
        """Cache a reply (`plain`: to the query without its EDNS options, carrying the SOA
        serial if `serial`) under its key; return what the query gets of it, after the ID
        (with `--loadbalance`, an ordering)."""
        reply: bytes | SerialReply | Orderings = plain[2:]
        first = plain[2:]
        if serial:
            reply = SerialReply(first, self.snapshot.serial)
        elif self.loadbalance:
            orderings = Orderings.of(first)
            if orderings is not None:
                reply, first = orderings, orderings.current()
        if self.caches[transport].store(key, reply, policy, labels, depends, row) and self.metrics:
            self.metrics.retire(transport)
        return first

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
            reply = self.balanced(reply)
            self.counted(data, reply, transport, started, qtype, plugin=plugin)
        return reply

    def completed(
        self, completion: Completion, data: bytes, transport: Transport, started: float, qtype: int
    ) -> Reply:
        """An --autopath reply, counted (and with --loadbalance reordered) when it is there."""
        if isinstance(completion, bytes):
            reply = self.balanced(completion)
            return self.counted(data, reply, transport, started, qtype, plugin="autopath")
        return self.counted_later(completion, data, transport, started, qtype, "autopath")

    def balanced(self, reply: bytes) -> bytes:
        """The reply in a new order with `--loadbalance` (for replies that are never cached)."""
        return (shuffle_reply(reply) or reply) if self.loadbalance else reply

    def failed(self, query: Query) -> bytes:
        """SERVFAIL for a bug, with the traceback in the log."""
        PANICS.inc()
        log.exception(
            "internal error answering %s %s; replied SERVFAIL",
            name_text(query.name),
            type_name(query.qtype),
        )
        return encode_bare(query, SERVFAIL)

    def count_autopath(self) -> None:
        """A name autopath found (`coredns_autopath_success_total`, with metrics on)."""
        if self.metrics is not None:
            AUTOPATH_SUCCESS.labels(self.metrics.server).inc()

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


def _limit(data: bytes, key: bytes, transport: Transport) -> int:
    """The largest uncompressed, whole reply a plain query may get: its buffer size (read from
    its key, which ends with its OPT record's class and TTL fields, if it has one) and, over
    UDP, the size past which replies are compressed."""
    if transport.tcp:
        return MAX_TCP_SIZE
    size = max(MIN_UDP_SIZE, (key[-6] << 8) | key[-5]) if data[11] else MIN_UDP_SIZE
    return min(size, transport.fragment_limit)


def _qtype(data: bytes, key: bytes) -> int:
    """The qtype of a plain query, for its metrics labels."""
    end = question_end(data, key)
    return (data[end - 4] << 8) | data[end - 3]
