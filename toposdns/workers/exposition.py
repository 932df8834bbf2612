"""One /metrics for a supervisor and its workers: their metric families, summed.

Samples with the same name and labels are added up: counters, histogram buckets, sums and
counts, and gauges such as the forward cache's entries. The result reads as one server's, under
the same (CoreDNS) names. A `_created` sample keeps the earliest time instead, and a gauge that
every worker sets alike from one source (metrics.py `UNSUMMED`: a hosts file's entries) its
largest value. The families are prometheus_client's `Metric` objects, what a registry's
`collect()` gives and `generate_latest` formats; workers send theirs pickled.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from toposdns.metrics import UNSUMMED

#: A sample's identity: its name and its labels, sorted.
SampleKey = tuple[str, tuple[tuple[str, str], ...]]
#: Families whose samples only ever grow while a process lives.
GROWING = frozenset({"counter", "histogram", "summary"})


class Sum(Collector):
    """Metric families added up sample by sample, in the order they were first seen; a
    collector, so `generate_latest(summed)` gives the text Prometheus scrapes."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[Metric, dict[SampleKey, float]]] = {}

    def add(self, families: Iterable[Metric], growing_only: bool = False) -> None:
        """Add these families' samples; with `growing_only`, only counters and histograms
        (what a worker that is gone had counted, which must not go backwards in the sum)."""
        for family in families:
            if growing_only and family.type not in GROWING:
                continue
            entry = self.families.get(family.name)
            if entry is None:
                header = Metric(family.name, family.documentation, family.type, family.unit)
                entry = self.families[family.name] = (header, {})
            values = entry[1]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if sample.name.endswith("_created"):
                    values[key] = min(values.get(key, sample.value), sample.value)
                elif family.name in UNSUMMED:
                    values[key] = max(values.get(key, sample.value), sample.value)
                else:
                    values[key] = values.get(key, 0.0) + sample.value

    def collect(self) -> Iterator[Metric]:
        """The summed families, as prometheus_client collectors give them."""
        for header, values in self.families.values():
            family = Metric(header.name, header.documentation, header.type, header.unit)
            family.samples = [
                Sample(name, dict(labels), value) for (name, labels), value in values.items()
            ]
            yield family


def sample_total(families: Iterable[Metric], sample_name: str) -> float:
    """The sum of the samples named so, whatever their labels."""
    return sum(s.value for f in families for s in f.samples if s.name == sample_name)
