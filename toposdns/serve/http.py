"""The HTTP endpoints operators probe and scrape: /health, /ready, /metrics and /explain.

/health and /ready follow CoreDNS's health and ready plugins: /health answers 200 `OK` while the
process is up; /ready answers 200 `OK` once the data has synced, and 503 with what is not ready
otherwise. `/explain?client=IP&name=NAME[&type=A]` answers what `toposdns explain --json`
prints, from the data being served at that moment, or 400 with `{"error": ...}`. It tells no
more than a DNS query from that client would, plus where the client and the endpoints are
placed: the port is meant for the cluster's own monitoring, as /metrics is.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from toposdns.explain import explain, parse_question, render_json
from toposdns.resolve.resolver import ResolverConfig
from toposdns.store.snapshot import Snapshot


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
        self.runner = web.AppRunner(app, access_log=None)
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (port 0 picks one)."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        await self.runner.setup()
        await web.SockSite(self.runner, sock).start()
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Stop listening."""
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
            usage = "GET /explain?client=IP&name=NAME[&type=A]"
            return web.json_response({"error": f"{exc}; usage: {usage}"}, status=400)
        assert self.serving is not None  # the route exists only with it
        snapshot, config = self.serving()
        result = render_json(explain(snapshot, config, address, name, qtype))
        return web.json_response(result, dumps=_indented)


def _indented(data: object) -> str:
    """JSON as `toposdns explain --json` prints it."""
    return json.dumps(data, indent=2) + "\n"
