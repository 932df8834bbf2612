"""The reply cache: bounded in bytes that match what Python really spends, one entry per name
whatever its letter case and buffer size, each query's reply cut to its own limit."""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable
from struct import pack
from typing import Any

import dnslib
import pytest

from tests.differential import reference_reply
from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB, headless
from toposdns.serve.cache import (
    LABELS_OVERHEAD,
    REMEMBERED_OPTIONS_BYTES,
    Cached,
    ReplyCache,
    TopologyReplies,
    container_memory_limit,
    default_max_bytes,
)
from toposdns.serve.forward_cache import CacheSettings, ForwardCache
from toposdns.serve.responder import TCP4, UDP4, UDP6, Responder, Transport
from toposdns.store.topology import Policy

CONFIG = config_of()
#: A headless service of 100 endpoints with names: SRV answers of about 8 KB with their glue.
BIG: list[dict[str, Any]] = [
    *SHOP_WEB,
    *headless(
        "big",
        "shop",
        [
            {"addresses": [f"10.2.{i // 250}.{i % 250 + 1}"], "hostname": f"big-{i}"}
            for i in range(100)
        ],
    ),
]
SNAPSHOT = snapshot_of(BIG)


def query(name: str, qtype: str = "A", size: int | None = None, qid: int = 7) -> bytes:
    question = dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype))
    q = dnslib.DNSRecord(dnslib.DNSHeader(id=qid, rd=1), q=question)
    if size is not None:
        q.add_ar(dnslib.EDNS0(udp_len=size))
    return bytes(q.pack())


def reply(responder: Responder, data: bytes, transport: Transport = UDP4) -> bytes:
    answer = responder.respond(data, transport, "127.0.0.1")
    assert isinstance(answer, bytes)
    snapshot, limit = responder.snapshot, responder.max_udp_size
    assert answer == reference_reply(data, transport, "127.0.0.1", snapshot, CONFIG, (), limit)
    return answer


def random_case(name: str, rng: random.Random) -> str:
    return "".join(rng.choice((c.lower(), c.upper())) for c in name)


def traced(fill: Callable[[], None]) -> int:
    """Bytes Python holds after `fill` that it did not hold before."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


# Byte accounting: the bound is in the bytes Python really spends.


@pytest.mark.parametrize("flood", ["made-up names", "services and SRV"])
def test_the_bytes_counted_are_the_bytes_held(flood: str) -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    rng = random.Random(1)
    names = {
        "made-up names": [
            (f"x{rng.getrandbits(40):x}.shop.svc.cluster.local", "A", None) for _ in range(3000)
        ],
        "services and SRV": [
            (f"big-{i % 100}.big.shop.svc.cluster.local", "A", 1232) for i in range(100)
        ]
        + [("_http._tcp.big.shop.svc.cluster.local", "SRV", 65535)]
        + [(f"nope{i}.shop.svc.cluster.local", "AAAA", 1232) for i in range(2000)],
    }[flood]
    queries = [query(name, qtype, size) for name, qtype, size in names]
    for data in queries:  # the encoder's memory of names and records, filled before
        responder.respond(data, TCP4, "127.0.0.1")
    responder.cache.clear()
    for data in queries:  # asked once more: a template reply is kept when asked again
        responder.respond(data, TCP4, "127.0.0.1")
    for key in list(responder.cache.table):
        responder.cache.drop(key)

    def fill() -> None:
        for data in queries:
            responder.respond(data, UDP4, "127.0.0.1")

    held = traced(fill)
    counted = responder.cache.bytes_held
    assert counted > 0
    # What is counted is what is held, within a fifth (the rest is Python's rounding).
    assert 0.8 <= held / counted <= 1.2, (held, counted, responder.cache.entries)


def test_the_forward_cache_counts_its_bytes() -> None:
    cache = ForwardCache(CacheSettings())
    replies = []
    for i in range(2000):
        message = dnslib.DNSRecord.question(f"host{i}.example.com")
        answer = message.reply()
        for j in range(1 + i % 5):
            answer.add_answer(dnslib.RR(message.q.qname, rdata=dnslib.A(f"192.0.2.{j}"), ttl=60))
        replies.append((b"key%d" % i + bytes(40), bytes(answer.pack()), answer))

    def fill() -> None:
        for key, wire, message in replies:
            cache.store(key, wire, message)

    held = traced(fill)
    assert 0.8 <= held / cache.bytes_held <= 1.2, (held, cache.bytes_held)


def test_the_labels_a_topology_reply_remembers_are_counted_and_bounded() -> None:
    cache = ReplyCache()
    policy = Policy("topologyKeys", ("topology.kubernetes.io/zone", "*"))
    cache.store(b"k", Cached(b"reply", None, b"q", ()), policy, {"example.com/rack": "r"})
    entry = cache.table[b"k"]
    assert isinstance(entry, TopologyReplies)
    # Label sets of many nodes, none with a label the policy reads: all get that reply.
    many = [{"example.com/rack": f"r{i}"} for i in range(entry.REMEMBERED + 44)]
    (found,) = entry.replies.values()
    held, size = cache.bytes_held, entry.size

    def remember() -> None:
        for labels in many:
            assert cache.choose(entry, labels) == found

    traced_bytes = traced(remember)
    assert len(entry.held) == entry.REMEMBERED  # more are answered, not remembered
    assert cache.bytes_held - held == entry.size - size == entry.REMEMBERED * LABELS_OVERHEAD
    assert 0.8 <= traced_bytes / (cache.bytes_held - held) <= 1.2, traced_bytes
    cache.clear()
    assert cache.bytes_held == 0


def with_options(name: str, options: bytes, size: int = 1232, qid: int = 7) -> bytes:
    """An A query whose OPT record carries the raw `options`."""
    head = query(name, qid=qid)
    opt = b"\0" + pack("!HHIH", 41, size, 0, len(options)) + options
    return head[:11] + b"\x01" + head[12:] + opt


def client_options(rng: random.Random, kind: str) -> bytes:
    """Raw EDNS options a client might send: a cookie, a Client Subnet, or both."""
    cookie = pack("!HH", 10, 8) + rng.randbytes(8)
    subnet = pack("!HHHB", 8, 8, 1, 32) + b"\0" + bytes((10, *rng.randbytes(3)))
    return {"cookie": cookie, "subnet": subnet, "both": subnet + cookie}[kind]


@pytest.mark.parametrize("kind", ["cookie", "subnet", "both"])
def test_the_options_remembered_are_counted_as_held(kind: str) -> None:
    responder = Responder(CONFIG, SNAPSHOT, cache_max_bytes=256 << 20)
    rng = random.Random(5)
    queries = [
        with_options("web.shop.svc.cluster.local", client_options(rng, kind)) for _ in range(5000)
    ]
    responder.respond(queries[0], TCP4, "127.0.0.1")
    cache = responder.cache

    def fill() -> None:
        for data in queries[1:]:
            responder.respond(data, TCP4, "127.0.0.1")

    before = cache.bytes_held
    held = traced(fill)
    assert len(cache.options) == len(queries) + 1  # and the empty set
    assert 0.8 <= held / (cache.bytes_held - before) <= 1.2, (held, cache.bytes_held - before)
    assert cache.options_bytes < cache.bytes_held


@pytest.mark.parametrize(
    ("flood", "count", "length"),
    [
        ("large options, each once", 2000, 8000),  # never remembered, nor their replies
        ("small options, each once", 16_000, 12),  # remembered within a sixteenth of the bound
        ("options just over the memo's size", 8000, REMEMBERED_OPTIONS_BYTES - 3),
    ],
)
def test_distinct_options_hold_no_more_than_the_bound(flood: str, count: int, length: int) -> None:
    bound = 1 << 20
    responder = Responder(CONFIG, SNAPSHOT, cache_max_bytes=bound)
    rng = random.Random(6)
    queries = [
        with_options(
            "web.shop.svc.cluster.local", pack("!HH", 65001, length) + rng.randbytes(length)
        )
        for _ in range(count)
    ]
    for data in queries[:2]:  # the reply and the encoder's memory, filled before
        reply(responder, data)

    def fill() -> None:
        for data in queries:
            responder.respond(data, UDP4, "127.0.0.1")

    held = traced(fill)
    assert held <= bound, (flood, held)
    cache = responder.cache
    assert cache.bytes_held <= bound and cache.options_bytes <= bound // 16, flood
    assert cache.hits >= count  # every query was still a hit: only the memo is bounded
    for data in queries[-3:]:
        reply(responder, data)


# Eviction: a flood never takes more than the bound.


def test_a_flood_of_names_stays_within_the_bound_and_keeps_the_index_in_step() -> None:
    responder = Responder(CONFIG, SNAPSHOT, cache_max_bytes=1 << 20)
    cache = responder.cache
    for i in range(20_000):
        for _ in range(2):  # a template reply is kept when its name is asked again
            responder.respond(query(f"n{i}.nope{i}.svc.cluster.local"), UDP4, "127.0.0.1")
    assert cache.bytes_held <= cache.max_bytes and cache.evictions > 10_000
    assert 0 < cache.entries < 20_000
    # Every word indexes only keys that are still there, and every entry is indexed.
    indexed = set()
    for keys in cache.dependents.values():
        indexed |= {keys} if isinstance(keys, bytes) else keys
    assert indexed == set(cache.table)
    # The oldest went first; the last names asked are still answered from the cache.
    last = query("n19999.nope19999.svc.cluster.local")
    hits = cache.hits
    reply(responder, last)
    assert cache.hits == hits + 1


def test_names_asked_once_hold_no_memory_past_the_bound() -> None:
    bound = 1 << 20
    responder = Responder(CONFIG, SNAPSHOT, cache_max_bytes=bound)
    queries = [query(f"h{i}.example.com.shop.svc.cluster.local") for i in range(60_000)]
    responder.respond(query("web.shop.svc.cluster.local"), UDP4, "127.0.0.1")

    def fill() -> None:
        for data in queries:
            responder.respond(data, UDP4, "127.0.0.1")

    held = traced(fill)
    cache = responder.cache
    # What marks them as asked is set aside in the bound; the few taken for asked again (and
    # kept) are held within it.
    assert held <= bound * 1.2 and cache.room + len(cache.seen) <= bound, held
    assert cache.entries < len(queries) // 10
    again = queries[-1]  # asked again: kept
    assert again[2:] not in cache.table
    reply(responder, again)
    assert again[2:] in cache.table


def test_a_template_reply_is_kept_when_its_name_is_asked_again() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    cache = responder.cache
    once = [query(f"api-{i}.example.com.shop.svc.cluster.local") for i in range(100)]
    first = [reply(responder, message) for message in once]
    assert cache.entries == 0 and all(answer[3] & 0x0F == 3 for answer in first)  # NXDOMAIN
    again = [reply(responder, message) for message in once]
    assert cache.entries == 100 and cache.hits == 0 and again == first
    assert [reply(responder, message) for message in once] == first
    assert cache.hits == 100


def test_an_evicted_reply_is_built_again() -> None:
    responder = Responder(CONFIG, SNAPSHOT, cache_max_bytes=1 << 20)
    first = reply(responder, query("web.shop.svc.cluster.local"))
    for i in range(10_000):
        for _ in range(2):  # asked again: kept, so the first reply is pushed out
            responder.respond(query(f"n{i}.nope.svc.cluster.local"), UDP4, "127.0.0.1")
    assert query("web.shop.svc.cluster.local")[2:].lower() not in responder.cache.table
    assert reply(responder, query("web.shop.svc.cluster.local")) == first


def test_a_reply_over_the_threshold_is_served_but_not_kept() -> None:
    responder = Responder(CONFIG, SNAPSHOT, cache_max_bytes=1 << 20)  # keeps up to 4 KiB
    srv = query("_http._tcp.big.shop.svc.cluster.local", "SRV", 65535)
    answer = reply(responder, srv, TCP4)
    assert len(answer) > responder.cache.max_reply_bytes and not responder.cache.table
    roomy = Responder(CONFIG, SNAPSHOT)  # 32 MiB: keeps up to 64 KiB
    reply(roomy, srv, TCP4)
    assert roomy.cache.entries == 1


def test_a_changed_service_drops_only_its_replies() -> None:
    cache = ReplyCache()
    word_a, word_b = ("svc", "shop", "a"), ("svc", "shop", "b")
    cache.store(b"a", Cached(b"reply-a", None, b"q", (word_a,)))
    cache.store(b"b", Cached(b"reply-b", None, b"q", (word_a, word_b)))
    cache.store(b"c", Cached(b"reply-c", None, b"q", (word_b,)))
    held = cache.bytes_held
    cache.invalidate([word_a])
    assert set(cache.table) == {b"c"} and cache.dependents == {word_b: {b"c"}}
    assert cache.bytes_held == held - cache_size(b"a", b"reply-a", 1) - cache_size(
        b"b", b"reply-b", 2
    )
    cache.clear()
    assert (cache.bytes_held, cache.dependents) == (0, {})


def cache_size(key: bytes, reply: bytes, words: int) -> int:
    return len(key) + Cached(reply, None, b"q", (("w",),) * words).size


# Keys: letter case and buffer size do not multiply entries; each query gets its own reply.


def test_one_entry_serves_every_letter_case_each_in_its_own_case() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    rng = random.Random(2)
    for _ in range(50):
        name = random_case("_http._tcp.big.shop.svc.cluster.local", rng)
        answer = dnslib.DNSRecord.parse(reply(responder, query(name, "SRV", 65535), TCP4))
        assert str(answer.q.qname) == name + "." and str(answer.rr[0].rname) == name + "."
    assert responder.cache.entries == 1


def test_random_case_and_buffer_sizes_take_no_memory() -> None:
    # The flood: SRV for a 100-endpoint service, random case, buffers up to 65535.
    responder = Responder(CONFIG, SNAPSHOT)
    rng = random.Random(3)
    srv = "_http._tcp.big.shop.svc.cluster.local"
    queries = [query(random_case(srv, rng), "SRV", rng.randint(512, 65535)) for _ in range(40)]

    def fill() -> None:
        for data in queries:
            responder.respond(data, UDP4, "127.0.0.1")

    held = traced(fill)
    assert responder.cache.entries == 1
    # What stays is one reply and the encoder's bounded memory of names and records.
    assert held < 8 << 20, held


@pytest.mark.parametrize(
    ("size", "transport"),
    [(None, UDP4), (512, UDP4), (1232, UDP4), (1232, UDP6), (4096, UDP4), (65535, UDP4)]
    + [(None, TCP4), (65535, TCP4)],
)
def test_one_entry_is_cut_to_each_querys_limit(size: int | None, transport: Transport) -> None:
    responder = Responder(CONFIG, SNAPSHOT, max_udp_size=4096)
    srv = "_http._tcp.big.shop.svc.cluster.local"
    for first in (65535, 1232, 512):  # whichever buffer size built the entry
        reply(responder, query(srv, "SRV", first))
        answer = reply(responder, query(srv, "SRV", size), transport)
        header = dnslib.DNSRecord.parse(answer).header
        assert bool(header.tc) == (not transport.tcp)  # 8 KB do not fit 4096 bytes
        responder.cache.clear()
    # A query without OPT record has its own key: the reply has no OPT record either.
    assert responder.cache.hits == (0 if size is None else 3)


def test_the_udp_frontend_folds_case_too() -> None:
    from tests.differential import Frontends

    async def run() -> None:
        responder = Responder(CONFIG, SNAPSHOT)
        frontends = Frontends(responder)
        for name in ("web.shop.svc.cluster.local", "WEB.shop.svc.cluster.local") * 2:
            data = query(name)
            (got,) = frontends.over_udp(UDP4, data, "127.0.0.1")
            want = reference_reply(data, UDP4, "127.0.0.1", responder.snapshot, CONFIG)
            assert got == want
        # Built once; every later query, in either case, is served from the cache.
        assert responder.cache.entries == 1 and responder.cache.hits == 3

    import asyncio

    asyncio.run(run())


# Defaults from the container's memory limit.


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": "178257920\n"}, 178257920),  # cgroup v2, kubeadm's 170Mi
        ({"memory.max": "max\n"}, None),
        ({"memory/memory.limit_in_bytes": "268435456\n"}, 268435456),  # cgroup v1
        ({"memory/memory.limit_in_bytes": "9223372036854771712\n"}, None),  # v1: unlimited
        ({}, None),
    ],
)
def test_the_memory_limit_is_read_from_the_cgroup(
    tmp_path: Any, files: dict[str, str], limit: int | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert container_memory_limit(str(tmp_path)) == limit
    fallback = 32 << 20
    want = fallback if limit is None else max(1 << 20, limit // 8 // 2)
    assert default_max_bytes(8, 2, fallback, str(tmp_path)) == want


@pytest.mark.parametrize("name", ["web.shop.svc.cluster.local", "nope.shop.svc.cluster.local"])
def test_a_query_in_another_case_is_a_hit_and_leaves_the_cached_reply_as_it_was(
    name: str,
) -> None:
    responder = Responder(CONFIG, SNAPSHOT)  # the second name: NXDOMAIN from a template
    first = (name,) if name.startswith("nope") else ()  # kept when asked again
    for asked in (*first, name, name.upper(), name, name.upper(), name):
        reply(responder, query(asked))
    misses = 1 + len(first)
    assert (responder.cache.entries, responder.cache.hits, responder.cache.misses) == (1, 4, misses)
    (entry,) = responder.cache.table.values()
    assert isinstance(entry, Cached) and entry.question == query(name)[12:]
