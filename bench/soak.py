"""A soak: one server under everything at once, every answer checked against the truth.

`toposdns serve --workers 2` watches the stand-in API (tests/kubeapi.py) and forwards other
names to a fake upstream (tests/upstream.py), both in this process. Then, all at once:

- **load**: a checked stream of queries (`--checked-qps`): ClusterIP, headless and
  topology-filtered names in random letter case, from placed clients' own addresses and with
  EDNS Client Subnet from a trusted forwarder, with and without DNS cookies, over UDP and TCP, a
  headless service of 100 endpoints (truncated over UDP, whole over TCP), forwarded names, and
  a flood of made-up names; and with `--bulk`, dnsperf adds unchecked load, so that the total
  is `--load` (0.5) of the server's max QPS, measured by dnsperf first;
- **changes**: `--slice-changes` EndpointSlice (10) and `--locator-changes` PodLocator (5)
  changes a second: an endpoint moves to a new address and node, a client to another node;
- **faults**, one every `--fault-every` seconds (30), in turn: the API server drops every watch,
  the API history is compacted (410), the upstream goes silent, the upstream sends garbage, a
  worker is SIGKILLed, a TCP slowloris (256 connections sending a byte at a time), and a
  Corefile update. The server reads its Corefile (`reload 2s 1s`) from a directory laid out as
  the kubelet mounts a ConfigMap, and each update swaps it as the kubelet does, with a new
  `hosts` address for `reloaded.soak.test`: every worker must answer it within the reload's
  interval, jitter and settling time (plus a margin). Every second update (the first too)
  first writes a broken Corefile, which must be refused (its log line) while the old one
  keeps answering.

Every answer is checked against what the API held when the query was sent, up to one change
interval before (`LAG`); inside the window of a fault that cuts the server off from the API,
against anything since the fault began. It reports, per minute: queries, wrong answers (must
be 0), unanswered queries outside the fault windows and inside them, p99 latency, and the RSS
and open files of the server's processes; then the slope of RSS and open files over the last 20
minutes (`--slope-window`).

Run from the repository root:  python -m bench.soak --duration 1800 --bulk  (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import multiprocessing
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dns.asyncquery
import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype

from bench import dnsperf as perf
from bench.harness import (
    HOST,
    ConfigMap,
    FakeApiServer,
    ServerProcess,
    StubUpstream,
    endpoint,
    endpoint_slice,
    log,
    namespace,
    percentile,
    pod_locator,
    service,
    toposdns_command,
)
from toposdns.reload import SETTLE

JSON = dict[str, Any]
NS = "soak"
ZONES = ("z0", "z1", "z2")
NODES = [(f"node-{i}", ZONES[i % len(ZONES)]) for i in range(6)]
#: Clients that ask from their own loopback address, and clients behind a forwarder (ECS).
SOURCE_CLIENTS = [f"127.0.1.{i}" for i in range(1, 13)]
ECS_CLIENTS = [f"10.9.0.{i}" for i in range(1, 13)]
FORWARDER = HOST  # the only address --ecs-trust names
CLUSTER_IPS = 20
HEADLESS = 10
TOPOLOGY = 10
BIG_ENDPOINTS = 100
FORWARDED = {f"ext-{i}.example.test": f"192.0.2.{i}" for i in range(1, 21)}
BIG_FORWARDED = "big.example.test"
BIG_FORWARDED_ADDRESSES = [f"198.51.100.{i}" for i in range(1, 81)]
#: How stale an answer may be: one change interval, and the server's coalescing of events.
LAG = 1.0
#: How long a fault lasts, and how long after it the server may take to be whole again: an
#: upstream found healthy (probes every 0.5 s) and the SERVFAILs cached meanwhile gone (5 s).
FAULT_SECONDS = 8.0
RECOVERY = 8.0
QUERY_TIMEOUT = 2.0
SAMPLE_EVERY = 10.0
#: The name each Corefile update changes the address of, and the reload's interval and jitter.
RELOADED = "reloaded.soak.test."
RELOAD_EVERY, RELOAD_JITTER = 2.0, 1.0
#: How long an update may take to answer: a check, the settling read, and a margin.
RELOAD_WITHIN = RELOAD_EVERY + RELOAD_JITTER + SETTLE + 4.0


# ----------------------------------------------------------------------------- the cluster


def slice_object(name: str, endpoints: list[tuple[str, str]]) -> JSON:
    """An EndpointSlice of `name` with ready endpoints (address, node)."""
    zone_of = dict(NODES)
    endpoints_ = [
        endpoint(address, nodeName=node, zone=zone_of[node]) for address, node in endpoints
    ]
    return endpoint_slice(name, NS, endpoints_, ports=[{"name": "http", "port": 8080}])


def service_object(name: str, cluster_ip: str | None, topology: bool = False) -> JSON:
    keys = {"toposdns.io/topology-keys": "topology.kubernetes.io/zone,*"}
    return service(
        name, NS, cluster_ip=cluster_ip or "None", annotations=keys if topology else None
    )


def locator_object(client: str, node: str) -> JSON:
    zone = dict(NODES)[node]
    return pod_locator(  # as the controller writes it, in its own namespace
        f"{NS}.client-" + client.replace(".", "-"),
        "toposdns",
        labels={"toposdns.io/pod-namespace": NS},
        addresses=[client],
        node_name=node,
        node_labels={"kubernetes.io/hostname": node, "topology.kubernetes.io/zone": zone},
    )


@dataclass
class History:
    """What one thing was since the start: (from when, value), oldest first."""

    versions: list[tuple[float, Any]] = field(default_factory=list)

    def set(self, when: float, value: Any) -> None:
        self.versions.append((when, value))

    def between(self, start: float, end: float) -> list[Any]:
        """Every value current at some moment in [start, end]."""
        found = []
        for i, (when, value) in enumerate(self.versions):
            until = self.versions[i + 1][0] if i + 1 < len(self.versions) else float("inf")
            if when <= end and until >= start:
                found.append(value)
        return found


class Truth:
    """The cluster in the API, and its history, which answers are checked against."""

    def __init__(self, api: FakeApiServer, rng: random.Random) -> None:
        self.api = api
        self.rng = rng
        self.services: dict[str, History] = {}  # name -> [(address, node), ...]
        self.clients: dict[str, History] = {}  # client address -> node
        self.next_address = int(ipaddress.IPv4Address("10.200.0.1"))
        now = time.monotonic()
        api.add(namespace(NS))
        for i in range(CLUSTER_IPS):
            api.add(service_object(f"c-{i}", f"10.96.1.{i + 1}"))
        names = [f"h-{i}" for i in range(HEADLESS)] + [f"t-{i}" for i in range(TOPOLOGY)]
        for name in names:
            api.add(service_object(name, None, topology=name.startswith("t-")))
            endpoints = [self.new_endpoint() for _ in range(rng.randint(3, 6))]
            api.add(slice_object(name, endpoints))
            self.services[name] = History([(now, endpoints)])
        big = [self.new_endpoint() for _ in range(BIG_ENDPOINTS)]
        api.add(service_object("big", None))
        api.add(slice_object("big", big))
        self.services["big"] = History([(now, big)])
        for client in SOURCE_CLIENTS + ECS_CLIENTS:
            node = rng.choice(NODES)[0]
            api.add(locator_object(client, node))
            self.clients[client] = History([(now, node)])
        self.changeable = names

    def new_endpoint(self) -> tuple[str, str]:
        self.next_address += 1
        return str(ipaddress.IPv4Address(self.next_address)), self.rng.choice(NODES)[0]

    def change_slice(self) -> None:
        """One endpoint of a headless service moves to a new address and node."""
        name = self.rng.choice(self.changeable)
        endpoints = list(self.services[name].versions[-1][1])
        endpoints[self.rng.randrange(len(endpoints))] = self.new_endpoint()
        when = time.monotonic()  # before the API has it: the server cannot see it earlier
        self.api.modify(slice_object(name, endpoints))
        self.services[name].set(when, endpoints)

    def change_locator(self) -> None:
        """A client moves to another node."""
        client = self.rng.choice(SOURCE_CLIENTS + ECS_CLIENTS)
        node = self.rng.choice([n for n, _ in NODES if n != self.clients[client].versions[-1][1]])
        when = time.monotonic()
        self.api.modify(locator_object(client, node))
        self.clients[client].set(when, node)

    def expected(self, name: str, client: str | None, start: float, end: float) -> list[set[str]]:
        """Every answer (a set of addresses) that was right for `client` at some moment in
        [start, end]."""
        zone_of = dict(NODES)
        answers = []
        nodes: list[str | None] = [None]
        if client is not None and name.startswith("t-"):
            nodes = self.clients[client].between(start, end)
        for endpoints in self.services[name].between(start, end):
            for node in nodes:
                chosen = [a for a, n in endpoints if node and zone_of[n] == zone_of[node]]
                answers.append(set(chosen or [a for a, _ in endpoints]))
        return answers


# ----------------------------------------------------------------------------- the queries


@dataclass(frozen=True)
class Seen:
    """One checked query and what came back (`rcode` None: no reply within QUERY_TIMEOUT)."""

    kind: str
    name: str
    client: str
    tcp: bool
    cookie: bool
    sent: float  # time.monotonic(), the same clock in every process
    done: float
    rcode: int | None = None
    found: frozenset[str] = frozenset()
    truncated: bool = False
    cookie_echoed: bool = False
    ecs_scope: int | None = None

    @property
    def latency(self) -> float | None:
        return None if self.rcode is None else self.done - self.sent


def random_case(name: str, rng: random.Random) -> str:
    return "".join(c.upper() if rng.random() < 0.5 else c for c in name)


KINDS = ("clusterip", "headless", "topology", "ecs", "big", "forwarded", "bigforward",
         "madeup", "madeup-forward")  # fmt: skip
WEIGHTS = (15, 15, 20, 15, 5, 10, 3, 12, 5)


async def ask(port: int, rng: random.Random) -> Seen:
    """One query of a random kind, from a random client, over UDP or TCP."""
    kind = rng.choices(KINDS, weights=WEIGHTS)[0]
    client = rng.choice(SOURCE_CLIENTS)
    source, options = client, []
    tcp = rng.random() < 0.15
    if kind == "clusterip":
        name = f"c-{rng.randrange(CLUSTER_IPS)}.{NS}.svc.cluster.local."
    elif kind == "headless":
        name = f"h-{rng.randrange(HEADLESS)}.{NS}.svc.cluster.local."
    elif kind in ("topology", "ecs"):
        name = f"t-{rng.randrange(TOPOLOGY)}.{NS}.svc.cluster.local."
        if kind == "ecs":
            client, source = rng.choice(ECS_CLIENTS), FORWARDER
            options.append(dns.edns.ECSOption(client, 32))
    elif kind == "big":
        name = f"big.{NS}.svc.cluster.local."
    elif kind == "forwarded":
        name = rng.choice(list(FORWARDED)) + "."
    elif kind == "bigforward":
        name = BIG_FORWARDED + "."
    elif kind == "madeup":
        name = f"x{rng.getrandbits(40):x}.{NS}.svc.cluster.local."
    else:
        name = f"x{rng.getrandbits(40):x}.example.test."
    cookie = rng.random() < 0.3
    if cookie:
        options.append(dns.edns.GenericOption(dns.edns.COOKIE, rng.randbytes(8)))
    query = dns.message.make_query(
        random_case(name, rng), "A", use_edns=0, payload=1232, options=options
    )
    seen = Seen(kind, name, client, tcp, cookie, time.monotonic(), 0.0)
    send = dns.asyncquery.tcp if tcp else dns.asyncquery.udp
    try:
        reply = await send(query, HOST, port=port, source=source, timeout=QUERY_TIMEOUT)
    except (dns.exception.DNSException, OSError, EOFError, ValueError):  # EOF: TCP closed
        return dataclasses.replace(seen, done=time.monotonic())
    echoed = [o for o in reply.options if isinstance(o, dns.edns.ECSOption)]
    return dataclasses.replace(
        seen,
        done=time.monotonic(),
        rcode=reply.rcode(),
        found=frozenset(
            rd.to_text() for rrset in reply.answer if rrset.rdtype == dns.rdatatype.A
            for rd in rrset
        ),
        truncated=bool(reply.flags & dns.flags.TC),
        cookie_echoed=any(o.otype == dns.edns.COOKIE for o in reply.options),
        ecs_scope=echoed[0].scopelen if echoed else None,
    )  # fmt: skip


def asker(port: int, qps: float, until: float, seed: int, out: Any) -> None:
    """The checked load, in a process of its own so that the stand-ins' threads do not slow
    it: `qps` queries a second until the monotonic time `until`, what each saw sent to `out`
    (a queue) in batches; None at the end. When the machine cannot keep up, it sends fewer
    queries rather than bursts."""

    async def main() -> None:
        rng = random.Random(seed)
        pending: set[asyncio.Task[Seen]] = set()
        batch: list[Seen] = []

        def collect(task: asyncio.Task[Seen]) -> None:
            pending.discard(task)
            batch.append(task.result())

        next_query = next_flush = time.monotonic()
        while (now := time.monotonic()) < until:
            if next_query <= now:
                if len(pending) < 500:
                    task = asyncio.create_task(ask(port, rng))
                    pending.add(task)
                    task.add_done_callback(collect)
                next_query = max(next_query + 1 / qps, now - 0.05)
            if next_flush <= now:
                out.put(batch[:])
                batch.clear()
                next_flush += 1.0
            await asyncio.sleep(0.002)
        if pending:
            await asyncio.wait(pending)
        out.put(batch)
        out.put(None)

    asyncio.run(main())


class Judge:
    """Checks each answer against the truth, as it was while the query was out."""

    def __init__(self, truth: Truth, faults: Faults) -> None:
        self.truth = truth
        self.faults = faults
        self.seen: list[tuple[float, float | None, bool]] = []  # sent, latency, wrong
        self.examples: list[str] = []

    def add(self, seen: Seen) -> None:
        wrong = None if seen.rcode is None else self.wrong(seen)
        self.seen.append((seen.sent, seen.latency, wrong is not None))
        if seen.rcode is None and not self.faults.windows(seen.sent):
            wrong = f"no reply to {seen.kind} {seen.name} over {'tcp' if seen.tcp else 'udp'}"
        if wrong is not None and len(self.examples) < 20:
            self.examples.append(f"{seen.sent - self.faults.start:.1f}s: {wrong}")

    def wrong(self, seen: Seen) -> str | None:
        """What is wrong with the reply, or None."""
        kind, rcode, found = seen.kind, seen.rcode, set(seen.found)
        what = f"{kind} {seen.name} from {seen.client} over {'tcp' if seen.tcp else 'udp'}"
        if seen.cookie and not seen.cookie_echoed:
            return f"{what}: no cookie in the reply"
        if kind == "ecs" and seen.ecs_scope != 32:
            return f"{what}: ECS scope {seen.ecs_scope}, expected 32"
        upstream_down = self.faults.upstream(seen.sent)
        if kind.startswith("madeup"):
            if rcode == dns.rcode.NXDOMAIN:
                return None
            if kind == "madeup-forward" and rcode == dns.rcode.SERVFAIL and upstream_down:
                return None
            return f"{what}: {dns.rcode.to_text(rcode)}, expected NXDOMAIN"  # type: ignore[arg-type]
        if kind in ("forwarded", "bigforward"):
            if rcode == dns.rcode.SERVFAIL and upstream_down:
                return None
            if kind == "forwarded":
                expected = {FORWARDED[seen.name.rstrip(".")]}
            else:
                expected = set(BIG_FORWARDED_ADDRESSES)
            if rcode == dns.rcode.NOERROR and (
                found == expected or (seen.truncated and found <= expected)
            ):
                return None
            return f"{what}: {dns.rcode.to_text(rcode)} {sorted(found)[:4]}"  # type: ignore[arg-type]
        if rcode != dns.rcode.NOERROR:
            return f"{what}: {dns.rcode.to_text(rcode)}"  # type: ignore[arg-type]
        if kind == "clusterip":
            expected_ip = f"10.96.1.{int(seen.name.split('.')[0][2:]) + 1}"
            return None if found == {expected_ip} else f"{what}: {sorted(found)}"
        if kind == "big" and seen.tcp and seen.truncated:
            return f"{what}: truncated over TCP"
        stale = self.faults.stale_since(seen.sent)
        # As stale as one change interval; after a fault that cut the server off from the
        # API, as stale as it was when the fault began.
        start = (seen.sent if stale is None else min(seen.sent, stale)) - LAG
        placed = seen.client if kind in ("topology", "ecs") else None
        answers = self.truth.expected(seen.name.split(".")[0], placed, start, seen.done)
        if any(
            found == answer or (seen.truncated and found and found <= answer) for answer in answers
        ):
            return None
        return f"{what}: {len(found)} addresses {sorted(found)[:4]}, none of the right answers"


# ----------------------------------------------------------------------------- the faults


@dataclass
class Fault:
    kind: str
    start: float
    end: float


class Faults:
    """The faults, in turn, and their windows."""

    KINDS = ("watch-drop", "gone-410", "upstream-dies", "upstream-garbage", "worker-kill",
             "slowloris", "corefile-reload")  # fmt: skip
    #: Faults that cut the server off from the API: until it is back, it serves the data it had.
    STALE = ("watch-drop", "gone-410")

    def __init__(self, start: float) -> None:
        self.start = start
        self.done: list[Fault] = []

    def windows(self, when: float) -> list[Fault]:
        """The faults whose window holds `when`: from QUERY_TIMEOUT before it (a query out
        when it began) to RECOVERY after it."""
        return [f for f in self.done if f.start - QUERY_TIMEOUT <= when <= f.end + RECOVERY]

    def upstream(self, when: float) -> bool:
        return any(fault.kind.startswith("upstream") for fault in self.windows(when))

    def stale_since(self, when: float) -> float | None:
        starts = [fault.start for fault in self.windows(when) if fault.kind in self.STALE]
        return min(starts, default=None)


class Corefiles:
    """The server's Corefile, in a ConfigMap's directory, and what its updates did."""

    REFUSED = "reload: the Corefile is not applied"

    def __init__(self, directory: Path, port: int, kubeconfig: Path) -> None:
        directory.mkdir()
        self.configmap = ConfigMap(directory)
        self.port, self.kubeconfig = port, kubeconfig
        #: Per update: seconds until every worker answered it (None: not in RELOAD_WITHIN),
        #: and whether a broken Corefile went before it and was refused.
        self.updates: list[JSON] = []
        self.configmap.write(self.text())

    def address(self, version: int | None = None) -> str:
        """The address version `version` (default: the current one) gives RELOADED."""
        version = self.configmap.version if version is None else version
        return f"192.0.2.{1 + version % 250}"

    def text(self, broken: bool = False) -> str:
        """The next version of the Corefile; `broken`: with a line toposdns refuses."""
        return f"""\
.:{self.port} {{
    bind {HOST}
    hosts {{
        {self.address(self.configmap.version + 1)} {RELOADED.rstrip(".")}
        fallthrough
    }}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.kubeconfig}
        ttl {99999 if broken else 5}
    }}
    reload {RELOAD_EVERY:g}s {RELOAD_JITTER:g}s
}}
"""

    async def update(self, server: ServerProcess, port: int, broken: bool) -> None:
        """One update (after a broken one, if `broken`), checked through DNS and the log."""
        refused = None
        if broken:
            before = server.log().count(self.REFUSED)
            answer = self.address()
            self.configmap.write(self.text(broken=True))
            deadline = time.monotonic() + RELOAD_WITHIN
            while server.log().count(self.REFUSED) == before and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            refused = server.log().count(self.REFUSED) > before and await every_worker_answers(
                port, answer
            )
        self.configmap.write(self.text())
        written, answer = time.monotonic(), self.address()
        applied = None
        while time.monotonic() < written + RELOAD_WITHIN:
            if await every_worker_answers(port, answer):
                applied = round(time.monotonic() - written, 1)
                break
            await asyncio.sleep(0.2)
        self.updates.append({"applied_s": applied, "broken_refused": refused})

    def summary(self) -> JSON:
        applied = [u["applied_s"] for u in self.updates if u["applied_s"] is not None]
        broken = [u["broken_refused"] for u in self.updates if u["broken_refused"] is not None]
        return {
            "updates": len(self.updates),
            "applied": len(applied),
            "slowest_s": max(applied, default=None),
            "broken": len(broken),
            "broken_refused": sum(broken),
        }

    def failed(self) -> bool:
        summary = self.summary()
        return (
            summary["applied"] < summary["updates"] or summary["broken_refused"] < summary["broken"]
        )


async def every_worker_answers(port: int, address: str, tries: int = 8) -> bool:
    """True if RELOADED answers `address` to each of `tries` queries from new source ports
    (the kernel spreads them over the workers)."""
    query = dns.message.make_query(RELOADED, "A")
    for _ in range(tries):
        try:
            reply = await dns.asyncquery.udp(query, HOST, port=port, timeout=QUERY_TIMEOUT)
        except dns.exception.Timeout:
            return False
        found = {rr.address for rrset in reply.answer for rr in rrset}
        if found != {address}:
            return False
    return True


async def inject(
    kind: str,
    api: FakeApiServer,
    upstream: StubUpstream,
    server: ServerProcess,
    port: int,
    corefiles: Corefiles,
) -> None:
    """Cause one fault, and end it FAULT_SECONDS later."""
    if kind == "corefile-reload":
        await corefiles.update(server, port, broken=len(corefiles.updates) % 2 == 0)
    elif kind == "watch-drop":
        await asyncio.to_thread(api.restart)
    elif kind == "gone-410":
        api.compact()
    elif kind.startswith("upstream"):
        upstream.mode = upstream.tcp_mode = "silent" if kind == "upstream-dies" else "garbage"
        await asyncio.sleep(FAULT_SECONDS)
        upstream.mode, upstream.tcp_mode = "truncate", "answer"
    elif kind == "worker-kill":
        workers = children(server.proc.pid)
        if workers:
            os.kill(random.choice(workers), signal.SIGKILL)
    elif kind == "slowloris":
        held = []
        with contextlib.suppress(OSError):
            for _ in range(256):
                _, writer = await asyncio.open_connection(HOST, port)
                writer.write(b"\x00")  # the first byte of a length, and nothing more
                held.append(writer)
        await asyncio.sleep(FAULT_SECONDS)
        for writer in held:
            writer.close()


# ----------------------------------------------------------------------------- the process


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def usage(pid: int) -> tuple[float, int]:
    """RSS in MB and open files of a process and its children, summed."""
    rss, files = 0.0, 0
    for each in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{each}/status").read_text()
            rss += int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
            files += len(os.listdir(f"/proc/{each}/fd"))
    return rss, files


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per hour."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600 if var else 0.0


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/ready", timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def free_port() -> int:
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind((HOST, 0))
            port = int(udp.getsockname()[1])
            with contextlib.suppress(OSError), socket.socket() as tcp:
                tcp.bind((HOST, port))
                return port
    raise RuntimeError("no free port on loopback")


@contextlib.contextmanager
def stand(workdir: Path, rng: random.Random) -> Iterator[tuple[FakeApiServer, StubUpstream, Truth]]:
    """The stand-in API with the soak's cluster, and the fake upstream."""
    api = FakeApiServer()
    truth = Truth(api, rng)
    api.start()
    records = {(name, "A"): [f"{name}. 30 IN A {ip}"] for name, ip in FORWARDED.items()}
    records[(BIG_FORWARDED, "A")] = [
        f"{BIG_FORWARDED}. 30 IN A {a}" for a in BIG_FORWARDED_ADDRESSES
    ]
    upstream = StubUpstream(records, mode="truncate", tcp_mode="answer")
    upstream.start()
    try:
        yield api, upstream, truth
    finally:
        upstream.stop()
        api.stop()


def dnsperf(port: int, names: Path, seconds: float, qps: float | None) -> subprocess.Popen[str]:
    """dnsperf in the background, at most `qps` queries a second (None: as many as it can)."""
    rate = ["-Q", f"{qps:.0f}"] if qps else []
    argv = perf.command(port, names, seconds, ["-c", "8", "-q", "200", *rate])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def dnsperf_figures(process: subprocess.Popen[str], seconds: float) -> JSON:
    """What a dnsperf run reported: queries sent, completed and lost, and its QPS."""
    output = process.communicate(timeout=seconds + 60)[0]
    stats, _, _ = perf.read_output(output.splitlines())
    keys = {"sent": "Queries sent", "completed": "Queries completed", "lost": "Queries lost",
            "qps": "Queries per second"}  # fmt: skip
    return {key: float(stats[name].split()[0]) if name in stats else None
            for key, name in keys.items()}  # fmt: skip


def bulk_names(path: Path, rng: random.Random) -> Path:
    """dnsperf's input: the cluster's names in random case, and made-up ones."""
    lines = []
    for _ in range(5000):
        pick = rng.random()
        if pick < 0.4:
            name = f"c-{rng.randrange(CLUSTER_IPS)}.{NS}.svc.cluster.local"
        elif pick < 0.7:
            name = f"{rng.choice(['h', 't'])}-{rng.randrange(HEADLESS)}.{NS}.svc.cluster.local"
        else:
            name = f"x{rng.getrandbits(40):x}.{NS}.svc.cluster.local"
        lines.append(f"{random_case(name, rng)} A")
    path.write_text("\n".join(lines) + "\n")
    return path


async def soak(args: argparse.Namespace) -> JSON:
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-soak-"))
    with stand(workdir, rng) as (api, upstream, truth):
        port, http = free_port(), free_port()
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        corefiles = Corefiles(workdir / "coredns", port, kubeconfig)
        server = ServerProcess(toposdns_command(
            "serve", "--corefile", str(corefiles.configmap.path),
            "--kubeconfig", str(kubeconfig), "--listen", f"{HOST}:{port}",
            "--ready", f"{HOST}:{http}", "--workers", "2", "--upstream", f"{HOST}:{upstream.port}",
            "--ecs-trust", f"{FORWARDER}/32", "--log-format", "json",
        ))  # fmt: skip
        try:
            server.wait_until(lambda: ready(http), 60.0, 0.1)
            return await run(args, rng, api, upstream, truth, server, port, workdir, corefiles)
        finally:
            server.stop()
            if args.show_log:
                log("server log:\n" + server.tail(60))


async def run(
    args: argparse.Namespace,
    rng: random.Random,
    api: FakeApiServer,
    upstream: StubUpstream,
    truth: Truth,
    server: ServerProcess,
    port: int,
    workdir: Path,
    corefiles: Corefiles,
) -> JSON:
    result: JSON = {"duration": args.duration, "checked_qps": args.checked_qps}
    bulk: subprocess.Popen[str] | None = None
    if args.bulk:
        names = bulk_names(workdir / "names.txt", rng)
        most = dnsperf_figures(dnsperf(port, names, 5, None), 5)["qps"] or 0.0
        rate = max(most * args.load - args.checked_qps, 0)
        result["max_qps"], result["bulk_qps"] = most, rate
        log(f"max {most:.0f} QPS (dnsperf, 5 s); adding {rate:.0f} QPS unchecked")
        bulk = dnsperf(port, names, args.duration, rate) if rate else None
    context = multiprocessing.get_context("spawn")
    seen: Any = context.Queue()
    start = time.monotonic()
    until = start + args.duration
    checked = context.Process(
        target=asker, args=(port, args.checked_qps, until, args.seed, seen), daemon=True
    )
    checked.start()
    try:
        faults = Faults(start)
        judge = Judge(truth, faults)
        samples: list[tuple[float, float, int]] = []
        next_slice = next_locator = next_sample = start
        next_fault = start + args.fault_every
        fault_tasks: set[asyncio.Task[None]] = set()
        ended = False
        while not ended:
            now = time.monotonic()
            running = now < start + args.duration
            while running and next_slice <= now:
                truth.change_slice()
                next_slice += 1 / args.slice_changes
            while running and next_locator <= now:
                truth.change_locator()
                next_locator += 1 / args.locator_changes
            if next_sample <= now:
                rss, files = usage(server.proc.pid)
                samples.append((now - start, rss, files))
                next_sample += SAMPLE_EVERY
            if running and next_fault <= now:
                kind = Faults.KINDS[len(faults.done) % len(Faults.KINDS)]
                faults.done.append(Fault(kind, now, now + FAULT_SECONDS))
                log(f"{now - start:.0f}s: fault {kind}")
                task = asyncio.create_task(inject(kind, api, upstream, server, port, corefiles))
                fault_tasks.add(task)
                task.add_done_callback(fault_tasks.discard)
                next_fault += args.fault_every
            with contextlib.suppress(queue.Empty):
                while True:
                    batch = seen.get_nowait()
                    if batch is None:
                        ended = True
                        break
                    for each in batch:
                        judge.add(each)
            if not checked.is_alive() and not ended and seen.empty():
                raise RuntimeError(f"the checked load ended with status {checked.exitcode}")
            await asyncio.sleep(0.005)
    finally:
        # On an error or a signal: nothing the soak started outlives it.
        if checked.is_alive():
            checked.terminate()
        if bulk is not None and not ended and bulk.poll() is None:
            bulk.kill()
    checked.join(10)
    await asyncio.gather(*fault_tasks, return_exceptions=True)
    if bulk is not None:
        result["bulk"] = dnsperf_figures(bulk, 0)
    result.update(report(judge, faults, samples, start, args.slope_window))
    result["corefile_updates"] = corefiles.summary()
    result["reload_failed"] = corefiles.failed()
    return result


def report(
    judge: Judge,
    faults: Faults,
    samples: list[tuple[float, float, int]],
    start: float,
    slope_window: float,
) -> JSON:
    """Per minute, and the slopes over the last `slope_window` seconds of samples."""
    minutes: list[JSON] = []
    last = max((sent for sent, _, _ in judge.seen), default=start)
    for minute in range(int((last - start) // 60) + 1):
        seen = [s for s in judge.seen if int((s[0] - start) // 60) == minute]
        latencies = sorted(latency for _, latency, _ in seen if latency is not None)
        calm = sorted(
            latency for sent, latency, _ in seen
            if latency is not None and not faults.windows(sent)
        )  # fmt: skip
        lost = [sent for sent, latency, _ in seen if latency is None]
        in_faults = sum(bool(faults.windows(sent)) for sent in lost)
        sampled = [s for s in samples if int(s[0] // 60) == minute]
        minutes.append({
            "minute": minute + 1,
            "queries": len(seen),
            "wrong": sum(wrong for _, _, wrong in seen),
            "unanswered": len(lost) - in_faults,
            "unanswered_in_faults": in_faults,
            "p99_ms": round(percentile(latencies, 99) * 1000, 2) if latencies else None,
            "p99_ms_outside_faults": round(percentile(calm, 99) * 1000, 2) if calm else None,
            "rss_mb": round(sampled[-1][1], 1) if sampled else None,
            "files": sampled[-1][2] if sampled else None,
            "faults": [f.kind for f in faults.done if int((f.start - start) // 60) == minute],
        })  # fmt: skip
    recent = [s for s in samples if s[0] >= samples[-1][0] - slope_window] if samples else []
    by_fault: dict[str, int] = {}
    for sent, latency, _ in judge.seen:
        for fault in faults.windows(sent) if latency is None else ():
            by_fault[fault.kind] = by_fault.get(fault.kind, 0) + 1
    return {
        "unanswered_by_fault": by_fault,
        "minutes": minutes,
        "queries": len(judge.seen),
        "wrong": sum(m["wrong"] for m in minutes),
        "unanswered": sum(m["unanswered"] for m in minutes),
        "unanswered_in_faults": sum(m["unanswered_in_faults"] for m in minutes),
        "faults": [f.kind for f in faults.done],
        "rss_slope_mb_per_hour": round(slope([(t, rss) for t, rss, _ in recent]), 2),
        "files_slope_per_hour": round(slope([(t, float(n)) for t, _, n in recent]), 2),
        "slope_window_s": round(recent[-1][0] - recent[0][0]) if recent else 0,
        "examples": judge.examples,
    }


def table(result: JSON) -> str:
    """The figures as bench/README.md shows them."""
    lines = [
        "| minute | checked queries | wrong | unanswered outside faults | unanswered in faults "
        "| p99 ms | p99 ms outside faults | RSS MB | open files | fault |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in result["minutes"]:
        lines.append(
            f"| {m['minute']} | {m['queries']} | {m['wrong']} | {m['unanswered']} "
            f"| {m['unanswered_in_faults']} | {m['p99_ms']} | {m['p99_ms_outside_faults']} "
            f"| {m['rss_mb']} | {m['files']} | {', '.join(m['faults'])} |"
        )
    lost = ", ".join(f"{kind} {n}" for kind, n in result["unanswered_by_fault"].items())
    lines.append(
        f"\n{result['queries']} checked queries: {result['wrong']} wrong, {result['unanswered']} "
        f"unanswered outside fault windows, {result['unanswered_in_faults']} inside them "
        f"({lost or 'none'}). Over the last {result['slope_window_s']} s: RSS "
        f"{result['rss_slope_mb_per_hour']:+.2f} MB/hour, open files "
        f"{result['files_slope_per_hour']:+.2f}/hour."
    )
    updates = result["corefile_updates"]
    lines.append(
        f"Corefile updates: {updates['applied']} of {updates['updates']} answered by every "
        f"worker within {RELOAD_WITHIN:g} s (slowest {updates['slowest_s']} s); "
        f"{updates['broken_refused']} of {updates['broken']} broken ones refused."
    )
    if "max_qps" in result:
        bulk = result.get("bulk", {})
        lines.append(
            f"Max {result['max_qps']:.0f} QPS (dnsperf, 5 s); unchecked load asked at "
            f"{result['bulk_qps']:.0f} QPS, sent at {bulk.get('qps')}: {bulk.get('completed')} "
            f"of {bulk.get('sent')} answered, {bulk.get('lost')} lost."
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds (default 1800)")
    parser.add_argument("--checked-qps", type=float, default=300.0)
    parser.add_argument("--bulk", action="store_true", help="add dnsperf's unchecked load")
    parser.add_argument("--load", type=float, default=0.5, help="of the max QPS, with --bulk")
    parser.add_argument("--slice-changes", type=float, default=10.0, help="per second")
    parser.add_argument("--locator-changes", type=float, default=5.0, help="per second")
    parser.add_argument("--fault-every", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--slope-window", type=float, default=1200.0, help="seconds the slopes are fitted over"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--show-log", action="store_true", help="print the server's log tail")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A SIGTERM (a timeout, a CI cancel) unwinds as an exit: the server and dnsperf are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = asyncio.run(soak(args))
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    for example in result["examples"]:
        log(example)
    return 0 if result["wrong"] == 0 and not result["reload_failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
