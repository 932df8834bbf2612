"""TopologyCounts: rows per (policy source, tier), read by prometheus_client on scrape."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from toposdns.serve.topology_metrics import TopologyCounts, count
from toposdns.store.topology import HOSTNAME, TRAFFIC_DISTRIBUTIONS, ZONE, Policy
from toposdns.wire.codes import AAAA, MX, SRV, TXT, A

KEYS = Policy("topologyKeys", (HOSTNAME, ZONE, "*"))
SAME_NODE = Policy("trafficDistribution PreferSameNode", TRAFFIC_DISTRIBUTIONS["PreferSameNode"])
SAME_ZONE = Policy("trafficDistribution PreferSameZone", TRAFFIC_DISTRIBUTIONS["PreferSameZone"])
HINTS = Policy("hints", hints=True)


def scrape(counts: TopologyCounts) -> list[str]:
    registry = CollectorRegistry()
    registry.register(counts)
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_one_row_per_policy_source_and_tier() -> None:
    counts = TopologyCounts()
    assert counts.row(A, KEYS, ZONE) is counts.row(SRV, KEYS, ZONE)
    assert counts.row(A, KEYS, ZONE) is not counts.row(A, KEYS, HOSTNAME)
    # Every trafficDistribution value is one policy label.
    assert counts.row(AAAA, SAME_NODE, ZONE) is counts.row(A, SAME_ZONE, ZONE)


def test_other_types_are_not_counted() -> None:
    counts = TopologyCounts()
    for qtype in (TXT, MX):
        count(counts.row(qtype, KEYS, ZONE), unplaced=True)
    assert scrape(counts) == ["toposdns_unplaced_client_queries_total 0.0"]


def test_scrape_adds_up_the_rows() -> None:
    counts = TopologyCounts()
    for _ in range(3):
        count(counts.row(A, KEYS, HOSTNAME), unplaced=False)
    count(counts.row(A, KEYS, "*"), unplaced=True)
    count(counts.row(SRV, SAME_ZONE, "none"), unplaced=True)
    count(counts.row(A, HINTS, ZONE), unplaced=False)
    assert scrape(counts) == [
        'toposdns_topology_answers_total{policy="hints",tier="topology.kubernetes.io/zone"} 1.0',
        'toposdns_topology_answers_total{policy="topologyKeys",tier="*"} 1.0',
        'toposdns_topology_answers_total{policy="topologyKeys",tier="kubernetes.io/hostname"} 3.0',
        'toposdns_topology_answers_total{policy="trafficDistribution",tier="none"} 1.0',
        "toposdns_unplaced_client_queries_total 2.0",
    ]


def test_spillovers_and_weighted_answers_are_counted_apart() -> None:
    counts = TopologyCounts()
    count(counts.row(A, KEYS, ZONE), unplaced=False)
    for _ in range(2):
        count(counts.row(A, KEYS, ZONE, "spill-over"), unplaced=False)
    count(counts.row(SRV, SAME_ZONE, ZONE, "weighted"), unplaced=True)
    assert counts.row(A, KEYS, ZONE) is not counts.row(A, KEYS, ZONE, "spill-over")
    zone = 'tier="topology.kubernetes.io/zone"'
    assert scrape(counts) == [
        f'toposdns_topology_answers_total{{policy="topologyKeys",{zone}}} 3.0',
        f'toposdns_topology_answers_total{{policy="trafficDistribution",{zone}}} 1.0',
        f'toposdns_topology_spillovers_total{{policy="topologyKeys",{zone}}} 2.0',
        f'toposdns_topology_weighted_answers_total{{policy="trafficDistribution",{zone}}} 1.0',
        "toposdns_unplaced_client_queries_total 1.0",
    ]
