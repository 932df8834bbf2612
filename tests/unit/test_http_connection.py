"""An HTTP listener's guard around aiohttp's handler: the cap, with room made by closing the
oldest connection still waiting for a request, from the source that holds the most; the first
request's deadline, and an answer the client does not take. With fakes for the transport and
aiohttp's handler."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web

from toposdns.serve import http
from toposdns.serve.http import Listener


class FakeTransport:
    def __init__(self, source: str = "127.0.0.9") -> None:
        self.aborted = False
        self.source = source

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.source, 40000) if name == "peername" else default

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted


class FakeHandler(asyncio.Protocol):
    """Records what the guard passes on."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def connection_made(self, transport: Any) -> None:
        self.calls.append("made")

    def data_received(self, data: bytes) -> None:
        self.calls.append(data.decode())

    def pause_writing(self) -> None:
        self.calls.append("pause")

    def resume_writing(self) -> None:
        self.calls.append("resume")

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append("lost")


def connection(
    listener: Listener, source: str = "127.0.0.9"
) -> tuple[Any, FakeTransport, FakeHandler]:
    handler = FakeHandler()
    guard = http._Connection(listener, handler)
    transport = FakeTransport(source)
    guard.connection_made(transport)  # type: ignore[arg-type]
    return guard, transport, handler


def listener() -> Listener:
    return Listener(web.Application())


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(http, "REQUEST_TIMEOUT", 0.05)
    caplog.set_level(logging.INFO, logger="toposdns")


@pytest.mark.usefixtures("short_deadline")
def test_a_request_split_at_its_blank_line_is_in_time(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[FakeTransport, FakeHandler]:
        guard, transport, handler = connection(listener())
        guard.data_received(b"GET /health HTTP/1.1\r\nHost: x\r\n\r")
        guard.data_received(b"\n")
        await asyncio.sleep(0.1)
        return transport, handler

    transport, handler = asyncio.run(scenario())
    assert not transport.aborted and not caplog.records
    assert handler.calls == ["made", "GET /health HTTP/1.1\r\nHost: x\r\n\r", "\n"]


@pytest.mark.usefixtures("short_deadline")
def test_a_request_that_never_ends_is_closed(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> FakeTransport:
        guard, transport, _ = connection(listener())
        for _ in range(10):
            guard.data_received(b"X-Slow: 1\r\n")
            await asyncio.sleep(0.01)
        return transport

    assert asyncio.run(scenario()).aborted
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP: closed a connection from 127.0.0.9: it sent no whole request within 0.05s"
    ]


@pytest.mark.usefixtures("short_deadline")
def test_an_answer_the_client_does_not_take_is_abandoned(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[FakeTransport, FakeHandler, Listener]:
        server = listener()
        guard, transport, handler = connection(server)
        guard.data_received(b"GET /metrics HTTP/1.1\r\n\r\n")
        guard.pause_writing()
        guard.resume_writing()  # the client read in time
        await asyncio.sleep(0.1)
        assert not transport.aborted
        guard.pause_writing()  # and now it stops reading
        await asyncio.sleep(0.1)
        guard.connection_lost(None)
        return transport, handler, server

    transport, handler, server = asyncio.run(scenario())
    assert transport.aborted and server.open == 0
    assert handler.calls[-3:] == ["resume", "pause", "lost"]
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP: closed a connection from 127.0.0.9: it did not read its answer within 0.05s"
    ]


def test_at_the_cap_the_oldest_waiting_connection_makes_room(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 3)

    async def scenario() -> tuple[Listener, list[tuple[Any, FakeTransport, FakeHandler]]]:
        server = listener()
        made = [connection(server) for _ in range(3)]
        made[0][0].data_received(b"GET /metrics HTTP/1.1\r\n\r\n")  # busy: never closed
        made += [connection(server), connection(server)]
        return server, made

    server, made = asyncio.run(scenario())
    # The second and third waited longest for a request; the first was answering.
    assert [t.aborted for _, t, _ in made] == [False, True, True, False, False]
    assert server.open == 3 and server.sources == {"127.0.0.9": 3}
    assert made[1][2].calls == ["made"]  # aiohttp's handler hears of it when it is lost
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP: closed a connection from 127.0.0.9 to make room: it had sent no whole request, "
        "and 3 were open (the maximum)"
    ]


def test_the_source_holding_the_most_gives_way(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 4)

    async def scenario() -> tuple[Listener, list[tuple[Any, FakeTransport, FakeHandler]]]:
        server = listener()
        made = [connection(server, "127.0.0.3")] + [connection(server, "10.0.0.1") for _ in "abc"]
        made.append(connection(server, "127.0.0.3"))  # the flood's oldest goes: 2 each
        made.append(connection(server, "127.0.0.3"))  # a tie: the oldest, its own, goes
        made.append(connection(server, "127.0.0.3"))  # a tie, the oldest not its own: refused
        return server, made

    server, made = asyncio.run(scenario())
    assert [t.aborted for _, t, _ in made] == [True, True, False, False, False, False, True]
    assert server.sources == {"127.0.0.3": 2, "10.0.0.1": 2}
    assert made[6][2].calls == []  # aiohttp never saw it
    assert caplog.records[-1].getMessage() == (
        "refused an HTTP connection from 127.0.0.3: 4 already open (the maximum), 2 of them its "
        "own, none of a larger share waiting for a request"
    )


def test_at_the_cap_with_none_waiting_a_new_connection_is_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)

    async def scenario() -> tuple[Listener, list[tuple[Any, FakeTransport, FakeHandler]]]:
        server = listener()
        made = [connection(server) for _ in range(2)]
        for guard, _, _ in made:
            guard.data_received(b"GET /metrics HTTP/1.1\r\n\r\n")
        made.append(connection(server))
        return server, made

    server, made = asyncio.run(scenario())
    assert [t.aborted for _, t, _ in made] == [False, False, True]
    assert server.open == 2
    made[0][0].connection_lost(None)
    assert server.open == 1 and server.sources == {"127.0.0.9": 1}
    assert [r.getMessage() for r in caplog.records] == [
        "refused an HTTP connection from 127.0.0.9: 2 already open (the maximum), 2 of them its "
        "own, none of a larger share waiting for a request"
    ]
