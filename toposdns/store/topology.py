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

Three annotations soften that (docs/topology.md, "Soft topology"): spill-over to a minimum of
endpoints, SRV priorities by tier, and weights between tiers. Each is validated on its own; an
invalid one is ignored (the hard policy answers) and its errors are kept for logs and `explain`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from toposdns.kube.names import qualified_name_errors
from toposdns.store.convert import (
    MIN_ENDPOINTS_ANNOTATION,
    SRV_ANNOTATION,
    TOPOLOGY_KEYS_ANNOTATION,
    WEIGHTS_ANNOTATION,
)
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
#: The largest `topology-min-endpoints` count (a DNS answer holds far fewer anyway).
MAX_MIN_ENDPOINTS = 10_000
#: Weights are shares of this many replies.
ROTATION = 100

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
    #: Spill-over: take tiers until the answer holds this many endpoints (0: hard), or with
    #: `min_percent` this percentage of the ready endpoints.
    min_endpoints: int = 0
    min_percent: bool = False
    #: SRV priorities by tier (`toposdns.io/topology-srv: priority`).
    srv_priority: bool = False
    #: One weight per tier, summing to ROTATION; empty without weights.
    weights: tuple[int, ...] = ()
    #: Why soft-topology annotations are ignored (the hard policy answers); empty when none is.
    soft_errors: tuple[str, ...] = ()
    #: The keys a client's labels are compared on ("*" compares nothing).
    match_keys: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "match_keys", tuple(k for k in self.keys if k != ANY))

    @property
    def active(self) -> bool:
        """True when answers depend on the client."""
        return bool(self.keys or self.hints or self.node_hints) and not self.errors

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tiers in order, as weights count them: the keys, or for hints the node hints,
        the zone hints and every endpoint."""
        if self.node_hints or self.hints:
            kinds = ((self.node_hints, NODE_NAME), (self.hints, ZONE))
            return tuple(key for used, key in kinds if used) + (ANY,)
        return self.keys

    @property
    def mode(self) -> str:
        """How the tiers are used: hard, spill-over, SRV priorities or weights."""
        if self.weights:
            return "weights " + ",".join(map(str, self.weights))
        parts = []
        if self.min_endpoints:
            unit = "%" if self.min_percent else ""
            parts.append(f"spill-over to {self.min_endpoints}{unit} endpoints")
        if self.srv_priority:
            parts.append("SRV priorities by tier")
        return ", ".join(parts) or "hard"

    def signature(self, labels: Labels) -> tuple[object, ...]:
        """What of a client's labels decides its answer: clients with equal signatures get
        equal answers, so answers are cached per signature, never per address. The soft modes
        read nothing more of the client: its values for the same tiers decide which tiers it
        has, and the rest (the mode, the weights, the endpoints) is the service's, whose
        change drops its cached answers."""
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


def _soft(policy: Policy, service: Service) -> Policy:
    """The policy with the service's soft-topology annotations that are valid for it."""
    given = (service.topology_min_endpoints, service.topology_srv, service.topology_weights)
    if given == (None, None, None):
        return policy
    errors: list[str] = []
    if not policy.active:
        for name, value in zip(
            (MIN_ENDPOINTS_ANNOTATION, SRV_ANNOTATION, WEIGHTS_ANNOTATION), given, strict=True
        ):
            if value is not None:
                errors.append(
                    f"metadata.annotations[{name}]: Forbidden: needs a valid topology policy "
                    "(topologyKeys, the toposdns.io/topology-keys annotation, "
                    "trafficDistribution or hints)"
                )
        return replace(policy, soft_errors=tuple(errors)) if policy.errors == () else policy
    minimum, percent = 0, False
    if service.topology_min_endpoints is not None:
        minimum, percent = _min_endpoints(service.topology_min_endpoints, errors)
    srv_priority = False
    if service.topology_srv is not None:
        field_name = f"metadata.annotations[{SRV_ANNOTATION}]"
        if service.topology_srv != "priority":
            errors.append(
                f'{field_name}: Unsupported value: "{service.topology_srv}": '
                'supported values: "priority"'
            )
        elif service.topology_weights is not None:
            errors.append(
                f"{field_name}: Forbidden: may not be specified with {WEIGHTS_ANNOTATION}, "
                "which puts every tier in priority 0"
            )
        else:
            srv_priority = True
    weights: tuple[int, ...] = ()
    if service.topology_weights is not None:
        weights = _weights(service.topology_weights, policy.tiers, errors)
        if weights and minimum:
            field_name = f"metadata.annotations[{MIN_ENDPOINTS_ANNOTATION}]"
            errors.append(
                f"{field_name}: Forbidden: may not be specified with {WEIGHTS_ANNOTATION}, "
                "whose tiers each answer their share"
            )
            minimum, percent = 0, False
    return replace(
        policy,
        min_endpoints=minimum,
        min_percent=percent,
        srv_priority=srv_priority,
        weights=weights,
        soft_errors=tuple(errors),
    )


def _min_endpoints(text: str, errors: list[str]) -> tuple[int, bool]:
    """`N` or `P%`; (0, False) with an error when it is neither."""
    field_name = f"metadata.annotations[{MIN_ENDPOINTS_ANNOTATION}]"
    number, percent = (text[:-1], True) if text.endswith("%") else (text, False)
    top = 100 if percent else MAX_MIN_ENDPOINTS
    if number.isascii() and number.isdigit() and 1 <= int(number) <= top:
        return int(number), percent
    errors.append(
        f'{field_name}: Invalid value: "{text}": must be a number of endpoints from 1 to '
        f'{MAX_MIN_ENDPOINTS} ("3") or a percentage of the ready endpoints from 1% to 100% '
        '("50%")'
    )
    return 0, False


def _weights(text: str, tiers: tuple[str, ...], errors: list[str]) -> tuple[int, ...]:
    """One whole number per tier, summing to ROTATION; () with errors otherwise."""
    field_name = f"metadata.annotations[{WEIGHTS_ANNOTATION}]"
    parts = [part.strip() for part in text.split(",")]
    found = len(errors)
    if len(parts) != len(tiers):
        errors.append(
            f'{field_name}: Invalid value: "{text}": must have one weight per tier, '
            f"{len(tiers)} for [{', '.join(tiers)}]"
        )
    for i, part in enumerate(parts):
        if not (part.isascii() and part.isdigit() and int(part) <= ROTATION):
            errors.append(
                f'{field_name}[{i}]: Invalid value: "{part}": must be a whole number from 0 '
                f"to {ROTATION}"
            )
    if len(errors) == found and sum(map(int, parts)) != ROTATION:
        errors.append(
            f'{field_name}: Invalid value: "{text}": the weights must add up to {ROTATION}, '
            f"not {sum(map(int, parts))}"
        )
    return tuple(map(int, parts)) if len(errors) == found else ()


def policy_for(service: Service, slices: Iterable[EndpointSlice]) -> Policy:
    """The policy a headless service asks for (first source that applies), with its
    soft-topology annotations."""
    return _soft(_hard_policy_for(service, slices), service)


def _hard_policy_for(service: Service, slices: Iterable[EndpointSlice]) -> Policy:
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
        if policy is not None and (policy.errors or policy.soft_errors) and old.get(key) != policy:
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
    #: Zone hints that matched count as the zone key's tier. With spill-over, the last tier
    #: taken.
    tier: str
    #: Soft topology (empty for a hard policy): the tiers taken into `chosen`, in order.
    taken: tuple[str, ...] = ()
    #: True when spill-over took more than the nearest tier with an endpoint.
    spilled: bool = False
    #: SRV priorities or weights: (candidate index, its SRV priority, its group, the weight
    #: its group shares) for every endpoint the policy allows; empty when SRV answers as A
    #: and AAAA do. A group's weight is shared among the SRV records of its endpoints.
    srv: tuple[tuple[int, int, int, int], ...] = ()
    #: Weights: (share of ROTATION replies, the candidates that answer it: every endpoint the
    #: tier holds) per tier that adds endpoints, in the policy's order; an empty tier's share
    #: already moved to the next.
    rotation: tuple[tuple[int, tuple[int, ...]], ...] = ()


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
    hard = _select_hard(policy, client, candidates)
    if not policy.active or not (policy.min_endpoints or policy.srv_priority or policy.weights):
        return hard
    return _soften(policy, hard, client_tiers(policy, client, candidates), len(candidates))


def client_tiers(
    policy: Policy, client: Labels, candidates: Sequence[tuple[Endpoint, Labels]]
) -> list[tuple[str, tuple[int, ...]]]:
    """Each tier of an active policy for this client, in order: (its key, the candidates it
    holds). A tier the client has no value for holds none; "*" holds every candidate."""
    everyone = tuple(range(len(candidates)))
    tiers: list[tuple[str, tuple[int, ...]]] = []
    if policy.node_hints or policy.hints:
        kinds = ((policy.node_hints, NODE_NAME, "hint_nodes"), (policy.hints, ZONE, "hint_zones"))
        for used, key, field_name in kinds:
            if used:
                value = client.get(key)
                hinted = tuple(
                    i
                    for i, (ep, _) in enumerate(candidates)
                    if value and value in (getattr(ep, field_name) or ())
                )
                tiers.append((key, hinted))
        return [*tiers, (ANY, everyone)]
    for key in policy.keys:
        value = client.get(key) if client else None
        if key == ANY:
            tiers.append((key, everyone))
        elif value is None:
            tiers.append((key, ()))
        else:
            tiers.append(
                (
                    key,
                    tuple(
                        i for i, (_, labels) in enumerate(candidates) if labels.get(key) == value
                    ),
                )
            )
    return tiers


def rotation_schedule(shares: Sequence[int]) -> tuple[int, ...]:
    """Which of the shares answers each of ROTATION turns: share i answers exactly shares[i]
    turns, spread out (smooth weighted round robin, as nginx's upstream module), so that any
    run of replies is near the shares too. Deterministic: the same shares, the same order."""
    total = sum(shares)
    if total <= 0:
        return ()
    current = [0] * len(shares)
    order = []
    for _ in range(total):
        for i, share in enumerate(shares):
            current[i] += share
        best = max(range(len(shares)), key=lambda i: (current[i], -i))
        current[best] -= total
        order.append(best)
    return tuple(order)


#: Schedules made so far, by their shares (few services carry weights; a bound all the same).
_SCHEDULES: dict[tuple[int, ...], tuple[int, ...]] = {}
SCHEDULES_KEPT = 1024


def schedule_of(shares: tuple[int, ...]) -> tuple[int, ...]:
    """`rotation_schedule`, made once per set of shares."""
    found = _SCHEDULES.get(shares)
    if found is None:
        if len(_SCHEDULES) >= SCHEDULES_KEPT:
            _SCHEDULES.clear()
        found = _SCHEDULES[shares] = rotation_schedule(shares)
    return found


def _soften(
    policy: Policy, hard: Selection, tiers: list[tuple[str, tuple[int, ...]]], ready: int
) -> Selection:
    """The soft selection from the client's tiers (docs/topology.md, "Soft topology")."""
    # Each endpoint counts in the nearest tier that holds it.
    seen: set[int] = set()
    own: list[tuple[str, tuple[int, ...]]] = []
    for key, held in tiers:
        fresh = tuple(i for i in held if i not in seen)
        seen.update(fresh)
        own.append((key, fresh))
    if policy.weights:
        return _weighted(policy, hard, own, tiers)
    # Spill-over: tiers in order, added together, until the answer holds the minimum (without
    # one, the nearest tier with an endpoint, as the hard policy takes).
    minimum = policy.min_endpoints
    if policy.min_percent:
        minimum = math.ceil(ready * policy.min_endpoints / 100)
    chosen: set[int] = set()
    taken: list[str] = []
    beyond: list[tuple[int, ...]] = []
    for key, fresh in own:
        if not fresh:
            continue
        if len(chosen) >= max(minimum, 1):
            beyond.append(fresh)
        else:
            chosen.update(fresh)
            taken.append(key)
    rule, tier = hard.rule, hard.tier
    if minimum and chosen:
        rule = f"spill-over to {minimum} endpoints: {' + '.join(taken)} hold {len(chosen)}"
        tier = taken[-1]
    srv: tuple[tuple[int, int, int, int], ...] = ()
    if policy.srv_priority and chosen:
        groups = [tuple(sorted(chosen)), *beyond]
        srv = tuple(
            sorted(
                (i, priority, priority, 100) for priority, group in enumerate(groups) for i in group
            )
        )
    return Selection(tuple(sorted(chosen)), rule, tier, tuple(taken), len(taken) > 1, srv)


def _weighted(
    policy: Policy,
    hard: Selection,
    own: list[tuple[str, tuple[int, ...]]],
    tiers: list[tuple[str, tuple[int, ...]]],
) -> Selection:
    """Weights: SRV holds every tier in priority 0, each endpoint in the nearest tier that
    holds it (`own`); A and AAAA rotate between the tiers, each answering with every endpoint
    it holds (`tiers`: those matching its key, all of them for "*")."""
    shares = list(policy.weights)
    # An empty tier's share goes to the next tier with endpoints (past the last, the last one
    # before it that has some).
    carried = 0
    for i, (_, fresh) in enumerate(own):
        if not fresh:
            carried += shares[i]
            shares[i] = 0
        else:
            shares[i] += carried
            carried = 0
    if carried:
        for i in range(len(own) - 1, -1, -1):
            if own[i][1]:
                shares[i] += carried
                break
    groups = [(shares[i], fresh, tiers[i][1]) for i, (_, fresh) in enumerate(own) if fresh]
    if not groups:
        return hard
    rotation = tuple((share, held) for share, _, held in groups)
    srv = tuple(
        sorted(
            (i, 0, group, share) for group, (share, fresh, _) in enumerate(groups) for i in fresh
        )
    )
    taken = tuple(key for key, fresh in own if fresh)
    rule = "weighted: " + ", ".join(
        f"{key} {share}" for (key, fresh), share in zip(own, shares, strict=True) if fresh
    )
    return Selection(hard.chosen, rule, hard.tier, taken, False, srv, rotation)


def _select_hard(
    policy: Policy, client: Labels, candidates: Sequence[tuple[Endpoint, Labels]]
) -> Selection:
    """The hard selection: the nearest tier with an endpoint, whole."""
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
