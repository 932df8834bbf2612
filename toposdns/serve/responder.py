"""Bytes in, bytes out: decode, place the client, resolve, encode, and the caches around it.

Two caches, both emptied whenever a new snapshot arrives:

- the *wire* cache maps a query's bytes after its ID to the reply's bytes after the ID, one per
  transport (the reply size limits differ). A hit costs one dict lookup and a concatenation.
  Only queries without EDNS options go in, since options such as cookies and Client Subnet
  differ per client. For a topology-filtered name the value is a `TopologyReplies`: one reply
  per client signature, chosen by the querying address's labels.
- the *answer* cache maps (name as asked, qtype) to the resolver's Answer, or, for names whose
  answer depends on the client, to their Policy; those answers are then cached per
  (name, qtype, signature). A signature is the client's values for the policy's label keys, so a
  cluster of thousands of nodes in three zones keeps three answers for a zone policy.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from typing import Any

from cachetools import LRUCache

from toposdns.resolve.answer import (
    NOERROR,
    REFUSED,
    SERVFAIL,
    Answer,
    Name,
    name_text,
    type_name,
)
from toposdns.resolve.client import NO_LABELS, Network, client_address, identify, plain_address
from toposdns.resolve.resolver import ResolverConfig, match_zone, resolve
from toposdns.serve.forward import Forwarder, answer_records, build_query
from toposdns.serve.query_metrics import QueryMetrics, labels_of
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels, Policy
from toposdns.wire.decode import Dropped, Query, Rejected, decode_query
from toposdns.wire.encode import (
    FRAGMENT_LIMIT_V4,
    FRAGMENT_LIMIT_V6,
    MAX_TCP_SIZE,
    encode_badvers,
    encode_bare,
    encode_opt,
    encode_rejection,
    encode_reply,
    udp_limit,
)

log = logging.getLogger("toposdns")

CLASS_IN = 1
WIRE_CACHE_SIZE = 100_000
ANSWER_CACHE_SIZE = 50_000


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


class TopologyReplies:
    """Wire replies to one query whose answer depends on the client, by client signature."""

    __slots__ = ("policy", "replies", "by_labels")

    #: How many label sets each entry remembers directly (more is still answered, just slower).
    REMEMBERED = 256

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.replies: dict[tuple[object, ...], bytes] = {}
        #: id(labels) -> reply. Equal label sets are one interned object (store/convert.py),
        #: alive as long as the snapshot whose cache this is, so the id stays theirs.
        self.by_labels: dict[int, bytes] = {}

    def get(self, labels: Labels) -> bytes | None:
        """The reply for a client with these labels, if one is cached: the hot path."""
        reply = self.by_labels.get(id(labels))
        if reply is None:
            reply = self.replies.get(self.policy.signature(labels))
            if reply is not None and len(self.by_labels) < self.REMEMBERED:
                self.by_labels[id(labels)] = reply
        return reply


WireCache = dict[bytes, bytes | TopologyReplies]


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
        self.ecs_trust = ecs_trust
        self.forwarder = forwarder
        self.metrics = metrics
        #: Per-transport wire caches; frontends hold references, so they are cleared in place.
        self.wire: dict[Transport, WireCache] = {kind: {} for kind in TRANSPORTS}
        self.answers: LRUCache[tuple[Name, int], Answer | Policy] = LRUCache(ANSWER_CACHE_SIZE)
        self.topology_answers: LRUCache[tuple[Name, int, tuple[object, ...]], Answer] = LRUCache(
            ANSWER_CACHE_SIZE
        )

    def update(self, snapshot: Snapshot) -> None:
        """Serve from a new snapshot; every cached reply is dropped."""
        self.snapshot = snapshot
        if self.metrics is not None:
            self.metrics.retire()
        for cache in self.wire.values():
            cache.clear()
        self.answers.clear()
        self.topology_answers.clear()

    def labels_of(self, source: str) -> Labels:
        """The node labels of a querying address (empty when no locator holds it)."""
        locator = self.snapshot.locators.get(source)
        if locator is None and (":" in source and ("%" in source or "." in source)):
            locator = self.snapshot.locators.get(plain_address(source))
        return NO_LABELS if locator is None else locator.node_labels

    def cached(self, data: bytes, transport: Transport, source: str) -> bytes | None:
        """The wire-cache hit for a query, ID patched in, or None: the hot path."""
        hit = self.wire[transport].get(data[2:])
        if hit is None:
            return None
        if isinstance(hit, bytes):
            return data[:2] + hit
        reply = hit.get(self.labels_of(source))
        return None if reply is None else data[:2] + reply

    def respond(self, data: bytes, transport: Transport, source: str, started: float = 0) -> Reply:
        """The reply to one query message, None when it gets none, or a coroutine giving it
        when an upstream must be asked first. `started` (perf_counter) times it for metrics."""
        try:
            query = decode_query(data)
        except Dropped:
            return None
        except Rejected as rejected:
            rejection = encode_rejection(rejected.data, rejected.rcode)
            self.count(data, rejection, transport, 0, "", started)
            return rejection
        try:
            if query.edns is not None and query.edns.version != 0:
                # Checked by the server before any plugin sees the query, forwarded or not.
                badvers = encode_badvers(query)
                self.count(data, badvers, transport, query.qtype, "", started)
                return badvers
            if self.forwarder is not None and not self.in_zones(query.name):
                forwarded = self.forwarded(data, query, transport)
                return self.counted(forwarded, data, transport, query, started, "forward")
            reply, policy, labels = self.reply(query, transport, source)
        except Exception:
            failure = self.failed(query)
            self.count(data, failure, transport, query.qtype, "", started)
            return failure
        if not isinstance(reply, bytes):
            if reply is None:
                return None
            return self.counted(reply, data, transport, query, started, "kubernetes")
        cacheable = query.edns is None or not query.edns.options
        if cacheable:
            self.remember(data, reply, transport, policy, labels)
        self.count(data, reply, transport, query.qtype, "", started, cacheable)
        return reply

    def count(
        self,
        data: bytes,
        reply: bytes,
        transport: Transport,
        qtype: int,
        plugin: str,
        started: float,
        cached: bool = False,
    ) -> None:
        """Count a query and its reply (when metrics are on)."""
        metrics = self.metrics
        if metrics is None:
            return
        rcode = reply[3] & 0x0F
        # Replies the zones wrote are the kubernetes plugin's; the server writes the others.
        plugin = plugin or ("kubernetes" if reply[2] & 0x04 else "")
        labels = labels_of(transport.tcp, transport.family, qtype, rcode, plugin)
        key = data[2:] if cached else b""
        metrics.observe(transport, labels, started, len(data), len(reply), key)

    async def counted(
        self,
        pending: Coroutine[Any, Any, bytes | None],
        data: bytes,
        transport: Transport,
        query: Query,
        started: float,
        plugin: str,
    ) -> bytes | None:
        """Count a reply that needed an upstream once it is there."""
        reply = await pending
        if reply is not None:
            self.count(data, reply, transport, query.qtype, plugin, started)
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
                answer = replace(answer, answer=answer.answer + records, chase=None)
            limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
            encoded = encode_reply(query, answer, limit, transport.fragment_limit, scope)
        except Exception:
            return self.failed(query)
        if truncated:  # CoreDNS copies the upstream's TC bit
            encoded = encoded[:2] + bytes((encoded[2] | 0x02,)) + encoded[3:]
        return encoded

    def remember(
        self, data: bytes, reply: bytes, transport: Transport, policy: Policy | None, labels: Labels
    ) -> None:
        """Put a reply in the wire cache, per client signature when it depends on the client."""
        cache = self.wire[transport]
        if len(cache) >= WIRE_CACHE_SIZE:
            if self.metrics is not None:
                self.metrics.retire(transport)
            cache.clear()  # cheaper than LRU bookkeeping on every hit
        if policy is None:
            cache[data[2:]] = reply[2:]
            return
        entry = cache.get(data[2:])
        if not isinstance(entry, TopologyReplies):
            entry = cache[data[2:]] = TopologyReplies(policy)
        entry.replies[policy.signature(labels)] = reply[2:]

    def reply(
        self, query: Query, transport: Transport, source: str
    ) -> tuple[Reply, Policy | None, Labels]:
        """Encode the reply to a decoded query; also say which policy and labels it used."""
        if query.qclass != CLASS_IN and self.forwarder is None:
            # CoreDNS refuses other classes unless `forward` is loaded; then the zones answer
            # them with IN records.
            return encode_bare(query, REFUSED), None, NO_LABELS
        ecs = query.ecs.address if query.ecs is not None else None
        address, via_ecs = client_address(source, ecs, self.ecs_trust)
        labels = identify(self.snapshot, address, via_ecs).labels
        answer = self.answer(query.name, query.qtype, labels)
        limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
        # The answer was tailored to the ECS prefix only if it depended on the client at all.
        scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
        if answer.chase is not None and self.forwarder is not None:
            return self.chased(query, answer, transport, scope), None, labels
        reply = encode_reply(query, answer, limit, transport.fragment_limit, scope)
        return reply, answer.policy, labels

    def answer(self, name: Name, qtype: int, labels: Labels = NO_LABELS) -> Answer:
        """The resolver's answer for a client with these labels, cached until the next snapshot."""
        key = (name, qtype)
        found = self.answers.get(key)
        if isinstance(found, Answer):
            return found
        if found is not None:
            topology_key = (name, qtype, found.signature(labels))
            answer = self.topology_answers.get(topology_key)
            if answer is None:
                answer = resolve(name, qtype, self.snapshot, self.config, labels)
                self.topology_answers[topology_key] = answer
            return answer
        answer = resolve(name, qtype, self.snapshot, self.config, labels)
        if answer.policy is None:
            self.answers[key] = answer
        else:
            self.answers[key] = answer.policy
            self.topology_answers[(name, qtype, answer.policy.signature(labels))] = answer
        return answer
