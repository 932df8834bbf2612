"""Placement by PodLocator CIDRs: the rules in a table, the placer's memory under changes, the
report of a prefix claimed twice, and a cluster described by node CIDRs answering byte for byte
as the same cluster described by one locator per pod."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random

import dnslib
import pytest

from tests.differential import Frontends, reference_reply
from tests.helpers import config_of
from toposdns.metrics import LOCATOR_CONFLICTS, UNPLACED_SUBNETS
from toposdns.resolve.client import identify
from toposdns.serve.placement import Placer
from toposdns.serve.responder import UDP4, UDP6, Responder
from toposdns.server import report_conflicts
from toposdns.store.builder import StoreBuilder, build_snapshot
from toposdns.store.model import HEADLESS, Endpoint, EndpointSlice, Namespace, PodLocator, Port
from toposdns.store.model import Service as Svc
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import HOSTNAME, ZONE


def node(name: str, *cidrs: str, addresses: tuple[str, ...] = ()) -> PodLocator:
    labels = {HOSTNAME: name, ZONE: "z-" + name}
    return PodLocator("toposdns", name, addresses, name, labels, is_node=True, cidrs=cidrs)


def pod(name: str, address: str, on: str) -> PodLocator:
    return PodLocator("shop", name, (address,), on, {HOSTNAME: on, ZONE: "z-" + on})


LOCATORS = [
    node("wide", "10.0.0.0/8"),
    node("a", "10.244.1.0/24", "fd00:10:244:1::/64"),
    node("a-block", "10.244.1.64/26"),  # nested: longer wins inside it
    node("b", "10.244.2.0/24", addresses=("192.168.0.2",)),
    node("c", "10.244.3.0/24"),
    node("d", "10.244.3.0/24"),  # the same prefix as c: nobody inside is placed
    pod("borrowed", "10.244.1.9", on="b"),  # an exact address wins over any prefix
]

#: (address, prefix length or None, the locator expected, what placed it).
CASES = {
    "in a node's range": ("10.244.1.7", None, "a", "10.244.1.0/24"),
    "in a nested block": ("10.244.1.70", None, "a-block", "10.244.1.64/26"),
    "exact address wins": ("10.244.1.9", None, "borrowed", "10.244.1.9"),
    "node address": ("192.168.0.2", None, "b", "192.168.0.2"),
    "only the wide prefix": ("10.9.9.9", None, "wide", "10.0.0.0/8"),
    "IPv6 range": ("fd00:10:244:1::7", None, "a", "fd00:10:244:1::/64"),
    "nowhere": ("172.16.0.1", None, None, ""),
    "IPv6 nowhere": ("fd00:10:244:2::7", None, None, ""),
    "same prefix twice": ("10.244.3.7", None, None, "10.244.3.0/24"),
    "subnet inside a range": ("10.244.2.0", 24, "b", "10.244.2.0/24"),
    "subnet inside a block": ("10.244.1.64", 27, "a-block", "10.244.1.64/26"),
    "subnet around a block": ("10.244.1.0", 25, "a", "10.244.1.0/24"),
    "subnet spanning ranges": ("10.244.0.0", 16, "wide", "10.0.0.0/8"),
    "subnet wider than all": ("10.0.0.0", 7, None, ""),
    "exact address not a subnet": ("10.244.1.9", 31, "a", "10.244.1.0/24"),
    "host-long subnet": ("10.244.1.9", 32, "borrowed", "10.244.1.9"),
    "IPv6 /56 wider than a /64": ("fd00:10:244::", 56, None, ""),
    "IPv6 /64 subnet": ("fd00:10:244:1::", 64, "a", "fd00:10:244:1::/64"),
}


@pytest.mark.parametrize(("address", "length", "name", "via"), CASES.values(), ids=CASES.keys())
def test_placement_rules(address: str, length: int | None, name: str | None, via: str) -> None:
    snapshot = build_snapshot(LOCATORS, serial=1)
    placement = snapshot.place(address, length)
    assert (placement.locator.name if placement.locator else None, placement.via) == (name, via)
    client = identify(snapshot, address, length is not None, length)
    assert client.locator is placement.locator and client.placement == placement


def test_a_conflict_names_its_claimants() -> None:
    placement = build_snapshot(LOCATORS, serial=1).place("10.244.3.7")
    assert [held.name for held in placement.conflict] == ["c", "d"]


def test_the_addresses_of_one_prefix_share_its_placement() -> None:
    """A placement by prefix is the prefix's own object, not one per address: a DNS process
    remembers the placement of up to 65,536 clients."""
    snapshot = build_snapshot(LOCATORS, serial=1)
    for first, second in [("10.244.1.7", "10.244.1.8"), ("10.244.3.7", "10.244.3.8")]:
        assert snapshot.place(first) is snapshot.place(second)
    builder = StoreBuilder()
    for locator in LOCATORS:
        builder.put(locator)
    builder.remove(PodLocator, "toposdns", "d")  # the conflict ends: c places alone
    alone = builder.snapshot(2).place("10.244.3.7")
    assert alone.locator is not None and alone.locator.name == "c"
    assert (alone.via, alone.conflict) == ("10.244.3.0/24", ())


def test_the_placer_follows_changes_to_prefixes_and_addresses() -> None:
    builder = StoreBuilder()
    for locator in LOCATORS:
        builder.put(locator)
    placer = Placer((ipaddress.ip_network("127.0.0.53/32"),), builder.snapshot(1))
    where = {"source": ("10.244.2.7", None), "subnet": ("127.0.0.53", ("10.244.2.0", 24))}

    def placed() -> dict[str, str | None]:
        found = {}
        for what, (source, subnet) in where.items():
            labels, _ = placer.place(source, subnet)
            found[what] = labels.get(HOSTNAME)
        return found

    assert placed() == {"source": "b", "subnet": "b"}
    builder.put(node("b", "10.244.20.0/24", addresses=("192.168.0.2",)))  # b's range moves
    builder.put(node("e", "10.244.2.0/24"))  # and another node gets the old one
    placer.update(builder.snapshot(2))
    assert placed() == {"source": "e", "subnet": "e"}
    builder.put(pod("late", "10.244.2.7", on="c"))  # an exact address
    placer.update(builder.snapshot(3))
    assert placed() == {"source": "c", "subnet": "e"}
    builder.remove(PodLocator, "toposdns", "e")
    builder.remove(PodLocator, "toposdns", "wide")
    placer.update(builder.snapshot(4))
    assert placed() == {"source": "c", "subnet": None}
    placer.update(Snapshot())  # another source's data: nothing remembered holds
    assert placed() == {"source": None, "subnet": None}


def test_a_prefix_claimed_twice_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    builder = StoreBuilder()
    builder.put(node("c", "10.244.3.0/24"))
    first = builder.snapshot(1)
    builder.put(node("d", "10.244.3.0/24"))
    second = builder.snapshot(2)
    builder.put(node("x", "10.244.9.0/24"))
    third = builder.snapshot(3)
    before = LOCATOR_CONFLICTS._value.get()
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        report_conflicts(first, second)
        report_conflicts(second, third)  # an unrelated change
        report_conflicts(Snapshot(), third)  # a new source: every conflict is new to it
    lines = [r.getMessage() for r in caplog.records]
    assert (
        lines
        == [
            "PodLocators toposdns/c and toposdns/d all claim 10.244.3.0/24: no client inside it "
            "is placed by it; keep the prefix on one locator"
        ]
        * 2
    )
    assert LOCATOR_CONFLICTS._value.get() == before + 2


# --- the same cluster, by pod locators and by node CIDRs ----------------------------------------

NODES = {f"node-{i}": f"z{i % 3}" for i in range(5)}
PODS_PER_NODE = 6


def same_cluster(by_cidrs: bool, rng: random.Random) -> Snapshot:
    """Five nodes in three zones, six pods each, services with every kind of policy; the pods
    placed by their own locators, or by their node's CIDRs."""
    records: list[object] = [Namespace("shop")]
    pods: list[tuple[str, str, str]] = []  # (node, IPv4, IPv6)
    for i, (name, zone) in enumerate(NODES.items()):
        labels = {HOSTNAME: name, ZONE: zone}
        v6_range = ipaddress.ip_network(f"fd00:10:244:{i}::/64")
        cidrs = (f"10.244.{i}.0/24", str(v6_range)) if by_cidrs else ()
        records.append(PodLocator("toposdns", name, (f"192.168.0.{i}",), name, labels, True, cidrs))
        for j in range(PODS_PER_NODE):
            v4, v6 = f"10.244.{i}.{j + 2}", str(v6_range[j + 2])
            pods.append((name, v4, v6))
            if not by_cidrs:
                records.append(PodLocator("shop", f"p-{i}-{j}", (v4, v6), name, labels))
    policies = {
        "keys": {"topology_keys": (HOSTNAME, ZONE, "*")},
        "zone-only": {"topology_annotation": (ZONE,)},
        "same-node": {"traffic_distribution": "PreferSameNode"},
        "same-zone": {"traffic_distribution": "PreferSameZone"},
        "hints": {},
    }
    port = (Port("http", "TCP", 80),)
    for service, policy in policies.items():
        records.append(Svc("shop", service, HEADLESS, (), port, **policy))  # type: ignore[arg-type]
        chosen = rng.sample(pods, 7)
        for family, index in (("4", 1), ("6", 2)):
            endpoints = tuple(
                Endpoint(
                    (where[index],),
                    node_name=where[0],
                    zone=NODES[where[0]],
                    hint_zones=(NODES[where[0]],) if service == "hints" else None,
                )
                for where in chosen
            )
            records.append(EndpointSlice("shop", f"{service}-{family}", service, port, endpoints))
    return build_snapshot(records, serial=1_700_000_000)  # type: ignore[arg-type]


def test_node_cidrs_answer_as_pod_locators_do() -> None:
    rng = random.Random(7)
    seed = rng.randrange(2**32)
    by_pods = same_cluster(False, random.Random(seed))
    by_cidrs = same_cluster(True, random.Random(seed))
    config = config_of(pods="insecure")
    sources = [f"10.244.{i}.{j}" for i in range(5) for j in range(2, 2 + PODS_PER_NODE)]
    sources += [
        str(ipaddress.ip_network(f"fd00:10:244:{i}::/64")[j]) for i in range(5) for j in (2, 5)
    ]
    sources += ["192.168.0.1", "172.16.0.9"]  # a node address, an unknown client
    questions = [
        f"{service}.shop.svc.cluster.local"
        for service in ("keys", "zone-only", "same-node", "same-zone", "hints")
    ]

    async def ask() -> int:
        compared = 0
        frontends = [Frontends(Responder(config, snap)) for snap in (by_pods, by_cidrs)]
        try:
            for source in sources:
                kind = UDP6 if ":" in source else UDP4
                for name in questions:
                    for qtype in ("A", "AAAA", "SRV"):
                        query = bytes(dnslib.DNSRecord.question(name, qtype).pack())
                        want = reference_reply(query, kind, source, by_pods, config)
                        assert want == reference_reply(query, kind, source, by_cidrs, config)
                        for served in frontends:
                            assert served.over_udp(kind, query, source) == [want], (source, name)
                            compared += 1
        finally:
            for served in frontends:
                served.close()
        return compared

    assert asyncio.run(ask()) == len(sources) * len(questions) * 3 * 2


def test_an_unplaced_subnet_is_reported_once_per_forwarder_and_length(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trust = (ipaddress.ip_network("127.0.0.52/31"),)
    placer = Placer(trust, build_snapshot(LOCATORS, serial=1))
    before = UNPLACED_SUBNETS._value.get()
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        for _ in range(2):
            placer.place("127.0.0.53", ("10.0.0.0", 7))
            placer.place("127.0.0.53", ("11.0.0.0", 7))  # the same length: said already
            placer.place("127.0.0.53", ("fd00:10:244::", 56))
            # A second forwarder sending a prefix the first one sent: its own line.
            placer.place("127.0.0.52", ("10.0.0.0", 7))
    assert [r.getMessage().split(" sends ")[:2] for r in caplog.records] == [
        [
            "forwarder 127.0.0.53",
            "/7 Client Subnets that no PodLocator CIDR holds whole: its "
            "clients are unplaced; have it send /32 and /128 (CoreDNS: rewrite edns0 subnet set 32 "
            "128), or give the locators the node CIDRs that hold those prefixes",
        ],
        [
            "forwarder 127.0.0.53",
            "/56 Client Subnets that no PodLocator CIDR holds whole: its "
            "clients are unplaced; have it send /32 and /128 (CoreDNS: rewrite edns0 subnet set 32 "
            "128), or give the locators the node CIDRs that hold those prefixes",
        ],
        [
            "forwarder 127.0.0.52",
            "/7 Client Subnets that no PodLocator CIDR holds whole: its "
            "clients are unplaced; have it send /32 and /128 (CoreDNS: rewrite edns0 subnet set 32 "
            "128), or give the locators the node CIDRs that hold those prefixes",
        ],
    ]
    assert UNPLACED_SUBNETS._value.get() - before == 3
