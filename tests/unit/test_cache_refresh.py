"""The forward cache's prefetch, serve_stale and keepttl, through the forwarder, on a fake clock:
CoreDNS's tables for them (plugin/cache/prefetch_test.go TestPrefetch, TestPrefetchDedup;
cache_test.go TestServeFromStaleCache, TestServeFromStaleCacheResponseTTL,
TestServeFromStaleCacheFetchVerify, TestServeFromStaleCacheFetchVerifyTimeout(FastUpstream),
TestCacheKeepTTL; serve_stale_recheck_test.go TestServeStaleFailureRecheckImmediate and
...Verify) as data, then what toposdns bounds: refreshes in flight, the bytes stale entries
take, and their counts in the metrics. The upstream is an asyncio UDP server in the test's own
loop playing CoreDNS's test backends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from struct import pack
from typing import Any

import dnslib
import pytest

from toposdns.config import Reading
from toposdns.corefile import read_corefile
from toposdns.serve.forward import Forwarder
from toposdns.serve.forward_cache import CachePolicy, CacheSettings, Prefetch, ServeStale
from toposdns.serve.query_metrics import QueryMetrics
from toposdns.serve.upstream import Upstream
from toposdns.wire.codes import REFUSED, SERVFAIL

HOUR = 3600.0
SOA = "example.org. {ttl} IN SOA sns.dns.icann.org. noc.dns.icann.org. 2016082540 7200 3600 1209600"
SOA += " 3600"


class Clock:
    """The cache's clock, moved by the test."""

    def __init__(self) -> None:
        self.start = self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = self.start + seconds


class Backend(asyncio.DatagramProtocol):
    """CoreDNS's test backends: `answer` an A record of `ttl` with 127.0.0.N for its Nth
    answer (prefetchHandler, ttlBackend), `servfail` and `nxdomain` with an SOA of `ttl`
    (servFailBackend, nxDomainBackend), `silent`; each after `delay` seconds. Health probes
    (`. NS`) are answered, and not counted in `asked`."""

    def __init__(self) -> None:
        self.mode = "answer"
        self.ttl = 60
        self.delay = 0.0
        self.asked = 0
        self.answered = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        query = dnslib.DNSRecord.parse(data)
        reply = query.reply(ra=1, aa=0)
        if query.q.qtype != dnslib.QTYPE.NS:
            self.asked += 1
            if self.mode == "silent":
                return
            if self.mode == "answer":
                self.answered += 1
                n = self.answered  # 127.0.0.N for the first 255
                address = f"127.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"
                line = f"{query.q.qname} {self.ttl} IN A {address}"
                reply.add_answer(*dnslib.RR.fromZone(line))
            else:
                reply.header.rcode = SERVFAIL if self.mode == "servfail" else 3
                reply.add_auth(*dnslib.RR.fromZone(SOA.format(ttl=self.ttl)))
        loop = asyncio.get_running_loop()
        loop.call_later(self.delay, self.transport.sendto, bytes(reply.pack()), addr)


Test = Callable[[Forwarder, Backend, Clock], Awaitable[None]]


def run(test: Test, settings: CacheSettings, **options: Any) -> None:
    """`test` with a forwarder caching by `settings` on a fake clock, to a `Backend`."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        transport, backend = await loop.create_datagram_endpoint(
            Backend, local_addr=("127.0.0.1", 0)
        )
        clock = Clock()
        port = transport.get_extra_info("sockname")[1]
        options.setdefault("timeout", 0.2)
        forwarder = Forwarder([Upstream("127.0.0.1", port)], cache=settings, clock=clock, **options)
        try:
            await test(forwarder, backend, clock)
        finally:
            await forwarder.close()
            transport.close()

    asyncio.run(main())


async def ask(
    forwarder: Forwarder, name: str = "cached.org.", do: bool = False, cd: bool = False
) -> dnslib.DNSRecord | int:
    """A query with EDNS (as CoreDNS's tests send), forwarded: the reply parsed, or an rcode."""
    record = dnslib.DNSRecord.question(name, "A")
    record.header.cd = int(cd)
    record.add_ar(dnslib.EDNS0(udp_len=512, flags="do" if do else ""))
    opt = b"\x00" + pack("!HHIH", 41, 512, 0x8000 if do else 0, 0)
    reply = await forwarder.forward(bytes(record.pack()), False, 4096, opt)
    return reply if isinstance(reply, int) else dnslib.DNSRecord.parse(reply)


async def settled(forwarder: Forwarder) -> None:
    """Wait for the refreshes under way (bounded: each is one forwarded query)."""
    assert forwarder.refresher is not None
    for _ in range(10):
        tasks = list(forwarder.refresher.tasks)
        if not tasks:
            return
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    raise AssertionError("refreshes kept starting")


def first(reply: dnslib.DNSRecord | int) -> tuple[int, int, str]:
    """The rcode, and the TTL and data of the first record (answer, else authority)."""
    assert not isinstance(reply, int), f"no reply: rcode {reply}"
    rr = (reply.rr or reply.auth)[0]
    return reply.header.rcode, rr.ttl, str(rr.rdata) if rr.rtype == 1 else ""


def zone_record(line: str) -> tuple[int, str]:
    """The TTL and address of a record as CoreDNS's tables write it."""
    rr = dnslib.RR.fromZone(line)[0]
    return rr.ttl, str(rr.rdata)


# ----- prefetch_test.go TestPrefetch: (qname, TTL, AMOUNT, steps), each step (seconds after
# the first query, the answer CoreDNS expects, whether the upstream is asked then (for the
# client, or in the background), DO, CD).
Step = tuple[int, str, bool, bool, bool]
PREFETCH: list[tuple[str, int, int, list[Step]]] = [
    (
        "hits.reset.example.org.",
        80,
        1,
        [
            (0, "hits.reset.example.org. 80 IN A 127.0.0.1", True, False, False),
            # 10% of 80 s is 8 s: a hit with 7 s left prefetches
            (73, "hits.reset.example.org. 7 IN A 127.0.0.1", True, False, False),
            (80, "hits.reset.example.org. 73 IN A 127.0.0.2", False, False, False),
        ],
    ),
    (
        "short.ttl.example.org.",
        5,
        1,
        [
            (0, "short.ttl.example.org. 5 IN A 127.0.0.1", True, False, False),
            (1, "short.ttl.example.org. 4 IN A 127.0.0.1", False, False, False),
            (4, "short.ttl.example.org. 1 IN A 127.0.0.1", True, False, False),
            (5, "short.ttl.example.org. 4 IN A 127.0.0.2", False, False, False),
        ],
    ),
    (
        "no.prefetch.example.org.",
        30,
        0,
        [
            (0, "no.prefetch.example.org. 30 IN A 127.0.0.1", True, False, False),
            (15, "no.prefetch.example.org. 15 IN A 127.0.0.1", False, False, False),
            (29, "no.prefetch.example.org. 1 IN A 127.0.0.1", False, False, False),
            (30, "no.prefetch.example.org. 30 IN A 127.0.0.2", True, False, False),
        ],
    ),
    (
        "do.prefetch.example.org.",
        80,
        1,
        [
            (0, "do.prefetch.example.org. 80 IN A 127.0.0.1", True, True, False),
            (73, "do.prefetch.example.org. 7 IN A 127.0.0.1", True, True, False),
            (80, "do.prefetch.example.org. 73 IN A 127.0.0.2", False, True, False),
            # without DO another entry: 127.0.0.2 was the prefetch with DO
            (80, "do.prefetch.example.org. 80 IN A 127.0.0.3", True, False, False),
        ],
    ),
    (
        "cd.prefetch.example.org.",
        80,
        1,
        [
            (0, "cd.prefetch.example.org. 80 IN A 127.0.0.1", True, False, True),
            (73, "cd.prefetch.example.org. 7 IN A 127.0.0.1", True, False, True),
            (80, "cd.prefetch.example.org. 73 IN A 127.0.0.2", False, False, True),
            (80, "cd.prefetch.example.org. 80 IN A 127.0.0.3", True, False, False),
        ],
    ),
]


@pytest.mark.parametrize(
    ("qname", "ttl", "amount", "steps"), PREFETCH, ids=[case[0] for case in PREFETCH]
)
def test_prefetch(qname: str, ttl: int, amount: int, steps: list[Step]) -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = ttl
        for after, answer, fetch, do, cd in steps:
            clock.at(after)
            asked = backend.asked
            reply = await ask(forwarder, qname, do, cd)
            if forwarder.refresher is not None:
                await settled(forwarder)
            assert first(reply)[1:] == zone_record(answer), (after, answer)
            assert backend.asked - asked == fetch, (after, answer)

    run(test, CacheSettings(prefetch=Prefetch(amount)))


def test_a_rarely_asked_name_is_not_prefetched() -> None:
    # `prefetch 3`: three hits with no gap of a minute; a gap starts the count again.
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = 80
        assert first(await ask(forwarder))[1:] == (80, "127.0.0.1")
        for after in (10, 72, 75):  # 72 - 10 > 60: the count starts again; at 75 it is 2
            clock.at(after)
            await ask(forwarder)
            await settled(forwarder)
            assert backend.asked == 1, after
        clock.at(78)  # the third in a row, 2 s left: prefetched
        assert first(await ask(forwarder))[1:] == (2, "127.0.0.1")
        await settled(forwarder)
        assert backend.asked == 2
        clock.at(80)
        assert first(await ask(forwarder))[1:] == (78, "127.0.0.2")
        assert backend.asked == 2 and forwarder.cache.counts.prefetches == 1

    run(test, CacheSettings(prefetch=Prefetch(3)))


# ----- prefetch_test.go TestPrefetchDedup: 200 hits on one entry at once, when it is due for
# a prefetch or stale: one refresh.
DEDUP = [
    ("serve_stale", CacheSettings(stale=ServeStale(HOUR)), 110),
    ("prefetch", CacheSettings(prefetch=Prefetch(1, 60.0, 50)), 70),
]


@pytest.mark.parametrize(("settings", "hit_at"), [c[1:] for c in DEDUP], ids=[c[0] for c in DEDUP])
def test_one_refresh_per_entry_at_a_time(settings: CacheSettings, hit_at: int) -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = 100
        await ask(forwarder, "dedup.example.org.")
        backend.delay = 0.05  # the refresh is under way while the hits come
        clock.at(hit_at)
        replies = await asyncio.gather(*(ask(forwarder, "dedup.example.org.") for _ in range(200)))
        assert {first(reply)[2] for reply in replies} == {"127.0.0.1"}
        await settled(forwarder)
        assert backend.asked == 2 and forwarder.cache.counts.prefetches == 1

    run(test, settings)


# ----- cache_test.go TestServeFromStaleCache: a 60 s answer, `serve_stale 1h`; the upstream
# then never answers. (name, minutes later, answered from the cache (else the upstream is
# asked and fails: SERVFAIL))
SERVE_STALE = [
    ("cached.org.", 30, True),
    ("cached.org.", 60, True),
    ("cached.org.", 70, False),
    ("notcached.org.", 30, False),
    ("notcached.org.", 60, False),
    ("notcached.org.", 70, False),
]


def test_serve_from_stale_cache() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        assert first(await ask(forwarder))[1:] == (60, "127.0.0.1")
        backend.mode = "silent"
        for name, minutes, cached in SERVE_STALE:
            clock.at(minutes * 60)
            reply = await ask(forwarder, name)
            await settled(forwarder)
            if cached:
                assert first(reply) == (0, 0, "127.0.0.1"), (name, minutes)
            else:
                assert reply == SERVFAIL, (name, minutes)

    run(test, CacheSettings(stale=ServeStale(HOUR)))


# ----- TestServeFromStaleCacheResponseTTL: (cache options, the reply cached (0 NOERROR, 3
# NXDOMAIN, TTL 60), seconds later, the TTL served) while the upstream answers SERVFAIL.
RESPONSE_TTL = [
    ("legacy default", "serve_stale 1h immediate", 0, 120, 0),
    ("immediate positive", "serve_stale 1h immediate 30s", 0, 120, 30),
    ("exact expiry", "serve_stale 1h immediate 30s", 0, 60, 30),
    ("immediate negative", "serve_stale 1h immediate 25s", 3, 120, 25),
    ("verify failure", "serve_stale 1h verify 0 45s", 0, 120, 45),
    ("stale ttl overrides keepttl", "serve_stale 1h immediate 17s\nkeepttl", 0, 120, 17),
    ("fresh response is unchanged", "serve_stale 1h immediate 30s", 0, 10, 50),
]


def corefile_cache(tmp_path: Path, options: str) -> CacheSettings:
    """The cache settings of `cache { OPTIONS }` in a Corefile."""
    path = tmp_path / "Corefile"
    path.write_text(f".:53 {{\n  kubernetes cluster.local\n  cache {{\n{options}\n  }}\n}}\n")
    return read_corefile(path, Reading()).done().cache


@pytest.mark.parametrize(
    ("options", "rcode", "after", "ttl"),
    [case[1:] for case in RESPONSE_TTL],
    ids=[case[0] for case in RESPONSE_TTL],
)
def test_serve_stale_response_ttl(
    tmp_path: Path, options: str, rcode: int, after: int, ttl: int
) -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.mode = "answer" if rcode == 0 else "nxdomain"
        assert first(await ask(forwarder))[:2] == (rcode, 60)
        backend.mode = "servfail"
        clock.at(after)
        assert first(await ask(forwarder))[:2] == (rcode, ttl)
        await settled(forwarder)

    run(test, corefile_cache(tmp_path, options))


# ----- TestServeFromStaleCacheFetchVerify: `serve_stale 1h verify`, a 120 s answer cached;
# (what the upstream answers then, with what TTL, minutes later, the rcode and TTL served).
VERIFY = [
    ("answer", 200, 1, 0, 60),  # live: not asked
    ("answer", 200, 3, 0, 200),  # expired, the upstream answers: its answer
    ("servfail", 200, 7, 0, 0),  # expired, the upstream fails: the stale answer
    ("nxdomain", 150, 8, 3, 150),  # expired, the upstream denies: the denial
]


def test_serve_stale_verify_asks_first() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = 120
        await ask(forwarder)
        for mode, ttl, minutes, rcode, served in VERIFY:
            backend.mode, backend.ttl = mode, ttl
            clock.at(minutes * 60)
            assert first(await ask(forwarder))[:2] == (rcode, served), (mode, minutes)
        assert forwarder.cache.counts.served_stale == 1
        assert forwarder.cache.counts.prefetches == 0  # no refresh in the background

    run(test, CacheSettings(stale=ServeStale(HOUR, verify=True)))


def test_serve_stale_verify_timeout() -> None:
    # A slow upstream: the stale answer after VERIFY_TIMEOUT, the refresh going on after it.
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = 120
        await ask(forwarder)
        clock.at(180)
        backend.ttl, backend.delay = 60, 0.5
        assert first(await ask(forwarder)) == (0, 30, "127.0.0.1")
        await settled(forwarder)
        backend.delay = 0.0
        assert first(await ask(forwarder)) == (0, 60, "127.0.0.2")  # refreshed meanwhile
        assert backend.asked == 2

    stale = ServeStale(HOUR, verify=True, verify_timeout=0.05, ttl=30)
    run(test, CacheSettings(stale=stale), timeout=2.0)


def test_serve_stale_verify_timeout_fast_upstream() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = 120
        await ask(forwarder)
        clock.at(180)
        backend.ttl = 200
        assert first(await ask(forwarder)) == (0, 200, "127.0.0.2")

    run(test, CacheSettings(stale=ServeStale(HOUR, verify=True, verify_timeout=2.0)))


def test_serve_stale_immediate_refreshes_in_the_background() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        await ask(forwarder)
        clock.at(90)
        assert first(await ask(forwarder)) == (0, 0, "127.0.0.1")  # stale, at once
        await settled(forwarder)
        assert first(await ask(forwarder)) == (0, 60, "127.0.0.2")  # the refresh
        counts = forwarder.cache.counts
        assert (counts.served_stale, counts.prefetches, backend.asked) == (1, 1, 2)

    run(test, CacheSettings(stale=ServeStale(HOUR)))


# ----- serve_stale_recheck_test.go: FAILURE_RECHECK 30 s; a 1 s entry (MINTTL 0), expired,
# whose refreshes fail (SERVFAIL): one refresh until 30 s after the failure, the entry kept.
RECHECK = [
    ("immediate positive", False, "answer", 0),
    ("immediate negative", False, "nxdomain", 3),
    ("verify", True, "answer", 0),
]


@pytest.mark.parametrize(
    ("verify", "primed", "rcode"), [c[1:] for c in RECHECK], ids=[c[0] for c in RECHECK]
)
def test_serve_stale_failure_recheck(verify: bool, primed: str, rcode: int) -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.mode, backend.ttl = primed, 1
        await ask(forwarder)
        backend.mode = "servfail"
        clock.at(2)
        for _ in range(2):
            assert first(await ask(forwarder))[0] == rcode
            await settled(forwarder)
        assert backend.asked == 2  # the first stale hit's refresh only
        clock.at(33)
        assert first(await ask(forwarder))[0] == rcode
        await settled(forwarder)
        assert backend.asked == 3  # the recheck is over: refreshed (in vain) again
        assert first(await ask(forwarder))[0] == rcode  # the failed refreshes kept the entry

    policy = CachePolicy(min_ttl=0)
    stale = ServeStale(HOUR, verify=verify, ttl=30, recheck=30.0)
    run(test, CacheSettings(success=policy, denial=replace(policy, max_ttl=1800), stale=stale))


# ----- TestCacheKeepTTL: replies from the cache carry the TTL they were cached with.
def test_keepttl() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        for name, after in (("cached.org.", 0), ("cached.org.", 30), ("uncached.org.", 60)):
            clock.at(after)
            assert first(await ask(forwarder, name))[1] == 60, (name, after)
        assert backend.asked == 2

    run(test, CacheSettings(keepttl=True))


# ----- What toposdns bounds.


def test_a_servfail_does_not_replace_an_entry_while_it_is_served_stale() -> None:
    # Without serve_stale an expired entry is gone: the SERVFAIL is cached in its place.
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        await ask(forwarder)
        backend.mode = "servfail"
        clock.at(61)
        stale = forwarder.cache.settings.stale.up_to
        assert first(await ask(forwarder))[0] == (0 if stale else SERVFAIL)
        if stale:
            await settled(forwarder)
        assert first(await ask(forwarder))[0] == (0 if stale else SERVFAIL)

    run(test, CacheSettings(stale=ServeStale(HOUR)))
    run(test, CacheSettings())


def test_refreshes_in_the_background_take_half_of_max_concurrent() -> None:
    # Eight names due for a prefetch at once, max_concurrent 4: two refreshes go upstream,
    # and the clients still have room for theirs.
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        backend.ttl = 100
        names = [f"n{i}.example.org." for i in range(8)]
        for name in names:
            await ask(forwarder, name)
        backend.delay = 0.3
        clock.at(95)
        await asyncio.gather(*(ask(forwarder, name) for name in names))
        await asyncio.sleep(0.05)
        assert forwarder.outstanding == 2
        assert isinstance(await ask(forwarder, "client.example.org."), dnslib.DNSRecord)
        await settled(forwarder)
        assert forwarder.cache.counts.prefetches == 2 and backend.asked == 8 + 2 + 1

    run(test, CacheSettings(prefetch=Prefetch(1)), max_concurrent=4, timeout=2.0)


def test_verify_serves_stale_when_max_concurrent_queries_are_in_flight() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        await ask(forwarder)
        clock.at(90)
        backend.delay = 0.3
        slow = asyncio.ensure_future(ask(forwarder, "other.example.org."))
        await asyncio.sleep(0.05)
        assert first(await ask(forwarder)) == (0, 0, "127.0.0.1")  # not REFUSED
        assert await ask(forwarder, "third.example.org.") == REFUSED
        await slow

    run(test, CacheSettings(stale=ServeStale(HOUR, verify=True)), max_concurrent=1)


def test_stale_entries_stay_within_the_byte_bound_and_go_after_duration() -> None:
    settings = CacheSettings(max_bytes=64 * 1024, stale=ServeStale(600.0))

    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        cache = forwarder.cache
        for i in range(300):  # far more than the bound holds, all expiring at 60 s
            await ask(forwarder, f"n{i}.example.org.")
            assert cache.bytes_held <= settings.max_bytes
        held = len(cache.success)
        assert 0 < held < 300 and cache.counts.evictions["success"] == 300 - held
        clock.at(300)  # expired, kept for serve_stale: still counted, still bounded
        backend.mode = "silent"
        assert first(await ask(forwarder, "n299.example.org."))[:2] == (0, 0)
        await settled(forwarder)
        assert len(cache.success) == held and cache.bytes_held <= settings.max_bytes
        clock.at(661)  # past 60 s + DURATION: gone
        assert len(cache.success) == 0 and cache.bytes_held == 0

    run(test, settings)


def test_the_counts_are_the_servers_cache_metrics() -> None:
    async def test(forwarder: Forwarder, backend: Backend, clock: Clock) -> None:
        metrics = QueryMetrics("dns://:53")
        forwarder.cache.counts = metrics.forward_counts  # as the server points them
        await ask(forwarder, "a.example.org.")
        await ask(forwarder, "b.example.org.")  # evicts a: capacity 1
        clock.at(57)
        await ask(forwarder, "b.example.org.")  # prefetched
        await settled(forwarder)
        clock.at(200)
        backend.mode = "silent"
        await ask(forwarder, "b.example.org.")  # stale, and refreshed in vain
        await settled(forwarder)
        found = {
            (sample.name, sample.labels.get("type", "")): sample.value
            for family in metrics.collect()
            for sample in family.samples
            if sample.name.startswith("coredns_cache_")
            and sample.labels["server"] == "dns://:53"
            and sample.labels["zones"] == "."
        }
        assert found[("coredns_cache_prefetch_total", "")] == 2
        assert found[("coredns_cache_served_stale_total", "")] == 1
        assert found[("coredns_cache_evictions_total", "success")] == 1
        assert found[("coredns_cache_evictions_total", "denial")] == 0

    settings = CacheSettings(
        success=CachePolicy(capacity=1), prefetch=Prefetch(1), stale=ServeStale(HOUR)
    )
    run(test, settings)
