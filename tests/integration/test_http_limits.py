"""The HTTP listeners, each on its own address as CoreDNS's, and under hostile clients: malformed
requests are one line each in the server's own log format, slow clients are closed, the
connection cap holds while probes keep answering (half-sent and kept-alive connections make room
for them, from one source or from many, and one source cannot take every connection), and DNS
answers throughout."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import dns.message
import pytest

from tests.integration.support import (
    Server,
    StartServer,
    addresses,
    http_get,
    udp,
    wait_until,
)

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
    # 128 connections from 4 pods (32 each, their share) fill the port: half trickle a
    # request a header a second (so each byte restarts nothing), half send nothing at all.
    slow = [
        socket.create_connection(
            ("127.0.0.1", port), timeout=2.0, source_address=(f"127.0.0.{2 + n // 32}", 0)
        )
        for n in range(128)
    ]
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
        r"WARNING HTTP: closed a connection to make room: from 127\.0\.0\.2 for a new one from "
        r"127\.0\.0\.1: 128 open \(the maximum\), 32 of them from 127\.0\.0\.2; it had sent no "
        r"whole request yet \(\d+\.\ds\)$",
        start=before,
    )
    # The other 127 are closed past the deadline: one line, the rest counted into one 5 s later.
    server.wait_for_log(
        r"WARNING HTTP: closed a connection from 127\.0\.0\.\d: it sent no whole request within 5s",
        start=before,
    )
    server.wait_for_log(r"WARNING HTTP: 126 more errors in the last 5s", timeout=7.0, start=before)
    assert len(server.log().splitlines()[before:]) == 3, server.log()


def made_room(server: Server, before: int) -> set[str]:
    """The sources of the connections the log says were closed to make room (of a tally, the
    last)."""
    lines = "\n".join(server.log().splitlines()[before:])
    return set(re.findall(r"to make room(?::|, the last:) from (\S+) for", lines))


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
def half_open(port: int, count: int, source: str | list[str], head: bytes) -> Iterator[list[int]]:
    """`count` connections from `source` (from each, if a list) that send `head` and never
    finish their request, opened again as fast as the server closes them, until the block ends.
    Yields a one-item list: how many were opened in all."""
    opened = [0]
    stop = threading.Event()

    sources = [source] if isinstance(source, str) else source

    def flood() -> None:
        held: dict[str, list[socket.socket]] = {source: [] for source in sources}
        try:
            while not stop.is_set():
                for source, mine in held.items():
                    for sock in [sock for sock in mine if closed(sock)]:
                        sock.close()
                        mine.remove(sock)
                    while len(mine) < count and not stop.is_set():
                        try:
                            sock = socket.create_connection(
                                ("127.0.0.1", port), timeout=1.0, source_address=(source, 0)
                            )
                            sock.send(head)
                        except OSError:
                            break
                        mine.append(sock)
                        opened[0] += 1
                stop.wait(0.05)
        finally:
            for mine in held.values():
                for sock in mine:
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
    server.wait_for_log(r"closed a connection to make room: from 127\.0\.0\.2 for", start=before)
    assert made_room(server, before) == {"127.0.0.2"}


class KeepAlive:
    """Keep-alive clients: `per_source` connections from each of `sources` to each port, each
    sending a whole `GET /health` every `every` seconds and reading its answer, reopened
    (after `reopen` seconds) when the server closes them, until the block ends."""

    def __init__(
        self,
        ports: list[int],
        sources: list[str],
        per_source: int,
        every: float = 2.0,
        reopen: float = 0.5,
    ) -> None:
        self.slots = [
            (port, source) for port in ports for source in sources for _ in range(per_source)
        ]
        self.every = every
        self.reopen = reopen
        self.opened = 0
        self.answered = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        socks: list[socket.socket | None] = [None] * len(self.slots)
        due = [0.0] * len(self.slots)  # when to send the next request, or to reopen
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"

        def drop(i: int, sock: socket.socket) -> None:
            sock.close()
            socks[i] = None
            due[i] = time.monotonic() + self.reopen

        try:
            while not self.stopping.is_set():
                for i, (port, source) in enumerate(self.slots):
                    sock = socks[i]
                    if sock is None:
                        if time.monotonic() < due[i]:
                            continue
                        try:
                            sock = socket.create_connection(
                                ("127.0.0.1", port), timeout=1.0, source_address=(source, 0)
                            )
                        except OSError:
                            due[i] = time.monotonic() + self.reopen
                            continue
                        sock.setblocking(False)
                        socks[i] = sock
                        self.opened += 1
                    try:
                        data = sock.recv(65536)
                        if not data:  # closed by the server
                            drop(i, sock)
                            continue
                        self.answered += data.count(b"HTTP/1.1 200 OK")
                    except BlockingIOError:
                        pass
                    except OSError:
                        drop(i, sock)
                        continue
                    if time.monotonic() >= due[i]:
                        try:
                            sock.send(request)
                        except BlockingIOError:
                            pass
                        except OSError:
                            drop(i, sock)
                            continue
                        due[i] = time.monotonic() + self.every
                self.stopping.wait(0.02)
        finally:
            for sock in socks:
                if sock is not None:
                    sock.close()

    def __enter__(self) -> KeepAlive:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10.0)


def probes(ports: dict[str, int], count: int = 20) -> dict[str, int]:
    """`count` probes of each path on its port, as kubelet sends them: how many answered OK."""
    answered = dict.fromkeys(ports, 0)
    for _ in range(count):
        for path, port in ports.items():
            answered[path] += probe(port, path) == (200, "OK")
        time.sleep(0.1)
    return answered


def probe_ports(server: Server) -> dict[str, int]:
    return {
        path: int(server.wait_for_log(rf"serving {path} on 127\.0\.0\.1:(\d+)$").group(1))
        for path in ("/health", "/ready")
    }


def test_a_keep_alive_flood_from_one_source_leaves_the_probes_answering(
    start_server: StartServer,
) -> None:
    server = start_server("--health", "127.0.0.1:0", "--ready", "127.0.0.1:0")
    ports = probe_ports(server)
    before = server.line_count()
    # A pod at 127.0.0.2 keeps 128 connections to each port busy with a request every 2 s
    # (they hold every slot unless idle ones can be closed), and one at 127.0.0.3 half-opens
    # more; kubelet probes from 127.0.0.1.
    with KeepAlive(list(ports.values()), ["127.0.0.2"], 128) as flood:
        assert wait_until(lambda: flood.answered >= 256, timeout=10.0), flood.answered
        with ExitStack() as stack:
            for port in ports.values():
                stack.enter_context(half_open(port, 64, "127.0.0.3", b"GET /health HTTP/1.1\r\n"))
            answered = probes(ports)
    assert all(count >= 19 for count in answered.values()), answered
    assert flood.opened > 256, "the flood never pressed the cap"
    assert "127.0.0.2" in made_room(server, before) <= {"127.0.0.2", "127.0.0.3"}
    assert_dns_answers(server)


@pytest.mark.parametrize("layout", ["one listener each", "one port"])
def test_a_keep_alive_flood_from_many_sources_leaves_the_probes_answering(
    start_server: StartServer, layout: str
) -> None:
    if layout == "one port":  # as the controller's --http serves them
        server = start_server("--http", "127.0.0.1:0")
        port = http_port(server)
        ports = {"/health": port, "/ready": port}
    else:
        server = start_server("--health", "127.0.0.1:0", "--ready", "127.0.0.1:0")
        ports = probe_ports(server)
    targets = sorted(set(ports.values()))
    before = server.line_count()
    # 64 pods with 2 keep-alive connections each to each port, and 32 more half-opening 2
    # each: no source holds more than the probes' would.
    pods = [f"127.0.1.{n}" for n in range(1, 65)]
    with KeepAlive(targets, pods, 2) as flood:
        assert wait_until(lambda: flood.answered >= 128 * len(targets), timeout=10.0)
        with ExitStack() as stack:
            tenants = [f"127.0.2.{n}" for n in range(1, 33)]
            for port in targets:
                stack.enter_context(half_open(port, 2, tenants, b"GET /health HTTP/1.1\r\n"))
            answered = probes(ports)
    assert all(count >= 19 for count in answered.values()), answered
    assert made_room(server, before), "the floods never pressed the cap"
    assert "127.0.0.1" not in made_room(server, before)
    assert_dns_answers(server)


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
