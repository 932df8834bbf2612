"""Prometheus metrics, each defined once here (exposed over HTTP by a later version)."""

from __future__ import annotations

from prometheus_client import Counter

INVALID_POLICIES = Counter(
    "toposdns_invalid_topology_policies",
    "Topology policies ignored because they are invalid, counted once per change.",
)
WATCH_RESTARTS = Counter(
    "toposdns_watch_restarts",
    "Watches of the Kubernetes API started again, by resource and reason "
    "(expired: the server ended it; gone: history compacted, relisted; timeout; error).",
    ["resource", "reason"],
)
API_ERRORS = Counter(
    "toposdns_kubernetes_api_errors",
    "Failed list or watch requests to the Kubernetes API, by resource.",
    ["resource"],
)
MALFORMED_OBJECTS = Counter(
    "toposdns_malformed_objects",
    "Kubernetes objects skipped because they cannot be served, by kind.",
    ["kind"],
)
