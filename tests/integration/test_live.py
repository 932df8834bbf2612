"""The real server process watching the stand-in API server: SERVFAIL and /ready 503 until the
first sync, answers that follow watch events within a second, and data kept when the API goes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.support import STOP_TIMEOUT, Server, dig, http_get, wait_until
from tests.kubeapi import FakeApiServer
from tests.objects import endpoint, headless, namespace, pod_locator, service

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serves_the_cluster_from_the_api(api: FakeApiServer, tmp_path: Path, workers: str) -> None:
    api.fail_next("services", 500, count=4)  # holds the first sync back for a second or more
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    options = ("--http", "127.0.0.1:0", "--startup-timeout", "0.2", "--workers", workers)
    server = Server(None, ("--kubeconfig", str(kubeconfig), *options))
    try:
        server.wait_ready()
        http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        assert http_get(http, "/health") == (200, "OK")
        assert http_get(http, "/ready") == (503, "kubernetes")
        unsynced = dig(server, "nothing.shop.svc.cluster.local")
        assert unsynced.status == "SERVFAIL" and "aa" in unsynced.flags
        assert [rr[3] for rr in unsynced.authority] == ["SOA"]

        assert wait_until(lambda: http_get(http, "/ready") == (200, "OK"), timeout=10)
        assert dig(server, "web.shop.svc.cluster.local", "+short").text.split() == ["10.96.0.5"]
        assert dig(server, "nothing.shop.svc.cluster.local").status == "NXDOMAIN"

        api.wait_for_watches(4)
        api.modify(service("web", cluster_ip="10.96.0.6"))
        changed = time.monotonic()
        assert wait_until(
            lambda: (
                dig(server, "web.shop.svc.cluster.local", "+short").text.split() == ["10.96.0.6"]
            ),
            timeout=1.0,
            interval=0.02,
        )
        assert time.monotonic() - changed < 1.0

        api.stop()  # the API server goes away: keep answering from the last data
        # One line for the outage, not one per watch and retry.
        server.wait_for_log(r"API unreachable since \d\d:\d\d:\d\d: .*retrying", timeout=5)
        assert dig(server, "web.shop.svc.cluster.local", "+short").text.split() == ["10.96.0.6"]
        assert http_get(http, "/ready") == (200, "OK")
        status, metrics = http_get(http, "/metrics")
        assert status == 200
        assert 'toposdns_watch_restarts_total{reason="error",resource="services"}' in metrics
        assert 'toposdns_kubernetes_api_errors_total{resource="services"}' in metrics
        assert server.log().count("API unreachable") == 1
        # The 500s at startup were the API server's answers, logged each; the outage is not.
        outage = server.log().partition("API unreachable")[2]
        assert "still serving the last data" not in outage
    finally:
        assert server.stop(STOP_TIMEOUT) == 0, server.log()


ZONE = "topology.kubernetes.io/zone"
Z1 = {"kubernetes.io/hostname": "node-a", ZONE: "z1"}
Z2 = {"kubernetes.io/hostname": "node-b", ZONE: "z2"}
#: Clients (dig -b): two pods in node ranges, one with a locator of its own.
ON_NODE_A, OWN_LOCATOR, ON_NODE_B = "127.0.0.2", "127.0.0.3", "127.0.0.4"


def trusted_cluster() -> list[dict[str, Any]]:
    """Service shop/db, one endpoint per zone, asking for the client's zone (no "*"); and the
    locators the controller writes, in its namespace: node-a in z1 with ON_NODE_A in its
    range, node-b in z2 with ON_NODE_B in its range, and OWN_LOCATOR, a pod of shop on node-b."""
    endpoints = [
        endpoint("10.244.1.10", nodeName="node-a", zone="z1"),
        endpoint("10.244.2.10", nodeName="node-b", zone="z2"),
    ]
    ns = "toposdns"
    return [
        *headless("db", "shop", endpoints, annotations={"toposdns.io/topology-keys": ZONE}),
        pod_locator("node-a", ns, addresses=["192.168.0.1"], cidrs=[f"{ON_NODE_A}/32"],
                    node_name="node-a", node_labels=Z1, role="node"),
        pod_locator("node-b", ns, addresses=["192.168.0.2"], cidrs=[f"{ON_NODE_B}/32"],
                    node_name="node-b", node_labels=Z2, role="node"),
        pod_locator("shop.client", ns, addresses=[OWN_LOCATOR], node_name="node-b",
                    node_labels=Z2, labels={"toposdns.io/pod-namespace": "shop"}),
    ]  # fmt: skip


def tenant_locators() -> list[dict[str, Any]]:
    """What a namespace admin who may write PodLocators in namespace tenant would write to
    move the clients of shop: exact addresses (over a node's range, and over the pod's own
    locator, with a name that sorts first), a node's range claimed again (nobody in it is
    placed), and the node label (an endpoint on node-a taken for one in z2)."""
    ns = "tenant"
    return [
        pod_locator("grab", ns, addresses=[ON_NODE_A], node_name="node-b", node_labels=Z2),
        pod_locator("steal", ns, addresses=[OWN_LOCATOR], node_name="node-a", node_labels=Z1),
        pod_locator("claim", ns, addresses=None, cidrs=[f"{ON_NODE_B}/32"],
                    node_name="node-a", node_labels=Z1),
        pod_locator("fake", ns, addresses=["10.77.0.1"], node_name="node-a",
                    node_labels=Z2, role="node"),
    ]  # fmt: skip


def db_for(server: Server, client: str) -> list[str]:
    return sorted(dig(server, "-b", client, "db.shop.svc.cluster.local", "+short").text.split())


#: Each client's answer from the controller's locators alone: its own zone's endpoint.
TRUE_ANSWERS = {
    ON_NODE_A: ["10.244.1.10"],
    OWN_LOCATOR: ["10.244.2.10"],
    ON_NODE_B: ["10.244.2.10"],
}
#: Each client's answer with the tenant's locators believed: ON_NODE_A is taken for a client
#: in z2, where node-a's endpoint now seems to be too; OWN_LOCATOR for one in z1, where no
#: endpoint is left; ON_NODE_B for nobody.
MOVED_ANSWERS: dict[str, list[str]] = {
    ON_NODE_A: ["10.244.1.10", "10.244.2.10"],
    OWN_LOCATOR: [],
    ON_NODE_B: [],
}


@pytest.mark.parametrize("believed", ["toposdns", "*"])
def test_a_tenants_podlocators_change_no_other_namespaces_answer(
    api: FakeApiServer, tmp_path: Path, believed: str
) -> None:
    for obj in [namespace("tenant"), *trusted_cluster(), tenant_locators()[0]]:
        api.add(obj)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    args = ("--kubeconfig", str(kubeconfig), "--http", "127.0.0.1:0")
    server = Server(None, (*args, "--locator-namespaces", believed))
    try:
        server.wait_ready()
        http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        assert wait_until(lambda: http_get(http, "/ready") == (200, "OK"), timeout=10)
        api.wait_for_watches(4)
        for obj in tenant_locators()[1:]:  # as watch events, one state change each
            api.add(obj)
        if believed == "*":  # as before: the tenant moves every client of shop
            assert wait_until(
                lambda: {c: db_for(server, c) for c in MOVED_ANSWERS} == MOVED_ANSWERS,
                timeout=5,
            ), server.log()
            return
        server.wait_for_log("PodLocator tenant/fake ignored", timeout=5)
        assert {c: db_for(server, c) for c in TRUE_ANSWERS} == TRUE_ANSWERS
        # One line for each when it appears, none per query; each counted once.
        for name in ("grab", "steal", "claim", "fake"):
            assert server.log().count(f"PodLocator tenant/{name} ignored: only PodLocators in "
                                      "toposdns place clients and endpoints") == 1  # fmt: skip
        api.modify(pod_locator("grab", "tenant", addresses=[ON_NODE_A], node_labels=Z1))
        assert {c: db_for(server, c) for c in TRUE_ANSWERS} == TRUE_ANSWERS
        metrics = http_get(http, "/metrics")[1]
        assert "toposdns_ignored_locators_total 4.0" in metrics
        assert server.log().count("PodLocator tenant/grab ignored") == 1
    finally:
        assert server.stop(STOP_TIMEOUT) == 0, server.log()


@pytest.mark.parametrize("pod_names", [True, False])
def test_endpoint_pod_names_from_the_watch(
    api: FakeApiServer, tmp_path: Path, pod_names: bool
) -> None:
    """The watch keeps each endpoint's pod name only under `--endpoint-pod-names` (the only
    reader of it); the names answer with it, and the dashed address without it."""
    target = {"kind": "Pod", "name": "db-7d9c-x1", "namespace": "shop"}
    for obj in headless("db", "shop", [endpoint("10.244.1.20", targetRef=target)]):
        api.add(obj)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    flags = ("--endpoint-pod-names",) if pod_names else ()
    server = Server(None, ("--kubeconfig", str(kubeconfig), "--workers", "1", *flags))
    try:
        server.wait_ready()
        named = dig(server, "db-7d9c-x1.db.shop.svc.cluster.local")
        dashed = dig(server, "10-244-1-20.db.shop.svc.cluster.local")
        answered, unknown = (named, dashed) if pod_names else (dashed, named)
        assert [rr[4] for rr in answered.answer] == ["10.244.1.20"]
        assert unknown.status == "NXDOMAIN"
        srv = dig(server, "_http._tcp.db.shop.svc.cluster.local", "SRV", "+short").text
        host = "db-7d9c-x1" if pod_names else "10-244-1-20"
        assert srv.split()[3] == f"{host}.db.shop.svc.cluster.local."
    finally:
        assert server.stop(STOP_TIMEOUT) == 0, server.log()
