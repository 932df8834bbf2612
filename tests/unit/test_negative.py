"""Replies from templates (NXDOMAIN, pod names) say exactly what resolve + encode say, for every
name they answer."""

from __future__ import annotations

import gc
import itertools
import random
import tracemalloc
from collections.abc import Callable
from struct import pack

import pytest

from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB, headless, namespace
from toposdns.resolve.resolver import ResolverConfig, resolve
from toposdns.serve.negative import Negatives
from toposdns.store.snapshot import Snapshot
from toposdns.wire.codes import AAAA, A
from toposdns.wire.decode import decode_query
from toposdns.wire.edns import split_query
from toposdns.wire.encode import encode_reply, udp_limit

DB = [{"addresses": ["10.1.2.3"], "hostname": "db-0"}, {"addresses": ["10.1.2.4"]}]
OBJECTS = [
    *SHOP_WEB,
    namespace("hidden"),
    *headless("db", "shop", DB),
    *headless("db6", "shop", [{"addresses": ["fd00::4"]}], family="IPv6"),
]
SNAPSHOTS = [snapshot_of(OBJECTS), snapshot_of(OBJECTS, synced=False)]
CONFIGS = [
    config_of(),
    config_of(zones=["Cluster.Local", "in-addr.arpa", "ip6.arpa", "svc.cluster.local"]),
    config_of(pods="insecure", namespaces=["shop"]),
    config_of(zones=["cluster.local", "."], ttl=600),
]
LABELS = ["web", "shop", "hidden", "svc", "pod", "ns", "dns", "api", "example", "com", "Shop"]
LABELS += ["WEB", "SVC", "10-1-2-3", "cluster", "local", "in-addr", "arpa", "ip6", "x" * 63]
#: Labels that make endpoint and pod names: hostnames, dashed addresses, made-up ones.
HOSTS = ["db-0", "DB-0", "10-1-2-3", "10-1-2-4", "10-1-2-5", "fd00--4", "fd00--1", "10-01-2-3"]
HOSTS += ["10-1-2", "256-1-2-3", "api", "_http", "_tcp"]


def query(name: tuple[str, ...], qtype: int, opt: tuple[int, int] | None, flags: int) -> bytes:
    """A plain query, as wire/edns.py `split_query` accepts them."""
    wire = b"".join(bytes((len(label),)) + label.encode() for label in name) + b"\x00"
    message = pack("!6H", 0x1234, flags, 1, 0, 0, 0 if opt is None else 1) + wire
    message += pack("!HH", qtype, 1)
    if opt is not None:
        message += b"\x00" + pack("!HHIH", 41, opt[0], opt[1], 0)
    return message


def names(rng: random.Random, count: int) -> list[tuple[str, ...]]:
    zones = [("cluster", "local"), ("CLUSTER", "local"), ("in-addr", "arpa"), ("ip6", "arpa")]
    zones += [("svc", "cluster", "local"), (), ("example", "org")]
    found = []
    for _ in range(count):
        left = tuple(rng.choice(LABELS) for _ in range(rng.randrange(0, 7)))
        found.append(left + rng.choice(zones))
        # Endpoint and pod names: `<host>.<service>.<ns>.svc` and `[<x>.]<pod>.<ns>.pod`.
        service = rng.choice(["db", "db6", "web", "nothing", "DB"])
        found.append((rng.choice(HOSTS), service, "shop", "svc") + rng.choice(zones))
        extra = tuple(rng.choice(HOSTS) for _ in range(rng.randrange(0, 3)))
        found.append(extra + (rng.choice(HOSTS), rng.choice(["shop", "hidden", "none"]), "pod"))
        found[-1] += rng.choice(zones)
    return found


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "mixed-case", "listed", "root"])
def test_templates_say_what_the_resolver_says(config: ResolverConfig) -> None:
    rng = random.Random(7)
    negatives = Negatives(config)
    answered = 0
    pods = 0  # pod names answered with an address or NODATA
    for name, snapshot in itertools.product(names(rng, 1500), SNAPSHOTS):
        qtype = rng.choice((A, AAAA))
        opt = rng.choice((None, (512, 0), (1232, 0x8000), (4096, 0x0010_8000)))
        data = query(name, qtype, opt, rng.choice((0x0100, 0x0110, 0x0000, 0x0010)))
        limit = min(udp_limit(decode_query(data).edns), 1480)
        found = negatives.reply(data, split_query(data)[0], snapshot, limit)
        if opt is None and (found is None or len(found[0]) <= 512):
            # Read off the bytes alone, as stub resolvers' queries are: the same reply.
            assert negatives.plain(data, snapshot) == (split_query(data)[0], found), name
        if found is None:
            continue
        answered += 1
        pods += found[0][3] & 0x0F == 0
        decoded = decode_query(data)
        answer = resolve(decoded.name, qtype, snapshot, config, {})
        reply, reply_type, depends = found
        assert reply == encode_reply(decoded, answer, limit, 1480), name
        assert (reply_type, depends) == (qtype, answer.depends), name
    assert answered > 500  # the templates answered a good share of what they were asked
    assert pods > 50 if config.pods == "insecure" else pods == 0


def check(snapshot: Snapshot, config: ResolverConfig, text: str, qtype: int = A) -> bool:
    name = tuple(text.split("."))
    data = query(name, qtype, None, 0x0100)
    return Negatives(config).reply(data, data[2:], snapshot, 512) is not None


def test_what_only_the_resolver_can_tell_is_left_to_it() -> None:
    snapshot, config = SNAPSHOTS[0], config_of()
    assert check(snapshot, config, "api.example.com.shop.svc.cluster.local")
    assert check(snapshot, config, "nothing.shop.svc.cluster.local")
    assert check(snapshot, config, "10-1-2-3.shop.pod.cluster.local")  # pods disabled
    assert not check(snapshot, config, "web.shop.svc.cluster.local")  # exists
    assert not check(snapshot, config, "shop.svc.cluster.local")  # NODATA
    assert not check(snapshot, config, "ns.dns.cluster.local")  # the server's own name
    assert not check(snapshot, config, "cluster.local")  # the apex
    assert not check(snapshot, config, "example.org")  # outside the zones: REFUSED
    assert not check(snapshot, config, "nothing.shop.svc.cluster.local", qtype=16)  # not A/AAAA
    assert check(snapshot, config, "10-1-2-9.db.shop.svc.cluster.local")  # no such endpoint
    assert not check(snapshot, config, "10-1-2-4.db.shop.svc.cluster.local")
    assert not check(snapshot, config, "db-0.db.shop.svc.cluster.local")
    assert check(snapshot, config_of(pods="insecure"), "10-1-2-3.shop.pod.cluster.local")  # A
    assert check(snapshot, config_of(pods="insecure"), "10-1-2-3.shop.pod.cluster.local", AAAA)
    assert not check(snapshot, config_of(pods="verified"), "10-1-2-3.shop.pod.cluster.local")
    assert not check(snapshot, config_of(pods="insecure"), "1-2-3.shop.pod.cluster.local")
    falling = ResolverConfig(zones=config.zones, fallthrough=(("cluster", "local"),))
    assert not check(snapshot, falling, "nothing.shop.svc.cluster.local")  # goes upstream


def _label(size: int) -> bytes:
    return bytes((size,)) + b"a" * size


#: A name of 255 octets in the zone (four 63-octet labels would be 257): the longest allowed.
LONGEST = _label(63) * 2 + _label(61) + _label(40) + b"\x04shop\x03svc\x07cluster\x05local\x00"
assert len(LONGEST) == 255

#: (what, query message, what `Negatives.plain` makes of it: None for a message it leaves to
#: the usual path, False for an A or AAAA query it leaves to the resolver, True for one the
#: templates answer). It reads every message as wire/edns.py `split_query` does; when the
#: templates answer, the reply is resolve + encode's, byte for byte.
HOSTILE = [
    (
        "search path",
        query(("api", "example", "com", "shop", "svc", "cluster", "local"), A, None, 0x0100),
        True,
    ),
    (
        "upper case",
        query(("API", "Example", "COM", "Shop", "SVC", "Cluster", "LOCAL"), AAAA, None, 0x0110),
        True,
    ),
    ("dot in a label", query(("a.b", "shop", "svc", "cluster", "local"), A, None, 0x0100), True),
    ("dot in the kind", query(("x", "s.vc", "cluster", "local"), A, None, 0x0100), True),
    (
        "endpoint of no endpoint",
        query(("db-1", "db", "shop", "svc", "cluster", "local"), A, None, 0),
        True,
    ),
    (
        "endpoint that exists",
        query(("DB-0", "db", "shop", "svc", "cluster", "local"), A, None, 0),
        False,
    ),
    ("the longest name", pack("!6H", 7, 0x0100, 1, 0, 0, 0) + LONGEST + pack("!HH", A, 1), True),
    (
        "a name too long",
        pack("!6H", 7, 0x0100, 1, 0, 0, 0) + _label(1) + LONGEST + pack("!HH", A, 1),
        None,
    ),
    (
        "a label of 64",
        pack("!6H", 7, 0x0100, 1, 0, 0, 0)
        + b"\x40"
        + b"a" * 64
        + b"\x07cluster\x05local\x00"
        + pack("!HH", A, 1),
        None,
    ),
    (
        "a compression pointer",
        pack("!6H", 7, 0x0100, 1, 0, 0, 0) + b"\x01x\xc0\x0c" + pack("!HH", A, 1),
        None,
    ),
    (
        "a byte past the question",
        query(("x", "cluster", "local"), A, None, 0x0100) + b"\x00",
        None,
    ),
    ("cut short", query(("x", "cluster", "local"), A, None, 0x0100)[:-1], None),
    ("a name that runs out", pack("!6H", 7, 0x0100, 1, 0, 0, 0) + b"\x09cluster", None),
    ("a response", query(("x", "cluster", "local"), A, None, 0x8100), None),
    ("another opcode", query(("x", "cluster", "local"), A, None, 0x2100), None),
    (
        "two questions",
        query(("x", "cluster", "local"), A, None, 0x0100)[:4]
        + b"\x00\x02"
        + query(("x", "cluster", "local"), A, None, 0x0100)[6:],
        None,
    ),
    ("class CH", query(("x", "cluster", "local"), A, None, 0x0100)[:-1] + b"\x03", None),
    ("not A or AAAA", query(("x", "cluster", "local"), 16, None, 0x0100), None),
    (
        "a byte beyond ASCII",
        pack("!6H", 7, 0x0100, 1, 0, 0, 0)
        + b"\x01\xe9\x04shop\x03svc\x07cluster\x05local\x00"
        + pack("!HH", A, 1),
        False,
    ),
    ("a NUL in a label", query(("a\x00b", "cluster", "local"), A, None, 0x0100), True),
    ("the zone's apex", query(("Cluster", "local"), A, None, 0x0100), False),
    ("outside the zones", query(("example", "org"), A, None, 0x0100), False),
]


@pytest.mark.parametrize(("what", "data", "answered"), HOSTILE, ids=[row[0] for row in HOSTILE])
def test_a_query_read_off_its_bytes_is_read_as_the_decoder_reads_it(
    what: str, data: bytes, answered: bool | None
) -> None:
    snapshot, config = SNAPSHOTS[0], config_of()
    negatives = Negatives(config)
    plain = negatives.plain(data, snapshot)
    if answered is None:
        assert plain is None
        return
    split = split_query(data)
    assert split is not None and plain is not None and plain[0] == split[0]  # the same key
    assert (plain[1] is not None) == answered
    if plain[1] is not None:
        reply, qtype, depends = plain[1]
        decoded = decode_query(data)
        answer = resolve(decoded.name, decoded.qtype, snapshot, config, {})
        assert reply == encode_reply(decoded, answer, 512, 1480)
        assert (qtype, depends) == (decoded.qtype, answer.depends)


def test_the_endpoint_names_kept_stay_within_their_bytes_and_are_counted_as_held() -> None:
    # 400 services of 50 named endpoints: their labels take about 3 MB in all.
    objects = [namespace("shop")]
    for s in range(400):
        endpoints = [{"addresses": [f"10.{s // 200}.{s % 200}.{i}"]} for i in range(1, 51)]
        objects += headless(f"svc{s}", "shop", endpoints)
    snapshot = snapshot_of(objects)
    services = list(snapshot.services.values())
    roomy = Negatives(config_of(), memory=64 << 20)

    def fill() -> None:
        for svc in services:
            roomy.hostnames(svc, snapshot)

    held = traced(fill)
    assert len(roomy.known) == 400 and 0.8 <= held / roomy.known_bytes <= 1.2
    bounded = Negatives(config_of(), memory=256 << 10)
    for svc in services:
        assert bounded.hostnames(svc, snapshot) == roomy.hostnames(svc, snapshot)
        assert bounded.known_bytes <= 256 << 10
    assert 0 < len(bounded.known) < 400


def traced(fill: Callable[[], None]) -> int:
    """Bytes Python holds after `fill` that it did not hold before."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
