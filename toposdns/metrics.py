"""Prometheus metrics, each defined once here (exposed over HTTP by a later version)."""

from __future__ import annotations

from prometheus_client import Counter

INVALID_POLICIES = Counter(
    "toposdns_invalid_topology_policies",
    "Topology policies ignored because they are invalid, counted once per change.",
)
