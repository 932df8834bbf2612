"""Forward queries for names outside the served zones, as CoreDNS's `forward` with `cache` does.

- Bounded: at most `max_concurrent` forwarded queries at once (kubeadm's Corefile sets 1000);
  one more gets REFUSED at once, as from CoreDNS's `max_concurrent`. A query has `BUDGET` seconds
  in all, each try at most `timeout`, and at most two passes over the upstreams (CoreDNS's
  defaults: 5 s, 2 s, twice the upstreams).
- One question, one upstream query: a query whose cache key is already on its way upstream waits
  for that answer instead of being sent again. Besides sparing the upstreams a burst of the same
  name, this is what stops a loop through other resolvers from going round (loop.py).
- Upstreams are tried in random order among those healthy over the transport in use
  (upstream.py); when none is, all are (CoreDNS counts this as its health check broken). Every
  failure moves the query on to the next upstream. A reply is relayed, and cached, only if it
  parses and answers the question asked; when the only replies were to other questions the client
  gets FORMERR, as from CoreDNS, and when none came SERVFAIL.
- A query that came over UDP is forwarded over UDP, and retried over TCP when the reply is
  truncated; a query that came over TCP is forwarded over TCP. Upstreams are asked with an EDNS
  buffer of `UPSTREAM_UDP_SIZE` (1232 bytes, DNS Flag Day 2020's size, which needs no IP
  fragments), whatever the client's, so that most answers come back whole over UDP.
- Replies pass through the cache as they pass through CoreDNS's `cache` (forward_cache.py). The
  cache keeps whole answers: a client whose buffer is smaller gets as many whole records as fit
  with TC set, as from the zones, and its retry over TCP is answered from the cache.
- Running out of sockets here (EMFILE and the like) answers SERVFAIL and is logged once; it is
  never counted against an upstream.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from struct import pack, unpack_from

import dnslib

from toposdns.metrics import (
    FORWARD_HEALTHCHECK_BROKEN,
    FORWARD_MAX_CONCURRENT_REJECTS,
    PROXY_DURATION,
)
from toposdns.options import Network, Origin, Plugin, Setting, integer, networks, sets
from toposdns.serve.forward_cache import CacheSettings, Entry, ForwardCache, Refresher
from toposdns.serve.loop import LoopGuard
from toposdns.serve.upstream import (
    HEADER_SIZE,
    MISMATCHES,
    LocalError,
    Upstream,
    UpstreamError,
    UpstreamHealth,
    check_reply,
    send_tcp,
    send_udp,
)
from toposdns.wire.codes import (
    AAAA,
    AD,
    CNAME,
    FORMERR,
    OPT,
    RCODE,
    RCODE_NAMES,
    REFUSED,
    SERVFAIL,
    TC,
    A,
    Name,
)
from toposdns.wire.decode import question_end, record_spans
from toposdns.wire.encode import truncate
from toposdns.wire.records import RR, name_text

__all__ = [
    "FORWARD",
    "ForwardOptions",
    "Forwarder",
    "Upstream",
    "answer_records",
    "build_query",
    "parse_upstreams",
    "resolv_conf_upstreams",
]

log = logging.getLogger("toposdns")

BUDGET = 5.0
PASSES = 2
MAX_CONCURRENT = 1000
UPSTREAM_UDP_SIZE = 1232
#: Sources whose `--forward-allow` verdict is remembered at most.
MAX_ADMITTED = 65536
#: CoreDNS's forward takes at most this many upstreams.
MAX_UPSTREAMS = 15


@dataclass(frozen=True, slots=True)
class ForwardOptions:
    """CoreDNS's `forward . TO... { max_concurrent N }` (`--upstream`, `--max-concurrent`)."""

    #: Where names outside the zones go; empty: they are refused. None: not configured (the
    #: server then takes resolv.conf's nameservers when watching a cluster).
    upstreams: tuple[Upstream, ...] | None = None
    #: Forwarded queries in flight at most; more get REFUSED.
    max_concurrent: int = MAX_CONCURRENT
    #: `--forward-allow`: the sources whose names outside the zones are forwarded; the rest
    #: get REFUSED (empty: every source, as CoreDNS's `forward`). A Corefile says it with `acl`.
    allow: tuple[Network, ...] = ()


def parse_upstreams(words: Sequence[str], origin: Origin) -> tuple[Upstream, ...]:
    """Upstreams: `IP`, `IP:PORT`, `[IPv6]:PORT`, `dns://` before any, or a resolv.conf file
    (a path), whose nameservers are taken, as CoreDNS's `forward . /etc/resolv.conf`."""
    upstreams: list[Upstream] = []
    for word in words:
        if "/" in word.removeprefix("dns://"):
            found = resolv_conf_upstreams(word)
            if not found:
                raise origin.error(f"{word}: no nameserver in it (or it cannot be read)")
            upstreams.extend(found)
            continue
        upstreams.append(_upstream(word.removeprefix("dns://"), origin))
    if len(upstreams) > MAX_UPSTREAMS:
        raise origin.error(f"more than {MAX_UPSTREAMS} upstreams, as CoreDNS allows")
    return tuple(upstreams)


def _upstream(text: str, origin: Origin) -> Upstream:
    host, port = text, "53"
    if text.startswith("["):
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":") or "53"
    elif text.count(":") == 1:
        host, port = text.split(":")
    try:
        ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        number = -1
    if not 0 < number < 65536:
        raise origin.error(f"{text!r}: expected IP[:PORT] or [IPv6]:PORT")
    return Upstream(host, number)


def _flag_upstreams(words: Sequence[str], origin: Origin) -> tuple[Upstream, ...]:
    """`--upstream IP[:PORT],...`, or `none` to refuse names outside the zones."""
    if [word.lower() for word in words] == ["none"]:
        return ()
    return parse_upstreams(words, origin)


def _to(words: Sequence[str], origin: Origin) -> tuple[Upstream, ...]:
    """`forward FROM TO...`: toposdns forwards every name outside its zones, so FROM is `.`."""
    if len(words) < 2:
        raise origin.error("expected `forward . TO...`, e.g. forward . /etc/resolv.conf")
    if words[0] != ".":
        raise origin.error(
            f"forwarding {words[0]} only is not supported: every name outside the zones is "
            "forwarded; write `forward . TO...`"
        )
    return parse_upstreams(words[1:], origin)


FORWARD: Plugin[ForwardOptions] = Plugin(
    "forward",
    ForwardOptions,
    (
        Setting("", sets("upstreams", _to)),
        Setting(
            None,
            sets("upstreams", _flag_upstreams),
            "--upstream",
            "IP[:PORT],...",
            "forward names outside the zones here ('none': refuse them). Default: the "
            "nameservers of /etc/resolv.conf when watching a cluster, none with --snapshot",
        ),
        Setting(
            "max_concurrent",
            sets("max_concurrent", integer(1, 1_000_000, "1000")),
            "--max-concurrent",
            "N",
            "forward at most N queries at once; more get REFUSED, as CoreDNS's forward "
            "max_concurrent (default {default}, as kubeadm's Corefile)",
            shows="max_concurrent",
        ),
        Setting(
            None,
            sets("allow", networks),
            "--forward-allow",
            "CIDR,...",
            "forward names outside the zones only for queries from these networks; others get "
            "REFUSED, so that no one outside the cluster uses it as an open resolver (default: "
            "any source, as CoreDNS's forward)",
        ),
    ),
)

#: What forwarding gives: the reply, or the rcode to answer with.
Outcome = bytes | int


class Forwarder:
    """Sends queries to upstream servers; caches what they answer."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        timeout: float = 2.0,
        max_concurrent: int = MAX_CONCURRENT,
        cache: CacheSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        allow: tuple[Network, ...] = (),
    ) -> None:
        self.upstreams = [UpstreamHealth(upstream) for upstream in upstreams]
        self.allow = allow
        #: `admits` by source address, decided once per source (cleared when it grows large).
        self.admitted: dict[str, bool] = {}
        self.timeout = timeout
        self.max_concurrent = max_concurrent
        self.clock = clock
        self.cache = ForwardCache(cache or CacheSettings(), clock)
        #: prefetch, serve_stale, keepttl: what a cache hit does beyond its reply.
        self.refresher = Refresher(self.cache, self) if self.cache.settings.refreshing else None
        self.loops = LoopGuard()
        #: Forwarded queries in flight, and those on their way upstream by cache key.
        self.outstanding = 0
        self.inflight: dict[bytes, asyncio.Future[Entry | int]] = {}
        self.refusing = False
        #: What this process ran short of (logged once), or "".
        self.short_of = ""

    def admits(self, source: str) -> bool:
        """True if queries from `source` may be forwarded (`--forward-allow`)."""
        if not self.allow:
            return True
        admitted = self.admitted.get(source)
        if admitted is None:
            try:
                address = ipaddress.ip_address(source.partition("%")[0])
                admitted = any(address in network for network in self.allow)
            except ValueError:
                admitted = False
            if len(self.admitted) >= MAX_ADMITTED:
                self.admitted.clear()
            self.admitted[source] = admitted
        return admitted

    async def forward(
        self, data: bytes, tcp: bool, limit: int, opt: bytes = b"", hits: list[int] | None = None
    ) -> Outcome:
        """The reply to a raw query (ID as the client's), or the rcode to answer it with.

        `limit` is the largest reply the client takes: a truncated UDP reply is retried over TCP
        only to be relayed if the whole answer fits. `opt` is the OPT record this client's reply
        carries (the upstream's is dropped, as CoreDNS's cache drops it). A reply from the cache
        counts in `hits` by its kind (serve/query_metrics.py: 1 success, 2 denial).
        """
        end = question_end(data)
        if self.loops.came_back(data[:2], data[HEADER_SIZE:end]):
            return SERVFAIL
        key = cache_key(data, end, bool(opt))
        ad = bool(key[2] or data[3] & AD)  # the client asked for DNSSEC or for AD
        cached = self.cache.get(key)
        if cached is not None:
            if hits is not None:
                hits[1 if cached.kind == "success" else 2] += 1
            now, hit = self.clock(), True
            if self.refresher is not None:
                cached, now, hit = await self.refresher.serve(cached, key, data, end, tcp, now)
            return truncate(
                cached.render(data[:2], now, opt, ad, hit, data[HEADER_SIZE:end]), limit
            )
        if self.outstanding >= self.max_concurrent:
            FORWARD_MAX_CONCURRENT_REJECTS.inc()
            if not self.refusing:
                self.refusing = True
                log.warning(
                    "forwarding: %d queries in flight (--max-concurrent); refusing more",
                    self.outstanding,
                )
            return REFUSED
        self.outstanding += 1
        try:
            outcome = await self._once(key, data, end, tcp)
        finally:
            self.outstanding -= 1
            if self.refusing and self.outstanding <= self.max_concurrent // 2:
                self.refusing = False
                log.info("forwarding: %d queries in flight; accepting again", self.outstanding)
        if isinstance(outcome, int):
            return outcome
        return truncate(
            outcome.render(data[:2], self.clock(), opt, ad, False, data[HEADER_SIZE:end]), limit
        )

    async def refetch(
        self, key: bytes, data: bytes, end: int, tcp: bool, background: bool
    ) -> Entry | int | None:
        """The upstreams' answer to refresh a cached reply (forward_cache.py `Refresher`),
        counted in the queries in flight as a client's; None when `max_concurrent` are, or
        half of it for a refresh in the `background`, so that clients keep the rest."""
        limit = max(1, self.max_concurrent // 2) if background else self.max_concurrent
        if self.outstanding >= limit:
            return None
        self.outstanding += 1
        try:
            return await self._once(key, data, end, tcp)
        finally:
            self.outstanding -= 1

    async def close(self) -> None:
        """Stop health probes and cache refreshes."""
        if self.refresher is not None:
            await self.refresher.close()
        tasks = [task for upstream in self.upstreams for task in upstream.stop_probes()]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _once(self, key: bytes, data: bytes, end: int, tcp: bool) -> Entry | int:
        """Ask the upstreams, unless the same question is on its way already over the same
        transport (a TCP client must not get what UDP left truncated): then its answer."""
        flight = key + (b"t" if tcp else b"u")
        pending = self.inflight.get(flight)
        if pending is not None:
            return await asyncio.shield(pending)
        pending = self.inflight[flight] = asyncio.get_running_loop().create_future()
        outcome: Entry | int = SERVFAIL
        try:
            outcome = await self._resolve(key, upstream_query(data, end), end, tcp)
        finally:
            del self.inflight[flight]
            pending.set_result(outcome)
        return outcome

    async def _resolve(self, key: bytes, data: bytes, end: int, tcp: bool) -> Entry | int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BUDGET
        failure = SERVFAIL
        for _ in range(PASSES):
            for upstream in self.order(tcp):
                if loop.time() >= deadline:
                    return failure
                started = time.perf_counter()
                try:
                    reply, message = await self._exchange(upstream, data, end, tcp, deadline)
                except LocalError as error:
                    if not self.short_of:
                        self.short_of = str(error)
                        log.warning(
                            "cannot forward: %s here (not the upstreams' fault); answering "
                            "SERVFAIL until it clears",
                            error,
                        )
                    return SERVFAIL
                except UpstreamError as error:
                    upstream.failed(tcp, error)
                    if error.kind in MISMATCHES:
                        failure = FORMERR
                    continue
                if self.short_of:
                    self.short_of = ""
                    log.info("forwarding works again")
                upstream.succeeded(tcp)
                rcode = RCODE_NAMES.get(reply[3] & RCODE, str(reply[3] & RCODE))
                seconds = time.perf_counter() - started
                PROXY_DURATION.labels("forward", str(upstream), rcode).observe(seconds)
                return self.cache.store(key, reply, message)
        return failure

    def order(self, tcp: bool) -> list[UpstreamHealth]:
        """The upstreams healthy over this transport, shuffled; all of them if none is."""
        healthy = [u for u in self.upstreams if not u.health(tcp).down]
        if not healthy:
            FORWARD_HEALTHCHECK_BROKEN.inc()
            healthy = list(self.upstreams)
        random.shuffle(healthy)
        return healthy

    async def _exchange(
        self,
        upstream: UpstreamHealth,
        data: bytes,
        end: int,
        tcp: bool,
        deadline: float,
    ) -> tuple[bytes, dnslib.DNSRecord]:
        """One try with one upstream: the checked reply and its parse."""
        loop = asyncio.get_running_loop()
        question = data[HEADER_SIZE:end]
        qid = self.loops.sending(upstream.upstream, question)
        query = qid + data[2:]
        try:
            timeout = min(self.timeout, deadline - loop.time())
            reply = await (send_tcp if tcp else send_udp)(upstream.upstream, query, timeout)
            message = check_reply(query, reply)
            if tcp or not reply[2] & TC >> 8:
                return reply, message
            # Truncated: the whole answer needs TCP, and is cached whole. If that fails, or
            # there is no time left, the truncated reply is relayed (never cached) and the
            # client retries over TCP itself.
            timeout = min(self.timeout, deadline - loop.time())
            if timeout <= 0:
                return reply, message
            try:
                whole = await send_tcp(upstream.upstream, query, timeout)
                whole_message = check_reply(query, whole)
            except LocalError:
                return reply, message
            except UpstreamError as error:
                upstream.failed(True, error)
                return reply, message
            upstream.succeeded(True)
            return whole, whole_message
        finally:
            self.loops.answered(qid, question)


def cache_key(data: bytes, end: int, edns: bool) -> bytes:
    """What the answer depends on, as CoreDNS's cache keys it: the question with its name in
    lower case (so that random letter case, as 0x20-randomizing resolvers send, cannot multiply
    the entries or pass the cache by), RD, CD and DO. Not the transport nor the client's buffer
    size: the cache keeps whole answers, cut per client. Client-specific EDNS options (cookies)
    are left out."""
    do = _do_bit(data) if edns else 0
    return bytes((data[2] & 0x01, data[3] & 0x10, do)) + data[HEADER_SIZE:end].lower()


def _do_bit(data: bytes) -> int:
    """The DO bit of a query's OPT record (0 if none)."""
    for _start, at, _, rtype, _ in record_spans(data):
        if rtype == OPT:
            return data[at + 2] >> 7
    return 0


def upstream_query(data: bytes, end: int) -> bytes:
    """The query as it goes upstream: its OPT record's buffer size set to UPSTREAM_UDP_SIZE, or
    an OPT record with that size (and no DO bit) added when it has none."""
    for _start, at, _, rtype, section in record_spans(data):
        if rtype == OPT and section == 2:
            return data[: at - 2] + pack("!H", UPSTREAM_UDP_SIZE) + data[at:]
    arcount = unpack_from("!H", data, 10)[0] + 1
    opt = b"\x00" + pack("!HHIH", OPT, UPSTREAM_UDP_SIZE, 0, 0)
    return data[:10] + pack("!H", arcount) + data[12:] + opt


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
            target = tuple(label.decode("latin-1") for label in rr.rdata.label.label)
            records.append(RR(name, CNAME, rr.ttl, target))
    return tuple(records), bool(message.header.tc)
