"""Topology through the resolver and the responder: what is filtered, what is cached, ECS."""

from __future__ import annotations

import asyncio
import ipaddress
import random
from pathlib import Path
from typing import Any

import dnslib
import pytest

from tests.differential import Frontends, frame, reference_reply
from tests.helpers import config_of, snapshot_of
from tests.objects import forwarder_service, headless, namespace, pod_locator, service
from tests.unit.test_hosts import hosts_of
from toposdns.resolve.autopath import AutopathOptions
from toposdns.resolve.client import TrustedService
from toposdns.resolve.resolver import resolve
from toposdns.serve.chain import Request
from toposdns.serve.responder import TCP4, UDP4, Responder
from toposdns.source.snapshot_file import load_records
from toposdns.store.builder import StoreBuilder, build_snapshot
from toposdns.store.convert import convert_object
from toposdns.store.model import PodLocator
from toposdns.store.turns import TurnCounts
from toposdns.wire.codes import AAAA, NOERROR, NXDOMAIN, PTR, SRV, TXT, A
from toposdns.wire.decode import decode_query

NODE_A = {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1"}
NODE_B = {"kubernetes.io/hostname": "node-b", "topology.kubernetes.io/zone": "z1"}
NODE_C = {"kubernetes.io/hostname": "node-c", "topology.kubernetes.io/zone": "z2"}
NODE_D = {"kubernetes.io/hostname": "node-d", "topology.kubernetes.io/zone": "z3"}


ENDPOINTS = [
    {"addresses": ["10.1.0.1"], "hostname": "web-0", "nodeName": "node-a", "zone": "z1"},
    {"addresses": ["10.3.0.1"], "hostname": "web-1", "nodeName": "node-c", "zone": "z2"},
    {"addresses": ["10.3.0.2"], "hostname": "web-2", "nodeName": "node-c", "zone": "z2"},
]
KEYS = ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]
OBJECTS = [
    namespace("shop"),
    *headless("web", "shop", ENDPOINTS, topologyKeys=KEYS),
    *headless(
        "zonal",
        "shop",
        ENDPOINTS,
        annotations={"toposdns.io/topology-keys": "topology.kubernetes.io/zone"},
    ),
    *headless("near", "shop", ENDPOINTS, trafficDistribution="PreferSameNode"),
    *headless("bad", "shop", ENDPOINTS, topologyKeys=["*", "kubernetes.io/hostname"]),
    *headless("empty", "shop", [], topologyKeys=KEYS),
    service(
        "alias",
        cluster_ip=None,
        ports=(),
        type="ExternalName",
        externalName="web.shop.svc.cluster.local",
    ),
    pod_locator("client-a", addresses=["127.0.0.2"], node_name="node-a", node_labels=NODE_A),
    pod_locator("client-b", addresses=["127.0.0.3"], node_name="node-b", node_labels=NODE_B),
    pod_locator("client-c", addresses=["127.0.0.4"], node_name="node-c", node_labels=NODE_C),
    pod_locator(
        "node-d", addresses=["127.0.0.5"], node_name="node-d", node_labels=NODE_D, role="node"
    ),
]
SNAPSHOT = snapshot_of(OBJECTS)
CONFIG = config_of(zones=["cluster.local", "in-addr.arpa"])


def ips(name: str, labels: dict[str, str], qtype: int = A) -> list[str]:
    answer = resolve(tuple(name.split(".")), qtype, SNAPSHOT, CONFIG, labels)
    return sorted(str(rr.rdata) for rr in answer.answer if rr.rtype in (A, AAAA))


@pytest.mark.parametrize(
    ("service", "client", "want"),
    [
        ("web", NODE_A, ["10.1.0.1"]),  # same node
        ("web", NODE_B, ["10.1.0.1"]),  # same zone
        ("web", NODE_C, ["10.3.0.1", "10.3.0.2"]),  # same node, the whole tier
        ("web", NODE_D, ["10.1.0.1", "10.3.0.1", "10.3.0.2"]),  # "*"
        ("web", {}, ["10.1.0.1", "10.3.0.1", "10.3.0.2"]),  # unknown client, last key "*"
        ("zonal", NODE_B, ["10.1.0.1"]),
        ("zonal", NODE_D, []),  # no tier: NODATA
        ("zonal", {}, []),  # unknown client and no "*": nothing
        ("near", NODE_A, ["10.1.0.1"]),
        ("near", NODE_B, ["10.1.0.1"]),
        ("near", NODE_D, ["10.1.0.1", "10.3.0.1", "10.3.0.2"]),
        ("bad", NODE_A, ["10.1.0.1", "10.3.0.1", "10.3.0.2"]),  # invalid: ignored
    ],
)
def test_headless_a(service: str, client: dict[str, str], want: list[str]) -> None:
    assert ips(f"{service}.shop.svc.cluster.local", client) == want


@pytest.mark.parametrize(
    ("name", "qtype", "client", "tier"),
    [
        ("web", A, NODE_A, "kubernetes.io/hostname"),
        ("web", A, NODE_B, "topology.kubernetes.io/zone"),
        ("web", A, NODE_D, "*"),
        ("web", A, {}, "*"),
        ("web", AAAA, NODE_A, "kubernetes.io/hostname"),  # the tier matched; it has no AAAA
        ("_http._tcp.web", SRV, NODE_C, "kubernetes.io/hostname"),
        ("zonal", A, NODE_D, "none"),
        ("near", A, NODE_B, "topology.kubernetes.io/zone"),
        ("alias", A, NODE_A, "kubernetes.io/hostname"),  # the CNAME's target was filtered
        ("bad", A, NODE_A, ""),  # invalid: no policy applied, no tier
        ("web-1.web", A, NODE_A, ""),  # endpoint names are not filtered
    ],
)
def test_answer_names_the_tier(name: str, qtype: int, client: dict[str, str], tier: str) -> None:
    qname = tuple(f"{name}.shop.svc.cluster.local".split("."))
    answer = resolve(qname, qtype, SNAPSHOT, CONFIG, client)
    assert answer.tier == tier
    assert (answer.policy is not None) == bool(tier)


def test_no_tier_is_nodata_with_soa_and_depends_on_the_client() -> None:
    answer = resolve(("zonal", "shop", "svc", "cluster", "local"), A, SNAPSHOT, CONFIG, NODE_D)
    assert answer.rcode == NOERROR and not answer.answer and answer.authority
    assert answer.policy is not None
    # A negative TTL of 0: a resolver that ignores its ECS scope cannot spread it.
    (soa,) = answer.authority
    assert (soa.ttl, soa.rdata.minimum) == (0, 0)
    # The same name's NODATA for a type it does not hold, for every client, keeps its TTL.
    txt = resolve(("zonal", "shop", "svc", "cluster", "local"), TXT, SNAPSHOT, CONFIG, NODE_D)
    assert (txt.authority[0].ttl, txt.authority[0].rdata.minimum) == (5, 5)


def test_topology_nodata_through_the_caches_has_ttl_0() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    for _ in range(2):
        reply = ask(responder, "zonal.shop.svc.cluster.local", "127.0.0.5")  # node-d: none
        assert reply.header.rcode == NOERROR and not reply.rr
        assert [(rr.ttl, rr.rdata.times[-1]) for rr in reply.auth] == [(0, 0)]
        # Another client is answered from its own signature's reply.
        assert addresses(ask(responder, "zonal.shop.svc.cluster.local", "127.0.0.2")) == [
            "10.1.0.1"
        ]


def test_txt_of_a_filtered_name_is_nodata_for_every_client() -> None:
    # Whether the name exists does not depend on the client, even one no tier serves.
    for client in (NODE_A, NODE_D, {}):
        answer = resolve(
            ("zonal", "shop", "svc", "cluster", "local"), TXT, SNAPSHOT, CONFIG, client
        )
        assert (answer.rcode, answer.answer, answer.policy) == (NOERROR, (), None)


def test_no_endpoints_at_all_is_still_nxdomain() -> None:
    name = ("empty", "shop", "svc", "cluster", "local")
    assert resolve(name, A, SNAPSHOT, CONFIG, NODE_A).rcode == NXDOMAIN


def test_an_invalid_policy_does_not_depend_on_the_client() -> None:
    answer = resolve(("bad", "shop", "svc", "cluster", "local"), A, SNAPSHOT, CONFIG, NODE_A)
    assert answer.policy is None and len(answer.answer) == 3


def test_srv_is_filtered_and_weights_recomputed() -> None:
    name = ("_http", "_tcp", "web", "shop", "svc", "cluster", "local")
    answer = resolve(name, SRV, SNAPSHOT, CONFIG, NODE_C)
    assert sorted(rr.rdata_text() for rr in answer.answer) == [
        "0 50 80 web-1.web.shop.svc.cluster.local.",
        "0 50 80 web-2.web.shop.svc.cluster.local.",
    ]
    assert sorted(str(rr.rdata) for rr in answer.additional) == ["10.3.0.1", "10.3.0.2"]


def test_endpoint_names_and_ptr_are_not_filtered() -> None:
    assert ips("web-1.web.shop.svc.cluster.local", NODE_A) == ["10.3.0.1"]
    ptr = resolve(("1", "0", "3", "10", "in-addr", "arpa"), PTR, SNAPSHOT, CONFIG, NODE_A)
    # The fixture reuses the endpoints in four services: one PTR each, whatever the client.
    assert sorted(rr.rdata_text() for rr in ptr.answer) == [
        f"web-1.{svc}.shop.svc.cluster.local." for svc in ("bad", "near", "web", "zonal")
    ]
    assert ptr.policy is None


def test_cname_chase_into_a_headless_service_is_filtered() -> None:
    answer = resolve(("alias", "shop", "svc", "cluster", "local"), A, SNAPSHOT, CONFIG, NODE_A)
    assert [rr.rdata_text() for rr in answer.answer] == ["web.shop.svc.cluster.local.", "10.1.0.1"]
    assert answer.policy is not None


# The responder: identity by source address or trusted ECS, caches keyed by signature.


def client_subnet(prefix: str) -> dnslib.EDNSOption:
    """A Client Subnet option (RFC 7871) for `prefix`, SCOPE 0, as a forwarder sends it."""
    network = ipaddress.ip_network(prefix)
    length = network.prefixlen
    raw = network.network_address.packed[: (length + 7) // 8]
    return dnslib.EDNSOption(8, bytes((0, 1 if network.version == 4 else 2, length, 0)) + raw)


def ask(
    responder: Responder, name: str, source: str, ecs: str | tuple[str, ...] | None = None
) -> dnslib.DNSRecord:
    """Ask `name` from `source`, with one Client Subnet option or several (in that order)."""
    q = dnslib.DNSRecord.question(name)
    if ecs is not None:
        prefixes = (ecs,) if isinstance(ecs, str) else ecs
        q.add_ar(dnslib.EDNS0(opts=[client_subnet(prefix) for prefix in prefixes]))
    data = bytes(q.pack())
    reply = responder.respond(data, UDP4, source)
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


def addresses(reply: dnslib.DNSRecord) -> list[str]:
    return sorted(str(rr.rdata) for rr in reply.rr if rr.rtype == 1)


def test_clients_get_their_own_answers_from_the_wire_cache() -> None:
    responder = Responder(CONFIG, SNAPSHOT)
    for _ in range(2):  # the second round is served from the wire cache
        assert addresses(ask(responder, "web.shop.svc.cluster.local", "127.0.0.2")) == ["10.1.0.1"]
        assert addresses(ask(responder, "web.shop.svc.cluster.local", "127.0.0.4")) == [
            "10.3.0.1",
            "10.3.0.2",
        ]
        assert len(addresses(ask(responder, "web.shop.svc.cluster.local", "127.0.0.9"))) == 3
    # One wire entry for the name, one reply per signature; never one per address.
    (entry,) = responder.cache.table.values()
    assert not isinstance(entry, bytes) and len(entry.replies) == 3


def test_answers_are_counted_per_policy_and_tier_cached_or_not() -> None:
    responder = Responder(CONFIG, SNAPSHOT, (ipaddress.ip_network("127.0.0.100/32"),))
    for _ in range(3):  # the first answer is resolved, the next two come from the wire cache
        ask(responder, "web.shop.svc.cluster.local", "127.0.0.2")  # node-a
        ask(responder, "web.shop.svc.cluster.local", "127.0.0.9")  # nobody's: "*"
        ask(responder, "zonal.shop.svc.cluster.local", "127.0.0.5")  # node-d, zone z3: none
        ask(responder, "web.shop.svc.cluster.local", "127.0.0.100", ecs="127.0.0.8/32")
        ask(responder, "web-0.web.shop.svc.cluster.local", "127.0.0.9")  # not filtered
    rows = responder.topology_counts.rows
    assert rows == {
        ("topologyKeys", "kubernetes.io/hostname"): [3, 0],
        ("topologyKeys", "*"): [6, 6],  # unplaced: by source, then by trusted ECS
        ("annotation", "none"): [3, 0],
    }


def test_clients_of_one_zone_share_a_cached_answer() -> None:
    objects = OBJECTS + [
        pod_locator(
            f"z1-{i}",
            addresses=[f"10.9.0.{i}"],
            node_name=f"n{i}",
            node_labels={**NODE_A, "kubernetes.io/hostname": f"n{i}"},
        )
        for i in range(1, 50)
    ]
    responder = Responder(CONFIG, snapshot_of(objects))
    for i in range(1, 50):
        assert addresses(ask(responder, "zonal.shop.svc.cluster.local", f"10.9.0.{i}")) == [
            "10.1.0.1"
        ]
    (entry,) = responder.cache.table.values()  # one reply for the zone's signature
    assert not isinstance(entry, bytes) and len(entry.replies) == 1


def test_ecs_is_believed_only_from_trusted_sources() -> None:
    trusted = Responder(CONFIG, SNAPSHOT, (ipaddress.ip_network("127.0.0.100/32"),))
    via_ecs = ask(trusted, "web.shop.svc.cluster.local", "127.0.0.100", ecs="127.0.0.4/32")
    assert addresses(via_ecs) == ["10.3.0.1", "10.3.0.2"]
    option = via_ecs.ar[0].rdata[0]
    assert option.code == 8 and option.data == bytes((0, 1, 32, 32, 127, 0, 0, 4))  # scope 32
    untrusted = ask(trusted, "web.shop.svc.cluster.local", "127.0.0.2", ecs="127.0.0.4/32")
    assert addresses(untrusted) == ["10.1.0.1"]  # the packet's source, node-a
    assert untrusted.ar[0].rdata[0].data[3] == 0  # scope 0: ECS was not used


def two_subnets_from_a_forwarder(path: str) -> dnslib.DNSRecord:
    """node-a's client 127.0.0.2 asks through a trusted forwarder whose `set` wrote its address
    into the first Client Subnet option; the client's own second option claims node-c's
    127.0.0.4. `path`: the responder's, or the full decoder's (the differential test's
    reference)."""
    trust = (ipaddress.ip_network("127.0.0.100/32"),)
    q = dnslib.DNSRecord.question(WEB)
    q.add_ar(dnslib.EDNS0(opts=[client_subnet("127.0.0.2/32"), client_subnet("127.0.0.4/32")]))
    data = bytes(q.pack())
    if path == "responder":
        reply = Responder(CONFIG, SNAPSHOT, trust).respond(data, UDP4, "127.0.0.100")
    else:
        reply = reference_reply(data, UDP4, "127.0.0.100", SNAPSHOT, CONFIG, trust)
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


@pytest.mark.parametrize("path", ["responder", "decoder"])
def test_the_first_client_subnet_counts(path: str) -> None:
    # CoreDNS's `rewrite edns0 subnet set` overwrites the first Client Subnet option only.
    reply = two_subnets_from_a_forwarder(path)
    assert addresses(reply) == ["10.1.0.1"]  # node-a's, not node-c's
    (option,) = reply.ar[-1].rdata  # the one echoed is the one that placed the client
    assert option.data == bytes((0, 1, 32, 32, 127, 0, 0, 2))


def test_ecs_scope_is_zero_when_the_answer_does_not_depend_on_the_client() -> None:
    responder = Responder(CONFIG, SNAPSHOT, (ipaddress.ip_network("127.0.0.0/8"),))
    reply = ask(responder, "web-0.web.shop.svc.cluster.local", "127.0.0.1", ecs="127.0.0.4/32")
    assert addresses(reply) == ["10.1.0.1"] and reply.ar[0].rdata[0].data[3] == 0


# --- ECS trusted from a Service's endpoints (--ecs-trust-service) -------------------------------

FORWARDERS = TrustedService("kube-system", "coredns")


def forwarder_objects(*endpoints: str) -> list[dict[str, Any]]:
    """OBJECTS plus a `kube-system/coredns` Service whose ready endpoints are `endpoints` (and a
    not-ready one, which is no forwarder to trust)."""
    return [
        *OBJECTS,
        namespace("kube-system"),
        *forwarder_service(*endpoints, not_ready=["127.0.0.102"]),
    ]


WEB = "web.shop.svc.cluster.local"


def client_a(node: str, labels: dict[str, str]) -> dict[str, Any]:
    return pod_locator("client-a", addresses=["127.0.0.2"], node_name=node, node_labels=labels)


EVERY_WEB = ["10.1.0.1", "10.3.0.1", "10.3.0.2"]  # an unplaced client under a list ending in *
NODE_C_WEB = ["10.3.0.1", "10.3.0.2"]  # 127.0.0.4's answer: node-c's endpoints


def scope(reply: dnslib.DNSRecord) -> int:
    (option,) = reply.ar[0].rdata
    return int(option.data[3])


def test_ecs_from_outside_the_trusted_service_changes_nothing() -> None:
    responder = Responder(CONFIG, snapshot_of(forwarder_objects("127.0.0.100")), (FORWARDERS,))
    # Placed by its own address (node-a), the ECS option ignored: scope 0.
    reply = ask(responder, WEB, "127.0.0.2", ecs="127.0.0.4/32")
    assert addresses(reply) == ["10.1.0.1"] and scope(reply) == 0
    # Nobody's address: unplaced, whatever it claims.
    for outsider in ("127.0.0.101", "127.0.0.102", "10.96.0.20"):
        reply = ask(responder, WEB, outsider, ecs="127.0.0.4/32")
        assert addresses(reply) == EVERY_WEB and scope(reply) == 0, outsider


def test_ecs_from_an_endpoint_of_the_trusted_service_places_the_client() -> None:
    trust = (ipaddress.ip_network("127.0.0.200/32"), FORWARDERS)  # both flags together
    objects = forwarder_objects("127.0.0.100", "127.0.0.103")
    responder = Responder(CONFIG, snapshot_of(objects), trust)
    for forwarder in ("127.0.0.100", "127.0.0.103", "127.0.0.200"):
        reply = ask(responder, WEB, forwarder, ecs="127.0.0.4/32")
        assert addresses(reply) == NODE_C_WEB and scope(reply) == 32, forwarder
        # Without ECS, the forwarder is placed by its own address, like any client.
        assert addresses(ask(responder, WEB, forwarder)) == EVERY_WEB


def test_the_trusted_set_follows_the_endpoints() -> None:
    responder = Responder(CONFIG, snapshot_of(forwarder_objects("127.0.0.100")), (FORWARDERS,))
    assert addresses(ask(responder, WEB, "127.0.0.100", ecs="127.0.0.4/32")) == NODE_C_WEB
    assert addresses(ask(responder, WEB, "127.0.0.101", ecs="127.0.0.4/32")) == EVERY_WEB
    # The forwarder pod is replaced: the old address is trusted no longer, the new one is.
    responder.update(snapshot_of(forwarder_objects("127.0.0.101")))
    assert addresses(ask(responder, WEB, "127.0.0.100", ecs="127.0.0.4/32")) == EVERY_WEB
    assert addresses(ask(responder, WEB, "127.0.0.101", ecs="127.0.0.4/32")) == NODE_C_WEB
    # The Service loses its endpoints (or goes): nothing is trusted.
    responder.update(snapshot_of(forwarder_objects()))
    assert addresses(ask(responder, WEB, "127.0.0.101", ecs="127.0.0.4/32")) == EVERY_WEB
    responder.update(snapshot_of(OBJECTS))
    assert addresses(ask(responder, WEB, "127.0.0.101", ecs="127.0.0.4/32")) == EVERY_WEB


# The UDP frontend's fast path: a hit from a placed client is found by its placement, which
# each snapshot that moves the client must change.

MOVES: list[tuple[str, dict[str, Any] | None, list[str], int]] = [
    # (step, client-a's locator after it or None when removed, addresses, unplaced answers)
    ("placed on node-a", client_a("node-a", NODE_A), ["10.1.0.1"], 0),
    ("moved to node-c", client_a("node-c", NODE_C), NODE_C_WEB, 0),
    ("locator removed: unplaced", None, EVERY_WEB, 2),
    ("placed again, on node-b", client_a("node-b", NODE_B), ["10.1.0.1"], 0),
]


def test_a_udp_hit_follows_the_placement_of_its_source() -> None:
    builder = StoreBuilder()
    for obj in OBJECTS:
        builder.put(convert_object(obj))
    responder = Responder(CONFIG, builder.snapshot(1))
    frontends = Frontends(responder)
    data = bytes(dnslib.DNSRecord.question(WEB).pack())
    counted = 0
    for serial, (step, after, want, unplaced) in enumerate(MOVES, start=2):
        if after is None:
            builder.remove(PodLocator, "shop", "client-a")
        else:
            builder.put(convert_object(after))
        snapshot = builder.snapshot(serial)
        assert snapshot.changed_since(responder.snapshot) is not None, step  # not a reload
        responder.update(snapshot)
        rows = responder.topology_counts.rows
        before = sum(row[1] for row in rows.values())
        expected = reference_reply(data, UDP4, "127.0.0.2", snapshot, CONFIG)
        for _ in range(2):  # built, then a hit of the fast path, which renders nothing
            (got,) = frontends.over_udp(UDP4, data, "127.0.0.2")
            assert got == expected, step
            assert addresses(dnslib.DNSRecord.parse(got)) == want, step
        assert not responder.cache.renders[UDP4.slot], step
        counted += 2
        assert sum(row[0] for row in rows.values()) == counted, step
        assert sum(row[1] for row in rows.values()) - before == unplaced, step


def test_a_reply_rendered_for_one_client_is_not_replayed_to_another() -> None:
    # The same bytes (a cookie, so the reply is kept as rendered) from three placed clients.
    responder = Responder(CONFIG, SNAPSHOT)
    frontends = Frontends(responder)
    question = dnslib.DNSRecord.question(WEB)
    question.add_ar(dnslib.EDNS0(opts=[dnslib.EDNSOption(10, b"01234567")]))
    data = bytes(question.pack())
    for _ in range(3):  # built, found and rendered, then replayed: the same every time
        for source, want in (("127.0.0.2", ["10.1.0.1"]), ("127.0.0.4", NODE_C_WEB)):
            (got,) = frontends.over_udp(UDP4, data, source)
            assert got == reference_reply(data, UDP4, source, SNAPSHOT, CONFIG), source
            assert addresses(dnslib.DNSRecord.parse(got)) == want, source
    assert responder.cache.renders[UDP4.slot]


# Soft topology through the resolver and the responder's caches (docs/topology.md,
# "Soft topology"). Endpoints: web-0 on node-a (z1); web-1, web-2 on node-c (z2).

SOFT_OBJECTS = [
    namespace("shop"),
    *headless(
        "spill",
        "shop",
        ENDPOINTS,
        topologyKeys=KEYS,
        annotations={"toposdns.io/topology-min-endpoints": "2"},
    ),
    *headless(
        "prio",
        "shop",
        ENDPOINTS,
        trafficDistribution="PreferSameNode",
        annotations={"toposdns.io/topology-srv": "priority"},
    ),
    *headless(
        "weighted",
        "shop",
        ENDPOINTS,
        annotations={
            "toposdns.io/topology-keys": "topology.kubernetes.io/zone,*",
            "toposdns.io/topology-weights": "80,20",
        },
    ),
    *headless(
        "exact",
        "shop",
        ENDPOINTS[:2],
        topologyKeys=["topology.kubernetes.io/zone", "*"],
        annotations={"toposdns.io/topology-weights": "57,43"},
    ),
    *headless(
        "hard",
        "shop",
        ENDPOINTS,
        topologyKeys=KEYS,
        annotations={"toposdns.io/topology-weights": "80,20"},  # 2 weights for 3 tiers
    ),
    *OBJECTS[-4:],  # the clients' locators
]
SOFT_SNAPSHOT = snapshot_of(SOFT_OBJECTS)


def srv_texts(service: str, client: dict[str, str]) -> list[str]:
    name = ("_http", "_tcp", service, "shop", "svc", "cluster", "local")
    answer = resolve(name, SRV, SOFT_SNAPSHOT, CONFIG, client)
    return [rr.rdata_text() for rr in answer.answer]


def soft_ips(service: str, client: dict[str, str]) -> list[str]:
    answer = resolve((service, "shop", "svc", "cluster", "local"), A, SOFT_SNAPSHOT, CONFIG, client)
    return sorted(str(rr.rdata) for rr in answer.answer)


@pytest.mark.parametrize(
    ("service", "client", "a", "srv"),
    [
        # Spill-over: node-a's one replica is not enough, its zone holds no other: "*".
        (
            "spill",
            NODE_A,
            ["10.1.0.1", "10.3.0.1", "10.3.0.2"],
            ["0 33 80 web-0", "0 33 80 web-1", "0 33 80 web-2"],
        ),
        # node-c's two replicas are enough.
        ("spill", NODE_C, ["10.3.0.1", "10.3.0.2"], ["0 50 80 web-1", "0 50 80 web-2"]),
        # SRV priorities by tier: A keeps the nearest tier.
        ("prio", NODE_A, ["10.1.0.1"], ["0 100 80 web-0", "1 50 80 web-1", "1 50 80 web-2"]),
        ("prio", NODE_B, ["10.1.0.1"], ["0 100 80 web-0", "1 50 80 web-1", "1 50 80 web-2"]),
        (
            "prio",
            NODE_C,
            ["10.3.0.1", "10.3.0.2"],
            ["1 100 80 web-0", "0 50 80 web-1", "0 50 80 web-2"],
        ),
        (
            "prio",
            NODE_D,
            ["10.1.0.1", "10.3.0.1", "10.3.0.2"],
            ["0 33 80 web-0", "0 33 80 web-1", "0 33 80 web-2"],
        ),
        # Weights: SRV in priority 0, the zone's endpoints sharing 80, the others 20.
        ("weighted", NODE_A, ["10.1.0.1"], ["0 80 80 web-0", "0 10 80 web-1", "0 10 80 web-2"]),
        (
            "weighted",
            NODE_C,
            ["10.3.0.1", "10.3.0.2"],
            ["0 20 80 web-0", "0 40 80 web-1", "0 40 80 web-2"],
        ),
        # No endpoint in z3: the zone's share goes to "*".
        (
            "weighted",
            NODE_D,
            ["10.1.0.1", "10.3.0.1", "10.3.0.2"],
            ["0 33 80 web-0", "0 33 80 web-1", "0 33 80 web-2"],
        ),
        # Weights are whole: 57, not the 56 that float arithmetic would give.
        ("exact", NODE_A, ["10.1.0.1"], ["0 57 80 web-0", "0 43 80 web-1"]),
        # An invalid annotation: the hard policy.
        ("hard", NODE_A, ["10.1.0.1"], ["0 100 80 web-0"]),
    ],
)
def test_soft_answers(service: str, client: dict[str, str], a: list[str], srv: list[str]) -> None:
    assert soft_ips(service, client) == a
    suffix = f".{service}.shop.svc.cluster.local."
    assert srv_texts(service, client) == [text + suffix for text in srv]


def test_soft_answers_through_the_caches_agree_with_the_reference() -> None:
    responder = Responder(CONFIG, SOFT_SNAPSHOT)
    turns = TurnCounts()  # the reference's rotations, asked in the server's order
    for _ in range(2):  # the second round is served from the caches
        for name in ("spill", "prio", "weighted", "hard"):
            for qtype in ("A", "SRV"):
                for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.9"):
                    prefix = "_http._tcp." if qtype == "SRV" else ""
                    q = dnslib.DNSRecord.question(f"{prefix}{name}.shop.svc.cluster.local", qtype)
                    data = bytes(q.pack())
                    got = responder.respond(data, UDP4, source)
                    want = reference_reply(data, UDP4, source, SOFT_SNAPSHOT, CONFIG, turns=turns)
                    assert got == want, (name, qtype, source)
                    assert dnslib.DNSRecord.parse(got).header.rcode == NOERROR


def test_spillovers_and_weighted_answers_are_counted_cached_or_not() -> None:
    responder = Responder(CONFIG, SOFT_SNAPSHOT)
    for _ in range(2):  # built, then from the cache
        ask(responder, "spill.shop.svc.cluster.local", "127.0.0.2")  # node-a: spills to "*"
        ask(responder, "spill.shop.svc.cluster.local", "127.0.0.4")  # node-c: enough
        srv = dnslib.DNSRecord.question("_http._tcp.weighted.shop.svc.cluster.local", "SRV")
        assert isinstance(responder.respond(bytes(srv.pack()), UDP4, "127.0.0.4"), bytes)
        ask(responder, "weighted.shop.svc.cluster.local", "127.0.0.4")  # A: the zone's turns
    # 80,20 in turn: zone, zone, "*", zone, zone...
    ask(responder, "weighted.shop.svc.cluster.local", "127.0.0.4")  # "*"'s turn
    ask(responder, "weighted.shop.svc.cluster.local", "127.0.0.4")  # the zone's again
    assert responder.topology_counts.rows == {
        ("topologyKeys", "*", "spill-over"): [2, 0],
        ("topologyKeys", "kubernetes.io/hostname"): [2, 0],
        # Two SRV answers and three A replies from the zone's tier; one A reply from "*".
        ("annotation", "topology.kubernetes.io/zone", "weighted"): [5, 0],
        ("annotation", "*", "weighted"): [1, 0],
    }


def weighted_query(rng: random.Random, qtype: str = "A") -> bytes:
    """An A (or AAAA) query for `weighted` with a random ID, in one of the forms that take
    different paths through the server: plain, with EDNS, in another letter case."""
    form = rng.randrange(3)
    name = "weighted.shop.svc.cluster.local"
    if form == 2:
        name = "".join(rng.choice((c, c.upper())) for c in name)
    q = dnslib.DNSRecord.question(name, qtype)
    q.header.id = rng.randrange(65536)
    if form == 1:
        q.add_ar(dnslib.EDNS0(udp_len=1232))
    return bytes(q.pack())


def test_weighted_a_replies_take_turns_on_every_path() -> None:
    # node-c's client (127.0.0.4), zone z2: its zone's two replicas answer 80 replies in 100,
    # every endpoint ("*") 20, whether the reply comes from the UDP
    # fast path, the cache's other paths, TCP or the resolver (other letter case), each
    # taking the next turn.
    asyncio.run(take_turns())  # the TCP frontend sets timers


async def take_turns() -> None:
    responder = Responder(CONFIG, SOFT_SNAPSHOT)
    frontends = Frontends(responder)
    turns = TurnCounts()
    rng = random.Random(7)
    zone = everyone = 0
    for turn in range(200):
        data = weighted_query(rng)
        want = reference_reply(data, UDP4, "127.0.0.4", SOFT_SNAPSHOT, CONFIG, turns=turns)
        assert want is not None
        if turn % 5 == 4:
            (got,) = frontends.over_tcp(TCP4, [frame(data)], "127.0.0.4")
        else:
            (got,) = frontends.over_udp(UDP4, data, "127.0.0.4")
        served = addresses(dnslib.DNSRecord.parse(got))
        assert served == addresses(dnslib.DNSRecord.parse(want)), turn
        if served == ["10.3.0.1", "10.3.0.2"]:
            zone += 1
        else:
            assert served == ["10.1.0.1", "10.3.0.1", "10.3.0.2"]
            everyone += 1
        if turn == 99:
            assert (zone, everyone) == (80, 20)
    assert (zone, everyone) == (160, 40)
    frontends.close()


def test_weighted_a_replies_are_byte_for_byte_the_references() -> None:
    responder = Responder(CONFIG, SOFT_SNAPSHOT)
    frontends = Frontends(responder)
    turns = TurnCounts()
    rng = random.Random(3)
    for turn in range(150):
        qtype = rng.choice(("A", "AAAA"))
        source = rng.choice(("127.0.0.2", "127.0.0.4", "127.0.0.5", "127.0.0.9"))
        data = weighted_query(rng, qtype)
        want = reference_reply(data, UDP4, source, SOFT_SNAPSHOT, CONFIG, turns=turns)
        assert frontends.over_udp(UDP4, data, source) == [want], (turn, qtype, source)
    frontends.close()


def test_weighted_a_replies_take_turns_through_autopath() -> None:
    # A pod's search path completed by autopath: the name it finds takes its turn too.
    responder = Responder(CONFIG, SOFT_SNAPSHOT, autopath=AutopathOptions(enabled=True))
    served = []
    for _ in range(5):
        reply = ask(
            responder, "weighted.shop.svc.cluster.local.shop.svc.cluster.local", "127.0.0.4"
        )
        assert reply.rr[0].rtype == 5  # the CNAME to the name found
        served.append(addresses(reply))
    zone, other = ["10.3.0.1", "10.3.0.2"], ["10.1.0.1", "10.3.0.1", "10.3.0.2"]
    assert served == [zone, zone, other, zone, zone]  # 80,20: "*" has the third turn


def test_weighted_a_replies_take_turns_behind_a_plugin(tmp_path: Path) -> None:
    # With a plugin before kubernetes (hosts), a miss is made by the cache-filling path and a
    # query with options by the kubernetes handler: each takes its turn, as a hit does.
    responder = Responder(
        CONFIG, SOFT_SNAPSHOT, plugins=[hosts_of(tmp_path, "192.0.2.1 other\n", fallthrough=((),))]
    )
    turns = TurnCounts()
    rng = random.Random(5)
    for turn in range(40):
        data = weighted_query(rng)
        want = reference_reply(data, UDP4, "127.0.0.4", SOFT_SNAPSHOT, CONFIG, turns=turns)
        assert responder.respond(data, UDP4, "127.0.0.4") == want, turn


def test_the_kubernetes_handler_takes_turns_too() -> None:
    # What the chain's kubernetes handler answers itself (a query the cache does not make)
    # takes the next turn of the same rotation as the cache's replies.
    responder = Responder(CONFIG, SOFT_SNAPSHOT)
    served = []
    for _ in range(5):
        data = bytes(dnslib.DNSRecord.question("weighted.shop.svc.cluster.local").pack())
        request = Request(decode_query(data), data, UDP4, "127.0.0.4")
        reply = responder.kubernetes.serve(request, lambda passed: None)
        assert isinstance(reply, bytes)
        served.append(addresses(dnslib.DNSRecord.parse(reply)))
    zone, everyone = ["10.3.0.1", "10.3.0.2"], ["10.1.0.1", "10.3.0.1", "10.3.0.2"]
    assert served == [zone, zone, everyone, zone, zone]
    # The cache's next reply is the sixth turn: the zone's (80,20: "*" has the third and eighth).
    assert addresses(ask(responder, "weighted.shop.svc.cluster.local", "127.0.0.4")) == zone


EXAMPLE = Path(__file__).parents[2] / "examples" / "topology-soft.yaml"


@pytest.mark.parametrize(
    ("name", "qtype", "client", "want"),
    [
        ("api", A, NODE_A, ["10.244.1.10", "10.244.2.10"]),
        ("api", A, NODE_C, ["10.244.3.10", "10.244.3.11"]),
        (
            "_grpc._tcp.grpc",
            SRV,
            NODE_A,
            ["0 100 9000 grpc-0", "1 100 9000 grpc-1", "2 100 9000 grpc-2"],
        ),
        ("grpc", A, NODE_A, ["10.244.1.20"]),
        (
            "_http._tcp.search",
            SRV,
            NODE_C,
            ["0 20 80 search-0", "0 40 80 search-1", "0 40 80 search-2"],
        ),
        ("search", A, NODE_C, ["10.244.3.30", "10.244.3.31"]),
    ],
)
def test_the_readme_soft_example(
    name: str, qtype: int, client: dict[str, str], want: list[str]
) -> None:
    snapshot = build_snapshot(load_records(EXAMPLE), serial=1)
    answer = resolve(
        tuple(f"{name}.shop.svc.cluster.local".split(".")), qtype, snapshot, CONFIG, client
    )
    if qtype == SRV:
        suffix = "." + name.split(".")[-1] + ".shop.svc.cluster.local."
        assert [rr.rdata_text() for rr in answer.answer] == [text + suffix for text in want]
    else:
        assert sorted(str(rr.rdata) for rr in answer.answer) == want
