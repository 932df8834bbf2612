"""`--autopath` through the real server with a stub upstream: a pod's first search-path query
gets the final answer behind a CNAME; nodes and strangers get the plain answers. Then glibc's
resolver as the pod (`getent ahosts`), counting the queries that reach the server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import glibc
from tests.integration.support import Dig, StartServer, copy_snapshot, dig, metric_total
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

TOPOLOGY = Path(__file__).parents[2] / "examples" / "topology.yaml"
UPSTREAM = {
    ("api.example.com", "A"): ["api.example.com. 60 IN A 192.0.2.80"],
    ("api.example.com", "AAAA"): [],  # NODATA
    ("intranet.corp.example", "A"): ["intranet.corp.example. 60 IN A 192.0.2.90"],
}
# The pods of examples/topology.yaml: 127.0.0.2 is a pod of namespace shop on node-a,
# 127.0.0.5 a node locator, 127.0.0.9 nobody.
POD, NODE, STRANGER = "127.0.0.2", "127.0.0.5", "127.0.0.9"


def node_resolv_conf(directory: Path) -> Path:
    path = directory / "node-resolv.conf"
    path.write_text("nameserver 192.0.2.53\nsearch corp.example\n")
    return path


def records(out: Dig) -> list[str]:
    return [" ".join(rr) for rr in out.answer]


def test_a_pods_first_query_gets_the_final_answer(
    start_server: StartServer, tmp_path: Path
) -> None:
    with stub_upstream(UPSTREAM) as upstream:
        server = start_server(
            "--upstream",
            f"127.0.0.1:{upstream.port}",
            "--autopath",
            "--autopath-resolv-conf",
            str(node_resolv_conf(tmp_path)),
            snapshot=copy_snapshot(tmp_path, TOPOLOGY),
        )
        for transport in ([], ["+tcp"]):
            out = dig(server, "-b", POD, "api.example.com.shop.svc.cluster.local", *transport)
            assert out.status == "NOERROR"
            assert records(out) == [
                "api.example.com.shop.svc.cluster.local. 60 IN CNAME api.example.com.",
                "api.example.com. 60 IN A 192.0.2.80",
            ]
        assert upstream.names()[:2] == [
            "api.example.com.corp.example",  # the node's search domain, NXDOMAIN there
            "api.example.com",
        ]
        # The node's search domain has it.
        out = dig(server, "-b", POD, "intranet.shop.svc.cluster.local")
        assert records(out) == [
            "intranet.shop.svc.cluster.local. 60 IN CNAME intranet.corp.example.",
            "intranet.corp.example. 60 IN A 192.0.2.90",
        ]
        # The cluster has it, one namespace up the path; topology still applies (node-a).
        out = dig(server, "-b", POD, "web.shop.shop.svc.cluster.local")
        assert "aa" in out.flags and records(out) == [
            "web.shop.shop.svc.cluster.local. 5 IN CNAME web.shop.svc.cluster.local.",
            "web.shop.svc.cluster.local. 5 IN A 10.244.1.10",
        ]
        asked = len(upstream.names())
        for source in (NODE, STRANGER):
            out = dig(server, "-b", source, "api.example.com.shop.svc.cluster.local")
            assert out.status == "NXDOMAIN" and not out.answer
        assert len(upstream.names()) == asked


def pod_snapshot(directory: Path) -> Path:
    """examples/topology.yaml plus a pod of shop at 127.0.0.1, where glibc's queries come from."""
    path = copy_snapshot(directory, TOPOLOGY)
    with path.open("a") as file:
        file.write(glibc.pod_locator("shop"))
    return path


@pytest.mark.parametrize(("autopath", "queries"), [(False, 10), (True, 2)])
def test_glibc_as_the_pod(
    start_server: StartServer, tmp_path: Path, autopath: bool, queries: int
) -> None:
    reason = glibc.unavailable()
    if reason is not None:
        pytest.skip(f"glibc as a client: {reason}")
    address = glibc.free_loopback_53()
    with stub_upstream(UPSTREAM) as upstream:
        options = ["--autopath", "--autopath-resolv-conf", str(node_resolv_conf(tmp_path))]
        server = start_server(
            "--listen",
            f"{address}:53",
            "--http",
            "127.0.0.1:0",
            "--upstream",
            f"127.0.0.1:{upstream.port}",
            *(options if autopath else []),
            snapshot=pod_snapshot(tmp_path),
        )
        http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        # The kubelet's resolv.conf for a pod of shop on a node that searches corp.example.
        search = ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example"]
        # One attempt with a short timeout: a lost query fails the test instead of inflating it.
        conf = glibc.resolv_conf(tmp_path, address, search, "ndots:5 attempts:1 timeout:2")
        done = glibc.getent_ahosts(conf, "api.example.com")
        assert done.returncode == 0, done.stderr
        assert glibc.addresses(done) == {"192.0.2.80"}
        # A and AAAA for each of 4 search domains, then for the name itself; or once.
        assert metric_total(http, "coredns_dns_requests_total") == queries
