"""Graceful shutdown: on SIGTERM /ready turns 503 at once, answers go on through the lameduck
period (CoreDNS's `health { lameduck }`), then the process exits 0; before it serves, a stop
signal ends it at once, even as PID 1."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.integration.support import StartServer, dig, http_get, wait_until
from tests.kubeapi import FakeApiServer
from tests.server_process import ServerProcess, toposdns_command

pytestmark = pytest.mark.integration


def test_sigterm_lameduck(start_server: StartServer) -> None:
    server = start_server("--http", "127.0.0.1:0", "--lameduck", "2s")
    http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
    assert http_get(http, "/ready") == (200, "OK")
    server.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert wait_until(lambda: http_get(http, "/ready") == (503, "Shutting down"), timeout=0.5)
    assert http_get(http, "/health") == (200, "OK")
    answer = dig(server, "web.shop.svc.cluster.local", "+short")
    assert answer.text.split(), "still answering during lameduck"
    assert server.proc.wait(5) == 0
    assert 1.8 < time.monotonic() - stopped < 5
    server.wait_for_log("answering for 2s more")


def test_a_second_signal_ends_the_lameduck(start_server: StartServer) -> None:
    server = start_server("--lameduck", "30s")
    server.proc.send_signal(signal.SIGINT)
    server.wait_for_log("answering for 30s more")
    stopped = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(5) == 0
    assert time.monotonic() - stopped < 3


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_sigterm_as_pid_1_during_a_slow_first_sync_exits_at_once(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """In a PID namespace of its own the server is PID 1, as in a container without an init:
    the kernel drops the signals it has no handler for."""
    api.fail_next("services", 500, count=1000)  # the first sync never ends
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    command = toposdns_command(
        "serve", "--kubeconfig", str(kubeconfig), "--listen", "127.0.0.1:0", "--workers", "1",
        "--startup-timeout", "60",
    )  # fmt: skip
    try:
        namespace = ServerProcess(["unshare", "--pid", "--fork", "--kill-child", *command])
    except OSError as exc:
        pytest.skip(f"cannot make a PID namespace: {exc}")
    try:
        # The server is unshare's child; wait until it asks the API server for Services.
        assert wait_until(lambda: api_asked(api), timeout=40), namespace.tail()
        (pid,) = children(namespace.pid)
        os.kill(pid, signal.SIGTERM)
        assert namespace.proc.wait(3) == 0, namespace.tail()
        namespace.wait_for_log("stopped by SIGTERM before serving", timeout=1)
    finally:
        namespace.stop(1.0)


def api_asked(api: FakeApiServer) -> bool:
    return any(request.resource == "services" for request in list(api.requests))


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as listed:
        return [int(child) for child in listed.read().split()]
