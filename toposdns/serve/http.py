"""The HTTP endpoints operators probe and scrape: /health, /ready, /metrics and /explain.

/health and /ready follow CoreDNS's health and ready plugins: /health answers 200 `OK` while the
process is up; /ready answers 200 `OK` once the data has synced, and 503 with what is not ready
otherwise. `/explain?client=IP[/LENGTH]&name=NAME[&type=A]` answers what `toposdns explain --json`
prints, from the data being served at that moment, or 400 with `{"error": ...}`. It tells no
more than a DNS query from that client would, plus where the client and the endpoints are
placed: the port is meant for the cluster's own monitoring, as /metrics is.

The port is bounded like the DNS port, with about the timeouts of CoreDNS's health server
(plugin/health/health.go: 5 s to read a request, 5 s to write the answer, 5 s idle): at most
MAX_CONNECTIONS at once; the first request must arrive within 5 s of connecting, a later one
within 6 s of the previous answer (aiohttp's keep-alive timeout), and an answer must be taken
by the client within 5 s; request lines and headers are short, and bodies are never read (the
connection is closed after the answer). What aiohttp reports about a bad request becomes one
line in the server's own log, tallied when requests come in floods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from toposdns.explain import explain, parse_question, render_json
from toposdns.logs import Tally
from toposdns.resolve.resolver import ResolverConfig
from toposdns.store.snapshot import Snapshot

log = logging.getLogger("toposdns")

MAX_CONNECTIONS = 128
REQUEST_TIMEOUT = 5.0
#: The longest request line or header line; probes and scrapers send short ones.
MAX_LINE = 4096
HEAD_END = b"\r\n\r\n"


class HttpServer:
    """A small aiohttp server; `not_ready()` returns None when ready, else why not. With
    `serving`, which gives the snapshot and resolver options answers come from right now, it
    serves /explain too. `exposition` gives what /metrics answers (default: this process's
    metrics)."""

    def __init__(
        self,
        not_ready: Callable[[], str | None],
        serving: Callable[[], tuple[Snapshot, ResolverConfig]] | None = None,
        exposition: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self.not_ready = not_ready
        self.serving = serving
        self.exposition = exposition
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.metrics)
        if serving is not None:
            app.router.add_get("/explain", self.explanation)
        self.errors = Tally(
            log,
            logging.WARNING,
            "HTTP: %s",
            "HTTP: %d more errors in the last %gs, the last: %s",
        )
        self.refused = Tally(
            log,
            logging.WARNING,
            "refused an HTTP connection %s",
            "refused %d more HTTP connections in the last %gs, the last %s",
        )
        self.runner = web.AppRunner(
            app,
            access_log=None,
            logger=_OneLine(self.errors),
            handler_cancellation=True,
            # Later than the first request's deadline, which aiohttp 3.14.4+ also enforces by
            # this timer: ours then closes (and logs) first.
            keepalive_timeout=REQUEST_TIMEOUT + 1,
            lingering_time=0,
            max_line_size=MAX_LINE,
            max_field_size=MAX_LINE,
            max_headers=32,
        )
        self.listener: asyncio.Server | None = None
        self.open = 0
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (port 0 picks one)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        await self.runner.setup()
        handlers = self.runner.server
        assert handlers is not None
        loop = asyncio.get_running_loop()
        self.listener = await loop.create_server(
            lambda: _Connection(self, handlers()), sock=sock, backlog=MAX_CONNECTIONS
        )
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening, then close the open connections."""
        if self.listener is not None:
            self.listener.close()
        await self.runner.cleanup()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def ready(self, request: web.Request) -> web.Response:
        reason = self.not_ready()
        if reason is None:
            return web.Response(text="OK")
        return web.Response(status=503, text=reason)

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest() if self.exposition is None else await self.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def explanation(self, request: web.Request) -> web.Response:
        params = request.query
        try:
            for required in ("client", "name"):
                if required not in params:
                    raise ValueError(f"parameter {required!r} is missing")
            address, name, qtype = parse_question(
                params["client"], params["name"], params.get("type", "A")
            )
        except ValueError as exc:
            usage = "GET /explain?client=IP[/LENGTH]&name=NAME[&type=A]"
            return web.json_response({"error": f"{exc}; usage: {usage}"}, status=400)
        assert self.serving is not None  # the route exists only with it
        snapshot, config = self.serving()
        result = render_json(explain(snapshot, config, address, name, qtype))
        return web.json_response(result, dumps=_indented)


def _indented(data: object) -> str:
    """JSON as `toposdns explain --json` prints it."""
    return json.dumps(data, indent=2) + "\n"


class _Connection(asyncio.Protocol):
    """One HTTP connection: aiohttp's handler behind the connection cap and two deadlines.

    aiohttp closes a connection that sends no whole request within its keep-alive timeout of
    the previous answer, but (before 3.14.4) not before the first request, and it waits for
    a client that does not read its answer for ever. So: the first request's head (up to its
    blank line) must be whole within REQUEST_TIMEOUT of connecting, and the answer may not
    wait for the client to read it for more than REQUEST_TIMEOUT either.
    """

    def __init__(self, server: HttpServer, handler: asyncio.Protocol) -> None:
        self.server = server
        self.handler: asyncio.Protocol | None = handler
        self.transport: asyncio.Transport | None = None
        self.tail = b""  # the first request so far, up to 3 bytes: a blank line may be split
        self.waiting = True  # for the first request's head to be whole
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        if server.open >= MAX_CONNECTIONS:
            server.refused.add(f"from {self.peer()}: {server.open} already open (the maximum)")
            self.handler = None
            self.transport.abort()
            return
        server.open += 1
        assert self.handler is not None
        self.handler.connection_made(transport)
        self.timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT, self.expire)

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            return
        if self.waiting:
            seen = self.tail + data
            if HEAD_END in seen:
                self.waiting = False
                self.cancel()
            self.tail = seen[-(len(HEAD_END) - 1) :]
        self.handler.data_received(data)

    def pause_writing(self) -> None:
        # The client is not reading its answer: it has REQUEST_TIMEOUT to start again.
        self.cancel()
        self.timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT, self.expire)
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if not self.waiting:
            self.cancel()
        if self.handler is not None:
            self.handler.resume_writing()

    def expire(self) -> None:
        """A deadline passed: close the connection."""
        self.timer = None
        if self.transport is None or self.transport.is_closing():
            return
        what = "sent no whole request" if self.waiting else "did not read its answer"
        self.server.errors.add(
            f"closed a connection from {self.peer()}: it {what} within {REQUEST_TIMEOUT:g}s"
        )
        self.transport.abort()

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return str(peer[0]) if peer else "?"

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel()
        if self.handler is not None:
            self.server.open -= 1
            self.handler.connection_lost(exc)
            self.handler = None


class _OneLine(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log (a malformed request, an error in a handler) as one line each,
    without the traceback, tallied; its debug lines are dropped."""

    def __init__(self, tally: Tally) -> None:
        super().__init__(log, {})
        self.tally = tally

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level < logging.WARNING:
            return
        text = str(msg) % args if args else str(msg)
        exc = kwargs.get("exc_info")
        if isinstance(exc, BaseException):
            what = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            text = f"{text}: {what}"
        self.tally.add(" ".join(text.split()))
