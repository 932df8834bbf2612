"""Many TCP connections held open against one port, as a hostile pod holds them, for
`bench/hostile.py`: each sends `hello` when it opens, optionally `repeat` every `every`
seconds (a keep-alive client), reads what comes back or never reads at all, and is opened again
when the server closes it, or kept (an unread connection the server gave up on).

One thread polls them all (`select.poll`, with POLLRDHUP so that a connection the server closed
is seen without reading from it). Everything is bounded: `per_source` connections from each
source at once, `max_opened` in all, at most `burst` opened per round of the loop (a round
lasts about 10 ms), 1 s per connect. On `stop` every connection is reset (SO_LINGER 0), so
that neither end keeps its queues.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.harness import HOST

CLOSED = select.POLLHUP | select.POLLERR | select.POLLRDHUP | select.POLLNVAL
RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
ROUND = 0.01  # seconds


@dataclass
class Held:
    """One connection and when it last sent."""

    sock: socket.socket
    source: str
    sent_at: float
    closed: bool = False


class HeldConnections:
    """Hold `per_source` connections from each of `sources` to 127.0.0.1:`port`."""

    def __init__(
        self,
        port: int,
        sources: Sequence[str],
        per_source: int,
        hello: bytes,
        *,
        every: float | None = None,
        repeat: bytes = b"",
        read: bool = True,
        replace: bool = True,
        rcvbuf: int | None = None,
        max_opened: int = 100_000,
        burst: int = 16,
    ) -> None:
        self.port = port
        self.sources = list(sources)
        self.per_source = per_source
        self.hello = hello
        self.every = every
        self.repeat = repeat
        self.read = read
        self.replace = replace
        self.rcvbuf = rcvbuf
        self.max_opened = max_opened
        self.burst = burst
        #: Connections opened, closed by the server, and connects that failed.
        self.opened = 0
        self.closed_by_server = 0
        self.failed = 0
        self._held: dict[int, Held] = {}
        self._poll = select.poll()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HeldConnections:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def open(self) -> int:
        """Connections open on this side that the server has not closed."""
        return sum(1 for held in list(self._held.values()) if not held.closed)

    def wait_opened(self, count: int, timeout: float) -> bool:
        """Wait until `count` connections were opened in all; False after `timeout` s."""
        deadline = time.monotonic() + timeout
        while self.opened < count:
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """Stop the thread, then reset every connection."""
        self._stop.set()
        self._thread.join(10.0)
        for held in list(self._held.values()):
            _reset(held.sock)
        self._held.clear()

    def _run(self) -> None:
        counts = dict.fromkeys(self.sources, 0)
        next_round = 0.0
        while not self._stop.is_set():
            # At most `burst` connects per 10 ms (one per source at least), however fast the
            # server closes them.
            now = time.monotonic()
            budget = max(self.burst, len(self.sources)) if now >= next_round else 0
            if budget:
                next_round = now + ROUND
            # Round-robin, one connect per source in turn, so that no source waits on another.
            wanting = True
            while budget > 0 and wanting and not self._stop.is_set():
                wanting = False
                for source in self.sources:
                    if budget <= 0 or self.opened >= self.max_opened:
                        break
                    if counts[source] < self.per_source:
                        wanting = True
                        budget -= 1
                        if self._connect(source):
                            counts[source] += 1
            self._tick()
            for fd, events in self._poll.poll(ROUND * 1000):
                held = self._held.get(fd)
                if held is None or held.closed:
                    continue
                gone = bool(events & CLOSED)
                if self.read and events & select.POLLIN:
                    gone |= not _drain(held.sock)
                if gone:
                    self.closed_by_server += 1
                    self._poll.unregister(fd)
                    if self.replace:
                        _reset(held.sock)
                        del self._held[fd]
                        counts[held.source] -= 1
                    else:  # kept, unread, as an attacker that never reads keeps it
                        held.closed = True

    def _connect(self, source: str) -> bool:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if self.rcvbuf is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            sock.bind((source, 0))
            sock.settimeout(1.0)
            sock.connect((HOST, self.port))
            sock.setblocking(False)
            if self.hello:
                sock.send(self.hello)
        except OSError:
            self.failed += 1
            _reset(sock)
            return False
        self.opened += 1
        fd = sock.fileno()
        self._held[fd] = Held(sock, source, time.monotonic())
        mask = CLOSED | (select.POLLIN if self.read else 0)
        self._poll.register(fd, mask)
        return True

    def _tick(self) -> None:
        """Send `repeat` on every connection whose turn has come."""
        if self.every is None:
            return
        now = time.monotonic()
        for held in list(self._held.values()):
            if not held.closed and now - held.sent_at >= self.every:
                held.sent_at = now
                with contextlib.suppress(OSError):
                    held.sock.send(self.repeat)


def _drain(sock: socket.socket) -> bool:
    """Read what is there; False if the peer has closed."""
    try:
        for _ in range(16):
            if not sock.recv(65536):
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    return True


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    with contextlib.suppress(OSError):
        sock.close()
