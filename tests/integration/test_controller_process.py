"""`toposdns controller` as a process against the stand-in API server: probes, metrics, and
the Lease released on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.support import REPO, http_get, wait_until
from tests.kubeapi import FakeApiServer
from tests.objects import node
from toposdns import __version__

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_probes_metrics_and_release_on_sigterm(tmp_path: Path) -> None:
    api = FakeApiServer(leases=True)
    api.add(
        node(
            "n1",
            labels={"topology.kubernetes.io/zone": "z1"},
            addresses=[("InternalIP", "10.0.0.1")],
        )
    )
    api.fail_next("pods", 500, count=3)  # the first lists fail for a while: not ready
    api.start()
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "toposdns",
        "controller",
        f"--kubeconfig={api.write_kubeconfig(tmp_path / 'kubeconfig')}",
        "--namespace=toposdns",
        f"--http=127.0.0.1:{port}",
        "--lease-duration=2s",
        "--renew-deadline=1s",
        "--retry-period=200ms",
        "--identity=cli-1",
        "--log-format=json",
    ]
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: http_get(port, "/health")[0] == 200, 10, 0.02), "/health"
        status, body = http_get(port, "/ready")
        assert status == 503 and body.startswith("not listed yet: pods")
        assert wait_until(lambda: http_get(port, "/ready") == (200, "OK"), 10, 0.02), "/ready"
        assert wait_until(lambda: api.get("podlocators", "toposdns", "n1") is not None, 10, 0.02), (
            "the node locator"
        )
        status, metrics = http_get(port, "/metrics")
        assert status == 200
        assert "toposdns_controller_leader 1.0" in metrics
        assert 'toposdns_controller_writes_total{result="ok",verb="create"} 1.0' in metrics
        assert 'toposdns_controller_locators{kind="node"} 1.0' in metrics
        # The key leaves the queue just after its write is seen.
        assert wait_until(
            lambda: "toposdns_controller_queue_depth 0.0" in http_get(port, "/metrics")[1], 5, 0.02
        ), "queue drained"
        assert http_get(port, "/health")[0] == 200

        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
        assert process.stderr is not None
        with process.stderr:
            logs = [json.loads(line) for line in process.stderr.read().splitlines() if line]
        api.stop()
    lease = api.get("leases", "toposdns", "toposdns-controller")
    assert lease is not None and lease["spec"]["holderIdentity"] == ""
    assert lease["spec"]["leaseDurationSeconds"] == 1
    messages = [entry["msg"] for entry in logs]
    assert "released Lease toposdns/toposdns-controller" in messages
    assert messages[-1] == "stopped"
    user_agents = {r.headers.get("User-Agent") for r in api.requests if r.method == "POST"}
    assert user_agents == {f"toposdns/{__version__} controller (cli-1)"}
