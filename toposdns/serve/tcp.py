"""The TCP frontend (RFC 7766): 2-byte length framing, pipelining, timeouts, a fair cap.

Queries on one connection are answered in the order they arrive; each answer is written as soon
as it is ready, so a client may send many queries without waiting.

Two timers bound a connection, as miekg/dns (under CoreDNS) bounds its reads: a connection with
no message under way is closed once idle for the idle timeout, counted from its last whole
message; once a message's first byte is in, the whole message must follow within the read
timeout. A client trickling bytes therefore holds a slot for seconds, not indefinitely.

The cap is shared fairly: one source address holds at most a quarter of it (`SHARE`). A new
connection past either bound closes the oldest idle connection (none under way, no answer
pending) of that source, or of the source holding the most, to make room (RFC 7766 §6.2.3
lets a server close idle connections when it needs to); only when none is idle is the new
one refused. One client opening connections without end therefore neither holds every slot
nor keeps others out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, cast

from toposdns.logs import Tally
from toposdns.options import Plugin, Setting, integer, seconds, sets
from toposdns.serve.acl import Screen
from toposdns.serve.responder import Responder
from toposdns.serve.transport import TCP4, Transport, unmapped

log = logging.getLogger("toposdns")

#: Queries one connection may have waiting for an upstream; past that its queries are read only
#: as those are answered, so one pipelining client cannot hold every forwarding slot.
MAX_PENDING = 32
#: The part of the connection cap one source address may hold.
SHARE = 4


@dataclass(frozen=True, slots=True)
class TcpOptions:
    """The DNS port's TCP connections: how many, and how long they may wait (toposdns's own)."""

    max_connections: int = 1024
    #: Connections idle this long are closed.
    idle_timeout: float = 10.0
    #: Once a message's first byte is in, the rest must follow within this many seconds.
    read_timeout: float = 3.0


TCP: Plugin[TcpOptions] = Plugin(
    "tcp",
    TcpOptions,
    (
        Setting(
            "tcp_idle_timeout",
            sets("idle_timeout", seconds()),
            "--tcp-idle-timeout",
            "DURATION",
            "close TCP connections idle this long (default {default}s)",
            shows="idle_timeout",
        ),
        Setting(
            "tcp_read_timeout",
            sets("read_timeout", seconds()),
            "--tcp-read-timeout",
            "DURATION",
            "close a TCP connection when a query's bytes take longer than this to arrive "
            "(default {default}s)",
            shows="read_timeout",
        ),
        Setting(
            "tcp_max_connections",
            sets("max_connections", integer(1, 1_000_000, "1024")),
            "--tcp-max-connections",
            "N",
            "keep at most this many TCP connections open, a quarter of them from one "
            "address; past that a new one closes the oldest idle one, or is refused "
            "(default {default})",
            shows="max_connections",
        ),
    ),
    directive="toposdns",
)


class TcpLimits:
    """Shared by all connections of one listener: the open ones, in the order they opened, in
    all and by source address."""

    def __init__(
        self, max_connections: int, idle_timeout: float, read_timeout: float = 3.0
    ) -> None:
        self.max_connections = max_connections
        self.per_source = max(1, max_connections // SHARE)
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self.connections: dict[TcpProtocol, None] = {}
        self.by_source: dict[str, dict[TcpProtocol, None]] = {}
        self.refused = Tally(
            log,
            logging.WARNING,
            "refused a TCP connection %s",
            "refused %d more TCP connections in the last %gs, the last %s",
        )
        self.too_slow = Tally(
            log,
            logging.WARNING,
            "closed a TCP connection %s",
            "closed %d more TCP connections in the last %gs, the last %s",
        )
        self.evicted = Tally(
            log,
            logging.INFO,
            "closed an idle TCP connection %s",
            "closed %d more idle TCP connections in the last %gs to make room, the last %s",
        )

    @property
    def open(self) -> int:
        """Connections open."""
        return len(self.connections)

    def admit(self, connection: TcpProtocol, source: str) -> bool:
        """Count a new connection in, closing an idle one to make room if a bound is reached;
        False (not counted) when none is idle."""
        mine = self.by_source.get(source)
        if mine is not None and len(mine) >= self.per_source:
            if not self._evict(mine, f"of {source}: {len(mine)} open from it, its share"):
                self.refused.add(
                    f"from {source}: {len(mine)} already open from it (a quarter of "
                    "--tcp-max-connections)"
                )
                return False
        elif len(self.connections) >= self.max_connections:
            if not self._evict(self.connections, f"for {source}: {self.open} open"):
                self.refused.add(f"from {source}: {self.open} already open (--tcp-max-connections)")
                return False
        self.connections[connection] = None
        self.by_source.setdefault(source, {})[connection] = None
        return True

    def release(self, connection: TcpProtocol, source: str) -> None:
        """Count a connection out (closed, or closing)."""
        if self.connections.pop(connection, 0) is None:
            mine = self.by_source[source]
            del mine[connection]
            if not mine:
                del self.by_source[source]

    def _evict(self, among: dict[TcpProtocol, None], why: str) -> bool:
        """Close the connection idle the longest among `among`, of the source holding the most
        connections; False if none is idle."""
        idle = [connection for connection in among if connection.idle]
        if not idle:
            return False
        by_source = self.by_source
        oldest = max(idle, key=lambda c: (len(by_source[c.source]), -c.last_active))
        self.evicted.add(f"{why} (--tcp-max-connections)")
        oldest.close()
        return True


class TcpProtocol(asyncio.Protocol):
    """One TCP connection."""

    def __init__(
        self, responder: Responder, limits: TcpLimits, kind: Transport, screen: Screen | None = None
    ) -> None:
        self.responder = responder
        #: CoreDNS's `acl`, checked before anything else: None, or what the client gets.
        self.screen = screen
        self.limits = limits
        self.kind = kind
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.last_active = 0.0
        #: When the first byte of the message not yet whole came; 0.0 when there is none.
        self.started = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.wake_at = 0.0
        self.source = ""
        self.pending: set[asyncio.Task[None]] = set()
        self.writing_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self.source = self.peer()
        if self.kind.family == 2 and "." in self.source and ":" not in self.source:
            self.kind = TCP4  # an IPv4 client of a socket bound to `::` (`peer`)
        self.last_active = time.monotonic()
        if not self.limits.admit(self, self.source):
            self.transport.abort()
            return
        self.wake(self.last_active + self.limits.idle_timeout)

    @property
    def idle(self) -> bool:
        """No message under way and no answer pending: closing it loses nothing."""
        return not self.buffer and not self.pending

    def close(self) -> None:
        """Close the connection (made room for another): counted out at once."""
        self.limits.release(self, self.source)
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buffer = self.buffer
        buffer += data
        received = len(buffer)
        responder = self.responder
        source = self.source
        while len(buffer) >= 2 and len(self.pending) < MAX_PENDING:
            length = (buffer[0] << 8) | buffer[1]
            if len(buffer) < 2 + length:
                break
            message = bytes(buffer[2 : 2 + length])
            del buffer[: 2 + length]
            if self.screen is not None and (verdict := self.screen(message, source)) is not None:
                if verdict:
                    self.transport.write(len(verdict).to_bytes(2, "big") + verdict)
                continue
            reply = responder.respond(message, self.kind, source, time.perf_counter())
            if reply is None:
                continue
            if not isinstance(reply, bytes):
                # Answered when the upstream is; RFC 7766 lets replies overtake each other.
                self.later(reply)
                continue
            self.transport.write(len(reply).to_bytes(2, "big") + reply)
        if len(buffer) < received:  # whole messages came: the connection is in use
            self.last_active = time.monotonic()
            self.started = 0.0
        if buffer and not self.started:
            self.message_begun()

    def message_begun(self) -> None:
        """The first bytes of a message are in: the rest must follow within the read timeout."""
        buffer = self.buffer
        if len(buffer) >= 2 and len(buffer) >= 2 + ((buffer[0] << 8) | buffer[1]):
            return  # a whole query waits for this server (MAX_PENDING), not for the client
        self.started = time.monotonic()
        deadline = self.started + self.limits.read_timeout
        if deadline < self.wake_at:
            self.wake(deadline)

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

    def wake(self, at: float) -> None:
        """Check the timeouts at monotonic time `at` (instead of when it was due)."""
        if self.timer is not None:
            self.timer.cancel()
        self.wake_at = at
        self.timer = asyncio.get_running_loop().call_later(
            at - time.monotonic(), self.check_timeouts
        )

    def check_timeouts(self) -> None:
        """Close the connection if a message is overdue or it has been idle for too long."""
        assert self.transport is not None
        self.timer = None
        now = time.monotonic()
        limits = self.limits
        if self.started and now - self.started >= limits.read_timeout:
            limits.too_slow.add(
                f"from {self.peer()}: a query took longer than {limits.read_timeout:g}s "
                "to arrive (--tcp-read-timeout)"
            )
            self.transport.abort()
            return
        if now - self.last_active >= limits.idle_timeout:
            self.transport.close()
            return
        deadline = self.last_active + limits.idle_timeout
        if self.started:
            deadline = min(deadline, self.started + limits.read_timeout)
        self.wake(deadline)

    def peer(self) -> str:
        """The client's address, as every address rule and log reads it (IPv4 clients of a
        socket bound to `::` as IPv4 addresses, not IPv4-mapped)."""
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return unmapped(str(peer[0])) if peer else "?"

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.limits.release(self, self.source)
