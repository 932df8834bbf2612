"""Measure toposdns serving a large cluster from the (stand-in) Kubernetes API.

Three numbers:

1. time to ready: from starting `python -m toposdns serve --kubeconfig ...` to the first 200 from
   /ready, with ~100,000 PodLocators, 10,000 Services and 10,000 EndpointSlices in the API;
2. peak memory of that process after the sync (VmHWM / VmRSS), next to CoreDNS's formula;
3. event-to-answer delay: how long after a Service's cluster IP (or a headless Service's
   EndpointSlice) changes in the API a UDP query sees the new address.

The API is tests/kubeapi.py's FakeApiServer, in a thread of this process. Its own cost of
serving the lists (plain paged LISTs from threads, nothing decoded but the continue token) is
measured first and reported separately, so it can be subtracted.

Run from the repository root:  python bench/live.py  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import ipaddress
import json
import math
import os
import random
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.process import ToposdnsProcess, free_port  # noqa: E402
from tests.kubeapi import FakeApiServer  # noqa: E402

HOST = "127.0.0.1"
ZONE = "cluster.local"
REGION = "region-1"
ZONES = ("zone-a", "zone-b", "zone-c")
LOCATOR_NAMESPACE = "toposdns"
READY_TIMEOUT = 120.0
EVENT_TIMEOUT = 2.0
EVENT_POLL = 0.001
PAGE = 500
SERVING_LINE = re.compile(r"serving DNS on \S+:\d+")
LISTED_LINE = re.compile(r"(\w+): listed (\d+) objects")

JSON = dict[str, Any]


def log(msg: str) -> None:
    print(f"[live] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- the cluster


@dataclass
class Cluster:
    """The objects, by API resource, plus what the event phase needs to find again."""

    namespaces: list[JSON] = field(default_factory=list)
    services: list[JSON] = field(default_factory=list)
    slices: list[JSON] = field(default_factory=list)
    locators: list[JSON] = field(default_factory=list)
    endpoint_pods: int = 0
    pod_locators: int = 0
    node_locators: int = 0

    def by_resource(self) -> dict[str, list[JSON]]:
        return {
            "namespaces": self.namespaces,
            "services": self.services,
            "endpointslices": self.slices,
            "podlocators": self.locators,
        }


def _uid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


def generate(
    n_locators: int,
    n_services: int,
    n_slices: int,
    n_nodes: int,
    n_namespaces: int,
    seed: int,
) -> Cluster:
    """A deterministic cluster.

    Services round-robin over the namespaces, every second one headless, port http/80->8080.
    EndpointSlice i belongs to service i % services and has 3-10 ready endpoints, each a pod on
    a random node (nodeName and zone set). Pod locators: one per endpoint pod, then more pods
    (not behind any service) up to `n_locators`; each carries its node's three labels. Plus one
    node locator per node (label toposdns.io/locator: node) in namespace `toposdns`.
    """
    rng = random.Random(seed)
    cluster = Cluster()
    namespaces = [f"ns-{i:02d}" for i in range(n_namespaces)]
    for ns in [*namespaces, LOCATOR_NAMESPACE, "kube-system", "default"]:
        cluster.namespaces.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }
        )
    nodes = []
    node_net = int(ipaddress.IPv4Address("172.16.0.10"))
    for i in range(n_nodes):
        name = f"node-{i:05d}"
        labels = {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": ZONES[i % len(ZONES)],
            "topology.kubernetes.io/region": REGION,
        }
        nodes.append((name, labels, str(ipaddress.IPv4Address(node_net + i))))
    pod_ip = int(ipaddress.IPv4Address("10.128.0.1"))
    cluster_ip = int(ipaddress.IPv4Address("10.96.0.10"))

    def pod_locator(name: str, ns: str, ip: str, node: tuple[str, dict[str, str], str]) -> JSON:
        return {
            "apiVersion": "toposdns.io/v1alpha1",
            "kind": "PodLocator",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": {"toposdns.io/locator": "pod"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": _uid(rng)}
                ],
            },
            "addresses": [ip],
            "nodeName": node[0],
            "nodeLabels": dict(node[1]),
        }

    service_names: list[tuple[str, str, bool]] = []
    for i in range(n_services):
        ns = namespaces[i % n_namespaces]
        name = f"svc-{i:05d}"
        headless = i % 2 == 1
        ip = "None" if headless else str(ipaddress.IPv4Address(cluster_ip + i))
        service_names.append((ns, name, headless))
        cluster.services.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": name,
                    "namespace": ns,
                    "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": ns},
                },
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": ip,
                    "clusterIPs": [ip],
                    "ipFamilies": ["IPv4"],
                    "ipFamilyPolicy": "SingleStack",
                    "internalTrafficPolicy": "Cluster",
                    "sessionAffinity": "None",
                    "selector": {"app.kubernetes.io/name": name},
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}],
                },
                "status": {"loadBalancer": {}},
            }
        )
    pods = 0
    for i in range(n_slices):
        ns, svc, _ = service_names[i % n_services]
        endpoints = []
        for _ in range(rng.randint(3, 10)):
            node = nodes[rng.randrange(n_nodes)]
            pod = f"{svc}-{_suffix(rng, 10)}-{_suffix(rng)}"
            ip = str(ipaddress.IPv4Address(pod_ip + pods))
            pods += 1
            endpoints.append(
                {
                    "addresses": [ip],
                    "conditions": {"ready": True, "serving": True, "terminating": False},
                    "nodeName": node[0],
                    "zone": node[1]["topology.kubernetes.io/zone"],
                    "targetRef": {"kind": "Pod", "namespace": ns, "name": pod, "uid": _uid(rng)},
                }
            )
            if len(cluster.locators) < n_locators:
                cluster.locators.append(pod_locator(pod, ns, ip, node))
        cluster.slices.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{svc}-{_suffix(rng)}",
                    "generateName": f"{svc}-",
                    "namespace": ns,
                    "labels": {
                        "kubernetes.io/service-name": svc,
                        "endpointslice.kubernetes.io/managed-by": (
                            "endpointslice-controller.k8s.io"
                        ),
                        "app.kubernetes.io/name": svc,
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "v1",
                            "kind": "Service",
                            "name": svc,
                            "uid": _uid(rng),
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            }
        )
    cluster.endpoint_pods = pods
    while len(cluster.locators) < n_locators:
        node = nodes[rng.randrange(n_nodes)]
        ns = namespaces[rng.randrange(n_namespaces)]
        ip = str(ipaddress.IPv4Address(pod_ip + pods))
        pods += 1
        cluster.locators.append(pod_locator(f"job-{pods:06d}-{_suffix(rng)}", ns, ip, node))
    cluster.pod_locators = len(cluster.locators)
    for name, labels, ip in nodes:
        cluster.locators.append(
            {
                "apiVersion": "toposdns.io/v1alpha1",
                "kind": "PodLocator",
                "metadata": {
                    "name": name,
                    "namespace": LOCATOR_NAMESPACE,
                    "labels": {"toposdns.io/locator": "node"},
                },
                "addresses": [ip],
                "nodeName": name,
                "nodeLabels": dict(labels),
            }
        )
    cluster.node_locators = n_nodes
    return cluster


# --------------------------------------------------------------------------- the stand-in alone

LIST_PATHS = {
    "namespaces": "/api/v1/namespaces",
    "services": "/api/v1/services",
    "endpointslices": "/apis/discovery.k8s.io/v1/endpointslices",
    "podlocators": "/apis/toposdns.io/v1alpha1/podlocators",
}
CONTINUE = re.compile(rb'"continue":"([^"]*)"')


@dataclass
class ListTiming:
    resource: str
    pages: int = 0
    bytes: int = 0
    seconds: float = 0.0


def plain_list(url: str, token: str, resource_name: str, page: int = PAGE) -> ListTiming:
    """LIST one resource in pages with urllib; only the continue token is looked at."""
    timing = ListTiming(resource_name)
    cont = ""
    start = time.perf_counter()
    for _ in range(100_000):  # bounded: far more pages than any size here needs
        query = f"?limit={page}" + (f"&continue={cont}" if cont else "")
        request = urllib.request.Request(
            url + LIST_PATHS[resource_name] + query, headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            body = response.read()
        timing.pages += 1
        timing.bytes += len(body)
        # The list metadata comes before the items; the token is base64url, no escapes.
        found = CONTINUE.search(body, 0, 2048)
        if found is None:
            break
        cont = found.group(1).decode()
    timing.seconds = time.perf_counter() - start
    return timing


@dataclass
class StandIn:
    """What the stand-in costs on its own. It encodes each stored object once, at its first
    LIST ("cold"); toposdns then lists the same objects, so the "warm" numbers are its share."""

    cold_seconds: float = 0.0  # all four LISTs at once, one thread each (as toposdns), first
    warm_seconds: float = 0.0  # the same again: what toposdns's lists cost the stand-in
    warm: list[ListTiming] = field(default_factory=list)  # warm, one resource at a time
    mbytes: float = 0.0
    load_seconds: float = 0.0  # adding the objects (setup, not part of any timing)


def list_all(server: FakeApiServer) -> tuple[float, list[ListTiming]]:
    """All four resources listed at once, one thread each; wall seconds and each list."""
    timings: list[ListTiming] = []
    threads = [
        threading.Thread(
            target=lambda n=name: timings.append(plain_list(server.url, server.token, n)),
            daemon=True,
        )
        for name in LIST_PATHS
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return time.perf_counter() - start, timings


def measure_standin(server: FakeApiServer) -> StandIn:
    result = StandIn()
    result.cold_seconds, timings = list_all(server)
    result.mbytes = sum(t.bytes for t in timings) / 1e6
    result.warm_seconds, _ = list_all(server)
    result.warm = [plain_list(server.url, server.token, name) for name in LIST_PATHS]
    return result


# --------------------------------------------------------------------------- toposdns process


def free_ports() -> tuple[int, int]:
    """A port free for both UDP and TCP, and another for HTTP."""
    for _ in range(50):
        port = free_port(socket.SOCK_DGRAM)
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind((HOST, port))
            http = free_port()
            if http != port:
                return port, http
    raise RuntimeError("no free ports on loopback")


def start_toposdns(
    kubeconfig: Path, dns_port: int, http_port: int, extra: Sequence[str]
) -> ToposdnsProcess:
    """`toposdns serve` against the stand-in."""
    args = ["serve", "--kubeconfig", str(kubeconfig), "--listen", f"{HOST}:{dns_port}",
            "--http", f"{HOST}:{http_port}", *extra]  # fmt: skip
    return ToposdnsProcess(args, http_port)


# --------------------------------------------------------------------------- DNS over UDP


def encode_query(name: str, qid: int) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\x00" + b"\x00\x01\x00\x01"


def _skip_name(msg: bytes, pos: int) -> int:
    for _ in range(128):
        length = msg[pos]
        if length & 0xC0 == 0xC0:
            return pos + 2
        if length == 0:
            return pos + 1
        pos += 1 + length
    raise ValueError("name too long")


def a_records(msg: bytes, qid: int) -> set[str] | None:
    """The A addresses in a reply with this ID (None if it is not one)."""
    if len(msg) < 12:
        return None
    rid, _flags, qd, an = struct.unpack("!HHHH", msg[:8])
    if rid != qid:
        return None
    pos = 12
    for _ in range(qd):
        pos = _skip_name(msg, pos) + 4
    found: set[str] = set()
    for _ in range(an):
        pos = _skip_name(msg, pos)
        rtype, _cls, _ttl, rdlen = struct.unpack("!HHIH", msg[pos : pos + 10])
        pos += 10
        if rtype == 1 and rdlen == 4:
            found.add(socket.inet_ntoa(msg[pos : pos + 4]))
        pos += rdlen
    return found


class Asker:
    """One UDP socket asking toposdns for A records."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.connect((HOST, port))
        self.qid = random.randrange(65536)

    def close(self) -> None:
        self.sock.close()

    def ask(self, name: str, timeout: float = 0.2) -> set[str] | None:
        self.qid = (self.qid + 1) & 0xFFFF
        self.sock.setblocking(False)
        with contextlib.suppress(BlockingIOError, InterruptedError):
            for _ in range(1000):  # drop late replies to earlier queries
                self.sock.recv(4096)
        self.sock.send(encode_query(name, self.qid))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                reply = self.sock.recv(4096)
            except TimeoutError:
                return None
            found = a_records(reply, self.qid)
            if found is not None:
                return found
        return None

    def wait_for(self, name: str, want: Callable[[set[str]], bool], timeout: float) -> float | None:
        """Ask every EVENT_POLL seconds until `want(answer)`; seconds it took, or None."""
        start = time.perf_counter()
        deadline = start + timeout
        while (now := time.perf_counter()) < deadline:
            found = self.ask(name, min(0.2, deadline - now))
            if found is not None and want(found):
                return time.perf_counter() - start
            pause = EVENT_POLL - (time.perf_counter() - now)
            if pause > 0:
                time.sleep(pause)
        return None


# --------------------------------------------------------------------------- events


@dataclass
class Delays:
    kind: str
    samples_ms: list[float] = field(default_factory=list)
    missed: int = 0

    def summary(self) -> JSON:
        s = sorted(self.samples_ms)
        return {
            "kind": self.kind,
            "events": len(s) + self.missed,
            "missed": self.missed,
            "p50_ms": percentile(s, 50),
            "p99_ms": percentile(s, 99),
            "max_ms": s[-1] if s else math.nan,
        }


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    if not sorted_vals:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_vals)))
    return sorted_vals[rank - 1]


def equals(want: set[str]) -> Callable[[set[str]], bool]:
    return lambda got: got == want


def holds(address: str) -> Callable[[set[str]], bool]:
    return lambda got: address in got


def fqdn(obj: JSON) -> str:
    return f"{obj['metadata']['name']}.{obj['metadata']['namespace']}.svc.{ZONE}."


def service_events(
    server: FakeApiServer, asker: Asker, cluster: Cluster, count: int, budget: float, seed: int
) -> Delays:
    """Give `count` ClusterIP services a new cluster IP each; time until DNS answers it."""
    rng = random.Random(seed)
    delays = Delays("Service clusterIP")
    candidates = [s for s in cluster.services if s["spec"]["clusterIP"] != "None"]
    chosen = rng.sample(candidates, min(count, len(candidates)))
    fresh = int(ipaddress.IPv4Address("10.104.0.1"))
    end = time.monotonic() + budget
    for i, svc in enumerate(chosen):
        if time.monotonic() > end:
            break
        name = fqdn(svc)
        old = svc["spec"]["clusterIP"]
        if asker.wait_for(name, equals({old}), EVENT_TIMEOUT) is None:
            delays.missed += 1  # not even the old address: skip, count it
            continue
        new = str(ipaddress.IPv4Address(fresh + i))
        svc["spec"]["clusterIP"] = new
        svc["spec"]["clusterIPs"] = [new]
        time_change(server, asker, svc, name, new, delays)
    return delays


def time_change(
    server: FakeApiServer, asker: Asker, obj: JSON, name: str, new: str, delays: Delays
) -> None:
    """Write `obj` to the stand-in; record how long until `name` answers with `new`."""
    start = time.perf_counter()
    server.modify(obj)
    if asker.wait_for(name, holds(new), EVENT_TIMEOUT) is None:
        delays.missed += 1
    else:
        delays.samples_ms.append((time.perf_counter() - start) * 1000)
    time.sleep(0.005)


def slice_events(
    server: FakeApiServer, asker: Asker, cluster: Cluster, count: int, budget: float, seed: int
) -> Delays:
    """Replace one endpoint's address in `count` headless services' slices; time until the
    headless name's A answer holds the new address."""
    rng = random.Random(seed + 1)
    delays = Delays("EndpointSlice (headless)")
    headless = {
        (s["metadata"]["namespace"], s["metadata"]["name"])
        for s in cluster.services
        if s["spec"]["clusterIP"] == "None"
    }
    candidates = [
        eps
        for eps in cluster.slices
        if (eps["metadata"]["namespace"], eps["metadata"]["labels"]["kubernetes.io/service-name"])
        in headless
    ]
    chosen = rng.sample(candidates, min(count, len(candidates)))
    fresh = int(ipaddress.IPv4Address("10.127.0.1"))
    end = time.monotonic() + budget
    for i, eps in enumerate(chosen):
        if time.monotonic() > end:
            break
        ns = eps["metadata"]["namespace"]
        name = f"{eps['metadata']['labels']['kubernetes.io/service-name']}.{ns}.svc.{ZONE}."
        before = {ep["addresses"][0] for ep in eps["endpoints"]}
        if asker.wait_for(name, equals(before), EVENT_TIMEOUT) is None:
            delays.missed += 1
            continue
        new = str(ipaddress.IPv4Address(fresh + i))
        eps["endpoints"][rng.randrange(len(eps["endpoints"]))]["addresses"] = [new]
        time_change(server, asker, eps, name, new, delays)
    return delays


# --------------------------------------------------------------------------- profiling


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def profile_child(kubeconfig: Path, mode: str, out: Path) -> None:
    """In this process: the real client and KubeSource, synced once against the stand-in.

    mode "plain": wall time and RSS at each step; "cpu": the same under cProfile (stats to
    `out`); "memory": tracemalloc from after the imports to the sync (top lines to `out`).
    """
    import asyncio
    import cProfile
    import gc
    import pstats
    import tracemalloc

    rss0 = rss_mb()
    from toposdns.kube.client import apis_of, connect
    from toposdns.source.kube import KubeSource
    from toposdns.store.snapshot import Snapshot

    report: list[str] = [f"RSS bare interpreter {rss0:.0f} MB, after imports {rss_mb():.0f} MB"]
    collections: dict[int, list[float]] = {0: [], 1: [], 2: []}  # generation -> seconds each
    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            collections[info["generation"]].append(time.perf_counter() - started[0])

    holder: list[Snapshot] = []

    async def sync() -> None:
        ready = asyncio.Event()

        def publish(snapshot: Snapshot) -> None:
            holder[:] = [snapshot]  # the server keeps only the latest
            if snapshot.synced:
                ready.set()

        api_client = await connect(kubeconfig)
        report.append(f"RSS after connect {rss_mb():.0f} MB")
        try:
            source = KubeSource(apis_of(api_client), publish, on_page=gc.freeze)  # as `serve`
            start = time.perf_counter()
            if mode == "plain":
                gc.callbacks.append(on_gc)
            task = asyncio.create_task(source.run())
            try:
                async with asyncio.timeout(READY_TIMEOUT):
                    await ready.wait()
                report.append(f"sync took {time.perf_counter() - start:.2f} s ({mode})")
                if mode == "plain":
                    gc.callbacks.remove(on_gc)
                    report.append(
                        "garbage collections during the sync: "
                        + ", ".join(
                            f"gen{g} {len(t)}x {sum(t):.2f} s (max {max(t, default=0):.3f} s)"
                            for g, t in collections.items()
                        )
                    )
                report.append(f"RSS after sync {rss_mb():.0f} MB")
                gc.collect()
                report.append(f"RSS after sync and gc.collect() {rss_mb():.0f} MB")
                if mode == "memory":
                    snap = tracemalloc.take_snapshot()
                    current, peak = tracemalloc.get_traced_memory()
                    report.append(
                        f"tracemalloc since imports: {current / 2**20:.0f} MB live, "
                        f"{peak / 2**20:.0f} MB peak"
                    )
                    lines = ["top allocation sites still alive after the sync:"]
                    for stat in snap.statistics("lineno")[:20]:
                        frame = stat.traceback[0]
                        lines.append(
                            f"{stat.size / 2**20:8.1f} MB {stat.count:>9,} blocks  "
                            f"{frame.filename.removeprefix(str(REPO_ROOT) + '/')}:{frame.lineno}"
                        )
                    out.write_text("\n".join(lines) + "\n")
                    report.extend(lines)
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        finally:
            await api_client.close()

    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    profiler = cProfile.Profile() if mode == "cpu" else None
    if mode == "memory":
        tracemalloc.start(1)
    if profiler is not None:
        profiler.enable()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(sync())
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(out)
        for key in ("tottime", "cumulative"):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(25)
            report.append(f"--- top 25 by {key} ---")
            report.append(text.getvalue().split("\n\n", 2)[-1].replace(str(REPO_ROOT) + "/", ""))
    print("\n".join(report), flush=True)


def profile(args: argparse.Namespace) -> int:
    """Load the stand-in, then sync a KubeSource against it in a child process, three ways."""
    cluster = generate(
        args.locators, args.services, args.slices, args.nodes, args.namespaces, args.seed
    )
    outdir = Path(args.profile)
    outdir.mkdir(parents=True, exist_ok=True)
    server = FakeApiServer()
    try:
        for objs in cluster.by_resource().values():
            for obj in objs:
                server.add(obj)
        server.compact()
        server.start()
        list_all(server)  # warm the stand-in, as in the measured run
        kubeconfig = server.write_kubeconfig(outdir / "kubeconfig")
        for mode, name in (("plain", "plain.txt"), ("cpu", "sync.prof"), ("memory", "memory.txt")):
            log(f"profiling the sync: {mode}")
            child = subprocess.run(
                [sys.executable, __file__, "--profile-child", mode, str(kubeconfig),
                 str(outdir / name)],
                cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=600,
            )  # fmt: skip
            print(f"===== {mode} =====\n{child.stdout}{child.stderr[-3000:]}", flush=True)
    finally:
        server.stop()
    return 0


# --------------------------------------------------------------------------- main


def coredns_mb(pods: int, services: int) -> float:
    """coredns/deployment kubernetes/Scaling_CoreDNS.md, default settings (best linear fit)."""
    return (pods + services) * 0.000858 + 49.1


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def run(args: argparse.Namespace) -> JSON:
    result: JSON = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": sys.version.split()[0],
    }
    log("generating objects")
    cluster = generate(
        args.locators, args.services, args.slices, args.nodes, args.namespaces, args.seed
    )
    counts = {k: len(v) for k, v in cluster.by_resource().items()}
    result["objects"] = {
        **counts,
        "pod_locators": cluster.pod_locators,
        "node_locators": cluster.node_locators,
        "endpoint_pods": cluster.endpoint_pods,
    }
    log(f"objects: {counts}, {cluster.endpoint_pods} endpoint pods")
    server = FakeApiServer()
    proc: ToposdnsProcess | None = None
    asker: Asker | None = None
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-live-"))
    try:
        start = time.perf_counter()
        for objs in cluster.by_resource().values():
            for obj in objs:
                server.add(obj)
        server.compact()  # drop the load's history (etcd compacts too): nothing watches it
        load_seconds = time.perf_counter() - start
        server.start()
        log(f"stand-in loaded in {load_seconds:.1f} s; listing through it alone")
        standin = measure_standin(server)
        standin.load_seconds = load_seconds
        result["standin"] = asdict(standin)
        log(
            f"stand-in alone: all lists at once {standin.cold_seconds:.2f} s cold, "
            f"{standin.warm_seconds:.2f} s warm"
        )
        server.compact()  # a fresh resourceVersion, so toposdns lists nothing cached
        server.requests.clear()

        kubeconfig = server.write_kubeconfig(workdir / "kubeconfig")
        dns_port, http_port = free_ports()
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        log("starting toposdns")
        proc = start_toposdns(kubeconfig, dns_port, http_port, args.toposdns_arg)
        ready = proc.wait_ready(READY_TIMEOUT)
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
        serving = proc.find(SERVING_LINE)
        listed = {}
        for at, line in list(proc.lines):
            found = LISTED_LINE.search(line)
            if found:
                listed[found.group(1)] = {"seconds": round(at, 3), "objects": int(found[2])}
        hwm, rss = proc.memory()
        result["toposdns"] = {
            "ready_s": ready,
            "serving_dns_s": serving[0] if serving else None,
            "listed": listed,
            "cpu_s_to_ready": proc.cpu_seconds(),
            "bench_process_cpu_s_to_ready": (cpu_after.ru_utime + cpu_after.ru_stime)
            - (cpu_before.ru_utime + cpu_before.ru_stime),
            "vmhwm_mb": hwm,
            "vmrss_mb": rss,
        }
        log(f"ready after {ready:.2f} s; VmHWM {hwm:.0f} MB, VmRSS {rss:.0f} MB")
        services = len(cluster.services)
        result["coredns_formula_mb"] = {
            "endpoint_pods": coredns_mb(cluster.endpoint_pods, services),
            "pod_locators": coredns_mb(cluster.pod_locators, services),
        }

        asker = Asker(dns_port)
        time.sleep(0.2)
        log(f"{args.events} Service events")
        events = [service_events(server, asker, cluster, args.events, args.event_budget, args.seed)]
        log(f"{args.events} EndpointSlice events")
        events.append(
            slice_events(server, asker, cluster, args.events, args.event_budget, args.seed)
        )
        result["events"] = [d.summary() for d in events]
        hwm2, rss2 = proc.memory()
        result["toposdns"]["vmhwm_after_events_mb"] = hwm2
        result["toposdns"]["vmrss_after_events_mb"] = rss2
        return result
    finally:
        if asker is not None:
            asker.close()
        if proc is not None:
            proc.stop()
            if args.show_log:
                log("toposdns log:\n" + proc.tail(40))
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def table(r: JSON) -> str:
    o, s, t, c = r["objects"], r["standin"], r["toposdns"], r["coredns_formula_mb"]
    rows = [
        ("date / machine", f"{r['date']}, nproc {r['nproc']}, {r['cpu']}, Python {r['python']}"),
        (
            "objects",
            f"{o['podlocators']:,} PodLocators ({o['pod_locators']:,} pod + "
            f"{o['node_locators']:,} node), {o['services']:,} Services, "
            f"{o['endpointslices']:,} EndpointSlices ({o['endpoint_pods']:,} endpoints), "
            f"{o['namespaces']} Namespaces",
        ),
        (
            "stand-in alone: LIST all",
            f"{s['warm_seconds']:.2f} s (4 at once, warm: toposdns's share; "
            f"{s['cold_seconds']:.2f} s cold), {s['mbytes']:.0f} MB JSON",
        ),
        (
            "  one at a time, warm",
            ", ".join(f"{x['resource']} {x['seconds']:.2f} s" for x in s["warm"]),
        ),
        ("time to 'serving DNS on'", f"{t['serving_dns_s']:.2f} s"),
        ("time to /ready 200", f"{t['ready_s']:.2f} s"),
        (
            "  'listed' log lines at",
            ", ".join(f"{k} {v['seconds']:.2f} s" for k, v in t["listed"].items()),
        ),
        (
            "  CPU until ready",
            f"toposdns {t['cpu_s_to_ready']:.1f} s, bench process (stand-in) "
            f"{t['bench_process_cpu_s_to_ready']:.1f} s",
        ),
        (
            "memory after sync",
            f"VmHWM {t['vmhwm_mb']:.0f} MB, VmRSS {t['vmrss_mb']:.0f} MB "
            f"(after events: {t['vmhwm_after_events_mb']:.0f} / {t['vmrss_after_events_mb']:.0f})",
        ),
        (
            "CoreDNS formula",
            f"{c['endpoint_pods']:.0f} MB with pods = endpoint pods "
            f"({o['endpoint_pods']:,}); {c['pod_locators']:.0f} MB with pods = pod locators",
        ),
    ]
    for e in r["events"]:
        rows.append(
            (
                f"event->answer {e['kind']}",
                f"p50 {e['p50_ms']:.1f} ms, p99 {e['p99_ms']:.1f} ms, max {e['max_ms']:.1f} ms "
                f"({e['events']} events, {e['missed']} missed)",
            )
        )
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--locators", type=int, default=100_000, help="pod locators (one per pod)")
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--slices", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=5_000, help="nodes (one node locator each)")
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument("--events", type=int, default=200, help="events of each kind")
    p.add_argument(
        "--event-budget", type=float, default=120.0, help="seconds at most per kind of event"
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print toposdns's log at the end")
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="instead of measuring: profile the sync in-process (cProfile, tracemalloc)",
    )
    p.add_argument("--profile-child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument(
        "--toposdns-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `toposdns serve` (repeatable)",
    )
    args = p.parse_args(argv)
    if min(args.services, args.slices, args.nodes, args.namespaces) < 1 or args.locators < 0:
        p.error("sizes must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile_child:
        mode, kubeconfig, out = args.profile_child
        profile_child(Path(kubeconfig), mode, Path(out))
        return 0
    if args.profile:
        return profile(args)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
