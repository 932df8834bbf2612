"""/metrics of several workers summed: the same text one process that counted everything gives."""

from __future__ import annotations

import pickle
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, generate_latest

from toposdns.serve.query_metrics import QueryMetrics, labels_of
from toposdns.workers.exposition import Sum, sample_total

A, SRV = labels_of(False, 1, 1, 0, "kubernetes"), labels_of(True, 2, 33, 3, "kubernetes")
# (transport, labels, seconds, query size, reply size) of the queries a process answered
QUERIES = [
    ("udp4", A, 0.0001, 40, 56),
    ("udp4", A, 0.0001, 40, 56),
    ("tcp4", SRV, 0.002, 70, 300),
    ("udp4", A, 0.3, 45, 100),
]


class Process:
    """The metrics one process keeps, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queries = QueryMetrics("dns://:53")
        self.registry.register(self.queries)
        self.hits = Counter("hits", "Hits.", ["server", "type"], registry=self.registry)
        self.duration = Histogram("proxy", "Seconds.", ["to"], registry=self.registry)
        self.entries = Gauge("entries", "Entries.", ["type"], registry=self.registry)
        self.plain = Counter("plain", "No labels.", registry=self.registry)

    def answer(
        self, transport: str, labels: tuple[str, ...], seconds: float, q: int, r: int
    ) -> None:
        self.queries.add(labels, seconds, q, r)  # type: ignore[arg-type]
        self.hits.labels("dns://:53", transport).inc()
        self.duration.labels("10.0.0.1:53").observe(seconds)
        self.entries.labels("success").inc()
        self.plain.inc()

    def families(self) -> list[Metric]:
        return pickle.loads(pickle.dumps(list(self.registry.collect())))  # as a worker sends


def without_created(text: bytes) -> list[str]:
    """The lines of an exposition, but the creation times; in any order within a family."""
    return sorted(line for line in text.decode().splitlines() if "_created" not in line)


def spread(split: Callable[[int], int], workers: int) -> tuple[list[Process], Process]:
    processes, alone = [Process() for _ in range(workers)], Process()
    for i, query in enumerate(QUERIES):
        processes[split(i)].answer(*query)
        alone.answer(*query)
    return processes, alone


def test_the_sum_of_workers_reads_as_one_process() -> None:
    for split in (lambda i: i % 2, lambda i: 0, lambda i: 1 if i == 2 else 0):
        workers, alone = spread(split, 2)
        summed = Sum()
        for worker in workers:
            summed.add(worker.families())
        assert without_created(generate_latest(summed)) == without_created(
            generate_latest(alone.registry)
        )
        assert sample_total(summed.collect(), "coredns_dns_requests_total") == len(QUERIES)


def test_created_keeps_the_earliest() -> None:
    first = Metric("c", "A counter.", "counter")
    first.add_sample("c_total", {}, 2)
    first.add_sample("c_created", {}, 100.0)
    second = Metric("c", "A counter.", "counter")
    second.add_sample("c_total", {}, 3)
    second.add_sample("c_created", {}, 50.0)
    summed = Sum()
    summed.add([first])
    summed.add([second])
    (family,) = summed.collect()
    assert {s.name: s.value for s in family.samples} == {"c_total": 5, "c_created": 50.0}


def test_what_a_gone_worker_counted_stays_but_not_its_gauges() -> None:
    (worker,), _ = spread(lambda i: 0, 1)
    retired = Sum()
    retired.add(worker.families(), growing_only=True)
    names = {family.name for family in retired.collect()}
    assert "entries" not in names
    assert {"hits", "proxy", "plain", "coredns_dns_requests"} <= names
    assert sample_total(retired.collect(), "plain_total") == len(QUERIES)


def test_a_gauge_every_worker_sets_from_one_file_is_not_summed() -> None:
    families = []
    for _ in range(2):  # two workers that read the same hosts file
        registry = CollectorRegistry()
        entries = Gauge("coredns_hosts_entries", "Entries.", ["hostsfile"], registry=registry)
        entries.labels("/etc/coredns/NodeHosts").set(4)
        stamp = Gauge("coredns_hosts_reload_timestamp_seconds", "Read.", registry=registry)
        stamp.set(1700000000.5)
        families.append(pickle.loads(pickle.dumps(list(registry.collect()))))
    summed = Sum()
    for worker in families:
        summed.add(worker)
    values = {s.name: s.value for family in summed.collect() for s in family.samples}
    assert values == {
        "coredns_hosts_entries": 4,
        "coredns_hosts_reload_timestamp_seconds": 1700000000.5,
    }
