"""The TCP frontend (RFC 7766): 2-byte length framing, pipelining, idle timeout, connection cap.

Queries on one connection are answered in the order they arrive; each answer is written as soon
as it is ready, so a client may send many queries without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, cast

from toposdns.serve.responder import Responder, Transport

log = logging.getLogger("toposdns")

#: Queries one connection may have waiting for an upstream; past that its queries are read only
#: as those are answered, so one pipelining client cannot hold every forwarding slot.
MAX_PENDING = 32


class TcpLimits:
    """Shared by all connections of one listener."""

    def __init__(self, max_connections: int, idle_timeout: float) -> None:
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.open = 0


class TcpProtocol(asyncio.Protocol):
    """One TCP connection."""

    def __init__(self, responder: Responder, limits: TcpLimits, kind: Transport) -> None:
        self.responder = responder
        self.limits = limits
        self.kind = kind
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.counted = False
        self.pending: set[asyncio.Task[None]] = set()
        self.writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        if self.limits.open >= self.limits.max_connections:
            log.warning("closing a TCP connection: %d already open", self.limits.open)
            self.transport.abort()
            return
        self.limits.open += 1
        self.counted = True
        self.last_active = time.monotonic()
        self.timer = asyncio.get_running_loop().call_later(
            self.limits.idle_timeout, self.check_idle
        )

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        self.last_active = time.monotonic()
        buffer = self.buffer
        buffer += data
        responder = self.responder
        source = self.transport.get_extra_info("peername")[0]
        while len(buffer) >= 2 and len(self.pending) < MAX_PENDING:
            length = (buffer[0] << 8) | buffer[1]
            if len(buffer) < 2 + length:
                break
            message = bytes(buffer[2 : 2 + length])
            del buffer[: 2 + length]
            reply = responder.respond(message, self.kind, source, time.perf_counter())
            if reply is None:
                continue
            if not isinstance(reply, bytes):
                # Answered when the upstream is; RFC 7766 lets replies overtake each other.
                self.later(reply)
                continue
            self.transport.write(len(reply).to_bytes(2, "big") + reply)

    def later(self, answer: Coroutine[Any, Any, bytes | None]) -> None:
        """Write a reply once its upstream lookup is done, if the connection is still open."""

        async def send() -> None:
            reply = await answer
            if reply is not None and self.transport is not None and not self.transport.is_closing():
                self.last_active = time.monotonic()
                self.transport.write(len(reply).to_bytes(2, "big") + reply)

        task = asyncio.create_task(send())
        self.pending.add(task)
        task.add_done_callback(self.answered)
        if len(self.pending) == MAX_PENDING and self.transport is not None:
            self.transport.pause_reading()

    def answered(self, task: asyncio.Task[None]) -> None:
        """An upstream lookup is done: read on if the connection had reached MAX_PENDING."""
        full = len(self.pending) == MAX_PENDING
        self.pending.discard(task)
        if full and self.transport is not None and not self.transport.is_closing():
            if not self.writing_paused:
                self.transport.resume_reading()
            self.data_received(b"")  # the queries already read and left in the buffer

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading its queries too.
        self.writing_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.transport is not None and len(self.pending) < MAX_PENDING:
            self.transport.resume_reading()

    def check_idle(self) -> None:
        """Close the connection once it has been idle for the whole timeout."""
        assert self.transport is not None
        idle = time.monotonic() - self.last_active
        if idle >= self.limits.idle_timeout:
            self.transport.close()
            return
        self.timer = asyncio.get_running_loop().call_later(
            self.limits.idle_timeout - idle, self.check_idle
        )

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.counted:
            self.limits.open -= 1
            self.counted = False
