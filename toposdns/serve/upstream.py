"""One upstream server: one exchange with it over UDP or TCP, its reply checked, and its health.

- An exchange is one query and one reply within a time limit. What can go wrong is either an
  `UpstreamError` (the upstream's doing: timeout, refused, closed early, short, unparseable,
  wrong ID, a reply to another question) or a `LocalError` (this process ran out of file
  descriptors, buffers or ports), which is never counted against the upstream.
- A reply is accepted only if it is a response to the question asked, as CoreDNS's
  `request.Match` checks. Over UDP, datagrams with another ID, or too short to hold one, are
  skipped as CoreDNS skips them, so a stray or forged packet cannot end the wait.
- Health is kept per transport, since a server may answer over UDP and not over TCP. Each failure
  counts; `MAX_FAILS` in a row mark that transport down. From the first failure on, a probe
  (`. IN NS` with RD, as CoreDNS's) goes over the same transport every `HEALTH_INTERVAL` until a
  reply to it comes: an upstream whose TCP is broken stays down for TCP instead of being
  declared healthy by a UDP probe, and one that answers garbage stays down instead of being
  declared healthy by the garbage. Each change of state is logged once.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import secrets
from dataclasses import dataclass, field
from struct import pack

import dnslib

from toposdns.metrics import PROXY_HEALTHCHECK_FAILURES, UPSTREAM_ERRORS
from toposdns.wire.codes import QR, RD
from toposdns.wire.decode import read_name, record_spans

log = logging.getLogger("toposdns")

MAX_FAILS = 2
HEALTH_INTERVAL = 0.5
HEALTH_TIMEOUT = 1.0  # CoreDNS's health check read timeout
HEADER_SIZE = 12
#: errno values that say this process ran short of something, not that the upstream failed.
LOCAL_ERRNOS = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.EADDRNOTAVAIL}
)
#: Kinds of UpstreamError that mean "a reply, but not to this query": FORMERR, as CoreDNS.
MISMATCHES = frozenset({"not_response", "wrong_question"})
HEALTH_QUESTION = b"\x00" + pack("!HH", 2, 1)  # . IN NS


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

    @property
    def down(self) -> bool:
        return self.fails >= MAX_FAILS


@dataclass(frozen=True, slots=True)
class Upstream:
    """An upstream server, as the configuration names it."""

    host: str
    port: int = 53

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(eq=False)
class UpstreamHealth:
    """An upstream as a forwarder uses it: its health over UDP and over TCP, and the probes that
    run while it fails. (Kept apart from `Upstream`, which the frozen configuration holds.)"""

    upstream: Upstream
    udp: Health = field(default_factory=Health, repr=False)
    tcp: Health = field(default_factory=Health, repr=False)

    def __str__(self) -> str:
        return str(self.upstream)

    def health(self, tcp: bool) -> Health:
        return self.tcp if tcp else self.udp

    def failed(self, tcp: bool, error: UpstreamError) -> None:
        """Count a failed exchange, and probe this transport until it works again."""
        UPSTREAM_ERRORS.labels(str(self), _proto(tcp), error.kind).inc()
        log.debug("upstream %s over %s: %s", self, _proto(tcp), error)
        self._count_failure(tcp, error)
        health = self.health(tcp)
        if health.probe is None:
            health.probe = asyncio.create_task(self._probe(tcp))

    def succeeded(self, tcp: bool) -> None:
        """A good exchange over this transport: it is healthy."""
        health = self.health(tcp)
        if health.down:
            log.info("upstream %s is healthy again over %s", self, _proto(tcp))
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
        if health.fails == MAX_FAILS:
            log.warning(
                "upstream %s is unhealthy over %s (%s); probing it every %gs",
                self,
                _proto(tcp),
                error,
                HEALTH_INTERVAL,
            )

    async def _probe(self, tcp: bool) -> None:
        """`. IN NS` over this transport, now and every HEALTH_INTERVAL, until a reply to it comes
        (any rcode will do, as for CoreDNS; garbage will not) or a query succeeds meanwhile."""
        health = self.health(tcp)
        try:
            while health.fails:
                query = pack("!6H", secrets.randbits(16), RD, 1, 0, 0, 0) + HEALTH_QUESTION
                try:
                    check_reply(
                        query,
                        await (send_tcp if tcp else send_udp)(self.upstream, query, HEALTH_TIMEOUT),
                    )
                except LocalError:
                    pass  # not the upstream's doing: ask again later
                except UpstreamError as error:
                    PROXY_HEALTHCHECK_FAILURES.labels("forward", str(self)).inc()
                    self._count_failure(tcp, error)
                else:
                    self.succeeded(tcp)
                    return
                await asyncio.sleep(HEALTH_INTERVAL)
        finally:
            health.probe = None


def _proto(tcp: bool) -> str:
    return "tcp" if tcp else "udp"


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


async def send_tcp(upstream: Upstream, query: bytes, timeout: float) -> bytes:
    """The framed reply to one query on a connection of its own, within `timeout`."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(upstream.host, upstream.port)
            try:
                writer.write(len(query).to_bytes(2, "big") + query)
                length = int.from_bytes(await reader.readexactly(2), "big")
                reply = await reader.readexactly(length)
            finally:
                writer.close()
    except TimeoutError:
        raise UpstreamError("timeout", f"no reply within {timeout:g}s over TCP") from None
    except asyncio.IncompleteReadError as exc:
        when = "mid-reply" if exc.partial or exc.expected != 2 else "without replying"
        raise UpstreamError("closed", f"closed the connection {when}") from None
    except OSError as exc:
        raise os_error(exc) from None
    if len(reply) < HEADER_SIZE:
        raise UpstreamError("short", f"a reply of {len(reply)} bytes")
    if reply[:2] != query[:2]:
        raise UpstreamError("wrong_id", "a reply with another ID")
    return reply


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
