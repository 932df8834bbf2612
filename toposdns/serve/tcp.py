"""The TCP frontend (RFC 7766): 2-byte length framing, pipelining, timeouts, a fair cap.

Queries on one connection are answered in the order they arrive; each answer is written as soon
as it is ready, so a client may send many queries without waiting.

Three timers bound a connection, as miekg/dns (under CoreDNS) bounds its reads: a new
connection's first whole message must arrive within a second (`FIRST_MESSAGE`, or the read
timeout if shorter); a connection with no message under way is closed once idle for the idle
timeout, counted from its last whole message; once a message's first byte is in, the whole
message must follow within the read timeout. A client trickling bytes therefore holds a slot
for seconds, not indefinitely.

The cap is shared fairly: one source address holds at most a quarter of it (`SHARE`), and less
as more sources hold connections (the cap over one more than their number), so that the sources
holding connections never fill it and the next one finds room. A new connection past either
bound closes the oldest idle connection (one answered, none under way, no answer pending,
nothing unsent) of that source, or of the source holding the most, to make room (RFC 7766
§6.2.3 lets a server close idle connections when it needs to); when none is idle, a connection
of a source holding more than its share (which shrank after it took them) is closed for a
source within its share; only then is the new one refused.

Replies a client does not read are bounded too. Once the transport's buffer is full, the
connection's queries are neither answered nor read until the client takes its replies. What
each connection holds unsent (the transport's buffer and the kernel's send queue, `SIOCOUTQ`) is
measured after each write and counted per source: a source past its share of `UNSENT_MAX`, or
the largest holder when all together are past it, has its connections holding the most reset.
A connection is only closed gracefully when it holds nothing unsent; otherwise it is reset
(SO_LINGER 0), because a closed socket keeps its unsent bytes in the kernel, for as long as the
client does not read them, where no cap counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import socket
import struct
import sys
import termios
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
#: The largest part of the connection cap one source address may hold (a quarter); with more
#: sources holding connections, each may hold the cap over one more than their number.
SHARE = 4
#: A new connection's first whole message must arrive within this many seconds (or the read
#: timeout, if shorter): a client sends its query as soon as it connects.
FIRST_MESSAGE = 1.0
#: Bytes of replies one listener's connections may hold unsent, in its buffers and the kernel's
#: send queues; one source may hold the same share of it as of the connections.
UNSENT_MAX = 16 * 1024 * 1024
#: What a source may hold unsent however many sources there are: two replies of the largest size.
UNSENT_FLOOR = 2 * (2 + 65535)
#: A connection's unsent bytes, measured after each write, are measured again before it is
#: judged idle when the last measure is older than this (the client may have read them since).
REMEASURE = 0.1

#: SO_LINGER on with a zero timeout: close() drops the send queue and sends a reset.
_RESET = struct.pack("ii", 1, 0)
_COUNT = bytes(4)  # the int SIOCOUTQ fills in


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
            "(default {default}s; a new connection's first query, at most 1s)",
            shows="read_timeout",
        ),
        Setting(
            "tcp_max_connections",
            sets("max_connections", integer(1, 1_000_000, "1024")),
            "--tcp-max-connections",
            "N",
            "keep at most this many TCP connections open, at most a quarter of them from one "
            "address and less as more addresses hold some; past that a new one closes the "
            "oldest idle one, or is refused (default {default})",
            shows="max_connections",
        ),
    ),
    directive="toposdns",
)


class TcpLimits:
    """Shared by all connections of one listener: the open ones, in the order they opened, in
    all and by source address, and the bytes of replies they hold unsent."""

    def __init__(
        self,
        max_connections: int,
        idle_timeout: float,
        read_timeout: float = 3.0,
        max_unsent: int = UNSENT_MAX,
    ) -> None:
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self.first_timeout = min(FIRST_MESSAGE, read_timeout, idle_timeout)
        self.max_unsent = max_unsent
        self.connections: dict[TcpProtocol, None] = {}
        self.by_source: dict[str, dict[TcpProtocol, None]] = {}
        #: Bytes unsent as last measured, in all and by source address (sources holding none
        #: are left out).
        self.unsent = 0
        self.unsent_by_source: dict[str, int] = {}
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
        self.preempted = Tally(
            log,
            logging.WARNING,
            "closed a busy TCP connection %s",
            "closed %d more busy TCP connections in the last %gs to make room, the last %s",
        )
        self.overflowed = Tally(
            log,
            logging.WARNING,
            "reset a TCP connection %s",
            "reset %d more TCP connections in the last %gs for their unsent replies, the last %s",
        )

    @property
    def open(self) -> int:
        """Connections open."""
        return len(self.connections)

    def share(self, source: str) -> int:
        """Connections `source` may hold: a quarter of the cap, or the cap over one more than
        the sources holding connections (`source` among them), so that they never fill it."""
        holders = len(self.by_source) + (source not in self.by_source)
        return max(1, self.max_connections // max(SHARE, holders + 1))

    def unsent_share(self) -> int:
        """Bytes one source's connections may hold unsent: its share of `max_unsent`, as of the
        connections, but never less than `UNSENT_FLOOR`."""
        return max(UNSENT_FLOOR, self.max_unsent // max(SHARE, len(self.by_source) + 1))

    def admit(self, connection: TcpProtocol, source: str) -> bool:
        """Count a new connection in, making room if a bound is reached (closing an idle one,
        or a busy one of a source over its share); False (not counted) when none can go."""
        mine = self.by_source.get(source)
        share = self.share(source)
        if mine is not None and len(mine) >= share:
            if not self._evict(mine, f"of {source}: {len(mine)} open from it, its share"):
                self.refused.add(
                    f"from {source}: {len(mine)} already open from it, its share of "
                    f"--tcp-max-connections while {len(self.by_source)} addresses hold some"
                )
                return False
        elif len(self.connections) >= self.max_connections:
            if not self._evict(
                self.connections, f"for {source}: {self.open} open"
            ) and not self._preempt(source, share):
                self.refused.add(f"from {source}: {self.open} already open (--tcp-max-connections)")
                return False
        self.connections[connection] = None
        self.by_source.setdefault(source, {})[connection] = None
        return True

    def release(self, connection: TcpProtocol, source: str) -> None:
        """Count a connection out (closed, or closing), and what it held unsent."""
        if connection in self.connections:
            self.account(connection, 0)
            del self.connections[connection]
            mine = self.by_source[source]
            del mine[connection]
            if not mine:
                del self.by_source[source]

    def account(self, connection: TcpProtocol, unsent: int) -> None:
        """Note that a counted connection now holds `unsent` bytes unsent."""
        change = unsent - connection.held
        if not change or connection not in self.connections:
            return
        connection.held = unsent
        self.unsent += change
        source = connection.source
        left = self.unsent_by_source.get(source, 0) + change
        if left:
            self.unsent_by_source[source] = left
        else:
            del self.unsent_by_source[source]

    def bound_unsent(self, source: str) -> None:
        """After `source` was written to: while it holds more unsent than its share, reset its
        connection holding the most; then, while all hold more than `max_unsent`, that of the
        source holding the most. What a source holds is measured again first (its client may
        have read some since)."""
        held = self.unsent_by_source.get(source, 0)
        if held > UNSENT_FLOOR and held > (allowed := self.unsent_share()):
            self._remeasure(source)
            while self.unsent_by_source.get(source, 0) > allowed:
                self._reset_most(source, f"more than its share of {allowed}")
        measured: set[str] = set()
        while self.unsent > self.max_unsent:
            largest = max(self.unsent_by_source, key=self.unsent_by_source.__getitem__)
            if largest in measured:
                self._reset_most(largest, f"the most while all hold over {self.max_unsent}")
            else:
                measured.add(largest)
                self._remeasure(largest)

    def _remeasure(self, source: str) -> None:
        """Measure again what each connection of `source` holding something holds unsent."""
        for connection in list(self.by_source.get(source, ())):
            if connection.held:
                connection.measure()

    def _reset_most(self, source: str, why: str) -> None:
        """Reset the connection of `source` holding the most unsent."""
        largest = max(self.by_source[source], key=lambda connection: connection.held)
        self.overflowed.add(
            f"of {source}: {self.unsent_by_source[source]} bytes of replies unsent, {why} "
            "(a client that does not read its answers)"
        )
        largest.drop()

    def _evict(self, among: dict[TcpProtocol, None], why: str) -> bool:
        """Close the connection idle the longest among `among`, of the source holding the most
        connections; False if none is idle."""
        now = time.monotonic()
        idle = [connection for connection in among if connection.idle(now)]
        if not idle:
            return False
        by_source = self.by_source
        oldest = max(idle, key=lambda c: (len(by_source[c.source]), -c.last_active))
        self.evicted.add(f"{why} (--tcp-max-connections)")
        oldest.close()
        return True

    def _preempt(self, source: str, share: int) -> bool:
        """Close at once the connection quiet the longest of the source holding the most
        connections, if that is more than `share` (it took them when there were fewer
        sources): the cap is full of busy connections and `source` is within its share. False
        if none is over."""
        if not self.by_source:
            return False
        largest = max(self.by_source.values(), key=len)
        if len(largest) <= share:
            return False
        oldest = min(largest, key=lambda connection: connection.last_active)
        self.preempted.add(
            f"of {oldest.source}: {len(largest)} open from it, more than its share of {share}, "
            f"for {source} (--tcp-max-connections)"
        )
        oldest.drop()
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
        #: The socket's descriptor, for its send queue; -1 when that cannot be read.
        self.fd = -1
        self.opened = 0.0
        self.last_active = 0.0
        #: Whether a whole message has come (until then, the first message's deadline holds).
        self.greeted = False
        #: Whether the client has sent all it will (shut its side): closed once answered.
        self.finished = False
        #: When the first byte of the message not yet whole came; 0.0 when there is none.
        self.started = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.wake_at = 0.0
        self.source = ""
        self.pending: set[asyncio.Task[None]] = set()
        self.writing_paused = False
        #: Bytes unsent as last measured, and when.
        self.held = 0
        self.measured = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self.source = self.peer()
        if self.kind.family == 2 and "." in self.source and ":" not in self.source:
            self.kind = TCP4  # an IPv4 client of a socket bound to `::` (`peer`)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            self.fd = sock.fileno()
        self.opened = self.last_active = time.monotonic()
        if not self.limits.admit(self, self.source):
            self.drop()
            return
        self.wake(self.opened + self.limits.first_timeout)

    def idle(self, now: float) -> bool:
        """A message answered, none under way, no answer pending and nothing unsent: closing
        it loses nothing. (A new connection's first message may not have been read yet, and
        has its own deadline.)"""
        if self.buffer or self.pending or not self.greeted:
            return False
        if self.held and now - self.measured >= REMEASURE:
            self.measure()
        return not self.held

    def measure(self) -> int:
        """Bytes of replies written and not yet taken by the client, in the transport's
        buffer and the kernel's send queue; noted in the limits."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return 0
        unsent = transport.get_write_buffer_size()
        if self.fd >= 0:
            try:
                queued = fcntl.ioctl(self.fd, termios.TIOCOUTQ, _COUNT)  # SIOCOUTQ on Linux
                unsent += int.from_bytes(queued, sys.byteorder)
            except OSError:  # not a platform that tells
                self.fd = -1
        self.measured = time.monotonic()
        self.limits.account(self, unsent)
        return unsent

    def close(self) -> None:
        """Close the connection (made room for another, or idle): counted out at once;
        gracefully if it holds nothing unsent, else as `drop` does."""
        if self.measure():
            self.drop()
            return
        self.limits.release(self, self.source)
        if self.transport is not None:
            self.transport.close()

    def drop(self) -> None:
        """Close the connection at once, counted out; with a reset if it holds replies unsent,
        which drops them: closed gracefully, its socket would keep them in the kernel,
        uncounted, for as long as the client does not read."""
        unsent = self.measure()
        self.limits.release(self, self.source)
        transport = self.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket") if unsent else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        transport.abort()

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        buffer = self.buffer
        buffer += data
        received = len(buffer)
        responder = self.responder
        source = self.source
        wrote = False
        # While the client is not taking its replies, its queries wait (resume_writing).
        while len(buffer) >= 2 and len(self.pending) < MAX_PENDING and not self.writing_paused:
            length = (buffer[0] << 8) | buffer[1]
            if len(buffer) < 2 + length:
                break
            message = bytes(buffer[2 : 2 + length])
            del buffer[: 2 + length]
            if self.screen is not None and (verdict := self.screen(message, source)) is not None:
                if verdict:
                    transport.write(len(verdict).to_bytes(2, "big") + verdict)
                    wrote = True
                continue
            reply = responder.respond(message, self.kind, source, time.perf_counter())
            if reply is None:
                continue
            if not isinstance(reply, bytes):
                # Answered when the upstream is; RFC 7766 lets replies overtake each other.
                self.later(reply)
                continue
            transport.write(len(reply).to_bytes(2, "big") + reply)
            wrote = True
        if len(buffer) < received:  # whole messages came: the connection is in use
            self.last_active = time.monotonic()
            self.started = 0.0
            self.greeted = True
        if wrote:
            self.measure()
            self.limits.bound_unsent(source)
        if buffer and not self.started:
            self.message_begun()

    def message_begun(self) -> None:
        """The first bytes of a message are in: the rest must follow within the read timeout."""
        buffer = self.buffer
        if len(buffer) >= 2 and len(buffer) >= 2 + ((buffer[0] << 8) | buffer[1]):
            return  # a whole query waits for this server or its client, not for its bytes
        self.started = time.monotonic()
        deadline = self.started + self.limits.read_timeout
        if deadline < self.wake_at:
            self.wake(deadline)

    def later(self, answer: Coroutine[Any, Any, bytes | None]) -> None:
        """Write a reply once its upstream lookup is done, if the connection is still open."""

        async def send() -> None:
            reply = await answer
            transport = self.transport
            if reply is not None and transport is not None and not transport.is_closing():
                self.last_active = time.monotonic()
                transport.write(len(reply).to_bytes(2, "big") + reply)
                self.measure()
                self.limits.bound_unsent(self.source)

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

    def eof_received(self) -> bool | None:
        # The client will send no more. Closed now, its socket would be left to flush what is
        # unsent to a client that may never read it; so it stays open, counted, until its
        # answers are taken (checked every REMEASURE) or a timer ends it.
        self.finished = True
        if not self.buffer and not self.pending and not self.measure():
            return None
        now = time.monotonic()
        if now + REMEASURE < self.wake_at:
            self.wake(now + REMEASURE)
        return True

    def pause_writing(self) -> None:
        # The client is not reading its answers: stop reading (and answering) its queries.
        self.writing_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if len(self.pending) < MAX_PENDING:
            transport.resume_reading()
        if self.buffer:
            self.data_received(b"")  # the queries read while the client was not reading

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
        transport = self.transport
        assert transport is not None
        self.timer = None
        if transport.is_closing():
            return
        now = time.monotonic()
        limits = self.limits
        if not self.greeted and now - self.opened >= limits.first_timeout:
            limits.too_slow.add(
                f"from {self.source}: no whole query within {limits.first_timeout:g}s of "
                "connecting (--tcp-read-timeout, at most 1s for the first)"
            )
            self.drop()
            return
        if self.started and now - self.started >= limits.read_timeout:
            limits.too_slow.add(
                f"from {self.source}: a query took longer than {limits.read_timeout:g}s "
                "to arrive (--tcp-read-timeout)"
            )
            self.drop()
            return
        if now - self.last_active >= limits.idle_timeout:
            self.close()  # reset instead when it holds replies unsent
            return
        deadline = self.last_active + limits.idle_timeout
        if self.finished:
            if not self.buffer and not self.pending and not self.measure():
                self.close()  # the client has taken every answer
                return
            deadline = min(deadline, now + REMEASURE)
        if not self.greeted:
            deadline = min(deadline, self.opened + limits.first_timeout)
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
