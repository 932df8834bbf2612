"""Topology-aware answers through the real server: clients on 127.0.0.2-5 get different answers,
over UDP and TCP, and EDNS Client Subnet counts only from trusted peers. Every test runs twice:
with clients placed by their own PodLocators (examples/topology.yaml), and by the CIDRs of their
nodes' locators (examples/topology-cidrs.yaml), which must answer alike."""

from __future__ import annotations

from pathlib import Path

import dns.edns
import dns.message
import dns.query
import pytest
import yaml

from tests.integration.support import (
    Server,
    StartServer,
    addresses,
    copy_snapshot,
    dig,
    replace_file,
    wait_until,
)
from tests.objects import forwarder_service

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"
TOPOLOGY = EXAMPLES / "topology.yaml"
WEB = "web.shop.svc.cluster.local"
ALL_WEB = ["10.244.1.10", "10.244.3.10", "10.244.3.11"]


@pytest.fixture(params=["topology.yaml", "topology-cidrs.yaml"])
def server(start_server: StartServer, tmp_path: Path, request: pytest.FixtureRequest) -> Server:
    # 127.0.0.100 plays a CoreDNS that forwards with `rewrite edns0 subnet set 32 128`.
    snapshot = copy_snapshot(tmp_path, EXAMPLES / request.param)
    return start_server("--ecs-trust", "127.0.0.100/32", snapshot=snapshot)


def dig_from(server: Server, source: str, *args: str) -> list[str]:
    return sorted(dig(server, "-b", source, *args, "+short").text.split())


@pytest.mark.parametrize(
    ("source", "web", "ledger", "cache"),
    [
        ("127.0.0.2", ["10.244.1.10"], ["10.244.1.20"], ["10.244.2.30"]),  # node-a, zone z1
        ("127.0.0.3", ["10.244.1.10"], ["10.244.1.20"], ["10.244.2.30"]),  # node-b: same zone
        ("127.0.0.4", ["10.244.3.10", "10.244.3.11"], ["10.244.3.20"], ["10.244.3.30"]),
        ("127.0.0.5", ALL_WEB, [], ["10.244.2.30", "10.244.3.30"]),  # node locator, zone z3
        ("127.0.0.1", ALL_WEB, [], ["10.244.2.30", "10.244.3.30"]),  # unknown client
    ],
)
def test_each_client_gets_its_domain(
    server: Server, source: str, web: list[str], ledger: list[str], cache: list[str]
) -> None:
    for _ in range(2):  # the second round comes from the wire cache
        assert dig_from(server, source, WEB) == web
        assert dig_from(server, source, "ledger.shop.svc.cluster.local") == ledger
        assert dig_from(server, source, "cache.shop.svc.cluster.local") == cache
    assert dig_from(server, source, WEB, "+tcp") == web


def test_no_tier_is_nodata_with_soa(server: Server) -> None:
    out = dig(server, "-b", "127.0.0.5", "ledger.shop.svc.cluster.local")
    assert out.status == "NOERROR" and "aa" in out.flags and not out.answer
    assert [rr[3] for rr in out.authority] == ["SOA"]


def test_srv_weights_follow_the_filtered_set(server: Server) -> None:
    name = f"_http._tcp.{WEB}"
    near = dig(server, "-b", "127.0.0.4", name, "SRV")
    assert sorted(near.rdata("SRV")) == [
        "0 50 80 web-1.web.shop.svc.cluster.local.",
        "0 50 80 web-2.web.shop.svc.cluster.local.",
    ]
    assert sorted(near.rdata("A", "additional")) == ["10.244.3.10", "10.244.3.11"]
    same = dig(server, "-b", "127.0.0.2", name, "SRV")
    assert same.rdata("SRV") == ["0 100 80 web-0.web.shop.svc.cluster.local."]
    anywhere = dig(server, "-b", "127.0.0.5", name, "SRV")
    assert {rr.split()[1] for rr in anywhere.rdata("SRV")} == {"33"}


def test_endpoint_names_are_the_same_for_everyone(server: Server) -> None:
    for source in ("127.0.0.2", "127.0.0.4", "127.0.0.1"):
        assert dig_from(server, source, f"web-1.{WEB}") == ["10.244.3.10"]


def ask_with_ecs(server: Server, source: str, subnet: str) -> dns.message.Message:
    address, prefix = subnet.split("/")
    ecs = dns.edns.ECSOption(address, int(prefix))
    query = dns.message.make_query(WEB, "A", use_edns=0, options=[ecs])
    return dns.query.udp(query, server.host, port=server.port, timeout=2, source=source)


def test_ecs_from_a_trusted_forwarder_places_the_client(server: Server) -> None:
    reply = ask_with_ecs(server, "127.0.0.100", "127.0.0.4/32")
    assert addresses(reply) == {"10.244.3.10", "10.244.3.11"}
    (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    assert (option.address, option.srclen, option.scopelen) == ("127.0.0.4", 32, 32)


def test_ecs_from_anyone_else_is_not_believed(server: Server) -> None:
    reply = ask_with_ecs(server, "127.0.0.2", "127.0.0.4/32")
    assert addresses(reply) == {"10.244.1.10"}  # placed by its own address: node-a
    (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    assert option.scopelen == 0


@pytest.fixture
def cidr_server(start_server: StartServer, tmp_path: Path) -> Server:
    snapshot = copy_snapshot(tmp_path, EXAMPLES / "topology-cidrs.yaml")
    return start_server("--ecs-trust", "127.0.0.100/32", snapshot=snapshot)


def test_a_subnet_inside_a_node_cidr_places_the_client(cidr_server: Server) -> None:
    # unbound sends a /24 of its client's address by default: node-c's pod range holds it all.
    for _ in range(2):  # the second from the cache
        reply = ask_with_ecs(cidr_server, "127.0.0.100", "10.244.3.0/24")
        assert addresses(reply) == {"10.244.3.10", "10.244.3.11"}
        (option,) = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
        assert (option.address, option.srclen, option.scopelen) == ("10.244.3.0", 24, 24)


def test_a_subnet_spanning_nodes_is_unplaced_and_logged_once(cidr_server: Server) -> None:
    for _ in range(3):
        reply = ask_with_ecs(cidr_server, "127.0.0.100", "10.244.0.0/16")
        assert addresses(reply) == set(ALL_WEB)  # unknown client, last key "*"
    lines = [line for line in cidr_server.log().splitlines() if "Client Subnets" in line]
    assert len(lines) == 1, lines
    assert "forwarder 127.0.0.100 sends /16 Client Subnets that no PodLocator" in lines[0]


def with_forwarders(*endpoints: str) -> str:
    """examples/topology.yaml plus a `kube-system/coredns` Service with these endpoints."""
    cluster = yaml.safe_load(TOPOLOGY.read_text())
    cluster["items"] += forwarder_service(*endpoints)
    return yaml.safe_dump(cluster)


def test_ecs_trust_follows_the_services_endpoints(
    start_server: StartServer, tmp_path: Path
) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(with_forwarders("127.0.0.100"))
    server = start_server("--ecs-trust-service", "kube-system/coredns", snapshot=snapshot)
    placed = {"10.244.3.10", "10.244.3.11"}  # 127.0.0.4's answer, given in ECS
    assert addresses(ask_with_ecs(server, "127.0.0.100", "127.0.0.4/32")) == placed
    assert addresses(ask_with_ecs(server, "127.0.0.101", "127.0.0.4/32")) == set(ALL_WEB)
    # The forwarder moves to another address: trust moves with it, in every worker.
    replace_file(snapshot, with_forwarders("127.0.0.101"))

    def moved() -> bool:
        return all(
            addresses(ask_with_ecs(server, "127.0.0.101", "127.0.0.4/32")) == placed
            for _ in range(8)
        )

    assert wait_until(moved, 10), server.log()
    for _ in range(8):
        assert addresses(ask_with_ecs(server, "127.0.0.100", "127.0.0.4/32")) == set(ALL_WEB)
