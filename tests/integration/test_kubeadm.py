"""kubeadm's Corefile lines through the real server: `fallthrough in-addr.arpa ip6.arpa` sends
the reverse names the cluster does not have to the upstream, and `loadbalance` varies the order
of address records over UDP and TCP, plain and topology-filtered, but never SRV's."""

from __future__ import annotations

from pathlib import Path

import dns.message
import pytest

from tests.integration.support import Server, StartServer, copy_snapshot, dig, tcp, udp
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

REVERSE = {
    ("8.8.8.8.in-addr.arpa", "PTR"): ["8.8.8.8.in-addr.arpa. 300 IN PTR dns.google."],
}
UNKNOWN_V6 = "2001:db8::1"
TOPOLOGY = Path(__file__).parents[2] / "examples" / "topology.yaml"


def test_unknown_reverse_names_fall_through_to_the_upstream(start_server: StartServer) -> None:
    with stub_upstream(REVERSE) as upstream:
        server = start_server(
            "--upstream", f"127.0.0.1:{upstream.port}", "--fallthrough", "in-addr.arpa,ip6.arpa"
        )
        for transport in (["+tcp"], []):
            out = dig(server, "-x", "8.8.8.8", *transport)
            assert out.status == "NOERROR" and out.rdata("PTR") == ["dns.google."]
            assert "ra" in out.flags
        assert "aa" in out.flags  # the second from the cache, whatever the transport
        ptr = "8.8.8.8.in-addr.arpa"
        asked = [(proto, qtype) for proto, name, qtype in upstream.queries if name == ptr]
        assert asked == [("tcp", "PTR")]  # as the client asked
        # The upstream's NXDOMAIN (its own SOA) for an address it does not know either.
        v6 = dig(server, "-x", UNKNOWN_V6)
        assert v6.status == "NXDOMAIN" and v6.authority[0][0] == "test."
        # What the cluster has, and names in other zones, are answered here.
        known = dig(server, "-x", "10.96.10.10")
        assert known.rdata("PTR") == ["frontend.shop.svc.cluster.local."] and "aa" in known.flags
        missing = dig(server, "nothere.shop.svc.cluster.local")
        assert missing.status == "NXDOMAIN" and missing.authority[0][0] == "cluster.local."
        assert all(name.endswith(".arpa") for name in upstream.names())


def test_without_upstreams_what_falls_through_is_servfail(start_server: StartServer) -> None:
    server = start_server("--fallthrough", "in-addr.arpa")
    out = dig(server, "-x", "8.8.8.8")
    assert out.status == "SERVFAIL" and "aa" not in out.flags and not out.authority


def orders(
    server: Server, name: str, rtype: str = "A", count: int = 40
) -> set[tuple[tuple[str, ...], tuple[str, ...]]]:
    """The orders in which `count` replies over UDP and as many over TCP list their records:
    (answer, additional)."""
    seen = set()
    for _ in range(count):
        query = dns.message.make_query(name, rtype)
        for send in (udp, tcp):
            reply = send(server, query)
            seen.add(
                (
                    tuple(rd.to_text() for rrset in reply.answer for rd in rrset),
                    tuple(rd.to_text() for rrset in reply.additional for rd in rrset),
                )
            )
    return seen


def test_loadbalance_varies_the_order_of_addresses(start_server: StartServer) -> None:
    server = start_server("--loadbalance")
    seen = orders(server, "workers.data.svc.cluster.local")
    assert len(seen) > 1
    assert {tuple(sorted(answer)) for answer, _ in seen} == {("10.244.3.5", "10.244.3.6")}
    # SRV records keep their order and weights; their addresses in additional move.
    srv = orders(server, "_grpc._tcp.workers.data.svc.cluster.local", "SRV")
    assert len({answer for answer, _ in srv}) == 1
    assert len({additional for _, additional in srv}) > 1
    # One record: nothing to vary.
    assert len(orders(server, "frontend.shop.svc.cluster.local", count=5)) == 1


def test_without_loadbalance_the_order_stays(start_server: StartServer) -> None:
    server = start_server()
    assert len(orders(server, "workers.data.svc.cluster.local", count=10)) == 1


def test_loadbalance_varies_topology_filtered_answers(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = start_server("--loadbalance", snapshot=copy_snapshot(tmp_path, TOPOLOGY))
    # 127.0.0.4 is on node-c, which holds two of web's three endpoints.
    seen = set()
    for _ in range(40):
        out = dig(server, "-b", "127.0.0.4", "web.shop.svc.cluster.local", "+short")
        seen.add(tuple(out.text.split()))
        if len(seen) > 1:
            break
    assert seen == {("10.244.3.10", "10.244.3.11"), ("10.244.3.11", "10.244.3.10")}
