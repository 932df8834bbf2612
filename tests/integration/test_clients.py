"""Real clients that no one here wrote, against the real server: musl's getaddrinfo through a
pod's search path, and a large forwarded answer without TCP (musl up to 1.2.3 never retries
over TCP); Go's own resolver for A, SRV, PTR and a large answer over TCP; unbound forwarding
with EDNS Client Subnet, so that clients behind it are placed by their own address."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import dns.edns
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest
import yaml

from tests import clients, glibc, objects
from tests.integration.support import STOP_TIMEOUT, Server, StartServer, copy_snapshot
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

TOPOLOGY = Path(__file__).parents[2] / "examples" / "topology.yaml"
#: A forwarded name with 80 A records, more than a 512-byte reply holds.
BIG = "big.example.test"
BIG_ADDRESSES = [f"198.51.100.{i}" for i in range(1, 81)]
BIG_UPSTREAM = {(BIG, "A"): [f"{BIG}. 60 IN A {address}" for address in BIG_ADDRESSES]}
#: A headless service with 100 ready endpoints, added to the fixture cluster.
MANY_ADDRESSES = [f"10.244.9.{i}" for i in range(1, 101)]


@pytest.fixture(scope="session")
def musl_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """getaddrinfo.c built with musl-gcc, once per session."""
    reason = clients.musl_unavailable()
    if reason is not None:
        pytest.skip(reason)
    return clients.build_getaddrinfo(tmp_path_factory.mktemp("musl"))


@pytest.fixture(scope="session")
def go_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """resolve.go built with Go's own resolver, once per session."""
    reason = clients.go_unavailable()
    if reason is not None:
        pytest.skip(reason)
    return clients.build_resolve(tmp_path_factory.mktemp("go"))


def lines(done: object) -> list[str]:
    return sorted(str(getattr(done, "stdout", "")).split())


# --- musl


def test_musl_getaddrinfo_walks_the_search_path(
    musl_program: Path, start_server: StartServer, tmp_path: Path
) -> None:
    address = glibc.free_loopback_53()
    start_server("--listen", f"{address}:53")
    search = ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"]
    conf = glibc.resolv_conf(tmp_path, address, search, "ndots:5 attempts:1 timeout:2")
    for name, expected in (
        ("frontend", ["10.96.10.10"]),  # the first search domain
        ("workers.data", ["10.244.3.5", "10.244.3.6"]),  # the second
        ("frontend.shop.svc.cluster.local", ["10.96.10.10"]),  # after NXDOMAIN in all three
    ):
        done = clients.musl_getaddrinfo(musl_program, conf, name)
        assert done.returncode == 0, (name, done.stderr)
        assert lines(done) == expected, name
    missing = clients.musl_getaddrinfo(musl_program, conf, "nowhere")
    assert missing.returncode == 2 and missing.stdout == ""


def test_musl_gets_a_large_forwarded_answer_without_tcp(
    musl_program: Path, start_server: StartServer, tmp_path: Path
) -> None:
    address = glibc.free_loopback_53()
    with stub_upstream(BIG_UPSTREAM, mode="truncate") as upstream:
        start_server("--listen", f"{address}:53", "--upstream", f"127.0.0.1:{upstream.port}")
        # What a client without EDNS gets: TC, and as many whole records as 512 bytes hold.
        query = dns.message.make_query(f"{BIG}.", "A", use_edns=False)
        reply = dns.query.udp(query, address, port=53, timeout=5)
        assert reply.flags & dns.flags.TC
        fitted = sorted(rr.address for rrset in reply.answer for rr in rrset)
        assert 20 <= len(fitted) < len(BIG_ADDRESSES), fitted
        assert set(fitted) <= set(BIG_ADDRESSES)
        # musl takes the truncated reply as it is (up to 1.2.3 it never retries over TCP).
        conf = glibc.resolv_conf(tmp_path, address, [], "attempts:1 timeout:2")
        done = clients.musl_getaddrinfo(musl_program, conf, f"{BIG}.")
        assert done.returncode == 0, f"musl {clients.musl_version()}: {done.stderr}"
        assert lines(done) == fitted


# --- Go


@pytest.fixture(scope="module")
def go_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The fixture cluster plus `many.shop`, a headless service with 100 endpoints."""
    snapshot = copy_snapshot(tmp_path_factory.mktemp("go-server"))
    endpoints = "".join(
        f"  - addresses: [{address}]\n    conditions: {{ready: true}}\n"
        for address in MANY_ADDRESSES
    )
    with open(snapshot, "a", encoding="utf-8") as file:
        file.write(
            "- apiVersion: v1\n  kind: Service\n  metadata: {name: many, namespace: shop}\n"
            "  spec: {clusterIP: None, ports: [{name: http, port: 80, protocol: TCP}]}\n"
            "- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n"
            "  metadata:\n    name: many-1\n    namespace: shop\n"
            "    labels: {kubernetes.io/service-name: many}\n"
            "  addressType: IPv4\n  ports: [{name: http, port: 80, protocol: TCP}]\n"
            f"  endpoints:\n{endpoints}"
        )
    server = Server(snapshot)
    server.wait_ready()
    yield server
    assert server.stop(STOP_TIMEOUT) == 0, server.log()


@pytest.mark.parametrize(
    ("kind", "name", "expected"),
    [
        ("ip4", "frontend.shop.svc.cluster.local.", ["10.96.10.10"]),
        (
            "srv",
            "_http._tcp.web.shop.svc.cluster.local.",
            [
                "0 50 80 web-0.web.shop.svc.cluster.local.",
                "0 50 80 web-1.web.shop.svc.cluster.local.",
            ],
        ),
        ("ptr", "10.244.1.10", ["web-0.web.shop.svc.cluster.local."]),
    ],
)
def test_go_resolver(
    go_program: Path, go_server: Server, kind: str, name: str, expected: list[str]
) -> None:
    done = clients.go_resolve(go_program, go_server.address, kind, name)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == expected
    assert "dial tcp" not in done.stderr, "a small answer needs no TCP"


def test_go_resolver_takes_a_large_answer_over_tcp(go_program: Path, go_server: Server) -> None:
    done = clients.go_resolve(go_program, go_server.address, "ip4", "many.shop.svc.cluster.local.")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(MANY_ADDRESSES)
    assert done.stderr.split("\n")[:2] == ["dial udp", "dial tcp"], done.stderr


# --- soft topology: weights as real clients see them


SOFT = Path(__file__).parents[2] / "examples" / "topology-soft.yaml"
#: Lookups per client; a share must come within SHARE_MARGIN points of the weights'.
LOOKUPS = 1000
SHARE_MARGIN = 5
#: `search.shop` (weights 80,20 over its zone and "*") for a client in zone z2.
NEAR = {"10.244.3.30", "10.244.3.31"}
EVERYONE = {"10.244.1.30", "10.244.3.30", "10.244.3.31"}


def soft_snapshot(directory: Path) -> Path:
    """examples/topology-soft.yaml with 127.0.0.1, where local clients ask from, on node-c
    (zone z2)."""
    snapshot = yaml.safe_load(SOFT.read_text())
    snapshot["items"].append(
        objects.pod_locator(
            "shop.local",
            "toposdns",
            addresses=["127.0.0.1"],
            node_name="node-c",
            node_labels={"kubernetes.io/hostname": "node-c", "topology.kubernetes.io/zone": "z2"},
            labels={"toposdns.io/pod-namespace": "shop"},
        )
    )
    target = directory / "snapshot.yaml"
    target.write_text(yaml.safe_dump(snapshot, sort_keys=False))
    return target


def test_go_lookup_srv_puts_the_near_tier_first_in_its_weights_share(
    go_program: Path, start_server: StartServer, tmp_path: Path
) -> None:
    # Every endpoint in priority 0, the zone's two sharing 80 of the weight: Go orders records
    # of one priority by weight at random (RFC 2782), so the first is the zone's 80% of times.
    server = start_server(snapshot=soft_snapshot(tmp_path))
    name = "_http._tcp.search.shop.svc.cluster.local."
    done = clients.go_resolve(go_program, server.address, "srv", name, LOOKUPS)
    assert done.returncode == 0, done.stderr
    firsts = done.stdout.splitlines()
    assert len(firsts) == LOOKUPS
    near = sum(line.split()[3].split(".")[0] in ("search-1", "search-2") for line in firsts)
    assert abs(near * 100 / LOOKUPS - 80) <= SHARE_MARGIN, near


@pytest.fixture(scope="session")
def glibc_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """getaddrinfo.c built with gcc (glibc's resolver), once per session."""
    reason = glibc.unavailable()
    if reason is None and shutil.which("gcc") is None:
        reason = "gcc is not installed (Debian: apt-get install gcc)"
    if reason is not None:
        pytest.skip(reason)
    return clients.build_glibc_getaddrinfo(tmp_path_factory.mktemp("glibc"))


def test_glibc_getaddrinfo_gets_the_near_tier_in_the_rotations_share(
    glibc_program: Path, start_server: StartServer, tmp_path: Path
) -> None:
    # A and AAAA rotate between tiers: of every 100 replies to this client, its zone's
    # replicas answer 80, every endpoint ("*") 20.
    address = glibc.free_loopback_53()
    start_server("--listen", f"{address}:53", snapshot=soft_snapshot(tmp_path))
    conf = glibc.resolv_conf(tmp_path, address, ["shop.svc.cluster.local"], "attempts:1")
    done = clients.musl_getaddrinfo(glibc_program, conf, "search.shop.svc.cluster.local.", LOOKUPS)
    assert done.returncode == 0, done.stderr
    replies = [set(line.split()) for line in done.stdout.splitlines()]
    assert len(replies) == LOOKUPS
    near = replies.count(NEAR)
    assert near + replies.count(EVERYONE) == LOOKUPS, "every reply is one tier's"
    assert abs(near * 100 / LOOKUPS - 80) <= SHARE_MARGIN, near


# --- unbound


def test_unbound_with_ecs_places_each_client(start_server: StartServer, tmp_path: Path) -> None:
    reason = clients.unbound_unavailable()
    if reason is not None:
        pytest.skip(reason)
    # unbound asks from 127.0.0.9, which only the ECS trust makes a forwarder.
    server = start_server("--ecs-trust", "127.0.0.9/32", snapshot=copy_snapshot(tmp_path, TOPOLOGY))
    listen = ("127.0.0.1", clients.free_port("127.0.0.1"))
    with clients.unbound(tmp_path, listen, "127.0.0.9", server.address, "cluster.local"):
        for _ in range(2):  # the second round from unbound's cache, kept per client
            for source, expected in (
                ("127.0.0.2", ["10.244.1.10"]),  # node-a, zone z1
                ("127.0.0.4", ["10.244.3.10", "10.244.3.11"]),  # zone z2
                ("127.0.0.6", ["10.244.1.10", "10.244.3.10", "10.244.3.11"]),  # nobody's
            ):
                query = dns.message.make_query("web.shop.svc.cluster.local.", "A")
                reply = dns.query.udp(query, listen[0], port=listen[1], source=source, timeout=3)
                found = sorted(rr.address for rrset in reply.answer for rr in rrset)
                assert found == expected, source


# --- PowerDNS Recursor


def test_pdns_recursor_never_spreads_a_topology_nodata_to_another_zone(
    start_server: StartServer, tmp_path: Path
) -> None:
    # PowerDNS Recursor 4.8 caches a negative answer for every subnet, whatever its ECS scope:
    # the topology NODATA's negative TTL of 0 keeps it from being cached at all.
    reason = clients.pdns_recursor_unavailable()
    if reason is not None:
        pytest.skip(reason)
    server = start_server("--ecs-trust", "127.0.0.9/32", snapshot=copy_snapshot(tmp_path, TOPOLOGY))
    listen = ("127.0.0.1", clients.free_port("127.0.0.1"))
    name = "ledger.shop.svc.cluster.local."  # zone-only: nothing for zone z3
    with clients.pdns_recursor(tmp_path, listen, "127.0.0.9", server.address, "cluster.local"):
        for _ in range(3):  # again and again, well within any TTL the manifests set
            for source, expected in (
                ("127.0.0.5", []),  # node-d, zone z3: NODATA
                ("127.0.0.2", ["10.244.1.20"]),  # zone z1
                ("127.0.0.4", ["10.244.3.20"]),  # zone z2
            ):
                query = dns.message.make_query(name, "A")
                reply = dns.query.udp(query, listen[0], port=listen[1], source=source, timeout=3)
                assert reply.rcode() == dns.rcode.NOERROR, source
                found = sorted(rr.address for rrset in reply.answer for rr in rrset)
                assert found == expected, source


def test_unbound_places_an_ipv6_client_by_its_64(start_server: StartServer, tmp_path: Path) -> None:
    # The guide's setting, max-client-subnet-ipv6: 64: a /64 fits a node's pod range whole,
    # where unbound's default /56 spans many nodes' and places nobody.
    reason = clients.unbound_unavailable()
    if reason is not None:
        pytest.skip(reason)
    snapshot = yaml.safe_load(TOPOLOGY.read_text())
    snapshot["items"].append(
        objects.pod_locator(
            "node-c-pods",
            "toposdns",
            addresses=[],
            cidrs=["fd00:10:244:3::/64"],
            node_name="node-c",
            node_labels={"kubernetes.io/hostname": "node-c", "topology.kubernetes.io/zone": "z2"},
        )
    )
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump(snapshot, sort_keys=False))
    server = start_server("--ecs-trust", "127.0.0.9/32", snapshot=path)
    listen = ("127.0.0.1", clients.free_port("127.0.0.1"))
    with clients.unbound(
        tmp_path, listen, "127.0.0.9", server.address, "cluster.local", ipv6_bits=64
    ):
        # The client's own Client Subnet, as a pod behind a node-local forwarder sends it.
        option = dns.edns.ECSOption("fd00:10:244:3::7", 128)
        query = dns.message.make_query("web.shop.svc.cluster.local.", "A", use_edns=0)
        query.use_edns(0, options=[option])
        reply = dns.query.udp(query, listen[0], port=listen[1], source="127.0.0.6", timeout=3)
        found = sorted(rr.address for rrset in reply.answer for rr in rrset)
        assert found == ["10.244.3.10", "10.244.3.11"]  # zone z2's, not everyone's
