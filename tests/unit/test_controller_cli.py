"""`toposdns controller` as a process: probes, metrics, SIGTERM, and startup errors."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kubeapi import FakeApiServer
from toposdns.cli import main

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def wait_for(check: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.02)


def test_probes_metrics_and_release_on_sigterm(tmp_path: Path) -> None:
    api = FakeApiServer(leases=True)
    api.add(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "z1"}},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
        }
    )
    api.fail_next("pods", 500, count=3)  # the first lists fail for a while: not ready
    api.start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
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
        wait_for(lambda: fetch(f"{base}/health")[0] == 200, what="/health")
        status, body = fetch(f"{base}/ready")
        assert status == 503 and body.startswith("not listed yet: pods")
        wait_for(lambda: fetch(f"{base}/ready") == (200, "OK"), what="/ready")
        wait_for(lambda: api.get("podlocators", "toposdns", "n1"), what="the node locator")
        status, metrics = fetch(f"{base}/metrics")
        assert status == 200
        assert "toposdns_controller_leader 1.0" in metrics
        assert 'toposdns_controller_writes_total{result="ok",verb="create"} 1.0' in metrics
        assert 'toposdns_controller_locators{kind="node"} 1.0' in metrics
        assert "toposdns_controller_queue_depth 0.0" in metrics
        assert fetch(f"{base}/health")[0] == 200

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
    assert user_agents == {"toposdns/0.1.0.dev0 controller (cli-1)"}


def test_no_cluster_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    code = main(
        ["controller", f"--kubeconfig={missing}", "--namespace=toposdns", "--http=127.0.0.1:0"]
    )
    assert code == 1
    assert f"cannot use the kubeconfig {missing}" in capsys.readouterr().err
