"""An HTTP listener's guard around aiohttp's handler: the cap and each source's share, with room
made by closing the connection quiet the longest (half-sent, idle between requests, or not
reading its answer) of the source that holds the most, or of the newcomer's own; the first
request's deadline, and an answer the client does not take. With fakes for the transport and
aiohttp's handler."""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class CapCase:
    """Connections opened (`open` SOURCE), sending a whole request (`request` N, N counting
    the connections opened), not reading their answer (`pause` N) or taking some of it again
    (`resume` N), under a cap of `cap` connections, `share` the part one source may hold."""

    name: str
    cap: int
    share: int
    events: tuple[tuple[str, str | int], ...]
    closed: tuple[int, ...]  # the connections closed to make room, counted as opened
    sources: dict[str, int]


A, B, C, D, E = "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "127.0.0.1"


def opened(*sources: str) -> tuple[tuple[str, str | int], ...]:
    return tuple(("open", source) for source in sources)


def requests(*numbers: int) -> tuple[tuple[str, str | int], ...]:
    return tuple(("request", number) for number in numbers)


CAP_CASES = [
    CapCase(
        "below the cap and the share, nobody is closed",
        4,
        2,
        opened(A, A, B, B),
        (),
        {A: 2, B: 2},
    ),
    CapCase(
        "at the cap, the waiting connection quiet the longest makes room",
        3,
        1,
        opened(A, A, A) + requests(0) + opened(A, A),
        (1, 2),
        {A: 3},
    ),
    CapCase(
        "idle keep-alive connections make room too, the one idle the longest first",
        3,
        1,
        opened(A, A, A) + requests(1, 0, 2) + opened(E),
        (1,),
        {A: 2, E: 1},
    ),
    CapCase(
        "a client not reading its answer is quiet since its request",
        3,
        1,
        opened(A, A, A) + requests(0, 1, 2) + (("pause", 0),) + opened(E),
        (0,),
        {A: 2, E: 1},
    ),
    CapCase(
        "one taking its answer again is active",
        3,
        1,
        opened(A, A, A) + requests(0, 1, 2) + (("pause", 0), ("resume", 0)) + opened(E),
        (1,),
        {A: 2, E: 1},
    ),
    CapCase(
        "the source holding the most gives way, even when a smaller one was quiet longer",
        4,
        1,
        opened(B, A, A, A) + requests(0, 1, 2, 3) + opened(E),
        (1,),
        {A: 2, B: 1, E: 1},
    ),
    CapCase(
        "a source holding as many as any other recycles its own, the quietest first",
        4,
        1,
        opened(E, A, A, A) + requests(1, 2, 3) + opened(E, E) + requests(4) + opened(E),
        (0, 1, 5),
        {A: 2, E: 2},
    ),
    CapCase(
        "one connection from each of many sources: a new source closes the quietest",
        4,
        1,
        opened(A, B, C, D) + requests(2, 0, 1, 3) + opened(E, E),
        (2, 4),
        {A: 1, B: 1, D: 1, E: 1},
    ),
    CapCase(
        "past its share a source recycles its own, below the cap",
        8,
        4,
        opened(A, A) + requests(0, 1) + opened(B, A, A),
        (0, 1),
        {A: 2, B: 1},
    ),
]


@pytest.mark.parametrize("case", CAP_CASES, ids=[case.name for case in CAP_CASES])
def test_room_at_the_cap_and_the_share(monkeypatch: pytest.MonkeyPatch, case: CapCase) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", case.cap)
    monkeypatch.setattr(http, "SHARE", case.share)

    async def scenario() -> tuple[Listener, list[tuple[Any, FakeTransport, FakeHandler]]]:
        server = listener()
        made: list[tuple[Any, FakeTransport, FakeHandler]] = []
        for event, what in case.events:
            if event == "open":
                made.append(connection(server, str(what)))
            else:
                guard = made[int(what)][0]
                if event == "request":
                    guard.data_received(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                else:
                    getattr(guard, f"{event}_writing")()
        return server, made

    server, made = asyncio.run(scenario())
    assert tuple(n for n, (_, t, _) in enumerate(made) if t.aborted) == case.closed
    assert server.sources == case.sources
    assert server.open == sum(case.sources.values()) == len(made) - len(case.closed)
    for n in case.closed:  # aiohttp's handler hears of it when it is lost
        assert made[n][2].calls[0] == "made"


def test_each_connection_closed_to_make_room_is_one_line_then_counted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(http, "MAX_CONNECTIONS", 8)
    caplog.set_level(logging.INFO, logger="toposdns")

    async def scenario() -> Listener:
        server = listener()
        connection(server, B), connection(server, B)
        for _ in range(3):  # the third closes the first: 2 is A's share
            connection(server, A)[0].data_received(b"GET /ready HTTP/1.1\r\n\r\n")
        for source in [C, C, D, D, E, E]:  # the cap: E's take B's oldest, then A's
            connection(server, source)
        server.evicted.flush()
        return server

    server = asyncio.run(scenario())
    assert server.sources == {A: 1, B: 1, C: 2, D: 2, E: 2}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert re.fullmatch(
        r"HTTP: closed a connection to make room: from 10\.0\.0\.1 for a new one from "
        r"10\.0\.0\.1: it held 2, its share \(a quarter of 8\); it had been idle [0-9.]+s "
        r"since its last request",
        lines[0],
    )
    assert re.fullmatch(
        r"HTTP: closed 2 more connections in the last 5s to make room, the last: from "
        r"10\.0\.0\.1 for a new one from 127\.0\.0\.1: 8 open \(the maximum\), 2 of them from "
        r"10\.0\.0\.1; it had been idle [0-9.]+s since its last request",
        lines[1],
    )
