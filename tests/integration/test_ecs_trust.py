"""No pod picks its own placement through the forwarders the project ships configurations for.

Every path a pod's query takes to toposdns is played with the configuration we document, read
from where we ship it: the Corefile block of `manifests/coredns-forward/` (with that overlay's
ECS trust flag), and NodeLocal DNSCache's cluster-zone block in `manifests/README.md`, each run by
the CoreDNS stand-in (tests/coredns_forwarder.py). A pod on node-a (zone z1) sends its own
Client Subnet option claiming a pod of another zone. Through the shipped blocks, which `set` the
subnet, it gets its own zone's answer, and so does its neighbour of another namespace behind the
same node cache. The same blocks with `append`, as they were, show the forgery: the claimed
zone's answer, and a node cache poisoned for every pod on the node.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.edns
import dns.message
import dns.query
import pytest
import yaml

from tests.coredns_forwarder import CorefileForwarder, Directive, corefile_block, shown_corefile
from tests.integration.support import REPO, Server, StartServer
from tests.objects import endpoint, endpoint_slice, headless, namespace, pod_locator, service

pytestmark = pytest.mark.integration

MANIFESTS = REPO / "manifests"
OVERLAY = MANIFESTS / "coredns-forward"

# The cluster, on loopback addresses: three nodes in three zones, each with its own address (for
# NodeLocal's queries) and pod range; `web` answers with the client's zone only (no "*").
NODE_A = "127.0.10.1"  # node-a's InternalIP: where its NodeLocal DNSCache asks from
POD = "127.0.1.2"  # a pod of namespace tenant on node-a, zone z1: the one that lies
NEIGHBOUR = "127.0.1.3"  # a pod of namespace shop on node-a too
Z2_POD = "127.0.2.2"  # an address on node-c, zone z2, which the pod claims
Z3_POD = "127.0.4.2"  # an address on node-d, zone z3, where web has no endpoint
COREDNS_POD = "127.0.2.53"  # CoreDNS's pod, on node-c, zone z2
WEB = "web.shop.svc.cluster.local."
API = "api.shop.svc.cluster.local."  # the same endpoints and policy as web's
Z1_WEB = ["10.244.1.10"]
Z2_WEB = ["10.244.2.10"]
NODATA: list[str] = []

NODES = [  # (name, zone, address, pod range)
    ("node-a", "z1", NODE_A, "127.0.1.0/24"),
    ("node-c", "z2", "127.0.10.3", "127.0.2.0/24"),
    ("node-d", "z3", "127.0.10.4", "127.0.4.0/24"),
]


def overlay_trust_flags() -> list[str]:
    """The ECS trust flags the `coredns-forward` overlay adds to the DNS server's args."""
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    found = []
    for patch in kustomization["patches"]:
        operations = yaml.safe_load(patch["patch"])
        if isinstance(operations, list):
            found += [
                op["value"]
                for op in operations
                if str(op.get("value", "")).startswith("--ecs-trust")
            ]
    assert found, "the overlay trusts no forwarder"
    return found


def cluster(trusted_service: tuple[str, str]) -> dict[str, Any]:
    """The objects served: the nodes' locators, web and api, and the trusted Service with
    CoreDNS's pod as its endpoint."""
    trusted_ns, trusted_name = trusted_service
    dns_ports = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    items = [namespace(n) for n in ("shop", "tenant", "toposdns", trusted_ns)]
    for node, zone, address, pods in NODES:
        labels = {"kubernetes.io/hostname": node, "topology.kubernetes.io/zone": zone}
        items.append(
            pod_locator(
                node,
                "toposdns",
                addresses=[address],
                cidrs=[pods],
                node_name=node,
                node_labels=labels,
                role="node",
            )
        )
    for name in ("web", "api"):
        items += headless(
            name,
            "shop",
            [
                endpoint(Z1_WEB[0], nodeName="node-a", zone="z1"),
                endpoint(Z2_WEB[0], nodeName="node-c", zone="z2"),
            ],
            annotations={"toposdns.io/topology-keys": "topology.kubernetes.io/zone"},
        )
    items += [
        service(trusted_name, trusted_ns, cluster_ip="10.96.0.10", ports=dns_ports),
        endpoint_slice(trusted_name, trusted_ns, [endpoint(COREDNS_POD)], ports=dns_ports),
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    (flag,) = [f for f in overlay_trust_flags() if f.startswith("--ecs-trust-service=")]
    ns, name = flag.split("=", 1)[1].split("/")
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster((ns, name))))
    return path


def as_shipped(text: str, config: str) -> str:
    """A Corefile as shipped, or as it was (`append`), or NodeLocal's own without our line."""
    rewrite = re.compile(r"^\s*rewrite edns0 subnet set 32 128\n", re.MULTILINE)
    assert len(rewrite.findall(text)) == 1, "the shipped block sets the subnet, once"
    if config == "append":
        return text.replace("subnet set 32 128", "subnet append 32 128")
    if config == "stock":
        return rewrite.sub("", text)
    return text


def coredns_block(config: str) -> list[Directive]:
    """The overlay's Corefile block for the cluster zone (ConfigMap `coredns-custom`)."""
    (document,) = yaml.safe_load_all((OVERLAY / "coredns-custom.yaml").read_text())
    (text,) = document["data"].values()
    return corefile_block(as_shipped(text, config), "cluster.local:53")


def nodelocal_block(config: str) -> list[Directive]:
    """NodeLocal DNSCache's cluster-zone block as manifests/README.md gives it."""
    text = shown_corefile((MANIFESTS / "README.md").read_text(), "Behind NodeLocal DNSCache")
    return corefile_block(as_shipped(text, config), "cluster.local:53")


def ask(hop: CorefileForwarder, source: str, *claims: str, name: str = WEB) -> dns.message.Message:
    """`name` A from the pod at `source` through `hop`, with a Client Subnet option for each
    address it claims."""
    options: list[dns.edns.Option] = [dns.edns.ECSOption(claim, 32) for claim in claims]
    query = dns.message.make_query(name, "A", use_edns=0 if claims else None, options=options)
    return dns.query.udp(query, hop.listen, port=hop.port, source=source, timeout=5)


def addresses(reply: dns.message.Message) -> list[str]:
    assert reply.rcode() == 0, reply
    return sorted(rr.address for rrset in reply.answer for rr in rrset)


@pytest.fixture
def hops() -> Iterator[list[CorefileForwarder]]:
    """The stand-ins a test starts, closed (and checked) at its end."""
    started: list[CorefileForwarder] = []
    yield started
    for hop in reversed(started):
        hop.close()


def start(
    hops: list[CorefileForwarder], block: list[Directive], address: str, upstream: tuple[str, int]
) -> CorefileForwarder:
    hop = CorefileForwarder(block, address, upstream)
    hops.append(hop)
    return hop


# (configuration, what the pod gets claiming another zone): the shipped one places it truly;
# the old one lets it choose.
CONFIGS = [("shipped", Z1_WEB, Z1_WEB), ("append", Z2_WEB, NODATA)]


@pytest.mark.parametrize(("config", "claiming_z2", "claiming_z3"), CONFIGS)
def test_through_coredns_a_pod_gets_its_own_placement(
    start_server: StartServer,
    snapshot: Path,
    hops: list[CorefileForwarder],
    config: str,
    claiming_z2: list[str],
    claiming_z3: list[str],
) -> None:
    server: Server = start_server(*overlay_trust_flags(), snapshot=snapshot)
    coredns = start(hops, coredns_block(config), COREDNS_POD, server.address)
    # Without an option of its own, the pod is placed by its address, not CoreDNS's zone z2.
    assert addresses(ask(coredns, POD)) == Z1_WEB
    assert addresses(ask(coredns, POD, Z2_POD)) == claiming_z2
    assert addresses(ask(coredns, POD, Z3_POD)) == claiming_z3
    assert coredns.forwarded == 3 and coredns.cache is None


def test_through_coredns_a_second_subnet_changes_nothing(
    start_server: StartServer, snapshot: Path, hops: list[CorefileForwarder]
) -> None:
    # `set` overwrites the first Client Subnet option only; toposdns reads the first.
    server = start_server(*overlay_trust_flags(), snapshot=snapshot)
    coredns = start(hops, coredns_block("shipped"), COREDNS_POD, server.address)
    assert addresses(ask(coredns, POD, Z3_POD, Z2_POD)) == Z1_WEB
    assert addresses(ask(coredns, POD, Z2_POD, Z3_POD)) == Z1_WEB


@pytest.mark.parametrize(("config", "claiming_z2", "claiming_z3"), CONFIGS)
def test_behind_nodelocal_a_pod_cannot_poison_its_node(
    start_server: StartServer,
    snapshot: Path,
    hops: list[CorefileForwarder],
    config: str,
    claiming_z2: list[str],
    claiming_z3: list[str],
) -> None:
    # The pod's own address placed: toposdns trusts the addresses NodeLocal asks from.
    server = start_server("--ecs-trust", f"{NODE_A}/32", snapshot=snapshot)
    node = start(hops, nodelocal_block(config), NODE_A, server.address)
    assert addresses(ask(node, POD, Z3_POD)) == claiming_z3
    # A pod of another namespace on that node gets what the node's cache kept.
    assert addresses(ask(node, NEIGHBOUR)) == claiming_z3
    assert (node.forwarded, node.hits) == (1, 1)
    assert addresses(ask(node, POD, Z2_POD, name=API)) == claiming_z2


@pytest.mark.parametrize("config", ["shipped", "stock"])
def test_behind_nodelocal_the_node_places_its_pods(
    start_server: StartServer, snapshot: Path, hops: list[CorefileForwarder], config: str
) -> None:
    # The default install trusts no forwarder: NodeLocal's queries are placed by the node's
    # address, with our line or without it (NodeLocal's own Corefile passes the pod's option on).
    server = start_server(snapshot=snapshot)
    node = start(hops, nodelocal_block(config), NODE_A, server.address)
    assert addresses(ask(node, POD, Z3_POD)) == Z1_WEB
    assert addresses(ask(node, NEIGHBOUR)) == Z1_WEB
    assert addresses(ask(node, POD, Z2_POD, name=API)) == Z1_WEB


@pytest.mark.parametrize(("config", "claiming_z2", "claiming_z3"), CONFIGS)
def test_nodelocal_in_front_of_coredns(
    start_server: StartServer,
    snapshot: Path,
    hops: list[CorefileForwarder],
    config: str,
    claiming_z2: list[str],
    claiming_z3: list[str],
) -> None:
    # pod -> NodeLocal (TCP) -> CoreDNS -> toposdns: CoreDNS's `set` writes the node's address.
    server = start_server(*overlay_trust_flags(), snapshot=snapshot)
    coredns = start(hops, coredns_block(config), COREDNS_POD, server.address)
    node = start(hops, nodelocal_block(config), NODE_A, coredns.address)
    assert node.force_tcp
    assert addresses(ask(node, POD, Z3_POD)) == claiming_z3
    assert addresses(ask(node, NEIGHBOUR)) == claiming_z3
    assert addresses(ask(node, POD, Z2_POD, name=API)) == claiming_z2
    assert (node.forwarded, node.hits, coredns.forwarded) == (2, 1, 2)
