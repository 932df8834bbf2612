"""`--autopath`: CoreDNS's autopath tests as data (autopath_test.go, kubernetes/autopath_test.go),
the search path and the CNAME rule, then the walk through the responder with a table upstream."""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

import dnslib
import pytest

from tests.helpers import config_of, snapshot_of
from tests.objects import namespace, pod_locator, service
from toposdns.resolve.answer import Answer
from toposdns.resolve.autopath import (
    AutopathOptions,
    candidates,
    completed,
    first_candidate,
    parse_search_domains,
    search_path,
)
from toposdns.serve.responder import TCP4, UDP4, Responder, Transport
from toposdns.wire.codes import CNAME, NOERROR, NXDOMAIN, SERVFAIL, A, Name
from toposdns.wire.records import RR


def labels(text: str) -> Name:
    return tuple(text.rstrip(".").split(".")) if text.strip(".") else ()


def texts(names: tuple[Name, ...] | None) -> list[str] | None:
    return None if names is None else [".".join(name) for name in names]


# kubernetes/autopath.go AutoPath, with BenchmarkAutoPath's mock: zone cluster.local, a pod in
# test-namespace, resolv.conf search example.com internal.example.com cluster.local.
def test_coredns_search_path() -> None:
    node = tuple(labels(d) for d in ("example.com", "internal.example.com", "cluster.local"))
    assert texts(search_path("test-namespace", labels("cluster.local"), node)) == [
        "test-namespace.svc.cluster.local",
        "svc.cluster.local",
        "cluster.local",
        "example.com",
        "internal.example.com",
        "cluster.local",
        "",  # the sentinel: the name as asked
    ]
    # Zone "." (served as the root): NS.svc., svc., .
    assert texts(search_path("ns", (), ())) == ["ns.svc", "svc", "", ""]


CONFIG = config_of(zones=["cluster.local", "in-addr.arpa"])
SEARCH = parse_search_domains("search corp.example\n", "test")


# autopath_test.go TestInSearchPath, for a pod in `default`: does the name start the walk?
@pytest.mark.parametrize(
    ("qname", "walks"),
    [
        ("google.com", False),
        # CoreDNS says true, then dnsutil.TrimZone fails and the reply is SERVFAIL; here the
        # name itself is not completed (it gets its plain answer).
        ("default.svc.cluster.local.", False),
        ("a.default.svc.cluster.local.", True),
        ("a.b.svc.cluster.local.", False),
        ("4.3.2.1.in-addr.arpa.", False),
    ],
)
def test_coredns_in_search_path(qname: str, walks: bool) -> None:
    assert (candidates(labels(qname), "default", CONFIG, SEARCH) is not None) is walks


def test_candidates_keep_the_case_asked_of_the_name() -> None:
    found = candidates(
        labels("Api.Example.com.Default.SVC.cluster.local"), "default", CONFIG, SEARCH
    )
    assert texts(found) == [
        "Api.Example.com.default.svc.cluster.local",
        "Api.Example.com.svc.cluster.local",
        "Api.Example.com.cluster.local",
        "Api.Example.com.corp.example",
        "Api.Example.com",
    ]
    first = first_candidate(labels("x.Shop.svc.cluster.local"), CONFIG)
    assert first == labels("x.shop.svc.cluster.local")
    assert first_candidate(labels("shop.svc.cluster.local"), CONFIG) is None


@pytest.mark.parametrize(
    ("text", "domains"),
    [
        ("nameserver 10.0.0.2\nsearch Corp.Example. example.\noptions ndots:1\n",
         ["corp.example", "example"]),
        ("search a.example\nsearch b.example\n", ["b.example"]),  # the last line counts
        ("domain c.example\n", ["c.example"]),
        ("search a.example\ndomain d.example\n", ["d.example"]),
        ("nameserver 10.0.0.2\n", []),
        ("search .\n", []),
    ],
)  # fmt: skip
def test_search_domains_of_a_resolv_conf(text: str, domains: list[str]) -> None:
    assert texts(parse_search_domains(text, "resolv.conf")) == domains


def record(text: str) -> RR:
    name, ttl, _, rtype, data = text.split()
    return RR(
        labels(name),
        {"A": A, "CNAME": CNAME}[rtype],
        int(ttl),
        data if rtype == "A" else labels(data),
    )


# cname.go, as autopath_test.go checks it: a CNAME from the name asked to the owner of the first
# record named otherwise leads the answer, with that record's TTL.
@pytest.mark.parametrize(
    ("original", "records", "expected"),
    [
        ("b.example.org", ["b.com 3600 IN A 127.0.0.53"],
         ["b.example.org 3600 IN CNAME b.com", "b.com 3600 IN A 127.0.0.53"]),
        ("a.example.com", ["a.example.com 3600 IN A 127.0.0.53"],
         ["a.example.com 3600 IN A 127.0.0.53"]),
        ("A.Example.com", ["a.example.com 3600 IN A 127.0.0.53"],  # letter case aside
         ["a.example.com 3600 IN A 127.0.0.53"]),
        # An ExternalName found as asked: the CNAME rule still leads with one to the target.
        ("ext.default.svc.cluster.local",
         ["ext.default.svc.cluster.local 5 IN CNAME api.example.com",
          "api.example.com 60 IN A 192.0.2.1"],
         ["ext.default.svc.cluster.local 60 IN CNAME api.example.com",
          "ext.default.svc.cluster.local 5 IN CNAME api.example.com",
          "api.example.com 60 IN A 192.0.2.1"]),
        ("empty.example", [], []),  # NODATA stays NODATA
    ],
)  # fmt: skip
def test_coredns_cnamer(original: str, records: list[str], expected: list[str]) -> None:
    answer = Answer(NOERROR, tuple(record(line) for line in records))
    result = completed(answer, labels(original))
    assert result.answer == tuple(record(line) for line in expected)


# The walk, through the responder. The cluster: namespaces shop and other, a ClusterIP web in
# other, an ExternalName ext in other; a pod of shop at 10.244.9.9, a node at 10.0.0.1.
HOST_A = {"kubernetes.io/hostname": "node-a"}
OBJECTS: list[dict[str, Any]] = [
    namespace("shop"),
    namespace("other"),
    service("web", "other", cluster_ip="10.96.0.5"),
    service("web", "shop", cluster_ip="10.96.0.6"),
    service("ext", "other", cluster_ip=None, ports=(), type="ExternalName", externalName="b.com"),
    pod_locator("client", addresses=["10.244.9.9"], node_labels=HOST_A),
    pod_locator("node-a", "toposdns", addresses=["10.0.0.1"], node_labels=HOST_A, role="node"),
]
POD, NODE, STRANGER = "10.244.9.9", "10.0.0.1", "10.0.0.99"
# autopath_test.go's nextHandler map, upstream: the names it has (A 127.0.0.53, TTL 3600), and
# one with three addresses; every other name is NXDOMAIN.
UPSTREAM = {
    "b.com": ["127.0.0.53"],
    "a.example.com": ["127.0.0.53"],
    "lb.com": ["192.0.2.1", "192.0.2.2", "192.0.2.3"],
}
WALK_CONFIG = CONFIG
WALK = AutopathOptions(True, search=tuple(labels(d) for d in ("example.org", "example.com", "com")))


class TableUpstream:
    """An upstream that answers from UPSTREAM, or not at all when `silent`."""

    def __init__(self, silent: bool = False, outside: frozenset[str] = frozenset()) -> None:
        self.silent = silent
        #: Sources outside --forward-allow.
        self.outside = outside
        self.asked: list[str] = []

    def admits(self, source: str) -> bool:
        return source not in self.outside

    async def forward(
        self, data: bytes, tcp: bool, limit: int, opt: bytes = b"", hits: object = None
    ) -> bytes | int:
        query = dnslib.DNSRecord.parse(data)
        name = str(query.q.qname).rstrip(".")
        self.asked.append(name)
        if self.silent:
            return SERVFAIL  # what the forwarder says when no upstream answered
        reply = query.reply()
        reply.header.aa, reply.header.ra = 0, 1
        if name.lower() in UPSTREAM:
            if query.q.qtype == A:
                for address in UPSTREAM[name.lower()]:
                    reply.add_answer(*dnslib.RR.fromZone(f"{name}. 3600 IN A {address}"))
        else:
            reply.header.rcode = NXDOMAIN
            reply.add_auth(
                *dnslib.RR.fromZone("com. 900 IN SOA a.gtld. nstld. 1 1800 900 604800 900")
            )
        return bytes(reply.pack())


def ask(
    responder: Responder,
    name: str,
    source: str = POD,
    qtype: str = "A",
    transport: Transport = UDP4,
    ecs: str | None = None,
) -> dnslib.DNSRecord:
    query = dnslib.DNSRecord(
        dnslib.DNSHeader(id=77, rd=1), q=dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype))
    )
    if ecs is not None:
        query.add_ar(dnslib.EDNS0(udp_len=1232, opts=[dnslib.EDNSOption(8, ecs_option(ecs))]))
    pending = responder.respond(bytes(query.pack()), transport, source)
    reply = pending if isinstance(pending, bytes) or pending is None else asyncio.run(pending)
    assert reply is not None
    return dnslib.DNSRecord.parse(reply)


def ecs_option(address: str) -> bytes:
    return b"\x00\x01\x20\x00" + bytes(int(part) for part in address.split("."))


def answer_of(reply: dnslib.DNSRecord) -> list[str]:
    return [" ".join(str(rr).split()) for rr in reply.rr]


@pytest.fixture
def upstream() -> TableUpstream:
    return TableUpstream()


@pytest.fixture
def responder(upstream: TableUpstream) -> Responder:
    return Responder(WALK_CONFIG, snapshot_of(OBJECTS), forwarder=upstream, autopath=WALK)


@pytest.mark.parametrize("transport", [UDP4, TCP4], ids=["udp", "tcp"])
def test_coredns_search_path_expansion(
    responder: Responder, upstream: TableUpstream, transport: Transport
) -> None:
    # autopath_test.go TestAutoPath: b is found at b.com, behind a CNAME from the name asked.
    reply = ask(responder, "b.shop.svc.cluster.local", transport=transport)
    assert reply.header.rcode == NOERROR and reply.header.id == 77
    assert str(reply.q.qname) == "b.shop.svc.cluster.local."
    assert answer_of(reply) == [
        "b.shop.svc.cluster.local. 3600 IN CNAME b.com.",
        "b.com. 3600 IN A 127.0.0.53",
    ]
    assert upstream.asked == ["b.example.org", "b.example.com", "b.com"]
    assert reply.header.ra == 1 and reply.header.aa == 0  # the upstream's reply, reshaped


def test_coredns_no_search_path_expansion(responder: Responder, upstream: TableUpstream) -> None:
    # a.example.com is not below shop.svc.cluster.local: forwarded as it is.
    reply = ask(responder, "a.example.com")
    assert answer_of(reply) == ["a.example.com. 3600 IN A 127.0.0.53"]
    assert upstream.asked == ["a.example.com"]


def test_nothing_found_gives_the_first_reply(responder: Responder, upstream: TableUpstream) -> None:
    reply = ask(responder, "c.shop.svc.cluster.local")
    assert reply.header.rcode == NXDOMAIN and reply.header.aa == 1 and not reply.rr
    assert [str(rr.rname) for rr in reply.auth] == ["cluster.local."]
    assert upstream.asked == ["c.example.org", "c.example.com", "c.com", "c"]


def test_found_in_the_cluster_needs_no_upstream(
    responder: Responder, upstream: TableUpstream
) -> None:
    reply = ask(responder, "web.other.shop.svc.cluster.local", qtype="A")
    assert answer_of(reply) == [
        "web.other.shop.svc.cluster.local. 5 IN CNAME web.other.svc.cluster.local.",
        "web.other.svc.cluster.local. 5 IN A 10.96.0.5",
    ]
    assert reply.header.aa == 1 and upstream.asked == []


def test_an_external_name_on_the_way_is_chased(
    responder: Responder, upstream: TableUpstream
) -> None:
    reply = ask(responder, "ext.other.shop.svc.cluster.local")
    assert answer_of(reply) == [
        "ext.other.shop.svc.cluster.local. 5 IN CNAME ext.other.svc.cluster.local.",
        "ext.other.svc.cluster.local. 5 IN CNAME b.com.",
        "b.com. 3600 IN A 127.0.0.53",
    ]
    assert upstream.asked == ["b.com"]


@pytest.mark.parametrize("transport", [UDP4, TCP4], ids=["udp", "tcp"])
def test_a_pod_outside_forward_allow_is_completed_from_the_zones_only(
    transport: Transport,
) -> None:
    upstream = TableUpstream(outside=frozenset({POD}))
    responder = Responder(WALK_CONFIG, snapshot_of(OBJECTS), forwarder=upstream, autopath=WALK)
    # Found in the cluster on the way: completed as for any pod.
    found = ask(responder, "web.other.shop.svc.cluster.local", transport=transport)
    assert answer_of(found)[-1] == "web.other.svc.cluster.local. 5 IN A 10.96.0.5"
    # An ExternalName on the way: its CNAME alone, as with no upstream.
    external = ask(responder, "ext.other.shop.svc.cluster.local", transport=transport)
    assert external.header.rcode == NOERROR and external.header.aa == 1
    assert answer_of(external) == [
        "ext.other.shop.svc.cluster.local. 5 IN CNAME ext.other.svc.cluster.local.",
        "ext.other.svc.cluster.local. 5 IN CNAME b.com.",
    ]
    # A name outside the zones ends the walk: the reply to the name asked.
    nothing = ask(responder, "b.shop.svc.cluster.local", transport=transport)
    assert nothing.header.rcode == NXDOMAIN and nothing.header.aa == 1 and not nothing.rr
    assert str(nothing.q.qname) == "b.shop.svc.cluster.local."
    assert upstream.asked == []


def test_any_type_is_completed(responder: Responder) -> None:
    # autopath.go has no type switch: b.com has no AAAA, so the upstream's NODATA is the answer.
    reply = ask(responder, "b.shop.svc.cluster.local", qtype="AAAA")
    assert reply.header.rcode == NOERROR and not reply.rr
    assert str(reply.q.qname) == "b.shop.svc.cluster.local."


@pytest.mark.parametrize("source", [NODE, STRANGER])
def test_only_pods_placed_by_their_locator(
    responder: Responder, upstream: TableUpstream, source: str
) -> None:
    reply = ask(responder, "b.shop.svc.cluster.local", source=source)
    assert reply.header.rcode == NXDOMAIN and upstream.asked == []


def test_other_namespaces_are_not_completed(responder: Responder, upstream: TableUpstream) -> None:
    assert ask(responder, "b.other.svc.cluster.local").header.rcode == NXDOMAIN
    assert upstream.asked == []


def test_names_that_exist_keep_their_plain_cached_reply(responder: Responder) -> None:
    plain = ask(responder, "web.shop.svc.cluster.local", source=STRANGER)
    assert answer_of(plain) == ["web.shop.svc.cluster.local. 5 IN A 10.96.0.6"]
    assert len(responder.cache.table) == 1  # the same for every client: cached
    assert answer_of(ask(responder, "web.shop.svc.cluster.local")) == answer_of(plain)


def test_completable_names_are_not_cached_for_everyone(responder: Responder) -> None:
    assert ask(responder, "b.shop.svc.cluster.local", source=STRANGER).header.rcode == NXDOMAIN
    assert not responder.cache.table
    assert ask(responder, "b.shop.svc.cluster.local").rr  # so the pod still gets its walk


def test_letter_case_as_coredns_writes_it(responder: Responder) -> None:
    # Found as asked, but the walk asks `Web.shop.svc.cluster.local`: the records carry that name.
    reply = ask(responder, "Web.SHOP.svc.cluster.local")
    assert str(reply.q.qname) == "Web.SHOP.svc.cluster.local."
    assert answer_of(reply) == ["Web.shop.svc.cluster.local. 5 IN A 10.96.0.6"]


def test_a_silent_upstream_ends_the_walk_with_servfail() -> None:
    responder = Responder(
        WALK_CONFIG, snapshot_of(OBJECTS), forwarder=TableUpstream(silent=True), autopath=WALK
    )
    reply = ask(responder, "b.shop.svc.cluster.local")
    assert reply.header.rcode == SERVFAIL and str(reply.q.qname) == "b.shop.svc.cluster.local."


def test_without_upstreams_a_name_outside_the_zones_is_servfail() -> None:
    # CoreDNS: the kubernetes plugin has no next plugin for it, an error.
    responder = Responder(WALK_CONFIG, snapshot_of(OBJECTS), autopath=WALK)
    assert ask(responder, "b.shop.svc.cluster.local").header.rcode == SERVFAIL
    found = ask(responder, "web.other.shop.svc.cluster.local")  # found before that: answered
    assert found.header.rcode == NOERROR and len(found.rr) == 2


def test_ecs_places_the_pod_behind_a_trusted_forwarder(upstream: TableUpstream) -> None:
    responder = Responder(
        WALK_CONFIG,
        snapshot_of(OBJECTS),
        ecs_trust=(ipaddress.ip_network("10.0.0.0/24"),),
        forwarder=upstream,
        autopath=WALK,
    )
    reply = ask(responder, "web.other.shop.svc.cluster.local", source=NODE, ecs=POD)
    assert len(reply.rr) == 2
    (option,) = [o for o in reply.ar[0].rdata if o.code == 8]
    assert option.data[3] == 32  # scope: the answer depends on the address


def test_loadbalance_keeps_the_cname_first(upstream: TableUpstream) -> None:
    responder = Responder(
        WALK_CONFIG, snapshot_of(OBJECTS), forwarder=upstream, loadbalance=True, autopath=WALK
    )
    orders = set()
    for _ in range(30):
        reply = ask(responder, "lb.shop.svc.cluster.local")
        assert [rr.rtype for rr in reply.rr] == [CNAME, A, A, A]
        orders.add(tuple(str(rr.rdata) for rr in reply.rr[1:]))
    assert len(orders) > 1
