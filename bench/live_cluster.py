"""The cluster of `bench/live.py` and `bench/churn.py`: Kubernetes API objects as a real API server
returns them (Namespaces, Services, EndpointSlices, PodLocators), loaded into the stand-in."""

from __future__ import annotations

import ipaddress
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness import FakeApiServer

ZONE = "cluster.local"
REGION = "region-1"
ZONES = ("zone-a", "zone-b", "zone-c")
LOCATOR_NAMESPACE = "toposdns"
NODE_BASE = int(ipaddress.IPv4Address("172.16.0.10"))
POD_BASE = int(ipaddress.IPv4Address("10.128.0.1"))
CLUSTER_IP_BASE = int(ipaddress.IPv4Address("10.96.0.10"))

JSON = dict[str, Any]
#: (name, labels, address) of a node
NodeInfo = tuple[str, dict[str, str], str]


@dataclass(frozen=True)
class Sizes:
    services: int
    slices: int  # slice i belongs to service i % services
    nodes: int
    namespaces: int
    #: pod locators: one per endpoint pod first, then pods behind no service up to this many;
    #: None: exactly one per endpoint pod
    locators: int | None = None
    headless_every: int = 2  # service i is headless when i % headless_every == headless_every - 1
    #: Pods take addresses from their node's /24 (node i: POD_BASE's /24 plus i), as CNIs that
    #: allocate per node do; otherwise one after the other, whatever their node.
    node_ranges: bool = False
    #: Node locators carry their node's /24 and no pod has a locator of its own (node_ranges
    #: implied); `locators` still counts the pods.
    cidr_locators: bool = False
    #: The fewest and most ready endpoints of an EndpointSlice (drawn uniformly).
    per_slice: tuple[int, int] = (3, 10)


@dataclass
class Cluster:
    """The objects, by API resource, plus what the event phases need to find again."""

    namespaces: list[JSON] = field(default_factory=list)
    services: list[JSON] = field(default_factory=list)
    slices: list[JSON] = field(default_factory=list)
    locators: list[JSON] = field(default_factory=list)
    endpoint_pods: int = 0
    pod_locators: int = 0
    node_locators: int = 0
    #: (address, node name) of every pod, for checking where clients are placed.
    pods: list[tuple[str, str]] = field(default_factory=list)

    def by_resource(self) -> dict[str, list[JSON]]:
        return {
            "namespaces": self.namespaces,
            "services": self.services,
            "endpointslices": self.slices,
            "podlocators": self.locators,
        }

    def headless_slices(self) -> list[JSON]:
        """The EndpointSlices of headless services."""
        headless = {
            (s["metadata"]["namespace"], s["metadata"]["name"])
            for s in self.services
            if s["spec"]["clusterIP"] == "None"
        }
        return [eps for eps in self.slices if (namespace(eps), service_of(eps)) in headless]


def namespace(obj: JSON) -> str:
    return str(obj["metadata"]["namespace"])


def service_of(eps: JSON) -> str:
    return str(eps["metadata"]["labels"]["kubernetes.io/service-name"])


def fqdn(obj: JSON) -> str:
    """A Service's name, or the name of an EndpointSlice's service."""
    name = service_of(obj) if obj["kind"] == "EndpointSlice" else obj["metadata"]["name"]
    return f"{name}.{namespace(obj)}.svc.{ZONE}."


def generate(sizes: Sizes, seed: int) -> Cluster:
    """A deterministic cluster.

    Services round-robin over the namespaces, every `headless_every`th one headless, port
    http/80->8080. EndpointSlice i belongs to service i % services and has 3-10 ready endpoints,
    each a pod on a random node (nodeName and zone set). Pod locators carry their node's three
    labels; node locators (label toposdns.io/locator: node) live in namespace `toposdns`.
    """
    rng = random.Random(seed)
    cluster = Cluster()
    namespaces = [f"ns-{i:02d}" for i in range(sizes.namespaces)]
    cluster.namespaces = [
        namespace_object(ns) for ns in [*namespaces, LOCATOR_NAMESPACE, "kube-system", "default"]
    ]
    nodes = [node_info(i) for i in range(sizes.nodes)]
    cluster.services = [
        service_object(i, namespaces[i % sizes.namespaces], sizes.headless_every)
        for i in range(sizes.services)
    ]
    wanted = sizes.locators
    index = {node[0]: i for i, node in enumerate(nodes)}
    on_node = [0] * sizes.nodes

    def address(node: NodeInfo) -> str:
        i = index[node[0]]
        if sizes.node_ranges or sizes.cidr_locators:
            on_node[i] += 1
            if on_node[i] > 254:
                raise ValueError(f"more than 254 pods on {node[0]}: its /24 is full")
            ip = str(ipaddress.IPv4Address(node_range(i) + on_node[i]))
        else:
            ip = str(ipaddress.IPv4Address(POD_BASE + len(cluster.pods)))
        cluster.pods.append((ip, node[0]))
        return ip

    for i in range(sizes.slices):
        svc = cluster.services[i % sizes.services]
        room = None if wanted is None else wanted - len(cluster.pods)
        eps, locators = slice_object(svc, nodes, address, room, rng, sizes.per_slice)
        cluster.slices.append(eps)
        cluster.locators += locators
        cluster.endpoint_pods += len(eps["endpoints"])
    while wanted is not None and len(cluster.pods) < wanted:
        node = nodes[rng.randrange(sizes.nodes)]
        ns = namespaces[rng.randrange(sizes.namespaces)]
        name = f"job-{len(cluster.pods) + 1:06d}-{_suffix(rng)}"
        cluster.locators.append(pod_locator(name, ns, address(node), node, rng))
    if sizes.cidr_locators:
        cluster.locators = []
    cluster.pod_locators = len(cluster.locators)
    cluster.locators += [
        node_locator(node, node_range(i) if sizes.cidr_locators else None)
        for i, node in enumerate(nodes)
    ]
    cluster.node_locators = sizes.nodes
    return cluster


def load(server: FakeApiServer, cluster: Cluster) -> None:
    """Add every object to the stand-in, then drop the load's history (etcd compacts too), and
    encode the objects as list items once, before anything is measured."""
    for objs in cluster.by_resource().values():
        for obj in objs:
            server.add(obj)
    server.compact()
    server.encode_items()


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


def node_info(i: int) -> NodeInfo:
    name = f"node-{i:05d}"
    labels = {
        "kubernetes.io/hostname": name,
        "topology.kubernetes.io/zone": ZONES[i % len(ZONES)],
        "topology.kubernetes.io/region": REGION,
    }
    return name, labels, str(ipaddress.IPv4Address(NODE_BASE + i))


def namespace_object(ns: str) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def service_object(i: int, ns: str, headless_every: int) -> JSON:
    name = f"svc-{i:05d}"
    headless = i % headless_every == headless_every - 1
    ip = "None" if headless else str(ipaddress.IPv4Address(CLUSTER_IP_BASE + i))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": ns},
        },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "clusterIPs": [ip],
            "ipFamilies": ["IPv4"],
            "ipFamilyPolicy": "SingleStack",
            "internalTrafficPolicy": "Cluster",
            "sessionAffinity": "None",
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
        },
        "status": {"loadBalancer": {}},
    }


def node_range(i: int) -> int:
    """The first address of node i's /24."""
    return (POD_BASE & ~0xFF) + (i << 8)


def slice_object(
    svc: JSON,
    nodes: list[NodeInfo],
    address: Callable[[NodeInfo], str],
    room: int | None,
    rng: random.Random,
    per_slice: tuple[int, int] = (3, 10),
) -> tuple[JSON, list[JSON]]:
    """A slice of `per_slice` (3-10) ready endpoints of `svc`, pods addressed by `address`, and a
    PodLocator for each of its pods while `room` (None: no limit) allows."""
    ns, name = namespace(svc), svc["metadata"]["name"]
    endpoints: list[JSON] = []
    locators: list[JSON] = []
    for _ in range(rng.randint(*per_slice)):
        node = nodes[rng.randrange(len(nodes))]
        pod = f"{name}-{_suffix(rng, 10)}-{_suffix(rng)}"
        ip = address(node)
        endpoints.append(
            {
                "addresses": [ip],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": node[0],
                "zone": node[1]["topology.kubernetes.io/zone"],
                "targetRef": {"kind": "Pod", "namespace": ns, "name": pod, "uid": _uid(rng)},
            }
        )
        if room is None or len(locators) < room:
            locators.append(pod_locator(pod, ns, ip, node, rng))
    slice_name = f"{name}-{_suffix(rng)}"
    managed_by = "endpointslice-controller.k8s.io"
    owner = {"apiVersion": "v1", "kind": "Service", "name": name, "uid": _uid(rng),
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    eps = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name,
            "generateName": f"{name}-",
            "namespace": ns,
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": managed_by,
                "app.kubernetes.io/name": name,
            },
            "ownerReferences": [owner],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
    }
    return eps, locators


def pod_locator(name: str, ns: str, ip: str, node: NodeInfo, rng: random.Random) -> JSON:
    """The locator of pod `ns/name`, as the controller writes it: in its own namespace."""
    return {
        "apiVersion": "toposdns.io/v1alpha1",
        "kind": "PodLocator",
        "metadata": {
            "name": f"{ns}.{name}",
            "namespace": LOCATOR_NAMESPACE,
            "labels": {"toposdns.io/locator": "pod", "toposdns.io/pod-namespace": ns},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node[0], "uid": _uid(rng)}
            ],
        },
        "addresses": [ip],
        "nodeName": node[0],
        "nodeLabels": dict(node[1]),
    }


def node_locator(node: NodeInfo, pod_range: int | None = None) -> JSON:
    """A node's locator, carrying the /24 starting at `pod_range` when given."""
    name, labels, ip = node
    cidrs = {} if pod_range is None else {"cidrs": [f"{ipaddress.IPv4Address(pod_range)}/24"]}
    return {
        "apiVersion": "toposdns.io/v1alpha1",
        "kind": "PodLocator",
        "metadata": {
            "name": name,
            "namespace": LOCATOR_NAMESPACE,
            "labels": {"toposdns.io/locator": "node"},
        },
        "addresses": [ip],
        **cidrs,
        "nodeName": name,
        "nodeLabels": dict(labels),
    }
