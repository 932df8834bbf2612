"""Slim, immutable records of the Kubernetes objects DNS needs.

Like CoreDNS's `object/` package, everything DNS does not read is dropped at conversion, so a
snapshot of a large cluster stays small. Not-ready endpoints are dropped too: CoreDNS reads only
`conditions.ready` and never serves an endpoint whose value is false.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import FrozenInstanceError, dataclass, field
from socket import AF_INET, inet_pton
from typing import Any


def canonical_ip(text: str) -> str:
    """The canonical text of an address, so `fd00:0::1` and `fd00::1` index alike.

    Raises ValueError if `text` is not an address. An IPv4 address already in canonical form,
    nearly every address a cluster has, is recognised by the C library and returned as it is
    (parsed by `ipaddress`, it would cost ten times as much: a large sync parses 300,000)."""
    if is_canonical_ipv4(text):
        return text
    return str(ipaddress.ip_address(text))


def is_canonical_ipv4(text: str) -> bool:
    """True if `text` is an IPv4 address in canonical form (`10.1.0.1`, not `10.1.0.01`).

    One C call: the C library's `inet_pton` takes only this form of IPv4 address (four decimal
    parts of 0-255, no leading zeros, nothing else), glibc's and musl's alike, which
    tests/unit/test_convert.py holds against `ipaddress`."""
    try:
        inet_pton(AF_INET, text)
    except (OSError, ValueError):  # not dotted-quad IPv4 (or a NUL in it)
        return False
    return True


def _written_canonically(text: str) -> bool:
    """True if `text` is an address in canonical form; False for any other text."""
    try:
        return canonical_ip(text) == text
    except ValueError:
        return False


#: The key under which a locator's `labels` carry its `nodeName`: "same node" compares node names,
#: as kube-proxy does, and not the kubernetes.io/hostname label, which differs on some clouds.
#: Not a valid label key, so no node label can take its place.
NODE_NAME = "(nodeName)"

#: (id of a node label set, node name) -> (that label set, it with the node name): every locator
#: of a node shares one, so that caches can recognise a node's clients by identity.
_WITH_NODE: dict[tuple[int, str], tuple[Mapping[str, str], Mapping[str, str]]] = {}


def labels_with_node(node_labels: Mapping[str, str], node_name: str) -> Mapping[str, str]:
    """`node_labels` plus the node's name under NODE_NAME (itself without a name)."""
    if not node_name:
        return node_labels
    key = (id(node_labels), node_name)
    found = _WITH_NODE.get(key)
    if found is not None and found[0] is node_labels:  # held, so its id is still its own
        return found[1]
    if len(_WITH_NODE) >= 100_000:
        _WITH_NODE.clear()  # bounded; locators keep the sets they hold
    labels = {**node_labels, NODE_NAME: node_name}
    _WITH_NODE[key] = (node_labels, labels)
    return labels


#: Kinds of Service as DNS sees them.
CLUSTER_IP = "ClusterIP"  # also NodePort and LoadBalancer: all answer with their cluster IPs
HEADLESS = "Headless"
EXTERNAL_NAME = "ExternalName"


@dataclass(frozen=True, slots=True)
class Port:
    """A named port. CoreDNS gives objects without ports one sentinel port of number -1."""

    name: str
    protocol: str
    port: int


#: The sentinel CoreDNS uses for a Service or EndpointSlice that declares no ports.
NO_PORT = Port("", "", -1)


@dataclass(frozen=True, slots=True)
class Service:
    """A v1 Service, reduced to what DNS answers from."""

    namespace: str
    name: str
    kind: str
    cluster_ips: tuple[str, ...]
    ports: tuple[Port, ...]
    external_name: str = ""
    #: `spec.topologyKeys` (None when absent, which differs from an empty list only for explain).
    topology_keys: tuple[str, ...] | None = None
    #: The `toposdns.io/topology-keys` annotation, split on commas.
    topology_annotation: tuple[str, ...] | None = None
    traffic_distribution: str = ""
    external_traffic_policy: str = ""
    #: The soft-topology annotations as written (None when absent), validated in
    #: store/topology.py: `toposdns.io/topology-min-endpoints`, `-srv` and `-weights`.
    topology_min_endpoints: str | None = None
    topology_srv: str | None = None
    topology_weights: str | None = None


class Endpoint:
    """One ready endpoint of an EndpointSlice; immutable, compared and hashed by its fields.

    Not a dataclass, to be smaller: a cluster holds one per pod behind a Service. Its one
    address (nearly always one) is held without a tuple around it, and its two hint lists,
    nearly always absent, in one slot: 56 bytes less each, 8 MB at 150,000 endpoints."""

    __slots__ = ("_addresses", "hostname", "pod_name", "node_name", "zone", "_hints")
    _addresses: str | tuple[str, ...]
    hostname: str
    #: `targetRef.name` when the target is a Pod (used by `--endpoint-pod-names`).
    pod_name: str
    node_name: str
    zone: str
    _hints: tuple[tuple[str, ...] | None, tuple[str, ...] | None] | None

    def __init__(
        self,
        addresses: tuple[str, ...],
        hostname: str = "",
        pod_name: str = "",
        node_name: str = "",
        zone: str = "",
        hint_zones: tuple[str, ...] | None = None,
        hint_nodes: tuple[str, ...] | None = None,
    ) -> None:
        put = object.__setattr__
        put(self, "_addresses", addresses[0] if len(addresses) == 1 else tuple(addresses))
        put(self, "hostname", hostname)
        put(self, "pod_name", pod_name)
        put(self, "node_name", node_name)
        put(self, "zone", zone)
        hints = None if hint_zones is None and hint_nodes is None else (hint_zones, hint_nodes)
        put(self, "_hints", hints)

    @property
    def addresses(self) -> tuple[str, ...]:
        """Its addresses, as written."""
        held = self._addresses
        return (held,) if isinstance(held, str) else held

    @property
    def hint_zones(self) -> tuple[str, ...] | None:
        """`hints.forZones[].name`; None when the endpoint carries no zone hint."""
        return None if self._hints is None else self._hints[0]

    @property
    def hint_nodes(self) -> tuple[str, ...] | None:
        """`hints.forNodes[].name`; None when the endpoint carries no node hint."""
        return None if self._hints is None else self._hints[1]

    def _fields(self) -> tuple[object, ...]:
        return (
            self.addresses,
            self.hostname,
            self.pod_name,
            self.node_name,
            self.zone,
            self.hint_zones,
            self.hint_nodes,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Endpoint):
            return NotImplemented
        # The slots as held (a relist compares every endpoint): one address is held alike.
        return (
            self._addresses == other._addresses
            and self.pod_name == other.pod_name
            and self.node_name == other.node_name
            and self.zone == other.zone
            and self.hostname == other.hostname
            and self._hints == other._hints
        )

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        names = ("addresses", "hostname", "pod_name", "node_name", "zone", "hint_zones")
        values = zip((*names, "hint_nodes"), self._fields(), strict=True)
        return f"Endpoint({', '.join(f'{name}={value!r}' for name, value in values)})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __reduce__(self) -> tuple[type[Endpoint], tuple[object, ...]]:
        # By the constructor: the default would set the slots through __setattr__.
        return Endpoint, self._fields()


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    """A discovery.k8s.io/v1 EndpointSlice with only its ready endpoints."""

    namespace: str
    name: str
    service: str
    ports: tuple[Port, ...]
    endpoints: tuple[Endpoint, ...]
    #: True when every address is written in canonical form (as good as every slice): the
    #: snapshot then finds an address in it by equality, without parsing the others.
    canonical: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        canonical = all(
            _written_canonically(address)
            for endpoint in self.endpoints
            for address in endpoint.addresses
        )
        object.__setattr__(self, "canonical", canonical)

    def holding(self, ip: str) -> list[tuple[Endpoint, str]]:
        """(endpoint, address as written) of each address whose canonical form is `ip`."""
        if self.canonical:
            return [(ep, a) for ep in self.endpoints for a in ep.addresses if a == ip]
        return [(ep, a) for ep in self.endpoints for a in ep.addresses if canonical_ip(a) == ip]


@dataclass(frozen=True, slots=True)
class Namespace:
    """A v1 Namespace: DNS only needs to know that it exists."""

    name: str


class PodLocator:
    """A toposdns.io/v1alpha1 PodLocator: where a pod (or, for node locators, a node) runs.

    It places its `addresses` exactly, and every address inside its `cidrs` unless a locator
    holds that address exactly or a longer prefix contains it (docs/topology.md).

    Immutable, compared by its fields (not `labels`, made from them). Not a dataclass, to be
    smaller, as `Endpoint`: a cluster may hold one per pod, and its one address is held without
    a tuple around it (48 bytes less each, 7 MB at 150,000)."""

    __slots__ = (
        "namespace",
        "name",
        "_addresses",
        "node_name",
        "node_labels",
        "is_node",
        "cidrs",
        "pod_namespace",
        "labels",
    )
    namespace: str
    name: str
    _addresses: str | tuple[str, ...]
    node_name: str
    node_labels: Mapping[str, str]
    #: True for the controller's per-node locators (label `toposdns.io/locator: node`).
    is_node: bool
    #: Prefixes whose every address this locator places, in canonical network form
    #: (`10.244.3.0/24`): a node's pod range, where the CNI allocates per node.
    cidrs: tuple[str, ...]
    #: The label `toposdns.io/pod-namespace`: the namespace of the pod it places, which the
    #: controller says of the locators it writes in its own namespace; "" when not given.
    pod_namespace: str
    #: What topology compares: `node_labels` and `node_name` under NODE_NAME.
    labels: Mapping[str, str]

    def __init__(
        self,
        namespace: str,
        name: str,
        addresses: tuple[str, ...],
        node_name: str,
        node_labels: Mapping[str, str],
        is_node: bool = False,
        cidrs: tuple[str, ...] = (),
        pod_namespace: str = "",
    ) -> None:
        put = object.__setattr__
        put(self, "namespace", namespace)
        put(self, "name", name)
        put(self, "_addresses", addresses[0] if len(addresses) == 1 else tuple(addresses))
        put(self, "node_name", node_name)
        put(self, "node_labels", node_labels)
        put(self, "is_node", is_node)
        put(self, "cidrs", cidrs)
        put(self, "pod_namespace", pod_namespace)
        put(self, "labels", labels_with_node(node_labels, node_name))

    @property
    def addresses(self) -> tuple[str, ...]:
        """Its addresses, in canonical form (convert.py makes them so), the form the indexes
        use."""
        held = self._addresses
        return (held,) if isinstance(held, str) else held

    @property
    def namespace_of_pod(self) -> str:
        """The namespace of the pod it places (--autopath's search path, `--pods verified`):
        `pod_namespace`, else its own."""
        return self.pod_namespace or self.namespace

    def _fields(self) -> tuple[object, ...]:
        return (
            self.namespace,
            self.name,
            self.addresses,
            self.node_name,
            self.node_labels,
            self.is_node,
            self.cidrs,
            self.pod_namespace,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PodLocator):
            return NotImplemented
        return (
            self.name == other.name
            and self._addresses == other._addresses
            and self.namespace == other.namespace
            and self.node_name == other.node_name
            and self.node_labels == other.node_labels
            and self.is_node == other.is_node
            and self.cidrs == other.cidrs
            and self.pod_namespace == other.pod_namespace
        )

    def __hash__(self) -> int:
        # Its labels are a dict: hashed by what identifies it (equal locators agree on it).
        return hash((self.namespace, self.name, self.addresses))

    def __repr__(self) -> str:
        names = ("namespace", "name", "addresses", "node_name", "node_labels", "is_node", "cidrs")
        values = zip((*names, "pod_namespace"), self._fields(), strict=True)
        return f"PodLocator({', '.join(f'{name}={value!r}' for name, value in values)})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def replace(self, **changes: Any) -> PodLocator:
        """A copy with `changes` (keyword arguments of the constructor), as dataclasses.replace
        makes one of a dataclass."""
        fields = ("namespace", "name", "addresses", "node_name", "node_labels", "is_node")
        values = dict(zip((*fields, "cidrs", "pod_namespace"), self._fields(), strict=True))
        return PodLocator(**{**values, **changes})

    def __reduce__(self) -> tuple[type[PodLocator], tuple[object, ...]]:
        # By the constructor: the default would set the slots through __setattr__.
        return PodLocator, self._fields()


#: Any object a snapshot can hold.
Record = Service | EndpointSlice | Namespace | PodLocator
