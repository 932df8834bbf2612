"""The cache in front of forwarding, with the rules and knobs of CoreDNS's `cache` plugin.

- Two caches, *success* (answers, referrals) and *denial* (NXDOMAIN, NODATA, SERVFAIL), each with
  a capacity, a maximum TTL (3600 and 1800 s by default; `cache 30` in kubeadm's Corefile caps
  both at 30 s) and a minimum TTL (5 s), and zones where it is off (`disable success
  cluster.local`).
- A reply is classified as CoreDNS's `response.Typify` does. It is kept for the smallest TTL of
  its records, raised to the minimum and capped at the maximum; SERVFAIL and NOTIMP for 5 s.
  Every record's TTL is set to that number, in the reply that fills the cache as in those served
  from it (where it counts down), so a client never keeps an answer longer than the cache does.
- Not kept: truncated replies, NXDOMAIN without an SOA, a NOERROR whose CNAME chain does not end
  in the type asked and has no SOA, zone transfers and updates, replies with an expired RRSIG for
  a client that asked for DNSSEC, anything with a TTL of 0, other rcodes.
- Entries are kept without their OPT record, which is per hop: each client gets its own. A reply
  served from the cache is authoritative (AA set), as CoreDNS's are.
- Besides CoreDNS's capacities in entries, both caches together hold at most `max_bytes`
  (each entry counted as its key, its reply and `ENTRY_OVERHEAD`, measured), least recently
  used first out; a reply larger than `max_reply_bytes` is not kept.
- `cache [TTL] ZONES`: only names under ZONES are kept.
- `prefetch AMOUNT [DURATION [PERCENTAGE%]]`: an entry hit AMOUNT times, with no gap of
  DURATION (1m) between the hits, is asked of the upstreams again once PERCENTAGE (10%) of its
  TTL or less is left, in the background (`Refresher`).
- `serve_stale [DURATION [immediate|verify ...]]`: an expired entry is kept DURATION (1h) more,
  and served with TTL 0 (or RESPONSE_TTL) while a refresh runs in the background (`immediate`),
  or when a refresh asked first fails (`verify`, waiting at most VERIFY_TIMEOUT); after a failed
  refresh none is tried for FAILURE_RECHECK. Such an entry counts in the bounds as any other.
  Only NOERROR and NXDOMAIN refresh an entry (RFC 8767 section 4): a SERVFAIL never replaces a
  reply the cache holds. `serve_stale_policy` is not supported.
- `keepttl`: replies from the cache carry the TTL they were cached with, not counted down.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from struct import pack, unpack_from
from typing import Protocol

import dnslib
from cachetools import TLRUCache

from toposdns.options import (
    Origin,
    Plugin,
    Setting,
    check_range,
    domain,
    go_duration,
    none,
    sets,
)
from toposdns.serve.chain import Next, Reply, Request
from toposdns.wire.codes import (
    AA,
    AD,
    ANY,
    AXFR,
    CNAME,
    DO,
    IXFR,
    NOERROR,
    NOTIMP,
    NS,
    NXDOMAIN,
    OPT,
    SERVFAIL,
    SOA,
    Name,
)
from toposdns.wire.decode import record_spans

log = logging.getLogger("toposdns")

RRSIG = 46
NOTIFY, UPDATE = 4, 5  # opcodes
#: The lowest TTL CoreDNS uses: for replies without records and for referrals.
MINIMAL_TTL = 5
#: RFC 1982 serial arithmetic window for RRSIG times, as miekg/dns's ValidityPeriod.
YEAR68 = 1 << 31
#: The bound when the container sets none, and the share of its memory limit otherwise.
FORWARD_MAX_BYTES = 16 * 1024 * 1024
FORWARD_SHARE = 16
#: What Python spends on an entry beyond its key and reply: the `Entry`, the bytes objects'
#: headers, its TTL offsets and the LRU's links and slots. Measured with tracemalloc
#: (tests/unit/test_cache.py holds it to that) and rounded up.
ENTRY_OVERHEAD = 490


class ReplyType(Enum):
    """CoreDNS's `response.Type`, the classes its cache tells apart."""

    NO_ERROR = "NOERROR"
    NAME_ERROR = "NXDOMAIN"
    SERVER_ERROR = "SERVERERROR"
    NO_DATA = "NODATA"
    DELEGATION = "DELEGATION"
    META = "META"
    UPDATE = "UPDATE"
    OTHER_ERROR = "OTHERERROR"


SUCCESS_TYPES = frozenset({ReplyType.NO_ERROR, ReplyType.DELEGATION})
DENIAL_TYPES = frozenset({ReplyType.NAME_ERROR, ReplyType.NO_DATA, ReplyType.SERVER_ERROR})


@dataclass(frozen=True, slots=True)
class CachePolicy:
    """One of the two caches: `success CAPACITY TTL MINTTL` or `denial ...`, and `disable`."""

    capacity: int = 10_000
    max_ttl: int = 3600
    min_ttl: int = MINIMAL_TTL
    #: Zones (lower-case) whose replies this cache does not keep; `()` for the root: none kept.
    disabled: tuple[Name, ...] = field(default=())
    #: The zones whose replies it keeps (`cache ZONES`); the root: every one.
    zones: tuple[Name, ...] = field(default=((),))

    def keeps(self, name: Name) -> bool:
        """False if the name is outside the cache's zones, or in a zone where it is disabled."""
        return _under(name, self.zones) and not _under(name, self.disabled)


def _under(name: Name, zones: tuple[Name, ...]) -> bool:
    return any(name[len(name) - len(zone) :] == zone for zone in zones)


@dataclass(frozen=True, slots=True)
class Prefetch:
    """`prefetch AMOUNT [DURATION [PERCENTAGE%]]`, CoreDNS's defaults."""

    #: Hits that make an entry popular, each within `window` seconds of the one before; 0: off.
    amount: int = 0
    window: float = 60.0
    #: A popular entry is refreshed once this share of its TTL, in percent, or less is left.
    percentage: int = 10


@dataclass(frozen=True, slots=True)
class ServeStale:
    """`serve_stale [DURATION [immediate [RESPONSE_TTL [FAILURE_RECHECK]] | verify
    [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]]]`; `up_to` 0: off."""

    #: Seconds an expired entry is still served.
    up_to: float = 0.0
    #: Ask the upstreams first, serving the expired entry only when they fail (`verify`);
    #: else serve it at once and refresh it in the background (`immediate`).
    verify: bool = False
    #: `verify` waits this long for the upstreams at most (0: as long as forwarding takes).
    verify_timeout: float = 0.0
    #: The TTL of an expired entry's records (0 unless `keepttl`: its own).
    ttl: int = 0
    #: Seconds after a failed refresh before another is tried (0: at the next query).
    recheck: float = 0.0


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """Both caches, with CoreDNS's defaults."""

    success: CachePolicy = CachePolicy(max_ttl=3600)
    denial: CachePolicy = CachePolicy(max_ttl=1800)
    #: How long SERVFAIL and NOTIMP are kept (CoreDNS's `servfail` default).
    servfail_ttl: int = 5
    #: Bytes both caches hold at most, together.
    max_bytes: int = FORWARD_MAX_BYTES
    prefetch: Prefetch = Prefetch()
    stale: ServeStale = ServeStale()
    #: Replies from the cache carry the TTL they were cached with (`keepttl`).
    keepttl: bool = False

    @property
    def refreshing(self) -> bool:
        """Whether a hit does more than render the entry: prefetch, serve_stale or keepttl."""
        return bool(self.prefetch.amount or self.stale.up_to or self.keepttl)

    @property
    def max_reply_bytes(self) -> int:
        """Replies larger than this are not kept: a few must not take the room of many."""
        return max(4096, min(65536, self.max_bytes // 64))


MAX_TTL = 2**31 - 1  # RFC 2181 section 8
#: `disable` for the root: every zone.
OFF: tuple[Name, ...] = ((),)
MAX_CAPACITY = 1_000_000
#: CoreDNS caps `servfail` at 5 minutes, and serve_stale's FAILURE_RECHECK too.
MAX_SERVFAIL_TTL = 300
MAX_RECHECK = 300
#: serve_stale's RESPONSE_TTL is a record's TTL: 32 bits.
MAX_STALE_TTL = 2**32 - 1
#: The earliest time, for entries never hit nor refreshed.
NEVER = float("-inf")


def _cache_ttl(settings: CacheSettings, words: Sequence[str], origin: Origin) -> CacheSettings:
    """`cache [TTL] [ZONES...]`: TTL caps both caches; with zones, only names under them are
    kept (none: the server block's, which are all the names it is given)."""
    rest = list(words)
    if rest and rest[0].lstrip("-").isdigit():
        ttl = check_range(_number(rest.pop(0), origin), 1, MAX_TTL, origin, "TTL")
        settings = replace(
            settings,
            success=replace(settings.success, max_ttl=ttl),
            denial=replace(settings.denial, max_ttl=ttl),
        )
    if rest:
        zones = tuple(domain(word, origin) for word in rest)
        settings = replace(
            settings,
            success=replace(settings.success, zones=zones),
            denial=replace(settings.denial, zones=zones),
        )
    return settings


def _number(word: str, origin: Origin) -> int:
    try:
        return int(word)
    except ValueError:
        raise origin.error(f"{word!r} is not a whole number") from None


def _policy(kind: str) -> Callable[[CacheSettings, Sequence[str], Origin], CacheSettings]:
    """`success|denial CAPACITY [TTL [MINTTL]]`."""

    def apply(settings: CacheSettings, words: Sequence[str], origin: Origin) -> CacheSettings:
        if not 1 <= len(words) <= 3 or not all(word.isdigit() for word in words):
            raise origin.error(
                f"expected CAPACITY [TTL [MINTTL]] in whole numbers, e.g. {kind} 10000 30 5"
            )
        numbers = [int(word) for word in words]
        policy = getattr(settings, kind)
        capacity = check_range(numbers[0], 1, MAX_CAPACITY, origin, "CAPACITY")
        policy = replace(policy, capacity=capacity)
        if len(numbers) > 1:
            policy = replace(policy, max_ttl=check_range(numbers[1], 1, MAX_TTL, origin, "TTL"))
        if len(numbers) > 2:
            policy = replace(policy, min_ttl=check_range(numbers[2], 0, MAX_TTL, origin, "MINTTL"))
        return replace(settings, **{kind: policy})

    return apply


def _disable(settings: CacheSettings, words: Sequence[str], origin: Origin) -> CacheSettings:
    """`disable success|denial [ZONES...]` (no zones: everywhere)."""
    if not words or words[0] not in ("success", "denial"):
        raise origin.error("expected success or denial, then zones, e.g. success cluster.local")
    names = [domain(word, origin) for word in words[1:]] or [()]
    policy = getattr(settings, words[0])
    policy = replace(policy, disabled=policy.disabled + tuple(names))
    return replace(settings, **{words[0]: policy})


def _servfail(settings: CacheSettings, words: Sequence[str], origin: Origin) -> CacheSettings:
    """`servfail DURATION`: how long SERVFAIL is kept, at most 5m (0: not at all)."""
    if len(words) != 1:
        raise origin.error("expected a duration, e.g. servfail 5s")
    ttl = _duration(words[0], origin, "servfail 5s", MAX_SERVFAIL_TTL)
    return replace(settings, servfail_ttl=int(ttl))


def _duration(word: str, origin: Origin, example: str, most: float | None = None) -> float:
    """A Go duration, not negative, at most `most` seconds."""
    value = go_duration(word, origin, example)
    if value < 0:
        raise origin.error(f"{word}: must not be negative, e.g. {example}")
    if most is not None and value > most:
        raise origin.error(f"{word}: must be at most {most / 60:g}m")
    return value


def _prefetch(words: Sequence[str], origin: Origin) -> Prefetch:
    """`prefetch AMOUNT [DURATION [PERCENTAGE%]]`."""
    example = "prefetch 10 1m 10%"
    if not 1 <= len(words) <= 3:
        raise origin.error(f"expected AMOUNT [DURATION [PERCENTAGE%]], e.g. {example}")
    amount = check_range(_number(words[0], origin), 0, MAX_CAPACITY, origin, "AMOUNT")
    prefetch = Prefetch(amount)
    if len(words) > 1:
        prefetch = replace(prefetch, window=_duration(words[1], origin, example))
    if len(words) > 2:
        text = words[2]
        if not text.endswith("%") or not text[:-1].isdigit():
            raise origin.error(f"{text}: expected a percentage with its %, e.g. {example}")
        percentage = check_range(int(text[:-1]), 10, 90, origin, "PERCENTAGE")
        prefetch = replace(prefetch, percentage=percentage)
    return prefetch


def _serve_stale(words: Sequence[str], origin: Origin) -> ServeStale:
    """`serve_stale [DURATION [immediate [RESPONSE_TTL [FAILURE_RECHECK]] | verify
    [VERIFY_TIMEOUT [RESPONSE_TTL [FAILURE_RECHECK]]]]]`, as CoreDNS's setup.go reads it."""
    example = "serve_stale 1h verify 100ms 30s 30s"
    stale = ServeStale(up_to=3600.0)
    if words:
        stale = replace(stale, up_to=_duration(words[0], origin, "serve_stale 1h"))
    if len(words) < 2:
        return stale
    mode = words[1].lower()
    if mode not in ("immediate", "verify"):
        raise origin.error(f"{words[1]}: expected immediate or verify, e.g. {example}")
    rest = list(words[2:])
    if mode == "verify":
        stale = replace(stale, verify=True)
        if rest:
            stale = replace(stale, verify_timeout=_duration(rest.pop(0), origin, example))
    if len(rest) > 2:
        raise origin.error(f"{rest[2]}: too many words, e.g. {example}")
    if rest:
        ttl = _duration(rest[0], origin, "serve_stale 1h immediate 30s")
        if ttl != int(ttl) or ttl > MAX_STALE_TTL:
            raise origin.error(
                f"{rest[0]}: the TTL of stale replies must be whole seconds, at most "
                f"{MAX_STALE_TTL}s, e.g. 30s"
            )
        stale = replace(stale, ttl=int(ttl))
    if len(rest) > 1:
        recheck = _duration(rest[1], origin, "serve_stale 1h immediate 30s 30s", MAX_RECHECK)
        stale = replace(stale, recheck=recheck)
    return stale


def _disable_words(text: str) -> list[str]:
    """`--cache-disable success:ZONE,ZONE` as the words of `disable success ZONE ZONE`."""
    kind, _, zones = text.partition(":")
    return [kind.strip(), *(zone.strip() for zone in zones.split(",") if zone.strip())]


#: CoreDNS's `cache` with no options.
DEFAULT_CACHE = CacheSettings()

#: CoreDNS's `cache` for forwarded replies, as its Corefile block and `serve`'s flags set it.
CACHE: Plugin[CacheSettings] = Plugin(
    "cache",
    CacheSettings,
    (
        Setting(
            "",
            _cache_ttl,
            "--cache-max-ttl",
            "SECONDS",
            "keep forwarded answers and denials at most this long, as CoreDNS's `cache "
            f"SECONDS` (kubeadm: 30; default {DEFAULT_CACHE.success.max_ttl} for answers, "
            f"{DEFAULT_CACHE.denial.max_ttl} for denials)",
        ),
        Setting(
            "success",
            _policy("success"),
            "--cache-success",
            "CAPACITY[,TTL[,MINTTL]]",
            "the cache of forwarded answers, as CoreDNS cache's `success CAPACITY TTL MINTTL` "
            f"(default {DEFAULT_CACHE.success.capacity} entries, minimum TTL "
            f"{DEFAULT_CACHE.success.min_ttl})",
        ),
        Setting(
            "denial",
            _policy("denial"),
            "--cache-denial",
            "CAPACITY[,TTL[,MINTTL]]",
            "the cache of forwarded NXDOMAIN/NODATA/SERVFAIL, as CoreDNS cache's `denial "
            f"CAPACITY TTL MINTTL` (default {DEFAULT_CACHE.denial.capacity} entries, minimum TTL "
            f"{DEFAULT_CACHE.denial.min_ttl})",
        ),
        Setting(
            "disable",
            _disable,
            "--cache-disable",
            "success|denial[:ZONE,...]",
            "do not cache forwarded answers (success) or denials in these zones (default: "
            "everywhere), as CoreDNS cache's `disable`; repeatable",
            repeat="each",
            flag_words=_disable_words,
        ),
        Setting("servfail", _servfail),
        Setting(
            "prefetch",
            sets("prefetch", _prefetch),
            "--cache-prefetch",
            "AMOUNT[,DURATION[,PERCENTAGE%]]",
            "ask the upstreams again for a forwarded answer asked AMOUNT times, with no gap of "
            "DURATION (1m), once PERCENTAGE (10%) of its TTL is left, before it expires, as "
            "CoreDNS cache's `prefetch` (default: off)",
        ),
        Setting(
            "serve_stale",
            sets("stale", _serve_stale),
            "--cache-serve-stale",
            "DURATION[,immediate|verify[,...]]",
            "serve an expired forwarded answer for DURATION more (1h) while it is refreshed "
            "(immediate), or when the upstreams fail (verify), as CoreDNS cache's `serve_stale` "
            "(default: off)",
            optional=True,
        ),
        Setting("keepttl", sets("keepttl", none)),
    ),
)


@dataclass(slots=True)
class Entry:
    """A reply as the cache gives it out: no OPT, every TTL at `ttl`, counted down from `stored`."""

    reply: bytes
    ttl: int
    stored: float
    ttl_offsets: tuple[int, ...]
    #: Which cache holds it ("success" or "denial"), or "" if it is not kept.
    kind: str = ""
    #: What it costs in memory, key included, as the bound counts it.
    size: int = 0
    #: Whether it may replace an expired entry: NOERROR or NXDOMAIN, whole (RFC 8767 section
    #: 4), what CoreDNS's serve_stale takes for a refresh.
    refreshes: bool = False
    #: prefetch's count of hits, each within its DURATION of the one before, and the last's time.
    hits: int = 0
    last: float = NEVER
    #: A refresh from the upstreams is under way; none starts before `retry_after`.
    refreshing: bool = False
    retry_after: float = NEVER

    def fits(self, limit: int, opt: bytes) -> bool:
        return len(self.reply) + len(opt) <= limit

    def may_refresh(self, now: float) -> bool:
        """True if no refresh is under way, nor a failed one's FAILURE_RECHECK."""
        return not self.refreshing and now >= self.retry_after

    def refreshed(self, now: float, recheck: float, done: bool) -> None:
        """A refresh ended at `now`; when it failed, the next waits `recheck` seconds."""
        self.retry_after = now + recheck if recheck and not done else NEVER
        self.refreshing = False

    def render(
        self, qid: bytes, now: float, opt: bytes, ad: bool, hit: bool, question: bytes = b""
    ) -> bytes:
        """The reply for one client: its ID, its `question` in the letter case it asked (the
        key folds case; the records keep the case of the reply cached, as CoreDNS's cache
        does), TTLs counted down, its OPT record if it sent one; AD cleared when it asked for
        neither DNSSEC nor AD; AA set when it comes from the cache."""
        out = bytearray(qid + self.reply[2:])
        if question:  # the same name but for case: the same length
            out[12 : 12 + len(question)] = question
        elapsed = int(now - self.stored)
        if elapsed:
            remaining = pack("!I", max(0, self.ttl - elapsed))
            for offset in self.ttl_offsets:
                out[offset : offset + 4] = remaining
        if hit:
            out[2] |= AA >> 8
        if not ad:
            out[3] &= ~AD
        if opt:
            out[10:12] = pack("!H", unpack_from("!H", out, 10)[0] + 1)
            out += opt
        return bytes(out)


class CacheCounts:
    """What CoreDNS's cache counts besides hits: prefetches, replies served stale, and
    evictions by cache. The DNS server's metrics (serve/query_metrics.py) keep one, which every
    forward cache counts in, those a reload makes included."""

    __slots__ = ("prefetches", "served_stale", "evictions")

    def __init__(self) -> None:
        self.prefetches = 0
        self.served_stale = 0
        self.evictions = {"success": 0, "denial": 0}


class ForwardCache:
    """The success and denial caches of forwarded replies, bounded in entries (each, as
    CoreDNS's) and in bytes (together). An expired entry stays for serve_stale's DURATION."""

    def __init__(
        self, settings: CacheSettings = CacheSettings(), clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        stale = settings.stale.up_to
        self.success = _lru(settings.max_bytes, clock, stale)
        self.denial = _lru(settings.max_bytes, clock, stale)
        self.counts = CacheCounts()

    @property
    def bytes_held(self) -> int:
        """Bytes held by both caches, as `Entry.size` counts them."""
        return int(self.success.currsize + self.denial.currsize)

    def get(self, key: bytes) -> Entry | None:
        return self.success.get(key) or self.denial.get(key)

    def store(self, key: bytes, reply: bytes, message: dnslib.DNSRecord) -> Entry:
        """The entry for a checked reply to the query keyed `key`; kept if the rules allow. A
        reply that is no refresh (SERVFAIL, NOTIMP) does not replace the entry held for the key
        (a refresh's, while it is about to expire or expired), as none does in CoreDNS."""
        reply_type = classify(message, time.time())
        kind, ttl = _placement(message, reply_type, self.settings)
        body = without_opt(reply)
        offsets = tuple(at for _, at, _, _, _ in record_spans(body))
        stamp = pack("!I", ttl)
        out = bytearray(body)
        for offset in offsets:
            out[offset : offset + 4] = stamp
        size = len(key) + len(out) + 4 * len(offsets) + ENTRY_OVERHEAD
        refreshes = (
            not message.header.tc
            and message.header.rcode in (NOERROR, NXDOMAIN)
            and reply_type not in (ReplyType.OTHER_ERROR, ReplyType.META, ReplyType.UPDATE)
        )
        entry = Entry(bytes(out), ttl, self.clock(), offsets, kind, size, refreshes)
        if len(out) > self.settings.max_reply_bytes:
            entry.kind = ""
        if entry.kind and not refreshes and (key in self.success or key in self.denial):
            entry.kind = ""
        if entry.kind:
            self.success.pop(key, None)
            self.denial.pop(key, None)
            keeping, policy = (
                (self.success, self.settings.success)
                if kind == "success"
                else (self.denial, self.settings.denial)
            )
            if len(keeping) >= policy.capacity:  # CoreDNS's capacity: the least recent goes
                keeping.popitem()
                self.counts.evictions[kind] += 1
            self.make_room(size)
            keeping[key] = entry
        return entry

    def make_room(self, size: int) -> None:
        """Drop expired entries, then the least recently used of the larger cache, until
        `size` more bytes fit in the bound."""
        if self.bytes_held + size <= self.settings.max_bytes:
            return
        self.success.expire()
        self.denial.expire()
        while self.bytes_held + size > self.settings.max_bytes and (self.success or self.denial):
            larger = self.success if self.success.currsize >= self.denial.currsize else self.denial
            larger.popitem()
            self.counts.evictions["success" if larger is self.success else "denial"] += 1


def _lru(max_bytes: int, clock: Callable[[], float], stale: float) -> TLRUCache[bytes, Entry]:
    """A cache whose entries go `stale` seconds after they expire, the least recent first when
    it is full."""
    return TLRUCache(
        maxsize=max_bytes,
        ttu=lambda _key, entry, _now: entry.stored + entry.ttl + stale,
        timer=clock,
        getsizeof=lambda entry: entry.size,
    )


class Fetcher(Protocol):
    """What refreshing an entry needs of the forwarder (serve/forward.py)."""

    async def refetch(
        self, key: bytes, data: bytes, end: int, tcp: bool, background: bool
    ) -> Entry | int | None:
        """The upstreams' answer to the query `data` (cache key `key`, question ending at
        `end`), stored in the cache as a client's would be, or the rcode when none came; None
        when too many queries are in flight to send it."""
        ...


class Refresher:
    """CoreDNS cache's prefetch, serve_stale and keepttl: what a hit on a forwarded entry is
    answered with, and the refreshes from the upstreams it starts. A refresh of an entry runs
    one at a time, in the background (but for serve_stale's `verify`, which a client waits
    for), counted in the forwarder's queries in flight, where those no client waits for may
    take half of `max_concurrent` at most; it never delays a reply from the cache."""

    def __init__(self, cache: ForwardCache, fetcher: Fetcher) -> None:
        self.cache = cache
        self.fetcher = fetcher
        settings = cache.settings
        self.prefetch = settings.prefetch
        self.stale = settings.stale
        self.keepttl = settings.keepttl
        #: The refreshes under way, until they end (cancelled by `close`).
        self.tasks: set[asyncio.Task[Entry | None]] = set()
        #: An unexpected error in a refresh was logged (once).
        self.faulted = False

    async def serve(
        self, entry: Entry, key: bytes, data: bytes, end: int, tcp: bool, now: float
    ) -> tuple[Entry, float, bool]:
        """The answer to the query `data` (cache key `key`, question ending at `end`, asked
        over TCP or not) that hit `entry` at `now`: the entry to render, the time to render it
        at (its TTLs count down to that), and whether it is served from the cache (AA)."""
        left = entry.ttl - int(now - entry.stored)  # as CoreDNS counts: whole seconds
        stale = self.stale
        if left > 0 or not stale.up_to:
            if self.prefetch.amount and self.popular(entry, now, left):
                self.start(entry, key, data, end, tcp, now, 0.0)
            return entry, entry.stored if self.keepttl else now, True
        if stale.verify:
            fresh = await self.verify(entry, key, data, end, tcp, now)
            if fresh is not None:
                return fresh, self.cache.clock(), False
        else:
            self.start(entry, key, data, end, tcp, now, stale.recheck)
        self.cache.counts.served_stale += 1
        expired = entry.stored + entry.ttl  # rendered then, its records' TTL is 0
        if stale.ttl:
            return entry, expired - stale.ttl, True
        return entry, entry.stored if self.keepttl else expired, True

    def popular(self, entry: Entry, now: float, left: int) -> bool:
        """Count a hit on a live entry; True once it is popular and its TTL is low enough to
        prefetch it (CoreDNS's `shouldPrefetch`)."""
        prefetch = self.prefetch
        entry.hits = entry.hits + 1 if entry.last >= now - prefetch.window else 1
        entry.last = now
        # In CoreDNS's float arithmetic: 10% of a 70 s TTL rounds up to 8 s.
        threshold = math.ceil(prefetch.percentage / 100 * entry.ttl)
        return entry.hits >= prefetch.amount and left <= threshold

    def start(
        self, entry: Entry, key: bytes, data: bytes, end: int, tcp: bool, now: float, recheck: float
    ) -> None:
        """Refresh `entry` in the background, unless a refresh is under way or waits."""
        if not entry.may_refresh(now):
            return
        entry.refreshing = True
        self._run(self.refresh(entry, key, data, end, tcp, now, recheck, True))

    async def verify(
        self, entry: Entry, key: bytes, data: bytes, end: int, tcp: bool, now: float
    ) -> Entry | None:
        """serve_stale's `verify`: the entry the upstreams refresh `entry` with, waited for
        (at most VERIFY_TIMEOUT, the refresh going on after it); None when they do not."""
        stale = self.stale
        if stale.recheck:  # as CoreDNS: refreshes are one at a time only with FAILURE_RECHECK
            if not entry.may_refresh(now):
                return None
            entry.refreshing = True
        task = self._run(self.refresh(entry, key, data, end, tcp, now, stale.recheck, False))
        try:
            if stale.verify_timeout:
                return await asyncio.wait_for(asyncio.shield(task), stale.verify_timeout)
            return await asyncio.shield(task)
        except TimeoutError:
            return None

    async def refresh(
        self,
        entry: Entry,
        key: bytes,
        data: bytes,
        end: int,
        tcp: bool,
        now: float,
        recheck: float,
        background: bool,
    ) -> Entry | None:
        """Ask the upstreams again for `entry`: the new entry if their answer refreshes it (the
        cache then holds it, with the hits counted so far), else None (it stays)."""
        fresh = None
        try:
            outcome = await self.fetcher.refetch(key, data, end, tcp, background)
            if outcome is not None and background:
                self.cache.counts.prefetches += 1
            if isinstance(outcome, Entry) and outcome.refreshes:
                fresh = outcome
                outcome.hits, outcome.last = entry.hits, now
        except Exception:
            if not self.faulted:
                self.faulted = True
                log.exception("refreshing a cached forwarded reply failed (logged once)")
        finally:
            entry.refreshed(self.cache.clock(), recheck, fresh is not None)
        return fresh

    def _run(self, refresh: Coroutine[None, None, Entry | None]) -> asyncio.Task[Entry | None]:
        task = asyncio.get_running_loop().create_task(refresh)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def close(self) -> None:
        """Stop the refreshes under way."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def placement(message: dnslib.DNSRecord, settings: CacheSettings, now: float) -> tuple[str, int]:
    """Which cache keeps a reply ("success", "denial", or "" for neither) and the TTL its
    records get. `now` is wall-clock time, for RRSIG validity."""
    return _placement(message, classify(message, now), settings)


def _placement(
    message: dnslib.DNSRecord, kind: ReplyType, settings: CacheSettings
) -> tuple[str, int]:
    ttl = cache_ttl(message, kind, settings)
    if ttl <= 0 or not cacheable(message, kind):
        return "", ttl
    name = tuple(label.decode("latin-1").lower() for label in message.q.qname.label)
    if kind in SUCCESS_TYPES and settings.success.keeps(name):
        return "success", ttl
    if kind in DENIAL_TYPES and settings.denial.keeps(name):
        return "denial", ttl
    return "", ttl


def classify(message: dnslib.DNSRecord, now: float) -> ReplyType:
    """What kind of reply this is, as CoreDNS's cache sees it (`response.Typify`, then a NOERROR
    whose answer does not answer the question but has an SOA is NODATA). `now` is wall-clock
    time, for the validity of RRSIGs, checked when the reply's OPT has the DO bit."""
    header = message.header
    if header.opcode == UPDATE:
        return ReplyType.UPDATE
    if header.opcode == NOTIFY or any(q.qtype in (AXFR, IXFR) for q in message.questions):
        return ReplyType.META
    do = any(rr.rtype == OPT and rr.ttl & DO for rr in message.ar)
    if do and any(_expired(rr, now) for rr in _records(message)):
        return ReplyType.OTHER_ERROR
    rcode = header.rcode
    if message.rr:
        if rcode == NOERROR:
            if _has_soa(message) and not answers_question(message):
                return ReplyType.NO_DATA
            return ReplyType.NO_ERROR
        if rcode == NXDOMAIN:
            return ReplyType.OTHER_ERROR
    if rcode == NOERROR and _has_soa(message):
        return ReplyType.NO_DATA
    if rcode == NXDOMAIN:
        return ReplyType.NAME_ERROR
    if rcode in (SERVFAIL, NOTIMP):
        return ReplyType.SERVER_ERROR
    if rcode == NOERROR and any(rr.rtype == NS for rr in message.auth):
        return ReplyType.DELEGATION
    return ReplyType.NO_ERROR if rcode == NOERROR else ReplyType.OTHER_ERROR


def cacheable(message: dnslib.DNSRecord, kind: ReplyType) -> bool:
    """Whether CoreDNS's cache would keep a reply of this kind at all (its `key` function)."""
    if message.header.tc or kind in (ReplyType.OTHER_ERROR, ReplyType.META, ReplyType.UPDATE):
        return False
    if kind is ReplyType.NAME_ERROR:
        return _has_soa(message)  # the denial TTL comes from the SOA
    if kind is ReplyType.NO_ERROR and message.rr and not _has_soa(message):
        return answers_question(message)  # else an SOA-less NODATA (RFC 2308 section 5)
    return True


def cache_ttl(message: dnslib.DNSRecord, kind: ReplyType, settings: CacheSettings) -> int:
    """How long a reply is kept, in seconds: the smallest TTL in it (`minimal_ttl`) raised to the
    cache's minimum and capped at its maximum (CoreDNS's `computeTTL`)."""
    if kind is ReplyType.SERVER_ERROR:
        return settings.servfail_ttl
    policy = (
        settings.denial if kind in (ReplyType.NAME_ERROR, ReplyType.NO_DATA) else settings.success
    )
    return clamp_ttl(minimal_ttl(message, kind, policy.max_ttl), policy.min_ttl, policy.max_ttl)


def clamp_ttl(ttl: int, min_ttl: int, max_ttl: int) -> int:
    """`ttl` raised to `min_ttl`, then capped at `max_ttl`."""
    return min(max(ttl, min_ttl), max_ttl)


def minimal_ttl(message: dnslib.DNSRecord, kind: ReplyType, maximum: int) -> int:
    """The smallest TTL of the records outside OPT, at most `maximum`; MINIMAL_TTL for a reply
    that is neither an answer nor a denial, or that has no records (dnsutil.MinimalTTL)."""
    if kind not in (ReplyType.NO_ERROR, ReplyType.NAME_ERROR, ReplyType.NO_DATA):
        return MINIMAL_TTL
    records = [rr for rr in _records(message) if rr.rtype != OPT]
    if not message.rr and not message.auth and not records:
        return MINIMAL_TTL
    return int(min([maximum, *(rr.ttl for rr in records)]))


def answers_question(message: dnslib.DNSRecord) -> bool:
    """True if a NOERROR reply's answer holds the type asked at the end of the CNAME chain that
    starts at the question name (CoreDNS cache's `answersQuestion`)."""
    if message.header.rcode != NOERROR or not message.questions or not message.rr:
        return False
    question = message.q
    name, qtype, qclass = _lower(question.qname), question.qtype, question.qclass
    records = [rr for rr in message.rr if qclass == ANY or rr.rclass == qclass]
    if qtype == ANY:
        return any(_lower(rr.rname) == name for rr in records)
    if qtype == CNAME:
        target = _cname_target(records, name)
        return target is not None and target != ()
    seen: set[tuple[bytes, ...]] = set()
    while True:
        if name in seen:
            return False  # a CNAME loop
        seen.add(name)
        target = _cname_target(records, name)
        if target is None:
            return False  # two different targets: no canonical name
        if target == ():
            break
        name = target
    return any(rr.rtype == qtype and _lower(rr.rname) == name for rr in records)


def _cname_target(
    records: Iterable[dnslib.RR], owner: tuple[bytes, ...]
) -> tuple[bytes, ...] | None:
    """The one CNAME target of `owner`; () if it has none, None if it has several."""
    target: tuple[bytes, ...] = ()
    for rr in records:
        if rr.rtype == CNAME and _lower(rr.rname) == owner:
            found = _lower(rr.rdata.label)
            if target and found != target:
                return None
            target = found
    return target


def _lower(name: dnslib.DNSLabel | tuple[bytes, ...]) -> tuple[bytes, ...]:
    labels = name.label if isinstance(name, dnslib.DNSLabel) else name
    return tuple(label.lower() for label in labels)


def _records(message: dnslib.DNSRecord) -> list[dnslib.RR]:
    return [*message.rr, *message.auth, *message.ar]


def _has_soa(message: dnslib.DNSRecord) -> bool:
    return any(rr.rtype == SOA for rr in message.auth)


def _expired(rr: dnslib.RR, now: float) -> bool:
    """An RRSIG outside its validity period, in RFC 1982 serial arithmetic."""
    if rr.rtype != RRSIG:
        return False
    utc = int(now)
    inception = rr.rdata.sig_inc + int((rr.rdata.sig_inc - utc) / YEAR68) * YEAR68
    expiration = rr.rdata.sig_exp + int((rr.rdata.sig_exp - utc) / YEAR68) * YEAR68
    return not inception <= utc <= expiration


def without_opt(reply: bytes) -> bytes:
    """The reply without its OPT record, so another client can be given its own."""
    for start, _, end, rtype, _ in record_spans(reply):
        if rtype == OPT:
            count = unpack_from("!H", reply, 10)[0] - 1
            return reply[:10] + pack("!H", count) + reply[12:start] + reply[end:]
    return reply


def first_served(reply: bytes, settings: CacheSettings, now: float) -> bytes:
    """A reply as CoreDNS's `cache` passes it on the first time: every TTL (but the OPT's) set
    to how long the cache keeps it (its `filterRRSlice`); as it is when the cache would not
    keep it. A reply without records is as it is, without being parsed."""
    ancount, nscount, arcount = unpack_from("!3H", reply, 6)
    if ancount + nscount == 0 and arcount <= 1:
        return reply
    kind, ttl = placement(dnslib.DNSRecord.parse(reply), settings, now)
    if not kind:
        return reply
    out = bytearray(reply)
    stamp = pack("!I", ttl)
    for _, at, _, rtype, _ in record_spans(reply):
        if rtype != OPT:
            out[at : at + 4] = stamp
    return bytes(out)


#: The plugins whose replies `Capping` caps: forwarded replies are the forward cache's, which
#: caps them itself; the kubernetes block's own are the reply cache's (serve/cache.py).
CAPPED = ("template", "hosts")


class Capping:
    """CoreDNS's `cache` in a chain, for the replies of the plugins after it that it would keep
    (template, hosts, `CAPPED`): their TTLs capped as its first reply caps them."""

    name = "cache"

    def __init__(self, settings: CacheSettings) -> None:
        self.settings = settings

    def serve(self, request: Request, next: Next) -> Reply:
        reply = next(request)
        if isinstance(reply, bytes) and request.written_by in CAPPED:
            return first_served(reply, self.settings, time.time())
        return reply


def cache_off(settings: CacheSettings | None = None) -> CacheSettings:
    """The `cache` settings of a server block without one: nothing kept, for any zone."""
    settings = settings or CacheSettings()
    return replace(
        settings,
        success=replace(settings.success, disabled=OFF),
        denial=replace(settings.denial, disabled=OFF),
    )


def capping(settings: CacheSettings) -> Capping | None:
    """The `cache` handler of a chain whose block has one (a block without it keeps nothing)."""
    if settings.success.disabled == OFF and settings.denial.disabled == OFF:
        return None
    return Capping(settings)
