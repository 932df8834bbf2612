"""Per-query metrics under CoreDNS's names, cheap enough for the hot path.

A prometheus_client child costs a lock and a method call per update, several per query. Here a
cached reply's hit costs two additions: each cache entry (serve/cache.py `Cached`) points at the
counter row of its labels and sizes (`Hits`, shared by every entry alike), set when the entry is
made and gone with it, and the collector adds the rows up only when Prometheus scrapes. A
scrape's cost follows the number of distinct rows (labels times reply sizes), not the number of
cached replies.

Exported, as CoreDNS's `metrics` plugin does (label `view` is always empty; `server` is the
address the server listens on, `dns://:PORT` or with `bind` `dns://ADDR:PORT`, one
`QueryMetrics` per server; `zone` is the zone of the server block the query was routed by,
`dropped` for a query the server refused before any block, as CoreDNS's `vars.Dropped`):
`coredns_dns_requests_total{server,zone,view,proto,family,type}`,
`coredns_dns_do_requests_total{server,zone,view}` (queries with the DO bit set),
`coredns_dns_responses_total{server,zone,view,rcode,plugin}`,
`coredns_dns_request_duration_seconds{server,zone,view}`,
`coredns_dns_request_size_bytes{server,zone,view,proto}` and
`coredns_dns_response_size_bytes{server,zone,view,proto}`. The zone and the DO bit are labels
of a row like the others: a cached reply's queries all have its name and its key (which holds
the OPT record's flags), so a hit counts them at no cost.

And what a CoreDNS `cache` plugin in the server block would count (`coredns_cache_entries`,
`coredns_cache_requests_total`, `coredns_cache_hits_total`, `coredns_cache_misses_total`,
labels `server`, `type` (success or denial), `zones` and `view`; and the forward caches'
`coredns_cache_prefetch_total`, `coredns_cache_served_stale_total` and
`coredns_cache_evictions_total`, which they count in `forward_counts`): a query reaches it once it
has passed what CoreDNS answers before `cache` (the server's own checks, `acl`, `any`); it is a
hit when answered from a cached reply of a kind that cache keeps (`CachePolicy.keeps`: a zone
`disable`d for it, or no `cache` at all, makes every reply from it a miss), from either cache:
the replies of the zones (serve/cache.py) or the forwarded ones (serve/forward_cache.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from time import perf_counter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from toposdns.serve.forward_cache import CacheCounts
from toposdns.wire.codes import RCODE_NAMES
from toposdns.wire.records import type_name

ZONE = "."
#: The `zone` of a query the server refuses before any server block has it (no block's zone
#: holds the name, or a class the server does not take), as CoreDNS's `vars.Dropped`.
DROPPED = "dropped"
#: qtypes CoreDNS reports by name (vars/monitor.go); the rest are "other".
NAMED_TYPES = frozenset(
    "A AAAA CNAME DNSKEY DS MX NSEC3 NSEC NS PTR RRSIG SOA SRV TXT HTTPS SVCB IXFR AXFR ANY".split()
)
DURATION_BUCKETS = tuple(0.00025 * 2**k for k in range(16))
FIRST_BOUND = DURATION_BUCKETS[0]
SIZE_BUCKETS = (0, 100, 200, 300, 400, 511, 1023, 2047, 4095, 8291, 16e3, 32e3, 48e3, 64e3)

# A total row: query count, seconds, summed sizes, then per-bucket counts of durations and sizes.
COUNT, SECONDS, QUERY_SIZE, REPLY_SIZE = 0, 1, 2, 3
DURATIONS = 4
QUERY_SIZES = DURATIONS + len(DURATION_BUCKETS) + 1
REPLY_SIZES = QUERY_SIZES + len(SIZE_BUCKETS) + 1
ROW = REPLY_SIZES + len(SIZE_BUCKETS) + 1
#: proto, family, type, rcode, plugin, zone, and whether the query's DO bit is set.
Labels = tuple[str, str, str, str, str, str, bool]


#: How CoreDNS's `cache` would file a reply (its `type` label): one it would not keep, a
#: success, a denial.
UNCACHED, SUCCESS, DENIAL = 0, 1, 2
CACHE_TYPES = ("", "success", "denial")


class Hits:
    """Cache hits of one kind (labels, query size, reply size, how CoreDNS's cache would file
    the reply) answered within the first duration bucket, and their seconds. Two numbers, so
    that a hit touches little memory (slower hits, which are rare, go to the totals in full)."""

    __slots__ = ("labels", "query_size", "reply_size", "kind", "row")

    def __init__(self, labels: Labels, query_size: int, reply_size: int, kind: int) -> None:
        self.labels = labels
        self.query_size = query_size
        self.reply_size = reply_size
        self.kind = kind
        self.row = [0, 0.0]  # hits, seconds


class QueryMetrics:
    """Counts queries in plain numbers; a prometheus_client collector reads them on scrape."""

    def __init__(self, server: str) -> None:
        self.server = server
        #: The Hits rows, one per (labels, query size, reply size, kind), which cached replies point
        #: at: the counts stay here when the replies go.
        self.rows: dict[tuple[Labels, int, int, int], Hits] = {}
        #: Everything else, replies built and slow hits, by labels.
        self.totals: dict[Labels, list[float]] = {}
        #: The `cache` plugin's counts (the rest are the rows' hits): hits outside the rows
        #: (slow, or cut to another size), by kind; forwarded replies from the forward cache,
        #: by kind; queries that found no cached reply.
        self.cache_hits = [0, 0, 0]
        self.forward_hits = [0, 0, 0]
        self.cache_passes = 0
        #: Cached replies by kind, read when scraped (the server points it at its caches).
        self.cache_entries: Callable[[], list[int]] = lambda: [0, 0, 0]
        #: The forward caches' prefetches, stale replies and evictions (they count here).
        self.forward_counts = CacheCounts()

    def observe(self, labels: Labels, started: float, query_size: int, reply_size: int) -> None:
        """Count one query answered since `started` (perf_counter)."""
        self.add(labels, perf_counter() - started, query_size, reply_size)

    def row(self, labels: Labels, query_size: int, reply_size: int, kind: int = UNCACHED) -> Hits:
        """The Hits row a cached reply's hits count in: queries with these labels and sizes,
        answered by a reply CoreDNS's cache files as `kind`."""
        key = (labels, query_size, reply_size, kind)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = Hits(labels, query_size, reply_size, kind)
        return row

    def add(self, labels: Labels, seconds: float, query_size: int, reply_size: int) -> None:
        """Count one query in the totals."""
        row = self.totals.get(labels)
        if row is None:
            row = self.totals[labels] = _row()
        row[QUERY_SIZE] += query_size
        row[REPLY_SIZE] += reply_size
        _count_sizes(row, query_size, reply_size, 1)
        _count(row, seconds)

    def slow_hit(self, hits: Hits, seconds: float) -> None:
        """A wire-cache hit slower than the first duration bucket: counted in full."""
        self.add(hits.labels, seconds, hits.query_size, hits.reply_size)
        self.cache_hits[hits.kind] += 1

    def cache_families(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """The `cache` plugin's series, from the counts and the rows."""
        hits: list[float] = [float(count) for count in self.cache_hits]
        for row in list(self.rows.values()):
            hits[row.kind] += row.row[0]
        requests = sum(hits) + self.cache_passes
        for kind in (SUCCESS, DENIAL):
            hits[kind] += self.forward_hits[kind]
        base = [self.server]
        entries = GaugeMetricFamily(
            "coredns_cache_entries", "The number of elements in the cache.",
            labels=["server", "type", "zones", "view"])  # fmt: skip
        counted = self.cache_entries()
        hit = CounterMetricFamily(
            "coredns_cache_hits", "The count of cache hits.",
            labels=["server", "type", "zones", "view"])  # fmt: skip
        for kind in (SUCCESS, DENIAL):
            entries.add_metric([*base, CACHE_TYPES[kind], ZONE, ""], counted[kind])
            hit.add_metric([*base, CACHE_TYPES[kind], ZONE, ""], hits[kind])
        yield entries
        total = CounterMetricFamily(
            "coredns_cache_requests", "The count of cache requests.",
            labels=["server", "zones", "view"])  # fmt: skip
        total.add_metric([*base, ZONE, ""], requests)
        yield total
        yield hit
        misses = CounterMetricFamily(
            "coredns_cache_misses",
            "The count of cache misses. Deprecated, derive misses from cache hits/requests "
            "counters.",
            labels=["server", "zones", "view"])  # fmt: skip
        misses.add_metric([*base, ZONE, ""], requests - hits[SUCCESS] - hits[DENIAL])
        yield misses
        counts = self.forward_counts
        prefetch = CounterMetricFamily(
            "coredns_cache_prefetch", "The number of times the cache has prefetched a cached item.",
            labels=["server", "zones", "view"])  # fmt: skip
        prefetch.add_metric([*base, ZONE, ""], counts.prefetches)
        yield prefetch
        stale = CounterMetricFamily(
            "coredns_cache_served_stale", "The number of requests served from stale cache entries.",
            labels=["server", "zones", "view"])  # fmt: skip
        stale.add_metric([*base, ZONE, ""], counts.served_stale)
        yield stale
        evictions = CounterMetricFamily(
            "coredns_cache_evictions", "The count of cache evictions.",
            labels=["server", "type", "zones", "view"])  # fmt: skip
        for kind in (SUCCESS, DENIAL):
            name = CACHE_TYPES[kind]
            evictions.add_metric([*base, name, ZONE, ""], counts.evictions[name])
        yield evictions

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        """Build the metric families from the rows (called by prometheus_client on scrape)."""
        yield from self.cache_families()
        merged = {labels: list(row) for labels, row in self.totals.items()}
        for hits in list(self.rows.values()):
            _fold(merged.setdefault(hits.labels, _row()), hits)
        server = self.server
        by_request: dict[tuple[str, ...], float] = {}
        by_response: dict[tuple[str, ...], float] = {}
        by_do: dict[str, float] = {}
        durations: dict[str, _Histogram] = {}
        query_sizes: dict[tuple[str, str], _Histogram] = {}
        reply_sizes: dict[tuple[str, str], _Histogram] = {}
        for (proto, ip_family, qtype, rcode, plugin, zone, do), row in merged.items():
            if not row[COUNT]:  # cached replies have rows for transports never asked over
                continue
            key = (zone, proto, ip_family, qtype)
            by_request[key] = by_request.get(key, 0) + row[COUNT]
            answered = (zone, rcode, plugin)
            by_response[answered] = by_response.get(answered, 0) + row[COUNT]
            if do:
                by_do[zone] = by_do.get(zone, 0) + row[COUNT]
            if zone not in durations:
                durations[zone] = _Histogram(DURATION_BUCKETS)
            durations[zone].add(row[DURATIONS:QUERY_SIZES], row[SECONDS])
            if (zone, proto) not in query_sizes:
                query_sizes[zone, proto] = _Histogram(SIZE_BUCKETS)
                reply_sizes[zone, proto] = _Histogram(SIZE_BUCKETS)
            query_sizes[zone, proto].add(row[QUERY_SIZES:REPLY_SIZES], row[QUERY_SIZE])
            reply_sizes[zone, proto].add(row[REPLY_SIZES:ROW], row[REPLY_SIZE])
        requests = CounterMetricFamily(
            "coredns_dns_requests", "Counter of DNS requests made per zone, protocol and family.",
            labels=["server", "zone", "view", "proto", "family", "type"])  # fmt: skip
        for asked, value in sorted(by_request.items()):
            requests.add_metric([server, asked[0], "", *asked[1:]], value)
        yield requests
        dnssec = CounterMetricFamily(
            "coredns_dns_do_requests", "Counter of DNS requests with DO bit set per zone.",
            labels=["server", "zone", "view"])  # fmt: skip
        for zone, value in sorted(by_do.items()):
            dnssec.add_metric([server, zone, ""], value)
        yield dnssec
        responses = CounterMetricFamily(
            "coredns_dns_responses", "Counter of response status codes.",
            labels=["server", "zone", "view", "rcode", "plugin"])  # fmt: skip
        for got, value in sorted(by_response.items()):
            responses.add_metric([server, got[0], "", *got[1:]], value)
        yield responses
        duration = HistogramMetricFamily(
            "coredns_dns_request_duration_seconds",
            "Histogram of the time (in seconds) each request took.",
            labels=["server", "zone", "view"])  # fmt: skip
        for zone, histogram in sorted(durations.items()):
            histogram.add_to(duration, [server, zone, ""])
        yield duration
        for name, doc, histograms in (
            ("coredns_dns_request_size_bytes", "Size of the request in bytes.", query_sizes),
            ("coredns_dns_response_size_bytes", "Size of the response in bytes.", reply_sizes),
        ):
            sizes = HistogramMetricFamily(name, doc, labels=["server", "zone", "view", "proto"])
            for (zone, proto), histogram in sorted(histograms.items()):
                histogram.add_to(sizes, [server, zone, "", proto])
            yield sizes


class AllServers:
    """The per-query series of every DNS server of a process (one per port) as one collector:
    a registry takes each metric name from one collector only, and CoreDNS exports every
    server's series in one family, told apart by their `server` label."""

    def __init__(self, servers: list[QueryMetrics]) -> None:
        self.servers = servers

    def collect(self) -> Iterator[Metric]:
        """Each family once, with the samples of every server (called on scrape)."""
        families: dict[str, Metric] = {}
        for metrics in self.servers:
            for family in metrics.collect():
                found = families.get(family.name)
                if found is None:
                    families[family.name] = family
                else:
                    found.samples.extend(family.samples)
        yield from families.values()


def labels_of(
    tcp: bool,
    family: int,
    qtype: int,
    rcode: int,
    plugin: str,
    zone: str = ZONE,
    do: bool = False,
) -> Labels:
    """The label values of one query, as CoreDNS writes them; `do`: its DO bit is set."""
    name = type_name(qtype)
    return (
        "tcp" if tcp else "udp",
        str(family),
        name if name in NAMED_TYPES else "other",
        RCODE_NAMES.get(rcode, str(rcode)),
        plugin,
        zone,
        do,
    )


def _row() -> list[float]:
    return [0.0] * ROW


def count_hit(metrics: QueryMetrics, hits: Hits, started: float) -> None:
    """Count a cache hit in its entry's row (the UDP frontend writes this out inline)."""
    seconds = perf_counter() - started
    if seconds <= FIRST_BOUND:
        row = hits.row
        row[0] += 1
        row[1] += seconds
    else:
        metrics.slow_hit(hits, seconds)


def duration_slot(seconds: float) -> int:
    """The row index of the duration bucket that `seconds` falls in."""
    return DURATIONS + bisect_left(DURATION_BUCKETS, seconds)


def _count(row: list[float], seconds: float) -> None:
    row[COUNT] += 1
    row[SECONDS] += seconds
    row[duration_slot(seconds)] += 1


def _count_sizes(row: list[float], query_size: float, reply_size: float, count: float) -> None:
    row[QUERY_SIZES + bisect_left(SIZE_BUCKETS, query_size)] += count
    row[REPLY_SIZES + bisect_left(SIZE_BUCKETS, reply_size)] += count


def _fold(total: list[float], hits: Hits) -> None:
    """Add a wire-cache entry's hits (all within the first duration bucket) to a total row."""
    count, seconds = hits.row
    total[COUNT] += count
    total[SECONDS] += seconds
    total[DURATIONS] += count
    total[QUERY_SIZE] += hits.query_size * count
    total[REPLY_SIZE] += hits.reply_size * count
    _count_sizes(total, hits.query_size, hits.reply_size, count)


class _Histogram:
    """Per-bucket counts (not cumulative) and a sum, turned into a Prometheus histogram."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * (len(bounds) + 1)
        self.total = 0.0

    def add(self, counts: list[float], total: float) -> None:
        for i, value in enumerate(counts):
            self.counts[i] += value
        self.total += total

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0.0, []
        for bound, value in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += value
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
        return out

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        family.add_metric(labels, self.buckets(), self.total)
