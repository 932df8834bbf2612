"""The immutable snapshot the resolver reads, with the indexes its lookups need.

A snapshot is built once per change off the query path and swapped in whole, so a query always
sees one consistent view of the cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from toposdns.store.model import (
    HEADLESS,
    Endpoint,
    EndpointSlice,
    Namespace,
    PodLocator,
    Record,
    Service,
    canonical_ip,
)
from toposdns.store.topology import Policy, policy_for


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
    #: (namespace, canonical IP) of every pod locator, for `--pods verified`.
    pod_ips: frozenset[tuple[str, str]] = frozenset()
    #: Headless services that ask for a topology policy, valid or not, by (namespace, name).
    policies: Mapping[tuple[str, str], Policy] = field(default_factory=dict)
    #: SOA serial: unix seconds of the last change that DNS can see.
    serial: int = 0
    #: False until every source has delivered its first full list (live source only).
    synced: bool = True


def build_snapshot(records: Iterable[Record], serial: int, synced: bool = True) -> Snapshot:
    """Index records into a Snapshot. Input order decides ties (e.g. two services on one IP)."""
    services: dict[tuple[str, str], Service] = {}
    slices: defaultdict[tuple[str, str], list[EndpointSlice]] = defaultdict(list)
    namespaces: set[str] = set()
    service_ips: defaultdict[str, list[Service]] = defaultdict(list)
    endpoint_ips: defaultdict[str, list[tuple[EndpointSlice, Endpoint, str]]] = defaultdict(list)
    pod_locators: dict[str, PodLocator] = {}
    host_locators: dict[str, PodLocator] = {}
    node_locators: dict[str, PodLocator] = {}
    pod_ips: set[tuple[str, str]] = set()

    for record in records:
        if isinstance(record, Service):
            services[(record.namespace, record.name)] = record
            for ip in record.cluster_ips:
                service_ips[canonical_ip(ip)].append(record)
        elif isinstance(record, EndpointSlice):
            slices[(record.namespace, record.service)].append(record)
            for ep in record.endpoints:
                for ip in ep.addresses:
                    endpoint_ips[canonical_ip(ip)].append((record, ep, ip))
        elif isinstance(record, Namespace):
            namespaces.add(record.name)
        elif isinstance(record, PodLocator):
            if record.is_node:
                node_locators[record.node_name or record.name] = record
                for ip in record.addresses:
                    host_locators.setdefault(canonical_ip(ip), record)
            else:
                for ip in record.addresses:
                    pod_locators.setdefault(canonical_ip(ip), record)
                    pod_ips.add((record.namespace, canonical_ip(ip)))

    policies = {}
    for key, svc in services.items():
        if svc.kind == HEADLESS:
            policy = policy_for(svc, slices.get(key, ()))
            if policy.source != "none":
                policies[key] = policy

    return Snapshot(
        services=services,
        slices={key: tuple(value) for key, value in slices.items()},
        policies=policies,
        namespaces=frozenset(namespaces),
        service_ips={key: tuple(value) for key, value in service_ips.items()},
        endpoint_ips={key: tuple(value) for key, value in endpoint_ips.items()},
        locators={**host_locators, **pod_locators},
        node_locators=node_locators,
        pod_ips=frozenset(pod_ips),
        serial=serial,
        synced=synced,
    )
