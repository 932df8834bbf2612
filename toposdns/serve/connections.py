"""Stream connections to one upstream, TCP or DNS over TLS, kept open and reused as CoreDNS's
`forward` keeps them (plugin/pkg/proxy/persistent.go, connect.go).

- One query at a time on a connection, as CoreDNS (no pipelining). An exchange takes the idle
  connection that has waited longest, or opens one; after a good reply the connection waits
  for the next exchange, after anything else it is closed.
- Bounded: at most `MAX_IDLE` connections wait per upstream (more are closed), and each is
  closed once it has waited `expire` seconds (CoreDNS's `expire`, 10 s by default; 0: none is
  kept). What is open besides is one connection per exchange in flight, which the forwarder's
  `max_concurrent` bounds.
- A reused connection that the upstream has closed meanwhile (end of file or a reset before
  any byte of the reply) is no failure of the upstream's: the query goes out again on another,
  as CoreDNS retries on `ErrCachedClosed`. Every other failure is an `UpstreamError`, as over
  UDP.
- TLS is Python's `ssl`, at least TLS 1.2 as CoreDNS sets: the certificate is verified against
  the system's CAs or the `tls` CA file, for the name `tls_servername` gives (else the
  upstream's own `tls://IP%NAME`, else its address, as Go's TLS client checks an address).
- `coredns_proxy_conn_cache_hits_total` and `..._misses_total` count reuses and new connections,
  by `proto` (`tcp`, `tcp-tls`), as CoreDNS's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from toposdns.metrics import PROXY_CONN_CACHE_HITS, PROXY_CONN_CACHE_MISSES
from toposdns.serve.upstream import HEADER_SIZE, Upstream, UpstreamError, os_error

#: Idle connections kept per upstream, at most.
MAX_IDLE = 16
#: CoreDNS's `expire` default: seconds an idle connection is kept.
EXPIRE = 10.0
#: Seconds a closing forwarder waits for its TLS connections' close_notify exchange.
CLOSE_WAIT = 1.0


def tls_context(files: Sequence[str]) -> ssl.SSLContext:
    """The TLS client settings of CoreDNS's `tls [CERT KEY] [CA]`: no files, the system's CAs;
    `CA`; `CERT KEY` (a client certificate) with the system's CAs; `CERT KEY CA`. OSError or
    ssl.SSLError when a file cannot be read or used."""
    cafile = files[0] if len(files) == 1 else files[2] if len(files) == 3 else None
    context = ssl.create_default_context(cafile=cafile)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if len(files) >= 2:
        context.load_cert_chain(files[0], files[1])
    return context


class _CachedClosed(Exception):
    """A connection closed before any byte of the reply (retried when it was a reused one)."""


@dataclass(slots=True)
class _Idle:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    #: When it began to wait (the connections' clock).
    since: float


class Connections:
    """The stream connections to one upstream: TCP, or TLS with `context`."""

    def __init__(
        self,
        upstream: Upstream,
        expire: float = EXPIRE,
        context: ssl.SSLContext | None = None,
        server_name: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self.expire = expire
        self.context = context
        #: The name the certificate must carry (TLS only).
        self.server_name = server_name or upstream.host
        self.clock = clock
        self.proto = "tcp-tls" if context is not None else "tcp"
        self.idle: deque[_Idle] = deque()
        self.sweep: asyncio.TimerHandle | None = None
        self.closed = False

    async def exchange(self, query: bytes, timeout: float, reuse: bool = True) -> bytes:
        """The framed reply to one query within `timeout`: on an idle connection if one is
        open (and `reuse`), else on a new one. UpstreamError or LocalError when it fails."""
        to = str(self.upstream)
        try:
            async with asyncio.timeout(timeout):
                while reuse and (idle := self._take()) is not None:
                    PROXY_CONN_CACHE_HITS.labels("forward", to, self.proto).inc()
                    try:
                        reply = await self._ask(idle.reader, idle.writer, query)
                    except _CachedClosed:
                        continue  # closed by the upstream while it waited: another
                    self._keep(idle.reader, idle.writer, reuse)
                    return reply
                PROXY_CONN_CACHE_MISSES.labels("forward", to, self.proto).inc()
                reader, writer = await self._open()
                try:
                    reply = await self._ask(reader, writer, query)
                except _CachedClosed:
                    message = "closed the connection without replying"
                    raise UpstreamError("closed", message) from None
                self._keep(reader, writer, reuse)
                return reply
        except TimeoutError:
            over = "TLS" if self.context is not None else "TCP"
            raise UpstreamError("timeout", f"no reply within {timeout:g}s over {over}") from None
        except asyncio.IncompleteReadError:
            raise UpstreamError("closed", "closed the connection mid-reply") from None
        except OSError as exc:
            raise os_error(exc) from None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.context is None:
            return await asyncio.open_connection(self.upstream.host, self.upstream.port)
        return await asyncio.open_connection(
            self.upstream.host,
            self.upstream.port,
            ssl=self.context,
            server_hostname=self.server_name,
        )

    async def _ask(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, query: bytes
    ) -> bytes:
        """One exchange on a connection, which is closed unless it succeeds."""
        try:
            writer.write(len(query).to_bytes(2, "big") + query)
            await writer.drain()
            try:
                length = int.from_bytes(await reader.readexactly(2), "big")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    raise
                raise _CachedClosed from None
            reply = await reader.readexactly(length)
        except (ConnectionResetError, BrokenPipeError):
            _close(writer)
            raise _CachedClosed from None
        except BaseException:
            _close(writer)
            raise
        if len(reply) < HEADER_SIZE:
            _close(writer)
            raise UpstreamError("short", f"a reply of {len(reply)} bytes")
        if reply[:2] != query[:2]:
            _close(writer)
            raise UpstreamError("wrong_id", "a reply with another ID")
        return reply

    def _take(self) -> _Idle | None:
        """The connection that has waited longest and may still be used, or None."""
        now = self.clock()
        while self.idle:
            idle = self.idle.popleft()
            if now - idle.since < self.expire and not _gone(idle):
                return idle
            _close(idle.writer)
        return None

    def _keep(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reuse: bool
    ) -> None:
        """Let a connection wait for the next exchange, or close it."""
        if not reuse or self.closed or self.expire <= 0 or len(self.idle) >= MAX_IDLE:
            _close(writer)
            return
        self.idle.append(_Idle(reader, writer, self.clock()))
        if self.sweep is None:
            self.sweep = asyncio.get_running_loop().call_later(self.expire, self._swept)

    def _swept(self) -> None:
        """Close the connections that waited `expire`; come back for the others."""
        self.sweep = None
        now = self.clock()
        while self.idle and (now - self.idle[0].since >= self.expire or _gone(self.idle[0])):
            _close(self.idle.popleft().writer)
        if self.idle:
            wait = max(self.idle[0].since + self.expire - now, 0.01)
            self.sweep = asyncio.get_running_loop().call_later(wait, self._swept)

    async def close(self) -> None:
        """Close every idle connection (TLS ones with their close_notify, for at most
        `CLOSE_WAIT` seconds); those in use close when their exchange ends."""
        self.closed = True
        if self.sweep is not None:
            self.sweep.cancel()
            self.sweep = None
        writers = [idle.writer for idle in self.idle]
        self.idle.clear()
        for writer in writers:
            _close(writer)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CLOSE_WAIT):
                await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)
        for writer in writers:
            writer.transport.abort()  # a peer that never answered the close_notify


def _gone(idle: _Idle) -> bool:
    """True when the upstream has closed a waiting connection already."""
    return idle.reader.at_eof() or idle.writer.is_closing()


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
