"""Victims for `bench/hostile.py`: clients that keep asking while an attack runs, each from its
own loopback address, and what they got (answered of asked, p99 latency).

- `UdpVictim`: a query every `interval` seconds over UDP, whatever the server does (a fixed
  schedule, not a closed loop: a server that stalls loses queries instead of slowing the
  victim down), each lost after `timeout`;
- `TcpVictim`: `count` queries, each on a new connection (as a resolver falling back to TCP
  does), started every `interval` seconds, each within `timeout` from connect to reply.

Both run in a thread and stop by themselves; every socket call has a time limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import select
import socket
import threading
import time
from dataclasses import dataclass, field

import dns.message

from bench.harness import HOST, percentile


@dataclass
class VictimStats:
    """What one victim got: `latencies_ms` of the answered ones."""

    label: str
    asked: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    timeout_s: float = 1.0

    @property
    def answered(self) -> int:
        return len(self.latencies_ms)

    @property
    def p99_ms(self) -> float:
        """The 99th percentile over every query asked, a lost one counting as infinitely slow."""
        if not self.asked:
            return math.nan
        values = sorted(self.latencies_ms) + [math.inf] * (self.asked - self.answered)
        return percentile(values, 99)

    def answers_text(self) -> str:
        return f"{self.label} {self.answered}/{self.asked}"

    def p99_text(self) -> str:
        p99 = self.p99_ms
        if math.isnan(p99):
            return f"{self.label} -"
        if math.isinf(p99):
            return f"{self.label} >{self.timeout_s * 1000:.0f}"
        return f"{self.label} {p99:.1f}"

    def summary(self) -> dict[str, object]:
        p99 = self.p99_ms
        return {
            "victim": self.label,
            "asked": self.asked,
            "answered": self.answered,
            "p99_ms": None if math.isnan(p99) or math.isinf(p99) else round(p99, 2),
        }


def query_wire(name: str, rtype: str = "A") -> bytes:
    """A query without EDNS, as glibc's and musl's stub resolvers send."""
    return bytes(dns.message.make_query(name, rtype, use_edns=False).to_wire())


class UdpVictim:
    """Asks `name` over UDP from `source` every `interval` seconds until stopped."""

    def __init__(
        self,
        port: int,
        source: str,
        name: str,
        interval: float = 0.05,
        timeout: float = 1.0,
        label: str = "udp",
    ) -> None:
        self.port = port
        self.source = source
        self.wire = query_wire(name)
        self.interval = interval
        self.stats = VictimStats(label, timeout_s=timeout)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UdpVictim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> VictimStats:
        self._stop.set()
        self._thread.join(self.stats.timeout_s + 5.0)
        return self.stats

    def _run(self) -> None:
        timeout = self.stats.timeout_s
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((self.source, 0))
            sock.setblocking(False)
            poll = select.poll()  # not select(): the floods may have taken every fd below 1024
            poll.register(sock, select.POLLIN)
            waiting: dict[int, float] = {}  # query ID -> when sent
            next_send = time.monotonic()
            while True:
                now = time.monotonic()
                stopping = self._stop.is_set()
                if not stopping and now >= next_send:
                    qid = random.randrange(1 << 16)
                    while qid in waiting:
                        qid = random.randrange(1 << 16)
                    with contextlib.suppress(OSError):
                        sock.sendto(qid.to_bytes(2, "big") + self.wire[2:], (HOST, self.port))
                    waiting[qid] = now
                    self.stats.asked += 1
                    next_send = max(next_send + self.interval, now)
                for qid, sent in list(waiting.items()):
                    if now - sent > timeout:
                        del waiting[qid]  # lost
                if stopping and not waiting:
                    return
                wait = min(next_send - now, 0.05) if not stopping else 0.05
                if not poll.poll(max(wait, 0.0) * 1000):
                    continue
                got = time.monotonic()
                with contextlib.suppress(BlockingIOError, ConnectionRefusedError):
                    for _ in range(64):
                        reply = sock.recv(65535)
                        sent_at = waiting.pop(int.from_bytes(reply[:2], "big"), None)
                        if sent_at is not None:
                            self.stats.latencies_ms.append((got - sent_at) * 1000)


class TcpVictim:
    """`count` queries for `name` over TCP from `source`, each on a new connection, one started
    every `interval` seconds (they may overlap), in a thread of their own."""

    def __init__(
        self,
        port: int,
        source: str,
        name: str,
        count: int = 20,
        interval: float = 0.25,
        timeout: float = 2.0,
        label: str = "tcp",
    ) -> None:
        self.port = port
        self.source = source
        self.wire = query_wire(name)
        self.count = count
        self.interval = interval
        self.stats = VictimStats(label, timeout_s=timeout)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> TcpVictim:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wait()

    def wait(self) -> VictimStats:
        """The stats once every query is answered or timed out."""
        self._thread.join(self.count * self.interval + self.stats.timeout_s + 5.0)
        return self.stats

    async def _run(self) -> None:
        tasks = []
        for i in range(self.count):
            tasks.append(asyncio.create_task(self._ask(i)))
            self.stats.asked += 1
            await asyncio.sleep(self.interval)
        await asyncio.gather(*tasks)

    async def _ask(self, i: int) -> None:
        wire = (i % 65536).to_bytes(2, "big") + self.wire[2:]
        started = time.monotonic()
        writer = None
        try:
            async with asyncio.timeout(self.stats.timeout_s):
                reader, writer = await asyncio.open_connection(
                    HOST, self.port, local_addr=(self.source, 0)
                )
                writer.write(len(wire).to_bytes(2, "big") + wire)
                await writer.drain()
                size = int.from_bytes(await reader.readexactly(2), "big")
                reply = await reader.readexactly(size)
            if reply[:2] == wire[:2]:
                self.stats.latencies_ms.append((time.monotonic() - started) * 1000)
        except (TimeoutError, OSError, asyncio.IncompleteReadError):
            pass  # lost
        finally:
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), 1.0)
