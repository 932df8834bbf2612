"""The HTTP listeners, each on its own address as CoreDNS's, and under hostile clients: malformed
requests are one line each in the server's own log format, slow clients are closed, the
connection cap holds while probes keep answering (half-sent requests make room for them, and
one source cannot take every connection), and DNS answers throughout."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

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
        # One more is served: the oldest of them makes room.
        assert probe(port) == (200, "OK")
        assert closed(slow[0])
        assert_dns_answers(server)
        open_ = set(slow[1:])
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
        r"WARNING HTTP: closed a connection from 127\.0\.0\.1 to make room: it had sent no "
        r"whole request, and 128 were open \(the maximum\)",
        start=before,
    )
    # The other 127 closes (past the deadline) are counted into one line 5 s later.
    server.wait_for_log(r"WARNING HTTP: 127 more errors in the last 5s", timeout=7.0, start=before)
    assert len(server.log().splitlines()[before:]) == 2, server.log()


def probe(port: int, path: str = "/health", timeout: float = 1.0) -> tuple[int, str]:
    """A kubelet's probe from 127.0.0.1: (status, body), (0, "") if no answer in time."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


@contextmanager
def half_open(port: int, count: int, source: str, head: bytes) -> Iterator[list[int]]:
    """`count` connections from `source` that send `head` and never finish their request,
    opened again as fast as the server closes them, until the block ends. Yields a one-item
    list: how many were opened in all."""
    opened = [0]
    stop = threading.Event()

    def flood() -> None:
        held: list[socket.socket] = []
        try:
            while not stop.is_set():
                for sock in [sock for sock in held if closed(sock)]:
                    sock.close()
                    held.remove(sock)
                while len(held) < count and not stop.is_set():
                    try:
                        sock = socket.create_connection(
                            ("127.0.0.1", port), timeout=1.0, source_address=(source, 0)
                        )
                        sock.send(head)
                    except OSError:
                        break
                    held.append(sock)
                    opened[0] += 1
                stop.wait(0.05)
        finally:
            for sock in held:
                sock.close()

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        stop.set()
        thread.join(10.0)


def test_probes_answer_under_200_half_open_connections(start_server: StartServer) -> None:
    server = start_server("--health", "127.0.0.1:0", "--ready", "127.0.0.1:0")
    port = int(server.wait_for_log(r"serving /health on 127\.0\.0\.1:(\d+)").group(1))
    with half_open(port, 200, "127.0.0.1", b"GET /health HTTP/1.1\r\n") as opened:
        while opened[0] < 200:
            time.sleep(0.05)
        answers = []
        for _ in range(20):
            answers.append(probe(port))
            time.sleep(0.1)
    assert answers.count((200, "OK")) >= 19, answers
    assert opened[0] > 200, "the flood never pressed the cap"
    assert_dns_answers(server)


def test_one_source_cannot_starve_the_probes(start_server: StartServer) -> None:
    server = start_server("--http", "127.0.0.1:0")
    port = http_port(server)
    before = server.line_count()
    # Both half-sent and silent, from a pod at 127.0.0.2; the probes come from 127.0.0.1.
    with half_open(port, 128, "127.0.0.2", b"GET /health HTTP/1.1\r\nX-Slow: 1\r\n") as opened:
        while opened[0] < 128:
            time.sleep(0.05)
        answers = [probe(port, path) for path in ("/health", "/ready") * 6]
    assert answers == [(200, "OK")] * 12
    server.wait_for_log(r"closed a connection from 127\.0\.0\.2 to make room", start=before)
    assert "from 127.0.0.1" not in "\n".join(server.log().splitlines()[before:])


@pytest.mark.parametrize("workers", ["1", "2"])
def test_each_endpoint_on_its_own_address(start_server: StartServer, workers: str) -> None:
    flags = ("--health", "--ready", "--metrics", "--explain")
    server = start_server(
        *(arg for flag in flags for arg in (flag, "127.0.0.1:0")), "--workers", workers
    )
    ports = {
        path: int(server.wait_for_log(rf"serving {path} on 127\.0\.0\.1:(\d+)$").group(1))
        for path in ("/health", "/ready", "/metrics", "/explain")
    }
    assert len(set(ports.values())) == 4
    question = "/explain?client=10.244.1.7&name=frontend.shop.svc.cluster.local"
    for path, port in ports.items():
        for other in ("/health", "/ready", "/metrics", question):
            status, body = http_get(port, other)
            if other.startswith(path):
                assert status == 200, (path, other, body)
            else:
                assert status == 404, f"{other} answered on the {path} address"
    assert "frontend.shop.svc.cluster.local" in http_get(ports["/explain"], question)[1]
    assert "coredns_dns_requests_total" in http_get(ports["/metrics"], "/metrics")[1]


def test_endpoints_given_one_address_share_it(start_server: StartServer) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"127.0.0.1:{port}"
    server = start_server("--health", address, "--metrics", address)
    line = server.wait_for_log(rf"serving (.*) on 127\.0\.0\.1:{port}$")
    assert line.group(1) == "/health and /metrics"
    assert http_get(port, "/health") == (200, "OK")
    assert http_get(port, "/ready")[0] == 404
    assert not re.search(r"serving /ready|/explain on", server.log())
