"""`--autopath` on the server: walk a placed pod's search path, asking the upstreams for the
names outside the zones, and shape the reply as CoreDNS's `autopath` does (the search path and
the CNAME rule are in resolve/autopath.py).

Only a client that a pod's PodLocator places gets completed answers: the locator gives its
namespace. Node locators and unknown clients get the plain answers. The walk stops at the first
name whose reply is not NXDOMAIN; a failed upstream (or none configured for a name outside the
zones) ends it with SERVFAIL, as a plugin error ends CoreDNS's. For a client outside
`--forward-allow` nothing goes upstream: its walk ends at the first name outside the zones with
the reply to the name it asked, and an ExternalName found on the way is its CNAME alone.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from struct import error as StructError
from struct import pack
from typing import Any, Protocol

import dnslib
from dnslib.buffer import BufferError as PacketError

from toposdns.resolve.answer import Answer
from toposdns.resolve.autopath import (
    AutopathOptions,
    answered_alike,
    candidates,
    completed,
    first_candidate,
    first_other,
    goes_on,
    local_answer,
)
from toposdns.resolve.autopath import walk as walk_names
from toposdns.resolve.resolver import ResolverConfig
from toposdns.serve.chain import Next, Reply, Request, failed
from toposdns.serve.placement import Placer
from toposdns.serve.transport import Transport
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels
from toposdns.store.turns import TurnCounts
from toposdns.wire.codes import AXFR, CLASS_IN, IXFR, NXDOMAIN, OPT, SERVFAIL, Name
from toposdns.wire.decode import Query, question_end, record_spans
from toposdns.wire.encode import MAX_TCP_SIZE, encode_bare, encode_reply, name_wire, udp_limit

#: A completed reply, or one that waits for the upstreams.
Completion = bytes | Coroutine[Any, Any, bytes]


@dataclass(frozen=True, slots=True)
class _Walk:
    """One query's walk along its search path."""

    data: bytes
    query: Query
    transport: Transport
    #: The names to try, in order; the last is the name without the search domain.
    names: tuple[Name, ...]
    labels: Labels
    limit: int
    #: ECS scope of the reply: it depends on the client (its namespace) whenever ECS placed it.
    scope: int
    #: Whether the client's names outside the zones may go upstream (`--forward-allow`).
    admitted: bool


class Relay(Protocol):
    """How the walk asks the upstreams: the server's forwarding."""

    def admits(self, source: str) -> bool:
        """Whether a client's names outside the zones may go upstream (`--forward-allow`)."""

    async def forwarded(self, data: bytes, query: Query, transport: Transport) -> bytes:
        """The upstreams' reply to a query for a name outside the zones."""

    async def chased(self, query: Query, answer: Answer, transport: Transport, scope: int) -> bytes:
        """An answer ending in a CNAME out of the zones, completed upstream."""


class AutoPath:
    """Completes search paths from the snapshot being served and, for the names outside the
    zones, the upstreams (`relay`; None without any). It is the `autopath` handler of the
    kubernetes block's chain: a query it does not complete goes on to the plugins after it."""

    name = "autopath"

    def __init__(
        self,
        options: AutopathOptions,
        config: ResolverConfig,
        serving: Callable[[], Snapshot],
        placer: Placer,
        relay: Relay | None,
        count: Callable[[], None],
        turns: TurnCounts | None = None,
    ) -> None:
        self.options = options
        #: The server's rotations of topology weights: the name a walk finds takes a turn.
        self.turns = turns
        self.config = config
        self.serving = serving
        self.placer = placer
        self.relay = relay
        #: Called for each name found (`coredns_autopath_success_total`).
        self.count = count

    def serve(self, request: Request, next: Next) -> Reply:
        try:
            completion = self.complete(
                request.data, request.query, request.transport, request.source
            )
        except Exception:
            return failed(request.query)
        return next(request) if completion is None else completion

    def complete(
        self, data: bytes, query: Query, transport: Transport, source: str
    ) -> Completion | None:
        """The completed reply to a query, or None when the plain reply is what the client
        gets: the name is not below its first search domain, no pod's PodLocator places it,
        or the name exists as asked."""
        config = self.config
        if query.qtype in (AXFR, IXFR) or query.qclass != CLASS_IN:
            return None
        if first_candidate(query.name, config) is None:
            return None
        subnet = (query.ecs.address, query.ecs.source_prefix) if query.ecs else None
        snapshot = self.serving()
        locator, via_ecs = self.placer.locate(source, subnet)
        if locator is None or locator.is_node:
            return None
        names = candidates(query.name, locator.namespace_of_pod, config, self.options.search)
        if names is None:
            return None
        labels = locator.labels
        first = local_answer(names[0], query.qtype, snapshot, config, labels)
        if first is not None and answered_alike(query.name, names[0], first):
            return None  # the plain reply, which the reply cache may keep for everyone
        limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
        scope = query.ecs.source_prefix if query.ecs is not None and via_ecs else 0
        admitted = self.relay is not None and self.relay.admits(source)
        walk = _Walk(data, query, transport, names, labels, limit, scope, admitted)
        return self.steps(walk, 0)

    def shared(self, query: Query, answer: Answer) -> bool:
        """True when `answer`, the plain one to this query, is also what any placed pod would
        get, so that the reply cache may keep it for every client."""
        first = first_candidate(query.name, self.config)
        return first is None or answered_alike(query.name, first, answer)

    def steps(self, walk: _Walk, start: int, first: bytes | None = None) -> Completion:
        """Try the names from `start` on; `first` is the reply to the first name, which the
        client gets when no name exists."""
        snapshot = self.serving()

        def local(name: Name) -> Answer | None:
            return local_answer(
                name, walk.query.qtype, snapshot, self.config, walk.labels, turns=self.turns
            )

        for index, answer in walk_names(walk.names, start, local):
            name = walk.names[index]
            if answer is None:
                if self.relay is None:
                    return encode_bare(walk.query, SERVFAIL)  # no next plugin: an error
                if not walk.admitted:
                    # Outside --forward-allow: what the name asked gets, nothing asked upstream.
                    assert first is not None  # the first name is in the zones
                    return first
                return self.upstream(self.relay, walk, index, first)
            if not goes_on(answer):
                return self.found(walk, name, answer)
            if first is None:
                first = self.encode(walk.query._replace(name=name), answer, walk)
        assert first is not None  # the first name is the one asked: never skipped
        return first

    def found(self, walk: _Walk, name: Name, answer: Answer) -> Completion:
        """The reply for a name that exists in the zones."""
        self.count()
        if answer.chase is not None and self.relay is not None and walk.admitted:
            return self.chased(self.relay, walk, name, answer)
        return self.encode(walk.query, completed(answer, walk.query.name), walk)

    async def chased(self, relay: Relay, walk: _Walk, name: Name, answer: Answer) -> bytes:
        """An ExternalName found on the way, completed upstream, then led by the CNAME."""
        asked = walk.query._replace(name=name)
        reply = await relay.chased(asked, answer, walk.transport, walk.scope)
        return self.renamed(reply, walk)

    async def upstream(self, relay: Relay, walk: _Walk, index: int, first: bytes | None) -> bytes:
        """Ask the upstreams for one name, then go on with the walk if it does not exist."""
        name = walk.names[index]
        asked = walk.query._replace(name=name)
        reply = await relay.forwarded(renamed_query(walk.data, name), asked, walk.transport)
        if reply[3] & 0x0F != NXDOMAIN:
            self.count()
            return self.renamed(reply, walk)
        rest = self.steps(walk, index + 1, reply if first is None else first)
        return rest if isinstance(rest, bytes) else await rest

    def renamed(self, reply: bytes, walk: _Walk) -> bytes:
        """An encoded reply to a later name as the client gets it; SERVFAIL if it is garbage."""
        try:
            return renamed_reply(reply, walk.query.name, walk.limit)
        except (dnslib.DNSError, PacketError, ValueError, IndexError, StructError, UnicodeError):
            return encode_bare(walk.query, SERVFAIL)

    def encode(self, query: Query, answer: Answer, walk: _Walk) -> bytes:
        return encode_reply(query, answer, walk.limit, walk.transport.fragment_limit, walk.scope)


def renamed_query(data: bytes, name: Name) -> bytes:
    """The client's query with another name in its question, its header and OPT record kept
    (CoreDNS passes the client's message on with only the name changed)."""
    end = question_end(data)
    opt = b"".join(
        data[start:end]
        for start, _, end, rtype, section in record_spans(data)
        if rtype == OPT and section == 2
    )
    header = data[:4] + pack("!4H", 1, 0, 0, 1 if opt else 0)
    return header + name_wire(name) + data[end - 4 : end] + opt


def renamed_reply(reply: bytes, original: Name, limit: int) -> bytes:
    """A reply to a later name as the client that asked `original` gets it (cname.go): the
    question is `original` again, and when a record is named otherwise, a CNAME from `original`
    to that record's owner leads the answer. A reply that grows past `limit` goes out without
    its records, TC set, for the client to ask again over TCP."""
    message = dnslib.DNSRecord.parse(reply)
    owner = dnslib.DNSLabel([label.encode("latin-1") for label in original])
    at = first_other((_labels(rr.rname) for rr in message.rr), original)
    if at is not None:
        target = message.rr[at]
        cname = dnslib.CNAME(target.rname)
        message.rr.insert(0, dnslib.RR(owner, dnslib.QTYPE.CNAME, ttl=target.ttl, rdata=cname))
    message.q.qname = owner
    packed = bytes(message.pack())
    if len(packed) <= limit:
        return packed
    message.header.tc = 1
    message.rr, message.auth = [], []
    message.ar = [rr for rr in message.ar if rr.rtype == OPT]
    return bytes(message.pack())


def _labels(name: dnslib.DNSLabel) -> Name:
    return tuple(label.decode("latin-1") for label in name.label)
