"""The immutable snapshot the resolver reads, with the indexes its lookups need.

A snapshot is built off the query path (store/builder.py) and swapped in whole, so a query always
sees one consistent view of the cluster. Its indexes are persistent maps (`immutables.Map`, a
hash array mapped trie): a new snapshot shares every unchanged part of them with the previous
one, so publishing a change costs about the same in a large cluster as in a small one.

A snapshot also says what changed since the one before it (`changes`), in the vocabulary of
`Dependency`, so that caches built from the old snapshot drop only what the change touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import count

from immutables import Map

from toposdns.store.model import Endpoint, EndpointSlice, PodLocator, Service
from toposdns.store.placement import EVERYWHERE, NO_PREFIXES, Placement, Prefixes, place
from toposdns.store.topology import Policy

#: What an answer read from a snapshot, and what a change touches (the same words for both):
#: ("svc", namespace, name): a Service, its EndpointSlices and its topology policy;
#: ("ns", name): whether a Namespace exists;
#: ("ip", address): the Services and endpoints holding an address (PTR, own NS records);
#: ("loc", address): the PodLocators claiming an address (client and endpoint placement);
#: ("cidr", prefix): the PodLocators claiming a prefix (client placement);
#: ("node", name): a node's PodLocator;
#: ("ignored", namespace, name): a PodLocator held but not believed (no answer reads it).
Dependency = tuple[str, ...]
#: The `changes` of a snapshot that changed too much to say what (a full list): anything may
#: have changed.
EVERYTHING: frozenset[Dependency] = frozenset({("*",)})

_lineages = count(1)


def new_lineage() -> int:
    """A number no other builder of this process has: snapshots of one lineage follow each
    other change by change; a snapshot of another lineage replaces everything."""
    return next(_lineages)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything DNS answers from, indexed; never mutated after it is built."""

    services: Mapping[tuple[str, str], Service] = field(default_factory=Map)
    #: EndpointSlices by (namespace, service name), in input order.
    slices: Mapping[tuple[str, str], tuple[EndpointSlice, ...]] = field(default_factory=Map)
    #: Namespace name -> True (a persistent set).
    namespaces: Mapping[str, bool] = field(default_factory=Map)
    #: Canonical cluster IP -> the Services holding it, in input order (PTR answers the first).
    service_ips: Mapping[str, tuple[Service, ...]] = field(default_factory=Map)
    #: Canonical endpoint IP -> the EndpointSlice holding it, or the slices (a tuple, in input
    #: order) for the few addresses several hold: a slice, not an entry per endpoint, which
    #: cost 17 MB at 150,000 endpoints. `endpoints_at` reads it.
    endpoint_ips: Mapping[str, EndpointSlice | tuple[EndpointSlice, ...]] = field(
        default_factory=Map
    )
    #: Canonical IP -> the PodLocator holding it; pod locators win over node locators.
    locators: Mapping[str, PodLocator] = field(default_factory=Map)
    #: Node name -> that node's locator.
    node_locators: Mapping[str, PodLocator] = field(default_factory=Map)
    #: Canonical IP -> every locator claiming it, for the few addresses claimed twice.
    shared_ips: Mapping[str, tuple[PodLocator, ...]] = field(default_factory=Map)
    #: The locators' CIDRs, for longest-prefix placement.
    prefixes: Prefixes = NO_PREFIXES
    #: The namespaces whose PodLocators are believed (`--locator-namespaces`; "*": all).
    locator_namespaces: frozenset[str] = EVERYWHERE
    #: PodLocators of other namespaces, by (namespace, name): in no index above, for explain.
    ignored: Mapping[tuple[str, str], PodLocator] = field(default_factory=Map)
    #: Headless services that ask for a topology policy, valid or not, by (namespace, name).
    policies: Mapping[tuple[str, str], Policy] = field(default_factory=Map)
    #: SOA serial: unix seconds of the last change that DNS can see.
    serial: int = 0
    #: False until every source has delivered its first full list (live source only).
    synced: bool = True
    #: Which builder made it (0: none) and its place in that builder's sequence.
    lineage: int = 0
    generation: int = 0
    #: What changed since the snapshot of the same lineage one generation before.
    changes: frozenset[Dependency] = frozenset()

    def follows(self, previous: Snapshot) -> bool:
        """True if this snapshot is `previous` plus exactly `changes`."""
        return (
            self.lineage != 0
            and self.lineage == previous.lineage
            and self.generation == previous.generation + 1
        )

    def changed_since(self, previous: Snapshot) -> frozenset[Dependency] | None:
        """What changed since `previous`; None when anything may have (it is not the snapshot
        just before this one, or so much changed that the builder did not say what)."""
        if not self.follows(previous) or self.changes is EVERYTHING:
            return None
        return self.changes

    def endpoints_at(self, ip: str) -> list[tuple[EndpointSlice, Endpoint, str]]:
        """Every (slice, endpoint, address as written) holding `ip` (canonical), in the order
        the slices were put, then of their endpoints and addresses."""
        held = self.endpoint_ips.get(ip)
        if held is None:
            return []
        slices = (held,) if isinstance(held, EndpointSlice) else held
        return [(eps, ep, address) for eps in slices for ep, address in eps.holding(ip)]

    def place(self, address: str, length: int | None = None) -> Placement:
        """Which locator places `address` (canonical), or the prefix `address/length`."""
        return place(self.locators, self.prefixes, address, length)

    def holds_pod(self, namespace: str, ip: str) -> bool:
        """True if the PodLocator of a pod in `namespace` holds `ip` (canonical): `--pods
        verified`."""
        holders = self.shared_ips.get(ip)
        if holders is None:
            locator = self.locators.get(ip)
            holders = () if locator is None else (locator,)
        return any(not held.is_node and held.namespace_of_pod == namespace for held in holders)
