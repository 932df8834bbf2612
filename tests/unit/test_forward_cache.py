"""The forwarded-answer cache: CoreDNS cache's rules, as tables ported from its tests
(plugin/cache/cache_test.go: TestCacheInsertion, TestComputeTTL, TestCacheZeroTTL,
TestCacheServfailTTL0, TestCacheHonorsConfiguredPositiveMaxTTLAboveDefault), and what the cache
gives clients (TTLs counted down, AA, OPT, AD)."""

from __future__ import annotations

from dataclasses import replace
from struct import pack

import dnslib
import pytest

from toposdns.serve.forward_cache import (
    CachePolicy,
    CacheSettings,
    ForwardCache,
    cache_off,
    capping,
    clamp_ttl,
    first_served,
    placement,
)

# Fri Apr 21 10:51:21 BST 2017, the instant CoreDNS's table is checked at (RRSIG validity).
NOW = 1492768281.0
SIG = "8 2 1800 {exp} {inc} 12051 miek.nl. lAaEzB5teQLLKyDenatmyhca7blLRg9DoGNrhe3NReBZN5C5/pMQk8Jc"
SOA = (
    "example.org. 3600 IN SOA sns.dns.icann.org. noc.dns.icann.org. 2016082540 7200 3600 1209600 "
    "3600"
)
# The test cache of CoreDNS's table: a maximum of 3600 for both kinds, and zones where one is off.
TABLE_SETTINGS = CacheSettings(
    success=CachePolicy(max_ttl=3600, disabled=(("pos-disabled", "example", "org"),)),
    denial=CachePolicy(max_ttl=3600, disabled=(("neg-disabled", "example", "org"),)),
)


def message(
    qname: str,
    qtype: str,
    rcode: int = 0,
    answer: tuple[str, ...] = (),
    ns: tuple[str, ...] = (),
    tc: bool = False,
    do: bool = False,
) -> dnslib.DNSRecord:
    """A reply as it comes off the wire."""
    header = dnslib.DNSHeader(qr=1, rcode=rcode, tc=int(tc), ra=1)
    reply = dnslib.DNSRecord(header, q=dnslib.DNSQuestion(qname, getattr(dnslib.QTYPE, qtype)))
    for line in answer:
        reply.add_answer(*dnslib.RR.fromZone(line))
    for line in ns:
        reply.add_auth(*dnslib.RR.fromZone(line))
    if do:
        reply.add_ar(dnslib.EDNS0(flags="do"))
    return dnslib.DNSRecord.parse(reply.pack())


MX = ("miek.nl. 3601 IN MX 1 aspmx.l.google.com.", "miek.nl. 3601 IN MX 10 aspmx2.googlemail.com.")
CNAME = "alias.example.org. 3600 IN CNAME target.example.net."

# (name, reply, cache that keeps it ("" for none), TTL its records get)
INSERTION = [
    ("ad bit", message("miek.nl.", "MX", answer=MX), "success", 3600),
    ("case sensitivity", message("mIEK.nL.", "MX", answer=MX), "success", 3600),
    (
        "truncated responses are not cached",
        message("miek.nl.", "MX", answer=("miek.nl. 1800 IN MX 1 aspmx.l.google.com.",), tc=True),
        "",
        1800,
    ),
    ("NXDOMAIN", message("example.org.", "A", rcode=3, ns=(SOA,)), "denial", 3600),
    ("NXDOMAIN without SOA is not cached", message("1.1.168.192.in-addr.arpa.", "PTR", 3), "", 5),
    ("SERVFAIL", message("example.org.", "A", rcode=2), "denial", 5),
    ("NOTIMP", message("example.org.", "A", rcode=4), "denial", 5),
    (
        "expired RRSIG is not cached",
        message(
            "miek.nl.",
            "MX",
            answer=(
                *MX,
                "miek.nl. 1800 IN RRSIG MX " + SIG.format(exp=20160521031301, inc=20160421031301),
            ),
            do=True,
        ),
        "",
        5,
    ),
    (
        "DO bit with RRSIG not expired",
        message(
            "example.org.",
            "MX",
            answer=(
                "example.org. 3600 IN MX 1 aspmx.l.google.com.",
                "example.org. 1800 IN RRSIG MX "
                + SIG.format(exp=20170521031301, inc=20170421031301),
            ),
            do=True,
        ),
        "success",
        1800,
    ),
    (
        "negative zone exception",
        message("neg-disabled.example.org.", "A", rcode=3, ns=(SOA,)),
        "",
        3600,
    ),
    (
        "positive zone exception",
        message(
            "pos-disabled.example.org.",
            "A",
            answer=("pos-disabled.example.org. 3600 IN A 127.0.0.1",),
        ),
        "",
        3600,
    ),
    (
        "positive zone exception with a negative answer",
        message("pos-disabled.example.org.", "A", rcode=3, ns=(SOA,)),
        "denial",
        3600,
    ),
    (
        "negative zone exception with a positive answer",
        message(
            "neg-disabled.example.org.",
            "A",
            answer=("neg-disabled.example.org. 3600 IN A 127.0.0.1",),
        ),
        "success",
        3600,
    ),
    (
        "dangling CNAME chain without SOA",
        message(
            "alias.example.org.",
            "A",
            answer=(
                "alias.example.org. 3600 IN CNAME target1.example.net.",
                "target1.example.net. 3600 IN CNAME target2.example.net.",
            ),
        ),
        "",
        3600,
    ),
    (
        "CNAME chain ending in another type without SOA",
        message("alias.example.org.", "A", answer=(CNAME, "target.example.net. 3600 IN AAAA ::1")),
        "",
        3600,
    ),
    (
        "MX query, CNAME chain without an MX",
        message("alias.example.org.", "MX", answer=(CNAME,)),
        "",
        3600,
    ),
    (
        "MX query, CNAME chain ending in an MX",
        message(
            "alias.example.org.",
            "MX",
            answer=(CNAME, "target.example.net. 3600 IN MX 10 mail.example.net."),
        ),
        "success",
        3600,
    ),
    (
        "unrelated A off the chain",
        message(
            "alias.example.org.", "A", answer=(CNAME, "unrelated.example.net. 3600 IN A 192.0.2.1")
        ),
        "",
        3600,
    ),
    (
        "lone CNAME answering ANY",
        message("alias.example.org.", "ANY", answer=(CNAME,)),
        "success",
        3600,
    ),
    (
        "CNAME chain ending in an A",
        message(
            "alias.example.org.", "A", answer=(CNAME, "target.example.net. 3600 IN A 127.0.0.1")
        ),
        "success",
        3600,
    ),
    (
        "CNAME chain ending in an A, out of order",
        message(
            "alias.example.org.", "A", answer=("target.example.net. 3600 IN A 127.0.0.1", CNAME)
        ),
        "success",
        3600,
    ),
    (
        "CNAME answering CNAME",
        message("alias.example.org.", "CNAME", answer=(CNAME,)),
        "success",
        3600,
    ),
    (
        "two targets at one owner",
        message(
            "alias.example.org.",
            "A",
            answer=(
                "alias.example.org. 3600 IN CNAME target1.example.net.",
                "alias.example.org. 3600 IN CNAME target2.example.net.",
                "target1.example.net. 3600 IN A 192.0.2.1",
            ),
        ),
        "",
        3600,
    ),
    (
        "CNAME loop",
        message(
            "alias.example.org.",
            "A",
            answer=(
                CNAME,
                "target.example.net. 3600 IN CNAME alias.example.org.",
                "alias.example.org. 3600 IN A 192.0.2.1",
            ),
        ),
        "",
        3600,
    ),
    (
        "duplicate identical CNAME ending in an A",
        message(
            "alias.example.org.",
            "A",
            answer=(CNAME, CNAME, "target.example.net. 3600 IN A 127.0.0.1"),
        ),
        "success",
        3600,
    ),
    (
        "CNAME without the type asked but with an SOA is NODATA",
        message("alias.example.org.", "A", answer=(CNAME,), ns=(SOA,)),
        "denial",
        3600,
    ),
    ("NOERROR without records: the minimal TTL", message("example.org.", "A"), "success", 5),
    ("REFUSED is never cached", message("example.org.", "A", rcode=5), "", 5),
]


@pytest.mark.parametrize(
    ("reply", "kept", "ttl"), [c[1:] for c in INSERTION], ids=[c[0] for c in INSERTION]
)
def test_insertion(reply: dnslib.DNSRecord, kept: str, ttl: int) -> None:
    assert placement(reply, TABLE_SETTINGS, NOW) == (kept, ttl)


@pytest.mark.parametrize(
    ("ttl", "low", "high", "expected"),
    [(1800, 300, 3600, 1800), (299, 300, 3600, 300), (299, 0, 3600, 299), (3601, 300, 3600, 3600)],
)
def test_compute_ttl(ttl: int, low: int, high: int, expected: int) -> None:
    assert clamp_ttl(ttl, low, high) == expected


def test_ttl_rules_of_the_knobs() -> None:
    a_record = message("example.org.", "A", answer=("example.org. 86400 IN A 192.0.2.1",))
    zero = message("example.org.", "A", answer=("example.org. 0 IN A 192.0.2.1",))
    no_minimum = CacheSettings(success=CachePolicy(min_ttl=0), denial=CachePolicy(min_ttl=0))
    assert placement(zero, no_minimum, NOW) == ("", 0)  # TestCacheZeroTTL
    assert placement(zero, CacheSettings(), NOW) == ("success", 5)  # raised to MINTTL
    above_default = CacheSettings(success=CachePolicy(max_ttl=7200, min_ttl=0))
    assert placement(a_record, above_default, NOW) == ("success", 7200)
    # kubeadm's `cache 30`: both kinds capped at 30 s.
    kubeadm = CacheSettings(success=CachePolicy(max_ttl=30), denial=CachePolicy(max_ttl=30))
    assert placement(a_record, kubeadm, NOW) == ("success", 30)
    nxdomain = message("nowhere.example.org.", "A", rcode=3, ns=(SOA,))
    assert placement(nxdomain, kubeadm, NOW) == ("denial", 30)
    assert placement(nxdomain, CacheSettings(), NOW) == ("denial", 1800)  # denial's default cap
    servfail = message("example.org.", "A", rcode=2)
    assert placement(servfail, replace(CacheSettings(), servfail_ttl=0), NOW) == ("", 0)
    # `disable success` without zones: the root, so nowhere.
    nowhere = CacheSettings(success=CachePolicy(disabled=((),)))
    assert placement(a_record, nowhere, NOW) == ("", 3600)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_entries_count_down_carry_each_clients_opt_and_are_authoritative() -> None:
    clock = Clock()
    cache = ForwardCache(CacheSettings(), clock)
    upstream = dnslib.DNSRecord.question("www.example.org.", "A").reply(ra=1, aa=0)
    upstream.add_answer(*dnslib.RR.fromZone("www.example.org. 300 IN CNAME web.example.org."))
    upstream.add_answer(*dnslib.RR.fromZone("web.example.org. 60 IN A 192.0.2.1"))
    upstream.header.ad = 1
    upstream.add_ar(dnslib.EDNS0(udp_len=1232, opts=[dnslib.EDNSOption(10, b"servercookie")]))
    wire = bytes(upstream.pack())
    entry = cache.store(b"key", wire, dnslib.DNSRecord.parse(wire))
    assert entry.kind == "success" and cache.get(b"key") is entry
    assert len(cache.success) == 1 and len(cache.denial) == 0

    first = dnslib.DNSRecord.parse(entry.render(b"\x12\x34", clock.now, b"", ad=True, hit=False))
    assert first.header.id == 0x1234 and not first.header.aa and first.header.ad
    assert [rr.ttl for rr in first.rr] == [60, 60]  # every record gets the time it is kept
    assert not first.ar  # the upstream's OPT (its cookie) is not passed on

    clock.now += 25.5
    opt = b"\x00" + pack("!HHIH", 41, 4096, 0, 0)  # this client's OPT
    hit = dnslib.DNSRecord.parse(entry.render(b"\x00\x07", clock.now, opt, ad=False, hit=True))
    assert hit.header.aa and not hit.header.ad  # AD only for clients that asked for it
    assert [rr.ttl for rr in hit.rr] == [35, 35]
    assert [(rr.rtype, rr.edns_len) for rr in hit.ar] == [(41, 4096)]

    clock.now += 35
    assert cache.get(b"key") is None  # expired


def test_a_new_reply_moves_between_the_caches() -> None:
    cache = ForwardCache(CacheSettings(), Clock())
    nxdomain = message("www.example.org.", "A", rcode=3, ns=(SOA,))
    answer = message("www.example.org.", "A", answer=("www.example.org. 60 IN A 192.0.2.1",))
    cache.store(b"key", bytes(nxdomain.pack()), nxdomain)
    assert cache.get(b"key") is not None and len(cache.denial) == 1
    cache.store(b"key", bytes(answer.pack()), answer)
    assert len(cache.denial) == 0 and len(cache.success) == 1


def test_capacity_bounds_each_cache() -> None:
    cache = ForwardCache(CacheSettings(success=CachePolicy(capacity=2)), Clock())
    for i in range(5):
        reply = message(f"n{i}.example.org.", "A", answer=(f"n{i}.example.org. 60 IN A 192.0.2.1",))
        cache.store(bytes([i]), bytes(reply.pack()), reply)
    assert len(cache.success) == 2


def reply_of(name: str, ttls: list[int], rcode: int = 0, edns: bool = False) -> bytes:
    message = dnslib.DNSRecord(
        dnslib.DNSHeader(qr=1, aa=1, rcode=rcode), q=dnslib.DNSQuestion(name)
    )
    for index, ttl in enumerate(ttls):
        message.add_answer(
            dnslib.RR(name, dnslib.QTYPE.A, rdata=dnslib.A(f"192.0.2.{index}"), ttl=ttl)
        )
    if edns:
        message.add_ar(dnslib.EDNS0(udp_len=1232))
    return bytes(message.pack())


# (the settings, the reply's name and TTLs, the TTLs CoreDNS's cache passes on first)
FIRST_SERVED = [
    (CacheSettings(success=CachePolicy(max_ttl=30)), "node.", [60], [30]),
    (CacheSettings(success=CachePolicy(max_ttl=30)), "node.", [60, 10], [10, 10]),
    (CacheSettings(success=CachePolicy(max_ttl=3600)), "node.", [60], [60]),
    (CacheSettings(success=CachePolicy(max_ttl=30, min_ttl=40)), "node.", [60], [30]),
    # A zone the cache is disabled for, and no cache at all: as they are.
    (CacheSettings(success=CachePolicy(max_ttl=30, disabled=(("node",),))), "node.", [60], [60]),
    (cache_off(CacheSettings(success=CachePolicy(max_ttl=30))), "node.", [60], [60]),
]


@pytest.mark.parametrize(("settings", "name", "ttls", "expected"), FIRST_SERVED)
def test_a_chains_replies_get_the_ttl_the_cache_gives_its_first_reply(
    settings: CacheSettings, name: str, ttls: list[int], expected: list[int]
) -> None:
    served = dnslib.DNSRecord.parse(first_served(reply_of(name, ttls, edns=True), settings, 0))
    assert [rr.ttl for rr in served.rr] == expected
    assert [rr.rtype for rr in served.ar] == [dnslib.QTYPE.OPT]  # the OPT as it was
    handler = capping(settings)
    assert (handler is None) == (settings.success.disabled == ((),))


def test_a_reply_without_records_is_passed_on_unparsed() -> None:
    nxdomain = reply_of("a.b.", [], rcode=3)
    assert first_served(nxdomain, CacheSettings(), 0) is nxdomain
