"""The HTTP endpoints operators probe and scrape: /health, /ready and /metrics.

They follow CoreDNS's health and ready plugins: /health answers 200 `OK` while the process is
up; /ready answers 200 `OK` once the data has synced, and 503 with what is not ready otherwise.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


class HttpServer:
    """A small aiohttp server; `not_ready()` returns None when ready, else why not."""

    def __init__(self, not_ready: Callable[[], str | None]) -> None:
        self.not_ready = not_ready
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/metrics", self.metrics)
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
        body = generate_latest()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
