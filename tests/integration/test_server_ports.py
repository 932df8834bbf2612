"""Server blocks on several ports, as CoreDNS serves them: each port a server of its own, whose
queries go to its own blocks by zone; in one process and with workers, each port counted under
its own `server` label; and a port that cannot be bound named when startup stops."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import (
    REPO,
    CorefileServer,
    ask_port,
    copy_snapshot,
    free_ports,
    http_get,
    rrset_texts,
    wait_until,
)
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

CLUSTER = "frontend.shop.svc.cluster.local"
FIRST = {
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.1"],
    ("www.example.net", "A"): ["www.example.net. 300 IN A 192.0.2.11"],
}
SECOND = {
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.2"],
    ("www.example.net", "A"): ["www.example.net. 300 IN A 192.0.2.22"],
}
THIRD = {("example.org", "A"): ["example.org. 300 IN A 192.0.2.3"]}
#: Queries asked of each port, over each transport, in each test.
ROUNDS = 6


def corefile(tmp_path: Path, ports: dict[str, int], upstreams: list[int], workers: int) -> Path:
    """The kubernetes block on the first port, forwarding to the first upstream; `.` (with a
    template for ip-A-B.example.net) and example.org on the second port, forwarding to the
    second and third."""
    snapshot = copy_snapshot(tmp_path)
    first, second, third = upstreams
    path = tmp_path / "Corefile"
    path.write_text(
        f""".:{ports["one"]} {{
    bind 127.0.0.1
    errors
    log
    kubernetes cluster.local
    prometheus 127.0.0.1:{ports["metrics"]}
    forward . 127.0.0.1:{first}
    toposdns {{
        snapshot {snapshot}
        workers {workers}
    }}
}}
.:{ports["two"]} {{
    errors
    log
    prometheus 127.0.0.1:{ports["metrics"]}
    template IN A example.net {{
        match "^ip-(?P<a>[0-9]+)-(?P<b>[0-9]+)[.]example[.]net[.]$"
        answer "{{{{ .Name }}}} 60 IN A 192.0.{{{{ .Group.a }}}}.{{{{ .Group.b }}}}"
        fallthrough
    }}
    forward . 127.0.0.1:{second}
}}
example.org:{ports["two"]} {{
    forward . 127.0.0.1:{third}
}}
"""
    )
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_each_port_answers_its_own_blocks(tmp_path: Path, workers: int) -> None:
    ports = free_ports("one", "two", "metrics")
    one, two = ports["one"], ports["two"]
    with stub_upstream(FIRST) as up1, stub_upstream(SECOND) as up2, stub_upstream(THIRD) as up3:
        path = corefile(tmp_path, ports, [up1.port, up2.port, up3.port], workers)
        out = tmp_path / "stdout"
        # The server's stdout, where `log` writes, into a file (the harness reads its stderr).
        server = CorefileServer(path, wrapper=("sh", "-c", 'exec "$@" >"$0"', str(out)))
        try:
            server.wait_ready(30)
            assert server.port == one  # the first "serving DNS" line is the kubernetes port's
            line = server.wait_for_log(rf"serving DNS on 127\.0\.0\.1:{two} \(udp, tcp\) for (.*)")
            assert line.group(1).startswith("., example.org.")
            for round in range(ROUNDS):
                tcp = bool(round % 2)
                # The kubernetes block's port: the cluster, and its forward for the rest.
                assert ask(one, CLUSTER, tcp).answer
                assert rrset_texts(ask(one, "example.org", tcp).answer) == {
                    "example.org. 300 IN A 192.0.2.1"
                }
                # The second port: its `.` block's upstream, and example.org's own.
                assert rrset_texts(ask(two, "www.example.net", tcp).answer) == {
                    "www.example.net. 300 IN A 192.0.2.22"
                }
                # Routed by its zone whatever the letter case.
                assert rrset_texts(ask(two, "EXAMPLE.org", tcp).answer) == {
                    "example.org. 300 IN A 192.0.2.3"
                }
                # The cluster's names are not the second port's: its `.` block forwards them.
                assert ask(two, CLUSTER, tcp).rcode() == dns.rcode.NXDOMAIN
                # Its template answers before its forward, on its port only.
                assert rrset_texts(ask(two, "ip-7-8.example.net", tcp).answer) == {
                    "ip-7-8.example.net. 60 IN A 192.0.7.8"
                }
                assert ask(one, "ip-7-8.example.net", tcp).rcode() == dns.rcode.NXDOMAIN
            assert set(up1.names()) == {"example.org", "ip-7-8.example.net"}
            assert set(up2.names()) == {"www.example.net", CLUSTER}
            assert set(up3.names()) == {"example.org"}
            status, text = http_get(ports["metrics"], "/metrics")
            assert status == 200, text
            families = {f.name: f for f in text_string_to_metric_families(text)}
            # The servers' addresses, as CoreDNS's labels write them (the second port's blocks
            # listen on the kubernetes block's `bind` address).
            first, second = f"dns://127.0.0.1:{one}", f"dns://127.0.0.1:{two}"
            requests: dict[str, float] = {}
            for sample in families["coredns_dns_requests"].samples:
                server_label = sample.labels["server"]
                requests[server_label] = requests.get(server_label, 0) + sample.value
            assert requests == {
                first: 3 * ROUNDS,
                # example.org's block has no `prometheus`: its queries are not counted.
                second: 3 * ROUNDS,
            }
            matches = families["coredns_template_matches"].samples
            assert {(s.labels["server"], s.value) for s in matches} == {(second, ROUNDS)}
            enabled = {
                (s.labels["server"], s.labels["zone"], s.labels["name"])
                for s in families["coredns_plugin_enabled"].samples
            }
            # As CoreDNS's: per block with `prometheus`, per zone (example.org's has none).
            assert {(server, zone) for server, zone, _ in enabled} == {
                (first, "."),
                (second, "."),
            }
            assert {name for server, _, name in enabled if server == second} == {
                "errors",
                "log",
                "prometheus",
                "template",
                "forward",
            }
            # `log` in a block of the second port logs its queries too (as the kubernetes
            # block's `log` says).
            logged = lambda: out.read_text().count('"A IN www.example.net. ')  # noqa: E731
            assert wait_until(lambda: logged() == ROUNDS, 5), out.read_text()
        finally:
            assert server.stop() == 0, server.log()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_port_that_cannot_be_bound_is_named(tmp_path: Path, workers: int) -> None:
    ports = free_ports("one", "two", "metrics")
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        taken.bind(("127.0.0.1", ports["two"]))
        path = corefile(tmp_path, ports, [1, 2, 3], workers)
        done = subprocess.run(
            [sys.executable, "-m", "toposdns", "-conf", str(path)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        taken.close()
    assert done.returncode == 1, done.stderr
    assert "serving DNS on" not in done.stderr
    found = re.search(r"cannot listen on (\S+) \(the server block at (\S+)\): (.*)", done.stderr)
    assert found is not None, done.stderr
    assert found.group(1) == f"127.0.0.1:{ports['two']}"
    assert found.group(2) == f"{path}:13"  # the first block on the port
    assert "in use" in found.group(3)


def ask(port: int, name: str, tcp: bool) -> dns.message.Message:
    return ask_port(port, name, tcp=tcp)
