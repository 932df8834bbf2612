"""Topology policies of headless services: which one applies, whether it is valid, what it picks.

A headless service answers a client with the endpoints of the client's topology domain. The
policy comes from the first of these that the service sets (docs/topology.md):

1. `spec.topologyKeys` (Service Topology, Kubernetes 1.17-1.21);
2. the `toposdns.io/topology-keys` annotation (the same list, for clusters without the field);
3. `spec.trafficDistribution`: PreferSameNode is the tiers (node, zone, all), PreferSameZone and
   its older name PreferClose are (zone, all);
4. EndpointSlice hints, when every ready endpoint carries a node hint or every one a zone hint;
5. nothing: every ready endpoint, as CoreDNS answers.

Key lists are validated as the API server validated `topologyKeys`; an invalid policy is
ignored (every endpoint is returned) and its errors are kept for logs and `explain`.

Selection by keys is kube-proxy's `FilterTopologyEndpoint` (kubernetes/kubernetes
pkg/proxy/topology.go, 1.17-1.21): the first tier with any endpoint wins whole, tiers never mix,
and a client whose labels are unknown gets everything only if the last key is "*".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from toposdns.kube.names import qualified_name_errors
from toposdns.store.convert import TOPOLOGY_KEYS_ANNOTATION
from toposdns.store.model import (
    NODE_NAME,
    Endpoint,
    EndpointSlice,
    PodLocator,
    Service,
    canonical_ip,
)

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
ANY = "*"
#: The tier of a selection that chose nothing.
NO_TIER = "none"
MAX_KEYS = 16

TRAFFIC_DISTRIBUTIONS = {
    # The same node is the same node name, as kube-proxy compares it (NODE_NAME).
    "PreferSameNode": (NODE_NAME, ZONE, ANY),
    "PreferSameZone": (ZONE, ANY),
    "PreferClose": (ZONE, ANY),
}

Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Policy:
    """How a headless service chooses endpoints for a client."""

    #: Where it came from: topologyKeys, annotation, trafficDistribution, hints or none.
    source: str
    #: Tiers, in order (kube-proxy's topologyKeys semantics).
    keys: tuple[str, ...] = ()
    #: Zone hints mode: the endpoints hinted for the client's zone, else all.
    hints: bool = False
    #: Node hints mode (before zone hints, if both): the endpoints hinted for the client's node.
    node_hints: bool = False
    #: Why the policy is ignored; empty when it is valid.
    errors: tuple[str, ...] = ()
    #: The keys a client's labels are compared on ("*" compares nothing).
    match_keys: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "match_keys", tuple(k for k in self.keys if k != ANY))

    @property
    def active(self) -> bool:
        """True when answers depend on the client."""
        return bool(self.keys or self.hints or self.node_hints) and not self.errors

    def signature(self, labels: Labels) -> tuple[object, ...]:
        """What of a client's labels decides its answer: clients with equal signatures get
        equal answers, so answers are cached per signature, never per address."""
        if self.node_hints:
            return (labels.get(ZONE), labels.get(NODE_NAME))
        if self.hints:
            return (labels.get(ZONE),)
        # Runs on the hot path for every topology-filtered query: keep it to one map().
        return (bool(labels), *map(labels.get, self.match_keys))

    def describe(self) -> str:
        """One line for people: the source and what it asks for."""
        if self.node_hints:
            then = ", then hints.forZones" if self.hints else ""
            return f"EndpointSlice hints.forNodes{then}"
        if self.hints:
            return "EndpointSlice hints.forZones"
        if not self.keys and not self.errors:
            return "none: every ready endpoint"
        return f"{self.source} [{', '.join(self.keys)}]"


NO_POLICY = Policy("none")


def policy_for(service: Service, slices: Iterable[EndpointSlice]) -> Policy:
    """The policy a headless service asks for (first source that applies)."""
    if service.topology_keys:
        return _keys_policy(service, "topologyKeys", service.topology_keys, "spec.topologyKeys")
    if service.topology_annotation is not None:
        field = f"metadata.annotations[{TOPOLOGY_KEYS_ANNOTATION}]"
        keys = tuple(k for k in service.topology_annotation if k) or service.topology_annotation
        return _keys_policy(service, "annotation", keys, field)
    if service.traffic_distribution:
        tiers = TRAFFIC_DISTRIBUTIONS.get(service.traffic_distribution)
        if tiers is None:
            known = ", ".join(TRAFFIC_DISTRIBUTIONS)
            error = (
                f'spec.trafficDistribution: Unsupported value: "{service.traffic_distribution}": '
                f"supported values: {known}"
            )
            return Policy("trafficDistribution", errors=(error,))
        return Policy(f"trafficDistribution {service.traffic_distribution}", tiers)
    endpoints = [ep for eps in slices for ep in eps.endpoints]
    if not endpoints:
        return NO_POLICY
    # kube-proxy uses each kind of hint only when every ready endpoint carries one.
    zones = all(ep.hint_zones for ep in endpoints)
    nodes = all(ep.hint_nodes for ep in endpoints)
    if zones or nodes:
        return Policy("hints", hints=zones, node_hints=nodes)
    return NO_POLICY


def invalid_changes(
    old: Mapping[tuple[str, str], Policy],
    new: Mapping[tuple[str, str], Policy],
    keys: Iterable[tuple[str, str]] | None = None,
) -> list[tuple[tuple[str, str], Policy]]:
    """Invalid policies in `new` that `old` did not have in that form: each is reported once.
    `keys`: the only services that may differ (default: look at every one)."""
    found = []
    for key in new.keys() if keys is None else keys:
        policy = new.get(key)
        if policy is not None and policy.errors and old.get(key) != policy:
            found.append((key, policy))
    return found


def _keys_policy(service: Service, source: str, keys: tuple[str, ...], field: str) -> Policy:
    return Policy(source, keys, errors=tuple(validate_keys(keys, field, service)))


def validate_keys(keys: Sequence[str], field: str, service: Service) -> list[str]:
    """The API server's `topologyKeys` checks, with its messages. Errors accumulate."""
    errors = []
    if service.external_traffic_policy == "Local":
        errors.append(
            f"{field}: Forbidden: may not be specified when `externalTrafficPolicy=Local`"
        )
    if len(keys) > MAX_KEYS:
        errors.append(f"{field}: Too many: {len(keys)}: must have at most {MAX_KEYS} items")
    seen: set[str] = set()
    for i, key in enumerate(keys):
        where = f"{field}[{i}]"
        if key in seen:
            errors.append(f'{where}: Duplicate value: "{key}"')
        seen.add(key)
        if key == ANY:
            if i != len(keys) - 1:
                errors.append(f'{where}: Invalid value: "*": "*" must be the last value specified')
            continue
        for message in qualified_name_errors(key):
            # The API server reports the whole list as the value here, not the key, printed
            # the way Go's %#v prints a []string.
            errors.append(f"{where}: Invalid value: {_go_strings(keys)}: {message}")
    return errors


def _go_strings(values: Sequence[str]) -> str:
    return "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"


def endpoint_labels(
    endpoint: Endpoint, locators: Mapping[str, PodLocator], node_locators: Mapping[str, PodLocator]
) -> Labels:
    """Where an endpoint runs: its pod's locator, else its node's locator, else the slice."""
    for address in endpoint.addresses:
        locator = locators.get(canonical_ip(address))
        if locator is not None and not locator.is_node:
            return locator.labels
    node = node_locators.get(endpoint.node_name) if endpoint.node_name else None
    if node is not None:
        return node.labels
    labels = {}
    if endpoint.node_name:
        labels[HOSTNAME] = labels[NODE_NAME] = endpoint.node_name
    if endpoint.zone:
        labels[ZONE] = endpoint.zone
    return labels


@dataclass(frozen=True, slots=True)
class Selection:
    """The endpoints chosen for a client, and which rule chose them (for `explain`)."""

    chosen: tuple[int, ...]
    rule: str
    #: The tier that matched: a label key, "*" for every endpoint (the catch-all, hints falling
    #: back, or no policy to apply), or "none" when no tier matched (the answer is NODATA).
    #: Zone hints that matched count as the zone key's tier.
    tier: str


def _by_hints(
    policy: Policy, client: Labels, candidates: Sequence[tuple[Endpoint, Labels]]
) -> Selection:
    """Node hints, then zone hints (those every endpoint carries), else every endpoint."""
    # (used, the client's value they are compared with, what it is, the endpoint's hints)
    kinds = (
        (policy.node_hints, NODE_NAME, "node", "hint_nodes"),
        (policy.hints, ZONE, "zone", "hint_zones"),
    )
    missed = ""
    for used, key, kind, field_name in kinds:
        if not used:
            continue
        value = client.get(key)
        hinted = tuple(
            i
            for i, (ep, _) in enumerate(candidates)
            if value and value in (getattr(ep, field_name) or ())
        )
        if hinted:
            return Selection(hinted, f"hinted for {kind} {value}", key)
        missed = f"no endpoint hinted for {kind} {value!r}"
    return Selection(tuple(range(len(candidates))), f"{missed}: every endpoint", ANY)


def select(
    policy: Policy, client: Labels, candidates: Sequence[tuple[Endpoint, Labels]]
) -> Selection:
    """Choose among candidates (endpoint, its topology labels); returns indexes into them."""
    everyone = tuple(range(len(candidates)))
    if policy.errors:
        return Selection(everyone, "policy ignored (invalid): every endpoint", ANY)
    if policy.node_hints or policy.hints:
        return _by_hints(policy, client, candidates)
    keys = policy.keys
    if not keys:
        return Selection(everyone, "no policy: every endpoint", ANY)
    if not client:
        if keys[-1] == ANY:
            return Selection(
                everyone, 'client labels unknown, last key is "*": every endpoint', ANY
            )
        return Selection((), 'client labels unknown and no "*": no endpoint', NO_TIER)
    for key in keys:
        if key == ANY:
            return Selection(everyone, '"*": every endpoint', ANY)
        value = client.get(key)
        if value is None:
            continue
        tier = tuple(i for i, (_, labels) in enumerate(candidates) if labels.get(key) == value)
        if tier:
            return Selection(tier, f"{key}={value}", key)
    return Selection((), "no tier matched: no endpoint", NO_TIER)
