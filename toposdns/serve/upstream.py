"""One upstream server: one exchange with it over UDP, its reply checked, and its health.

- An exchange is one query and one reply within a time limit. What can go wrong is either an
  `UpstreamError` (the upstream's doing: timeout, refused, closed early, short, unparseable,
  wrong ID, a reply to another question) or a `LocalError` (this process ran out of file
  descriptors, buffers or ports), which is never counted against the upstream.
- A reply is accepted only if it is a response to the question asked, as CoreDNS's
  `request.Match` checks. Over UDP, datagrams with another ID, or too short to hold one, are
  skipped as CoreDNS skips them, so a stray or forged packet cannot end the wait.
- Health is kept per transport, since a server may answer over UDP and not over TCP (a DNS over
  TLS upstream has one: TLS). Each failure counts; `max_fails` in a row (CoreDNS's `max_fails`,
  2 by default; 0: never down, never probed) mark that transport down. From the first failure
  on, a probe (`. IN NS` with RD, as CoreDNS's; `health_check`'s `domain` and `no_rec` change
  it) goes over the same transport every `health_check` interval (0.5 s) until a reply to it
  comes: an upstream whose TCP is broken stays down for TCP instead of being declared healthy
  by a UDP probe, and one that answers garbage stays down instead of being declared healthy by
  the garbage. Each change of state is logged once.
- Stream exchanges (TCP, TLS) and the connections they reuse are serve/connections.py's; a
  probe over a stream goes on a connection of its own, given as `stream`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from struct import pack

import dnslib

from toposdns.metrics import PROXY_HEALTHCHECK_FAILURES, UPSTREAM_ERRORS
from toposdns.wire.codes import QR, RD
from toposdns.wire.decode import read_name, record_spans

log = logging.getLogger("toposdns")

HEALTH_TIMEOUT = 1.0  # CoreDNS's health check read timeout
#: Probes go out at most this often, whatever `health_check` says (CoreDNS takes 0: back to back).
MIN_HEALTH_INTERVAL = 0.1
HEADER_SIZE = 12
#: errno values that say this process ran short of something, not that the upstream failed.
LOCAL_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)
#: Kinds of UpstreamError that mean "a reply, but not to this query": FORMERR, as CoreDNS.
MISMATCHES = frozenset({"not_response", "wrong_question"})
HEALTH_QUESTION = b"\x00" + pack("!HH", 2, 1)  # . IN NS


@dataclass(frozen=True, slots=True)
class HealthChecks:
    """How an upstream's health is judged and probed: CoreDNS's `max_fails` and `health_check
    DURATION [no_rec] [domain FQDN]`."""

    #: Failures in a row that mark a transport down; 0: never down, never probed.
    max_fails: int = 2
    #: Seconds between probes while a transport fails.
    interval: float = 0.5
    #: The probe's question (name, type NS, class IN) and whether it asks for recursion.
    question: bytes = HEALTH_QUESTION
    recursion: bool = True


DEFAULT_CHECKS = HealthChecks()

#: A query over a stream (TCP or TLS) on a connection of its own: (query, timeout) -> reply.
Stream = Callable[[bytes, float], Awaitable[bytes]]


class UpstreamError(Exception):
    """One exchange with an upstream failed. `kind` is a short label for the metrics; the
    message says what happened, for the log."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class LocalError(Exception):
    """This process could not send a query: no file descriptors, buffers or ports left."""


def os_error(exc: OSError) -> Exception:
    """An OSError from a socket, as whose fault it is."""
    if exc.errno in LOCAL_ERRNOS:
        return LocalError(exc.strerror or str(exc))
    if isinstance(exc, ssl.SSLCertVerificationError):
        return UpstreamError("tls", f"TLS certificate not accepted: {exc.verify_message}")
    if isinstance(exc, ssl.SSLError):
        return UpstreamError("tls", f"TLS failed: {exc.reason or exc}")
    if isinstance(exc, ConnectionRefusedError):
        return UpstreamError("refused", "connection refused")
    if isinstance(exc, ConnectionResetError):
        return UpstreamError("closed", "connection reset")
    return UpstreamError("network", exc.strerror or str(exc))


@dataclass(eq=False)
class Health:
    """Consecutive failures of one upstream over one transport, and the probe that runs while
    there are any."""

    fails: int = 0
    probe: asyncio.Task[None] | None = None
    #: Failures in a row that make it down; 0: never.
    max_fails: int = 2

    @property
    def down(self) -> bool:
        return 0 < self.max_fails <= self.fails


@dataclass(frozen=True, slots=True)
class Upstream:
    """An upstream server, as the configuration names it."""

    host: str
    port: int = 53
    #: DNS over TLS (`tls://`), and the name its certificate must carry when the upstream
    #: names one (`tls://IP%NAME`).
    tls: bool = False
    server_name: str = ""

    def __str__(self) -> str:
        # CoreDNS's `to` label: the address, without the scheme.
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(eq=False)
class UpstreamHealth:
    """An upstream as a forwarder uses it: its health over UDP and over TCP (or TLS), and the
    probes that run while it fails. (Kept apart from `Upstream`, which the frozen configuration
    holds.)"""

    upstream: Upstream
    checks: HealthChecks = DEFAULT_CHECKS
    #: How a probe goes over a stream (TCP, or TLS for a `tls://` upstream); None: not at all.
    stream: Stream | None = field(default=None, repr=False)
    udp: Health = field(default_factory=Health, repr=False)
    tcp: Health = field(default_factory=Health, repr=False)

    def __post_init__(self) -> None:
        self.udp.max_fails = self.tcp.max_fails = self.checks.max_fails

    def __str__(self) -> str:
        return str(self.upstream)

    def health(self, tcp: bool) -> Health:
        """The health of one transport (a TLS upstream has only one: TLS, kept as TCP's)."""
        return self.tcp if tcp or self.upstream.tls else self.udp

    def failed(self, tcp: bool, error: UpstreamError) -> None:
        """Count a failed exchange, and probe this transport until it works again (with
        `max_fails 0`, never)."""
        tcp = tcp or self.upstream.tls
        UPSTREAM_ERRORS.labels(str(self), _proto(self.upstream, tcp), error.kind).inc()
        log.debug("upstream %s over %s: %s", self, _proto(self.upstream, tcp), error)
        if not self.checks.max_fails:
            return
        self._count_failure(tcp, error)
        health = self.health(tcp)
        if health.probe is None:
            health.probe = asyncio.create_task(self._probe(tcp))

    def succeeded(self, tcp: bool) -> None:
        """A good exchange over this transport: it is healthy."""
        health = self.health(tcp)
        if health.down:
            log.info("upstream %s is healthy again over %s", self, _proto(self.upstream, tcp))
        health.fails = 0

    def stop_probes(self) -> list[asyncio.Task[None]]:
        """Cancel the running probes; returns them, to be awaited."""
        tasks = [h.probe for h in (self.udp, self.tcp) if h.probe is not None]
        for task in tasks:
            task.cancel()
        return tasks

    def _count_failure(self, tcp: bool, error: UpstreamError) -> None:
        health = self.health(tcp)
        health.fails += 1
        if health.fails == self.checks.max_fails:
            log.warning(
                "upstream %s is unhealthy over %s (%s); probing it every %gs",
                self,
                _proto(self.upstream, tcp),
                error,
                self.interval,
            )

    @property
    def interval(self) -> float:
        """Seconds between probes."""
        return max(self.checks.interval, MIN_HEALTH_INTERVAL)

    async def _probe(self, tcp: bool) -> None:
        """`. IN NS` (or `health_check`'s question) over this transport, now and every interval,
        until a reply to it comes (any rcode will do, as for CoreDNS; garbage will not) or a
        query succeeds meanwhile."""
        health = self.health(tcp)
        flags = RD if self.checks.recursion else 0
        try:
            while health.fails:
                query = pack("!6H", secrets.randbits(16), flags, 1, 0, 0, 0) + self.checks.question
                try:
                    if tcp and self.stream is not None:
                        reply = await self.stream(query, HEALTH_TIMEOUT)
                    else:
                        reply = await send_udp(self.upstream, query, HEALTH_TIMEOUT)
                    check_reply(query, reply)
                except LocalError:
                    pass  # not the upstream's doing: ask again later
                except UpstreamError as error:
                    PROXY_HEALTHCHECK_FAILURES.labels("forward", str(self)).inc()
                    self._count_failure(tcp, error)
                else:
                    self.succeeded(tcp)
                    return
                await asyncio.sleep(self.interval)
        finally:
            health.probe = None


def _proto(upstream: Upstream, tcp: bool) -> str:
    """The transport as logs and metrics name it."""
    return "tls" if upstream.tls else "tcp" if tcp else "udp"


async def send_udp(upstream: Upstream, query: bytes, timeout: float) -> bytes:
    """The first datagram from the upstream with the query's ID, within `timeout`."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[bytes] = loop.create_future()
    protocol = _OneReply(waiter, query[:2])
    try:
        transport, _ = await loop.create_datagram_endpoint(
            lambda: protocol, remote_addr=(upstream.host, upstream.port)
        )
    except OSError as exc:
        raise os_error(exc) from None
    try:
        transport.sendto(query)
        async with asyncio.timeout(timeout):
            return await waiter
    except TimeoutError:
        skipped = f"; skipped {protocol.skipped} with another ID" if protocol.skipped else ""
        raise UpstreamError("timeout", f"no reply within {timeout:g}s{skipped}") from None
    except OSError as exc:
        raise os_error(exc) from None
    finally:
        transport.close()


class _OneReply(asyncio.DatagramProtocol):
    """Waits for the one datagram with the right ID; counts the others."""

    def __init__(self, waiter: asyncio.Future[bytes], qid: bytes) -> None:
        self.waiter = waiter
        self.qid = qid
        self.skipped = 0

    def datagram_received(self, data: bytes, addr: object) -> None:
        if self.waiter.done():
            return
        if len(data) >= HEADER_SIZE and data[:2] == self.qid:
            self.waiter.set_result(data)
        else:
            self.skipped += 1

    def error_received(self, exc: Exception) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(exc)


def check_reply(query: bytes, reply: bytes) -> dnslib.DNSRecord:
    """The parsed reply if it is a response to the query's question (name compared without
    regard to case, type and class); UpstreamError if not."""
    if not reply[2] & QR >> 8:
        raise UpstreamError("not_response", "a message that is not a response")
    try:
        message = dnslib.DNSRecord.parse(reply)
        record_spans(reply)  # the same walk the cache does on it
    except Exception as exc:  # dnslib raises several kinds on hostile bytes
        raise UpstreamError("malformed", f"an unparseable reply ({exc})") from None
    name, offset = read_name(query, HEADER_SIZE)
    asked = (tuple(label.lower() for label in name), query[offset : offset + 4])
    questions = message.questions
    if len(questions) == 1:
        q = questions[0]
        got = tuple(label.decode("latin-1").lower() for label in q.qname.label)
        if (got, pack("!HH", q.qtype, q.qclass)) == asked:
            return message
    shown = ", ".join(f"{q.qname} {dnslib.QTYPE.get(q.qtype)}" for q in questions) or "none"
    raise UpstreamError("wrong_question", f"a reply to another question ({shown})")
