"""Server blocks and chains: which block a name goes to, CoreDNS's plugin order, and the
plugins the kubernetes block runs before its own, through the responder."""

from __future__ import annotations

import dnslib
import pytest

from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB
from toposdns.resolve.answer import Answer
from toposdns.serve.blocks import BlockConfig, Blocks
from toposdns.serve.chain import ORDER, Next, Reply, Request, chain
from toposdns.serve.query_metrics import QueryMetrics
from toposdns.serve.responder import TCP4, UDP4, Responder
from toposdns.wire.codes import DS, A
from toposdns.wire.decode import decode_query
from toposdns.wire.encode import encode_reply
from toposdns.wire.records import RR


def block(*zones: str) -> BlockConfig:
    return BlockConfig(tuple(tuple(zone.split(".")) if zone != "." else () for zone in zones))


def chained(tag: str) -> Next:
    return lambda request: tag.encode()


# (the kubernetes block's zones, the other blocks' zones, the name, qtype, where it goes:
# "k8s", another block's tag, or None for REFUSED)
FOUND = [
    ((".",), ("consul.local",), "web.consul.local", A, "consul.local"),
    ((".",), ("consul.local",), "WEB.Consul.LOCAL", A, "consul.local"),
    ((".",), ("consul.local",), "consul.local", A, "consul.local"),
    ((".",), ("consul.local",), "example.org", A, "k8s"),
    ((".",), ("consul.local",), "local", A, "k8s"),
    (("cluster.local",), (".",), "web.shop.svc.cluster.local", A, "k8s"),
    (("cluster.local",), (".",), "example.org", A, "."),
    (("cluster.local",), ("example.org",), "example.net", A, None),
    (("cluster.local",), ("example.org",), "", A, None),
    # The longest zone wins, whichever block it is.
    ((".", "svc.cluster.local"), ("cluster.local",), "a.svc.cluster.local", A, "k8s"),
    ((".", "svc.cluster.local"), ("cluster.local",), "a.pod.cluster.local", A, "cluster.local"),
    # DS for a block's own zone is its parent's to answer (CoreDNS's server), when it has one.
    ((".",), ("consul.local",), "consul.local", DS, "k8s"),
    ((".",), ("consul.local",), "a.consul.local", DS, "consul.local"),
    (("consul.local",), (), "consul.local", DS, "k8s"),
]


@pytest.mark.parametrize(("main", "others", "name", "qtype", "expected"), FOUND)
def test_a_name_goes_to_the_block_of_its_longest_zone(
    main: tuple[str, ...], others: tuple[str, ...], name: str, qtype: int, expected: str | None
) -> None:
    zones = [tuple(zone.split(".")) if zone != "." else () for zone in main]
    blocks = Blocks(zones, [(block(zone), chained(zone)) for zone in others])
    found = blocks.find(tuple(name.split(".")) if name else (), qtype)
    if expected is None:
        assert found is None
    elif expected == "k8s":
        assert found is not None and found[1] is None
    else:
        assert found is not None and found[1] is not None
        assert found[1](None) == expected.encode()  # type: ignore[arg-type]


def test_the_plugin_order_is_coredns_s() -> None:
    wanted = ["prometheus", "errors", "log", "acl", "any", "loadbalance", "cache", "rewrite"]
    wanted += ["autopath", "template", "hosts", "kubernetes", "loop", "forward"]
    assert sorted(wanted, key=ORDER.index) == wanted


class Hosts:
    """A stand-in for a plugin before kubernetes: answers one name, passes the rest on."""

    name = "hosts"

    def __init__(self) -> None:
        self.asked: list[str] = []

    def serve(self, request: Request, next: Next) -> Reply:
        query = request.query
        self.asked.append(".".join(query.name))
        if tuple(label.lower() for label in query.name) != ("node1",) or query.qtype != A:
            return next(request)
        answer = Answer(0, (RR(query.name, A, 60, "192.0.2.1"),))
        return encode_reply(query, answer, request.limit, request.transport.fragment_limit, 0)


def ask(responder: Responder, name: str, transport=UDP4, edns: bool = False) -> dnslib.DNSRecord:
    query = dnslib.DNSRecord.question(name, "A")
    if edns:
        query.add_ar(dnslib.EDNS0(udp_len=1232))
    reply = responder.respond(bytes(query.pack()), transport, "127.0.0.1")
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


@pytest.mark.parametrize("edns", [False, True])
def test_the_plugins_before_kubernetes_answer_first_and_pass_the_rest(edns: bool) -> None:
    hosts = Hosts()
    responder = Responder(config_of(), snapshot_of(SHOP_WEB), plugins=[hosts])
    for transport in (UDP4, TCP4):
        node = ask(responder, "node1", transport, edns)
        assert [str(rr.rdata) for rr in node.rr] == ["192.0.2.1"] and node.header.aa
    # Passed on: the kubernetes block answers, and caches, its names as before.
    web = ask(responder, "web.shop.svc.cluster.local", edns=edns)
    assert [str(rr.rdata) for rr in web.rr] == ["10.96.0.5"]
    assert len(responder.cache.table) == 1
    asked = len(hosts.asked)
    assert ask(responder, "web.shop.svc.cluster.local", edns=edns).rr == web.rr
    assert len(hosts.asked) == asked  # a hit: no plugin runs
    # A name the cluster does not have is still NXDOMAIN, once the plugin has said no.
    missing = ask(responder, "nothere.shop.svc.cluster.local", edns=edns)
    assert missing.header.rcode == dnslib.RCODE.NXDOMAIN
    assert "nothere.shop.svc.cluster.local" in hosts.asked
    # Every plugin is asked once per query.
    assert hosts.asked.count("nothere.shop.svc.cluster.local") == 1


def test_a_chains_reply_is_counted_under_the_plugin_that_wrote_it() -> None:
    metrics = QueryMetrics("dns://:53")
    responder = Responder(config_of(), snapshot_of(SHOP_WEB), metrics=metrics, plugins=[Hosts()])
    ask(responder, "node1")
    ask(responder, "web.shop.svc.cluster.local")
    plugins = {labels[4] for labels in metrics.totals}
    assert plugins == {"hosts", "kubernetes"}


def test_a_plugin_that_passes_a_request_on_is_not_the_writer() -> None:
    class Passing:
        name = "rewrite"

        def serve(self, request: Request, next: Next) -> Reply:
            return next(request)

    link = chain([Passing(), Hosts()])
    query = dnslib.DNSRecord.question("node1", "A")
    data = bytes(query.pack())
    request = Request(decode_query(data), data, UDP4, "127.0.0.1")
    assert isinstance(link(request), bytes) and request.written_by == "hosts"
    # Passed on to the end: SERVFAIL, as CoreDNS's plugin.NextOrFailure.
    passed = Request(decode_query(data), data, UDP4, "127.0.0.1")
    ended = chain([Passing()])(passed)
    assert isinstance(ended, bytes) and dnslib.DNSRecord.parse(ended).header.rcode == 2
