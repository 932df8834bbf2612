"""The --http port under hostile clients: malformed requests are one line each in the server's
own log format, slow clients are closed, the connection cap holds, and DNS answers throughout."""

from __future__ import annotations

import json
import socket
import time

import dns.message
import pytest

from tests.integration.support import Server, StartServer, addresses, http_get, udp

pytestmark = pytest.mark.integration

MALFORMED = [
    b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\n\r\n",
    b"GET /health HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
]


def http_port(server: Server) -> int:
    return int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))


def send_raw(port: int, data: bytes) -> bytes:
    """Send `data`; what the server answered before closing (or within 2 s)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.sendall(data)
        return sock.recv(200)


def assert_dns_answers(server: Server) -> None:
    reply = udp(server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
    assert addresses(reply) == {"10.96.10.10"}


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_malformed_requests_are_one_line_each(start_server: StartServer, log_format: str) -> None:
    server = start_server("--http", "127.0.0.1:0", "--log-format", log_format)
    port = http_port(server)
    before = server.line_count()
    for request in MALFORMED:
        assert send_raw(port, request).startswith(b"HTTP/1.0 400 Bad Request")
    assert http_get(port, "/health") == (200, "OK")
    assert_dns_answers(server)
    # The first at once, the other two counted into one line when the 5 s window ends.
    first = server.wait_for_log(r"HTTP: Error handling request from 127\.0\.0\.1", start=before)
    assert "Invalid header token" in first.string
    if log_format == "json":
        entry = json.loads(first.string)
        assert entry["level"] == "warning" and entry["logger"] == "toposdns"
        assert "exc" not in entry
        assert len(server.log().splitlines()[before:]) == 1  # the other two are being counted
    else:
        server.wait_for_log(r"HTTP: 2 more errors in the last 5s", timeout=7.0, start=before)
        lines = server.log().splitlines()[before:]
        assert len(lines) == 2 and "Content-Length" in lines[1], lines
    assert "Traceback" not in server.log()


def closed(sock: socket.socket) -> bool:
    """True if the server has closed the connection (without answering)."""
    sock.settimeout(0.01)
    try:
        data = sock.recv(10)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    assert data == b"", f"a slow client got an answer: {data!r}"
    return True


def test_slow_clients_are_closed_and_the_cap_holds(start_server: StartServer) -> None:
    server = start_server("--http", "127.0.0.1:0")
    port = http_port(server)
    before = server.line_count()
    # 128 connections fill the port: half trickle a request a header a second (so each byte
    # restarts nothing), half send nothing at all.
    slow = [socket.create_connection(("127.0.0.1", port), timeout=2.0) for _ in range(128)]
    try:
        for sock in slow[:64]:
            sock.send(b"GET /health HTTP/1.1\r\n")
        with socket.create_connection(("127.0.0.1", port), timeout=2.0) as extra:
            assert closed(extra) or extra.recv(10) == b"", "a connection over the cap was served"
        assert_dns_answers(server)
        open_ = set(slow)
        deadline = time.monotonic() + 8.0
        while open_ and time.monotonic() < deadline:
            for sock in slow[:64]:
                if sock in open_:
                    try:
                        sock.send(b"X-Slow: 1\r\n")
                    except (BrokenPipeError, ConnectionResetError):
                        open_.discard(sock)
            open_ = {sock for sock in open_ if not closed(sock)}
            time.sleep(0.5)
        assert not open_, f"{len(open_)} slow clients were kept past 8 s"
    finally:
        for sock in slow:
            sock.close()
    assert http_get(port, "/health") == (200, "OK")
    assert_dns_answers(server)
    server.wait_for_log(
        r"WARNING refused an HTTP connection from 127\.0\.0\.1: 128 already open", start=before
    )
    server.wait_for_log(
        r"WARNING HTTP: closed a connection from 127\.0\.0\.1: it sent no whole request "
        r"within 5s",
        start=before,
    )
    # The other 127 closes are counted into one line 5 s later (as the TCP test checks).
    assert len(server.log().splitlines()[before:]) == 2, server.log()
