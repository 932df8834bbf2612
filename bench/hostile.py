"""Hostile tenants against one toposdns server: every attack a pod or a namespace admin can make
with what they own, each with a victim measuring what everyone else gets.

One server configuration (`toposdns serve --workers 1` watching the test suite's stand-in API
server, `tests/kubeapi.py`, with kubeadm's cache bounds and CoreDNS's probe listeners), started
afresh for each attack so that no attack's leftovers (cache contents, orphaned sockets, a
backlog of work) count against the next. The attacks, one after the other:

- `slice`: a headless Service of one EndpointSlice of 1,000 endpoints x 100 ports in a tenant
  namespace; the server CPU of its first bare SRV query (UDP, EDNS 1232), whether a repeat is a
  cache hit (`coredns_cache_hits_total`), over TCP too; tracebacks in the log and
  `coredns_panics_total`; then 2 such queries a second while the victim asks;
- `large-service`: a legitimate headless service of 1,000 named endpoints: its SRV repeated
  (UDP and TCP) is a cache hit; then repeated over TCP while the victim asks;
- `options`: distinct 60 KB EDNS options over TCP (PADDING and an unknown option, in turn):
  RSS growth against the cache bounds; and a PADDING option over UDP against the 1232-byte cap;
- `http`: 128 keep-alive connections sending a valid GET every 2 s and 64 half-open ones, on
  each probe listener: `/health` and `/ready` answered, 20 probes each from kubelet's address;
- `orphans`: one source opening pipelining, never-reading connections (16 SRV queries of ~8 KB
  answers each, a 4 KiB receive buffer) for 5 s: bytes left in the server's send queues, and
  sockets the server no longer holds (the cap cannot count them);
- `fairness-4`, `fairness-32`: 4 (32) sources holding busy 1-byte connections, more than the
  cap in all: a fifth client's 20 TCP queries, each on a new connection;
- `case`: server CPU per query in random letter case (each case new) against a same-case cache
  hit, for an A record and for a 100-endpoint SRV;
- `ecs-coredns`, `ecs-nodelocal`: a pod that sends its own Client Subnet option through the
  cluster-zone block of the `coredns-forward` overlay and through NodeLocal DNSCache's as
  `manifests/README.md` shows it, each read where it is shipped and played by the test suite's
  CoreDNS stand-in (tests/coredns_forwarder.py), toposdns trusting each hop as the shipped
  text says: does it, and another pod on its node, get the true placement;
- `locators`: PodLocators in a tenant namespace (an exact address, a claim on a node's CIDR, the
  `toposdns.io/locator: node` label): does any other namespace's client answer change.

Every attack has a victim at its own address asking all along (`udp`: an A record every 50 ms),
and some a victim of their own (a fifth TCP client, kubelet's probes, the pods). Each row gives
the victims' answers and p99, the server's RSS and PSS at the height of the attack, and the
bytes in the kernel queues of the server's TCP sockets (`ss`), what was measured and the target
it is held to. An attack that cannot run, or whose server dies, is a FAIL row, not a crash.

Loopback only; every flood, wait and socket call is bounded in count and time (an attack takes
seconds, a whole run a minute or two).

Run from the repository root:  python -m bench.hostile  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import resource
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dns.edns
import dns.exception
import dns.message
import dns.query
import dns.rdatatype
import yaml

from bench.harness import (
    HOST,
    REPO,
    CorefileForwarder,
    Directive,
    FakeApiServer,
    ServerProcess,
    corefile_block,
    endpoint,
    endpoint_slice,
    free_port,
    headless,
    log,
    machine,
    metric_total,
    namespace,
    pod_locator,
    recv_exact,
    service,
    shown_corefile,
    toposdns_command,
)
from bench.held_connections import HeldConnections
from bench.live_server import free_ports, ready
from bench.socket_queues import SocketQueues, socket_queues
from bench.victims import TcpVictim, UdpVictim, VictimStats, query_wire

JSON = dict[str, Any]
ZONE = "cluster.local"
CONTROLLER_NAMESPACE = "toposdns"  # where the manifests run the controller
TENANT = "tenant"  # a namespace whose admin is the attacker

# Who asks from where: the server tells clients apart by address only.
PROBES = "127.0.0.1"  # kubelet's probes, and the bench's own checks
UDP_VICTIM = "127.0.9.1"
TCP_VICTIM = "127.0.9.2"
ATTACKER = "127.0.1.1"
ATTACKER_TCP = "127.0.1.2"
OPTION_FLOODER = "127.0.1.3"
CASE_CLIENT = "127.0.1.4"
HTTP_KEEPALIVE = "127.0.3.1"
HTTP_HALF_OPEN = "127.0.3.2"
ORPHAN_FLOODER = "127.0.2.1"
COREDNS_POD = "127.0.5.1"  # the CoreDNS forwarder's address, which toposdns trusts
NODE_A = "127.0.6.1"  # node-a's address: NodeLocal DNSCache's queries come from it
HONEST_POD = "127.1.1.5"  # pods on node-a (z1), in its pod range 127.1.1.0/24
FORGING_POD = "127.1.1.6"
LOCATOR_VICTIM = "127.1.1.7"
POISONING_POD = "127.1.1.8"
NEIGHBOUR_POD = "127.1.1.9"
Z2_ADDRESS = "127.1.2.9"  # in node-b's range (z2)
UNPLACED = "10.99.0.1"  # in no locator's range

VICTIM_NAME = f"frontend.shop.svc.{ZONE}."
WEB = f"web.shop.svc.{ZONE}."  # headless, answered per zone
BIG_SRV = f"_http._tcp.big.shop.svc.{ZONE}."  # 100 named endpoints: ~8 KB over TCP
Z1 = frozenset({"10.0.1.1", "10.0.1.2"})
Z2 = frozenset({"10.0.2.1", "10.0.2.2"})

MAX_TCP_CONNECTIONS = 1024  # toposdns's default --tcp-max-connections
ORPHAN_QUEUE_TARGET = 16 << 20
OPTION_BYTES = 60_000
SLICE_FIRST_TARGET_MS = 20.0
CASE_TARGET = 1.5


def node_labels(node: str, zone: str) -> dict[str, str]:
    return {
        "kubernetes.io/hostname": node,
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": "r1",
    }


def base_objects() -> list[JSON]:
    """What every attack's server serves: the victim's ClusterIP service, a headless service
    answered per zone (`web`: two endpoints on node-a in z1, two on node-b in z2), one of 100
    named endpoints (`big`), and the controller's two node locators, each with its pod range."""
    zone_key = ["topology.kubernetes.io/zone"]  # no "*": an unplaced client gets NODATA
    web = [
        endpoint(address, nodeName=node, zone=zone)
        for address, node, zone in (
            ("10.0.1.1", "node-a", "z1"),
            ("10.0.1.2", "node-a", "z1"),
            ("10.0.2.1", "node-b", "z2"),
            ("10.0.2.2", "node-b", "z2"),
        )
    ]
    big = [endpoint(f"10.0.3.{i + 1}", hostname=f"big-{i}") for i in range(100)]
    return [
        *(namespace(ns) for ns in ("shop", TENANT, CONTROLLER_NAMESPACE, "kube-system")),
        service("frontend", "shop", cluster_ip="10.96.0.10"),
        endpoint_slice("frontend", "shop", [endpoint("10.0.0.10")]),
        *headless("web", "shop", web, topologyKeys=zone_key),
        *headless("big", "shop", big),
        pod_locator(
            "node-a",
            CONTROLLER_NAMESPACE,
            addresses=[NODE_A],
            cidrs=["127.1.1.0/24"],
            node_name="node-a",
            node_labels=node_labels("node-a", "z1"),
            role="node",
        ),
        pod_locator(
            "node-b",
            CONTROLLER_NAMESPACE,
            addresses=["127.0.6.2"],
            cidrs=["127.1.2.0/24"],
            node_name="node-b",
            node_labels=node_labels("node-b", "z2"),
            role="node",
        ),
    ]


# ----- the server under attack -----


@dataclass
class Sample:
    """The server's memory and socket queues at one moment."""

    rss_mib: float = math.nan
    pss_mib: float = math.nan
    queues: SocketQueues = field(default_factory=SocketQueues)


@dataclass
class Cost:
    """One query: its reply (None if lost), wall time and the server's CPU time for it."""

    reply: bytes | None
    wall_ms: float
    cpu_ms: float

    @property
    def rcode(self) -> str:
        if self.reply is None:
            return "no reply"
        names = {0: "NOERROR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED", 1: "FORMERR"}
        rcode = self.reply[3] & 0xF
        return names.get(rcode, str(rcode)) + (" TC" if self.reply[2] & 2 else "")

    @property
    def records(self) -> int:
        return 0 if self.reply is None else int.from_bytes(self.reply[6:8], "big")


class Target:
    """One toposdns process serving the stand-in, on free loopback ports."""

    def __init__(self, api: FakeApiServer, workdir: Path, flags: Sequence[str]) -> None:
        self.api = api
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        self.dns_port, self.health_port = free_ports()
        self.ready_port = free_port()
        self.metrics_port = free_port()
        self.proc = ServerProcess(
            toposdns_command(
                "serve", "--kubeconfig", str(kubeconfig), "--listen", f"{HOST}:{self.dns_port}",
                "--health", f"{HOST}:{self.health_port}", "--ready", f"{HOST}:{self.ready_port}",
                "--metrics", f"{HOST}:{self.metrics_port}", "--workers", "1", "--lameduck", "0s",
                "--upstream", "none", *flags,
            )
        )  # fmt: skip
        try:
            self.proc.wait_until(lambda: ready(self.ready_port), timeout=60.0, interval=0.05)
        except BaseException:
            self.proc.stop()
            raise
        time.sleep(0.3)
        self.start = self.sample(queues=False)

    @property
    def ports(self) -> list[int]:
        return [self.dns_port, self.health_port, self.ready_port, self.metrics_port]

    def sample(self, queues: bool = True) -> Sample:
        """RSS and PSS (summed over its processes), and its TCP sockets' queues."""
        found = Sample()
        with contextlib.suppress(OSError, KeyError):
            found.rss_mib = self.proc.memory()[1]
            found.pss_mib = self.proc.pss_mb()
        if queues:
            found.queues = socket_queues(self.ports, self.proc.processes())
        return found

    def cpu_ns(self) -> int:
        """CPU time of all its threads so far, in nanoseconds (/proc/PID/task/*/schedstat)."""
        total = 0
        for pid in self.proc.processes():
            for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int(stat.read_text().split()[0])
        return total

    def metric(self, name: str) -> float | None:
        """The sum of a metric's samples, None if /metrics does not answer."""
        try:
            return metric_total(self.metrics_port, name)
        except (AssertionError, OSError, ValueError):
            return None

    def cache_hits(self) -> float | None:
        return self.metric("coredns_cache_hits_total")

    def tracebacks(self) -> int:
        return self.proc.log().count("Traceback")

    def udp(self, wire: bytes, source: str, timeout: float = 2.0) -> bytes | None:
        """One query over UDP from `source`: the reply with its ID, or None."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((source, 0))
            sock.settimeout(timeout)
            sock.sendto(wire, (HOST, self.dns_port))
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                sock.settimeout(left)
                try:
                    reply = sock.recv(65535)
                except (TimeoutError, ConnectionRefusedError):
                    return None
                if reply[:2] == wire[:2]:
                    return reply
            return None

    def tcp(self, wire: bytes, source: str, timeout: float = 2.0) -> bytes | None:
        """One query over a new TCP connection from `source`: the reply, or None."""
        try:
            with socket.create_connection(
                (HOST, self.dns_port), timeout=timeout, source_address=(source, 0)
            ) as sock:
                sock.sendall(len(wire).to_bytes(2, "big") + wire)
                size = int.from_bytes(recv_exact(sock, 2), "big")
                return recv_exact(sock, size)
        except OSError:
            return None

    def cost(self, wire: bytes, source: str, tcp: bool = False, timeout: float = 30.0) -> Cost:
        """One query with nothing else asking: its reply, wall time and the server's CPU."""
        before = self.cpu_ns()
        started = time.perf_counter()
        reply = (self.tcp if tcp else self.udp)(wire, source, timeout)
        wall = time.perf_counter() - started
        time.sleep(0.02)  # the server counts and logs after it has sent
        return Cost(reply, wall * 1000, (self.cpu_ns() - before) / 1e6)

    def addresses(
        self,
        name: str,
        source: str,
        via: tuple[str, int] | None = None,
        ecs: str | None = None,
        timeout: float = 2.0,
    ) -> frozenset[str] | None:
        """The A addresses `name` gets from `source`, straight or through a forwarder at
        `via`, with a Client Subnet option of its own (`ecs`, /32) or none; None if lost."""
        options: list[dns.edns.Option] = [dns.edns.ECSOption(ecs, 32)] if ecs else []
        query = dns.message.make_query(name, "A", use_edns=0 if ecs else False, options=options)
        try:
            host, port = via or (HOST, self.dns_port)
            reply = dns.query.udp(query, host, port=port, source=source, timeout=timeout)
        except (dns.exception.DNSException, OSError):
            return None
        a_records = [rrset for rrset in reply.answer if rrset.rdtype == dns.rdatatype.A]
        return frozenset(rd.to_text() for rrset in a_records for rd in rrset)

    def stop(self) -> None:
        self.proc.stop()


def with_id(wire: bytes, qid: int | None = None) -> bytes:
    """`wire` with a new (random) query ID."""
    qid = random.randrange(1 << 16) if qid is None else qid
    return qid.to_bytes(2, "big") + wire[2:]


def srv_query(name: str, payload: int | None = 1232) -> bytes:
    """An SRV query, with EDNS at this buffer size (as dig sends it) or without."""
    if payload is None:
        return query_wire(name, "SRV")
    return bytes(dns.message.make_query(name, "SRV", use_edns=0, payload=payload).to_wire())


def random_case(name: str, rng: random.Random) -> str:
    return "".join(rng.choice((c.lower(), c.upper())) for c in name)


def probe(port: int, path: str, timeout: float = 1.0) -> float | None:
    """A kubelet probe from 127.0.0.1 (a new connection, as kubelet's prober opens): seconds to
    a 200 answer, None for anything else within `timeout` (kubelet's timeoutSeconds: 1)."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as answer:
            ok = answer.status == 200
            answer.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return time.monotonic() - started if ok else None


def hit_text(hit: bool | None) -> str:
    return {True: "hit", False: "miss", None: "unknown (no /metrics)"}[hit]


def counted_hit(target: Target, ask: Callable[[], Cost]) -> tuple[Cost, bool | None]:
    """A query asked again, and whether the server counted it as a cache hit."""
    before = target.cache_hits()
    cost = ask()
    after = target.cache_hits()
    if before is None or after is None:
        return cost, None
    return cost, after - before >= 1


# ----- the attacks -----


@dataclass
class Outcome:
    """What an attack measured, against its target."""

    measured: str
    passed: bool
    victims: list[VictimStats] = field(default_factory=list)
    #: The server's memory and queues at the height of the attack (None: at its end).
    sample: Sample | None = None
    details: JSON = field(default_factory=dict)


@dataclass(frozen=True)
class Attack:
    name: str
    target: str
    run: Callable[[Target, argparse.Namespace], Outcome]
    objects: Callable[[], list[JSON]] = list
    flags: Callable[[argparse.Namespace], list[str]] = lambda args: []


def rogue_slice() -> list[JSON]:
    """A headless Service in the tenant namespace, one slice of 1,000 endpoints x 100 ports."""
    ports = [{"name": f"p{j}", "port": 10_000 + j, "protocol": "TCP"} for j in range(100)]
    endpoints = [endpoint(f"10.60.{i // 250}.{i % 250 + 1}") for i in range(1000)]
    return [
        service("rogue", TENANT, cluster_ip="None", ports=ports),
        endpoint_slice("rogue", TENANT, endpoints, ports=ports),
    ]


def attack_slice(target: Target, args: argparse.Namespace) -> Outcome:
    name = f"rogue.{TENANT}.svc.{ZONE}."
    udp_wire = srv_query(name)
    first = target.cost(with_id(udp_wire), ATTACKER)
    repeat, udp_hit = counted_hit(target, lambda: target.cost(with_id(udp_wire), ATTACKER))
    tcp_wire = srv_query(name, None)
    tcp_first = target.cost(with_id(tcp_wire), ATTACKER_TCP, tcp=True)
    tcp_repeat, tcp_hit = counted_hit(
        target, lambda: target.cost(with_id(tcp_wire), ATTACKER_TCP, tcp=True)
    )
    panics = target.metric("coredns_panics_total")
    tracebacks = target.tracebacks()
    # Then 2 of them a second, never waiting for an answer, while the victim asks.
    with (
        UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock,
    ):
        sock.bind((ATTACKER, 0))
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            sock.sendto(with_id(udp_wire), (HOST, target.dns_port))
            time.sleep(0.5)
        sample = target.sample()
    passed = (
        first.reply is not None
        and first.cpu_ms <= SLICE_FIRST_TARGET_MS
        and udp_hit is True
        and tcp_hit is True
        and tracebacks == 0
        and panics == 0
    )
    measured = (
        f"first SRV (UDP) {first.cpu_ms:.1f} ms CPU ({first.wall_ms:.0f} ms wall): {first.rcode}, "
        f"{first.records} records; repeat {hit_text(udp_hit)} ({repeat.cpu_ms:.1f} ms CPU). "
        f"TCP first {tcp_first.cpu_ms:.1f} ms CPU: {tcp_first.rcode}, {tcp_first.records} "
        f"records; repeat {hit_text(tcp_hit)} ({tcp_repeat.cpu_ms:.1f} ms CPU). "
        f"Tracebacks in the log: {tracebacks}; coredns_panics_total: {fmt(panics)}"
    )
    details = {
        "first_udp": vars_of(first), "repeat_udp": vars_of(repeat), "udp_repeat_hit": udp_hit,
        "first_tcp": vars_of(tcp_first), "repeat_tcp": vars_of(tcp_repeat),
        "tcp_repeat_hit": tcp_hit, "tracebacks": tracebacks, "panics": panics,
    }  # fmt: skip
    return Outcome(measured, passed, [victim.stats], sample, details)


def large_service() -> list[JSON]:
    """A legitimate headless service of 1,000 named endpoints in namespace shop."""
    endpoints = [
        endpoint(f"10.70.{i // 250}.{i % 250 + 1}", hostname=f"large-{i}") for i in range(1000)
    ]
    return headless("large", "shop", endpoints)


def attack_large_service(target: Target, args: argparse.Namespace) -> Outcome:
    name = f"large.shop.svc.{ZONE}."
    tcp_wire = srv_query(name, None)
    tcp_first = target.cost(with_id(tcp_wire), ATTACKER_TCP, tcp=True)
    tcp_repeat, tcp_hit = counted_hit(
        target, lambda: target.cost(with_id(tcp_wire), ATTACKER_TCP, tcp=True)
    )
    udp_wire = srv_query(name)
    udp_first = target.cost(with_id(udp_wire), ATTACKER)
    udp_repeat, udp_hit = counted_hit(target, lambda: target.cost(with_id(udp_wire), ATTACKER))
    # Then asked over and over (one connection, one query at a time) while the victim asks.
    asked = answered = 0
    with UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim:
        before = target.cpu_ns()
        deadline = time.monotonic() + args.seconds
        with (
            contextlib.suppress(OSError),
            socket.create_connection(
                (HOST, target.dns_port), timeout=5.0, source_address=(ATTACKER_TCP, 0)
            ) as sock,
        ):
            while time.monotonic() < deadline:
                wire = with_id(tcp_wire)
                sock.sendall(len(wire).to_bytes(2, "big") + wire)
                asked += 1
                recv_exact(sock, int.from_bytes(recv_exact(sock, 2), "big"))
                answered += 1
        cpu_each = (target.cpu_ns() - before) / 1e6 / max(asked, 1)
        sample = target.sample()
    size = 0 if tcp_first.reply is None else len(tcp_first.reply)
    measured = (
        f"TCP first {tcp_first.cpu_ms:.1f} ms CPU: {tcp_first.rcode}, {tcp_first.records} "
        f"records, {size:,} B; repeat {hit_text(tcp_hit)} ({tcp_repeat.cpu_ms:.1f} ms CPU). "
        f"UDP first {udp_first.cpu_ms:.1f} ms CPU ({udp_first.rcode}); repeat "
        f"{hit_text(udp_hit)} ({udp_repeat.cpu_ms:.1f} ms CPU). Then {answered}/{asked} repeats "
        f"over TCP in {args.seconds:g} s, {cpu_each:.2f} ms CPU each"
    )
    details = {
        "first_tcp": vars_of(tcp_first), "repeat_tcp": vars_of(tcp_repeat),
        "tcp_repeat_hit": tcp_hit, "first_udp": vars_of(udp_first),
        "repeat_udp": vars_of(udp_repeat), "udp_repeat_hit": udp_hit,
        "repeats": asked, "repeats_answered": answered, "cpu_ms_per_repeat": cpu_each,
    }  # fmt: skip
    return Outcome(measured, tcp_hit is True and udp_hit is True, [victim.stats], sample, details)


def parse_size(text: str) -> int:
    """Bytes from `1048576`, `512Ki`, `64Mi` or `1Gi`."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    if text[-2:] in units:
        return int(text[:-2]) * units[text[-2:]]
    return int(text)


def cache_bounds(flags: Sequence[str]) -> int:
    """The two caches' byte bounds that `--cache-flags` give (toposdns's defaults otherwise:
    32Mi and 16Mi without a memory limit)."""
    bounds = {"--cache-max-bytes": 32 << 20, "--forward-cache-max-bytes": 16 << 20}
    for i, flag in enumerate(flags):
        name, _, value = flag.partition("=")
        if name in bounds:
            bounds[name] = parse_size(value or flags[i + 1])
    return sum(bounds.values())


def option_query(name: str, code: int, value: bytes, payload: int = 1232) -> bytes:
    """An A query with one EDNS option (written by hand: dnspython keeps its messages well
    under 64 KiB)."""
    wire = bytearray(query_wire(name))
    wire[10:12] = (1).to_bytes(2, "big")  # ARCOUNT: the OPT record
    rdata = struct.pack("!HH", code, len(value)) + value
    return bytes(wire) + b"\x00" + struct.pack("!HHIH", 41, payload, 0, len(rdata)) + rdata


def attack_options(target: Target, args: argparse.Namespace) -> Outcome:
    bound = cache_bounds(args.cache_flags.split())
    for _ in range(20):  # warm: the reply is cached, so the flood measures the options only
        target.udp(with_id(query_wire(VICTIM_NAME)), OPTION_FLOODER)
    time.sleep(0.5)
    start = target.sample(queues=False).rss_mib
    peak = start
    sent = answered = reconnects = 0
    stop_at = args.option_stop_mib
    sock: socket.socket | None = None
    with UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim:
        deadline = time.monotonic() + args.seconds + 4.0
        try:
            while sent < args.option_queries and time.monotonic() < deadline:
                if sock is None:
                    sock = socket.create_connection(
                        (HOST, target.dns_port), timeout=5.0, source_address=(OPTION_FLOODER, 0)
                    )
                code = 12 if sent % 2 == 0 else 65001  # PADDING, then an unknown option
                wire = option_query(VICTIM_NAME, code, os.urandom(OPTION_BYTES))
                sent += 1
                try:
                    sock.sendall(len(wire).to_bytes(2, "big") + wire)
                    recv_exact(sock, int.from_bytes(recv_exact(sock, 2), "big"))
                    answered += 1
                except OSError:
                    sock.close()
                    sock = None
                    reconnects += 1
                if sent % 50 == 0:
                    peak = max(peak, target.sample(queues=False).rss_mib)
                    if peak - start > stop_at:
                        break  # far past any bound: enough to tell, and the machine is spared
        finally:
            if sock is not None:
                sock.close()
        time.sleep(0.5)
        sample = target.sample()
    peak = max(peak, sample.rss_mib)
    growth = peak - start
    # PADDING over UDP: the reply must stay within the 1232-byte cap.
    padded = option_query(VICTIM_NAME, 12, bytes(1300))
    udp_reply = target.udp(padded, OPTION_FLOODER)
    udp_size = None if udp_reply is None else len(udp_reply)
    limit_mib = bound * 1.1 / (1 << 20)
    passed = growth <= limit_mib and (udp_size is None or udp_size <= 1232)
    measured = (
        f"{answered}/{sent} queries with distinct {OPTION_BYTES // 1000} KB options over TCP "
        f"({reconnects} reconnects): RSS {start:.0f} -> {peak:.0f} MiB (+{growth:.0f} MiB) "
        f"against cache bounds of {bound / (1 << 20):.0f} MiB"
        + (f" (stopped past +{stop_at} MiB)" if growth > stop_at else "")
        + f". A 1,300-byte PADDING over UDP: reply {fmt(udp_size)} B"
    )
    details = {
        "queries": sent, "answered": answered, "rss_start_mib": start, "rss_peak_mib": peak,
        "cache_bounds_bytes": bound, "udp_padding_reply_bytes": udp_size,
    }  # fmt: skip
    return Outcome(measured, passed, [victim.stats], sample, details)


def attack_http(target: Target, args: argparse.Namespace) -> Outcome:
    probed = ((target.health_port, "/health"), (target.ready_port, "/ready"))
    keep_alive, half_open = [], []
    for port, path in probed:
        get = f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode()
        keep_alive.append(HeldConnections(port, [HTTP_KEEPALIVE], 128, get, every=2.0, repeat=get))
        half_open.append(HeldConnections(port, [HTTP_HALF_OPEN], 64, get[: get.index(b"\r\n")]))
    answered = {path: VictimStats(path, timeout_s=1.0) for _, path in probed}
    with contextlib.ExitStack() as stack:
        victim = stack.enter_context(UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME))
        # The keep-alive clients first, as a pod that connected before the others: each has
        # sent a whole request by the time the half-open ones come.
        for flood in keep_alive:
            stack.enter_context(flood)
        for flood in keep_alive:
            flood.wait_opened(flood.per_source, 5.0)
        time.sleep(0.5)
        for flood in half_open:
            stack.enter_context(flood)
        time.sleep(1.0)
        for _ in range(20):
            for port, path in probed:
                took = probe(port, path)
                answered[path].asked += 1
                if took is not None:
                    answered[path].latencies_ms.append(took * 1000)
            time.sleep(0.2)
        sample = target.sample()
        held = [flood.open for flood in keep_alive], [flood.open for flood in half_open]
        opened = sum(flood.opened for flood in half_open)
    probes = list(answered.values())
    passed = all(stats.answered >= 19 for stats in probes)
    measured = (
        f"/health {answered['/health'].answered}/20, /ready {answered['/ready'].answered}/20 "
        "with 128 keep-alive connections (a GET every 2 s), then 64 half-open ones, on each "
        f"listener; open at the end: keep-alive {held[0][0]} + {held[0][1]}, half-open "
        f"{held[1][0]} + {held[1][1]} ({opened} opened)"
    )
    details = {"keep_alive_open": held[0], "half_open_open": held[1], "half_open_opened": opened}
    return Outcome(measured, passed, [*probes, victim.stats], sample, details)


def attack_orphans(target: Target, args: argparse.Namespace) -> Outcome:
    queries = b"".join(
        len(wire).to_bytes(2, "big") + wire
        for wire in (with_id(srv_query(BIG_SRV, None), i) for i in range(16))
    )
    flood = HeldConnections(
        target.dns_port, [ORPHAN_FLOODER], args.orphan_connections, queries,
        read=False, replace=False, rcvbuf=4096, max_opened=args.orphan_connections,
    )  # fmt: skip
    with (
        flood,
        UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as udp_victim,
        TcpVictim(target.dns_port, TCP_VICTIM, VICTIM_NAME, count=20) as victim,
    ):
        time.sleep(args.orphan_seconds)
        sample = target.sample()  # while the flood still holds its end of every connection
        opened, closed, failed = flood.opened, flood.closed_by_server, flood.failed
        victim.wait()
    queues = sample.queues
    passed = (
        not queues.error
        and queues.queued <= ORPHAN_QUEUE_TARGET
        and queues.orphans_holding == 0
        and queues.owned <= MAX_TCP_CONNECTIONS
    )
    measured = (
        f"{opened} connections opened in {args.orphan_seconds:g} s ({failed} connects failed), "
        f"{closed} closed by the server; its side: {queues.sockets} sockets "
        f"({queues.owned} its own, {queues.orphans} orphans, {queues.orphans_holding} of them "
        "holding bytes), "
        f"{queues.send_q / (1 << 20):.1f} MiB in send queues"
    )
    details = {"opened": opened, "closed_by_server": closed, "connect_failed": failed,
               "queues": queues.summary()}  # fmt: skip
    return Outcome(measured, passed, [victim.stats, udp_victim.stats], sample, details)


def attack_fairness(sources: int) -> Callable[[Target, argparse.Namespace], Outcome]:
    def run(target: Target, args: argparse.Namespace) -> Outcome:
        addresses = [f"127.0.4.{i + 1}" for i in range(sources)]
        # More than the cap in all, evenly: each holds a tenth more than its equal share.
        per_source = math.ceil(MAX_TCP_CONNECTIONS * 1.1 / sources)
        flood = HeldConnections(target.dns_port, addresses, per_source, b"\x00")
        with flood:
            flood.wait_opened(MAX_TCP_CONNECTIONS, 8.0)
            time.sleep(0.5)
            with (
                UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as udp_victim,
                TcpVictim(target.dns_port, TCP_VICTIM, VICTIM_NAME, count=20) as victim,
            ):
                pass
            sample = target.sample()
            opened, closed, failed = flood.opened, flood.closed_by_server, flood.failed
        stats = victim.stats
        measured = (
            f"fifth client {stats.answered}/{stats.asked} TCP answers; {sources} sources of "
            f"{per_source} busy 1-byte connections: {opened} opened, {closed} closed by the "
            f"server, {failed} connects failed"
        )
        details = {"opened": opened, "closed_by_server": closed, "connect_failed": failed}
        victims = [stats, udp_victim.stats]
        return Outcome(measured, stats.answered >= 19, victims, sample, details)

    return run


def case_costs(
    target: Target, name: str, rtype: str, payload: int | None, count: int, rounds: int
) -> tuple[float, float, int]:
    """(server µs per same-case hit, per random-case query, lost), medians of `rounds`."""
    rng = random.Random(7)

    def wire(qname: str) -> bytes:
        if payload is None:
            return query_wire(qname, rtype)
        return bytes(dns.message.make_query(qname, rtype, use_edns=0, payload=payload).to_wire())

    same = wire(name)
    for _ in range(50):
        target.udp(with_id(same), CASE_CLIENT, 1.0)
    lost = 0

    def cost(wires: list[bytes]) -> float:
        nonlocal lost
        before = target.cpu_ns()
        for query in wires:
            lost += target.udp(query, CASE_CLIENT, 1.0) is None
        time.sleep(0.02)
        return (target.cpu_ns() - before) / 1000 / len(wires)

    same_us, random_us = [], []
    for _ in range(rounds):
        same_us.append(cost([with_id(same) for _ in range(count)]))
        cased = {random_case(name, rng) for _ in range(count * 2)} - {name, name.lower()}
        random_us.append(cost([with_id(wire(qname)) for qname in list(cased)[:count]]))
    return statistics.median(same_us), statistics.median(random_us), lost


def attack_case(target: Target, args: argparse.Namespace) -> Outcome:
    rounds = 3
    small = case_costs(target, VICTIM_NAME, "A", None, args.case_queries, rounds)
    large = case_costs(target, BIG_SRV, "SRV", 1232, max(args.case_queries // 3, 20), rounds)
    ratios = [small[1] / small[0], large[1] / large[0]]
    # Then random-case SRV as fast as one client asks, while the victim asks.
    rng = random.Random(8)
    with UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim:
        deadline = time.monotonic() + min(args.seconds, 4.0)
        while time.monotonic() < deadline:
            target.udp(srv_query(random_case(BIG_SRV, rng)), CASE_CLIENT, 1.0)
        sample = target.sample()
    measured = (
        f"A: {small[1]:.0f} µs per random-case query vs {small[0]:.0f} µs per same-case hit "
        f"({ratios[0]:.2f}x); 100-endpoint SRV (EDNS 1232): {large[1]:.0f} vs {large[0]:.0f} "
        f"µs ({ratios[1]:.2f}x); server CPU, medians of {rounds} rounds; {small[2] + large[2]} "
        "lost"
    )
    details = {
        "a_same_us": small[0], "a_random_us": small[1], "srv_same_us": large[0],
        "srv_random_us": large[1], "ratios": ratios,
    }  # fmt: skip
    return Outcome(measured, max(ratios) <= CASE_TARGET, [victim.stats], sample, details)


OVERLAY = REPO / "manifests" / "coredns-forward"


def shipped_block(hop: str) -> tuple[list[Directive], str]:
    """The cluster zone's Corefile block as shipped for `hop`, and where: "coredns", the
    `coredns-forward` overlay's (ConfigMap `coredns-custom`); "nodelocal", the one
    manifests/README.md gives for NodeLocal DNSCache's Corefile."""
    if hop == "coredns":
        path = OVERLAY / "coredns-custom.yaml"
        (document,) = yaml.safe_load_all(path.read_text(encoding="utf-8"))
        (text,) = document["data"].values()
    else:
        path = REPO / "manifests" / "README.md"
        text = shown_corefile(path.read_text(encoding="utf-8"), "Behind NodeLocal DNSCache")
    return corefile_block(text, "cluster.local:53"), str(path.relative_to(REPO))


def overlay_trust() -> list[str]:
    """The `--ecs-trust*` flags the `coredns-forward` overlay adds to the DNS server's args."""
    kustomization = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text(encoding="utf-8"))
    found = []
    for patch in kustomization.get("patches", []):
        operations = yaml.safe_load(patch.get("patch", ""))
        if isinstance(operations, list):
            found += [
                str(op["value"])
                for op in operations
                if isinstance(op, dict) and str(op.get("value", "")).startswith("--ecs-trust")
            ]
    return found


def trusted_services() -> list[tuple[str, str]]:
    """The Services whose endpoints the overlay trusts (`--ecs-trust-service=NS/NAME,...`)."""
    return [
        (found.split("/")[0], found.split("/")[1])
        for flag in overlay_trust()
        if flag.startswith("--ecs-trust-service=")
        for found in flag.split("=", 1)[1].split(",")
    ]


def coredns_objects() -> list[JSON]:
    """CoreDNS's Service as the overlay trusts it, CoreDNS's pod (the forwarder) its endpoint."""
    dns_ports = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    objects = []
    for i, (ns, name) in enumerate(trusted_services()):
        objects += [
            service(name, ns, cluster_ip=f"10.96.0.{20 + i}", ports=dns_ports),
            endpoint_slice(name, ns, [endpoint(COREDNS_POD)], ports=dns_ports),
        ]
    return objects


def coredns_flags(args: argparse.Namespace) -> list[str]:
    return overlay_trust()  # as the overlay trusts CoreDNS's pods


def nodelocal_flags(args: argparse.Namespace) -> list[str]:
    # As manifests/README.md says: with the block's rewrite, trust the nodes' own addresses.
    directives, _ = shipped_block("nodelocal")
    return ["--ecs-trust", f"{NODE_A}/32"] if any(d[0][0] == "rewrite" for d in directives) else []


def rewrite_text(hop: CorefileForwarder) -> str:
    """The block's `rewrite edns0 subnet` as the stand-in plays it."""
    rule = hop.rewrite
    return "no rewrite" if rule is None else f"`rewrite edns0 subnet {rule.action}`"


def placement_text(answer: frozenset[str] | None) -> str:
    if answer is None:
        return "no reply"
    for name, addresses in (("z1", Z1), ("z2", Z2)):
        if answer == addresses:
            return name
    return "NODATA" if not answer else ",".join(sorted(answer))


def attack_ecs_coredns(target: Target, args: argparse.Namespace) -> Outcome:
    block, where = shipped_block("coredns")
    forged = VictimStats("forging pod", timeout_s=2.0)
    got: dict[str, int] = {}
    with (
        CorefileForwarder(block, COREDNS_POD, (HOST, target.dns_port)) as coredns,
        UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim,
    ):
        honest = target.addresses(WEB, HONEST_POD, coredns.address)
        for _ in range(20 if honest == Z1 else 0):  # else the set-up is wrong: nothing to tell
            started = time.monotonic()
            answer = target.addresses(WEB, FORGING_POD, coredns.address, ecs=Z2_ADDRESS)
            forged.asked += 1
            got[placement_text(answer)] = got.get(placement_text(answer), 0) + 1
            if answer == Z1:
                forged.latencies_ms.append((time.monotonic() - started) * 1000)
        sample = target.sample()
        played = rewrite_text(coredns)
    passed = honest == Z1 and forged.answered == forged.asked
    measured = f"{where}: {played}, {' '.join(overlay_trust()) or 'no trust flag'}; " + (
        f"a pod of z1 sending ECS {Z2_ADDRESS}/32 (z2) got: {counted(got)}"
        if honest == Z1
        else f"SET-UP: a pod of z1 without ECS got {placement_text(honest)}, not z1"
    )
    details = {"block": where, "rewrite": played, "forged_answers": got,
               "honest": sorted(honest or [])}  # fmt: skip
    return Outcome(measured, passed, [forged, victim.stats], sample, details)


def counted(got: dict[str, int]) -> str:
    return ", ".join(f"{what} {count}x" for what, count in sorted(got.items()))


def attack_ecs_nodelocal(target: Target, args: argparse.Namespace) -> Outcome:
    block, where = shipped_block("nodelocal")
    neighbour = VictimStats("neighbour pod", timeout_s=2.0)
    got: dict[str, int] = {}
    # The set-up, asked past the node cache (so that it keeps nothing): a pod of z1 gets z1.
    honest = target.addresses(WEB, HONEST_POD)
    poisoner = None
    with (
        CorefileForwarder(block, NODE_A, (HOST, target.dns_port)) as cache,
        UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim,
    ):
        if honest == Z1:
            # A pod of another namespace on node-a claims an address nobody places: NODATA,
            # if believed, and the node's cache keeps it (its key is the name and type only).
            poisoner = target.addresses(WEB, POISONING_POD, cache.address, ecs=UNPLACED)
            for _ in range(20):
                started = time.monotonic()
                answer = target.addresses(WEB, NEIGHBOUR_POD, cache.address)
                neighbour.asked += 1
                got[placement_text(answer)] = got.get(placement_text(answer), 0) + 1
                if answer == Z1:
                    neighbour.latencies_ms.append((time.monotonic() - started) * 1000)
                time.sleep(0.1)
        sample = target.sample()
        forwarded, hits, played = cache.forwarded, cache.hits, rewrite_text(cache)
    passed = poisoner == Z1 and neighbour.answered == neighbour.asked == 20
    measured = f"{where}, NodeLocal's block: {played}; " + (
        f"the pod sending ECS {UNPLACED}/32 got {placement_text(poisoner)}; then a pod of "
        f"another namespace on its node (z1) got: {counted(got)} ({hits} from the node cache)"
        if honest == Z1
        else f"SET-UP: a pod of z1 got {placement_text(honest)}, not z1"
    )
    details = {
        "block": where, "rewrite": played, "poisoner": placement_text(poisoner),
        "neighbour_answers": got, "forwarded": forwarded, "cache_hits": hits,
    }  # fmt: skip
    return Outcome(measured, passed, [neighbour, victim.stats], sample, details)


def rogue_locators() -> list[tuple[str, list[JSON]]]:
    """What a tenant's admin can create: (what it claims, the PodLocators)."""
    z2 = node_labels("node-b", "z2")
    return [
        ("exact address", [pod_locator(
            "pl-exact", TENANT, addresses=[LOCATOR_VICTIM], node_name="node-b", node_labels=z2,
        )]),
        ("node-a's CIDR", [pod_locator(
            "pl-cidr", TENANT, addresses=None, cidrs=["127.1.1.0/24"], node_name="node-b",
            node_labels=z2,
        )]),
        ("node label", [pod_locator(
            "node-a", TENANT, addresses=["127.0.6.77"], node_name="node-a",
            node_labels=node_labels("node-a", "z2"), role="node",
        )]),
    ]  # fmt: skip


def wait_for(check: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def attack_locators(target: Target, args: argparse.Namespace) -> Outcome:
    api = target.api
    answers = VictimStats("shop pod", timeout_s=2.0)
    results: dict[str, str] = {}

    def victim_answer() -> frozenset[str] | None:
        return target.addresses(WEB, LOCATOR_VICTIM)

    with UdpVictim(target.dns_port, UDP_VICTIM, VICTIM_NAME) as victim:
        for k, (claim, rogues) in enumerate(rogue_locators()):
            if not wait_for(lambda: victim_answer() == Z1, 5.0):
                results[claim] = f"SET-UP: the victim got {placement_text(victim_answer())}"
                continue
            for rogue in rogues:
                api.add(rogue)
            # A barrier: a node locator of the controller's (believed under any rule) added
            # after the tenant's, on the same watch; once it shows, so has theirs.
            barrier = f"127.1.{20 + k}"
            api.add(pod_locator(
                f"barrier-{k}", CONTROLLER_NAMESPACE, addresses=None,
                cidrs=[f"{barrier}.0/24"], node_name=f"barrier-{k}",
                node_labels=node_labels(f"barrier-{k}", "z2"), role="node",
            ))  # fmt: skip
            client = f"{barrier}.1"
            seen = wait_for(lambda: Z2 <= (target.addresses(WEB, client) or set()), 5.0)  # noqa: B023
            got: dict[str, int] = {}
            for _ in range(5):
                started = time.monotonic()
                answer = victim_answer()
                answers.asked += 1
                got[placement_text(answer)] = got.get(placement_text(answer), 0) + 1
                if answer == Z1:
                    answers.latencies_ms.append((time.monotonic() - started) * 1000)
                time.sleep(0.1)
            results[claim] = counted(got) + (
                "" if seen else " (the barrier never showed: not applied yet?)"
            )
            for rogue in rogues:
                meta = rogue["metadata"]
                api.delete("podlocators", meta["namespace"], meta["name"])
        sample = target.sample()
    passed = answers.asked == 15 and answers.answered == 15
    measured = "a shop pod in z1, with a tenant's PodLocator claiming " + "; ".join(
        f"{claim}: {text}" for claim, text in results.items()
    )
    return Outcome(measured, passed, [answers, victim.stats], sample, {"results": results})


ATTACKS: list[Attack] = [
    Attack("slice", f"first SRV <= {SLICE_FIRST_TARGET_MS:g} ms CPU, repeats are cache hits, "
           "no traceback, no panic", attack_slice, rogue_slice),
    Attack("large-service", "SRV repeats are cache hits (UDP and TCP)", attack_large_service,
           large_service),
    Attack("options", "RSS growth <= cache bounds + 10%; UDP reply <= 1232 B", attack_options),
    Attack("http", "/health and /ready each >= 19/20", attack_http),
    Attack("orphans", "<= 16 MiB queued; no orphan holding bytes; its sockets <= the cap",
           attack_orphans),
    Attack("fairness-4", "fifth client >= 19/20", attack_fairness(4)),
    Attack("fairness-32", "fifth client >= 19/20", attack_fairness(32)),
    Attack("case", f"random case <= {CASE_TARGET:g}x a same-case hit", attack_case),
    Attack("ecs-coredns", "the pod gets its own zone (z1), 20/20", attack_ecs_coredns,
           coredns_objects, coredns_flags),
    Attack("ecs-nodelocal", "both pods get their own zone (z1), 20/20", attack_ecs_nodelocal,
           flags=nodelocal_flags),
    Attack("locators", "the shop pod's answer unchanged (z1), 15/15", attack_locators),
]  # fmt: skip


# ----- running them -----


@dataclass
class Row:
    attack: str
    target: str
    measured: str = ""
    passed: bool = False
    victims: list[VictimStats] = field(default_factory=list)
    start: Sample = field(default_factory=Sample)
    sample: Sample = field(default_factory=Sample)
    details: JSON = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> JSON:
        return {
            "attack": self.attack,
            "verdict": "PASS" if self.passed else "FAIL",
            "target": self.target,
            "measured": self.measured,
            "victims": [victim.summary() for victim in self.victims],
            "rss_start_mib": finite(self.start.rss_mib),
            "rss_mib": finite(self.sample.rss_mib),
            "pss_mib": finite(self.sample.pss_mib),
            "socket_queues": self.sample.queues.summary(),
            "seconds": round(self.seconds, 1),
            "details": self.details,
        }


def finite(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)


def fmt(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def vars_of(cost: Cost) -> JSON:
    return {"rcode": cost.rcode, "records": cost.records, "wall_ms": round(cost.wall_ms, 2),
            "cpu_ms": round(cost.cpu_ms, 2)}  # fmt: skip


def run_attack(attack: Attack, args: argparse.Namespace) -> Row:
    """Start a stand-in with the attack's objects and a server, run the attack, stop both."""
    row = Row(attack.name, attack.target)
    started = time.monotonic()
    api = FakeApiServer()
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-hostile-"))
    target: Target | None = None
    try:
        for obj in [*base_objects(), *attack.objects()]:
            api.add(obj)
        api.start()
        flags = [*args.cache_flags.split(), *attack.flags(args), *args.toposdns_arg]
        target = Target(api, workdir, flags)
        row.start = target.start
        outcome = attack.run(target, args)
        row.measured, row.passed = outcome.measured, outcome.passed
        row.victims, row.details = outcome.victims, outcome.details
        row.sample = outcome.sample or target.sample()
        if target.proc.proc.poll() is not None:
            row.passed = False
            row.measured += f" [the server exited with {target.proc.proc.returncode}]"
        elif attack.name != "slice" and (tracebacks := target.tracebacks()):
            row.passed = False
            row.measured += f" [{tracebacks} tracebacks in the server's log]"
    except Exception as exc:  # an attack that cannot run is a FAIL row, not the end of the run
        row.passed = False
        row.measured = f"could not run: {type(exc).__name__}: {exc}".splitlines()[0]
        if target is not None and target.proc.proc.poll() is not None:
            row.measured += f" [the server exited with {target.proc.proc.returncode}]"
        log(f"{attack.name}: {traceback.format_exc()}")
    finally:
        if target is not None:
            target.stop()
            if args.show_log:
                log(f"{attack.name}: toposdns log:\n{target.proc.tail(40)}")
        with contextlib.suppress(Exception):
            api.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    row.seconds = time.monotonic() - started
    verdict = "PASS" if row.passed else "FAIL"
    log(f"{attack.name}: {verdict} in {row.seconds:.0f} s: {row.measured}")
    return row


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(rows: list[Row], info: JSON) -> str:
    lines = [
        f"{info['date']}, nproc {info['nproc']}, {info['cpu']}, Python {info['python']}, "
        f"commit {info['commit']}, `python -m bench.hostile {' '.join(info['argv'])}`".rstrip(),
        "",
        "| attack | victim's answers | victim p99 ms | RSS MiB | PSS MiB | server's TCP queues "
        "| measured | target | verdict |",
        "|---|---|---|---:|---:|---|---|---|---|",
    ]
    for row in rows:
        rss = row.sample.rss_mib
        growth = rss - row.start.rss_mib
        rss_text = "?" if math.isnan(rss) else f"{rss:.0f} ({growth:+.0f})"
        pss = row.sample.pss_mib
        cells = [
            row.attack,
            "; ".join(v.answers_text() for v in row.victims) or "-",
            "; ".join(v.p99_text() for v in row.victims) or "-",
            rss_text,
            "?" if math.isnan(pss) else f"{pss:.0f}",
            row.sample.queues.text(),
            row.measured,
            row.target,
            "PASS" if row.passed else "**FAIL**",
        ]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    passed = sum(row.passed for row in rows)
    lines += ["", f"{passed} of {len(rows)} attacks held to their target."]
    return "\n".join(lines)


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
            timeout=10, check=True,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "?"
    return done.stdout.strip()


def selected(only: str | None) -> list[Attack]:
    """The attacks `--only` names (a name, or the start of names: `fairness`, `ecs`)."""
    if not only:
        return list(ATTACKS)
    wanted = [word.strip() for word in only.split(",") if word.strip()]
    chosen = [
        attack
        for attack in ATTACKS
        if any(attack.name == word or attack.name.startswith(word + "-") for word in wanted)
    ]
    unknown = [
        word
        for word in wanted
        if not any(a.name == word or a.name.startswith(word + "-") for a in ATTACKS)
    ]
    if unknown:
        names = ", ".join(attack.name for attack in ATTACKS)
        raise SystemExit(f"--only: no attack named {', '.join(unknown)} (attacks: {names})")
    return chosen


def raise_open_files() -> None:
    """Room for a few thousand sockets: the floods hold up to --orphan-connections at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help="run only these attacks (or those starting NAME-: fairness, ecs)",
    )
    p.add_argument("--list", action="store_true", help="list the attacks and their targets")
    p.add_argument(
        "--seconds",
        type=float,
        default=6.0,
        help="length of each attack's flood while its victim asks (default 6)",
    )
    p.add_argument(
        "--option-queries",
        type=int,
        default=3000,
        help="60 KB option queries of the option flood, at most (default 3000)",
    )
    p.add_argument(
        "--option-stop-mib",
        type=float,
        default=512.0,
        help="stop the option flood once RSS grew this much (default 512)",
    )
    p.add_argument(
        "--orphan-connections",
        type=int,
        default=2000,
        help="connections of the orphan flood, at most (default 2000)",
    )
    p.add_argument(
        "--orphan-seconds",
        type=float,
        default=5.0,
        help="how long the orphan flood lasts (default 5)",
    )
    p.add_argument(
        "--case-queries",
        type=int,
        default=500,
        help="queries per round of the random-case cost (default 500; SRV a third of that)",
    )
    bounds = "--cache-max-bytes 21Mi --forward-cache-max-bytes 10Mi"
    p.add_argument(
        "--cache-flags",
        default=bounds,
        help=f"the cache bounds a 170Mi pod derives (default {bounds!r})",
    )
    p.add_argument(
        "--toposdns-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `toposdns serve` (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print each server's log at the end")
    args = p.parse_args(argv)
    positive = [args.seconds, args.option_queries, args.orphan_connections,
                args.orphan_seconds, args.case_queries, args.option_stop_mib]  # fmt: skip
    if min(positive) <= 0:
        p.error("counts and durations must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for attack in ATTACKS:
            print(f"{attack.name:14} {attack.target}")
        return 0
    attacks = selected(args.only)
    raise_open_files()
    info: JSON = {**machine(), "commit": commit(),
                  "argv": list(sys.argv[1:] if argv is None else argv)}  # fmt: skip
    rows = [run_attack(attack, args) for attack in attacks]
    if args.json:
        print(json.dumps({**info, "attacks": [row.summary() for row in rows]}, indent=1))
    else:
        print(table(rows, info))
    return 0 if all(row.passed for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
