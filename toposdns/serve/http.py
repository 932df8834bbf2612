"""The HTTP endpoints operators probe and scrape: /health, /ready, /metrics and /explain.

/health and /ready follow CoreDNS's health and ready plugins: /health answers 200 `OK` while the
process is up; /ready answers 200 `OK` once the data has synced, and 503 with what is not ready
otherwise. `/explain?client=IP[/LENGTH]&name=NAME[&type=A]` answers what `toposdns explain --json`
prints, from the data being served at that moment, or 400 with `{"error": ...}`. It tells
where every client and endpoint is placed, so it is served only on an address given for it.

Each address is a listener of its own, as CoreDNS serves health (:8080), ready (:8181) and
metrics (:9153) apart: a flood of scrapes or slow clients on one leaves the probes on the others
alone. A listener is bounded like the DNS port, with about the timeouts of CoreDNS's health
server (plugin/health/health.go: 5 s to read a request, 5 s to write the answer, 5 s idle): at
most MAX_CONNECTIONS at once, a quarter of them from one source address (`SHARE`, as the DNS
port's TCP); the first request must arrive within 5 s of connecting, a later one within 6 s of
the previous answer (aiohttp's keep-alive timeout), and an answer must be taken by the client
within 5 s; request lines and headers are short, and bodies are never read.

A new connection is never refused: past a bound, the connection quiet the longest (waiting for
its first request, idle between requests, or not reading its answer) is closed to make room,
from the source holding the most connections if it holds more than the newcomer's source does,
else from the newcomer's own source. Clients that keep their connections open with a request
now and then therefore hold no slot another source needs, and a connection from an address
holding fewer than the largest holder always gets in: kubelet opens a new one for each probe
(its prober disables keep-alive), so its probes get in wherever they come from (the node's
address, a bridge's, loopback) with no address trusted (docs/operations.md says why). What
aiohttp reports about a bad request becomes one line in the server's own log, tallied when
requests come in floods.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from toposdns.explain import explain, parse_question, render_json
from toposdns.logs import Tally
from toposdns.options import Origin, Plugin, Setting, address_value, seconds, sets
from toposdns.resolve.autopath import AutopathOptions
from toposdns.resolve.resolver import ResolverConfig
from toposdns.store.snapshot import Snapshot

log = logging.getLogger("toposdns")

#: The addresses CoreDNS's health, ready and prometheus plugins listen on by default.
HEALTH_ADDRESS = ("0.0.0.0", 8080)
READY_ADDRESS = ("0.0.0.0", 8181)
METRICS_ADDRESS = ("127.0.0.1", 9153)

Address = tuple[str, int]
#: What answers come from right now, for /explain.
Serving = tuple[Snapshot, ResolverConfig, AutopathOptions]


@dataclass(frozen=True, slots=True)
class HealthOptions:
    """CoreDNS's `health [ADDRESS] { lameduck DURATION }` (`--lameduck`)."""

    #: Where /health is served; None: not at all (but `--http`).
    address: Address | None = None
    #: After SIGTERM, how long to keep answering with /ready failing.
    lameduck: float = 5.0


@dataclass(frozen=True, slots=True)
class ReadyOptions:
    """CoreDNS's `ready [ADDRESS]`."""

    address: Address | None = None


@dataclass(frozen=True, slots=True)
class PrometheusOptions:
    """CoreDNS's `prometheus [ADDRESS]`."""

    address: Address | None = None


def listen_at(default: Address) -> Callable[[Sequence[str], Origin], Address]:
    """`[ADDRESS]`: `HOST:PORT` or `:PORT` (`localhost` is 127.0.0.1); none: `default`."""

    def parse(words: Sequence[str], origin: Origin) -> Address:
        if not words:
            return default
        if len(words) != 1:
            raise origin.error("expected at most one address, e.g. :8080")
        return address_value(words[0].replace("localhost:", "127.0.0.1:"), origin)

    return parse


HEALTH: Plugin[HealthOptions] = Plugin(
    "health",
    HealthOptions,
    (
        Setting(
            "",
            sets("address", listen_at(HEALTH_ADDRESS)),
            "--health",
            "HOST:PORT",
            "serve /health, the liveness probe, here (CoreDNS's health: :8080; default: off)",
        ),
        Setting(
            "lameduck",
            sets("lameduck", seconds(0.0)),
            "--lameduck",
            "DURATION",
            "after SIGTERM, keep answering this long while /ready fails (default {default}s)",
            shows="lameduck",
        ),
    ),
)
READY: Plugin[ReadyOptions] = Plugin(
    "ready",
    ReadyOptions,
    (
        Setting(
            "",
            sets("address", listen_at(READY_ADDRESS)),
            "--ready",
            "HOST:PORT",
            "serve /ready, the readiness probe, here (CoreDNS's ready: :8181; default: off)",
        ),
    ),
)
PROMETHEUS: Plugin[PrometheusOptions] = Plugin(
    "prometheus",
    PrometheusOptions,
    (
        Setting(
            "",
            sets("address", listen_at(METRICS_ADDRESS)),
            "--metrics",
            "HOST:PORT",
            "serve /metrics, for Prometheus, here (CoreDNS's prometheus: :9153; default: off)",
        ),
    ),
)

MAX_CONNECTIONS = 128
#: The part of MAX_CONNECTIONS one source address may hold, as on the DNS port's TCP.
SHARE = 4
REQUEST_TIMEOUT = 5.0
#: The longest request line or header line; probes and scrapers send short ones.
MAX_LINE = 4096
HEAD_END = b"\r\n\r\n"


#: What a listener may serve, in the order its start-up line names them.
PATHS = ("/health", "/ready", "/explain", "/metrics")


class HttpServer:
    """The HTTP endpoints of one process, served on any number of listeners.

    `not_ready()` returns None when ready, else why not. `serving` gives the snapshot and
    resolver options answers come from right now (for /explain); `exposition` gives what
    /metrics answers (default: this process's metrics).
    """

    def __init__(
        self,
        not_ready: Callable[[], str | None],
        serving: Callable[[], Serving] | None = None,
        exposition: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self.not_ready = not_ready
        self.serving = serving
        self.exposition = exposition
        self.listeners: list[Listener] = []

    async def listen(self, host: str, port: int, paths: Collection[str]) -> int:
        """Serve `paths` (of PATHS) on HOST:PORT until `stop`; returns the bound port (port 0
        picks one)."""
        handlers = {
            "/health": self.health,
            "/ready": self.ready,
            "/explain": self.explanation,
            "/metrics": self.metrics,
        }
        app = web.Application()
        for path in paths:
            if path == "/explain" and self.serving is None:
                raise ValueError("/explain needs the data being served")
            app.router.add_get(path, handlers[path])
        listener = Listener(app)
        bound = await listener.start(host, port)
        self.listeners.append(listener)
        return bound

    async def stop(self) -> None:
        """Stop listening, then close the open connections."""
        for listener in self.listeners:
            await listener.stop()

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
        snapshot, config, autopath = self.serving()
        result = render_json(explain(snapshot, config, address, name, qtype, autopath))
        return web.json_response(result, dumps=_indented)


def _indented(data: object) -> str:
    """JSON as `toposdns explain --json` prints it."""
    return json.dumps(data, indent=2) + "\n"


class Listener:
    """One address: aiohttp's server for an application, behind the connection cap."""

    def __init__(self, app: web.Application) -> None:
        self.errors = Tally(
            log,
            logging.WARNING,
            "HTTP: %s",
            "HTTP: %d more errors in the last %gs, the last: %s",
        )
        self.evicted = Tally(
            log,
            logging.WARNING,
            "HTTP: closed a connection to make room: %s",
            "HTTP: closed %d more connections in the last %gs to make room, the last: %s",
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
        self.server: asyncio.Server | None = None
        self.per_source = max(1, MAX_CONNECTIONS // SHARE)
        #: The open connections, quiet the longest first (see `_Connection.active`).
        self.connections: dict[_Connection, None] = {}
        #: Open connections per source address.
        self.sources: dict[str, int] = {}

    @property
    def open(self) -> int:
        """Connections open."""
        return len(self.connections)

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        await self.runner.setup()
        handlers = self.runner.server
        assert handlers is not None
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _Connection(self, handlers()), sock=sock, backlog=MAX_CONNECTIONS
        )
        return int(sock.getsockname()[1])

    async def stop(self) -> None:
        """Stop listening, then close the open connections."""
        if self.server is not None:
            self.server.close()
        await self.runner.cleanup()

    def admit(self, connection: _Connection) -> None:
        """Count a new connection in. At its source's share, first close that source's
        connection quiet the longest; at the cap, the one quiet the longest of the source
        holding the most, if that holds more than the newcomer's source, else of its own."""
        source = connection.source
        held = self.sources.get(source, 0)
        victim: _Connection | None = None
        if held >= self.per_source:
            victim = self.quietest(source, held, others=False)
            why = f"it held {held}, its share (a quarter of {MAX_CONNECTIONS})"
        elif self.open >= MAX_CONNECTIONS:
            victim = self.quietest(source, held, others=True)
            why = (
                f"{self.open} open (the maximum), "
                f"{self.sources[victim.source]} of them from {victim.source}"
            )
        if victim is not None:
            self.evicted.add(
                f"from {victim.source} for a new one from {source}: {why}; it {victim.state()}"
            )
            victim.close()  # which may be of `source`: count after
        self.connections[connection] = None
        self.sources[source] = self.sources.get(source, 0) + 1

    def quietest(self, source: str, held: int, others: bool) -> _Connection:
        """The connection quiet the longest of the source holding the most connections, more
        than `held` (with `others`), else of `source`, which holds `held`.

        One is always found: past the share `source` holds some; at the cap, if `source` holds
        none, every connection is of a source holding more."""
        found: _Connection | None = None
        most = -1
        for connection in self.connections:  # quiet the longest first
            if connection.source == source:
                rank = 0
            elif not others or (rank := self.sources[connection.source]) <= held:
                continue
            if rank > most:
                found, most = connection, rank
        assert found is not None
        return found

    def touch(self, connection: _Connection) -> None:
        """`connection` is active: it becomes the last to be closed to make room."""
        if connection.counted:
            del self.connections[connection]
            self.connections[connection] = None

    def release(self, connection: _Connection) -> None:
        """A connection `admit` let in is gone."""
        del self.connections[connection]
        left = self.sources[connection.source] - 1
        if left:
            self.sources[connection.source] = left
        else:
            del self.sources[connection.source]


class _Connection(asyncio.Protocol):
    """One HTTP connection: aiohttp's handler behind the connection cap and two deadlines.

    aiohttp closes a connection that sends no whole request within its keep-alive timeout of
    the previous answer, but (before 3.14.4) not before the first request, and it waits for
    a client that does not read its answer for ever. So: the first request's head (up to its
    blank line) must be whole within REQUEST_TIMEOUT of connecting, and the answer may not
    wait for the client to read it for more than REQUEST_TIMEOUT either.

    The connection is active when it connects, when the head of a request is whole, and when
    the client takes some of its answer after a pause: the one active the longest ago is the
    first to be closed to make room.
    """

    def __init__(self, listener: Listener, handler: asyncio.Protocol) -> None:
        self.listener = listener
        self.handler: asyncio.Protocol | None = handler
        self.transport: asyncio.Transport | None = None
        self.source = "?"
        self.counted = False  # admitted, and not yet released
        self.tail = b""  # the last 3 bytes received: a blank line may be split
        self.waiting = True  # for the first request's head to be whole
        self.paused = False  # the client is not reading its answer
        self.active = 0.0  # monotonic time of the last activity
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = self.transport.get_extra_info("peername")
        self.source = str(peer[0]) if peer else "?"
        self.active = time.monotonic()
        self.listener.admit(self)
        self.counted = True
        assert self.handler is not None
        self.handler.connection_made(transport)
        self.timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT, self.expire)

    def data_received(self, data: bytes) -> None:
        if self.handler is None:
            return
        # The end of a request's head (or a body's bytes that look like it: whoever sends a
        # body with GET only makes its own connection look active).
        keep = len(HEAD_END) - 1
        if HEAD_END in data or HEAD_END in self.tail + data[:keep]:
            if self.waiting:
                self.waiting = False
                self.cancel()
            self.activity()
        self.tail = (self.tail + data[-keep:])[-keep:]
        self.handler.data_received(data)

    def activity(self) -> None:
        self.active = time.monotonic()
        self.listener.touch(self)

    def state(self) -> str:
        """What the connection was doing, for the line that says it was closed."""
        quiet = time.monotonic() - self.active
        if self.waiting:
            return f"had sent no whole request yet ({quiet:.1f}s)"
        if self.paused:
            return f"had not read its answer for {quiet:.1f}s"
        return f"had been idle {quiet:.1f}s since its last request"

    def pause_writing(self) -> None:
        # The client is not reading its answer: it has REQUEST_TIMEOUT to start again.
        self.paused = True
        self.cancel()
        self.timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT, self.expire)
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        self.paused = False
        if not self.waiting:
            self.cancel()
        self.activity()
        if self.handler is not None:
            self.handler.resume_writing()

    def expire(self) -> None:
        """A deadline passed: close the connection."""
        self.timer = None
        if self.transport is None or self.transport.is_closing():
            return
        what = "sent no whole request" if self.waiting else "did not read its answer"
        self.listener.errors.add(
            f"closed a connection from {self.source}: it {what} within {REQUEST_TIMEOUT:g}s"
        )
        self.close()

    def close(self) -> None:
        """Close at once, and leave room for another connection right away."""
        self.cancel()
        self.release()
        if self.transport is not None:
            self.transport.abort()

    def release(self) -> None:
        if self.counted:
            self.counted = False
            self.listener.release(self)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def eof_received(self) -> bool | None:
        return self.handler.eof_received() if self.handler is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.cancel()
        self.release()
        if self.handler is not None:
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
