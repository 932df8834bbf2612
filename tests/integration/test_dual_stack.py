"""IPv4 clients of a server bound to `::`: a dual-stack socket gives them IPv4-mapped
(`::ffff:127.0.0.2`), and every address rule must still read them as IPv4 addresses, as CoreDNS
does: `acl`, `--forward-allow`, placement by PodLocator, and the metrics' `family`."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import dns.edns
import dns.message
import dns.query
import dns.rcode
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import READY_LINE, addresses, copy_snapshot, http_get
from tests.server_process import ServerProcess, toposdns_command
from tests.upstream import StubUpstream, stub_upstream

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"
WEB = "web.shop.svc.cluster.local"
UPSTREAM = {("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"]}


def dual_stack() -> bool:
    """Whether an IPv6 socket bound to `::` takes IPv4 clients here (net.ipv6.bindv6only=0)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as server:
            server.bind(("::", 0))
            server.settimeout(1)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
                client.sendto(b"x", ("127.0.0.1", server.getsockname()[1]))
                return server.recvfrom(16)[1][0] == "::ffff:127.0.0.1"
    except OSError:
        return False


def free_port() -> int:
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind(("::", 0))
        return int(sock.getsockname()[1])


class Running:
    """The server, its DNS and metrics ports, and the upstream it forwards to."""

    def __init__(self, process: ServerProcess, port: int, metrics: int, up: StubUpstream) -> None:
        self.process, self.port, self.metrics, self.upstream = process, port, metrics, up


@pytest.fixture(params=["on", "off"], ids=["batched", "unbatched"])
def running(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Running]:
    if not dual_stack():
        pytest.skip("IPv6 sockets bound to :: take no IPv4 clients here (net.ipv6.bindv6only)")
    snapshot = copy_snapshot(tmp_path, EXAMPLES / "topology.yaml")
    port, metrics = free_port(), free_port()
    with stub_upstream(UPSTREAM) as upstream:
        corefile = tmp_path / "Corefile"
        corefile.write_text(
            f".:{port} {{\n  bind ::\n  kubernetes cluster.local\n"
            f"  acl {{\n    block net 127.0.0.3\n  }}\n"
            f"  forward . 127.0.0.1:{upstream.port}\n  prometheus 127.0.0.1:{metrics}\n"
            f"  toposdns {{\n    snapshot {snapshot}\n    workers 1\n"
            f"    udp_batch {request.param}\n  }}\n}}\n"
        )
        command = toposdns_command(
            "serve", "--corefile", str(corefile), "--forward-allow", "127.0.0.2/32,127.0.0.4/32"
        )
        process = ServerProcess(command)
        try:
            found = process.wait_for_log(READY_LINE, timeout=30)
            assert found.group(1) == "::"
            yield Running(process, port, metrics, upstream)
        finally:
            assert process.stop() == 0, process.log()


def ask(running: Running, name: str, source: str, tcp: bool) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    send = dns.query.tcp if tcp else dns.query.udp
    return send(query, "127.0.0.1", port=running.port, timeout=2, source=source)


@pytest.mark.parametrize("tcp", [False, True], ids=["udp", "tcp"])
def test_ipv4_clients_of_a_dual_stack_socket_meet_the_ipv4_rules(
    running: Running, tcp: bool
) -> None:
    # acl: 127.0.0.3 is blocked; the others are not.
    blocked = ask(running, WEB, "127.0.0.3", tcp)
    assert blocked.rcode() == dns.rcode.REFUSED and not blocked.answer
    assert [option.code for option in blocked.options] == [dns.edns.EDE]
    # --forward-allow: 127.0.0.2 and .4 are forwarded, 127.0.0.5 is refused.
    for source in ("127.0.0.2", "127.0.0.4"):
        forwarded = ask(running, "www.example.test", source, tcp)
        assert addresses(forwarded) == {"192.0.2.10"}, source
    assert ask(running, "www.example.test", "127.0.0.5", tcp).rcode() == dns.rcode.REFUSED
    # Placement: each client gets its own zone's endpoints, twice (the second from the cache).
    for _ in range(2):
        assert addresses(ask(running, WEB, "127.0.0.2", tcp)) == {"10.244.1.10"}
        assert addresses(ask(running, WEB, "127.0.0.4", tcp)) == {"10.244.3.10", "10.244.3.11"}
    # Counted as IPv4 queries, as CoreDNS counts them.
    status, text = http_get(running.metrics, "/metrics")
    assert status == 200
    families = {
        sample.labels["family"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "coredns_dns_requests_total" and sample.value
    }
    assert families == {"1"}, text
