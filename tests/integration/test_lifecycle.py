"""Graceful shutdown: on SIGTERM /ready turns 503 at once, answers go on through the lameduck
period (CoreDNS's `health { lameduck }`), then the process exits 0."""

from __future__ import annotations

import signal
import time

import pytest

from tests.integration.support import StartServer, dig, http_get, wait_until

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
