"""The responder: bytes in, bytes out, with its caches and its error replies."""

from __future__ import annotations

import logging

import dnslib
import pytest

import toposdns.serve.responder as responder_module
from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB
from toposdns.serve.responder import TCP4, UDP4, Responder

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


def test_internal_error_is_servfail_with_a_log_line(
    responder: Responder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(responder_module, "resolve", broken)
    with caplog.at_level(logging.ERROR, logger="toposdns"):
        reply = ask(responder, "web.shop.svc.cluster.local")
    assert (reply.header.rcode, reply.header.aa, len(reply.questions)) == (2, 0, 1)
    assert "web.shop.svc.cluster.local. A" in caplog.text and "boom" in caplog.text


def test_short_and_response_packets_get_no_reply(responder: Responder) -> None:
    assert responder.respond(b"\x00\x01\x02", UDP4, "127.0.0.1") is None
    response = dnslib.DNSRecord.question("web.shop.svc.cluster.local").reply().pack()
    assert responder.respond(bytes(response), UDP4, "127.0.0.1") is None
