"""The cluster `bench/run.py` measures with: headless services in namespaces, their endpoints on
nodes in three zones, written both as a toposdns snapshot (a `kind: List` of Kubernetes objects)
and as a Knot zone with the same records.
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bench.harness import endpoint_slice, namespace, pod_locator, service

ZONE = "cluster.local"
TTL = 5
SOA_SERIAL = 1
REGION = "region-1"
ZONES = ("zone-a", "zone-b", "zone-c")
TOPOLOGY_KEYS = ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]
#: The soft variant's weights between those tiers (docs/topology.md, "Soft topology").
SOFT_WEIGHTS = {"toposdns.io/topology-weights": "80,15,5"}
#: The first EDNS Client Subnet address; client i of the ECS scenario is this + i.
ECS_BASE = ipaddress.IPv4Address("172.20.0.1")

JSON = dict[str, object]


@dataclass(frozen=True)
class Node:
    name: str
    zone: str
    ip: str

    @property
    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": REGION,
        }


@dataclass(frozen=True)
class Endpoint:
    ip: str
    node: Node
    pod: str


@dataclass
class Service:
    name: str
    namespace: str
    endpoints: list[Endpoint] = field(default_factory=list)

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{self.namespace}.svc.{ZONE}."

    def endpoint_name(self, endpoint: Endpoint) -> str:
        """The endpoint's own name, as CoreDNS names an endpoint without a hostname."""
        return f"{dashed(endpoint.ip)}.{self.fqdn}"


@dataclass
class Cluster:
    nodes: list[Node]
    namespaces: list[str]
    services: list[Service]

    @property
    def endpoints(self) -> int:
        return sum(len(s.endpoints) for s in self.services)


def dashed(ip: str) -> str:
    return ip.replace(".", "-")


def srv_weight(n: int) -> int:
    """CoreDNS gives each of n equal-priority SRV records weight floor(100 / n)."""
    return 100 // n


def generate_cluster(n_services: int, n_namespaces: int, n_nodes: int, seed: int) -> Cluster:
    """Deterministic cluster: services round-robin over namespaces, 3-10 pods each."""
    rng = random.Random(seed)
    nodes = [
        Node(name=f"node-{i:02d}", zone=ZONES[i % len(ZONES)], ip=f"172.18.0.{10 + i}")
        for i in range(n_nodes)
    ]
    namespaces = [f"ns{i}" for i in range(n_namespaces)]
    # Each node owns a /16 of pod addresses (10.(64+i).0.0/16), allocated sequentially.
    pod_nets = [ipaddress.IPv4Network(f"10.{64 + i}.0.0/16") for i in range(n_nodes)]
    next_host = [1] * n_nodes
    services: list[Service] = []
    for i in range(n_services):
        svc = Service(name=f"svc{i}", namespace=namespaces[i % n_namespaces])
        for k in range(rng.randint(3, 10)):
            ni = rng.randrange(n_nodes)
            ip = str(pod_nets[ni].network_address + next_host[ni])
            next_host[ni] += 1
            svc.endpoints.append(Endpoint(ip=ip, node=nodes[ni], pod=f"{svc.name}-pod-{k}"))
        services.append(svc)
    return Cluster(nodes=nodes, namespaces=namespaces, services=services)


def ecs_clients(cluster: Cluster) -> dict[str, Node]:
    """One EDNS Client Subnet address per node (so clients in every zone), address -> node."""
    return {str(ECS_BASE + i): node for i, node in enumerate(cluster.nodes)}


def tier_answers(service: Service, node: Node) -> set[frozenset[str]]:
    """What each tier of [hostname, zone, "*"] answers a client on `node` with its own endpoints
    (the soft variant rotates among them): those that have any."""
    tiers = (
        [ep.ip for ep in service.endpoints if ep.node == node],
        [ep.ip for ep in service.endpoints if ep.node.zone == node.zone],
        [ep.ip for ep in service.endpoints],
    )
    return {frozenset(tier) for tier in tiers if tier}


def topology_answer(service: Service, node: Node) -> frozenset[str]:
    """What [hostname, zone, "*"] gives a client on `node`: the first tier with endpoints."""
    for tier in (
        [ep.ip for ep in service.endpoints if ep.node == node],
        [ep.ip for ep in service.endpoints if ep.node.zone == node.zone],
    ):
        if tier:
            return frozenset(tier)
    return frozenset(ep.ip for ep in service.endpoints)


# --------------------------------------------------------------------------- the snapshot


def snapshot_objects(
    cluster: Cluster,
    topology: bool = False,
    clients: Mapping[str, Node] | None = None,
    soft: bool = False,
) -> JSON:
    """The cluster as a Kubernetes `kind: List` of the objects toposdns reads.

    With `topology`, every service asks for [hostname, zone, "*"] (with `soft`, weighted
    `SOFT_WEIGHTS` between them). `clients` (address -> node)
    adds a PodLocator per address that places a client (a querying address, or an ECS address)
    on that node.
    """
    items: list[JSON] = [namespace(ns) for ns in cluster.namespaces]
    for svc in cluster.services:
        items.append(service_object(svc, topology, soft))
        items.append(slice_object(svc))
        items.extend(
            locator_object(ep.pod, svc.namespace, ep.ip, ep.node, "pod") for ep in svc.endpoints
        )
    items.extend(locator_object(node.name, "", node.ip, node, "node") for node in cluster.nodes)
    for i, (address, node) in enumerate((clients or {}).items()):
        items.append(locator_object(f"bench-client-{i}", cluster.namespaces[0], address, node))
    return {"apiVersion": "v1", "kind": "List", "items": items}


def service_object(svc: Service, topology: bool, soft: bool = False) -> JSON:
    return service(
        svc.name,
        svc.namespace,
        annotations=SOFT_WEIGHTS if soft else None,
        cluster_ip="None",
        ports=[{"name": "http", "port": 80, "targetPort": 80}],
        selector={"app": svc.name},
        **({"topologyKeys": TOPOLOGY_KEYS} if topology else {}),
    )


def slice_object(svc: Service) -> JSON:
    endpoints = [
        {
            "addresses": [ep.ip],
            "nodeName": ep.node.name,
            "zone": ep.node.zone,
            "conditions": {"ready": True},
            "targetRef": {"kind": "Pod", "namespace": svc.namespace, "name": ep.pod},
        }
        for ep in svc.endpoints
    ]
    return endpoint_slice(svc.name, svc.namespace, endpoints, name=f"{svc.name}-abcde")


def locator_object(name: str, namespace: str, ip: str, node: Node, kind: str = "") -> JSON:
    """A PodLocator placing `ip` on `node` (`kind` is its toposdns.io/locator label, if any),
    as the controller writes them, in its namespace: a node's named after it, the pod
    `namespace/name`'s named NAMESPACE.NAME."""
    pod = kind != "node"
    return pod_locator(
        f"{namespace}.{name}" if pod else name,
        "toposdns",
        addresses=[ip],
        node_name=node.name,
        node_labels=node.labels,
        role=kind or None,
        labels={"toposdns.io/pod-namespace": namespace} if pod else None,
    )


# --------------------------------------------------------------------------- the Knot zone


def zone_text(cluster: Cluster, with_srv: bool, pods: Iterable[tuple[str, str]] = ()) -> str:
    """The zone file: SOA, NS, each service's A RRset and each endpoint's own name (with_srv:
    the SRV RRsets too), plus an A record per (name, address) in `pods`."""
    lines = [
        f"$ORIGIN {ZONE}.",
        f"$TTL {TTL}",
        f"@ {TTL} IN SOA ns.dns.{ZONE}. hostmaster.{ZONE}. {SOA_SERIAL} 7200 1800 86400 {TTL}",
        f"@ {TTL} IN NS ns.dns.{ZONE}.",
        f"ns.dns {TTL} IN A 127.0.0.1",
    ]
    for svc in cluster.services:
        weight = srv_weight(len(svc.endpoints))
        for ep in svc.endpoints:
            lines.append(f"{svc.fqdn} {TTL} IN A {ep.ip}")
            lines.append(f"{svc.endpoint_name(ep)} {TTL} IN A {ep.ip}")
            if with_srv:
                target = svc.endpoint_name(ep)
                lines.append(f"_http._tcp.{svc.fqdn} {TTL} IN SRV 0 {weight} 80 {target}")
    lines.extend(f"{name} {TTL} IN A {ip}" for name, ip in pods)
    return "\n".join(lines) + "\n"


def knot_conf(workdir: str, host: str, port: int, zonefile: str, workers: int = 1) -> str:
    """Knot DNS: `workers` UDP workers, no DNSSEC, EDNS Client Subnet answered (RFC 7871,
    scope 0)."""
    return f"""\
server:
    rundir: "{workdir}/knot-run"
    listen: {host}@{port}
    udp-workers: {workers}
    tcp-workers: 1
    background-workers: 1
    edns-client-subnet: on

log:
  - target: stderr
    any: warning

database:
    storage: "{workdir}/knot-db"

template:
  - id: default
    storage: "{workdir}"
    semantic-checks: off
    journal-content: none
    zonefile-sync: -1

zone:
  - domain: {ZONE}.
    file: "{zonefile}"
"""
