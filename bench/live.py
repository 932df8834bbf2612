"""Measure toposdns serving a large cluster from the (stand-in) Kubernetes API.

Three numbers:

1. time to ready: from starting `python -m toposdns serve --kubeconfig ...` to the first 200 from
   /ready, with ~100,000 PodLocators, 10,000 Services and 10,000 EndpointSlices in the API;
2. peak memory of that process after the sync (VmHWM / VmRSS), next to CoreDNS's formula;
3. event-to-answer delay: how long after a Service's cluster IP (or a headless Service's
   EndpointSlice) changes in the API a UDP query sees the new address.

The API is the test suite's stand-in (`FakeApiServer`), in a thread of this process. Its own
cost of serving the lists (plain paged LISTs from threads, nothing decoded but the continue
token) is measured first and reported separately, so it can be subtracted.

Run from the repository root:  python -m bench.live  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import random
import re
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import FakeApiServer, ServerProcess, log, machine
from bench.live_cluster import Cluster, Sizes, fqdn, generate, load
from bench.live_server import Asker, Delays, EveryWorker, equals, holds, live, wait_ready

READY_TIMEOUT = 120.0
PAGE = 500
SERVING_LINE = re.compile(r"serving DNS on \S+:\d+")
LISTED_LINE = re.compile(r"(\w+): listed (\d+) objects")

JSON = dict[str, Any]


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


# --------------------------------------------------------------------------- events


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
        if asker.wait_for(name, equals({old})) is None:
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
    if asker.wait_for(name, holds(new)) is None:
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
    candidates = cluster.headless_slices()
    chosen = rng.sample(candidates, min(count, len(candidates)))
    fresh = int(ipaddress.IPv4Address("10.127.0.1"))
    end = time.monotonic() + budget
    for i, eps in enumerate(chosen):
        if time.monotonic() > end:
            break
        name = fqdn(eps)
        before = {ep["addresses"][0] for ep in eps["endpoints"]}
        if asker.wait_for(name, equals(before)) is None:
            delays.missed += 1
            continue
        new = str(ipaddress.IPv4Address(fresh + i))
        eps["endpoints"][rng.randrange(len(eps["endpoints"]))]["addresses"] = [new]
        time_change(server, asker, eps, name, new, delays)
    return delays


# --------------------------------------------------------------------------- main


def coredns_mb(pods: int, services: int) -> float:
    """coredns/deployment kubernetes/Scaling_CoreDNS.md, default settings (best linear fit)."""
    return (pods + services) * 0.000858 + 49.1


def sizes_of(args: argparse.Namespace) -> Sizes:
    return Sizes(args.services, args.slices, args.nodes, args.namespaces, args.locators)


def objects(cluster: Cluster) -> JSON:
    counts = {k: len(v) for k, v in cluster.by_resource().items()}
    log(f"objects: {counts}, {cluster.endpoint_pods} endpoint pods")
    return {
        **counts,
        "pod_locators": cluster.pod_locators,
        "node_locators": cluster.node_locators,
        "endpoint_pods": cluster.endpoint_pods,
    }


def load_standin(server: FakeApiServer, cluster: Cluster) -> StandIn:
    """Load the objects, start the stand-in and measure it alone."""
    start = time.perf_counter()
    load(server, cluster)
    load_seconds = time.perf_counter() - start
    server.start()
    log(f"stand-in loaded in {load_seconds:.1f} s; listing through it alone")
    standin = measure_standin(server)
    standin.load_seconds = load_seconds
    log(
        f"stand-in alone: all lists at once {standin.cold_seconds:.2f} s cold, "
        f"{standin.warm_seconds:.2f} s warm"
    )
    server.compact()  # a fresh resourceVersion, so toposdns lists nothing cached
    server.requests.clear()
    return standin


def time_to_ready(proc: ServerProcess, http_port: int) -> JSON:
    """Wait for /ready; when it came, when the log said what, CPU and memory meanwhile."""
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    ready = wait_ready(proc, http_port, READY_TIMEOUT)
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    serving = proc.find(SERVING_LINE)
    listed = {}
    for at, line in list(proc.lines):
        found = LISTED_LINE.search(line)
        if found:
            listed[found.group(1)] = {"seconds": round(at, 3), "objects": int(found[2])}
    hwm, rss = proc.memory()
    log(f"ready after {ready:.2f} s; VmHWM {hwm:.0f} MB, VmRSS {rss:.0f} MB")
    return {
        "ready_s": ready,
        "serving_dns_s": serving[0] if serving else None,
        "listed": listed,
        "cpu_s_to_ready": proc.cpu_seconds(),
        "bench_process_cpu_s_to_ready": (cpu_after.ru_utime + cpu_after.ru_stime)
        - (cpu_before.ru_utime + cpu_before.ru_stime),
        "vmhwm_mb": hwm,
        "vmrss_mb": rss,
    }


def run(args: argparse.Namespace) -> JSON:
    result: JSON = machine()
    log("generating objects")
    cluster = generate(sizes_of(args), args.seed)
    result["objects"] = objects(cluster)
    services = len(cluster.services)
    result["coredns_formula_mb"] = {
        "endpoint_pods": coredns_mb(cluster.endpoint_pods, services),
        "pod_locators": coredns_mb(cluster.pod_locators, services),
    }
    with live(args.show_log) as setup:
        result["standin"] = asdict(load_standin(setup.server, cluster))
        proc = setup.start(args.toposdns_arg)
        result["toposdns"] = time_to_ready(proc, setup.http_port)
        result["events"] = events(setup.server, cluster, setup.dns_port, args)
        hwm, rss = proc.memory()
        result["toposdns"]["vmhwm_after_events_mb"] = hwm
        result["toposdns"]["vmrss_after_events_mb"] = rss
    return result


def events(
    server: FakeApiServer, cluster: Cluster, dns_port: int, args: argparse.Namespace
) -> list[JSON]:
    """Both kinds of event-to-answer measurements, one after the other."""
    asker = Asker(dns_port) if args.askers == 1 else EveryWorker(dns_port, args.askers)
    try:
        time.sleep(0.2)
        log(f"{args.events} Service events")
        found = [service_events(server, asker, cluster, args.events, args.event_budget, args.seed)]
        log(f"{args.events} EndpointSlice events")
        found.append(
            slice_events(server, asker, cluster, args.events, args.event_budget, args.seed)
        )
        return [d.summary() for d in found]
    finally:
        asker.close()


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    p.add_argument(
        "--askers",
        type=int,
        default=1,
        help="UDP sockets asking at once: a change counts when all see it (with --workers, "
        "8 or more reach every worker)",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print toposdns's log at the end")
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="instead of measuring: profile the sync in-process (cProfile, tracemalloc)",
    )
    p.add_argument(
        "--toposdns-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `toposdns serve` (repeatable)",
    )
    args = p.parse_args(argv)
    if min(args.services, args.slices, args.nodes, args.namespaces, args.askers) < 1 or (
        args.locators < 0
    ):
        p.error("sizes must be positive")
    return args


def profile(args: argparse.Namespace) -> int:
    """Load the stand-in, then sync a KubeSource against it in a child process
    (`bench.sync_profile`), three ways: plain, under cProfile, under tracemalloc."""
    cluster = generate(sizes_of(args), args.seed)
    outdir = Path(args.profile)
    outdir.mkdir(parents=True, exist_ok=True)
    server = FakeApiServer()
    try:
        load(server, cluster)
        server.start()
        list_all(server)  # warm the stand-in, as in the measured run
        kubeconfig = server.write_kubeconfig(outdir / "kubeconfig")
        for mode, name in (("plain", "plain.txt"), ("cpu", "sync.prof"), ("memory", "memory.txt")):
            log(f"profiling the sync: {mode}")
            child = subprocess.run(
                [sys.executable, "-m", "bench.sync_profile", mode, str(kubeconfig),
                 str(outdir / name)],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            print(f"===== {mode} =====\n{child.stdout}{child.stderr[-3000:]}", flush=True)
    finally:
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        return profile(args)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
