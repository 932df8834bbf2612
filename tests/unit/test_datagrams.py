"""The C extension behind the batched UDP frontend: batches both ways, and its error paths."""

from __future__ import annotations

import errno
import logging
import select
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from toposdns.serve import udp_batch
from toposdns.serve.datagrams import Datagrams
from toposdns.serve.udp_batch import BatchedUdp


@pytest.fixture(params=[(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")], ids=["v4", "v6"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket]]:
    """A server socket and a client socket on loopback, both bound."""
    family, host = request.param
    server = socket.socket(family, socket.SOCK_DGRAM)
    client = socket.socket(family, socket.SOCK_DGRAM)
    try:
        server.bind((host, 0))
        client.bind((host, 0))
        client.settimeout(2)
        yield server, client
    finally:
        server.close()
        client.close()


def received(sock: socket.socket, count: int) -> list[tuple[bytes, Any]]:
    return [sock.recvfrom(65535) for _ in range(count)]


def test_a_batch_read_and_answered_in_one_flush(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    datagrams = Datagrams(server.fileno(), server.family, 4)
    sent = [bytes([i]) * (i + 1) for i in range(6)]
    for data in sent:
        client.sendto(data, server.getsockname())
    first, second, third = datagrams.recv(), datagrams.recv(), datagrams.recv()
    assert [data for data, _ in first + second] == sent  # 4 slots, then the 2 left
    assert third == []
    # The address is the socket module's: the client's own, as recvfrom gives it.
    assert {addr for _, addr in first} == {client.getsockname()}
    for data, addr in first + second:
        datagrams.sendto(b"re:" + data, addr)
    assert not readable(client)  # held until the flush
    assert datagrams.flush() == 0
    assert [data for data, _ in received(client, 6)] == [b"re:" + data for data in sent]
    # After the flush a reply goes at once (an upstream's answer, outside a batch).
    datagrams.sendto(b"later", client.getsockname())
    assert client.recv(100) == b"later"
    assert datagrams.dropped == 0


def readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0.05)[0])


def test_empty_socket_reads_nothing(pair: tuple[socket.socket, socket.socket]) -> None:
    server, _ = pair
    assert Datagrams(server.fileno(), server.family).recv() == []


def test_oversize_reply_is_dropped_and_the_rest_sent(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    server, client = pair
    datagrams = Datagrams(server.fileno(), server.family)
    client.sendto(b"q", server.getsockname())
    [(_, addr)] = datagrams.recv()
    datagrams.sendto(b"a", addr)
    datagrams.sendto(b"x" * 70_000, addr)  # larger than any UDP datagram: EMSGSIZE
    datagrams.sendto(b"b", addr)
    assert datagrams.flush() == errno.EMSGSIZE
    assert [data for data, _ in received(client, 2)] == [b"a", b"b"]
    assert (datagrams.dropped, datagrams.last_error) == (1, errno.EMSGSIZE)
    datagrams.recv()
    datagrams.sendto(b"c", addr)
    assert datagrams.flush() == 0  # the next send that goes clears the error
    assert (datagrams.dropped, datagrams.last_error) == (1, 0)


@pytest.mark.parametrize(
    ("address", "error", "message"),
    [
        ("HOST", TypeError, "address must be a tuple, not str"),
        (("HOST",), TypeError, "address must be \\(host, port"),
        (("HOST", 53, 0, 0, 0), TypeError, "address must be \\(host, port"),
        ((b"HOST", 53), TypeError, "address must be \\(host, port"),
        (("not an address", 53), ValueError, "not an IPv[46] address"),
        (("HOST", 70000), ValueError, "port 70000 is not within 0..65535"),
        (("HOST", -1), ValueError, "port -1 is not within 0..65535"),
    ],
)
def test_bad_address_is_refused_before_anything_is_sent(
    pair: tuple[socket.socket, socket.socket], address: Any, error: type[Exception], message: str
) -> None:
    server, client = pair
    datagrams = Datagrams(server.fileno(), server.family)
    datagrams.recv()
    host = client.getsockname()[0]
    if isinstance(address, tuple):
        address = tuple(host if part == "HOST" else part for part in address)
        address = tuple(host.encode() if part == b"HOST" else part for part in address)
    with pytest.raises(error, match=message):
        datagrams.sendto(b"reply", address)
    datagrams.sendto(b"good", client.getsockname())
    assert datagrams.flush() == 0
    assert client.recv(100) == b"good"


def test_reply_must_be_bytes(pair: tuple[socket.socket, socket.socket]) -> None:
    server, client = pair
    with pytest.raises(TypeError, match="data must be bytes, not bytearray"):
        Datagrams(server.fileno(), server.family).sendto(bytearray(b"x"), client.getsockname())


def test_closed_socket_raises_oserror() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    datagrams = Datagrams(sock.fileno(), socket.AF_INET)
    sock.close()
    with pytest.raises(OSError) as read:
        datagrams.recv()
    assert read.value.errno == errno.EBADF
    with pytest.raises(OSError) as write:
        datagrams.sendto(b"x", ("127.0.0.1", 9))
    assert write.value.errno == errno.EBADF


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((3, socket.AF_UNIX), "neither AF_INET nor AF_INET6"),
        ((3, socket.AF_INET, 0), "slots 0 is not within 1..1024"),
        ((3, socket.AF_INET, 5000), "slots 5000 is not within 1..1024"),
    ],
)
def test_bad_construction(args: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Datagrams(*args)


class Echo:
    """A protocol stand-in: replies with what it got, or with `big` bytes when asked "big"."""

    transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(b"x" * 70_000 if data == b"big" else data, addr)


def test_drops_are_logged_once_per_state_change(
    pair: tuple[socket.socket, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    server, client = pair
    batched = BatchedUdp(Echo(), server)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, "toposdns")
    for round_ in (["big", "a"], ["big", "big"], ["b"], ["c"]):
        for data in round_:
            client.sendto(data.encode(), server.getsockname())
        batched.ready()
    assert [client.recv(100) for _ in range(3)] == [b"a", b"b", b"c"]
    host, port = server.getsockname()[:2]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    dropped, again = (r.getMessage() for r in caplog.records)
    assert dropped.startswith(f"UDP replies dropped on {where}: Message too long (EMSGSIZE): ")
    assert again == f"UDP replies sent again on {where}"


def test_unbuilt_extension_warns_once_and_falls_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(udp_batch, "MISSING", "No module named 'toposdns.serve.datagrams'")
    monkeypatch.setattr(udp_batch, "_warned", False)
    assert udp_batch.wanted("off") is False
    assert caplog.records == []
    assert udp_batch.wanted("on") is False
    assert udp_batch.wanted("on") is False
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("--udp-batch on: the C extension toposdns.serve.datagrams is not built")
    monkeypatch.setattr(udp_batch, "MISSING", None)
    assert udp_batch.wanted("on") is True
