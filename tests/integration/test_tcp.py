"""TCP framing, pipelining, idle timeout and the connection cap, shared fairly among sources,
with raw sockets."""

from __future__ import annotations

import contextlib
import selectors
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple, cast

import dns.message
import dns.rcode
import pytest

from tests.integration.support import (
    Server,
    StartServer,
    addresses,
    framed,
    recv_framed,
    udp,
    wait_until,
)

pytestmark = pytest.mark.integration


@contextmanager
def connect(
    server: Server, timeout: float = 2.0, source: str = "127.0.0.1"
) -> Iterator[socket.socket]:
    sock = socket.create_connection(server.address, timeout=timeout, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        yield sock
    finally:
        sock.close()


def closed_by_peer(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closes the connection, or None if it is still open."""
    start = time.monotonic()
    sock.settimeout(timeout)
    try:
        data = sock.recv(1)
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.monotonic() - start
    assert data == b"", f"unexpected data {data!r}"
    return time.monotonic() - start


def ask(sock: socket.socket, name: str, rtype: str = "A") -> dns.message.Message:
    query = dns.message.make_query(name, rtype)
    sock.sendall(framed(query))
    reply = recv_framed(sock)
    assert reply.id == query.id
    return reply


def test_pipelined_queries_in_one_send(shared_server: Server) -> None:
    first = dns.message.make_query("frontend.shop.svc.cluster.local.", "A")
    second = dns.message.make_query("api.shop.svc.cluster.local.", "AAAA")
    third = dns.message.make_query("nosuch.shop.svc.cluster.local.", "A")
    first.id, second.id, third.id = 0x1111, 0x2222, 0x3333
    with connect(shared_server) as sock:
        sock.sendall(framed(first) + framed(second) + framed(third))
        replies = [recv_framed(sock) for _ in range(3)]
    assert [r.id for r in replies] == [0x1111, 0x2222, 0x3333]
    assert addresses(replies[0]) == {"10.96.10.10"}
    assert addresses(replies[1], "AAAA") == {"fd00:10:96::20"}
    assert replies[2].rcode() == dns.rcode.NXDOMAIN


def test_many_pipelined_queries_answered_in_order(shared_server: Server) -> None:
    names = [
        ("frontend.shop.svc.cluster.local.", {"10.96.10.10"}),
        ("web-0.web.shop.svc.cluster.local.", {"10.244.1.10"}),
        ("web-1.web.shop.svc.cluster.local.", {"10.244.2.11"}),
        ("api.shop.svc.cluster.local.", {"10.96.10.20"}),
    ]
    queries = []
    for i in range(100):
        query = dns.message.make_query(names[i % 4][0], "A")
        query.id = 1000 + i
        queries.append(query)
    with connect(shared_server) as sock:
        sock.sendall(b"".join(framed(q) for q in queries))
        replies = [recv_framed(sock) for _ in queries]
    assert [r.id for r in replies] == [q.id for q in queries]
    for i, reply in enumerate(replies):
        assert addresses(reply) == names[i % 4][1]


def test_query_split_byte_by_byte(shared_server: Server) -> None:
    query = dns.message.make_query("web-1.web.shop.svc.cluster.local.", "A")
    data = framed(query)
    with connect(shared_server) as sock:
        for i in range(len(data)):
            sock.send(data[i : i + 1])
            time.sleep(0.002)
        reply = recv_framed(sock)
    assert reply.id == query.id
    assert addresses(reply) == {"10.244.2.11"}


def test_query_split_across_length_prefix_and_body(shared_server: Server) -> None:
    first = dns.message.make_query("frontend.shop.svc.cluster.local.", "A")
    second = dns.message.make_query("web-0.web.shop.svc.cluster.local.", "A")
    data = framed(first) + framed(second)
    with connect(shared_server) as sock:
        # Cut inside the first prefix, inside the first body, and across the boundary.
        for piece in (data[:1], data[1:7], data[7 : len(data) - 20], data[len(data) - 20 :]):
            sock.send(piece)
            time.sleep(0.02)
        replies = [recv_framed(sock), recv_framed(sock)]
    assert [r.id for r in replies] == [first.id, second.id]
    assert addresses(replies[0]) == {"10.96.10.10"}
    assert addresses(replies[1]) == {"10.244.1.10"}


def test_half_closed_connection_is_answered_then_closed(shared_server: Server) -> None:
    # A client that shuts its side after its queries gets every answer, then the server's
    # close at once (not after the idle timeout).
    queries = [dns.message.make_query(BIG_SRV, "SRV") for _ in range(20)]
    with connect(shared_server) as sock:
        sock.sendall(b"".join(framed(query) for query in queries))
        sock.shutdown(socket.SHUT_WR)
        replies = [recv_framed(sock) for _ in queries]
        waited = closed_by_peer(sock, timeout=3.0)
    assert [reply.id for reply in replies] == [query.id for query in queries]
    assert all(len(reply.answer[0]) > 20 for reply in replies)
    assert waited is not None and waited < 1.0, "the answered connection was kept open"


def test_idle_connection_is_closed(start_server: StartServer) -> None:
    server = start_server("--tcp-idle-timeout", "1")
    with connect(server) as sock:
        reply = ask(sock, "frontend.shop.svc.cluster.local.")
        assert addresses(reply) == {"10.96.10.10"}
        waited = closed_by_peer(sock, timeout=3.0)
    assert waited is not None, "the server kept an idle connection open for 3 s"
    assert 0.5 <= waited <= 3.0
    # A connection that stays busy is not closed by the idle timer.
    with connect(server) as sock:
        for _ in range(6):
            assert addresses(ask(sock, "web-0.web.shop.svc.cluster.local.")) == {"10.244.1.10"}
            time.sleep(0.3)


def test_connection_cap_closes_the_oldest_idle_connection(start_server: StartServer) -> None:
    # A cap of 8: a source holds 2 at most; past either bound the oldest idle one is closed.
    server = start_server("--tcp-max-connections", "8")
    name = "frontend.shop.svc.cluster.local."
    with (
        connect(server, source="127.0.0.2") as first,
        connect(server, source="127.0.0.2") as second,
    ):
        assert addresses(ask(first, name)) == {"10.96.10.10"}
        assert addresses(ask(second, name)) == {"10.96.10.10"}
        time.sleep(0.05)  # the second answered last: the first is idle the longest
        with connect(server, source="127.0.0.2") as third:
            assert addresses(ask(third, name)) == {"10.96.10.10"}
            waited = closed_by_peer(first, timeout=2.0)
            assert waited is not None and waited < 1.0, "the oldest idle one was kept"
            assert addresses(ask(second, "web-0.web.shop.svc.cluster.local.")) == {"10.244.1.10"}
    server.wait_for_log(r"INFO closed an idle TCP connection of 127\.0\.0\.2: 2 open", timeout=2)


def test_connections_under_way_are_not_closed_to_make_room(start_server: StartServer) -> None:
    server = start_server("--tcp-max-connections", "2")
    with connect(server) as busy:
        busy.send(b"\x00")  # a message under way
        with connect(server) as refused:
            waited = closed_by_peer(refused, timeout=2.0)
            assert waited is not None and waited < 1.0, "the second connection was not closed"
        busy.send(framed(dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))[1:])
        assert addresses(recv_framed(busy)) == {"10.96.10.10"}
    server.wait_for_log(
        r"WARNING refused a TCP connection from 127\.0\.0\.1: 1 already open from it", timeout=2
    )


def test_one_source_cannot_keep_others_out(start_server: StartServer) -> None:
    """1,024 connections from one source, half silent and half with a message begun, leave
    another source's queries answered at once."""
    server = start_server()
    held: list[socket.socket] = []
    try:
        for i in range(1024):
            sock = socket.create_connection(
                server.address, timeout=2.0, source_address=("127.0.0.2", 0)
            )
            held.append(sock)
            if i % 2:
                with contextlib.suppress(OSError):
                    sock.send(b"\x00")
        started = time.monotonic()
        answered = 0
        for _ in range(8):
            with connect(server, source="127.0.0.3") as sock:
                answered += addresses(ask(sock, "frontend.shop.svc.cluster.local.")) == {
                    "10.96.10.10"
                }
        assert answered == 8 and time.monotonic() - started < 4
    finally:
        for sock in held:
            sock.close()


def trickle(sock: socket.socket, data: bytes, every: float, budget: float) -> float | None:
    """Send `data` a byte at a time; seconds until the server closed the connection, or None
    if all of it went out (or `budget` passed) with the connection open."""
    start = time.monotonic()
    for i in range(len(data)):
        if time.monotonic() - start > budget:
            return None
        try:
            sock.send(data[i : i + 1])
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start
        waited = closed_by_peer(sock, every)
        if waited is not None:
            return time.monotonic() - start
    return None


@pytest.mark.parametrize(
    ("idle", "read"), [("1", "30"), ("30", "1")], ids=["idle-timeout", "read-timeout"]
)
def test_trickled_query_is_closed(start_server: StartServer, idle: str, read: str) -> None:
    # A byte every 0.3 s restarts neither timer: once its first byte is in, a query has the
    # read timeout to arrive, and the idle time counts from the last whole query.
    server = start_server("--tcp-idle-timeout", idle, "--tcp-read-timeout", read)
    query = framed(dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
    with connect(server) as sock:
        assert addresses(ask(sock, "frontend.shop.svc.cluster.local.")) == {"10.96.10.10"}
        closed = trickle(sock, query, every=0.3, budget=6.0)
    assert closed is not None, "a connection trickling a query was kept open for 6 s"
    if read == "1":
        server.wait_for_log(
            r"WARNING closed a TCP connection from 127\.0\.0\.1: a query took longer than 1s "
            r"to arrive \(--tcp-read-timeout\)",
            timeout=2.0,
        )
    with connect(server) as sock:
        assert addresses(ask(sock, "web-0.web.shop.svc.cluster.local.")) == {"10.244.1.10"}


def test_slow_clients_do_not_hold_the_connection_cap(start_server: StartServer) -> None:
    """Slowloris: tricklers fill every slot; they are closed within the read timeout, the
    refusals meanwhile are logged as two lines rather than one per connection, and TCP and
    UDP answer throughout and after."""
    server = start_server("--tcp-max-connections", "20", "--tcp-read-timeout", "1")
    # Twenty sources of one each: with that many, a source's share is one connection, and
    # no source is over it to make room.
    slow = [
        socket.create_connection(server.address, timeout=2.0, source_address=(f"127.0.1.{i}", 0))
        for i in range(1, 21)
    ]
    try:
        for sock in slow:
            sock.send(b"\x00")  # the first byte of a length prefix, and no more
        extra = 0
        for _ in range(30):
            with connect(server) as sock:
                extra += closed_by_peer(sock, 1.0) is not None
        assert extra >= 20, "connections over the cap were not refused"
        reply = udp(server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
        assert addresses(reply) == {"10.96.10.10"}
        for sock in slow:
            assert closed_by_peer(sock, 3.0) is not None, "a trickler was kept past 1 s"
    finally:
        for sock in slow:
            sock.close()
    with connect(server) as sock:
        assert addresses(ask(sock, "web-1.web.shop.svc.cluster.local.")) == {"10.244.2.11"}
    summary = server.wait_for_log(
        r"WARNING refused (\d+) more TCP connections in the last 5s, the last from "
        r"127\.0\.0\.1: 20 already open \(--tcp-max-connections\)",
        timeout=7.0,
    )
    refusals = [line for line in server.log().splitlines() if "refused" in line]
    assert len(refusals) == 2, refusals
    assert int(summary.group(1)) == extra - 1
    closed = [line for line in server.log().splitlines() if "closed" in line and "TCP" in line]
    assert 1 <= len(closed) <= 3, closed  # one at once, the rest counted


# Clients that hold what the server sends them: replies left unread, connections kept busy.

#: A name whose SRV reply is large (a headless service of many endpoints), so that a few
#: pipelined queries fill a client's receive buffer and then the server's send queue.
BIG_SRV = "_http._tcp.big.data.svc.cluster.local."
#: What one listener may hold unsent for a source alone (a quarter of its 16 MiB).
UNSENT_SHARE = 4 * 1024 * 1024


class ServerSocket(NamedTuple):
    """The server's end of a TCP connection, as the kernel shows it."""

    state: int
    #: Bytes in its send queue.
    queued: int
    #: Whether a process holds it; when not, the server closed it and the kernel keeps it.
    owned: bool


def server_side(server: Server, client: str) -> list[ServerSocket]:
    """The server's end of every TCP connection from `client` (from /proc/net/tcp: other
    tests on this machine may hold sockets on the same port number, on other addresses)."""
    local = f"{_proc_address(server.host)}:{server.port:04X}"
    remote = _proc_address(client) + ":"
    found = []
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            fields = line.split()
            if fields[1] == local and fields[2].startswith(remote):
                queued = int(fields[4].split(":")[0], 16)
                found.append(ServerSocket(int(fields[3], 16), queued, fields[9] != "0"))
    return found


def _proc_address(ip: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (the 32-bit word in host order, in hex)."""
    return f"{int.from_bytes(socket.inet_aton(ip), sys.byteorder):08X}"


def unreading(server: Server, source: str, queries: int) -> socket.socket | None:
    """A connection that sends `queries` pipelined SRV queries for a large answer and will
    never read a reply (a small receive buffer, so the server's send queue fills soon);
    None if the server closed it before all were sent."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(1.0)
    try:
        sock.bind((source, 0))
        sock.connect(server.address)
        sock.sendall(framed(dns.message.make_query(BIG_SRV, "SRV")) * queries)
    except OSError:
        sock.close()
        return None
    return sock


def test_unread_replies_are_bounded_and_counted(start_server: StartServer) -> None:
    """One source opens connections that pipeline queries and never read, as long as the
    server lets it: what the server then holds unsent is within the source's share, and no
    socket holding replies escapes the connection cap (an evicted connection is reset, not
    left to the kernel to flush)."""
    server = start_server()
    held: list[socket.socket] = []
    try:
        started = time.monotonic()
        while len(held) < 400 and time.monotonic() - started < 3.0:
            sock = unreading(server, "127.0.38.2", 40)
            if sock is not None:
                held.append(sock)
        time.sleep(0.5)  # the last replies reach the send queues
        sockets = server_side(server, "127.0.38.2")
        holding = [sock.queued for sock in sockets if sock.queued]
        orphans = [sock.queued for sock in sockets if sock.queued and not sock.owned]
        assert not orphans, f"{len(orphans)} closed sockets hold {sum(orphans)} B"
        assert len(holding) <= 256, "more sockets hold replies than the source's share"
        assert sum(holding) <= UNSENT_SHARE, f"{sum(holding)} B unsent in {len(holding)} sockets"
        # Everyone else is answered meanwhile.
        with connect(server, source="127.0.0.3") as sock:
            assert addresses(ask(sock, "frontend.shop.svc.cluster.local.")) == {"10.96.10.10"}
    finally:
        for sock in held:
            sock.close()
    server.wait_for_log(
        r"WARNING reset a TCP connection of 127\.0\.38\.2: \d+ bytes of replies unsent", timeout=2
    )


@pytest.mark.parametrize("stop", ["idle", "half-closed"])
def test_connection_with_unread_replies_is_reset(start_server: StartServer, stop: str) -> None:
    """A connection that stops sending (quiet, or shut for writing) and never reads holds its
    replies in the server's socket, counted, until the idle timeout resets it: a graceful
    close would leave them to the kernel, for as long as the client does not read."""
    server = start_server("--tcp-idle-timeout", "1")
    sock = unreading(server, "127.0.38.2", 40)
    assert sock is not None
    try:
        if stop == "half-closed":
            sock.shutdown(socket.SHUT_WR)
        time.sleep(0.3)
        holding = [found for found in server_side(server, "127.0.38.2") if found.queued]
        assert holding, "nothing was left unsent"
        assert all(found.owned for found in holding), "closed with its replies unsent"
        assert wait_until(
            lambda: not any(found.queued for found in server_side(server, "127.0.38.2")),
            timeout=4.0,
        ), "the replies were still held after 4 s"
    finally:
        sock.close()


class BusyFlood:
    """Sources that each keep up to `per_source` connections open with one byte of a query
    sent and no more (busy, never finished), opening another for every one the server closes;
    at most `seconds` long."""

    def __init__(self, server: Server, sources: list[str], per_source: int, seconds: float):
        self.server = server
        self.sources = sources
        self.per_source = per_source
        self.deadline = time.monotonic() + seconds
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> BusyFlood:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def run(self) -> None:
        watch = selectors.DefaultSelector()
        open_from = dict.fromkeys(self.sources, 0)
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                for source in self.sources:
                    for _ in range(min(8, self.per_source - open_from[source])):
                        try:
                            sock = socket.create_connection(
                                self.server.address, timeout=0.5, source_address=(source, 0)
                            )
                        except OSError:
                            break
                        with contextlib.suppress(OSError):
                            sock.send(b"\x00")
                        watch.register(sock, selectors.EVENT_READ, source)
                        open_from[source] += 1
                for key, _ in watch.select(timeout=0.01):
                    sock = cast(socket.socket, key.fileobj)
                    with contextlib.suppress(OSError):
                        sock.recv(1)  # the server closed it (EOF or reset)
                    watch.unregister(sock)
                    sock.close()
                    open_from[key.data] -= 1
        finally:
            for key in list(watch.get_map().values()):
                cast(socket.socket, key.fileobj).close()
            watch.close()


@pytest.mark.parametrize("flooders", [4, 32])
def test_flooding_sources_leave_room_for_another(start_server: StartServer, flooders: int) -> None:
    """Several sources hold as many busy connections as they can get: a source that is not
    among them still gets its TCP answers, because each source's share of the cap shrinks as
    more sources hold connections."""
    server = start_server("--tcp-max-connections", "128")
    sources = [f"127.0.2.{i}" for i in range(1, flooders + 1)]
    answered = 0
    with BusyFlood(server, sources, per_source=max(64, 256 // flooders), seconds=20):
        time.sleep(1.5)  # the flood holds what it can get
        for _ in range(20):
            try:
                with connect(server, source="127.0.0.9") as sock:
                    reply = ask(sock, "frontend.shop.svc.cluster.local.")
                answered += addresses(reply) == {"10.96.10.10"}
            except (OSError, ConnectionError):
                pass
            time.sleep(0.05)
    assert answered >= 19, f"{answered} of 20 answered"
