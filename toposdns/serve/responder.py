"""One query's way through the server: wire in, client placed, reply found or built, wire out.

`Responder.respond` reads top to bottom as that path:

1. **wire in**: `split_query` cuts a plain query into its cache key (the message after the ID,
   its name in lower case, without the EDNS buffer size and options) and its EDNS options,
   without decoding it;
2. **client placed**, only when the answer depends on the client: `Placer` gives the labels of
   the node a PodLocator puts the source (or a trusted Client Subnet address) on;
3. **reply found** in the `ReplyCache` (`found`; a query that got a reply from it before, the
   same bytes but the ID, gets that reply again at once: `replayed`), or **built** (`built`):
   from a template when the name certainly does not exist or is a pod name (`negative`,
   serve/negative.py; cached the second time it is asked), else decoded as far as its cached
   reply needs, resolved by the pure resolver and encoded (`made`), and cached, whole, under
   the key with what its answer read;
4. **wire out** (`rendered`): the query's ID, its own OPT record (buffer size and the options
   it echoes, so cookies and Client Subnet never defeat the cache), the reply cut to its size
   limit (wire/encode.py `fit`). A query in another letter case than the cached reply's gets
   it with its own letters wherever the reply copies the name asked (`recasing`: wire/case.py,
   found once, from the reply to the name in the other case), compressed as its names compress;
   a name whose answer depends on its case (a zone's apex, `ns.dns`) is built anew.

Everything else takes `decoded`, the full decoder's path: messages that are not plain queries,
BADVERS, other classes, failures, names for an upstream, and every miss when the kubernetes
block has plugins before `kubernetes` (rewrite, template, hosts). It decodes the query, finds
its server block (serve/blocks.py) and runs it down that block's chain (serve/chain.py), the
kubernetes block's too (`chain`: any, loadbalance, rewrite, autopath, template, hosts,
kubernetes, forward, as the block has them, in CoreDNS's order), and counts the reply once, at
the head, under the plugin that wrote it. Nothing it answers is cached, but a miss that the
plugins before `kubernetes` pass on unchanged: the kubernetes handler gets that one from the
cache-filling path (`fill`, which is `made`). A new snapshot drops only the cached replies
that read what it changed (`update`). Buffer sizes are bounded by `--max-udp-size` first, as
CoreDNS's `bufsize` bounds them."""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, Literal

from toposdns.metrics import AUTOPATH_SUCCESS
from toposdns.resolve.answer import Answer
from toposdns.resolve.autopath import NO_AUTOPATH, AutopathOptions
from toposdns.resolve.client import NO_LABELS, Trust
from toposdns.resolve.resolver import ResolverConfig, case_insensitive, resolve
from toposdns.serve.any import Any as AnyHandler
from toposdns.serve.autopath import AutoPath
from toposdns.serve.blocks import Blocks
from toposdns.serve.cache import (
    DEFAULT_MAX_BYTES,
    NAMES_SHARE,
    TURNS_OVERHEAD,
    Cached,
    Entry,
    Rendered,
    ReplyCache,
    TopologyReplies,
    Turns,
)
from toposdns.serve.chain import ORDER, Handler, Next, Reply, Request, chain
from toposdns.serve.forward import Forwarder, Forwarding
from toposdns.serve.forward_cache import DEFAULT_CACHE, CacheSettings
from toposdns.serve.kubernetes import BADVERS, REFUSE, ZONES, Kubernetes, route
from toposdns.serve.loadbalance import LoadBalance
from toposdns.serve.negative import Negatives
from toposdns.serve.placement import Placer
from toposdns.serve.query_metrics import (
    DENIAL,
    DROPPED,
    SUCCESS,
    UNCACHED,
    ZONE,
    Hits,
    QueryMetrics,
    count_hit,
    labels_of,
)
from toposdns.serve.topology_metrics import TopologyCounts
from toposdns.serve.topology_metrics import count as count_topology
from toposdns.serve.transport import TCP4 as TCP4
from toposdns.serve.transport import TCP6 as TCP6
from toposdns.serve.transport import TRANSPORTS
from toposdns.serve.transport import UDP4 as UDP4
from toposdns.serve.transport import UDP6 as UDP6
from toposdns.serve.transport import Transport as Transport
from toposdns.store.snapshot import Dependency, Snapshot
from toposdns.store.topology import Labels
from toposdns.store.turns import TurnCounts
from toposdns.wire.case import (
    NOT_RECASED,
    Recasing,
    Runs,
    case_runs,
    compress,
    label_facts,
    packed,
    recase,
    rotation_runs,
)
from toposdns.wire.codes import (
    AA,
    DO,
    NOERROR,
    NOTIMP,
    NXDOMAIN,
    RCODE,
    REFUSED,
    SERVFAIL,
    SOA,
)
from toposdns.wire.decode import (
    HEADER_SIZE,
    Dropped,
    Query,
    Rejected,
    decode_plain,
    decode_query,
    dnssec_ok,
    read_name,
)
from toposdns.wire.edns import (
    NO_OPTIONS,
    EchoedOptions,
    buffer_size,
    plain_question_end,
    read_options,
    reply_opt,
    split_query,
)
from toposdns.wire.encode import (
    MAX_TCP_SIZE,
    MAX_UDP_SIZE,
    MIN_UDP_SIZE,
    bound_buffer,
    encode_badvers,
    encode_bare,
    encode_forms,
    encode_rejection,
    fit,
)
from toposdns.wire.records import name_text
from toposdns.wire.shuffle import Rotation

#: Replies larger than this are cached compressed too, for the queries they do not fit whole
#: (the smallest limit, 512 bytes, less room for a query's EDNS options).
COMPRESS_OVER = MIN_UDP_SIZE - 100


#: The plugins whose replies count as a query that passed the `cache` plugin's place in the
#: kubernetes block (a miss of CoreDNS's cache), as they always have here: `any`, the `acl` of
#: `--forward-allow` and the server's own refusals answer before it, and the replies of
#: template and hosts are not counted by the `cache` metrics.
PASSING = frozenset({"kubernetes", "autopath", "forward"})

#: The rcodes CoreDNS's cache keeps as denials (NXDOMAIN, NODATA is NOERROR, SERVFAIL, NOTIMP).
DENIALS = frozenset({NOERROR, NXDOMAIN, SERVFAIL, NOTIMP})


class Responder:
    """Answers raw queries: from the reply cache and its fast paths when it can, else down the
    server block's chain (the kubernetes block's: `chain`)."""

    def __init__(
        self,
        config: ResolverConfig,
        snapshot: Snapshot,
        ecs_trust: tuple[Trust, ...] = (),
        forwarder: Forwarder | None = None,
        metrics: QueryMetrics | None = None,
        loadbalance: bool = False,
        autopath: AutopathOptions = NO_AUTOPATH,
        cache_max_bytes: int = DEFAULT_MAX_BYTES,
        max_udp_size: int = MAX_UDP_SIZE,
        forward_any: bool = False,
        cache: CacheSettings = DEFAULT_CACHE,
        blocks: Blocks | None = None,
        plugins: Sequence[Handler] = (),
    ) -> None:
        self.config = config
        #: The handlers of the kubernetes block's plugins that the server makes (rewrite,
        #: template, hosts, and the `cache` that caps their replies), for its chain (`chain`).
        self.plugins = tuple(plugins)
        #: The server blocks of the port, when there are others than this one's `.`: a query
        #: of another block's zone goes down that block's chain (serve/blocks.py).
        self.blocks = blocks
        self.snapshot = snapshot
        self.placer = Placer(ecs_trust, snapshot)
        self.forwarder = forwarder
        self.metrics = metrics
        #: `--loadbalance`: vary the order of address records (CoreDNS `loadbalance`).
        self.loadbalance = loadbalance
        #: Where each rotation of topology weights stands, shared by the cache and the
        #: resolver's path (store/topology.py `TurnCounts`).
        self.turns = TurnCounts()
        #: `--max-udp-size`: the largest UDP reply, whatever buffer a client announces.
        self.max_udp_size = max_udp_size
        #: The `cache` plugin's settings: which replies it would keep, for its metrics.
        self.cache_settings = cache
        #: Topology-filtered answers by policy and tier (counted with or without --http).
        self.topology_counts = TopologyCounts()
        self.kubernetes = Kubernetes(
            config, lambda: self.snapshot, self.placer, forwarder, self.count_answer, self.turns
        )
        self.autopath = (
            AutoPath(
                autopath,
                config,
                lambda: self.snapshot,
                self.placer,
                self.kubernetes if forwarder is not None else None,
                self.count_autopath,
                self.turns,
            )
            if autopath.enabled
            else None
        )
        #: The miss being answered down the chain, whose reply the cache-filling path may
        #: make (`fill`), while the chain runs; None otherwise.
        self.miss: Miss | None = None
        if self.plugins:  # a query they pass on unchanged is still made and cached
            self.kubernetes.fill = self.fill
        #: The kubernetes block's handlers, in CoreDNS's order, and their chain (serve/chain.py):
        #: what answers a query the reply cache does not (`decoded`).
        self.handlers: list[Handler] = []
        self.chain = self.linked(forward_any)
        #: NXDOMAIN from templates; not with autopath, which completes names that do not exist,
        #: nor when a name of the zones may be another server block's or none's, nor when
        #: plugins run before `kubernetes`. Their memory of endpoint names takes a share of the
        #: cache's bound.
        shared = blocks is not None and not blocks.holds_whole(config.zones)
        names = cache_max_bytes // NAMES_SHARE
        templated = not (autopath.enabled or shared or self.plugins)
        self.negatives = Negatives(config, names) if templated else None
        #: The reply cache, one for every transport: replies are cut per query.
        self.cache = ReplyCache(cache_max_bytes, 0 if self.negatives is None else names)

    def linked(self, forward_any: bool) -> Next:
        """The kubernetes block's chain: the server's plugins (`plugins`) with `any`,
        `loadbalance`, `autopath`, `kubernetes` and `forward` as this block has them, linked in
        CoreDNS's order."""
        handlers: list[Handler] = [*self.plugins, self.kubernetes]
        if self.autopath is not None:
            handlers.append(self.autopath)
        if self.loadbalance:
            handlers.append(LoadBalance())
        if self.forwarder is not None:
            metrics = self.metrics
            hits = None if metrics is None else metrics.forward_hits
            handlers.append(Forwarding(self.forwarder, hits))
            if not forward_any:
                handlers.append(AnyHandler())
        handlers.sort(key=lambda handler: ORDER.index(handler.name))
        self.handlers = handlers
        return chain(handlers)

    def clear(self) -> None:
        """Drop every cached reply: a plugin before the kubernetes block's own (a hosts file
        read again) may now answer a name whose reply the cache holds."""
        self.cache.clear()

    def update(self, snapshot: Snapshot) -> None:
        """Serve from a new snapshot, dropping the cached replies it makes stale."""
        previous, self.snapshot = self.snapshot, snapshot
        self.placer.update(snapshot)
        changed = snapshot.changed_since(previous)
        if changed is not None and snapshot.synced == previous.synced:
            self.cache.invalidate(changed)
            # Serials, placements and what the dropped entries said may all have moved.
            self.cache.forget_rendered()
        else:
            self.cache.clear()

    def respond(self, data: bytes, transport: Transport, source: str, started: float = 0) -> Reply:
        """The reply to one query message, None when it gets none, or a coroutine giving it
        when an upstream must be asked first. `started` (perf_counter) times it for metrics."""
        rendered = self.cache.renders[transport.slot].get(data[2:])
        if rendered is not None and (rendered.source is None or rendered.source == source):
            return self.replayed(rendered, data, started)
        if len(data) > 16 and not data[11]:
            # Without OPT record: its key, if it is a plain query (wire/edns.py `plain_key`;
            # only a plain query lowers to a plain query's key), is cached in another case.
            key = data[2:-4].lower() + data[-4:]
            if key in self.cache.table:
                return self.answered(data, key, NO_OPTIONS, transport, source, started)
            if self.negatives is not None:
                first = self.first_time(data, transport, source, started)
                if first is not False:
                    return first
        split = split_query(data)
        if split is None:  # not a plain query: decoded in full, never cached
            return self.decoded(data, transport, source, started)
        key, options = split
        echo = self.cache.options.get(options)
        if echo is None:
            try:
                echo = read_options(options)
            except ValueError:  # malformed options: the decoder's FORMERR
                return self.decoded(data, transport, source, started)
            self.cache.remember_options(options, echo)
        return self.answered(data, key, echo, transport, source, started)

    def answered(
        self,
        data: bytes,
        key: bytes,
        echo: EchoedOptions,
        transport: Transport,
        source: str,
        started: float,
    ) -> Reply:
        """The reply to a plain query: found in the cache, else built."""
        reply = self.found(data, key, echo, transport, source, started)
        if reply is None:
            self.cache.misses += 1
            return self.built(data, key, echo, transport, source, started)
        self.cache.hits += 1
        return reply

    def found(
        self,
        data: bytes,
        key: bytes,
        echo: EchoedOptions,
        transport: Transport,
        source: str,
        started: float,
    ) -> bytes | None:
        """A cached reply to the query, with its ID and OPT record, counted; or None."""
        entry = self.cache.table.get(key)
        if entry is None:
            return None
        via_ecs = False
        row = None
        labels = NO_LABELS
        if entry.__class__ is TopologyReplies:
            labels, via_ecs = self.placer.place(source, echo.subnet)
            found = self.cache.choose(entry, labels)
            if found is None:
                return None
            cached, row = found, found.row
        else:
            cached = entry  # type: ignore[assignment]
        question_end = plain_question_end(data, key)
        name = None
        case = None
        held = 0
        if cached.question != data[12:question_end]:
            # Asked in another letter case: the reply is written with the query's letters.
            if cached.case is None:
                self.recasing(data, key, echo, source, entry, cached)
            case = cached.case
            if case is None or case is NOT_RECASED:
                return None  # its names are written anew
            name = data[12 : question_end - 4]
            held = case.size
        turns = cached.turns
        if turns is not None:  # topology weights: this turn's reply, taken once it is served
            cached = turns.peek()
            row = cached.row
        options = echo.scoped if via_ecs else echo.plain
        reply = self.rendered(data, key, cached, options, transport, name)
        if case is not None and case.size != held:  # a compressed form kept, or let go
            self.cache.grow(entry, cached, case.size - held)
        if reply is None:
            return None
        if turns is not None:
            turns.next()
        hits = None if cached.hits is None else cached.hits[transport.slot]
        whole = hits is not None and (len(data), len(reply)) == (hits.query_size, hits.reply_size)
        replay = Rendered(
            reply[2:], None if row is None else source, hits, whole, row, labels is NO_LABELS
        )
        if (
            name is None
            and cached.rotation is None
            and cached.compressed_rotation is None
            and turns is None
        ):
            # The same each time (a query in random case is seldom asked again).
            self.cache.remember(transport.slot, data[2:], replay)
        self.count(replay, data, reply, started)
        return reply

    def replayed(self, rendered: Rendered, data: bytes, started: float) -> bytes:
        """The reply a query with the same bytes but the ID got from the cache, counted."""
        self.cache.hits += 1
        reply = data[:2] + rendered.reply
        self.count(rendered, data, reply, started)
        return reply

    def count(self, rendered: Rendered, data: bytes, reply: bytes, started: float) -> None:
        """Count a hit in its topology row and its metrics."""
        if rendered.row is not None:
            count_topology(rendered.row, rendered.unplaced)
        metrics = self.metrics
        hits = rendered.hits
        if metrics is not None and hits is not None:
            if rendered.whole:
                count_hit(metrics, hits, started)
            else:  # options, or cut to another size: counted in full
                metrics.observe(hits.labels, started, len(data), len(reply))
                metrics.cache_hits[hits.kind] += 1

    def recasing(
        self,
        data: bytes,
        key: bytes,
        echo: EchoedOptions,
        source: str,
        entry: Entry,
        cached: Cached,
    ) -> None:
        """Find where a cached reply copies the name asked (wire/case.py), from the reply to its
        name with each letter in the other case, built now (`twin`): `cached.case`, counted in
        the cache's bound; NOT_RECASED when it cannot be written for another case so."""
        serial = self.snapshot.serial
        if cached.serial >= 0 and serial != cached.serial:
            cached.rewrite(serial)  # as the reply to the other case has it
        name = cached.question[:-4]
        found = NOT_RECASED
        twin = None
        if not cached.packed:  # compressed whole: another case's names compress otherwise
            twin = self.twin(
                data[:12] + name.swapcase() + data[12 + len(name) :], key, echo, source
            )
        if twin is not None:
            ours, theirs = cached.reply, twin[2:]
            if data[11]:  # the OPT records: the buffer size may differ
                theirs = theirs[:-11] + ours[-11:]
            runs = case_runs(ours, theirs, name)
            if runs is not None and cached.rotation is None:
                found = Recasing(runs, None, label_facts(ours, runs, name))
            elif runs is not None and cached.rotation is not None:
                rotation = Rotation.of(theirs)
                parts = None if rotation is None else rotation_runs(cached.rotation, rotation, name)
                if parts is not None:
                    found = Recasing(runs, parts)
        cached.case = found
        if found is not NOT_RECASED:
            self.cache.grow(entry, cached, found.size)

    def twin(self, data: bytes, key: bytes, echo: EchoedOptions, source: str) -> bytes | None:
        """The whole reply (uncompressed, with its ID) to a plain query, from templates or the
        resolver as `built` makes it, nothing cached or counted; None when its answer depends
        on its letter case (resolver `case_insensitive`; the plugins before the kubernetes
        block's own, which may match names by their case, are asked each time) or is not the
        zones' alone."""
        if self.plugins:
            return None
        try:
            query = self.bounded(decode_plain(data))
            lower = tuple(label.lower() for label in query.name)
            if not case_insensitive(lower, self.config.zones):
                return None
            if self.blocks is not None and not self.blocks.mine(query.name, query.qtype):
                return None
            if self.negatives is not None:
                templated = self.negatives.reply(data, key, self.snapshot, MAX_TCP_SIZE)
                if templated is not None:
                    return templated[0]
            if route(query, self.config.zones, self.forwarder is not None) is not ZONES:
                return None
            labels, _ = self.placer.place(source, echo.subnet)
            answer = resolve(query.name, query.qtype, self.snapshot, self.config, labels)
            if self.forwarder is not None and (answer.chase or not answer.authoritative):
                return None
            if self.autopath is not None and not self.autopath.shared(query, answer):
                return None
            return encode_forms(query, answer, MAX_TCP_SIZE)[0]
        except Exception:
            return None  # built anew, where the decoder's path says what failed

    def rendered(
        self,
        data: bytes,
        key: bytes,
        cached: Cached,
        options: bytes,
        transport: Transport,
        name: bytes | None = None,
    ) -> bytes | None:
        """A cached reply as one query gets it: its ID, its OPT record (buffer size, options),
        cut to its size limit (wire/encode.py `fit`); written with the letters of `name`, the
        query's name in wire form, when it is asked in another case than the reply's; None when
        only a new encoding fits."""
        serial = self.snapshot.serial
        case = cached.case
        runs: Runs = ()
        if name is None or cached.rotation is None:
            body = cached.current(serial)
            if name is not None and case is not None:  # recased below, as far as it is sent
                runs = case.runs
        else:
            body = cached.recased(serial, name)
        opt = b""
        limit = MIN_UDP_SIZE
        if data[11]:  # an OPT record: the buffer size, as CoreDNS's `bufsize` bounds it
            size = min(buffer_size(data, key), self.max_udp_size)
            opt = reply_opt(body[-11:], size, options)
            limit = max(MIN_UDP_SIZE, size)
        if transport.tcp:
            limit = MAX_TCP_SIZE
        # A packed reply has one form, compressed already: the body, in its turn's order.
        compressed = body if cached.packed else cached.compressed
        turns = cached.compressed_rotation
        if name is not None:  # compressed below as this query's names compress
            compressed = turns = None
        if turns is not None:  # rotated only when this query gets that form
            size = len(body) - (11 if opt else 0) + len(opt) + 2
            if size > limit or transport.fragment_limit and size > transport.fragment_limit:
                compressed = turns.next()
        reply = fit(body, compressed, opt, limit, transport.fragment_limit)
        if name is not None:
            if reply is not None:
                reply = recase(reply, runs, name)
            elif case is not None and runs:  # compressed as its names compress, made once
                reply = packed(case, body, cached.serial, opt, limit, name)  # for those alike
            else:  # rotated and recased already
                reply = compress(body, opt, limit)
        return None if reply is None else data[:2] + reply

    def built(
        self,
        data: bytes,
        key: bytes,
        echo: EchoedOptions,
        transport: Transport,
        source: str,
        started: float,
        templates: bool = True,
    ) -> Reply:
        """The reply to a plain query with none cached: from templates (`negative`; not when
        `templates` is False, they have said no), or made and cached (for every query of its
        key, whatever their case, buffer size and options), then served as a hit is. Anything
        but an answer from the zones (BADVERS, forwarding, another class, a failure) takes the
        decoder's path."""
        if self.plugins:  # theirs first: the kubernetes handler then makes it (`fill`)
            return self.decoded(data, transport, source, started, Miss(data, key, echo))
        # A reply kept in another letter case (one that cannot be written in this query's)
        # stays: this one is made for this query only.
        kept = self.cache.table.get(key)
        keep = not isinstance(kept, Cached)
        if self.negatives is not None and templates:
            templated = self.negative(data, key, echo, transport, keep)
            if templated is not None:
                answer, qtype, stored = templated
                # Asked again: CoreDNS's `cache` would have kept it the first time, a hit.
                self.count_miss(kept if stored is None else stored)
                return self.counted(data, answer, transport, started, qtype)
        made = self.made(data, key, echo, source, keep)
        if made is None:
            return self.decoded(data, transport, source, started)
        cached, scoped = made
        turns = cached.turns
        if turns is not None:  # topology weights: this turn's reply, taken once it is served
            cached = turns.peek()
        reply = self.rendered(data, key, cached, echo.scoped if scoped else echo.plain, transport)
        if reply is None:  # larger than its cached forms allow for this query
            return self.decoded(data, transport, source, started)
        if turns is not None:
            turns.next()
        self.count_miss(kept)
        return self.counted(data, reply, transport, started, _qtype(data, key))

    def count_miss(self, kept: Entry | None) -> None:
        """Count a query built anew as CoreDNS's `cache` would: a hit when a reply in another
        letter case is cached (its cache folds case), else a query passed on."""
        if isinstance(kept, Cached) and kept.hits is not None and self.metrics is not None:
            self.metrics.cache_hits[kept.hits[0].kind] += 1
        else:
            self.passed()

    def negative(
        self, data: bytes, key: bytes, echo: EchoedOptions, transport: Transport, keep: bool
    ) -> tuple[bytes, int, Cached | None] | None:
        """(reply, qtype, the entry cached now) from templates (serve/negative.py): NXDOMAIN
        for a name that certainly does not exist, a pod name's address or NODATA; None when
        only the resolver can tell. Cached (if `keep`) the second time its key is asked
        (`ReplyCache.again`)."""
        assert self.negatives is not None
        found = self.negatives.reply(data, key, self.snapshot, MAX_TCP_SIZE)
        if found is None:
            return None
        reply, qtype, depends = found
        cached = stored = None
        if keep and self.cache.again(key):
            cached = stored = self.template_entry(data, key, reply, qtype, depends)
            self.cache.store(key, cached)
        if data[11] or len(reply) > MIN_UDP_SIZE and not transport.tcp:
            # An OPT record to write (buffer size, options), or a reply to cut to its limit.
            if cached is None:
                cached = self.template_entry(data, key, reply, qtype, depends)
            rendered = self.rendered(data, key, cached, echo.plain, transport)
            if rendered is None:  # only the compressed form fits: the encoder's to write
                return None
            reply = rendered
        return reply, qtype, stored

    def first_time(
        self, data: bytes, transport: Transport, source: str, started: float
    ) -> Reply | Literal[False]:
        """The reply to an A or AAAA query without OPT record (stub resolvers send most
        first-time names so) whose key has no reply cached: from templates, else made; False
        for the usual path, which gives the rest the same reply, cache entry and counts."""
        assert self.negatives is not None
        plain = self.negatives.plain(data, self.snapshot)
        if plain is None:
            return False
        key, templated = plain
        if key in self.cache.table:
            return False
        if templated is None:  # only the resolver can tell: what `built` does after templates
            self.cache.misses += 1
            return self.built(data, key, NO_OPTIONS, transport, source, started, templates=False)
        reply, qtype, depends = templated
        if len(reply) > MIN_UDP_SIZE and not transport.tcp:
            return False  # to cut to its limit
        self.cache.misses += 1
        stored = None
        if self.cache.again(key):
            stored = self.template_entry(data, key, reply, qtype, depends)
            self.cache.store(key, stored)
        self.count_miss(stored)
        return self.counted(data, reply, transport, started, qtype)

    def template_entry(
        self, data: bytes, key: bytes, reply: bytes, qtype: int, depends: frozenset[Dependency]
    ) -> Cached:
        """A reply from templates as the cache keeps it."""
        question = data[12 : plain_question_end(data, key)]
        hits = self.hit_rows(data, key, reply, qtype)
        # NXDOMAIN and NODATA carry the SOA (an authority record); a pod's address does not.
        serial = self.snapshot.serial if reply[9] else -1
        return Cached(reply[2:], None, question, tuple(depends), serial, False, hits)

    def made(
        self, data: bytes, key: bytes, echo: EchoedOptions, source: str, keep: bool
    ) -> tuple[Cached, bool] | None:
        """(cached reply, whether it depends on the Client Subnet) for a plain query, made by
        the resolver and cached (if `keep`); None for the decoder's path."""
        try:
            query = self.bounded(decode_plain(data))
        except ValueError:
            return None
        if route(query, self.config.zones, self.forwarder is not None) is not ZONES:
            return None
        if self.blocks is not None and not self.blocks.mine(query.name, query.qtype):
            return None  # another block's, or none's: the decoder's path says which
        try:
            labels, via_ecs = self.placer.place(source, echo.subnet)
            # As many records as the largest reply (TCP's) holds: it serves every transport.
            # With topology weights, the first tier's reply; the others' are made below.
            answer = resolve(
                query.name, query.qtype, self.snapshot, self.config, labels,
                turns=self.turns, group=0,
            )  # fmt: skip
            if self.forwarder is not None and (answer.chase or not answer.authoritative):
                # Outside the zones, ending outside them, or falling through (--fallthrough):
                # the upstream's to answer.
                return None
            if self.autopath is not None and not self.autopath.shared(query, answer):
                # A pod of the namespace the name names gets another reply: never cached.
                return None
            cached = self.entry_of(data, key, query, answer)
            row = cached.row
            if answer.schedule:
                self.rotation_of(data, key, query, labels, answer, cached)
            if keep:
                self.cache.store(key, cached, answer.policy, labels, row)
            if cached.turns is not None:  # counted as the turn it serves (`built`)
                row = cached.turns.peek().row
            if row is not None:
                count_topology(row, labels is NO_LABELS)
        except Exception:
            return None  # the decoder's path says what failed
        return cached, via_ecs and answer.policy is not None

    def entry_of(self, data: bytes, key: bytes, query: Query, answer: Answer) -> Cached:
        """A resolved answer as the cache keeps it (its `row` set when it follows a policy)."""
        whole, compressed = encode_forms(query, answer, COMPRESS_OVER)
        body = whole[2:]
        carries_soa = bool(answer.authority) or any(rr.rtype == SOA for rr in answer.answer)
        cached = Cached(
            body,
            None if compressed is None else body if compressed is whole else compressed[2:],
            query.question,
            tuple(answer.depends),
            self.snapshot.serial if carries_soa else -1,
            self.loadbalance and not carries_soa,
            self.hit_rows(data, key, whole, query.qtype),
        )
        if answer.policy is not None:
            cached.row = self.topology_counts.row(
                query.qtype, answer.policy, answer.tier, answer.soft
            )
        return cached

    def rotation_of(
        self, data: bytes, key: bytes, query: Query, labels: Labels, answer: Answer, first: Cached
    ) -> None:
        """Topology weights: the reply of each tier of the rotation beside `first` (tier 0's),
        and the `Turns` they all share, counted in `first`'s size as one entry. Each is built
        anew in another letter case (`NOT_RECASED`): a turn is taken once per reply."""
        made = {0: first}
        for group in sorted(set(answer.schedule) - {0}):
            other = resolve(
                query.name, query.qtype, self.snapshot, self.config, labels, turns=self.turns,
                group=group,
            )  # fmt: skip
            made[group] = self.entry_of(data, key, query, other)
        counter = answer.counter if answer.counter is not None else [0]
        turns = Turns(tuple(made[group] for group in answer.schedule), counter)
        for group, cached in made.items():
            cached.turns = turns
            cached.case = NOT_RECASED
            if group:
                first.size += cached.size
        first.size += TURNS_OVERHEAD

    def hit_rows(
        self, data: bytes, key: bytes, reply: bytes, qtype: int
    ) -> tuple[Hits, ...] | None:
        """The rows a cached reply's hits count in, one per transport: those of a query
        without EDNS options that gets the reply whole."""
        metrics = self.metrics
        if metrics is None:
            return None
        # Replies the zones wrote are the kubernetes plugin's; the server writes the others.
        plugin = "kubernetes" if reply[2] & (AA >> 8) else ""
        size = len(key) + (6 if data[11] else 2)  # with the ID, and the OPT's size and length
        filed = self.cache_kind(data, reply)
        zone = self.zone_of(data, qtype)
        # Every query of the key has the OPT record's flags it holds (wire/edns.py).
        do = bool(data[11]) and bool(key[-2] & (DO >> 8))
        return tuple(
            metrics.row(
                labels_of(kind.tcp, kind.family, qtype, reply[3] & RCODE, plugin, zone, do),
                size,
                len(reply),
                filed,
            )
            for kind in TRANSPORTS
        )

    def fill(self, request: Request) -> bytes | None:
        """The kubernetes handler's reply to the miss the chain is answering (`miss`) when the
        plugins before it passed its request on untouched: made and cached as `built` makes
        it, the miss counted; None for another request (one a rewrite rule touched, or a
        plugin's own lookup), or when only the resolver's uncached answer will do."""
        miss = self.miss
        if miss is None or request is not miss.request:
            return None
        self.miss = None  # once: the handler's own answer if this one is None
        data, key, echo = miss.data, miss.key, miss.echo
        kept = self.cache.table.get(key)
        made = self.made(data, key, echo, request.source, not isinstance(kept, Cached))
        if made is None:
            return None
        cached, scoped = made
        turns = cached.turns
        if turns is not None:  # topology weights: this turn's reply, taken once it is served
            cached = turns.peek()
        options = echo.scoped if scoped else echo.plain
        reply = self.rendered(data, key, cached, options, request.transport)
        if reply is None:  # larger than its cached forms allow for this query
            return None
        if turns is not None:
            turns.next()
        miss.filled = True
        self.count_miss(kept)
        return reply

    def decoded(
        self,
        data: bytes,
        transport: Transport,
        source: str,
        started: float,
        miss: Miss | None = None,
    ) -> Reply:
        """Decode a query in full and answer it down its server block's chain (the kubernetes
        block's, `chain`), counted at the head; nothing is cached but what the chain's
        kubernetes handler makes of the `miss` (`fill`). Every query that is not plain, not
        answered by the zones alone, or that plugins see first comes this way."""
        try:
            query = self.bounded(decode_query(data))
        except Dropped:
            return None
        except Rejected as rejected:
            rejection = encode_rejection(rejected.data, rejected.rcode)
            return self.counted(data, rejection, transport, started, 0, zone=DROPPED)
        qtype = query.qtype
        where = route(query, self.config.zones, self.forwarder is not None)
        if where is BADVERS:
            return self.counted(data, encode_badvers(query), transport, started, qtype)
        if self.blocks is not None:
            block = self.blocks.find(query.name, qtype)
            if block is None:  # no server block of the port holds the name, as CoreDNS
                return self.counted(data, encode_bare(query, REFUSED), transport, started, qtype)
            found, other = block
            if other is not None:
                request = Request(query, data, transport, source, name_text(found))
                return self.chained(request, other(request), started)
        if where is REFUSE:  # the server's own class check, before any block (CoreDNS)
            refused = encode_bare(query, REFUSED)
            return self.counted(data, refused, transport, started, qtype, zone=DROPPED)
        request = Request(query, data, transport, source)
        if miss is not None:
            miss.request = request
        outer, self.miss = self.miss, miss
        try:  # a plugin's own lookup (template's) asks the server again, within this one
            reply = self.chain(request)
        finally:
            self.miss = outer
        if request.written_by in PASSING and (miss is None or not miss.filled):
            self.passed()  # it reached the `cache` plugin's place and found no cached reply
        return self.chained(request, reply, started)

    def chained(self, request: Request, reply: Reply, started: float) -> Reply:
        """A chain's reply to `request`, counted (under the plugin that wrote it) when it is
        there."""
        data, transport, qtype = request.data, request.transport, request.query.qtype
        plugin = request.written_by
        if reply is None or isinstance(reply, bytes):
            if reply is None:
                return None
            return self.counted(data, reply, transport, started, qtype, plugin)
        return self.counted_later(reply, request, started)

    def bounded(self, query: Query) -> Query:
        """The query with its buffer size bounded by `--max-udp-size` (wire/encode.py)."""
        return bound_buffer(query, self.max_udp_size)

    def counted(
        self,
        data: bytes,
        reply: bytes,
        transport: Transport,
        started: float,
        qtype: int,
        plugin: str = "",
        zone: str = "",
    ) -> bytes:
        """Count a query and its reply (when metrics are on), under the zone of the block that
        has it (`zone_of`; `zone` when the server refused it before any block, `dropped`), unless
        that block has no `prometheus`, as CoreDNS counts in that plugin."""
        metrics = self.metrics
        if metrics is not None:
            zone = zone or self.zone_of(data, qtype)
            if self.blocks is not None and zone in self.blocks.uncounted:
                return reply
            if not plugin or plugin == "kubernetes":
                # Replies the zones wrote are the kubernetes plugin's; its failures (no AA)
                # and what the server refuses are the server's, as CoreDNS writes them.
                plugin = "kubernetes" if reply[2] & (AA >> 8) else ""
            labels = labels_of(
                transport.tcp,
                transport.family,
                qtype,
                reply[3] & RCODE,
                plugin,
                zone,
                dnssec_ok(data),
            )
            metrics.observe(labels, started, len(data), len(reply))
        return reply

    def zone_of(self, data: bytes, qtype: int) -> str:
        """The `zone` label of a query: the zone of the server block it goes to (`.` when the
        kubernetes block, for `.`, is the port's only one)."""
        if self.blocks is None:
            return ZONE
        try:
            name = read_name(data, HEADER_SIZE)[0]
        except (IndexError, ValueError):
            return DROPPED
        return self.blocks.zone_label(name, qtype)

    async def counted_later(
        self, pending: Coroutine[Any, Any, bytes | None], request: Request, started: float
    ) -> bytes | None:
        """Count a reply that needed an upstream once it is there."""
        reply = await pending
        if reply is not None:
            plugin = request.written_by
            qtype = request.query.qtype
            self.counted(request.data, reply, request.transport, started, qtype, plugin)
        return reply

    def passed(self) -> None:
        """A query that reached the `cache` plugin's place and found no cached reply."""
        if self.metrics is not None:
            self.metrics.cache_passes += 1

    def cache_kind(self, data: bytes, reply: bytes) -> int:
        """How CoreDNS's `cache` would file `reply` to the query `data`: success, denial, or
        not kept (its zone `disable`d for that kind, or another rcode)."""
        rcode = reply[3] & RCODE
        if rcode == NOERROR and reply[6:8] != b"\0\0":
            policy, kind = self.cache_settings.success, SUCCESS
        elif rcode in DENIALS:
            policy, kind = self.cache_settings.denial, DENIAL
        else:
            return UNCACHED
        name = tuple(label.lower() for label in read_name(data, HEADER_SIZE)[0])
        return kind if policy.keeps(name) else UNCACHED

    def cache_entries(self) -> list[int]:
        """Cached replies by how CoreDNS's cache would file them (a name answered per client
        is one entry), those of the forward cache included."""
        counts = [0, 0, 0]
        for entry in list(self.cache.table.values()):
            if isinstance(entry, TopologyReplies):
                if not entry.replies:
                    continue
                entry = next(iter(entry.replies.values()))
            counts[entry.hits[0].kind if entry.hits else UNCACHED] += 1
        if self.forwarder is not None:
            counts[SUCCESS] += len(self.forwarder.cache.success)
            counts[DENIAL] += len(self.forwarder.cache.denial)
        return counts

    def count_answer(self, qtype: int, answer: Answer, unplaced: bool) -> None:
        """Count a topology-filtered answer the kubernetes handler gave in its row."""
        assert answer.policy is not None
        row = self.topology_counts.row(qtype, answer.policy, answer.tier, answer.soft)
        count_topology(row, unplaced)

    def count_autopath(self) -> None:
        """A name autopath found (`coredns_autopath_success_total`, with metrics on)."""
        if self.metrics is not None:
            AUTOPATH_SUCCESS.labels(self.metrics.server).inc()


class Miss:
    """A plain query the reply cache missed, on its way down the kubernetes block's chain:
    its key and echoed options, for the cache-filling path (`Responder.fill`)."""

    def __init__(self, data: bytes, key: bytes, echo: EchoedOptions) -> None:
        self.data = data
        self.key = key
        self.echo = echo
        #: Its request down the chain: the one the kubernetes handler may answer from the
        #: cache-filling path (a plugin that changes a query passes on a request of its own).
        self.request: Request | None = None
        #: Whether the cache-filling path answered it (and counted the miss).
        self.filled = False


def _qtype(data: bytes, key: bytes) -> int:
    """The qtype of a plain query, for its metrics labels."""
    end = plain_question_end(data, key)
    return (data[end - 4] << 8) | data[end - 3]
