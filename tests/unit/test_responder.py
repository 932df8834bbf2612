"""The responder: bytes in, bytes out, with its caches and its error replies."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import replace
from struct import pack

import dnslib
import pytest

from tests.differential import reference_reply
from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB, headless
from toposdns.serve.responder import TCP4, UDP4, UDP6, Responder, Transport
from toposdns.wire.decode import record_spans
from toposdns.wire.edns import ECHOED_BYTES

OBJECTS = SHOP_WEB


@pytest.fixture
def responder() -> Responder:
    return Responder(config_of(), snapshot_of(OBJECTS))


def ask(
    responder: Responder,
    name: str,
    qtype: str = "A",
    qclass: str = "IN",
    transport=UDP4,
    edns: dnslib.EDNS0 | None = None,
    qid: int = 7,
) -> dnslib.DNSRecord:
    q = dnslib.DNSRecord(
        dnslib.DNSHeader(id=qid, rd=1),
        q=dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype), getattr(dnslib.CLASS, qclass)),
    )
    if edns is not None:
        q.add_ar(edns)
    data = bytes(q.pack())
    reply = responder.respond(data, transport, "127.0.0.1")
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


def test_answers_and_caches_wire_bytes(responder: Responder) -> None:
    first = ask(responder, "web.shop.svc.cluster.local", qid=1)
    assert [str(rr.rdata) for rr in first.rr] == ["10.96.0.5"]
    assert len(responder.cache.table) == 1
    second = ask(responder, "web.shop.svc.cluster.local", qid=2)  # from the wire cache
    assert second.header.id == 2 and second.rr == first.rr


def test_new_snapshot_drops_cached_replies(responder: Responder) -> None:
    ask(responder, "web.shop.svc.cluster.local")
    moved = [OBJECTS[0], {**OBJECTS[1], "spec": {"clusterIP": "10.96.0.6"}}]
    responder.update(snapshot_of(moved))
    assert not responder.cache.table
    assert [str(rr.rdata) for rr in ask(responder, "web.shop.svc.cluster.local").rr] == [
        "10.96.0.6"
    ]


def test_queries_with_edns_options_share_a_cached_reply_and_get_their_own_options(
    responder: Responder,
) -> None:
    replies = [
        ask(responder, "web.shop.svc.cluster.local", edns=dnslib.EDNS0(opts=[cookie]))
        for cookie in (dnslib.EDNSOption(10, b"12345678"), dnslib.EDNSOption(10, b"abcdefgh"))
    ]
    assert [reply.ar[0].rdata[0].data for reply in replies] == [b"12345678", b"abcdefgh"]
    assert replies[0].rr == replies[1].rr and len(responder.cache.table) == 1


def test_a_query_repeated_with_its_options_gets_its_rendered_reply_until_a_new_snapshot(
    responder: Responder,
) -> None:
    query = dnslib.DNSRecord.question("web.shop.svc.cluster.local")
    query.add_ar(dnslib.EDNS0(udp_len=1232, opts=[dnslib.EDNSOption(10, b"12345678")]))
    data = bytes(query.pack())
    replies = [responder.respond(qid + data[2:], UDP4, "127.0.0.1") for qid in (b"\0\1", b"\0\2")]
    cache = responder.cache
    (rendered,) = cache.renders[UDP4.slot].values()  # kept by the first hit
    assert not cache.renders[TCP4.slot] and cache.bytes_held > cache.rendered_bytes > 0
    third = responder.respond(b"\0\3" + data[2:], UDP4, "127.0.0.1")
    assert third == b"\0\3" + rendered.reply and [r[2:] for r in replies] == [rendered.reply] * 2
    assert (cache.hits, cache.misses) == (2, 1)
    responder.update(snapshot_of([OBJECTS[0], {**OBJECTS[1], "spec": {"clusterIP": "10.96.0.6"}}]))
    assert not any(cache.renders) and cache.rendered_bytes == 0
    reply = responder.respond(data, UDP4, "127.0.0.1")
    assert isinstance(reply, bytes)
    assert [str(rr.rdata) for rr in dnslib.DNSRecord.parse(reply).rr] == ["10.96.0.6"]


def test_transports_share_one_cached_reply(responder: Responder) -> None:
    tcp = ask(responder, "web.shop.svc.cluster.local", transport=TCP4)
    udp = ask(responder, "web.shop.svc.cluster.local")
    assert udp.rr == tcp.rr and len(responder.cache.table) == 1
    assert (responder.cache.hits, responder.cache.misses) == (1, 1)


def test_other_classes_are_refused(responder: Responder) -> None:
    reply = ask(responder, "web.shop.svc.cluster.local", qclass="CH")
    assert (reply.header.rcode, reply.header.aa, len(reply.questions)) == (5, 0, 1)


def test_edns_version_1_gets_badvers(responder: Responder) -> None:
    reply = ask(responder, "web.shop.svc.cluster.local", edns=dnslib.EDNS0(version=1))
    assert reply.header.rcode == 0 and reply.ar[0].ttl >> 24 == 1 and not reply.rr


class Broken(Mapping[tuple[str, str], object]):
    """A snapshot index that fails on every look: a bug in the resolver, as the responder meets
    it (compiled modules cannot be patched, so the fault comes in with the data)."""

    def __getitem__(self, key: tuple[str, str]) -> object:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[tuple[str, str]]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        raise RuntimeError("boom")


def test_internal_error_is_servfail_with_a_log_line(
    responder: Responder, caplog: pytest.LogCaptureFixture
) -> None:
    # Past the templates (which answer before the resolver's try), into the resolver.
    responder.negatives = None
    responder.snapshot = replace(responder.snapshot, services=Broken())
    with caplog.at_level(logging.ERROR, logger="toposdns"):
        reply = ask(responder, "web.shop.svc.cluster.local")
    assert (reply.header.rcode, reply.header.aa, len(reply.questions)) == (2, 0, 1)
    assert "web.shop.svc.cluster.local. A" in caplog.text and "boom" in caplog.text


def test_short_and_response_packets_get_no_reply(responder: Responder) -> None:
    assert responder.respond(b"\x00\x01\x02", UDP4, "127.0.0.1") is None
    response = dnslib.DNSRecord.question("web.shop.svc.cluster.local").reply().pack()
    assert responder.respond(bytes(response), UDP4, "127.0.0.1") is None


# PADDING and the other echoed options: as CoreDNS echoes them, within what every limit holds.

#: A headless service of 60 addresses: its A reply passes 512 bytes, so it is cut to a limit.
WIDE = [
    *SHOP_WEB,
    *headless("wide", "shop", [{"addresses": [f"10.3.0.{i + 1}"]} for i in range(60)]),
]


def opt_query(name: str, options: list[tuple[int, bytes]], size: int, qid: int = 7) -> bytes:
    """An A query whose OPT record (buffer `size`) carries `options` as given."""
    header = pack("!6H", qid, 0x0100, 1, 0, 0, 1)
    question = b"".join(bytes((len(label),)) + label.encode() for label in name.split("."))
    rdata = b"".join(pack("!HH", code, len(value)) + value for code, value in options)
    return (
        header
        + question
        + b"\0\0\x01\0\x01"
        + b"\0"
        + pack("!HHIH", 41, size, 0, len(rdata))
        + rdata
    )


def echoed_options(reply: bytes) -> list[tuple[int, bytes]]:
    """The options of a reply's OPT record, as (code, data)."""
    for _, ttl_at, end, rtype, _ in record_spans(reply):
        if rtype == 41:
            rdata, options = reply[ttl_at + 6 : end], []
            while rdata:
                code, length = int.from_bytes(rdata[:2]), int.from_bytes(rdata[2:4])
                options.append((code, rdata[4 : 4 + length]))
                rdata = rdata[4 + length :]
            return options
    raise AssertionError("no OPT record")


@pytest.mark.parametrize(
    ("padding", "size", "transport", "limit", "echoed"),
    [
        (0, 1232, UDP4, 1232, True),  # an empty PADDING option, as clients send it
        (100, 1232, UDP4, 1232, True),  # a query padded to a 128-byte block
        (ECHOED_BYTES - 16, 512, UDP4, 512, True),  # with the cookie, the most echoed
        (ECHOED_BYTES - 15, 512, UDP4, 512, False),  # one more byte: left out
        (1200, 1232, UDP4, 1232, False),
        (60_000, 1232, UDP4, 1232, False),  # larger than any UDP limit: left out
        (60_000, 65535, UDP6, 1232, False),  # --max-udp-size bounds the buffer first
        (60_000, 65535, TCP4, 65535, False),
    ],
)
def test_padding_is_echoed_only_within_every_limit(
    padding: int, size: int, transport: Transport, limit: int, echoed: bool
) -> None:
    responder = Responder(config_of(), snapshot_of(WIDE))
    cookie = (10, b"c" * 8)
    for name in ("web.shop.svc.cluster.local", "wide.shop.svc.cluster.local"):
        for qid in (1, 2):  # built, then from the cache: both as the reference writes it
            data = opt_query(name, [cookie, (12, bytes(padding))], size, qid)
            reply = responder.respond(data, transport, "127.0.0.1")
            assert isinstance(reply, bytes)
            expected = reference_reply(
                data, transport, "127.0.0.1", responder.snapshot, config_of()
            )
            assert reply == expected and len(reply) <= limit, (name, len(reply))
            want = [cookie, (12, bytes(padding))] if echoed else [cookie]
            assert echoed_options(reply) == want
