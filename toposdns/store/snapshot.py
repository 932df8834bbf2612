"""The immutable snapshot the resolver reads, with the indexes its lookups need.

A snapshot is built off the query path (store/builder.py) and swapped in whole, so a query always
sees one consistent view of the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from toposdns.store.model import Endpoint, EndpointSlice, PodLocator, Service
from toposdns.store.topology import Policy


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything DNS answers from, indexed; never mutated after it is built."""

    services: Mapping[tuple[str, str], Service] = field(default_factory=dict)
    #: EndpointSlices by (namespace, service name), in input order.
    slices: Mapping[tuple[str, str], tuple[EndpointSlice, ...]] = field(default_factory=dict)
    namespaces: frozenset[str] = frozenset()
    #: Canonical cluster IP -> the Services holding it, in input order (PTR answers the first).
    service_ips: Mapping[str, tuple[Service, ...]] = field(default_factory=dict)
    #: Canonical endpoint IP -> every (slice, endpoint, address as written) holding it.
    endpoint_ips: Mapping[str, tuple[tuple[EndpointSlice, Endpoint, str], ...]] = field(
        default_factory=dict
    )
    #: Canonical IP -> the PodLocator holding it; pod locators win over node locators.
    locators: Mapping[str, PodLocator] = field(default_factory=dict)
    #: Node name -> that node's locator.
    node_locators: Mapping[str, PodLocator] = field(default_factory=dict)
    #: Canonical IP -> every locator claiming it, for the few addresses claimed twice.
    shared_ips: Mapping[str, tuple[PodLocator, ...]] = field(default_factory=dict)
    #: Headless services that ask for a topology policy, valid or not, by (namespace, name).
    policies: Mapping[tuple[str, str], Policy] = field(default_factory=dict)
    #: SOA serial: unix seconds of the last change that DNS can see.
    serial: int = 0
    #: False until every source has delivered its first full list (live source only).
    synced: bool = True

    def holds_pod(self, namespace: str, ip: str) -> bool:
        """True if a pod's PodLocator in `namespace` holds `ip` (canonical): `--pods verified`."""
        holders = self.shared_ips.get(ip)
        if holders is None:
            locator = self.locators.get(ip)
            holders = () if locator is None else (locator,)
        return any(not held.is_node and held.namespace == namespace for held in holders)
