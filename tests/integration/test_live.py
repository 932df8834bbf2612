"""The real server process watching the stand-in API server: SERVFAIL and /ready 503 until the
first sync, answers that follow watch events within a second, and data kept when the API goes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.support import STOP_TIMEOUT, Server, dig, http_get, wait_until
from tests.kubeapi import FakeApiServer
from tests.objects import service

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
