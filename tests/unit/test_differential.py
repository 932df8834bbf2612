"""Differential test: what the real frontends serve is, byte for byte, what the reference says.

A seeded random cluster goes through rounds of random changes (services, slices, namespaces,
locators, node labels), each published as a new snapshot. After each, generated queries (every
name form, qtype, EDNS option and client placement, and some malformed packets) go to the real
UDP and TCP protocols, each twice so that the second is served from the caches; every reply must
equal tests/differential.py's `reference_reply`, which has no cache at all. Queries are drawn
from a fixed pool, so a reply cached before a change is asked for again after it.

The `manifests` configuration runs as the manifests do (forwarding to a fake upstream on
loopback, autopath, loadbalance, reverse fallthrough): there the replies an upstream or
autopath had a hand in are compared in what a client relies on (`relied_on`), the rest byte
for byte. The `blocks` configuration puts the cluster zone in a server block of its own beside
a block for corp.example (tests/differential.py `FixedZone`): every frontend path must send each
name to its block, or REFUSED where no block holds it, as the reference does. The `port`
configuration is a port without the kubernetes block, where only the corp.example block
answers: its caches and templates must never answer (nothing is cached).

Environment: TOPOSDNS_DIFF_ROUNDS and TOPOSDNS_DIFF_QUERIES (per round) make longer runs,
TOPOSDNS_DIFF_SEED picks the seed (an integer, or "random").
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from struct import pack
from typing import Any, TypeVar

import dnslib
import pytest

from tests.differential import (
    FixedZone,
    Frontends,
    frame,
    reference_relayed,
    reference_reply,
    relied_on,
    render,
)
from tests.helpers import config_of
from tests.upstream import StubUpstream
from toposdns.resolve.autopath import AutopathOptions
from toposdns.resolve.client import Network
from toposdns.serve.blocks import BlockConfig, Blocks
from toposdns.serve.chain import chain
from toposdns.serve.forward import Forwarder
from toposdns.serve.responder import TCP4, TCP6, UDP4, UDP6, Responder, Transport
from toposdns.serve.upstream import Upstream
from toposdns.store.builder import StoreBuilder
from toposdns.store.model import (
    CLUSTER_IP,
    EXTERNAL_NAME,
    HEADLESS,
    NO_PORT,
    Endpoint,
    EndpointSlice,
    Namespace,
    PodLocator,
    Port,
    Record,
    Service,
    canonical_ip,
)
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import HOSTNAME, REGION, TRAFFIC_DISTRIBUTIONS, ZONE
from toposdns.store.turns import TurnCounts
from toposdns.wire.codes import AAAA, ANY, AXFR, CNAME, MX, NS, PTR, SOA, SRV, TXT, A
from toposdns.wire.decode import Dropped, Rejected, decode_query, read_name, record_spans
from toposdns.wire.encode import MAX_TCP_SIZE, MAX_UDP_SIZE, bound_buffer, udp_limit

ROUNDS = int(os.environ.get("TOPOSDNS_DIFF_ROUNDS", "20"))
QUERIES = int(os.environ.get("TOPOSDNS_DIFF_QUERIES", "200"))
SEED = os.environ.get("TOPOSDNS_DIFF_SEED", "")
POOL_SIZE = 300
FIRST_SERIAL = 1_700_000_000

# The universe the cluster and the queries draw from: small, so that names and addresses collide.
NAMESPACES = ("default", "shop", "data", "ghost")
SERVICES = ("web", "db", "api", "alias", "big")
NODES = ("node-a", "node-b", "node-c", "node-d", "node-e")
ZONES = ("z1", "z2", "z3")
NODE_IPS = {node: (f"192.168.0.{i}", f"127.0.0.{21 + i}") for i, node in enumerate(NODES)}
CLUSTER_V4 = tuple(f"10.96.0.{i}" for i in range(1, 6))
CLUSTER_V6 = ("fd00:96::1", "fd00:96::2", "fd00:96:0:0::3")  # as written, not canonical
ENDPOINT_V4 = (*(f"10.1.0.{i}" for i in range(1, 8)), "127.0.0.3")  # a client is a pod too
ENDPOINT_V6 = ("fd00:1::1", "fd00:1::2", "fd00:1:0::3", "fd00:1::a")
BIG_V4 = tuple(f"10.2.0.{i}" for i in range(1, 46))  # enough to truncate and fragment
BIG_V6 = tuple(f"fd00:2::{i:x}" for i in range(1, 46))
PORTS = (
    Port("http", "TCP", 80),
    Port("dns", "UDP", 53),
    Port("", "TCP", 8080),  # unnamed
    Port("grpc", "TCP", 9090),
    Port("metrics", "SCTP", 9100),
    Port("all", "TCP", 0),  # a slice port without a number
)
#: A slice's ports now and then: 45 endpoints of "big" then hold 4,500 SRV records, an answer
#: larger than any message (built no further than a reply holds, and cut, TC set over TCP too).
MANY_PORTS = tuple(Port(f"p{i}", "TCP", 20000 + i) for i in range(100))
HOSTNAMES = ("", "", "", "pod-0", "pod-1", "db-0")
POD_NAMES = ("", "web-7f9c-abcde", "db-0")
EXTERNAL_NAMES = (
    "web.shop.svc.cluster.local",
    "db.data.svc.cluster.local.",
    "Alias.Default.SVC.cluster.local",
    "big.shop.svc.cluster.local",
    "nothing.shop.svc.cluster.local",
    "example.com",
    "www.example.org.",
    "10.0.0.1",  # an IP in externalName is ignored
)
KEY_LISTS = (
    (HOSTNAME, ZONE, "*"),
    (HOSTNAME, ZONE, "*"),
    (ZONE,),
    (ZONE,),
    (ZONE, "*"),
    (HOSTNAME,),
    (REGION, "*"),
    ("*", HOSTNAME),  # invalid: "*" not last
    ("bad key!",),
    ("",),  # an empty annotation
)
#: The kinds a service of each name may be (most are headless, where topology matters).
KINDS = {
    "db": (HEADLESS,),
    "big": (HEADLESS, HEADLESS, HEADLESS, CLUSTER_IP),
    "api": (CLUSTER_IP,),
    "alias": (EXTERNAL_NAME, EXTERNAL_NAME, EXTERNAL_NAME, HEADLESS),
}
DISTRIBUTIONS = ("PreferSameNode", "PreferSameZone", "PreferClose", "PreferElsewhere")

#: Client addresses: pod locators may place them; .9 and fd00::11 never are; 127.0.0.22+ are
#: node addresses (host-network clients).
CLIENT_V4 = (*(f"127.0.0.{i}" for i in range(2, 10)), "127.0.0.22", "127.0.0.24")
CLIENT_V6 = ("fd00::10", "fd00::11", "fe80::1")
#: Forwarders whose ECS is believed (and which may be placed themselves).
FORWARDERS = ("127.0.0.53", "fd00::53")
ECS_TRUST: tuple[Network, ...] = (
    ipaddress.ip_network("127.0.0.53/32"),
    ipaddress.ip_network("fd00::53/128"),
)
ECS_ADDRESSES = ("127.0.0.2", "127.0.0.4", "10.1.0.1", "192.168.0.3", "203.0.113.9", "fd00::10")
#: Prefixes node locators may carry: nested, overlapping, and now and then on two nodes at once.
NODE_CIDRS = (
    "127.0.0.0/24",
    "127.0.0.8/30",
    "127.0.0.0/29",
    "127.0.0.0/16",
    "10.1.0.0/29",
    "10.1.0.0/24",
    "fd00::/64",
    "fd00::10/127",
    "fd00:1::/120",
)

#: What a run without endpoints never meets (only headless services have large answers).
UNTRUNCATED = {"compressed", "ECS scope", "truncated", "cut over TCP"}

CONFIGS = {
    "defaults": (
        config_of(
            zones=["cluster.local", "in-addr.arpa", "ip6.arpa"],
            pods="verified",
            ns_addresses=["10.1.0.1"],
        ),
        (("cluster", "local"),),
    ),
    "options": (
        config_of(
            zones=["Cluster.Local", "example.org", "in-addr.arpa", "ip6.arpa"],
            ttl=30,
            pods="insecure",
            endpoint_pod_names=True,
            namespaces=["shop", "data", "ghost"],
            ns_addresses=["192.0.2.53", "fd00:1::1"],
            zonal=True,
            ignore_empty_service=True,
        ),
        (("cluster", "local"), ("example", "org")),
    ),
    # kubeadm's Corefile as the manifests run it: reverse names fall through (to SERVFAIL here,
    # with no upstream), and --loadbalance reorders addresses.
    "kubeadm": (
        replace(
            config_of(zones=["cluster.local", "in-addr.arpa", "ip6.arpa"], ttl=30, pods="insecure"),
            fallthrough=(("in-addr", "arpa"), ("ip6", "arpa")),
        ),
        (("cluster", "local"),),
    ),
    # The manifests' Corefile whole: `forward . <upstream>`, `autopath @kubernetes` with
    # `pods verified`, loadbalance and reverse fallthrough, against a fake upstream.
    "manifests": (
        replace(
            config_of(zones=["cluster.local", "in-addr.arpa", "ip6.arpa"], ttl=30, pods="verified"),
            fallthrough=(("in-addr", "arpa"), ("ip6", "arpa")),
        ),
        (("cluster", "local"),),
    ),
    # The cluster zone in a server block of its own, beside a block for corp.example: reverse
    # names and names outside both get REFUSED, corp.example's its block's fixed replies.
    "blocks": (
        config_of(zones=["cluster.local", "in-addr.arpa", "ip6.arpa"], pods="verified"),
        (("cluster", "local"), ("corp", "example")),
    ),
    # A port without the kubernetes block, a server of its own: every name goes to the block
    # for corp.example or gets REFUSED, whatever the responder's zones say.
    "port": (
        config_of(zones=["cluster.local", "in-addr.arpa", "ip6.arpa"], pods="verified"),
        (("cluster", "local"), ("corp", "example")),
    ),
    "noendpoints": (
        config_of(
            zones=["cluster.local", "in-addr.arpa", "ip6.arpa"],
            pods="verified",
            ns_addresses=["10.1.0.1"],
            noendpoints=True,
        ),
        (("cluster", "local"),),
    ),
}
#: The configurations run with --loadbalance: replies are compared up to their address order.
BALANCED = frozenset({"kubeadm", "manifests"})
#: The configurations that forward to a fake upstream, with --autopath.
FORWARDING = frozenset({"manifests"})
#: The configurations with server blocks: the kubernetes block's zones, and another block's.
BLOCKS = {
    "blocks": ([("cluster", "local")], [("corp", "example")]),
    "port": ([], [("corp", "example")]),
}
#: The node's search domains, which autopath walks after the cluster's.
NODE_SEARCH = (("corp", "test"),)
#: What the fake upstream knows: names the queries ask outside the zones, the ExternalName
#: targets, a name found by autopath on the node's search domain, and reverse names that fall
#: through. Small answers, so that the upstream never truncates.
UPSTREAM = {
    ("example.com", "A"): ["example.com. 300 IN A 93.184.216.34"],
    ("example.com", "AAAA"): ["example.com. 300 IN AAAA 2606:2800:220:1::248"],
    ("example.com", "TXT"): ['example.com. 60 IN TXT "v=spf1 -all"'],
    ("www.example.org", "A"): [
        "www.example.org. 120 IN CNAME example.org.",
        "example.org. 120 IN A 192.0.2.80",
    ],
    ("api.example.com", "A"): ["api.example.com. 45 IN A 192.0.2.45"],
    ("www.corp.test", "A"): ["www.corp.test. 90 IN A 192.0.2.90"],
    ("www.corp.test", "AAAA"): ["www.corp.test. 90 IN AAAA 2001:db8::90"],
    ("www", "A"): ["www. 30 IN A 192.0.2.1"],
    ("9.9.9.10.in-addr.arpa", "PTR"): ["9.9.9.10.in-addr.arpa. 300 IN PTR nine.example.com."],
}

R = TypeVar("R", bound=Record)


#: Soft-topology annotations (min-endpoints, srv, weights) the random services draw from.
SOFT_VALUES: tuple[tuple[str, ...], ...] = (
    ("1", "2", "3", "50%", "100%", "0"),
    ("priority", "priority", "weighted"),
    ("80,20", "60,30,10", "100", "0,100", "50,50,0", "70,30,0,0", "x"),
)


def moved(locator: PodLocator, node: str, labels: dict[str, str]) -> PodLocator:
    """The locator on another node, or with other node labels."""
    return PodLocator(
        locator.namespace,
        locator.name,
        locator.addresses,
        node,
        labels,
        locator.is_node,
        locator.cidrs,
        locator.pod_namespace,
    )


class Cluster:
    """A random cluster kept in a StoreBuilder, changed at random one object at a time."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.builder = StoreBuilder()
        #: What the builder holds, by (kind, namespace, name).
        self.objects: dict[tuple[str, str, str], Record] = {}
        self.nodes = {node: self.random_node_labels(node) for node in NODES}
        self.synced = True

    def populate(self) -> None:
        for namespace in NAMESPACES[:3]:
            self.put(Namespace(namespace))
            for name in SERVICES:
                if self.rng.random() < 0.9:
                    self.put(self.random_service(namespace, name))
                    for index in range(self.rng.randint(1, 2)):
                        self.put(self.random_slice(namespace, name, index))
        # Two services start with a valid policy whatever the seed, until changes touch them;
        # db's weights make its A and AAAA replies take turns between its tiers.
        ports = (PORTS[0],)
        self.put(
            Service(
                "shop", "db", HEADLESS, (), ports, topology_keys=KEY_LISTS[0],
                topology_weights="50,30,20",
            )
        )  # fmt: skip
        self.put(Service("shop", "big", HEADLESS, (), ports, traffic_distribution=DISTRIBUTIONS[1]))
        self.put(self.random_slice("shop", "big", 0))
        self.put(self.random_slice("shop", "big", 1, many_ports=True))
        for node in NODES:
            self.put(self.node_locator(node))
        node_ips = {ip for ips in NODE_IPS.values() for ip in ips}
        for address in CLIENT_V4 + CLIENT_V6:
            if address not in ("127.0.0.9", "fd00::11") and address not in node_ips:
                self.put(self.pod_locator(address))
        for address in ENDPOINT_V4 + ENDPOINT_V6:
            if self.rng.random() < 0.6:
                self.put(self.pod_locator(address))

    def put(self, record: Record) -> str:
        self.builder.put(record)
        namespace = getattr(record, "namespace", "")
        self.objects[(type(record).__name__, namespace, record.name)] = record
        return f"put {record}"

    def remove(self, kind: type, namespace: str, name: str) -> str:
        self.builder.remove(kind, namespace, name)
        del self.objects[(kind.__name__, namespace, name)]
        return f"remove {kind.__name__} {namespace}/{name}"

    def stored(self, kind: type[R]) -> list[R]:
        """The objects of a kind, in a fixed order (so that a seed replays the same run)."""
        return [obj for key, obj in sorted(self.objects.items()) if isinstance(obj, kind)]

    # Random objects

    def random_node_labels(self, node: str) -> dict[str, str]:
        labels = {HOSTNAME: node, REGION: self.rng.choice(("r1", "r1", "r2"))}
        if self.rng.random() < 0.9:
            labels[ZONE] = self.rng.choice(ZONES)
        return labels

    def labels_of(self, node: str) -> dict[str, str]:
        # Usually the node's one dict, as convert.py interns them; sometimes an equal copy.
        labels = self.nodes[node]
        return dict(labels) if self.rng.random() < 0.3 else labels

    def node_locator(self, node: str) -> PodLocator:
        cidrs = tuple(dict.fromkeys(self.rng.choices(NODE_CIDRS, k=self.rng.randint(0, 2))))
        return PodLocator(
            "toposdns-system",
            node,
            NODE_IPS[node],
            node,
            self.labels_of(node),
            is_node=True,
            cidrs=cidrs,
        )

    def pod_locator(self, address: str) -> PodLocator:
        ip = canonical_ip(address)
        node = self.rng.choice(NODES)
        namespace = self.rng.choice(NAMESPACES)
        return PodLocator(
            namespace, "pod-" + ip.replace(":", "-"), (ip,), node, self.labels_of(node)
        )

    def random_service(self, namespace: str, name: str) -> Service:
        rng = self.rng
        kind = rng.choice(KINDS.get(name, (CLUSTER_IP, HEADLESS)))
        ports = tuple(rng.sample(PORTS[:5], rng.randint(0, 3))) or (NO_PORT,)
        ips: tuple[str, ...] = ()
        if kind == CLUSTER_IP:  # one address of each family it has
            families = rng.choice(((CLUSTER_V4,), (CLUSTER_V6,), (CLUSTER_V4, CLUSTER_V6)))
            ips = tuple(rng.choice(pool) for pool in families)
        keys = annotation = None
        distribution = ""
        policy = rng.random()
        if policy < 0.35:
            keys = rng.choice(KEY_LISTS)
        elif policy < 0.55:
            annotation = rng.choice(KEY_LISTS)
        elif policy < 0.75:
            distribution = rng.choice(DISTRIBUTIONS)
        # Soft topology, valid or not for the policy drawn (weights count its tiers).
        soft: list[str | None] = [None, None, None]
        if rng.random() < 0.4:
            at = rng.randrange(3)
            soft[at] = rng.choice(SOFT_VALUES[at])
            tiers = len(keys or annotation or TRAFFIC_DISTRIBUTIONS.get(distribution, ()))
            if at == 2 and tiers and rng.random() < 0.7:  # valid weights: A and AAAA rotate
                cuts = sorted(rng.randint(0, 100) for _ in range(tiers - 1))
                soft[2] = ",".join(
                    str(b - a) for a, b in zip([0, *cuts], [*cuts, 100], strict=True)
                )
        return Service(
            namespace,
            name,
            kind,
            ips,
            ports,
            external_name=rng.choice(EXTERNAL_NAMES) if kind == EXTERNAL_NAME else "",
            topology_keys=keys,
            topology_annotation=annotation,
            traffic_distribution=distribution,
            external_traffic_policy="Local" if rng.random() < 0.1 else "",
            topology_min_endpoints=soft[0],
            topology_srv=soft[1],
            topology_weights=soft[2],
        )

    def random_slice(
        self, namespace: str, service: str, index: int, many_ports: bool = False
    ) -> EndpointSlice:
        """A slice of random endpoints; `many_ports`: every address of the pool, without
        hostnames, and `MANY_PORTS` (any client's share is more than a message holds)."""
        rng = self.rng
        v6 = rng.random() < 0.3
        many_ports = many_ports or service == "big" and rng.random() < 0.2
        if service == "big":
            pool, count = (BIG_V6 if v6 else BIG_V4), rng.randint(15, 45)
            count = len(pool) if many_ports else count
        else:
            pool, count = (ENDPOINT_V6 if v6 else ENDPOINT_V4), rng.choice((0, 1, 2, 3, 3, 4, 4))
        hinted = rng.random() < 0.3
        endpoints = tuple(
            Endpoint(
                (address,),
                hostname="" if many_ports else rng.choice(HOSTNAMES),
                pod_name="" if many_ports else rng.choice(POD_NAMES),
                node_name=rng.choice(NODES + ("",)),
                zone=rng.choice(ZONES + ("",)),
                hint_zones=tuple(rng.sample(ZONES, rng.randint(1, 2))) if hinted else None,
            )
            for address in rng.sample(pool, count)
        )
        ports = tuple(rng.sample(PORTS, rng.randint(0, 2))) or (NO_PORT,)
        if many_ports:
            ports = MANY_PORTS
        return EndpointSlice(namespace, f"{service}-{index}", service, ports, endpoints)

    # Changes

    def change(self) -> str:
        """Apply one random change; say what it was."""
        changes: list[tuple[float, Callable[[], str | None]]] = [
            (3, self.change_service),
            (0.5, lambda: self.remove_one(Service)),
            (3, self.change_slice),
            (1, lambda: self.remove_one(EndpointSlice)),
            (2, self.flip_address),
            (1, self.toggle_namespace),
            (2, lambda: self.put(self.pod_locator(self.rng.choice(ENDPOINT_V4 + CLIENT_V4)))),
            (0.3, lambda: self.put(self.pod_locator(self.rng.choice(FORWARDERS)))),
            (1, lambda: self.remove_one(PodLocator)),
            (2, self.move_locator),
            (2, self.relabel_node),
            (1, lambda: self.put(self.node_locator(self.rng.choice(NODES)))),  # new CIDRs
        ]
        while True:
            (action,) = self.rng.choices([c for _, c in changes], [w for w, _ in changes])
            done = action()
            if done is not None:
                return done

    def change_service(self) -> str:
        return self.put(self.random_service(*self.any_service()))

    def change_slice(self) -> str:
        namespace, service = self.any_service()
        return self.put(self.random_slice(namespace, service, self.rng.randint(0, 2)))

    def any_service(self) -> tuple[str, str]:
        return self.rng.choice(NAMESPACES), self.rng.choice(SERVICES)

    def remove_one(self, kind: type[Service | EndpointSlice | PodLocator]) -> str | None:
        found = self.stored(kind)
        if not found:
            return None
        chosen = self.rng.choice(found)
        return self.remove(kind, chosen.namespace, chosen.name)

    def flip_address(self) -> str | None:
        """Give one endpoint of a slice another address of its family."""
        slices = [eps for eps in self.stored(EndpointSlice) if eps.endpoints]
        if not slices:
            return None
        eps = self.rng.choice(slices)
        i = self.rng.randrange(len(eps.endpoints))
        old = eps.endpoints[i]
        v6 = ":" in old.addresses[0]
        pool = (BIG_V6 + ENDPOINT_V6) if v6 else (BIG_V4 + ENDPOINT_V4)
        endpoint = Endpoint(
            (self.rng.choice(pool),),
            old.hostname,
            old.pod_name,
            old.node_name,
            old.zone,
            old.hint_zones,
            old.hint_nodes,
        )
        endpoints = eps.endpoints[:i] + (endpoint,) + eps.endpoints[i + 1 :]
        return self.put(replace(eps, endpoints=endpoints))

    def toggle_namespace(self) -> str:
        name = self.rng.choice(NAMESPACES)
        exists = ("Namespace", "", name) in self.objects
        if exists and self.rng.random() < 0.3:  # most of them, most of the time
            return self.remove(Namespace, "", name)
        return self.put(Namespace(name))

    def move_locator(self) -> str | None:
        pods = [locator for locator in self.stored(PodLocator) if not locator.is_node]
        if not pods:
            return None
        locator = self.rng.choice(pods)
        node = self.rng.choice(NODES)
        return self.put(moved(locator, node, self.labels_of(node)))

    def relabel_node(self) -> str:
        """New labels for a node (a new zone, say), and so for every locator on it."""
        node = self.rng.choice(NODES)
        self.nodes[node] = self.random_node_labels(node)  # a new dict: snapshots keep the old
        for locator in self.stored(PodLocator):
            if locator.node_name == node:
                self.put(moved(locator, locator.node_name, self.labels_of(node)))
        return f"relabel {node}: {self.nodes[node]}"

    def publish(self, serial: int) -> Snapshot:
        return self.builder.snapshot(serial, self.synced)


class Queries:
    """Random query messages: every name form, qtype, EDNS option; a few malformed."""

    def __init__(self, rng: random.Random, zones: tuple[tuple[str, ...], ...]) -> None:
        self.rng = rng
        self.zones = zones
        self.questions: list[tuple[tuple[str, ...], int, int]] = []

    def message(self) -> bytes:
        """A query with ID 0 (the sender sets its own)."""
        rng = self.rng
        if rng.random() < 0.05:
            return self.malformed()
        flags = (
            rng.choice((0x0100, 0x0100, 0))
            | rng.choice((0, 0, 0x0010))
            | rng.choice((0, 0, 0x0020))
        )
        if self.questions and rng.random() < 0.3:
            # A question asked before, with other flags and options (another cookie, subnet...),
            # and at times in another letter case (one cached reply is written in every case).
            labels, qtype, qclass = rng.choice(self.questions)
            if rng.random() < 0.5:
                labels = tuple(
                    "".join(rng.choice((c.lower(), c.upper())) for c in label) for label in labels
                )
        else:
            labels, qtype = self.question()
            qclass = rng.choices((1, 3, 4, 255, 254), (96, 1, 1, 1, 1))[0]
            self.questions.append((labels, qtype, qclass))
        edns = self.opt(self.options()) if rng.random() < 0.6 else b""
        return self.pack(flags, labels, qtype, qclass, edns)

    @staticmethod
    def pack(
        flags: int, labels: tuple[str, ...], qtype: int, qclass: int, opt: bytes, qdcount: int = 1
    ) -> bytes:
        header = pack("!6H", 0, flags, qdcount, 0, 0, 1 if opt else 0)
        name = b"".join(bytes((len(raw),)) + raw for raw in (lb.encode("latin-1") for lb in labels))
        return header + name + b"\x00" + pack("!HH", qtype, qclass) + opt

    def question(self) -> tuple[tuple[str, ...], int]:
        """A name of some form, and usually the qtype that form is asked with."""
        rng = self.rng
        zone = rng.choice(self.zones)
        ns = rng.choice(NAMESPACES[:3] * 3 + NAMESPACES[3:] + ("nope",))
        svc = rng.choice(SERVICES + ("db", "db", "big", "nope"))
        endpoint = rng.choice(
            [h for h in HOSTNAMES + POD_NAMES if h]
            + [dashed(a) for a in ENDPOINT_V4 + ENDPOINT_V6 + BIG_V4[:3] + BIG_V6[:2]]
        )
        pod = rng.choice([dashed(a) for a in ENDPOINT_V4 + ENDPOINT_V6] + ["1-2-3-4", "not-ip"])
        port = rng.choice(("_http", "_http", "_dns", "_grpc", "_metrics", "http", "_", "_https"))
        proto = rng.choice(("_tcp", "_tcp", "_udp", "_sctp", "tcp", "_TCP"))
        address = rng.choice(CLUSTER_V4 + CLUSTER_V6 + ENDPOINT_V4 + ENDPOINT_V6 + BIG_V6[:4])
        directive = rng.choice(("pin", "pin", "prefer", "florp"))
        forms: list[tuple[float, tuple[str, ...], int]] = [
            (20, (svc, ns, "svc") + zone, rng.choice((A, A, AAAA, SRV, TXT))),
            (6, (endpoint, svc, ns, "svc") + zone, rng.choice((A, AAAA))),
            (6, (port, proto, svc, ns, "svc") + zone, SRV),
            (2, ("big", rng.choice(("shop", ns)), "svc") + zone, SRV),  # at times too large
            (3, (pod, ns, "pod") + zone, rng.choice((A, AAAA))),
            (1, ("extra", pod, ns, "pod") + zone, A),
            (5, reverse_name(address), PTR),
            (1, reverse_name(rng.choice(("10.9.9.9", "2001:db8::1"))), PTR),
            (1, rng.choice((("96", "10", "in-addr", "arpa"), ("in-addr", "arpa"))), PTR),
            (1, ("x", "1", "0", "1", "10", "in-addr", "arpa"), PTR),
            (3, zone, rng.choice((SOA, NS))),
            (1, ("ns", "dns") + zone, A),
            (1, ("dns-version",) + zone, TXT),
            (1, rng.choice(((ns, "svc"), ("svc",), ("pod",), (ns, "pod"))) + zone, A),
            (1, ("a", "b", "c", svc, ns, "svc") + zone, A),
            (4, (rng.choice(ZONES + ("z9", "z1.x")), directive, "_zone", svc, ns, "svc") + zone, A),
            (1, (svc, ns, "nope") + zone, A),
            (1, ("api", "example", "com", ns, "svc") + zone, A),
            (1, (svc, ns, "svc") + zone + (ns, "svc") + zone, A),
            (1, ("we.b", ns, "svc") + zone, A),  # a dot inside a label
            (2, rng.choice((("example", "com"), (), ("local",), zone + ("evil",))), A),
            # Search-path names, as a pod's resolver asks them first (autopath completes them).
            (2, (svc, rng.choice(NAMESPACES), ns, "svc") + zone, rng.choice((A, AAAA, SRV))),
            (1, ("www", ns, "svc") + zone, rng.choice((A, AAAA))),
            (1, ("www", "corp", "test"), A),
        ]
        _, labels, qtype = rng.choices(forms, [weight for weight, _, _ in forms])[0]
        if rng.random() < 0.3:  # dig users type any case; replies must keep it
            labels = tuple("".join(rng.choice((c.lower(), c.upper())) for c in lb) for lb in labels)
        if rng.random() < 0.4:
            types = (A, AAAA, SRV, PTR, TXT, CNAME, SOA, NS, MX, ANY, 65280, 13, AXFR)  # 13: HINFO
            qtype = rng.choices(types, (4, 4, 4, 3, 3, 3, 2, 2, 2, 2, 2, 1, 0.5))[0]
        return labels, qtype

    def options(self) -> list[tuple[int, bytes]]:
        rng = self.rng
        options = []
        if rng.random() < 0.5:
            options.append((8, self.client_subnet()))
            if rng.random() < 0.1:  # two: every path must believe the same one, the first
                options.append((8, self.client_subnet()))
        if rng.random() < 0.25:
            cookie = rng.randbytes(8) + (rng.randbytes(16) if rng.random() < 0.5 else b"")
            options.append((10, cookie))
        if rng.random() < 0.1:
            options.append((12, bytes(rng.randint(0, 40))))  # padding
        if rng.random() < 0.1:
            options.append((65001, rng.randbytes(rng.randint(0, 6))))  # unknown
        if rng.random() < 0.05:
            options.append((rng.choice((3, 11)), b""))  # NSID, TCP keepalive
        rng.shuffle(options)
        return options

    def opt(self, options: list[tuple[int, bytes]], version: int = 0) -> bytes:
        rng = self.rng
        size = rng.choice((0, 256, 512, 512, 1000, 1232, 1232, 1400, 2048, 4096, 4096, 65535))
        ttl = (version << 16) | rng.choice((0, 0x8000)) | rng.choice((0, 0, 0x0100))
        rdata = b"".join(pack("!HH", code, len(value)) + value for code, value in options)
        return b"\x00" + pack("!HHIH", 41, size, ttl, len(rdata)) + rdata

    def client_subnet(self) -> bytes:
        rng = self.rng
        ip = ipaddress.ip_address(rng.choice(ECS_ADDRESSES))
        family = 1 if ip.version == 4 else 2
        prefixes = (32, 32, 32, 24, 16, 0) if family == 1 else (128, 128, 64, 56, 0)
        prefix = rng.choice(prefixes)
        network = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
        raw = network.network_address.packed[: (prefix + 7) // 8]
        scope = 0
        if rng.random() < 0.15:  # malformed: FORMERR (RFC 7871 §7.1.1)
            match rng.randrange(6):
                case 0:
                    family = 3
                case 1:
                    prefix = 33 if family == 1 else 129
                case 2:
                    scope = 8
                case 3:
                    raw += b"\x00"
                case 4:
                    prefix, raw = 20, ip.packed[:2] + bytes((ip.packed[2] | 0x0F,))
                case _:
                    return pack("!HB", family, prefix)
        return pack("!HBB", family, prefix, scope) + raw

    def malformed(self) -> bytes:
        rng = self.rng
        good = self.pack(0x0100, ("web", "shop", "svc", "cluster", "local"), 1, 1, b"")
        with_opt = self.pack(0x0100, ("web", "shop", "svc", "cluster", "local"), 1, 1, b"\x00")
        cases = [
            b"",
            b"\x00",
            good[:11],  # shorter than a header
            good[:2] + bytes((good[2] | 0x80,)) + good[3:],  # a response
            good[:2] + bytes((good[2] | 0x20,)) + good[3:],  # opcode NOTIFY
            good[:2] + bytes((good[2] | 0x10,)) + good[3:],  # opcode STATUS
            self.pack(0x0100, ("a",), 1, 1, b"", qdcount=0),
            self.pack(0x0100, ("a",), 1, 1, b"", qdcount=2),
            good[:5] + b"\x03" + good[6:],  # qdcount 3
            good[:10] + b"\x00\x03" + good[12:],  # arcount 3, records missing
            good[:-6],  # cut inside the question
            good[:12] + b"\x40abc" + good[12:],  # an unknown label type
            good[:12] + b"\xc0\x0c",  # a compression loop
            good[:12] + b"\x3f" + b"a" * 63 + b"\x3f" + b"a" * 63 + good[12:],  # long but valid
            good[:12] + (b"\x3f" + b"a" * 63) * 4 + b"\x00\x00\x01\x00\x01",  # over 255
            self.pack(0x0100, ("web",), 1, 1, self.opt(self.options(), version=1)),  # BADVERS
            self.pack(0x0100, ("a", "cluster", "local"), 1, 1, self.opt([], version=2)),
            with_opt[:-1] + b"\x00" + pack("!HHIH", 41, 512, 0, 5) + b"\x00\x08\x00\x10\x00",
            good + b"garbage after the question",
        ]
        return rng.choice(cases)


def in_order(message: bytes) -> bytes:
    """A reply with its address records in a fixed order, each section on its own, so that
    replies --loadbalance reorders compare with the reference's. A truncated reply keeps
    records of another order than the reference's: only its header and question compare."""
    if message[2] & 0x02:
        return message[: read_name(message, 12)[1] + 4]
    spans = record_spans(message)
    if not spans:
        return message
    out = [message[: spans[0][0]]]
    for section in range(3):
        records = [message[a:b] for a, _, b, rtype, sec in spans if sec == section]
        types = [rtype for _, _, _, rtype, sec in spans if sec == section]
        addresses = iter(sorted(r for r, t in zip(records, types, strict=True) if t in (A, AAAA)))
        out += [
            next(addresses) if t in (A, AAAA) else r for r, t in zip(records, types, strict=True)
        ]
    return b"".join(out) + message[spans[-1][2] :]


def decoded_in_order(message: bytes) -> tuple[object, ...]:
    """A reply as `in_order` has it, records decoded: a reply --loadbalance shuffled after it
    was encoded (one never cached) has its names compressed against another order."""
    if message[2] & 0x02:
        return (in_order(message),)
    parsed = dnslib.DNSRecord.parse(message)

    def section(records: list[dnslib.RR]) -> list[tuple[str, int, int, int, str]]:
        return sorted((str(rr.rname), rr.rtype, rr.rclass, rr.ttl, str(rr.rdata)) for rr in records)

    return (message[:12], parsed.questions, section(parsed.rr), section(parsed.auth)) + (
        section(parsed.ar),
    )


def dashed(address: str) -> str:
    return address.replace(".", "-").replace(":", "-")


def reverse_name(address: str) -> tuple[str, ...]:
    return tuple(ipaddress.ip_address(address).reverse_pointer.split("."))


def clients() -> list[tuple[Transport, Transport, str]]:
    """(UDP transport, TCP transport, source address as the socket gives it) of each client."""
    found = []
    for address in CLIENT_V4:
        found.append((UDP4, TCP4, address))
        found.append((UDP6, TCP6, "::ffff:" + address))  # a dual-stack socket
    for address in CLIENT_V6:
        found.append((UDP6, TCP6, address + "%lo" if address.startswith("fe80") else address))
    # A third of the queries come through the forwarders, many with ECS.
    found += [(UDP4, TCP4, FORWARDERS[0]), (UDP6, TCP6, FORWARDERS[1])] * (len(found) // 4)
    return found


class Mismatch(AssertionError):
    """A served reply that is not the reference's."""


#: What a run of the default size must have met, so that a generator gone dull cannot pass.
COVERAGE = {
    "records",
    "NODATA",
    "NXDOMAIN",
    "SERVFAIL",
    "REFUSED",
    "FORMERR",
    "NOTIMP",
    "BADVERS",
    "no reply",
    "truncated",
    "cut over TCP",
    "compressed",
    "ECS scope",
    "client-dependent",
}
#: What the forwarding run must have met: the other configurations meet the rarer replies.
FORWARDING_COVERAGE = {
    "records",
    "NODATA",
    "NXDOMAIN",
    "SERVFAIL",
    "FORMERR",
    "ECS scope",
    "relayed",
    "autopath CNAME",
}
#: What a port without the kubernetes block meets: its block's replies and the server's own.
PORT_COVERAGE = {
    "records",
    "NODATA",
    "NXDOMAIN",
    "REFUSED",
    "FORMERR",
    "NOTIMP",
    "BADVERS",
    "no reply",
}
RCODE_NAMES = {1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}
BADVERS_OPT = b"\x00" + pack("!HHIH", 41, 0, 1 << 24, 0)


class Run:
    """One differential run: a cluster, a responder behind the real frontends, the oracle."""

    def __init__(self, seed: int, config_name: str) -> None:
        self.seed = seed
        self.config_name = config_name
        self.config, zones = CONFIGS[config_name]
        self.rng = random.Random(seed)
        self.cluster = Cluster(self.rng)
        self.cluster.populate()
        self.serial = FIRST_SERIAL
        self.snapshot = self.cluster.publish(self.serial)
        self.balanced = config_name in BALANCED
        self.upstream: StubUpstream | None = None
        forwarder, autopath = None, AutopathOptions()
        if config_name in FORWARDING:
            self.upstream = StubUpstream(UPSTREAM)
            self.upstream.start()
            forwarder = Forwarder([Upstream("127.0.0.1", self.upstream.port)])
            autopath = AutopathOptions(enabled=True, search=NODE_SEARCH)
        self.blocks = None
        if config_name in BLOCKS:
            main, others = BLOCKS[config_name]
            stub = (BlockConfig(tuple(others)), chain([FixedZone()]))
            self.blocks = Blocks(main, [stub])
        self.responder = Responder(
            self.config,
            self.snapshot,
            ecs_trust=ECS_TRUST,
            forwarder=forwarder,
            loadbalance=self.balanced,
            autopath=autopath,
            blocks=self.blocks,
        )
        self.frontends = Frontends(self.responder)
        self.queries = Queries(self.rng, zones)
        self.pool = [self.queries.message() for _ in range(POOL_SIZE)]
        # Addresses of db, whose weights make its replies take turns, with and without EDNS:
        # asked at the end of each round, from a generator of their own (the rest of the run
        # draws what it drew before they were added).
        self.turn_rng = random.Random(seed + 1)
        edns = b"\x00" + pack("!HHIH", 41, 1232, 0, 0)
        self.weighted = [
            Queries.pack(0x0100, ("db", "shop", "svc", *zone), qtype, 1, opt)
            for zone in zones
            for qtype in (A, AAAA)
            for opt in (b"", edns)
        ]
        self.clients = clients()
        self.history: list[str] = []
        self.compared = 0
        #: What the reference answered, by kind of reply (see COVERAGE).
        self.seen: Counter[str] = Counter()
        #: This round's distinct replies to each (transport, query after its ID).
        self.replies: dict[tuple[Transport, bytes], set[bytes]] = {}
        #: Where the reference's rotations of topology weights stand, as the server's do.
        self.turns = TurnCounts()

    async def round(self, number: int, publish: bool = True) -> None:
        """Change the cluster, publish the snapshot (unless told not to), and ask away."""
        # Now and then a snapshot from before the first sync: SERVFAIL where NXDOMAIN would be.
        self.cluster.synced = number % 7 != 3
        self.history = [self.cluster.change() for _ in range(self.rng.randint(1, 5))]
        self.serial += self.rng.randint(1, 3)
        self.snapshot = self.cluster.publish(self.serial)
        if publish:
            self.responder.update(self.snapshot)
        self.replies = {}
        # Part of the pool, so that each query is asked by several clients in a round.
        asked = self.rng.sample(self.pool, max(1, QUERIES // 3))
        for _ in range(QUERIES):
            fresh = self.rng.random() < 0.2
            body = (self.queries.message() if fresh else self.rng.choice(asked))[2:]
            await self.send(number, body, *self.rng.choice(self.clients))
        self.seen["client-dependent"] += sum(len(r) > 1 for r in self.replies.values())
        drawn, self.rng = self.rng, self.turn_rng
        try:
            for _ in range(QUERIES // 10):
                body = self.rng.choice(self.weighted)[2:]
                await self.send(number, body, *self.rng.choice(self.clients))
        finally:
            self.rng = drawn

    async def send(
        self, number: int, body: bytes, udp: Transport, tcp: Transport, source: str
    ) -> None:
        """Ask twice over UDP and twice over TCP (pipelined, in random pieces)."""
        first, second = (self.rng.randbytes(2) + body for _ in range(2))
        if self.upstream is not None:
            return await self.send_forwarding(number, (first, second), udp, tcp, source)
        # In the order the server is asked: topology weights answer each in its turn.
        want = {
            (kind, i): reference_reply(
                query,
                kind,
                source,
                self.snapshot,
                self.config,
                ECS_TRUST,
                blocks=self.blocks,
                turns=self.turns,
            )
            for kind in (udp, tcp)
            for i, query in enumerate((first, second))
        }
        self.note(udp, first, want[udp, 0], want[tcp, 0])
        if None not in (want[udp, 0], want[udp, 1]) and want[udp, 0][2:] != want[udp, 1][2:]:
            # Topology weights: the same query, another tier's turn (counted, not required: the
            # weighted service's names are not in every configuration's zones; the tests of
            # tests/unit/test_topology_answers.py take every path turn by turn).
            self.seen["rotated"] += 1
        for kind in (udp, tcp):
            wants = [reply for i in range(2) if (reply := want[kind, i]) is not None]
            if kind is udp:
                got = self.frontends.over_udp(kind, first, source)
                got += self.frontends.over_udp(kind, second, source)
            else:
                stream = frame(first) + frame(second)
                got = self.frontends.over_tcp(kind, self.pieces(stream), source)
            self.compared += 2
            if self.balanced:
                got, wants = [in_order(m) for m in got], [in_order(m) for m in wants]
            if got != wants:
                raise Mismatch(self.explain(number, kind, source, (first, second), wants, got))

    async def send_forwarding(
        self,
        number: int,
        queries: tuple[bytes, bytes],
        udp: Transport,
        tcp: Transport,
        source: str,
    ) -> None:
        """`send` for a server that forwards: replies the zones alone give are compared byte for
        byte (up to address order); those an upstream or autopath had a hand in, in what a
        client relies on (`relied_on`), whichever order they came back in."""
        first, second = queries
        for kind in (udp, tcp):
            want, again = (
                reference_relayed(
                    query,
                    kind,
                    source,
                    self.snapshot,
                    self.config,
                    ECS_TRUST,
                    UPSTREAM,
                    NODE_SEARCH,
                    self.turns,
                )
                for query in queries
            )
            if kind is udp:
                got = await self.frontends.later_over_udp(kind, queries, source)
            else:
                stream = frame(first) + frame(second)
                got = await self.frontends.later_over_tcp(kind, self.pieces(stream), source)
            self.compared += 2
            if not isinstance(want, dnslib.DNSRecord):
                self.note(kind, first, want, want)
                assert not isinstance(again, dnslib.DNSRecord)
                wants = [] if want is None or again is None else [want, again]
                if [in_order(m) for m in got] != [in_order(m) for m in wants] and [
                    decoded_in_order(m) for m in got
                ] != [decoded_in_order(m) for m in wants]:
                    raise Mismatch(self.explain(number, kind, source, queries, wants, got))
                continue
            self.seen["relayed"] += 1
            self.seen["autopath CNAME"] += bool(
                want.rr and want.rr[0].rtype == CNAME and want.q.qtype != CNAME
            )
            limit = MAX_TCP_SIZE
            if not kind.tcp:
                limit = udp_limit(bound_buffer(decode_query(first), MAX_UDP_SIZE).edns)
            by_id = {reply[:2]: reply for reply in got}
            for query in queries:
                served = by_id.get(query[:2])
                problem = "no reply" if served is None or len(got) != 2 else ""
                problem = problem or relied_on(want, served or b"", limit)
                if problem:
                    wants = [query[:2] + bytes(want.pack())[2:]]
                    explained = self.explain(number, kind, source, queries, wants, got)
                    raise Mismatch(f"{problem}\n{explained}")

    def note(self, kind: Transport, query: bytes, reply: bytes | None, tcp: bytes | None) -> None:
        """Count what kind of UDP reply the reference gave (`tcp`: its TCP reply)."""
        if reply is None:
            self.seen["no reply"] += 1
            return
        assert tcp is not None
        self.replies.setdefault((kind, query[2:]), set()).add(reply[2:])
        rcode = reply[3] & 0xF
        if reply.endswith(BADVERS_OPT):
            self.seen["BADVERS"] += 1
        elif rcode:
            self.seen[RCODE_NAMES[rcode]] += 1
        else:
            self.seen["records" if reply[6:8] != b"\0\0" else "NODATA"] += 1
        if reply[2] & 0x02:
            self.seen["truncated"] += 1
        if tcp[2] & 0x02:  # larger than any message
            self.seen["cut over TCP"] += 1
        elif len(reply) < len(tcp):  # over the fragment limit, not the buffer
            self.seen["compressed"] += 1
        if rcode or b"\x00\x08" not in query:  # no ECS option: nothing more to count
            return
        try:
            ecs = decode_query(query).ecs
        except (Dropped, Rejected):
            return
        if ecs is not None and reply[-len(ecs.raw_address) - 1]:
            self.seen["ECS scope"] += 1  # the echoed option is last; its SCOPE byte is set

    def pieces(self, stream: bytes) -> list[bytes]:
        """A TCP stream, whole or cut at random places (in a length prefix, at times)."""
        if self.rng.random() < 0.5:
            return [stream]
        cuts = sorted(self.rng.sample(range(1, len(stream)), min(2, len(stream) - 1)))
        return [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    def explain(
        self,
        number: int,
        kind: Transport,
        source: str,
        queries: tuple[bytes, bytes],
        wants: list[bytes],
        got: list[bytes],
    ) -> str:
        lines = [
            f"served bytes differ from the reference (seed {self.seed}, config {self.config_name},"
            f" round {number}, serial {self.serial}, {kind.name} from {source}; rerun with"
            f" TOPOSDNS_DIFF_SEED={self.seed})",
            "changes this round:",
            *(f"  {change}" for change in self.history),
        ]
        for i, query in enumerate(queries):
            lines += [f"--- query {i + 1}:", render(query)]
            lines += [f"--- expected reply {i + 1}:", render(wants[i] if i < len(wants) else None)]
            lines += [f"--- served reply {i + 1}:", render(got[i] if i < len(got) else None)]
        if len(got) > 2:
            lines.append(f"--- and {len(got) - 2} more replies were served")
        return "\n".join(lines)


def run_rounds(seed: int, config_name: str, rounds: int = ROUNDS, publish: bool = True) -> Run:
    """Run the rounds inside an event loop (the TCP protocol sets timers)."""

    async def main() -> Run:
        run = Run(seed, config_name)
        try:
            for number in range(rounds):
                await run.round(number, publish)
        finally:
            run.frontends.close()
            if run.responder.forwarder is not None:  # its TCP connections, kept for reuse
                await run.responder.forwarder.close()
            if run.upstream is not None:
                run.upstream.stop()
        return run

    return asyncio.run(main())


def seed_for() -> int:
    if SEED == "random":
        return random.SystemRandom().randrange(2**32)
    return int(SEED) if SEED else 1


@pytest.mark.parametrize("config_name", sorted(CONFIGS))
def test_served_bytes_equal_the_reference_across_changes(config_name: str) -> None:
    seed = seed_for()
    # Autopath resolves a name up to five times: half the rounds keep the run short.
    rounds = ROUNDS // 2 if config_name in FORWARDING else ROUNDS
    print(f"differential seed {seed} ({config_name}): {rounds} rounds of {QUERIES} queries")
    try:
        run = run_rounds(seed, config_name, rounds)
    except Mismatch as mismatch:
        pytest.fail(str(mismatch), pytrace=False)
    assert run.compared == rounds * (QUERIES + QUERIES // 10) * 4
    if config_name == "port":  # no reply is the responder's own: none is kept
        responder = run.responder
        assert responder.negatives is None and not responder.cache.table
        assert not any(responder.cache.renders)
    print(dict(run.seen))
    if ROUNDS * QUERIES >= 20 * 200:  # a shorter run may miss a rare case, and that is fine
        # Without endpoints there are no large or client-dependent answers to meet.
        wanted = COVERAGE - (UNTRUNCATED if config_name == "noendpoints" else set())
        if config_name in FORWARDING:  # a shorter run, with other classes forwarded
            wanted = FORWARDING_COVERAGE
        if config_name == "port":  # only the block and the server's own checks answer
            wanted = PORT_COVERAGE
        assert not wanted - set(run.seen), f"the run never met {wanted - set(run.seen)}"


def test_a_server_that_misses_a_change_is_caught() -> None:
    # The comparison must see changes at all: a responder left on the first snapshot fails it.
    with pytest.raises(Mismatch, match="served bytes differ"):
        run_rounds(seed_for(), "defaults", rounds=20, publish=False)


# The oracle itself, checked by hand on a small cluster, so that it is not trusted blindly.

SHOP: list[Record] = [
    Namespace("shop"),
    Service("shop", "web", CLUSTER_IP, ("10.96.0.5",), (PORTS[0],)),
    Service("shop", "db", HEADLESS, (), (PORTS[0],), topology_keys=(ZONE,)),
    EndpointSlice(
        "shop",
        "db-0",
        "db",
        (PORTS[0],),
        (
            Endpoint(("10.1.0.1",), hostname="db-0", node_name="node-a", zone="z1"),
            Endpoint(("10.3.0.1",), hostname="db-1", node_name="node-c", zone="z2"),
        ),
    ),
    Service("shop", "wide", HEADLESS, (), (PORTS[0],)),
    EndpointSlice(
        "shop", "wide-0", "wide", (PORTS[0],), tuple(Endpoint((ip,)) for ip in BIG_V4[:40])
    ),
    PodLocator("shop", "a", ("127.0.0.2",), "node-a", {HOSTNAME: "node-a", ZONE: "z1"}),
    PodLocator("shop", "c", ("127.0.0.4",), "node-c", {HOSTNAME: "node-c", ZONE: "z2"}),
]
ORACLE_CONFIG = config_of()


def reference(
    name: str,
    qtype: str = "A",
    source: str = "127.0.0.9",
    transport: Transport = UDP4,
    edns: dnslib.EDNS0 | None = None,
    qclass: str = "IN",
) -> bytes:
    """The reference's reply, on the wire, to a query that dnslib builds."""
    builder = StoreBuilder()
    for record in SHOP:
        builder.put(record)
    question = dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype), getattr(dnslib.CLASS, qclass))
    query = dnslib.DNSRecord(dnslib.DNSHeader(id=4321, rd=1), q=question)
    if edns is not None:
        query.add_ar(edns)
    data = bytes(query.pack())
    snapshot = builder.snapshot(FIRST_SERIAL)
    reply = reference_reply(data, transport, source, snapshot, ORACLE_CONFIG, ECS_TRUST)
    assert reply is not None and reply[:2] == data[:2]
    return reply


def oracle(name: str, qtype: str = "A", **how: Any) -> dnslib.DNSRecord:
    """The reference's reply, parsed by dnslib."""
    return dnslib.DNSRecord.parse(reference(name, qtype, **how))


def answers(reply: dnslib.DNSRecord) -> list[str]:
    return sorted(str(rr.rdata) for rr in reply.rr)


def client_subnet(address: str, prefix: int, scope: int = 0) -> dnslib.EDNS0:
    network = ipaddress.ip_network(f"{address}/{prefix}", strict=False)
    raw = network.network_address.packed[: (prefix + 7) // 8]
    value = pack("!HBB", 1 if network.version == 4 else 2, prefix, scope) + raw
    return dnslib.EDNS0(udp_len=1232, opts=[dnslib.EDNSOption(8, value)])


def echoed(reply: dnslib.DNSRecord) -> dict[int, bytes]:
    (opt,) = [rr for rr in reply.ar if rr.rtype == dnslib.QTYPE.OPT]
    return {option.code: option.data for option in opt.rdata}


def test_the_oracle_answers_a_service_in_the_case_asked() -> None:
    reply = oracle("Web.SHOP.svc.cluster.local")
    header = reply.header
    assert (header.id, header.qr, header.aa, header.rd, header.ra, header.tc) == (
        4321,
        1,
        1,
        1,
        0,
        0,
    )
    assert header.rcode == dnslib.RCODE.NOERROR and not reply.ar
    assert str(reply.q.qname) == "Web.SHOP.svc.cluster.local."
    (rr,) = reply.rr
    assert (str(rr.rname), rr.rtype, rr.ttl, str(rr.rdata)) == (
        "Web.SHOP.svc.cluster.local.",
        dnslib.QTYPE.A,
        5,
        "10.96.0.5",
    )


def test_the_oracle_places_clients_by_source_or_trusted_subnet() -> None:
    assert answers(oracle("db.shop.svc.cluster.local", source="127.0.0.2")) == ["10.1.0.1"]
    assert answers(oracle("db.shop.svc.cluster.local", source="::ffff:127.0.0.4")) == ["10.3.0.1"]
    unplaced = oracle("db.shop.svc.cluster.local")  # zone key, no "*": nothing, NODATA
    assert unplaced.header.rcode == dnslib.RCODE.NOERROR and not unplaced.rr
    assert [rr.rtype for rr in unplaced.auth] == [dnslib.QTYPE.SOA]
    # A trusted forwarder's ECS places the client, and the scope says the answer used it.
    ecs = client_subnet("127.0.0.4", 32)
    trusted = oracle("db.shop.svc.cluster.local", source="127.0.0.53", edns=ecs)
    assert answers(trusted) == ["10.3.0.1"]
    assert echoed(trusted)[8] == bytes((0, 1, 32, 32, 127, 0, 0, 4))
    # Anyone else's ECS is echoed with scope 0 and ignored.
    untrusted = oracle("db.shop.svc.cluster.local", source="127.0.0.2", edns=ecs)
    assert answers(untrusted) == ["10.1.0.1"]
    assert echoed(untrusted)[8] == bytes((0, 1, 32, 0, 127, 0, 0, 4))
    # An answer that is the same for everyone has scope 0 even from a trusted forwarder.
    same = oracle("web.shop.svc.cluster.local", source="127.0.0.53", edns=ecs)
    assert echoed(same)[8] == bytes((0, 1, 32, 0, 127, 0, 0, 4))


def test_the_oracle_writes_srv_with_glue() -> None:
    reply = oracle("_http._tcp.db.shop.svc.cluster.local", "SRV", source="127.0.0.2")
    assert [str(rr.rdata) for rr in reply.rr] == ["0 100 80 db-0.db.shop.svc.cluster.local."]
    assert [(str(rr.rname), str(rr.rdata)) for rr in reply.ar] == [
        ("db-0.db.shop.svc.cluster.local.", "10.1.0.1")
    ]


def test_the_oracle_truncates_by_transport() -> None:
    name = "wide.shop.svc.cluster.local"
    udp = reference(name)  # 40 A records do not fit 512 bytes
    parsed = dnslib.DNSRecord.parse(udp)
    assert len(udp) <= 512 and parsed.header.tc == 1 and 0 < len(parsed.rr) < 40
    tcp = reference(name, transport=TCP4)
    parsed = dnslib.DNSRecord.parse(tcp)
    assert len(tcp) > 1480 and parsed.header.tc == 0 and answers(parsed) == sorted(BIG_V4[:40])
    # 4096 bytes hold them, but the reply is compressed to stay under the fragment limit.
    big = dnslib.EDNS0(udp_len=4096, flags="do")
    for transport, limit in ((UDP4, 1480), (UDP6, 1220)):
        reply = reference(name, transport=transport, edns=big)
        parsed = dnslib.DNSRecord.parse(reply)
        assert len(reply) <= limit and parsed.header.tc == 0 and len(parsed.rr) == 40
        assert parsed.ar[0].ttl == 0x8000  # DO echoed, version 0


def test_the_oracle_refuses_and_rejects() -> None:
    for reply in (oracle("example.com"), oracle("web.shop.svc.cluster.local", qclass="CH")):
        assert reply.header.rcode == dnslib.RCODE.REFUSED and reply.header.aa == 0
        assert not reply.rr and not reply.auth
    missing = oracle("nope.shop.svc.cluster.local")
    assert missing.header.rcode == dnslib.RCODE.NXDOMAIN and missing.header.aa == 1
    (soa,) = missing.auth
    assert str(soa.rdata.mname) == "ns.dns.cluster.local." and soa.rdata.times[0] == FIRST_SERIAL
    badvers = oracle("web.shop.svc.cluster.local", edns=dnslib.EDNS0(version=1, udp_len=1232))
    (opt,) = badvers.ar
    assert (badvers.header.rcode, opt.ttl >> 24, opt.rclass, badvers.rr) == (0, 1, 0, [])
    malformed = oracle("db.shop.svc.cluster.local", edns=client_subnet("127.0.0.4", 32, scope=8))
    assert malformed.header.rcode == dnslib.RCODE.FORMERR and not malformed.questions


def test_the_oracle_echoes_only_the_options_coredns_echoes() -> None:
    options = [
        dnslib.EDNSOption(10, b"client-c"),  # COOKIE
        dnslib.EDNSOption(12, bytes(4)),  # padding
        dnslib.EDNSOption(65001, b"x"),  # unknown
    ]
    reply = oracle("web.shop.svc.cluster.local", edns=dnslib.EDNS0(udp_len=1232, opts=options))
    assert echoed(reply) == {10: b"client-c", 12: bytes(4)}


def test_the_oracle_answers_bad_headers_as_miekg_dns_does() -> None:
    good = bytes(dnslib.DNSRecord.question("web.shop.svc.cluster.local").pack())
    snapshot = StoreBuilder().snapshot(FIRST_SERIAL)

    def reply(data: bytes) -> bytes | None:
        return reference_reply(data, UDP4, "127.0.0.2", snapshot, ORACLE_CONFIG)

    assert reply(good[:11]) is None  # shorter than a header
    assert reply(good[:2] + bytes((good[2] | 0x80,)) + good[3:]) is None  # a response
    two = good[:5] + b"\x02" + good[6:]
    assert reply(two) == two[:2] + b"\x81\x01" + bytes(8)  # FORMERR, RD copied, no sections
    notify = good[:2] + bytes((good[2] | 0x20,)) + good[3:]
    assert reply(notify) == notify[:2] + b"\xa1\x04" + bytes(8)  # NOTIMP, opcode kept
