"""Forward queries for names outside the served zones, as CoreDNS's `forward` and `cache` do.

- Upstreams are tried in random order among the healthy ones. Two failures in a row
  (`MAX_FAILS`) mark an upstream unhealthy; it is then probed with `. IN NS` every half second,
  and any reply makes it healthy again. When every upstream is unhealthy, they are tried anyway.
- A query that came over UDP is forwarded over UDP, and retried over TCP when the reply is
  truncated; a query that came over TCP is forwarded over TCP.
- The reply is relayed unchanged but for the ID. Successful and negative replies are cached for
  their TTL (the SOA's for negative ones, capped), and served from the cache with TTLs counted
  down.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from struct import pack, unpack_from

import dnslib
from cachetools import TLRUCache

from toposdns.metrics import (
    CACHE_ENTRIES,
    CACHE_HITS,
    CACHE_MISSES,
    FORWARD_HEALTHCHECK_BROKEN,
    PROXY_DURATION,
    PROXY_HEALTHCHECK_FAILURES,
)
from toposdns.resolve.answer import RR, name_text
from toposdns.wire.codes import AAAA, CNAME, RCODE_NAMES, A, Name
from toposdns.wire.decode import record_spans

log = logging.getLogger("toposdns")

MAX_FAILS = 2
HEALTH_INTERVAL = 0.5
MAX_SUCCESS_TTL = 3600
MAX_DENIAL_TTL = 1800
NS_PROBE = pack("!6H", 0, 0, 1, 0, 0, 0) + b"\x00" + pack("!HH", 2, 1)  # ". IN NS", no RD


@dataclass
class Upstream:
    """One upstream server and its health."""

    host: str
    port: int = 53
    fails: int = 0
    probing: bool = False

    @property
    def healthy(self) -> bool:
        return self.fails < MAX_FAILS

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass
class _Cached:
    """A reply kept without its OPT record (the upstream's answer to another client)."""

    reply: bytes
    ttl: int
    stored: float
    positive: bool
    ttls: list[tuple[int, int]] = field(default_factory=list)

    def render(self, now: float, opt: bytes) -> bytes:
        """The reply with its TTLs counted down by the time it spent in the cache, and the
        asking client's own OPT record, if it sent one."""
        out = bytearray(self.reply)
        elapsed = int(now - self.stored)
        if elapsed:
            for offset, ttl in self.ttls:
                out[offset : offset + 4] = pack("!I", max(0, ttl - elapsed))
        if opt:
            out[10:12] = pack("!H", unpack_from("!H", out, 10)[0] + 1)
            out += opt
        return bytes(out)


class Forwarder:
    """Sends queries to upstream servers; caches what they answer."""

    def __init__(
        self,
        upstreams: list[Upstream],
        timeout: float = 2.0,
        cache_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstreams = upstreams
        self.timeout = timeout
        self.clock = clock
        #: The `server` label of the cache metrics, as CoreDNS's: `dns://:PORT`.
        self.server = "dns://:53"
        self.cache: TLRUCache[bytes, _Cached] = TLRUCache(
            maxsize=cache_size, ttu=lambda _key, value, now: now + value.ttl, timer=clock
        )
        self._probes: set[asyncio.Task[None]] = set()
        # Counted when scraped, not on every insert.
        CACHE_ENTRIES.labels(self.server, "success").set_function(lambda: self._entries(True))
        CACHE_ENTRIES.labels(self.server, "denial").set_function(lambda: self._entries(False))

    def _entries(self, positive: bool) -> int:
        return sum(1 for entry in list(self.cache.values()) if entry.positive == positive)

    async def forward(self, data: bytes, tcp: bool, limit: int, opt: bytes = b"") -> bytes | None:
        """The upstream's reply to a raw query (ID as the client's), or None if none answered.

        `limit` is the largest reply the client takes: a truncated UDP reply is retried over TCP
        only to be relayed if the whole answer fits. `opt` is the OPT record this client's
        reply carries when it comes from the cache.
        """
        key = _cache_key(data, tcp, limit, bool(opt))
        cached = self.cache.get(key)
        if cached is not None and len(cached.reply) + len(opt) <= limit:
            CACHE_HITS.labels(self.server, "success" if cached.positive else "denial").inc()
            return data[:2] + cached.render(self.clock(), opt)[2:]
        CACHE_MISSES.labels(self.server).inc()
        if all(not u.healthy for u in self.upstreams):
            FORWARD_HEALTHCHECK_BROKEN.inc()
        for upstream in self._order():
            start = time.perf_counter()
            try:
                reply = await self._exchange(upstream, data, tcp, limit)
            except (OSError, TimeoutError, ValueError) as exc:
                PROXY_HEALTHCHECK_FAILURES.labels("forward", str(upstream)).inc()
                self._failed(upstream, exc)
                continue
            upstream.fails = 0
            rcode = RCODE_NAMES.get(reply[3] & 0x0F, str(reply[3] & 0x0F))
            PROXY_DURATION.labels("forward", str(upstream), rcode).observe(
                time.perf_counter() - start
            )
            self._store(key, reply)
            return data[:2] + reply[2:]
        return None

    async def close(self) -> None:
        """Stop health probes."""
        for task in self._probes:
            task.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)

    def _order(self) -> list[Upstream]:
        healthy = [u for u in self.upstreams if u.healthy]
        random.shuffle(healthy)
        if healthy:
            return healthy
        every = list(self.upstreams)
        random.shuffle(every)
        return every

    async def _exchange(self, upstream: Upstream, data: bytes, tcp: bool, limit: int) -> bytes:
        qid = random.getrandbits(16).to_bytes(2, "big")
        query = qid + data[2:]
        if tcp:
            reply = await self._tcp(upstream, query)
        else:
            reply = await self._udp(upstream, query)
            if len(reply) > 3 and reply[2] & 0x02:  # TC: the whole answer needs TCP
                try:
                    whole = await self._tcp(upstream, query)
                except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
                    whole = b""  # relay the truncated reply: the client will retry over TCP
                if whole and len(whole) <= limit:
                    reply = whole
        if reply[:2] != qid:
            raise ValueError("reply ID does not match the query")
        return reply

    async def _udp(self, upstream: Upstream, query: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bytes] = loop.create_future()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _OneReply(waiter, query[:2]), remote_addr=(upstream.host, upstream.port)
        )
        try:
            transport.sendto(query)
            async with asyncio.timeout(self.timeout):
                return await waiter
        finally:
            transport.close()

    async def _tcp(self, upstream: Upstream, query: bytes) -> bytes:
        async with asyncio.timeout(self.timeout):
            reader, writer = await asyncio.open_connection(upstream.host, upstream.port)
            try:
                writer.write(len(query).to_bytes(2, "big") + query)
                length = int.from_bytes(await reader.readexactly(2), "big")
                return await reader.readexactly(length)
            finally:
                writer.close()

    def _failed(self, upstream: Upstream, exc: Exception) -> None:
        upstream.fails += 1
        if upstream.healthy or upstream.probing:
            return
        why = str(exc) or type(exc).__name__
        log.warning("upstream %s is unhealthy (%s); probing it", upstream, why)
        upstream.probing = True
        task = asyncio.create_task(self._probe(upstream))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, upstream: Upstream) -> None:
        """`. IN NS` every HEALTH_INTERVAL until any reply comes back."""
        try:
            while True:
                await asyncio.sleep(HEALTH_INTERVAL)
                try:
                    await self._udp(upstream, NS_PROBE)
                except (OSError, TimeoutError):
                    PROXY_HEALTHCHECK_FAILURES.labels("forward", str(upstream)).inc()
                    continue
                upstream.fails = 0
                log.info("upstream %s is healthy again", upstream)
                return
        finally:
            upstream.probing = False

    def _store(self, key: bytes, reply: bytes) -> None:
        if len(reply) < 12 or reply[2] & 0x02:
            return  # truncated: not a whole answer
        rcode = reply[3] & 0x0F
        if rcode not in (0, 3):
            return
        try:
            reply = _without_opt(reply)
            spans = record_spans(reply)
        except (ValueError, IndexError):
            return
        ttls = [(at, unpack_from("!I", reply, at)[0], section) for _, at, _, _, section in spans]
        positive = rcode == 0 and any(section == 0 for _, _, section in ttls)
        if positive:
            ttl = min(min(t for _, t, section in ttls if section == 0), MAX_SUCCESS_TTL)
        else:
            # Negative answers live as long as the SOA in the authority section says.
            ttl = min(min((t for _, t, section in ttls if section == 1), default=0), MAX_DENIAL_TTL)
        if ttl <= 0:
            return
        offsets = [(at, t) for at, t, _ in ttls]
        self.cache[key] = _Cached(reply, ttl, self.clock(), positive, offsets)


class _OneReply(asyncio.DatagramProtocol):
    """Datagram protocol that waits for the one reply with the right ID."""

    def __init__(self, waiter: asyncio.Future[bytes], qid: bytes) -> None:
        self.waiter = waiter
        self.qid = qid

    def datagram_received(self, data: bytes, addr: object) -> None:
        if data[:2] == self.qid and not self.waiter.done():
            self.waiter.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.waiter.done():
            self.waiter.set_exception(exc)


def _cache_key(data: bytes, tcp: bool, limit: int, edns: bool) -> bytes:
    """What the answer depends on, as CoreDNS's cache keys it: the question (as asked), RD, CD
    and DO; plus the reply size the client takes, since a reply may be truncated for it.
    Client-specific EDNS options (cookies) are left out."""
    end = 12
    while data[end]:
        end += 1 + data[end]
    do = _do_bit(data) if edns else 0
    return bytes((data[2] & 0x01, data[3] & 0x10, do, tcp)) + pack("!H", limit) + data[12 : end + 5]


def _do_bit(data: bytes) -> int:
    """The DO bit of a query's OPT record (0 if none)."""
    for _start, at, _, rtype, _ in record_spans(data):
        if rtype == 41:
            return data[at + 2] >> 7
    return 0


def _without_opt(reply: bytes) -> bytes:
    """The reply without its OPT record, so another client can be given its own."""
    for start, _, end, rtype, _ in record_spans(reply):
        if rtype == 41:
            count = unpack_from("!H", reply, 10)[0] - 1
            return reply[:10] + pack("!H", count) + reply[12:start] + reply[end:]
    return reply


def resolv_conf_upstreams(path: str = "/etc/resolv.conf") -> list[Upstream]:
    """The nameservers of resolv.conf, as `forward . /etc/resolv.conf` uses."""
    upstreams = []
    try:
        with open(path) as lines:
            for line in lines:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "nameserver":
                    upstreams.append(Upstream(fields[1].split("%")[0]))
    except OSError:
        pass
    return upstreams


def build_query(name: Name, qtype: int) -> bytes:
    """A recursive query for a name, as CoreDNS's upstream lookup of a CNAME target sends."""
    record = dnslib.DNSRecord.question(name_text(name), dnslib.QTYPE.get(qtype))
    return bytes(record.pack())


def answer_records(reply: bytes) -> tuple[tuple[RR, ...], bool]:
    """The address and CNAME records of an upstream reply's answer section, and its TC bit."""
    message = dnslib.DNSRecord.parse(reply)
    records = []
    for rr in message.rr:
        name = tuple(label.decode("latin-1") for label in rr.rname.label)
        if rr.rtype in (A, AAAA):
            records.append(RR(name, rr.rtype, rr.ttl, str(rr.rdata)))
        elif rr.rtype == CNAME:
            target = tuple(label.decode("latin-1") for label in rr.rdata.label)
            records.append(RR(name, CNAME, rr.ttl, target))
    return tuple(records), bool(message.header.tc)
