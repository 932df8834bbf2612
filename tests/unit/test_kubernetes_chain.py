"""The kubernetes server block as a chain of plugins: its handlers in CoreDNS's order, the
kubernetes handler's answers and what it passes on, `any` and `loadbalance` as handlers, and
one count per query at the chain's head."""

from __future__ import annotations

import asyncio
from pathlib import Path

import dnslib
import pytest

from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB
from tests.unit.test_fallthrough import KUBEADM, FakeForwarder
from tests.unit.test_hosts import hosts_of
from tests.unit.test_rewrite import handler
from toposdns.resolve.autopath import AutopathOptions
from toposdns.serve.any import Any
from toposdns.serve.chain import Reply, Request, chain
from toposdns.serve.forward import Forwarding
from toposdns.serve.kubernetes import Kubernetes
from toposdns.serve.loadbalance import LoadBalance
from toposdns.serve.placement import Placer
from toposdns.serve.query_metrics import QueryMetrics
from toposdns.serve.responder import UDP4, Responder
from toposdns.wire.codes import ANY, NOERROR, NXDOMAIN, PTR, SERVFAIL, A
from toposdns.wire.decode import decode_query

CLIENT = "127.0.0.1"
AUTOPATH = AutopathOptions(enabled=True, search=("svc.cluster.local",))


def handlers_of(**options: object) -> list[str]:
    responder = Responder(KUBEADM, snapshot_of(SHOP_WEB), **options)  # type: ignore[arg-type]
    return [handler.name for handler in responder.handlers]


# (the responder's options, the kubernetes block's handlers in the order they run)
SHAPES = [
    ({}, ["kubernetes"]),
    ({"forwarder": FakeForwarder()}, ["any", "kubernetes", "forward"]),
    ({"forwarder": FakeForwarder(), "forward_any": True}, ["kubernetes", "forward"]),
    ({"loadbalance": True}, ["loadbalance", "kubernetes"]),
    ({"autopath": AUTOPATH}, ["autopath", "kubernetes"]),
    ({"plugins": [Forwarding(FakeForwarder())]}, ["kubernetes", "forward"]),  # type: ignore
    (
        {"forwarder": FakeForwarder(), "loadbalance": True, "autopath": AUTOPATH},
        ["any", "loadbalance", "autopath", "kubernetes", "forward"],
    ),
]


@pytest.mark.parametrize(("options", "expected"), SHAPES)
def test_the_kubernetes_block_is_a_chain_in_coredns_order(
    options: dict[str, object], expected: list[str]
) -> None:
    assert handlers_of(**options) == expected


def request_of(name: str, qtype: int = A) -> Request:
    query = dnslib.DNSRecord.question(name, dnslib.QTYPE[qtype])
    data = bytes(query.pack())
    return Request(decode_query(data), data, UDP4, CLIENT)


def passed_on(request: Request) -> Reply:
    return b"passed on"


# (name, qtype, what the kubernetes handler does: passed on, or the rcode it answers)
KUBERNETES = [
    ("web.shop.svc.cluster.local", A, NOERROR),
    ("nothere.shop.svc.cluster.local", A, NXDOMAIN),
    ("example.org", A, "passed on"),  # in no zone of its: forward's
    ("8.8.8.8.in-addr.arpa", PTR, "passed on"),  # falls through (kubeadm's fallthrough)
    ("5.0.96.10.in-addr.arpa", PTR, NOERROR),  # the service's address
]


@pytest.mark.parametrize(("name", "qtype", "expected"), KUBERNETES)
def test_the_kubernetes_handler_answers_its_zones_and_passes_the_rest(
    name: str, qtype: int, expected: int | str
) -> None:
    snapshot = snapshot_of(SHOP_WEB)
    counted: list[int] = []
    handler = Kubernetes(
        KUBEADM,
        lambda: snapshot,
        Placer((), snapshot),
        FakeForwarder(),  # type: ignore[arg-type]
        lambda qtype, answer, unplaced: counted.append(qtype),
    )
    reply = handler.serve(request_of(name, qtype), passed_on)
    if isinstance(expected, str):
        assert reply == expected.encode()
        return
    assert isinstance(reply, bytes)
    parsed = dnslib.DNSRecord.parse(reply)
    assert (parsed.header.rcode, parsed.header.aa) == (expected, 1)


def test_without_upstreams_what_falls_through_is_the_zones_answer() -> None:
    snapshot = snapshot_of(SHOP_WEB)
    handler = Kubernetes(KUBEADM, lambda: snapshot, Placer((), snapshot), None, lambda *_: None)
    reply = handler.serve(request_of("8.8.8.8.in-addr.arpa", PTR), passed_on)
    assert isinstance(reply, bytes)
    assert dnslib.DNSRecord.parse(reply).header.rcode == SERVFAIL


# (qtype, `any` in the chain, what forward does: "minimal", "forwarded")
ANY_CASES = [
    (ANY, True, "minimal"),
    (ANY, False, "forwarded"),
    (A, True, "forwarded"),
]


@pytest.mark.parametrize(("qtype", "minimal", "expected"), ANY_CASES)
def test_any_marks_what_forward_must_not_send_upstream(
    qtype: int, minimal: bool, expected: str
) -> None:
    forwarder = FakeForwarder()
    handlers = [Any(), Forwarding(forwarder)] if minimal else [Forwarding(forwarder)]  # type: ignore
    request = request_of("example.org", qtype)
    reply = chain(handlers)(request)
    if expected == "minimal":
        assert isinstance(reply, bytes) and request.written_by == "any"
        assert [rr.rtype for rr in dnslib.DNSRecord.parse(reply).rr] == [13]  # HINFO
        assert not forwarder.sent
    else:
        assert not isinstance(reply, bytes) and reply is not None
        asyncio.run(reply)  # type: ignore[arg-type]
        assert len(forwarder.sent) == 1 and request.written_by == "forward"


def test_loadbalance_shuffles_the_replies_of_the_plugins_after_it(tmp_path: Path) -> None:
    # CoreDNS's loadbalance wraps what the rest of the chain writes: hosts' replies too.
    entries = "".join(f"192.0.2.{i} many\n" for i in range(1, 9))
    hosts = hosts_of(tmp_path, entries)
    responder = Responder(config_of(), snapshot_of(SHOP_WEB), loadbalance=True, plugins=[hosts])
    orders = set()
    for _ in range(20):
        reply = responder.respond(
            bytes(dnslib.DNSRecord.question("many", "A").pack()), UDP4, CLIENT
        )
        assert isinstance(reply, bytes)
        records = dnslib.DNSRecord.parse(reply).rr
        assert sorted(str(rr.rdata) for rr in records) == sorted(entries.split()[::2])
        orders.add(tuple(str(rr.rdata) for rr in records))
    assert len(orders) > 1
    assert LoadBalance().serve(request_of("x"), lambda _: None) is None  # no reply: none


def test_each_query_down_the_chain_is_counted_once_under_its_writer(tmp_path: Path) -> None:
    metrics = QueryMetrics("dns://:53")
    hosts = hosts_of(tmp_path, "192.0.2.1 node1\n", fallthrough=((),))
    forwarder = FakeForwarder()
    responder = Responder(
        KUBEADM,
        snapshot_of(SHOP_WEB),
        forwarder=forwarder,  # type: ignore[arg-type]
        metrics=metrics,
        plugins=[hosts],
    )
    for name in ("node1", "web.shop.svc.cluster.local", "web.shop.svc.cluster.local"):
        reply = responder.respond(bytes(dnslib.DNSRecord.question(name, "A").pack()), UDP4, CLIENT)
        assert isinstance(reply, bytes)
    pending = responder.respond(
        bytes(dnslib.DNSRecord.question("example.org", "A").pack()), UDP4, CLIENT
    )
    assert pending is not None and not isinstance(pending, bytes)
    asyncio.run(pending)  # type: ignore[arg-type]
    assert {labels[4] for labels in metrics.totals} == {"hosts", "kubernetes", "forward"}
    # The cluster name was made and cached by the cache-filling path (a miss, counted there
    # and not again at the chain's head), then a hit; the forwarded name is a miss too; hosts'
    # reply is not the `cache` metrics'.
    assert len(responder.cache.table) == 1
    assert metrics.cache_passes == 2


def test_a_reply_a_rewrite_rule_changed_is_never_served_from_the_cache(tmp_path: Path) -> None:
    # The rule leaves the query as it is and changes the reply: the reply cache, in front of
    # the chain, must not keep the kubernetes answer it changed, or the next ask gets that.
    rewrite = handler(tmp_path, "rewrite ttl web.shop.svc.cluster.local 30")
    responder = Responder(config_of(), snapshot_of(SHOP_WEB), plugins=[rewrite])
    query = bytes(dnslib.DNSRecord.question("web.shop.svc.cluster.local", "A").pack())
    for _ in range(3):
        reply = responder.respond(query, UDP4, CLIENT)
        assert isinstance(reply, bytes)
        assert [rr.ttl for rr in dnslib.DNSRecord.parse(reply).rr] == [30]
    assert not responder.cache.table
    # A name no rule touches is made and cached as without plugins.
    other = bytes(dnslib.DNSRecord.question("nothere.shop.svc.cluster.local", "A").pack())
    responder.respond(other, UDP4, CLIENT)
    assert len(responder.cache.table) == 1


def test_a_rewritten_any_question_still_gets_the_minimal_answer(tmp_path: Path) -> None:
    rewrite = handler(tmp_path, "rewrite name exact a.example b.example")
    forwarder = FakeForwarder()
    responder = Responder(
        KUBEADM,
        snapshot_of(SHOP_WEB),
        forwarder=forwarder,
        plugins=[rewrite],  # type: ignore
    )
    reply = responder.respond(
        bytes(dnslib.DNSRecord.question("a.example", "ANY").pack()), UDP4, CLIENT
    )
    assert isinstance(reply, bytes) and not forwarder.sent
    parsed = dnslib.DNSRecord.parse(reply)
    assert [(str(rr.rname), rr.rtype) for rr in parsed.rr] == [("a.example.", 13)]
