"""The --http port's guard around aiohttp's handler: the cap, the first request's deadline,
and an answer the client does not take. With fakes for the transport and aiohttp's handler."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from toposdns.serve import http
from toposdns.serve.http import HttpServer


class FakeTransport:
    def __init__(self) -> None:
        self.aborted = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.9", 40000) if name == "peername" else default

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


def connection(server: HttpServer) -> tuple[Any, FakeTransport, FakeHandler]:
    handler = FakeHandler()
    guard = http._Connection(server, handler)
    transport = FakeTransport()
    guard.connection_made(transport)  # type: ignore[arg-type]
    return guard, transport, handler


@pytest.fixture
def short_deadline(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(http, "REQUEST_TIMEOUT", 0.05)
    caplog.set_level(logging.INFO, logger="toposdns")


@pytest.mark.usefixtures("short_deadline")
def test_a_request_split_at_its_blank_line_is_in_time(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[FakeTransport, FakeHandler]:
        guard, transport, handler = connection(HttpServer(lambda: None))
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
        guard, transport, _ = connection(HttpServer(lambda: None))
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
    server = HttpServer(lambda: None)

    async def scenario() -> tuple[FakeTransport, FakeHandler]:
        guard, transport, handler = connection(server)
        guard.data_received(b"GET /metrics HTTP/1.1\r\n\r\n")
        guard.pause_writing()
        guard.resume_writing()  # the client read in time
        await asyncio.sleep(0.1)
        assert not transport.aborted
        guard.pause_writing()  # and now it stops reading
        await asyncio.sleep(0.1)
        guard.connection_lost(None)
        return transport, handler

    transport, handler = asyncio.run(scenario())
    assert transport.aborted and server.open == 0
    assert handler.calls[-3:] == ["resume", "pause", "lost"]
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP: closed a connection from 127.0.0.9: it did not read its answer within 0.05s"
    ]


def test_connections_over_the_cap_are_refused(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 2)
    server = HttpServer(lambda: None)

    async def scenario() -> list[tuple[Any, FakeTransport, FakeHandler]]:
        return [connection(server) for _ in range(3)]

    made = asyncio.run(scenario())
    assert [t.aborted for _, t, _ in made] == [False, False, True]
    assert made[2][2].calls == []  # aiohttp never saw it
    assert server.open == 2
    made[0][0].connection_lost(None)
    assert server.open == 1
    assert [r.getMessage() for r in caplog.records] == [
        "refused an HTTP connection from 127.0.0.9: 2 already open (the maximum)"
    ]
