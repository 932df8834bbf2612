"""`--fallthrough`: CoreDNS's fall_test.go and setup_test.go tables as data, then which answers
fall through (handler.go: only a name error, and before the sync check) and what the responder
does with them, with and without upstreams."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import dnslib
import pytest

from tests.helpers import config_of, kubernetes, snapshot_of
from tests.objects import SHOP_WEB
from toposdns.config import Reading
from toposdns.options import ConfigError
from toposdns.resolve.resolver import match_zone, resolve
from toposdns.serve.forward import Forwarder
from toposdns.serve.responder import TCP4, UDP4, Responder, Transport
from toposdns.store.builder import StoreBuilder
from toposdns.store.convert import convert_object
from toposdns.wire.codes import AXFR, NOERROR, NXDOMAIN, PTR, REFUSED, SERVFAIL, TXT, A
from toposdns.wire.edns import split_query

# fall_test.go TestFallthrough: (--fallthrough values, name, falls through). Its served zones
# are left open there; here they must hold the fallthrough zones.
FALL_ZONES = "foo.com,bar.com,foo.net"
FALL_CASES = [
    ([], "foo.com", False),  # the zero value: no fallthrough
    ([""], "foo.net", True),  # no zones: every zone
    (["foo.com,bar.com"], "foo.net", False),
    (["foo.com,bar.com"], "bar.com", True),
    (["foo.com", "bar.com"], "www.Bar.COM", True),  # repeated flag; a name below, any case
    (["."], "anything.foo.net", True),
]

# setup_test.go: `fallthrough` alone is the root zone; with zones, those zones in order.
SETUP_ZONES = "cluster.local,ip6.arpa,inaddr.arpa,foo.com"
SETUP_CASES = [
    ([""], [()]),
    (["ip6.arpa,inaddr.arpa,foo.com"], [("ip6", "arpa"), ("inaddr", "arpa"), ("foo", "com")]),
    (["Foo.Com.", "foo.com"], [("foo", "com")]),  # normalized, once
    (["arpa"], [("arpa",)]),  # a zone above served zones holds their names too
]


@pytest.mark.parametrize(("values", "name", "falls"), FALL_CASES)
def test_coredns_fall_table(values: list[str], name: str, falls: bool) -> None:
    zones = kubernetes({"--zone": [FALL_ZONES], "--fallthrough": values}).fallthrough
    lower = tuple(name.lower().split("."))
    assert (match_zone(lower, zones) is not None) is falls


@pytest.mark.parametrize(("values", "zones"), SETUP_CASES)
def test_coredns_setup_table(values: list[str], zones: list[tuple[str, ...]]) -> None:
    got = kubernetes({"--zone": [SETUP_ZONES], "--fallthrough": values}).fallthrough
    assert list(got) == zones


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["example.org"], "holds no name of the served zones (cluster.local, in-addr.arpa"),
        (["inaddr.arpa"], "name one of them or a zone inside one"),  # a typo
        (["a..b"], "not a domain name"),
    ],
)
def test_bad_fallthrough_zones(values: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match="fallthrough") as error:
        kubernetes({"--fallthrough": values})
    assert message in str(error.value)


OBJECTS = SHOP_WEB
REVERSE = config_of(zones=["cluster.local", "in-addr.arpa", "ip6.arpa"])
KUBEADM = replace(REVERSE, fallthrough=(("in-addr", "arpa"), ("ip6", "arpa")))
EVERYWHERE = replace(REVERSE, fallthrough=((),))
UNKNOWN_V6 = ".".join("0123456789abcdef0123456789abcdef") + ".ip6.arpa"

# (config, name, qtype, synced, rcode of the plain answer or None when it falls through)
CASES = [
    (KUBEADM, "8.8.8.8.in-addr.arpa", PTR, True, None),
    (KUBEADM, "5.0.96.10.in-addr.arpa", PTR, True, NOERROR),  # the cluster has it
    (KUBEADM, UNKNOWN_V6, PTR, True, None),
    (KUBEADM, "10.in-addr.arpa", PTR, True, None),  # not a whole address: a name error too
    (KUBEADM, "8.8.8.8.in-addr.arpa", A, True, None),  # any type: the fake A lookup fails
    (KUBEADM, "nothere.shop.svc.cluster.local", A, True, NXDOMAIN),  # not a fallthrough zone
    (KUBEADM, "8.8.8.8.in-addr.arpa", PTR, False, None),  # before the sync check
    (REVERSE, "8.8.8.8.in-addr.arpa", PTR, True, NXDOMAIN),  # no --fallthrough
    (REVERSE, "8.8.8.8.in-addr.arpa", PTR, False, SERVFAIL),
    (EVERYWHERE, "nothere.shop.svc.cluster.local", A, True, None),
    (EVERYWHERE, "nothere.svc.cluster.local", A, True, None),  # no such namespace
    (EVERYWHERE, "web.shop.svc.cluster.local", A, True, NOERROR),
    (EVERYWHERE, "web.shop.svc.cluster.local", TXT, True, NOERROR),  # NODATA stays here
    (EVERYWHERE, "cluster.local", AXFR, True, 5),  # REFUSED: transfers never fall
]


@pytest.mark.parametrize(("config", "name", "qtype", "synced", "rcode"), CASES)
def test_what_falls_through(config, name: str, qtype: int, synced: bool, rcode: int | None) -> None:
    answer = resolve(tuple(name.split(".")), qtype, snapshot_of(OBJECTS, synced), config)
    if rcode is None:
        assert answer.fallthrough and answer.rcode == SERVFAIL and not answer.authoritative
        assert not answer.answer and not answer.authority
    else:
        assert answer.rcode == rcode and not answer.fallthrough


class FakeForwarder:
    """Answers every query with one A record, and keeps what it was sent."""

    def __init__(self, refused: frozenset[str] = frozenset()) -> None:
        self.sent: list[tuple[bytes, bool]] = []
        self.refused = refused
        self.scoped = False  # forwards every name (FROM `.`, no `except`)

    def admits(self, source: str) -> bool:
        return source not in self.refused

    async def forward(
        self, data: bytes, tcp: bool, limit: int, opt: bytes = b"", hits: object = None
    ) -> bytes:
        self.sent.append((data, tcp))
        reply = dnslib.DNSRecord.parse(data).reply()
        reply.add_answer(dnslib.RR("dns.google.", dnslib.QTYPE.PTR, rdata=dnslib.PTR("dns.google")))
        return bytes(reply.pack())


def ptr_query(name: str, qid: int = 9) -> bytes:
    query = dnslib.DNSRecord(dnslib.DNSHeader(id=qid, rd=1), q=dnslib.DNSQuestion(name, PTR))
    query.add_ar(dnslib.EDNS0(udp_len=1232))
    return bytes(query.pack())


@pytest.mark.parametrize("transport", [UDP4, TCP4], ids=["udp", "tcp"])
def test_the_upstreams_answer_what_falls(transport: Transport) -> None:
    forwarder = FakeForwarder()
    responder = Responder(KUBEADM, snapshot_of(OBJECTS), forwarder=forwarder)
    data = ptr_query("8.8.8.8.in-addr.arpa")
    pending = responder.respond(data, transport, "127.0.0.1")
    assert not isinstance(pending, bytes) and pending is not None
    reply = dnslib.DNSRecord.parse(asyncio.run(pending))
    assert [str(rr.rdata) for rr in reply.rr] == ["dns.google."]
    assert forwarder.sent == [(data, transport.tcp)]  # the client's own query, as CoreDNS's
    # What the cluster has is answered here and never forwarded.
    known = responder.respond(ptr_query("5.0.96.10.in-addr.arpa"), transport, "127.0.0.1")
    assert isinstance(known, bytes)
    assert str(dnslib.DNSRecord.parse(known).rr[0].rdata) == "web.shop.svc.cluster.local."
    assert len(forwarder.sent) == 1


def test_without_upstreams_what_falls_is_servfail() -> None:
    responder = Responder(KUBEADM, snapshot_of(OBJECTS))
    reply = responder.respond(ptr_query("8.8.8.8.in-addr.arpa", qid=3), UDP4, "127.0.0.1")
    assert isinstance(reply, bytes)
    parsed = dnslib.DNSRecord.parse(reply)
    # plugin.NextOrFailure's error, written by the server: no AA, no records, the OPT echoed.
    assert parsed.header.rcode == SERVFAIL and parsed.header.id == 3 and not parsed.header.aa
    assert not parsed.rr and not parsed.auth and [rr.rtype for rr in parsed.ar] == [41]


def cache_key(query: bytes) -> bytes:
    split = split_query(query)
    assert split is not None
    return split[0]


def test_a_cached_servfail_goes_when_the_address_appears() -> None:
    # Without upstreams the SERVFAIL is cached like any reply, under what the lookup read.
    builder = StoreBuilder()
    for item in OBJECTS:
        builder.put(convert_object(item))
    responder = Responder(KUBEADM, builder.snapshot(serial=1))
    query = ptr_query("4.4.8.8.in-addr.arpa")
    first = responder.respond(query, UDP4, "127.0.0.1")
    assert isinstance(first, bytes) and dnslib.DNSRecord.parse(first).header.rcode == SERVFAIL
    other = ptr_query("5.0.96.10.in-addr.arpa")
    responder.respond(other, UDP4, "127.0.0.1")
    assert set(responder.cache.table) == {cache_key(query), cache_key(other)}
    service = {**OBJECTS[1], "metadata": {"name": "dns", "namespace": "shop"}}
    builder.put(convert_object({**service, "spec": {"clusterIP": "8.8.4.4"}}))
    responder.update(builder.snapshot(serial=2))
    assert set(responder.cache.table) == {cache_key(other)}  # only what read 8.8.4.4
    second = responder.respond(query, UDP4, "127.0.0.1")
    assert isinstance(second, bytes)
    assert [str(rr.rdata) for rr in dnslib.DNSRecord.parse(second).rr] == [
        "dns.shop.svc.cluster.local."
    ]


@pytest.mark.parametrize(
    ("name", "forward_any"),
    [("example.com", False), ("8.8.8.8.in-addr.arpa", False), ("example.com", True)],
    ids=["outside", "fallen-through", "--forward-any"],
)
def test_any_for_the_upstreams_gets_rfc_8482s_minimal_answer(name: str, forward_any: bool) -> None:
    forwarder = FakeForwarder()
    responder = Responder(
        KUBEADM, snapshot_of(OBJECTS), forwarder=forwarder, forward_any=forward_any
    )
    query = dnslib.DNSRecord(dnslib.DNSHeader(id=4, rd=1), q=dnslib.DNSQuestion(name, 255))
    query.add_ar(dnslib.EDNS0(udp_len=4096))
    pending = responder.respond(bytes(query.pack()), UDP4, "127.0.0.1")
    if forward_any:
        assert not isinstance(pending, bytes) and pending is not None
        asyncio.run(pending)
        assert len(forwarder.sent) == 1
        return
    assert isinstance(pending, bytes) and not forwarder.sent
    reply = dnslib.DNSRecord.parse(pending)
    # CoreDNS's `any`: one HINFO, TTL 8482, not authoritative; the OPT echoed (at 1232).
    assert (reply.header.rcode, reply.header.aa, reply.header.id) == (0, 0, 4)
    (hinfo,) = reply.rr
    assert (hinfo.rtype, hinfo.ttl, str(hinfo.rname)) == (13, 8482, name + ".")
    assert b"\x0dANY obsoleted\x0cSee RFC 8482\x00\x00\x29" in pending  # then the OPT
    assert [(rr.rtype, rr.rclass) for rr in reply.ar] == [(41, 1232)]


# --forward-allow: (allowed networks, source, forwarded). Empty: every source, as CoreDNS's.
ALLOW_CASES = [
    ("", "203.0.113.9", True),
    ("10.244.0.0/16,10.0.0.0/24", "10.244.3.7", True),
    ("10.244.0.0/16,10.0.0.0/24", "10.0.0.255", True),
    ("10.244.0.0/16,10.0.0.0/24", "10.0.1.1", False),
    ("10.244.0.0/16", "fd00::1", False),
    ("fd00:10:244::/48", "fd00:10:244:3::9", True),
    ("fd00:10:244::/48", "fe80::1%eth0", False),
    ("127.0.0.1", "127.0.0.1", True),  # an address alone is its /32
    ("10.244.0.0/16", "not-an-address", False),
]


@pytest.mark.parametrize(("allow", "source", "admitted"), ALLOW_CASES)
def test_forward_allow_admits(allow: str, source: str, admitted: bool) -> None:
    options = Reading().read_flags({"--forward-allow": allow or None}).done().forward
    forwarder = Forwarder([], allow=options.allow)
    assert forwarder.admits(source) is admitted
    assert forwarder.admits(source) is admitted  # decided once, remembered


def test_forward_allow_names_a_bad_network() -> None:
    with pytest.raises(ConfigError, match=r"^--forward-allow 10\.0\.0\.0/8,nowhere: 'nowhere'"):
        Reading().read_flags({"--forward-allow": "10.0.0.0/8,nowhere"})


@pytest.mark.parametrize("transport", [UDP4, TCP4], ids=["udp", "tcp"])
def test_sources_outside_forward_allow_are_refused_upstream_names(transport: Transport) -> None:
    forwarder = FakeForwarder(refused=frozenset({"198.51.100.7"}))
    responder = Responder(KUBEADM, snapshot_of(OBJECTS), forwarder=forwarder)
    outside = dnslib.DNSRecord.question("example.com", "A")
    for query in (bytes(outside.pack()), ptr_query("8.8.8.8.in-addr.arpa")):  # and fallen
        reply = responder.respond(query, transport, "198.51.100.7")
        assert isinstance(reply, bytes)
        assert dnslib.DNSRecord.parse(reply).header.rcode == REFUSED
    assert not forwarder.sent
    # The cluster's own names are still answered to anyone.
    known = responder.respond(ptr_query("5.0.96.10.in-addr.arpa"), transport, "198.51.100.7")
    assert isinstance(known, bytes) and dnslib.DNSRecord.parse(known).header.rcode == NOERROR
    allowed = responder.respond(bytes(outside.pack()), transport, "10.244.1.5")
    assert not isinstance(allowed, bytes) and allowed is not None
    asyncio.run(allowed)
    assert len(forwarder.sent) == 1
