"""Graceful shutdown: on SIGTERM /ready turns 503 at once, answers go on through the lameduck
period (CoreDNS's `health { lameduck }`), then the process exits 0; before it serves, a stop
signal ends it at once, even as PID 1. The same holds for the `toposdns` console script."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
import tomllib
from pathlib import Path

import pytest

from tests.integration.support import (
    FIXTURE_SNAPSHOT,
    READY_LINE,
    StartServer,
    dig,
    http_get,
    wait_until,
)
from tests.kubeapi import FakeApiServer
from tests.server_process import REPO, ServerProcess, toposdns_command

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


# The `toposdns` console script, as pip writes it from pyproject.toml's [project.scripts].
CONSOLE_SCRIPT = """\
import re
import sys
from {module} import {function}
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit({function}())
"""


def console_script(directory: Path) -> list[str]:
    """The command line of the `toposdns` console script that installing this tree gives (run
    with this interpreter, importing this tree, as `pip install -e .` would)."""
    with open(REPO / "pyproject.toml", "rb") as file:
        entry = tomllib.load(file)["project"]["scripts"]["toposdns"]
    module, _, function = entry.partition(":")
    script = directory / "toposdns"
    script.write_text(CONSOLE_SCRIPT.format(module=module, function=function))
    return ["env", f"PYTHONPATH={REPO}", sys.executable, str(script)]


def as_pid_1(command: list[str]) -> list[str]:
    """`command` as PID 1 of a new PID namespace (unshare forks it; `env` execs the script)."""
    return ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *command]


def started(command: list[str], pid_1: bool) -> tuple[ServerProcess, int]:
    """The process, and the pid to signal: the console script's own (unshare's child)."""
    try:
        process = ServerProcess(as_pid_1(command) if pid_1 else command)
    except OSError as exc:
        pytest.skip(f"cannot make a PID namespace: {exc}")
    if not pid_1:
        return process, process.pid
    assert wait_until(lambda: len(children(process.pid)) == 1, timeout=10), process.tail()
    return process, children(process.pid)[0]


PID_1 = [
    pytest.param(
        True,
        id="pid-1",
        marks=pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare"),
    ),
    pytest.param(False, id="ordinary"),
]


@pytest.mark.parametrize("pid_1", PID_1)
def test_the_console_script_stops_on_sigterm_before_serving(
    api: FakeApiServer, tmp_path: Path, pid_1: bool
) -> None:
    api.fail_next("services", 500, count=1000)  # the first sync never ends
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    command = console_script(tmp_path) + [
        "serve", "--kubeconfig", str(kubeconfig), "--listen", "127.0.0.1:0", "--workers", "1",
        "--startup-timeout", "60",
    ]  # fmt: skip
    process, pid = started(command, pid_1)
    try:
        assert wait_until(lambda: api_asked(api), timeout=40), process.tail()
        os.kill(pid, signal.SIGTERM)
        assert process.proc.wait(3) == 0, process.tail()
        process.wait_for_log("stopped by SIGTERM before serving", timeout=1)
    finally:
        process.stop(1.0)


@pytest.mark.parametrize("pid_1", PID_1)
def test_the_console_script_shuts_down_on_sigterm(tmp_path: Path, pid_1: bool) -> None:
    command = console_script(tmp_path) + [
        "serve", "--snapshot", str(FIXTURE_SNAPSHOT), "--listen", "127.0.0.1:0",
        "--workers", "1", "--lameduck", "1s",
    ]  # fmt: skip
    process, pid = started(command, pid_1)
    try:
        process.wait_for_log(READY_LINE, timeout=30)
        os.kill(pid, signal.SIGTERM)
        stopped = time.monotonic()
        assert process.proc.wait(5) == 0, process.tail()
        assert 0.9 < time.monotonic() - stopped < 5  # through the lameduck
        process.wait_for_log("answering for 1s more", timeout=1)
        process.wait_for_log("INFO stopped", timeout=1)
    finally:
        process.stop(1.0)
