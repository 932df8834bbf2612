"""Answers too large for one DNS message: a client gets what CoreDNS gives, the whole answer cut
to its buffer (TC set), and the server builds no more records than any reply can hold.

The reference is the whole answer (`resolve` with no limit that could stop it) encoded for the
query's limit, which cuts it as miekg/dns `Truncate` does. The capped answer must give the
same bytes, through the encoder and through the responder, first time and as a cache hit.
"""

from __future__ import annotations

import logging
from typing import Any

import dnslib
import pytest

from tests.differential import reference_reply
from tests.helpers import config_of, snapshot_of
from tests.objects import endpoint, endpoint_slice, namespace, service
from toposdns.metrics import ANSWERING
from toposdns.resolve.answer import Answer
from toposdns.resolve.resolver import resolve
from toposdns.serve.responder import TCP4, UDP4, UDP6, Responder, Transport
from toposdns.store.snapshot import Snapshot
from toposdns.wire.codes import NOERROR, TC, A
from toposdns.wire.decode import decode_query
from toposdns.wire.encode import (
    FRAGMENT_LIMIT_V4,
    MAX_TCP_SIZE,
    bound_buffer,
    encode_forms,
    encode_opt,
    encode_reply,
    fit,
    truncate,
    udp_limit,
)
from toposdns.wire.records import RR

#: No reply is this large: `resolve` with it builds the whole answer.
UNBOUNDED = 1 << 40
#: The largest UDP reply of the responders here (`--max-udp-size`), so that 4096 is asked too.
MAX_UDP = 4096
#: (endpoints, ports, address family, slices): headless services, each `s<E>x<P><v>`.
SHAPES = [
    (10, 1, "IPv4", 1),
    (10, 100, "IPv4", 1),
    (100, 1, "IPv4", 1),
    (100, 10, "IPv6", 1),
    (100, 100, "IPv4", 1),
    (300, 30, "IPv6", 1),
    (1000, 1, "IPv4", 1),
    (1000, 1, "IPv6", 1),
    (1000, 10, "IPv4", 1),
    (1000, 100, "IPv4", 1),
    (1000, 1, "IPv4", 6),  # 6,000 addresses: an A answer over 64 KiB too
]
#: How each is asked: (transport, EDNS buffer or None, with a COOKIE option).
ASKED: list[tuple[Transport, int | None, bool]] = [
    (UDP4, None, False),  # 512 bytes
    (UDP4, 1232, False),
    (UDP6, 1232, True),
    (UDP4, 4096, True),  # compressed under the IPv4 fragment limit
    (UDP4, 65535, False),  # bounded to MAX_UDP
    (TCP4, None, False),
    (TCP4, 1232, True),
]


def service_name(endpoints: int, ports: int, family: str, slices: int) -> str:
    return f"s{endpoints}x{ports}{family[-1]}" + (f"m{slices}" if slices > 1 else "")


def address(family: str, index: int, ports: int, slice_index: int) -> str:
    if family == "IPv4":
        return f"10.{slice_index * 4 + (index >> 8)}.{index & 255}.{ports}"
    return f"fd00:{ports:x}:{slice_index:x}::{index:x}"


def big_service(endpoints: int, ports: int, family: str, slices: int) -> list[dict[str, Any]]:
    """A headless service whose slices hold `endpoints` each, every third with a hostname (some
    shared: one SRV target with several addresses), and `ports` each."""
    name = service_name(endpoints, ports, family, slices)
    listed = [{"name": f"p{j}", "port": 1000 + j, "protocol": "TCP"} for j in range(ports)]
    objects = [service(name, "shop", cluster_ip="None")]
    for index in range(slices):
        members = [
            endpoint(
                address(family, i, ports, index), **({"hostname": f"h{i % 7}"} if i % 3 else {})
            )
            for i in range(1, endpoints + 1)
        ]
        objects.append(
            endpoint_slice(
                name, "shop", members, name=f"{name}-{index}", ports=listed, address_type=family
            )
        )
    return objects


def shared_address() -> list[dict[str, Any]]:
    """Ten slices of 500 endpoints, all at 10.99.0.1 under distinct hostnames: its PTR answer
    would name 5,000 targets."""
    objects = [service("same", "shop", cluster_ip="None")]
    for index in range(10):
        members = [endpoint("10.99.0.1", hostname=f"x{index}-{i}") for i in range(500)]
        objects.append(endpoint_slice("same", "shop", members, name=f"same-{index}"))
    return objects


def own_address() -> list[dict[str, Any]]:
    """A slice of 3,000 endpoints, one at the server's own address: the apex NS answer has
    each as glue."""
    members = [endpoint(f"10.98.{i >> 8}.{i & 255}", hostname=f"n{i}") for i in range(3000)]
    members.append(endpoint("10.1.0.53"))
    return [
        service("dns", "shop", cluster_ip="None"),
        endpoint_slice("dns", "shop", members, name="dns-0"),
    ]


CONFIG = config_of(zones=["cluster.local", "in-addr.arpa"], ns_addresses=["10.1.0.53"])


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    objects = [namespace("shop")]
    for shape in SHAPES:
        objects += big_service(*shape)
    return snapshot_of(objects + shared_address() + own_address())


QUESTIONS = [
    *((service_name(*shape), qtype) for shape in SHAPES for qtype in ("SRV", "A", "AAAA")),
    ("_p0._tcp." + service_name(1000, 100, "IPv4", 1), "SRV"),  # one port: 1,000 records
    ("h3." + service_name(1000, 100, "IPv4", 1), "SRV"),  # 143 addresses under one hostname
    ("h3." + service_name(1000, 1, "IPv6", 1), "AAAA"),
    ("1.0.99.10.in-addr.arpa", "PTR"),
    ("cluster.local", "NS"),
    ("ns.dns.cluster.local", "A"),
]


def message(
    name: str,
    qtype: str,
    buffer: int | None,
    cookie: bool = False,
    qid: int = 7,
    options: list[dnslib.EDNSOption] | None = None,
) -> bytes:
    """A query; with an OPT record when `buffer` is given, holding a COOKIE, or `options`."""
    query = dnslib.DNSRecord(
        dnslib.DNSHeader(id=qid, rd=1), q=dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype))
    )
    if buffer is not None:
        if options is None:
            options = [dnslib.EDNSOption(10, b"\x01" * 8)] if cookie else []
        query.add_ar(dnslib.EDNS0(udp_len=buffer, opts=options))
    return bytes(query.pack())


def limits(transport: Transport, data: bytes) -> tuple[int, int]:
    """The reply's size limit and UDP fragment limit for a query, as the server bounds them."""
    query = bound_buffer(decode_query(data), MAX_UDP)
    return (MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)), transport.fragment_limit


def whole_answers(snapshot: Snapshot) -> dict[tuple[str, str], Answer]:
    return {
        (name, qtype): resolve(
            tuple(name.split(".")), getattr(dnslib.QTYPE, qtype), snapshot, CONFIG, limit=UNBOUNDED
        )
        for name, qtype in QUESTIONS
    }


@pytest.fixture(scope="module")
def whole(snapshot: Snapshot) -> dict[tuple[str, str], Answer]:
    return whole_answers(snapshot)


@pytest.mark.parametrize(("name", "qtype"), QUESTIONS)
def test_the_capped_answer_is_the_whole_answer_cut(
    snapshot: Snapshot, whole: dict[tuple[str, str], Answer], name: str, qtype: str
) -> None:
    full = whole[(name, qtype)]
    labels = tuple(name.split("."))
    code = getattr(dnslib.QTYPE, qtype)
    # The responder's cache serves every buffer from one reply: asked in every way, twice.
    responder = Responder(CONFIG, snapshot, max_udp_size=MAX_UDP)
    for transport, buffer, cookie in ASKED:
        data = message(name, qtype, buffer, cookie)
        limit, fragment = limits(transport, data)
        query = bound_buffer(decode_query(data), MAX_UDP)
        expected = encode_reply(query, full, limit, fragment)
        for room in (limit, MAX_TCP_SIZE):
            capped = resolve(labels, code, snapshot, CONFIG, limit=room)
            assert encode_reply(query, capped, limit, fragment) == expected, (transport, room)
        reference = reference_reply(
            data, transport, "127.0.0.1", snapshot, CONFIG, max_udp_size=MAX_UDP
        )
        assert reference == expected, (transport, buffer)
        hits = responder.cache.hits
        assert responder.respond(data, transport, "127.0.0.1") == expected, (transport, buffer)
        again = data[:1] + b"\x08" + data[2:]  # another ID: the same cached reply
        assert responder.respond(again, transport, "127.0.0.1") == again[:2] + expected[2:]
        assert responder.cache.hits >= hits + 1, "a repeat is served from the cache"
        # A query that is not plain is never cached: resolved for its own limit.
        odd = data + b"garbage after the question"
        assert responder.respond(odd, transport, "127.0.0.1") == expected, (transport, buffer)


@pytest.mark.parametrize(("name", "qtype"), QUESTIONS)
def test_no_more_records_are_built_than_a_reply_can_hold(
    snapshot: Snapshot, whole: dict[tuple[str, str], Answer], name: str, qtype: str
) -> None:
    full = whole[(name, qtype)]
    capped = resolve(tuple(name.split(".")), getattr(dnslib.QTYPE, qtype), snapshot, CONFIG)
    built = len(capped.answer) + len(capped.additional)
    # Every record takes at least 12 bytes compressed (a pointer, type, class, TTL, length):
    # the records that make up 64 KiB, and the one that passes it.
    assert built <= MAX_TCP_SIZE // 12 + 2
    if len(full.answer) + len(full.additional) > MAX_TCP_SIZE // 12 + 2:
        assert built < len(full.answer) + len(full.additional)
    # The weight of SRV records counts every endpoint and port, built or not.
    if capped.answer and qtype == "SRV":
        assert capped.answer[0] == full.answer[0]


def test_the_slice_of_a_thousand_endpoints_and_a_hundred_ports(
    snapshot: Snapshot, caplog: pytest.LogCaptureFixture
) -> None:
    """The tenant's slice: every SRV query over UDP and TCP gets NOERROR, TC and as many records
    as its buffer holds; no internal error is logged or counted; a repeat is a cache hit."""
    name = service_name(1000, 100, "IPv4", 1) + ".shop.svc.cluster.local"
    capped = resolve(tuple(name.split(".")), 33, snapshot, CONFIG)
    assert len(capped.answer) < 2000 and len(capped.additional) < 20
    panics = ANSWERING.get_sample_value("coredns_panics_total")
    responder = Responder(CONFIG, snapshot)
    caplog.set_level(logging.INFO, "toposdns")
    for transport, buffer, size in ((UDP4, 1232, 1232), (TCP4, 1232, MAX_TCP_SIZE)):
        for qid in (1, 2):
            data = message(name, "SRV", buffer, cookie=False, qid=qid)
            reply = responder.respond(data, transport, "127.0.0.1")
            assert isinstance(reply, bytes)
            parsed = dnslib.DNSRecord.parse(reply)
            assert parsed.header.rcode == NOERROR and parsed.header.tc, transport
            assert size - 100 < len(reply) <= size
            assert len(parsed.rr) > (10 if size < 2000 else 1000)
    assert responder.cache.misses == 1 and responder.cache.hits == 3
    assert len(responder.cache.table) == 1
    assert ANSWERING.get_sample_value("coredns_panics_total") == panics
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_legitimate_thousand_endpoint_service_is_a_hit_on_repeat(snapshot: Snapshot) -> None:
    """1,000 endpoints, one port: its SRV reply is over 64 KiB uncompressed, so it goes out
    compressed, whole over TCP and cut with TC over UDP, and it is cached."""
    name = service_name(1000, 1, "IPv4", 1) + ".shop.svc.cluster.local"
    full = resolve(tuple(name.split(".")), 33, snapshot, CONFIG)  # all of it fits 64 KiB
    responder = Responder(CONFIG, snapshot)
    for qid in range(1, 5):
        transport = TCP4 if qid % 2 else UDP4
        reply = responder.respond(message(name, "SRV", 1232, False, qid), transport, "127.0.0.1")
        assert isinstance(reply, bytes)
        parsed = dnslib.DNSRecord.parse(reply)
        assert parsed.header.rcode == NOERROR and parsed.header.tc != transport.tcp
        if transport.tcp:
            assert len(reply) < 60_000
            assert (len(parsed.rr), len(parsed.ar)) == (len(full.answer), len(full.additional) + 1)
    assert (responder.cache.misses, responder.cache.hits) == (1, 3)


def test_no_count_passes_65535() -> None:
    """An answer of 70,000 records (more than a header can count) is cut, not a struct.error."""
    records = tuple(
        RR(("a", "example"), A, 5, f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}")
        for i in range(70_000)
    )
    answer = Answer(NOERROR, records, (), records[:10])
    query = decode_query(message("a.example", "A", 1232))
    for limit in (512, 1232, MAX_TCP_SIZE):
        reply = encode_reply(query, answer, limit, FRAGMENT_LIMIT_V4)
        parsed = dnslib.DNSRecord.parse(reply)
        assert parsed.header.tc and limit - 16 < len(reply) <= limit
        assert (parsed.header.a, parsed.header.ar) == (len(parsed.rr), 1)
    whole, compressed = encode_forms(query, answer, 412)
    assert compressed is whole and MAX_TCP_SIZE - 16 < len(whole) <= MAX_TCP_SIZE
    assert whole[2] & (TC >> 8)


OPTIONS: dict[str, list[dnslib.EDNSOption] | None] = {
    "no EDNS": None,
    "EDNS": [],
    "COOKIE": [dnslib.EDNSOption(10, b"\x01" * 8)],
    "ECS": [dnslib.EDNSOption(8, bytes((0, 1, 24, 0, 10, 0, 0)))],
}


@pytest.mark.parametrize("limit", [512, 1000, 1232, 4096, 40_000, MAX_TCP_SIZE])
@pytest.mark.parametrize("options", OPTIONS.values(), ids=OPTIONS.keys())
def test_a_packed_reply_is_cut_as_the_encoder_cuts(
    limit: int, options: list[dnslib.EDNSOption] | None
) -> None:
    """`fit` cuts the one compressed form a reply over 64 KiB is cached in, reading only the
    records up to its cut: the bytes `truncate` gives, and the encoder's for that limit."""
    records = tuple(RR(("w", "example"), A, 5, f"10.0.{i >> 8}.{i & 255}") for i in range(6000))
    answer = Answer(NOERROR, records)
    data = message("w.example", "A", None if options is None else 65535, options=options)
    query = decode_query(data)
    # Cached as a query without options has it: its OPT record bare (serve/responder.py).
    plain = query if query.edns is None else query._replace(edns=query.edns._replace(options=()))
    whole, compressed = encode_forms(plain, answer, 412)
    assert compressed is whole
    own = b"" if query.edns is None else encode_opt(query.edns, NOERROR, query.ecs)
    expected = encode_reply(query, answer, limit)
    cut = fit(whole[2:], whole[2:], own, limit, 0)
    assert cut is not None and whole[:2] + cut == expected
    kept = 0 if query.edns is None else 11
    assert truncate(whole[: len(whole) - kept] + own, limit) == expected
