"""CoreDNS's `kubernetes` as a handler of the kubernetes server block's chain.

It answers the names of its zones from the snapshot being served (resolve/resolver.py, the
pure resolver; its options are `ResolverConfig`, `KUBERNETES` in that module, which `explain`
reads too), for the client placed by its PodLocator. It passes a query on (to `forward`) when
the name is in none of its zones, or when the answer falls through (`fallthrough`, with
upstreams); an answer that ends in a CNAME out of the zones (an ExternalName) is completed with
the upstreams' answer to its target, as CoreDNS's upstream lookup completes it.

The reply cache in front of the chain (serve/responder.py) keeps the answers that can serve
every client alike; on a miss, a query that the plugins before this one pass on unchanged is
answered by the responder's cache-filling path (`fill`), which records what the answer read.
`route` is the first step of every query, the server's and this plugin's.
"""

from __future__ import annotations

from collections.abc import Callable

from toposdns.resolve.answer import Answer
from toposdns.resolve.client import NO_LABELS
from toposdns.resolve.resolver import ResolverConfig, match_zone, resolve
from toposdns.serve.chain import Next, Reply, Request, failed
from toposdns.serve.forward import Forwarder, answer_records, build_query
from toposdns.serve.placement import Placer
from toposdns.serve.transport import Transport
from toposdns.store.snapshot import Snapshot
from toposdns.store.turns import TurnCounts
from toposdns.wire.codes import CLASS_IN, NOERROR, REFUSED, TC, Name
from toposdns.wire.decode import Query
from toposdns.wire.encode import (
    MAX_TCP_SIZE,
    encode_badvers,
    encode_bare,
    encode_opt,
    encode_reply,
    udp_limit,
)

#: Where a query goes first (`route`).
BADVERS = "BADVERS"
UPSTREAMS = "upstreams"
REFUSE = "REFUSED"
ZONES = "zones"


def route(query: Query, zones: tuple[Name, ...], forwarding: bool) -> str:
    """The first step of every query, in the order CoreDNS takes it: an EDNS version other than
    0 gets BADVERS before anything looks at it (the server checks it, forwarded or not); a name
    in no zone goes to the upstreams when there are some; another class than IN is refused
    unless `forward` is loaded (then the zones answer it with IN records); the rest is the
    zones'. In the zones, --autopath may complete the name, and --fallthrough may send it
    upstream after all (`Kubernetes.serve`)."""
    if query.edns is not None and query.edns.version != 0:
        return BADVERS
    if forwarding and not in_zones(query.name, zones):
        return UPSTREAMS
    if query.qclass != CLASS_IN and not forwarding:
        return REFUSE
    return ZONES


def in_zones(name: Name, zones: tuple[Name, ...]) -> bool:
    """True if one of the zones holds the name."""
    return match_zone(tuple(label.lower() for label in name), zones) is not None


#: Counts a topology-filtered answer (the responder's rows): the query type, the answer, and
#: whether no locator placed the client.
CountTopology = Callable[[int, Answer, bool], None]


class Kubernetes:
    """The `kubernetes` handler: the zones' answers from the snapshot being served (`serving`),
    for the client `placer` places; `forwarder` (None without upstreams) gets what falls through
    and completes CNAMEs out of the zones. It is also the relay autopath asks the upstreams by
    (serve/autopath.py `Relay`)."""

    name = "kubernetes"

    def __init__(
        self,
        config: ResolverConfig,
        serving: Callable[[], Snapshot],
        placer: Placer,
        forwarder: Forwarder | None,
        count: CountTopology,
        turns: TurnCounts | None = None,
    ) -> None:
        self.config = config
        self.serving = serving
        self.placer = placer
        self.forwarder = forwarder
        self.count = count
        #: The server's rotations of topology weights (store/topology.py `TurnCounts`): an
        #: answer here takes its turn, as a reply from the cache does.
        self.turns = turns
        #: The responder's cache-filling path, when plugins run before this one: the cached
        #: reply to a query as asked that they passed on unchanged; None when it has none.
        self.fill: Callable[[Request], bytes | None] | None = None

    def serve(self, request: Request, next: Next) -> Reply:
        query = request.query
        where = route(query, self.config.zones, self.forwarder is not None)
        if where is BADVERS:
            return encode_badvers(query)
        if where is REFUSE:
            return encode_bare(query, REFUSED)
        if where is UPSTREAMS:
            return next(request)
        if self.fill is not None:
            filled = self.fill(request)
            if filled is not None:
                return filled
        try:
            subnet = (query.ecs.address, query.ecs.source_prefix) if query.ecs else None
            labels, via_ecs = self.placer.place(request.source, subnet)
            # Never cached: no more records than this reply can hold.
            answer = resolve(
                query.name, query.qtype, self.serving(), self.config, labels,
                limit=request.limit, turns=self.turns,
            )  # fmt: skip
            if answer.fallthrough and self.forwarder is not None:
                return next(request)
            # The answer was tailored to the ECS prefix only if it depended on the client.
            scope = query.ecs.source_prefix if query.ecs and via_ecs and answer.policy else 0
            if answer.chase is not None and self.admits(request.source):
                # Outside --forward-allow the CNAME stands alone, as CoreDNS's upstream lookup
                # would leave it with an acl block refusing the target to this client.
                return self.chased(query, answer, request.transport, scope)
            reply = encoded(query, answer, request.transport, scope)
            if answer.policy is not None:
                self.count(query.qtype, answer, labels is NO_LABELS)
            return reply
        except Exception:
            return failed(query)

    def admits(self, source: str) -> bool:
        """Whether names outside the zones may go upstream for this client: there are
        upstreams, and it is inside `--forward-allow`."""
        return self.forwarder is not None and self.forwarder.admits(source)

    async def forwarded(self, data: bytes, query: Query, transport: Transport) -> bytes:
        """A query for a name outside the zones, relayed to an upstream (autopath's walk)."""
        assert self.forwarder is not None
        try:
            limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
            opt = encode_opt(query.edns) if query.edns is not None else b""
            reply = await self.forwarder.forward(data, transport.tcp, limit, opt)
        except Exception:
            return failed(query)
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
            reply = encoded(query, answer, transport, scope)
        except Exception:
            return failed(query)
        if truncated:  # CoreDNS copies the upstream's TC bit
            reply = reply[:2] + bytes((reply[2] | (TC >> 8),)) + reply[3:]
        return reply


def encoded(query: Query, answer: Answer, transport: Transport, scope: int) -> bytes:
    """The reply to a decoded query (its buffer bounded already)."""
    limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
    return encode_reply(query, answer, limit, transport.fragment_limit, scope)


def make_kubernetes(
    config: ResolverConfig,
    serving: Callable[[], Snapshot],
    placer: Placer,
    forwarder: Forwarder | None,
    count: CountTopology,
    turns: TurnCounts | None = None,
) -> Kubernetes:
    """The kubernetes block's `kubernetes` handler."""
    return Kubernetes(config, serving, placer, forwarder, count, turns)
