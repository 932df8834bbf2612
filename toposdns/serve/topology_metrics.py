"""What topology does, counted cheaply enough for the hot path.

- `toposdns_topology_answers_total{policy,tier}`: answers to A, AAAA and SRV queries for the
  name of a headless service whose topology policy applies, cached replies included. `policy`
  is where the policy came from (`topologyKeys`, `annotation`, `trafficDistribution`, `hints`);
  `tier` is the label key whose tier answered (`kubernetes.io/hostname`,
  `topology.kubernetes.io/zone`, any other key; `(nodeName)` for PreferSameNode's same-node
  tier and node hints, which compare node names), `*` when every endpoint did (the catch-all, a
  client with unknown labels under a list ending in `*`, zone hints with none for the client's
  zone), `none` when no tier matched and the answer was NODATA. Zone hints that matched count
  as `topology.kubernetes.io/zone`.
- `toposdns_topology_spillovers_total{policy,tier}`: of those, the answers of a Service with
  `toposdns.io/topology-min-endpoints` that took tiers past the nearest one with an endpoint;
  `tier` is the last tier taken.
- `toposdns_topology_weighted_answers_total{policy,tier}`: of those, the answers of a Service
  with `toposdns.io/topology-weights`: SRV answers carrying weights between tiers (`tier`: the
  nearest one), and A and AAAA replies of its rotation (`tier`: the one whose turn it was).
- `toposdns_unplaced_client_queries_total`: those of them asked by a client whose address (the
  source, or a trusted EDNS Client Subnet address) no PodLocator holds.

As in query_metrics.py, the counts are plain numbers that a collector adds up on scrape: each
(policy, tier) has a *row*, a list [answers, of them from unplaced clients], and each cached
topology reply keeps a reference to its row, so a cache hit costs `row[0] += 1` (and one more
addition for an unplaced client). Rows are keyed by label values, not by cache entry, so they
outlive every cache flush and need no folding.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily

from toposdns.store.topology import Policy
from toposdns.wire.codes import AAAA, SRV, A

#: The slots of a row.
ANSWERS, UNPLACED = 0, 1
Row = list[int]
#: The query types whose answers are counted; other types of a filtered name (TXT, MX...) are
#: not answers to count, but their cached replies still get a row, which nobody reads.
COUNTED_TYPES = frozenset((A, AAAA, SRV))


class TopologyCounts:
    """Rows of counts per (policy, tier); a prometheus_client collector reads them on scrape."""

    def __init__(self) -> None:
        #: (policy, tier) for hard answers; (policy, tier, soft) for Answer.soft's kinds.
        self.rows: dict[tuple[str, ...], Row] = {}
        #: The row of replies that are not counted, so that the hot path never asks.
        self.uncounted: Row = [0, 0]

    def row(self, qtype: int, policy: Policy, tier: str, soft: str = "") -> Row:
        """The row that counts answers of this type that `policy` gave from `tier` (`soft`:
        what soft topology did, `Answer.soft`)."""
        if qtype not in COUNTED_TYPES:
            return self.uncounted
        # "trafficDistribution PreferSameZone" is counted as trafficDistribution.
        key: tuple[str, ...] = (policy.source.partition(" ")[0], tier)
        if soft:
            key += (soft,)
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = [0, 0]
        return row

    def collect(self) -> Iterator[CounterMetricFamily]:
        """Build the metric families from the rows (called by prometheus_client on scrape)."""
        answers = CounterMetricFamily(
            "toposdns_topology_answers",
            "Topology-filtered A, AAAA and SRV answers, by where the policy came from and the "
            'tier that answered ("*": every endpoint; "none": no tier matched, NODATA).',
            labels=["policy", "tier"],
        )
        spillovers = CounterMetricFamily(
            "toposdns_topology_spillovers",
            "Topology-filtered answers that took tiers past the nearest one with an endpoint "
            "(toposdns.io/topology-min-endpoints), by policy source and the last tier taken.",
            labels=["policy", "tier"],
        )
        weighted = CounterMetricFamily(
            "toposdns_topology_weighted_answers",
            "Topology-filtered answers shaped by toposdns.io/topology-weights: SRV answers "
            "carrying weights (tier: the nearest one), A and AAAA replies in turn (tier: the "
            "one whose turn it was), by policy source and tier.",
            labels=["policy", "tier"],
        )
        kinds = {"spill-over": spillovers, "weighted": weighted}
        totals: dict[tuple[str, str], int] = {}
        unplaced = 0
        for key, row in self.rows.items():
            policy, tier = key[0], key[1]
            totals[policy, tier] = totals.get((policy, tier), 0) + row[ANSWERS]
            unplaced += row[UNPLACED]
        for (policy, tier), total in sorted(totals.items()):
            answers.add_metric([policy, tier], total)
        for key, row in sorted(self.rows.items()):
            if len(key) == 3:
                kinds[key[2]].add_metric([key[0], key[1]], row[ANSWERS])
        yield answers
        yield spillovers
        yield weighted
        yield CounterMetricFamily(
            "toposdns_unplaced_client_queries",
            "Topology-filtered queries from an address (source or trusted ECS) that no "
            "PodLocator holds.",
            value=unplaced,
        )


def count(row: Row, unplaced: bool) -> None:
    """Count one answer (the UDP frontend writes this out inline)."""
    row[ANSWERS] += 1
    if unplaced:
        row[UNPLACED] += 1
