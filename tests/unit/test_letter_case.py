"""One cached reply per name, served in every letter case as the encoder writes it for that case.

A query in another case than the cached reply's is a hit: the reply gets the query's letters
where it copies its name (wire/case.py), compressed as that case's names compress, and is byte
for byte the reply the reference path builds for it (tests/differential.py)."""

from __future__ import annotations

import random
from struct import pack
from typing import Any

import dnslib
import pytest

from tests.differential import reference_reply
from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB, headless, service
from toposdns.resolve.answer import Answer
from toposdns.serve.cache import Cached
from toposdns.serve.responder import TCP4, TCP6, UDP4, UDP6, Responder, Transport
from toposdns.wire.case import NOT_RECASED, PACKS, case_runs, compress, recase, signature
from toposdns.wire.codes import AAAA, CNAME, MX, NOERROR, NS, PTR, SOA, SRV, TXT, A, Name
from toposdns.wire.decode import Edns, Query, record_spans
from toposdns.wire.edns import split_query
from toposdns.wire.encode import encode_reply
from toposdns.wire.records import RR, Mx, Raw, Soa, Srv

CONFIG = config_of(zones=["cluster.local", "in-addr.arpa", "ip6.arpa"], pods="insecure")
OBJECTS: list[dict[str, Any]] = [
    *SHOP_WEB,
    # 100 named endpoints: A and SRV replies far over 1232 bytes, cut and compressed over UDP.
    *headless(
        "big",
        "shop",
        [{"addresses": [f"10.2.0.{i + 1}"], "hostname": f"big-{i}"} for i in range(100)],
    ),
    # 28 endpoints: an A reply between the IPv6 fragment limit (1220) and 4096 bytes.
    *headless("mid", "shop", [{"addresses": [f"10.4.0.{i + 1}"]} for i in range(28)]),
    service("alias", "shop", cluster_ip=None, type="ExternalName", externalName="Web.Example.COM"),
]
SNAPSHOT = snapshot_of(OBJECTS)
SOURCE = "127.0.0.1"


def query(name: str, qtype: str, size: int | None, qid: int = 7) -> bytes:
    q = dnslib.DNSRecord(
        dnslib.DNSHeader(id=qid, rd=1),
        q=dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype)),
    )
    if size is not None:
        q.add_ar(dnslib.EDNS0(udp_len=size))
    return bytes(q.pack())


def spellings(name: str, count: int, seed: int) -> list[str]:
    """`name` as asked, all in upper case, then in `count` random letter cases."""
    rng = random.Random(seed)
    cased = ["".join(rng.choice((c.lower(), c.upper())) for c in name) for _ in range(count)]
    return [name, name.upper(), *cased]


def reference(responder: Responder, data: bytes, transport: Transport) -> bytes | None:
    return reference_reply(
        data, transport, SOURCE, responder.snapshot, CONFIG, (), responder.max_udp_size
    )


# Names of every form, each asked in many letter cases: each reply is the reference's, and all
# but the first (two for a template reply, kept when asked again) are hits.
CASES = [
    ("web.shop.svc.cluster.local", "A", None, UDP4),  # a ClusterIP service
    ("web.shop.svc.cluster.local", "AAAA", 1232, UDP4),  # NODATA: the SOA in the zone's case
    ("big.shop.svc.cluster.local", "A", 1232, UDP4),  # cut and compressed
    ("big.shop.svc.cluster.local", "A", None, UDP6),  # cut to 512 bytes
    ("_http._tcp.big.shop.svc.cluster.local", "SRV", 1232, UDP4),  # targets in the zone's case
    ("_http._tcp.big.shop.svc.cluster.local", "SRV", 65535, TCP4),  # whole, with its glue
    ("mid.shop.svc.cluster.local", "A", 4096, UDP6),  # whole but over the fragment limit
    ("mid.shop.svc.cluster.local", "A", 4096, UDP4),  # whole
    ("big-7.big.shop.svc.cluster.local", "A", None, TCP6),  # an endpoint's name
    ("alias.shop.svc.cluster.local", "A", None, UDP4),  # a CNAME to a name of its own case
    ("nope.shop.svc.cluster.local", "A", 1232, UDP4),  # NXDOMAIN, from a template
    ("10-1-2-3.shop.pod.cluster.local", "A", None, UDP4),  # a pod's name, from a template
    ("1.0.2.10.in-addr.arpa", "PTR", None, UDP4),  # reverse, into the primary zone
    ("dns-version.cluster.local", "TXT", None, TCP4),
    ("_http._tcp.web.shop.svc.cluster.local", "SRV", 1232, UDP4),
]


@pytest.mark.parametrize(("name", "qtype", "size", "transport"), CASES)
def test_every_letter_case_is_a_hit_written_in_its_own_case(
    name: str, qtype: str, size: int | None, transport: Transport
) -> None:
    responder = Responder(CONFIG, SNAPSHOT, max_udp_size=4096)
    cache = responder.cache
    asked = spellings(name, 16, len(name))
    for i, spelled in enumerate(asked):
        data = query(spelled, qtype, size, qid=i)
        served = responder.respond(data, transport, SOURCE)
        assert served == reference(responder, data, transport), spelled
    assert cache.entries == 1
    # A reply from a template is kept when its name is asked again.
    built = 2 if name.startswith(("nope", "10-1")) else 1
    assert (cache.misses, cache.hits) == (built, len(asked) - built)


@pytest.mark.parametrize(
    ("name", "qtype"),
    [
        ("cluster.local", "NS"),  # CoreDNS compares the lower-cased apex with the zone as asked
        ("ns.dns.cluster.local", "A"),  # and `ns.dns.<zone>` likewise
        ("cluster.local", "SOA"),
    ],
)
def test_names_whose_answer_depends_on_their_case_are_built_in_each(name: str, qtype: str) -> None:
    responder = Responder(config_of(ns_addresses=["10.0.0.10"]), SNAPSHOT)
    config = responder.config
    for spelled in spellings(name, 8, 1):
        data = query(spelled, qtype, 1232)
        served = responder.respond(data, UDP4, SOURCE)
        assert served == reference_reply(data, UDP4, SOURCE, responder.snapshot, config), spelled
    (entry,) = responder.cache.table.values()
    assert isinstance(entry, Cached) and entry.case is NOT_RECASED


def test_an_entry_built_in_upper_case_serves_lower_case_too() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    for name in ("WEB.SHOP.SVC.CLUSTER.LOCAL", "web.shop.svc.cluster.local"):
        data = query(name, "A", None)
        assert responder.respond(data, UDP4, SOURCE) == reference(responder, data, UDP4)
    assert (responder.cache.misses, responder.cache.hits) == (1, 1)


def test_the_case_map_is_counted_in_the_bound() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    cache = responder.cache
    srv = "_http._tcp.big.shop.svc.cluster.local"
    responder.respond(query(srv, "SRV", 65535), TCP4, SOURCE)
    (entry,) = cache.table.values()
    assert isinstance(entry, Cached)
    held, size = cache.bytes_held, entry.size
    responder.respond(query(srv.upper(), "SRV", 65535), TCP4, SOURCE)
    assert entry.case is not None and entry.case is not NOT_RECASED
    assert cache.bytes_held - held == entry.size - size == entry.case.size > 0
    key = split_query(query(srv, "SRV", 65535))
    assert key is not None
    cache.drop(key[0])
    assert cache.bytes_held == held - size - len(key[0]) == 0


# --loadbalance: a cached reply's addresses still take turns, in whatever case it is asked.


def records(reply: bytes) -> tuple[bytes, list[bytes]]:
    """A reply's header and question, and its records sorted (their order aside)."""
    spans = record_spans(reply)
    start = spans[0][0] if spans else len(reply)
    return reply[:start], sorted(reply[a:b] for a, _, b, _, _ in spans)


def test_balanced_replies_rotate_in_every_case() -> None:
    responder = Responder(CONFIG, SNAPSHOT, loadbalance=True)
    firsts = []
    for i, spelled in enumerate(spellings("mid.shop.svc.cluster.local", 28, 3)):
        data = query(spelled, "A", 4096, qid=i)
        served = responder.respond(data, TCP4, SOURCE)
        assert isinstance(served, bytes)
        want = reference(responder, data, TCP4)
        assert want is not None and records(served) == records(want), spelled
        firsts.append(served[record_spans(served)[0][2] - 4 : record_spans(served)[0][2]])
    # Each of the 28 addresses came first once in the replies after the first.
    assert len(set(firsts[1:])) == 28
    # Cut and compressed over UDP, in another case: the header and question as the reference's.
    for spelled in spellings("big.shop.svc.cluster.local", 4, 4):
        data = query(spelled, "A", 1232)
        served = responder.respond(data, UDP4, SOURCE)
        want = reference(responder, data, UDP4)
        assert isinstance(served, bytes) and want is not None
        assert records(served)[0] == records(want)[0] and len(served) <= 1232
        parsed = dnslib.DNSRecord.parse(served)
        assert {str(rr.rname) for rr in parsed.rr} == {spelled + "."}


# The cache key folds ASCII letters only, as DNS compares names (RFC 4343).


def test_only_ascii_letters_fold() -> None:
    def key(label: bytes) -> bytes:
        data = query("web.shop.svc.cluster.local", "A", 1232)
        split = split_query(data[:13] + label + data[16:])
        assert split is not None
        return split[0]

    assert key(b"WEB") == key(b"web") == key(b"wEb")
    assert len({key(b"w\xc9b"), key(b"w\xe9b"), key(b"web")}) == 3  # É, é: other names


# The pieces, on their own.


def wire_name(name: Name) -> bytes:
    return b"".join(bytes((len(label),)) + label.encode() for label in name) + b"\0"


def plain(name: Name, edns: Edns | None = None) -> Query:
    return Query(7, 0x0100, name, A, 1, edns, None, wire_name(name) + pack("!HH", A, 1))


def sample(name: Name, count: int) -> Answer:
    """Records of every type the encoder writes, names in and out of the query's case."""
    zone = name[-2:]
    target = ("web-0", "web", "shop", "svc", *zone)
    soa = Soa(("ns", "dns", *zone), ("hostmaster", *zone), 7, 7200, 1800, 8, 5)
    return Answer(
        NOERROR,
        (
            *(RR(name, A, 5, f"10.1.0.{i}") for i in range(count)),
            RR(name, AAAA, 5, "fd00::1"),
            RR(name, SRV, 5, Srv(0, 50, 80, target)),
            RR(name, CNAME, 5, ("svc1", "shop", "svc", "cluster", "local")),
            RR(("1", "0", "1", "10", "in-addr", "arpa"), PTR, 5, target),
            RR(("dns-version", *zone), TXT, 28800, ("1.1.0",)),
            RR(zone, NS, 5, ("ns", "dns", *zone)),
            RR(name, MX, 5, Mx(10, ("mail", *zone))),
            RR(name, 99, 5, Raw(b"\x03abc")),  # a type without a form: written as given
            RR(name, MX, 5, Raw(b"\x00\x0a\x04mail\x00", 3)),  # of class CH: as given
        ),
        (RR(zone, SOA, 5, soa),),
        (RR(target, A, 5, "10.1.0.1"),),
    )


def random_name(rng: random.Random) -> Name:
    labels = ("web", "shop", "svc", "cluster", "local")
    return tuple("".join(rng.choice((c.lower(), c.upper())) for c in label) for label in labels)


@pytest.mark.parametrize("edns", [None, Edns(1232, 0x8000)])
@pytest.mark.parametrize("limit", [512, 700, 1232, 65535])
@pytest.mark.parametrize("count", [1, 40])
def test_compress_writes_what_the_encoder_writes(edns: Edns | None, limit: int, count: int) -> None:
    rng = random.Random(limit + count)
    for _ in range(10):
        name = random_name(rng)
        query, answer = plain(name, edns), sample(name, count)
        whole = encode_reply(query, answer, 65535)
        opt = whole[-11:] if edns is not None else b""
        # The encoder's compressed form (a fragment limit of 1 byte: compressed even if it fits).
        want = encode_reply(query, answer, limit, fragment_limit=1)
        assert b"\x00\x00" + compress(whole[2:], opt, limit) == b"\x00\x00" + want[2:]


def test_case_runs_find_the_copies_of_the_name() -> None:
    name: Name = ("Web", "Shop", "svc", "Cluster", "LOCAL")
    other = tuple(label.swapcase() for label in name)
    ours = encode_reply(plain(name), sample(name, 3), 65535)
    theirs = encode_reply(plain(other), sample(other, 3), 65535)
    runs = case_runs(ours, theirs, wire_name(name))
    # The question's name, from its first letter: a length byte is the same in every case.
    assert runs is not None and runs[:3] == (13, 1, len(wire_name(name)) - 2)
    rng = random.Random(9)
    for _ in range(20):
        spelled = random_name(rng)
        want = encode_reply(plain(spelled), sample(spelled, 3), 65535)
        assert recase(ours, runs, wire_name(spelled)) == want
    assert case_runs(ours, theirs[:-1], wire_name(name)) is None  # not the same reply
    assert case_runs(ours, ours[:-5] + b"xxxxx", wire_name(name)) is None  # differs elsewhere
    zero = ("a\0b", "cluster", "local")  # a zero byte in a label hides where its name ends
    assert case_runs(ours, theirs, wire_name(zero)) is None


# A reply cut and compressed: made once for the spellings that compress alike, recased for each.


@pytest.mark.parametrize(
    ("name", "qtype"),
    [
        ("_http._tcp.big.shop.svc.cluster.local", "SRV"),  # targets and glue under the service
        ("big.shop.svc.cluster.local", "A"),
        ("mid.shop.svc.cluster.local", "A"),  # over 512 and 1000 bytes, not over 1232
    ],
)
def test_spellings_that_compress_alike_share_one_compressed_form(name: str, qtype: str) -> None:
    responder = Responder(CONFIG, SNAPSHOT, max_udp_size=4096)
    cache = responder.cache
    labels = name.split(".")
    # The labels the objects spell in lower case, asked in lower case or not: they decide
    # which suffixes point where.
    crafted = [
        ".".join(label.upper() if i in upper else label for i, label in enumerate(labels))
        for upper in ({0}, {1}, {2}, {3}, {0, 1}, {len(labels) - 1}, set(range(len(labels))))
    ]
    asked = [name, name, *crafted, *spellings(name, 60, 7)]
    for size in (512, 1232, 1000):
        for i, spelled in enumerate(asked):
            data = query(spelled, qtype, size, qid=i)
            served = responder.respond(data, UDP4, SOURCE)
            assert served == reference(responder, data, UDP4), (spelled, size)
    (entry,) = cache.table.values()
    assert isinstance(entry, Cached) and entry.case is not None
    assert 0 < len(entry.case.packs) <= PACKS
    # What the compressed forms take is counted: the bound holds what the entry says it holds.
    key = split_query(query(name, qtype, 1232))
    assert key is not None
    held = cache.bytes_held
    cache.drop(key[0])
    assert held - cache.bytes_held == entry.size + len(key[0]) > entry.case.size > 0


def test_a_label_like_an_objects_changes_the_signature() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    srv = "_http._tcp.big.shop.svc.cluster.local"
    for spelled in (srv, srv.upper()):
        responder.respond(query(spelled, "SRV", 1232), UDP4, SOURCE)
    (entry,) = responder.cache.table.values()
    assert isinstance(entry, Cached) and entry.case is not None
    case = entry.case
    # `big`, `shop` and `svc` are spelled by the glue's owners too; `cluster.local` only ever
    # copied from the name asked.
    texts = {label for _, _, label in case.fixed}
    assert {b"big", b"shop", b"svc"} <= texts and b"cluster" not in texts

    def wire(text: str) -> bytes:
        return b"".join(bytes((len(lb),)) + lb.encode() for lb in text.split(".")) + b"\0"

    lower, upper = wire(srv), wire(srv.replace("big", "BIG"))
    assert signature(case, lower) != signature(case, upper)
    # `_http` is no object's: its case changes nothing.
    http = srv.replace("big", "BIG").replace("_http", "_HTTP")
    assert signature(case, upper) == signature(case, wire(http))
