"""Memory of one toposdns process through API server restarts that make it relist everything.

Kubernetes' own 5,000-node test restarts the API server; every DNS pod's watches then resume
from a compacted history, get `410 Gone`, and list everything again. This bench does that to
`toposdns serve --workers 1` (one process, as under a Corefile) against the test suite's
stand-in API server (`FakeApiServer`, in a thread of this process), at that test's size by
default: 5,000 nodes, 150,000 pods addressed from their node's /24, 10,000 Services (every
second one headless, with a zone topology policy) in 10,000 EndpointSlices of 10-20 ready
endpoints (~150,000). With `--placement cidrs` (the default) the pods are placed by their node
locator's CIDR; with `--placement pods`, by one PodLocator each (155,000 locators).

Throughout, a thread asks for Services (a bounded loop), each through EDNS Client Subnet for a
random pod's address (`--ecs-trust` names the asking address), and checks every answer: a
ClusterIP Service's address; a headless Service's endpoints in the pod's zone, or all of them
when none is there. A wrong answer (or a missing one) is counted and the first few are shown.
Another thread samples RSS (`VmRSS`) and PSS (`Pss:` of smaps_rollup) every 100 ms.

Phases: ready, then settle; `--fill-caches N` asks N distinct names in the cluster's zone (each
twice, so template replies are kept) to fill the reply cache, and N names outside it, which
toposdns forwards to a stub upstream in this process (each answered with an A record for an
hour), to fill the forward cache; `--memory-limit MIB` bounds both caches as toposdns bounds
them by default in a container with that memory limit (serve/cache.py `default_max_bytes`:
an eighth and a sixteenth of it); `steady` is the mean over `--window` seconds; then
each of `--restarts` API restarts (a compaction, then every connection closed: every watch's
resume gets 410) until every resource watches again (`relist`), and `--after` seconds more.
Reported per restart: the peak from the restart to the end of `after`, and the mean over the
last `--window` seconds of `after`.

Run from the repository root:  python -m bench.relist  (see bench/README.md, "Relist").
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dns.edns
import dns.exception
import dns.message
import dns.rdatatype

from bench.harness import HOST, ServerProcess, log, machine, stub_upstream
from bench.live_cluster import ZONES, Cluster, Sizes, fqdn, generate, load
from bench.live_server import Live, live, wait_ready
from toposdns.serve.cache import DEFAULT_MAX_BYTES, MEMORY_SHARE, default_max_bytes
from toposdns.serve.forward_cache import FORWARD_MAX_BYTES, FORWARD_SHARE

JSON = dict[str, Any]
READY_TIMEOUT = 600.0
RELIST_TIMEOUT = 600.0
#: The resources toposdns watches: relisted when this many watches are open again.
WATCHED = 4
TOPOLOGY = {"toposdns.io/topology-keys": "topology.kubernetes.io/zone,*"}
#: How many queries the fill sends before reading their replies.
WINDOW = 200


@dataclass
class Truth:
    """What each Service's answer must be, and the clients to ask from."""

    #: Service FQDN -> ClusterIP, or None for a headless one.
    cluster_ip: dict[str, str | None] = field(default_factory=dict)
    #: Headless Service FQDN -> zone -> its endpoints there.
    by_zone: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    #: (address, zone) of pods whose address a locator places.
    clients: list[tuple[str, str]] = field(default_factory=list)

    def expected(self, name: str, zone: str) -> set[str]:
        ip = self.cluster_ip[name]
        if ip is not None:
            return {ip}
        zones = self.by_zone.get(name, {})
        return zones.get(zone) or set().union(*zones.values())


def truth_of(cluster: Cluster, placement: str) -> Truth:
    """The answers `cluster` must give, per Service and client zone."""
    truth = Truth()
    for svc in cluster.services:
        ip = svc["spec"]["clusterIP"]
        truth.cluster_ip[fqdn(svc)] = None if ip == "None" else ip
    for eps in cluster.slices:
        name = fqdn(eps)
        if truth.cluster_ip[name] is None:
            zones = truth.by_zone.setdefault(name, {})
            for ep in eps["endpoints"]:
                zones.setdefault(ep["zone"], set()).update(ep["addresses"])
    if placement == "pods":  # only pods with a locator of their own are placed
        located = {a for loc in cluster.locators[: cluster.pod_locators] for a in loc["addresses"]}
        pods = [(ip, node) for ip, node in cluster.pods if ip in located]
    else:
        pods = cluster.pods
    # Node i is in ZONES[i % 3] (live_cluster.node_info).
    truth.clients = [(ip, ZONES[int(node.rsplit("-", 1)[1]) % len(ZONES)]) for ip, node in pods]
    return truth


@dataclass
class Checks:
    """The answers checked so far."""

    asked: int = 0
    right: int = 0
    wrong: int = 0
    unanswered: int = 0
    examples: list[str] = field(default_factory=list)

    def summary(self) -> JSON:
        return {"asked": self.asked, "right": self.right, "wrong": self.wrong,
                "unanswered": self.unanswered, "examples": self.examples[:5]}  # fmt: skip


def ask_checked(
    port: int, truth: Truth, checks: Checks, stop: threading.Event, limit: int, seed: int
) -> None:
    """Ask Services for random pods (ECS) until `stop` or `limit` queries; check each answer."""
    rng = random.Random(seed)
    names = list(truth.cluster_ip)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        sock.connect((HOST, port))
        sock.settimeout(2.0)
        while not stop.is_set() and checks.asked < limit:
            name = rng.choice(names)
            client, zone = rng.choice(truth.clients)
            query = dns.message.make_query(
                name, "A", use_edns=0, payload=1232, options=[dns.edns.ECSOption(client, 32)]
            )
            checks.asked += 1
            try:
                sock.send(query.to_wire())
                while True:
                    reply = dns.message.from_wire(sock.recv(4096))
                    if reply.id == query.id:
                        break
            except (TimeoutError, OSError, dns.exception.DNSException):
                checks.unanswered += 1
                continue
            got = {rd.to_text() for rrset in reply.answer
                   if rrset.rdtype == dns.rdatatype.A for rd in rrset}  # fmt: skip
            want = truth.expected(name, zone)
            if got == want:
                checks.right += 1
            else:
                checks.wrong += 1
                checks.examples.append(f"{name} for {client} ({zone}): {sorted(got)}, "
                                       f"expected {sorted(want)}")  # fmt: skip


def forwarded_name(i: int) -> str:
    """The `i`th name the fill asks outside the cluster's zone."""
    return f"fill-{i}.example.net"


def upstream_records(count: int) -> dict[tuple[str, str], list[str]]:
    """The stub upstream's answers: an A record for each forwarded fill name."""
    names = (forwarded_name(i) for i in range(count))
    return {(name, "A"): [f"{name}. 3600 IN A 192.0.2.1"] for name in names}


def cache_bounds(limit_mib: int) -> list[str]:
    """The flags bounding the caches as toposdns bounds them by default in a container with a
    memory limit of `limit_mib` MiB (one process, no other server block)."""
    with tempfile.TemporaryDirectory() as cgroup:
        Path(cgroup, "memory.max").write_text(str(limit_mib << 20))
        replies = default_max_bytes(MEMORY_SHARE, 1, DEFAULT_MAX_BYTES, cgroup)
        forwarded = default_max_bytes(FORWARD_SHARE, 1, FORWARD_MAX_BYTES, cgroup)
    return [f"--cache-max-bytes={replies}", f"--forward-cache-max-bytes={forwarded}"]


def fill_caches(port: int, cluster: Cluster, count: int) -> int:
    """Ask `count` distinct names that do not exist, each twice (a template reply is kept the
    second time), and `count` names forwarded upstream, `WINDOW` at a time; how many replies
    came."""
    namespaces = [ns["metadata"]["name"] for ns in cluster.namespaces]
    replies = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((HOST, 0))
        sock.connect((HOST, port))
        sock.settimeout(1.0)
        for start in range(0, 2 * count, WINDOW):
            batch = range(start, min(2 * count, start + WINDOW))
            for _ in range(2):
                for i in batch:
                    if i < count:
                        name = f"fill-{i}.{namespaces[i % len(namespaces)]}.svc.cluster.local."
                    else:
                        name = forwarded_name(i - count)
                    sock.send(dns.message.make_query(name, "A").to_wire())
                for _ in batch:
                    try:
                        sock.recv(4096)
                        replies += 1
                    except TimeoutError:
                        break
    return replies


class Sampler:
    """RSS and PSS (MiB, summed over the process and its children) every `interval` seconds."""

    def __init__(self, proc: ServerProcess, interval: float = 0.1) -> None:
        self.proc = proc
        self.interval = interval
        self.samples: list[tuple[float, float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            rss = pss = 0
            for pid in self.proc.processes():
                try:
                    rss += kib(Path(f"/proc/{pid}/status"), "VmRSS:")
                    pss += kib(Path(f"/proc/{pid}/smaps_rollup"), "Pss:")
                except OSError:
                    continue
            self.samples.append((time.monotonic(), rss / 1024, pss / 1024))
            self.stop.wait(self.interval)

    def between(self, start: float, end: float) -> list[tuple[float, float, float]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def peak(self, start: float, end: float) -> JSON:
        window = self.between(start, end)
        return {"rss_mib": round(max((s[1] for s in window), default=0.0), 1),
                "pss_mib": round(max((s[2] for s in window), default=0.0), 1)}  # fmt: skip

    def mean(self, start: float, end: float) -> JSON:
        window = self.between(start, end) or self.samples[-1:]
        n = len(window) or 1
        return {"rss_mib": round(sum(s[1] for s in window) / n, 1),
                "pss_mib": round(sum(s[2] for s in window) / n, 1)}  # fmt: skip


def kib(path: Path, key: str) -> int:
    """The KiB a /proc file gives on the line starting with `key`."""
    for line in path.read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def restart_api(setup: Live) -> tuple[float, int]:
    """Compact the stand-in's history and close every connection, then wait until every
    resource is watched again (listed anew); seconds that took, and the list pages asked."""
    start = time.monotonic()
    before = len(setup.server.requests)
    setup.server.compact()
    setup.server.restart()
    deadline = start + RELIST_TIMEOUT
    while setup.server.open_watches < WATCHED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every resource watched again after {RELIST_TIMEOUT:.0f} s")
        time.sleep(0.05)
    pages = sum(
        1
        for r in setup.server.requests[before:]
        if r.method == "GET" and r.resource and not r.is_watch
    )
    return time.monotonic() - start, pages


def measure(
    setup: Live, cluster: Cluster, truth: Truth, args: argparse.Namespace, upstream: int
) -> JSON:
    """One toposdns from start through the restarts; stopped after."""
    bounds = cache_bounds(args.memory_limit) if args.memory_limit else []
    flags = ["--workers=1", "--ecs-trust", f"{HOST}/32", "--upstream", f"{HOST}:{upstream}"]
    proc = setup.start([*flags, *bounds, *args.toposdns_arg])
    sampler = Sampler(proc)
    checks = Checks()
    stop = threading.Event()
    asker = threading.Thread(
        target=ask_checked,
        args=(setup.dns_port, truth, checks, stop, args.max_queries, args.seed),
        daemon=True,
    )
    try:
        ready = wait_ready(proc, setup.http_port, READY_TIMEOUT)
        sampler.thread.start()
        result: JSON = {"ready_s": round(ready, 1)}
        time.sleep(args.settle)
        if args.fill_caches:
            result["fill_replies"] = fill_caches(setup.dns_port, cluster, args.fill_caches)
        asker.start()
        now = time.monotonic()
        time.sleep(args.window)
        result["steady"] = sampler.mean(now, now + args.window)
        result["restarts"] = []
        for n in range(args.restarts):
            start = time.monotonic()
            took, pages = restart_api(setup)
            time.sleep(args.after)
            end = time.monotonic()
            row = {"relist_s": round(took, 1), "list_pages": pages,
                   "peak": sampler.peak(start, end),
                   "after": sampler.mean(end - args.window, end)}  # fmt: skip
            log(f"restart {n + 1}: {row}")
            result["restarts"].append(row)
        proc.check_alive()
        return result
    finally:
        stop.set()
        if asker.is_alive():
            asker.join(timeout=5)
        sampler.stop.set()
        result_checks = checks.summary()
        if "result" in locals():
            result["answers"] = result_checks
        proc.stop()
        setup.proc = None


def run(args: argparse.Namespace) -> JSON:
    result: JSON = machine()
    log(f"generating objects ({args.placement})")
    sizes = Sizes(args.services, args.slices, args.nodes, args.namespaces, args.pods,
                  node_ranges=True, cidr_locators=args.placement == "cidrs",
                  per_slice=args.endpoints)  # fmt: skip
    cluster = generate(sizes, args.seed)
    for svc in cluster.services:
        if svc["spec"]["clusterIP"] == "None":
            svc["metadata"]["annotations"] = dict(TOPOLOGY)
    truth = truth_of(cluster, args.placement)
    result["objects"] = {k: len(v) for k, v in cluster.by_resource().items()}
    result["objects"]["endpoints"] = sum(len(eps["endpoints"]) for eps in cluster.slices)
    result["placement"] = args.placement
    result["fill_caches"] = args.fill_caches
    result["toposdns_args"] = args.toposdns_arg
    result["memory_limit_mib"] = args.memory_limit
    with live(args.show_log) as setup, stub_upstream(upstream_records(args.fill_caches)) as stub:
        load(setup.server, cluster)
        setup.server.start()
        result.update(measure(setup, cluster, truth, args, stub.port))
    return result


def table(result: JSON) -> str:
    objects = ", ".join(f"{n:,} {kind}" for kind, n in result["objects"].items())
    answers = result.get("answers", {})
    lines = [
        f"{result['date']}, nproc {result['nproc']}, {result['cpu']}, Python {result['python']}",
        f"objects: {objects}; placement by {result['placement']}; caches filled with "
        f"{result['fill_caches']:,} names in the zone and as many forwarded; cache bounds "
        + (f"of a {limit} MiB container" if (limit := result["memory_limit_mib"]) else "unlimited"),
        f"answers checked: {answers.get('asked', 0)}, wrong {answers.get('wrong', 0)}, "
        f"unanswered {answers.get('unanswered', 0)}",
        *(f"  wrong: {e}" for e in answers.get("examples", [])),
        "",
        "| state | RSS MiB | PSS MiB |",
        "|---|---:|---:|",
        f"| steady | {result['steady']['rss_mib']} | {result['steady']['pss_mib']} |",
    ]
    for n, row in enumerate(result["restarts"], 1):
        lines.append(f"| restart {n}: peak ({row['list_pages']} list pages) "
                     f"| {row['peak']['rss_mib']} | {row['peak']['pss_mib']} |")  # fmt: skip
        lines.append(f"| restart {n}: after | {row['after']['rss_mib']} "
                     f"| {row['after']['pss_mib']} |")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--placement", choices=("cidrs", "pods"), default="cidrs",
                   help="pods placed by their node's CIDR, or by a PodLocator each")  # fmt: skip
    p.add_argument("--pods", type=int, default=150_000)
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--slices", type=int, default=10_000)
    p.add_argument("--endpoints", default="10-20", help="ready endpoints per slice, fewest-most")
    p.add_argument("--nodes", type=int, default=5_000)
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument("--fill-caches", type=int, default=0, metavar="N",
                   help="fill the caches: N names in the zone, N forwarded")  # fmt: skip
    p.add_argument("--memory-limit", type=int, default=0, metavar="MIB",
                   help="bound the caches as in a container with this memory limit")  # fmt: skip
    p.add_argument("--restarts", type=int, default=1, help="API restarts, one after the other")
    p.add_argument("--settle", type=float, default=5.0, help="seconds after ready")
    p.add_argument("--window", type=float, default=3.0, help="seconds a mean is taken over")
    p.add_argument("--after", type=float, default=60.0, help="seconds kept after each relist")
    p.add_argument("--max-queries", type=int, default=1_000_000, help="bound of checked queries")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print toposdns's log at the end")
    p.add_argument("--toposdns-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `toposdns serve` (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    try:
        low, high = (int(n) for n in args.endpoints.split("-"))
    except ValueError:
        p.error(f"--endpoints {args.endpoints!r}: expected fewest-most, e.g. 10-20")
    if not 1 <= low <= high:
        p.error(f"--endpoints {args.endpoints!r}: expected 1 <= fewest <= most")
    args.endpoints = (low, high)
    if min(args.pods, args.services, args.slices, args.nodes, args.namespaces) < 1:
        p.error("sizes must be positive")
    if args.window > args.after:
        p.error("--window must not be longer than --after")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    answers = result.get("answers", {})
    return 1 if answers.get("wrong") or not answers.get("right") else 0


if __name__ == "__main__":
    sys.exit(main())
