"""`--loadbalance`: CoreDNS's loadbalance_test.go tables, ported as data, on encoded replies.

Each reply is tried both ways it can come: with names compressed against other records (as an
upstream, or dnslib, writes it: parsed and packed again) and with every record standing alone
(as toposdns writes it: record bytes moved).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dns.message
import dns.rrset
import dnslib
import pytest

from tests.differential import Frontends, frame
from tests.helpers import config_of, snapshot_of
from tests.objects import headless, namespace, pod_locator
from toposdns.serve.cache import Cached
from toposdns.serve.responder import TCP4, UDP4, Responder
from toposdns.wire.codes import AAAA, CNAME, MX, A
from toposdns.wire.decode import record_spans
from toposdns.wire.shuffle import order, shuffle_reply, varies

# loadbalance_test.go TestLoadBalanceRandom: the answer and extra sections it builds, and how
# many CNAME, address and MX records each must hold afterwards, CNAMEs first, MX last.
RANDOM_CASES = [
    {
        "answer": [
            "cname1.region2.skydns.test. 300 IN CNAME cname2.region2.skydns.test.",
            "cname2.region2.skydns.test. 300 IN CNAME cname3.region2.skydns.test.",
            "cname5.region2.skydns.test. 300 IN CNAME cname6.region2.skydns.test.",
            "cname6.region2.skydns.test. 300 IN CNAME endpoint.region2.skydns.test.",
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.1",
            "mx.region2.skydns.test. 300 IN MX 1 mx1.region2.skydns.test.",
            "mx.region2.skydns.test. 300 IN MX 2 mx2.region2.skydns.test.",
            "mx.region2.skydns.test. 300 IN MX 3 mx3.region2.skydns.test.",
        ],
        "extra": [],
        "answer_counts": (4, 1, 3),
        "extra_counts": (0, 0, 0),
    },
    {
        "answer": [
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.1",
            "mx.region2.skydns.test. 300 IN MX 1 mx1.region2.skydns.test.",
            "cname.region2.skydns.test. 300 IN CNAME endpoint.region2.skydns.test.",
        ],
        "extra": [],
        "answer_counts": (1, 1, 1),
        "extra_counts": (0, 0, 0),
    },
    {
        "answer": [
            "mx.region2.skydns.test. 300 IN MX 1 mx1.region2.skydns.test.",
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.1",
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.2",
            "mx.region2.skydns.test. 300 IN MX 1 mx2.region2.skydns.test.",
            "cname2.region2.skydns.test. 300 IN CNAME cname3.region2.skydns.test.",
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.3",
            "mx.region2.skydns.test. 300 IN MX 1 mx3.region2.skydns.test.",
        ],
        "extra": [
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.1",
            "endpoint.region2.skydns.test. 300 IN AAAA ::1",
            "mx.region2.skydns.test. 300 IN MX 1 mx1.region2.skydns.test.",
            "cname2.region2.skydns.test. 300 IN CNAME cname3.region2.skydns.test.",
            "mx.region2.skydns.test. 300 IN MX 1 mx2.region2.skydns.test.",
            "endpoint.region2.skydns.test. 300 IN A 10.240.0.3",
            "endpoint.region2.skydns.test. 300 IN AAAA ::2",
            "mx.region2.skydns.test. 300 IN MX 1 mx3.region2.skydns.test.",
        ],
        "answer_counts": (1, 3, 3),
        "extra_counts": (1, 4, 3),
    },
]

# TestLoadBalanceXFR: a transfer keeps its SOA first and last.
SOA = (
    "skydns.test. 30 IN SOA ns.dns.skydns.test. hostmaster.skydns.test. "
    "1542756695 7200 1800 86400 30"
)
XFR_ANSWER = [
    SOA,
    "mx.region2.skydns.test. 300 IN MX 1 mx1.region2.skydns.test.",
    "endpoint.region2.skydns.test. 300 IN A 10.240.0.1",
    "endpoint.region2.skydns.test. 300 IN A 10.240.0.2",
    "mx.region2.skydns.test. 300 IN MX 1 mx2.region2.skydns.test.",
    "cname2.region2.skydns.test. 300 IN CNAME cname3.region2.skydns.test.",
    "endpoint.region2.skydns.test. 300 IN A 10.240.0.3",
    "mx.region2.skydns.test. 300 IN MX 1 mx3.region2.skydns.test.",
    SOA,
]

# TestRoundRobinDoesNotMutateInput's "addresses only" input.
ADDRESSES = [f"a.example.org. 300 IN A 10.0.0.{i}" for i in range(1, 5)]


def records(lines: list[str]) -> list[dnslib.RR]:
    return [rr for line in lines for rr in dnslib.RR.fromZone(line)]


def message(
    answer: list[str],
    extra: Sequence[str] = (),
    qtype: str = "SRV",
    rcode: int = 0,
    edns: bool = False,
) -> dnslib.DNSRecord:
    reply = dnslib.DNSRecord.question("region2.skydns.test.", qtype).reply()
    reply.header.rcode = rcode
    reply.add_answer(*records(answer))
    reply.add_ar(*records(list(extra)))
    if edns:
        reply.add_ar(dnslib.EDNS0(udp_len=1232))
    return reply


def compressed(reply: dnslib.DNSRecord) -> bytes:
    return bytes(reply.pack())


def standing_alone(reply: dnslib.DNSRecord) -> bytes:
    """The same message with no name compressed."""
    reply.set_header_qa()
    buffer = dnslib.DNSBuffer()
    buffer.encode_name = buffer.encode_name_nocompress
    reply.header.pack(buffer)
    reply.q.pack(buffer)
    for rr in reply.rr + reply.auth + reply.ar:
        rr.pack(buffer)
    return bytes(buffer.data)


Encode = Callable[[dnslib.DNSRecord], bytes]
ENCODINGS: dict[str, Encode] = {"compressed": compressed, "standing-alone": standing_alone}


def pieces(wire: bytes) -> list[bytes]:
    return [wire[start:end] for start, _, end, _, _ in record_spans(wire)]


def draws(seed: int) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        yield rng.getrandbits(16)


def counts(section: list[dnslib.RR]) -> tuple[int, int, int]:
    types = [rr.rtype for rr in section]
    return (
        types.count(CNAME),
        sum(1 for t in types if t in (A, AAAA)),
        types.count(MX),
    )


def grouped(section: list[dnslib.RR]) -> bool:
    """CNAMEs, then other types, then addresses, then MX (loadbalance_test.go countRecords)."""
    rank = {CNAME: 0, A: 2, AAAA: 2, MX: 3}
    ranks = [rank.get(rr.rtype, 1) for rr in section]
    return ranks == sorted(ranks)


@pytest.mark.parametrize("encode", ENCODINGS.values(), ids=ENCODINGS)
@pytest.mark.parametrize("case", RANDOM_CASES, ids=["cnames", "one-of-each", "mixed-extra"])
def test_coredns_random_cases(case: dict[str, Any], encode: Encode) -> None:
    wire = encode(message(case["answer"], case["extra"]))
    source = draws(1)
    for _ in range(20):
        shuffled = shuffle_reply(wire, lambda: next(source))
        assert shuffled is not None
        reply = dnslib.DNSRecord.parse(shuffled)
        assert counts(reply.rr) == case["answer_counts"]
        assert counts(reply.ar) == case["extra_counts"]
        assert grouped(reply.rr) and grouped(reply.ar)
        if encode is standing_alone:  # moved as bytes: the same records, byte for byte
            assert sorted(pieces(shuffled)) == sorted(pieces(wire))
        # Nothing lost, nothing added; CNAMEs and the other records keep their order.
        assert sorted(map(str, reply.rr)) == sorted(map(str, records(case["answer"])))
        assert sorted(map(str, reply.ar)) == sorted(map(str, records(case["extra"])))
        cnames = [str(rr) for rr in records(case["answer"]) if rr.rtype == CNAME]
        assert [str(rr) for rr in reply.rr if rr.rtype == CNAME] == cnames


@pytest.mark.parametrize("qtype", ["AXFR", "IXFR"])
def test_coredns_transfers_are_left_alone(qtype: str) -> None:
    assert shuffle_reply(compressed(message(XFR_ANSWER, qtype=qtype))) is None


@pytest.mark.parametrize("encode", ENCODINGS.values(), ids=ENCODINGS)
def test_every_order_comes_up(encode: Encode) -> None:
    wire = encode(message(ADDRESSES[:3], qtype="A"))
    seen = Counter()
    source = draws(7)
    for _ in range(300):
        reply = dnslib.DNSRecord.parse(shuffle_reply(wire, lambda: next(source)))
        seen[tuple(str(rr.rdata) for rr in reply.rr)] += 1
    assert len(seen) == 6  # 3! orders, each about a sixth of the time
    assert min(seen.values()) > 20


@pytest.mark.parametrize(
    ("types", "numbers", "expected"),
    [
        # roundRobinShuffle: two records swap on an even draw, stay on an odd one.
        ([A, A], [0], [1, 0]),
        ([A, A], [1], [0, 1]),
        # Three or more: place j swaps with j + draw % (n - j).
        ([A, A, A], [1, 1, 0], [1, 2, 0]),
        ([A, A, A], [0, 0, 0], [0, 1, 2]),
        ([AAAA, AAAA, AAAA, AAAA], [3, 5, 1, 9], [3, 0, 1, 2]),
        # Mixed sections regroup: CNAME, other, addresses (A and AAAA together), then MX.
        ([A, CNAME], [], [1, 0]),
        ([MX, A, 33, CNAME, AAAA], [1], [3, 2, 1, 4, 0]),
        ([MX, MX, CNAME], [0], [2, 1, 0]),
    ],
)
def test_order_follows_round_robin_shuffle(
    types: list[int], numbers: list[int], expected: list[int]
) -> None:
    source = iter(numbers)
    assert order(types, lambda: next(source)) == expected


@pytest.mark.parametrize(
    ("types", "moves"),
    [([], False), ([A], False), ([33, 33, 33], False), ([CNAME, A], False), ([A, A], True),
     ([A, AAAA], True), ([MX, MX], True), ([A, CNAME], True), ([33, CNAME], True)],
)  # fmt: skip
def test_varies(types: list[int], moves: bool) -> None:
    assert varies(types) is moves


def test_static_replies_are_none() -> None:
    one = compressed(message(ADDRESSES[:1], qtype="A"))
    assert shuffle_reply(one) is None
    srv = [f"_http._tcp.region2.skydns.test. 30 IN SRV 0 {w} 80 t{w}.skydns.test." for w in (1, 2)]
    assert shuffle_reply(compressed(message(srv))) is None  # SRV order and weights stay
    assert shuffle_reply(compressed(message(ADDRESSES, qtype="A", rcode=3))) is None
    assert shuffle_reply(b"\x00\x01") is None


def test_srv_keeps_its_order_and_shuffles_its_addresses_with_opt_last() -> None:
    srv = [f"_http._tcp.region2.skydns.test. 30 IN SRV 0 33 80 t{i}.skydns.test." for i in range(3)]
    extra = [f"t{i}.skydns.test. 30 IN A 10.0.0.{i}" for i in range(3)]
    wire = standing_alone(message(srv, extra, edns=True))
    source = draws(3)
    seen = set()
    for _ in range(40):
        reply = dnslib.DNSRecord.parse(shuffle_reply(wire, lambda: next(source)))
        assert [str(rr) for rr in reply.rr] == [str(rr) for rr in records(srv)]
        assert reply.ar[-1].rtype == 41
        seen.add(tuple(str(rr.rdata) for rr in reply.ar[:-1]))
    assert len(seen) > 1


def test_a_reply_over_16_kib_is_never_written_with_pointers_out_of_reach() -> None:
    """A reply whose names point into its records is packed again by dnslib, which past 16 KiB
    wraps its pointers round to the wrong names: such a reply keeps its order instead."""
    lines = ["www.skydns.test. 30 IN CNAME endpoint.skydns.test."]
    lines += [f"endpoint.skydns.test. 30 IN A 10.0.{i >> 8}.{i & 255}" for i in range(1100)]
    # Names first written past 16 KiB, each twice: the second points at the first, if it can.
    lines += [f"n{i // 2}.endpoint.skydns.test. 30 IN A 10.1.0.{i % 2}" for i in range(400)]
    reply = dns.message.make_response(dns.message.make_query("www.skydns.test.", "A"))
    reply.answer = [dns.rrset.from_text(*line.split()) for line in lines]
    wire = reply.to_wire()
    assert len(wire) > 0x3FFF
    shuffled = shuffle_reply(wire)
    if shuffled is not None:  # whatever the order, the same records
        parsed = dns.message.from_wire(shuffled)
        assert sorted(map(str, parsed.answer)) == sorted(map(str, reply.answer))


def test_extended_rcode_is_not_noerror() -> None:
    reply = message(ADDRESSES, qtype="A", edns=True)
    reply.ar[-1].ttl = 1 << 24  # BADVERS: rcode 16, its high bits in the OPT record
    assert shuffle_reply(standing_alone(reply)) is None


def test_the_input_is_left_as_it_was() -> None:
    # TestRoundRobinDoesNotMutateInput: bytes cannot change, but the orders must be new lists.
    types = [CNAME, A, A, MX]
    before = list(types)
    for _ in range(50):
        assert sorted(order(types)) == [0, 1, 2, 3]
    assert types == before


# Through the responder: replies whose order varies are sent reordered and never cached, with
# or without EDNS options (a cookie makes the reply spliced from the plain one).
HEADLESS = [
    namespace("shop"),
    *headless("web", "shop", [{"addresses": [f"10.244.0.{i}"]} for i in range(1, 4)]),
]


@pytest.mark.parametrize("cookie", [False, True], ids=["plain", "cookie"])
def test_the_responder_reorders_cached_replies(cookie: bool) -> None:
    responder = Responder(config_of(), snapshot_of(HEADLESS), loadbalance=True)
    query = dnslib.DNSRecord.question("web.shop.svc.cluster.local")
    options = [dnslib.EDNSOption(10, b"\x01" * 8)] if cookie else []
    query.add_ar(dnslib.EDNS0(udp_len=1232, opts=options))
    seen = set()
    for _ in range(30):
        reply = responder.respond(bytes(query.pack()), UDP4, "127.0.0.1")
        assert isinstance(reply, bytes)
        seen.add(tuple(str(rr.rdata) for rr in dnslib.DNSRecord.parse(reply).rr))
    assert len(seen) > 1 and {tuple(sorted(order)) for order in seen} == {
        ("10.244.0.1", "10.244.0.2", "10.244.0.3")
    }
    (entry,) = responder.cache.table.values()  # one entry, served in varying order
    assert isinstance(entry, Cached) and entry.rotation is not None
    one = dnslib.DNSRecord.question("nothere.shop.svc.cluster.local")
    responder.respond(bytes(one.pack()), UDP4, "127.0.0.1")
    assert not any(
        isinstance(e, Cached) and e.rotation for e in list(responder.cache.table.values())[1:]
    )


# Balance: each address comes first equally often, over UDP (the frontend's fast path and the
# responder's) and TCP, plain and topology-filtered.

ZONE_1 = {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1"}


def balanced_service(name: str, family: str, addresses: list[str], **spec: Any) -> list[Any]:
    endpoints = [
        {"addresses": [address], "nodeName": "node-a", "zone": "z1" if i < 4 else "z2"}
        for i, address in enumerate(addresses)
    ]
    return headless(name, "shop", endpoints, family, **spec)


BALANCED = snapshot_of(
    [
        namespace("shop"),
        *balanced_service("six", "IPv4", [f"10.1.0.{i}" for i in range(1, 7)]),
        *balanced_service("six6", "IPv6", [f"fd00::{i}" for i in range(1, 7)]),
        *balanced_service(
            "near",
            "IPv4",
            [f"10.2.0.{i}" for i in range(1, 7)],
            topologyKeys=["topology.kubernetes.io/zone", "*"],
        ),
        pod_locator("client", addresses=["127.0.0.1"], node_labels=ZONE_1),
    ]
)


@pytest.mark.parametrize(
    ("name", "qtype", "count", "replies"),
    [
        ("six", "A", 6, 60),  # a headless service
        ("six6", "AAAA", 6, 30),
        ("near", "A", 4, 40),  # topology-filtered: the 4 endpoints of the client's zone
    ],
)
@pytest.mark.parametrize("edns", [False, True], ids=["plain", "edns"])
def test_every_address_comes_first_equally_often(
    name: str, qtype: str, count: int, replies: int, edns: bool
) -> None:
    async def run() -> Counter[str]:
        responder = Responder(config_of(), BALANCED, loadbalance=True)
        frontends = Frontends(responder)
        firsts: Counter[str] = Counter()
        for i in range(replies):
            query = dnslib.DNSRecord.question(f"{name}.shop.svc.cluster.local", qtype)
            if edns:
                query.add_ar(dnslib.EDNS0(udp_len=1232))
            data = bytes(query.pack())
            if i % 5 == 4:  # now and then over TCP: the same cached reply, the same turns
                (reply,) = frontends.over_tcp(TCP4, [frame(data)], "127.0.0.1")
            else:
                (reply,) = frontends.over_udp(UDP4, data, "127.0.0.1")
            records = dnslib.DNSRecord.parse(reply).rr
            assert len(records) == count
            firsts[str(records[0].rdata)] += 1
        return firsts

    import asyncio

    firsts = asyncio.run(run())
    assert len(firsts) == count and set(firsts.values()) == {replies // count}, firsts
