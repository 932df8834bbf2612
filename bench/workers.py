"""Measure `toposdns serve --workers N` watching a large cluster, for N = 1, 2, 4.

With `--placement pods,cidrs`, the same cluster twice, pods addressed from their node's /24:
described by one PodLocator per pod, then by node locators carrying that /24 and no pod
locators; each run also checks through /explain that sampled pods are placed on their node.

For each N, against the same stand-in API server (the test suite's `FakeApiServer`, in a thread
of this process): the requests toposdns makes to the API (the same for every N: the supervisor
watches once, whatever the number of workers); its memory as proportional set size (PSS, the
`Pss:` of /proc/PID/smaps_rollup) summed over the supervisor and its workers, so that pages the
workers share copy-on-write count once, when ready and again after every worker has answered
queries for every Service; and the time from start to the first /ready 200 (every worker
serving the synced data).

Run from the repository root:  python -m bench.workers  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from typing import Any

import dns.exception
import dns.message
import dns.query

from bench.harness import HOST, ServerProcess, log, machine
from bench.live_cluster import Cluster, Sizes, fqdn, generate, load
from bench.live_server import Live, live, wait_ready

READY_TIMEOUT = 300.0
JSON = dict[str, Any]


def ask_every_service(port: int, cluster: Cluster, limit: int) -> int:
    """Ask for up to `limit` Services, each from a new source port (so the kernel spreads
    them over the workers); how many got an answer."""
    answered = 0
    for service in cluster.services[:limit]:
        query = dns.message.make_query(fqdn(service), "A")
        try:
            dns.query.udp(query, HOST, port=port, timeout=1.0)
            answered += 1
        except (dns.exception.DNSException, OSError):
            pass
    return answered


def api_requests(setup: Live) -> JSON:
    """The requests the stand-in received, by kind and resource."""
    kinds = Counter(
        f"{'watch' if r.is_watch else r.method.lower()} {r.resource or r.path}"
        for r in setup.server.requests
    )
    return {"total": sum(kinds.values()), **dict(sorted(kinds.items()))}


def placed_right(http_port: int, cluster: Cluster, sample: int, seed: int) -> int:
    """How many of `sample` random pods /explain places on their own node."""
    name = fqdn(cluster.services[0])
    right = 0
    for address, node in random.Random(seed).sample(cluster.pods, min(sample, len(cluster.pods))):
        query = urllib.parse.urlencode({"client": address, "name": name})
        url = f"http://{HOST}:{http_port}/explain?{query}"
        with urllib.request.urlopen(url, timeout=5.0) as response:
            locator = json.load(response)["client"]["locator"]
        right += locator is not None and locator["node"] == node
    return right


def measure(setup: Live, cluster: Cluster, workers: int, args: argparse.Namespace) -> JSON:
    """One toposdns with `workers`, from start to ready, then queries; stopped after."""
    setup.server.requests.clear()
    proc: ServerProcess = setup.start([f"--workers={workers}", *args.toposdns_arg])
    try:
        ready = wait_ready(proc, setup.http_port, READY_TIMEOUT)
        time.sleep(args.settle)
        result: JSON = {
            "workers": workers,
            "ready_s": round(ready, 2),
            "processes": len(proc.processes()),
            "pss_ready_mb": round(proc.pss_mb(), 1),
            "cpu_s_to_ready": round(proc.cpu_seconds(), 1),
        }
        result["answered"] = ask_every_service(setup.dns_port, cluster, args.queries)
        if args.placement:
            result["placed_right"] = placed_right(setup.http_port, cluster, args.sample, args.seed)
            result["sampled"] = min(args.sample, len(cluster.pods))
        result["pss_after_queries_mb"] = round(proc.pss_mb(), 1)
        result["api_requests"] = api_requests(setup)
        log(f"--workers={workers}: {result}")
        return result
    finally:
        proc.stop()
        setup.proc = None


def run(args: argparse.Namespace) -> JSON:
    result: JSON = machine()
    result["runs"] = []
    for placement in args.placement or [""]:
        log(f"generating objects {placement}")
        sizes = Sizes(
            args.services,
            args.slices,
            args.nodes,
            args.namespaces,
            args.locators,
            node_ranges=bool(placement),
            cidr_locators=placement == "cidrs",
            per_slice=args.per_slice,
        )
        cluster = generate(sizes, args.seed)
        objects = {k: len(v) for k, v in cluster.by_resource().items()}
        result.setdefault("objects", objects)
        with live(args.show_log) as setup:
            load(setup.server, cluster)
            setup.server.start()
            for n in args.workers:
                measured = measure(setup, cluster, n, args)
                result["runs"].append({"placement": placement, "objects": objects, **measured})
    return result


def table(result: JSON) -> str:
    lines = [
        f"{result['date']}, nproc {result['nproc']}, {result['cpu']}, Python {result['python']}",
        "objects: " + ", ".join(f"{n:,} {kind}" for kind, n in result["objects"].items()),
        "",
        "| placement | PodLocators | workers | ready | PSS when ready | PSS after queries "
        "| API requests | CPU to ready | placed right |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in result["runs"]:
        requests = r["api_requests"]
        kinds = ", ".join(f"{n} {kind}" for kind, n in requests.items() if kind != "total")
        placed = f"{r['placed_right']}/{r['sampled']}" if "placed_right" in r else "-"
        lines.append(
            f"| {r['placement'] or '-'} | {r['objects']['podlocators']:,} | {r['workers']} "
            f"| {r['ready_s']:.1f} s | {r['pss_ready_mb']:.0f} MB "
            f"| {r['pss_after_queries_mb']:.0f} MB | {requests['total']} ({kinds}) "
            f"| {r['cpu_s_to_ready']:.1f} s | {placed} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--workers", default="1,2,4", help="the values of N (default %(default)s)")
    p.add_argument("--locators", type=int, default=100_000, help="pod locators (one per pod)")
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--slices", type=int, default=10_000)
    p.add_argument("--nodes", type=int, default=5_000, help="nodes (one node locator each)")
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument(
        "--per-slice", default="3,10", help="fewest,most ready endpoints of a slice (%(default)s)"
    )
    p.add_argument("--queries", type=int, default=10_000, help="Services asked after ready")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after ready before PSS")
    p.add_argument(
        "--placement",
        default="",
        help="pods,cidrs: the cluster described by pod locators, then by node CIDRs "
        "(pods addressed from their node's /24 in both)",
    )
    p.add_argument("--sample", type=int, default=300, help="pods checked through /explain")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print toposdns's log at the end")
    p.add_argument(
        "--toposdns-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `toposdns serve` (repeatable)",
    )
    args = p.parse_args(argv)
    try:
        args.workers = [int(n) for n in args.workers.split(",")]
    except ValueError:
        p.error(f"--workers {args.workers!r}: expected numbers, e.g. 1,2,4")
    try:
        low, high = (int(n) for n in args.per_slice.split(","))
    except ValueError:
        p.error(f"--per-slice {args.per_slice!r}: expected MIN,MAX, e.g. 3,10")
    args.per_slice = (low, high)
    if not 1 <= low <= high:
        p.error(f"--per-slice {args.per_slice!r}: expected 1 <= MIN <= MAX")
    args.placement = [kind for kind in args.placement.split(",") if kind]
    if set(args.placement) - {"pods", "cidrs"}:
        p.error(f"--placement {args.placement!r}: expected pods, cidrs or both")
    if min(args.services, args.slices, args.nodes, args.namespaces, *args.workers) < 1:
        p.error("sizes and worker counts must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
