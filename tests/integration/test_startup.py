"""Starting the server: a bad snapshot stops it with a precise error; options change answers."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import dns.message
import dns.rcode
import pytest

from tests.integration.support import REPO, Server, StartServer, addresses, rrset_texts, udp

pytestmark = pytest.mark.integration

SERVICE = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Namespace
  metadata: {{name: shop}}
- apiVersion: v1
  kind: Service
  metadata: {{name: web, namespace: shop}}
  spec:
{spec}
"""


def run_serve(snapshot: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "toposdns",
            "serve",
            "--snapshot",
            str(snapshot),
            "--listen",
            "127.0.0.1:0",
            *args,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=10,
    )


def test_bad_object_stops_start_with_file_object_and_field(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(
        SERVICE.format(spec="    clusterIP: 10.96.0.5\n    ports:\n    - {name: http, port: x80}")
    )
    done = run_serve(snapshot)
    assert done.returncode == 1, done.stderr
    assert "serving DNS on" not in done.stderr
    error = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(error) == 1, done.stderr
    assert str(snapshot) in error[0]
    assert "Service shop/web" in error[0]
    assert "spec.ports[0].port" in error[0]
    assert "'x80'" in error[0]


def test_bad_cluster_ip_names_the_field_that_holds_it(tmp_path: Path) -> None:
    # Only spec.clusterIP is set, so the error must name spec.clusterIP, not spec.clusterIPs.
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(
        SERVICE.format(spec="    clusterIP: 10.96.0.300\n    ports:\n    - {name: http, port: 80}")
    )
    done = run_serve(snapshot)
    assert done.returncode == 1, done.stderr
    assert str(snapshot) in done.stderr and "Service shop/web" in done.stderr
    assert "'10.96.0.300'" in done.stderr
    fields = re.findall(r"Service shop/web: (spec\.\w+):", done.stderr)
    assert fields == ["spec.clusterIP"], done.stderr


def test_bad_endpoint_address_stops_start(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(
        SERVICE.format(spec="    clusterIP: None")
        + """\
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-abc
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  endpoints:
  - addresses: [10.244.0.1]
  - addresses: [not-an-ip]
"""
    )
    done = run_serve(snapshot)
    assert done.returncode == 1, done.stderr
    assert str(snapshot) in done.stderr
    assert "EndpointSlice shop/web-abc: endpoints[1].addresses" in done.stderr
    assert "not-an-ip" in done.stderr


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (None, "cannot read"),
        ("items: [unclosed\n", "not valid YAML or JSON"),
        ('{"kind": "List", "items": [{"kind": "Pod", "apiVersion": "v1"}]}', "Pod"),
    ],
    ids=["missing", "yaml", "unsupported-kind"],
)
def test_unloadable_file_stops_start(tmp_path: Path, content: str | None, reason: str) -> None:
    snapshot = tmp_path / "cluster.yaml"
    if content is not None:
        snapshot.write_text(content)
    done = run_serve(snapshot)
    assert done.returncode == 1, done.stderr
    assert str(snapshot) in done.stderr and reason in done.stderr


def test_bad_option_exits_2(tmp_path: Path) -> None:
    snapshot = tmp_path / "cluster.yaml"
    snapshot.write_text(SERVICE.format(spec="    clusterIP: 10.96.0.5"))
    done = run_serve(snapshot, "--ttl", "99999")
    assert done.returncode == 2
    assert "--ttl 99999" in done.stderr


def ask(server: Server, name: str, rtype: str = "A") -> dns.message.Message:
    return udp(server, dns.message.make_query(name, rtype))


def test_answer_options(start_server: StartServer) -> None:
    server = start_server(
        "--ttl",
        "30",
        "--zone",
        "Example.ORG",
        "--zone",
        "cluster.local,in-addr.arpa",
        "--pods",
        "insecure",
        "--endpoint-pod-names",
        "--namespaces",
        "shop",
        "--cache-max-bytes",
        "8Mi",
        "--forward-cache-max-bytes",
        "4Mi",
    )
    assert (
        "caches: in-zone replies up to 8.0 MiB, each forward cache up to 4.0 MiB, per DNS "
        "process (as set)" in server.log()
    )
    assert "for example.org., cluster.local., in-addr.arpa." in server.log()
    reply = ask(server, "frontend.shop.svc.cluster.local.")
    assert rrset_texts(reply.answer) == {"frontend.shop.svc.cluster.local. 30 IN A 10.96.10.10"}
    other = ask(server, "frontend.shop.svc.example.org.")
    assert rrset_texts(other.answer) == {"frontend.shop.svc.example.org. 30 IN A 10.96.10.10"}
    # PTR targets are in the first forward zone, as configured (case kept).
    ptr = ask(server, "10.10.96.10.in-addr.arpa.", "PTR")
    assert rrset_texts(ptr.answer) == {
        "10.10.96.10.in-addr.arpa. 30 IN PTR frontend.shop.svc.Example.ORG."
    }
    # ip6.arpa is no longer served.
    assert (
        ask(
            server,
            "0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.1.0.0.0.0.d.f.ip6.arpa.",
            "PTR",
        ).rcode()
        == dns.rcode.REFUSED
    )
    # --namespaces shop hides data; the SOA minimum and TTL follow --ttl 30.
    hidden = ask(server, "workers.data.svc.cluster.local.")
    assert hidden.rcode() == dns.rcode.NXDOMAIN
    soa = hidden.authority[0][0]
    assert hidden.authority[0].ttl == 30 and soa.minimum == 30
    # --pods insecure answers any IP-shaped label in an existing namespace.
    pod = ask(server, "10-1-2-3.shop.pod.cluster.local.")
    assert rrset_texts(pod.answer) == {"10-1-2-3.shop.pod.cluster.local. 30 IN A 10.1.2.3"}
    # --endpoint-pod-names: an endpoint without a hostname answers under its pod name.
    named = ask(server, "frontend-7d9c-x1.frontend.shop.svc.cluster.local.")
    assert addresses(named) == {"10.244.1.20"}
    assert ask(server, "10-244-1-20.frontend.shop.svc.cluster.local.").rcode() == (
        dns.rcode.NXDOMAIN
    )


def test_default_options(shared_server: Server) -> None:
    assert "for cluster.local., in-addr.arpa., ip6.arpa." in shared_server.log()
    # The caches' bounds and where they come from: the defaults, or the runner's cgroup limit.
    assert re.search(
        r"caches: in-zone replies up to 32\.0 MiB, each forward cache up to 16\.0 MiB, per DNS "
        r"process \(no container memory limit: the defaults\)|from the container's memory "
        r"limit of \d+ MiB\)",
        shared_server.log(),
    )
    pod = ask(shared_server, "10-1-2-3.shop.pod.cluster.local.")
    assert pod.rcode() == dns.rcode.NXDOMAIN  # pods disabled
    named = ask(shared_server, "frontend-7d9c-x1.frontend.shop.svc.cluster.local.")
    assert named.rcode() == dns.rcode.NXDOMAIN
    dashed = ask(shared_server, "10-244-1-20.frontend.shop.svc.cluster.local.")
    assert rrset_texts(dashed.answer) == {
        "10-244-1-20.frontend.shop.svc.cluster.local. 5 IN A 10.244.1.20"
    }


def test_sigint_exits_0_and_logs_shutdown(start_server: StartServer) -> None:
    server = start_server()
    assert addresses(ask(server, "frontend.shop.svc.cluster.local.")) == {"10.96.10.10"}
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(5.0) == 0
    server.wait_for_log(r"INFO shutting down", timeout=2.0)


@pytest.mark.parametrize(
    ("flag", "what"),
    [("--metrics", " (/metrics)"), ("--health", " (/health)"), ("--listen", "")],
    ids=["metrics", "health", "dns"],
)
def test_a_busy_port_is_one_line_naming_its_address(flag: str, what: str, tmp_path: Path) -> None:
    # The error names the address that is taken (and what it was for), not the DNS one.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_serve(REPO / "examples" / "cluster.yaml", flag, f"127.0.0.1:{port}")
    assert done.returncode == 1, done.stderr
    # Besides the startup lines (INFO), one line says what went wrong.
    errors = "".join(line for line in done.stderr.splitlines(True) if " INFO " not in line)
    assert re.fullmatch(
        rf"\S+ \S+ ERROR cannot listen on 127\.0\.0\.1:{port}{re.escape(what)}: "
        r"Address already in use\n",
        errors,
    ), done.stderr
