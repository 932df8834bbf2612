"""Measure toposdns serving from the (stand-in) Kubernetes API while EndpointSlices change.

For each cluster size (headless services, one EndpointSlice each, a PodLocator per endpoint pod):

1. QPS under churn: dnsperf at maximum throughput on the services' names (as bench/run.py's
   repeated scenario) while a thread changes one endpoint address of a random headless
   service's slice through the stand-in, at each rate (changes per second, 0 = none); the QPS
   and its ratio to the same server's QPS without changes;
2. visibility under that load: a second thread takes a change whenever it is free and asks
   the changed name from its own UDP socket every millisecond until the answer holds the new
   address: the delay from just before the write to that answer (p50/p99/max, and misses);
3. apply cost: with no query load, the server's CPU seconds (/proc/PID/stat) over N changes,
   minus its idle CPU over as long, divided by N.

Run from the repository root:  python -m bench.churn  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import queue
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import dnsperf
from bench.harness import (
    FakeApiServer,
    ServerProcess,
    endpoint,
    endpoint_slice,
    log,
    machine,
    service,
)
from bench.live_cluster import (
    ZONES,
    Cluster,
    NodeInfo,
    Sizes,
    fqdn,
    generate,
    load,
    node_info,
    pod_locator,
)
from bench.live_server import CHANGE_TIMEOUT, Asker, Delays, holds, live, wait_ready

READY_TIMEOUT = 300.0
SETTLE = 1.0  # seconds between runs, so a backlog of changes does not spill into the next
FRESH = int(ipaddress.IPv4Address("10.127.0.1"))  # new endpoint addresses count up from here

JSON = dict[str, Any]


class Changer:
    """Changes one endpoint address of a random headless slice in the stand-in."""

    client: str | None = None  # queries come from the bench's own address

    def __init__(self, server: FakeApiServer, cluster: Cluster, seed: int) -> None:
        self.server = server
        self.slices = cluster.headless_slices()
        self.rng = random.Random(seed)
        self.fresh: Iterator[int] = itertools.count(FRESH)

    def change(self, avoid: str | None = None) -> tuple[str, str, float]:
        """(the service's name, the new address, perf_counter just before the write); never
        the service named `avoid` (the one being watched)."""
        eps = self.rng.choice(self.slices)
        while fqdn(eps) == avoid and len(self.slices) > 1:
            eps = self.rng.choice(self.slices)
        new = str(ipaddress.IPv4Address(next(self.fresh)))
        eps["endpoints"][self.rng.randrange(len(eps["endpoints"]))]["addresses"] = [new]
        started = time.perf_counter()
        self.server.modify(eps)
        return fqdn(eps), new, started


#: The prober's source address in `--kind locators`: a client placed by a PodLocator of its own.
CLIENT = "127.0.0.2"
PROBE_NAMESPACE = "ns-00"


class LocatorChanger:
    """Moves PodLocators to another node in the stand-in: a random pod's, or, when the change
    is to be probed, the prober's own (CLIENT), to a node of the next zone. The probed name is
    a headless service filtered by zone with one endpoint per zone, so the client's answer is
    that zone's endpoint: a move shows when the answer is the new zone's."""

    client = CLIENT

    def __init__(self, server: FakeApiServer, cluster: Cluster, nodes: int, seed: int) -> None:
        self.server = server
        self.rng = random.Random(seed)
        self.nodes = [node_info(i) for i in range(nodes)]
        self.locators = [
            o for o in cluster.locators if o["metadata"]["labels"]["toposdns.io/locator"] == "pod"
        ]
        # One node and one endpoint address per zone.
        self.zones = [next(n for n in self.nodes if n[1]["topology.kubernetes.io/zone"] == zone)
                      for zone in ZONES]  # fmt: skip
        self.endpoints = [f"10.126.0.{i + 1}" for i in range(len(self.zones))]
        self.zone = 0
        self.probe = self._probe_objects()
        self.mine = pod_locator("prober", PROBE_NAMESPACE, CLIENT, self.zones[0], self.rng)
        for obj in (*self.probe, self.mine):
            server.add(obj)

    def _probe_objects(self) -> tuple[JSON, JSON]:
        keys = {"toposdns.io/topology-keys": "topology.kubernetes.io/zone"}
        probe = service("probe", PROBE_NAMESPACE, cluster_ip="None", annotations=keys)
        endpoints = [
            endpoint(address, nodeName=node[0], zone=node[1]["topology.kubernetes.io/zone"])
            for address, node in zip(self.endpoints, self.zones, strict=True)
        ]
        port = [{"name": "http", "port": 8080}]
        return probe, endpoint_slice("probe", PROBE_NAMESPACE, endpoints, ports=port)

    def change(self, avoid: str | None = None) -> tuple[str, str, float]:
        """(the probed name, the address it must answer now, perf_counter just before the
        write) after moving the prober's locator; with `avoid` (a probe is pending), a random
        pod's locator is moved instead and the name is ""."""
        if avoid is None:
            self.zone = (self.zone + 1) % len(self.zones)
            obj, node = self.mine, self.zones[self.zone]
        else:
            obj, node = self.rng.choice(self.locators), self.rng.choice(self.nodes)
        move(obj, node)
        started = time.perf_counter()
        self.server.modify(obj)
        if avoid is not None:
            return "", "", started
        return f"probe.{PROBE_NAMESPACE}.svc.cluster.local.", self.endpoints[self.zone], started


def move(locator: JSON, node: NodeInfo) -> None:
    locator["nodeName"] = node[0]
    locator["nodeLabels"] = dict(node[1])


class Churn:
    """While entered: `rate` changes a second from one thread, and a prober thread timing
    how long a change takes to show in answers (one change at a time, whenever it is free)."""

    def __init__(self, changer: Changer | LocatorChanger, asker: Asker, rate: float) -> None:
        self.changer, self.asker, self.rate = changer, asker, rate
        self.delays = Delays(f"changes at {rate:g}/s")
        self.changes = 0
        self.seconds = 0.0  # how long it was entered
        self._stop = threading.Event()
        self._probe: queue.Queue[tuple[str, str, float]] = queue.Queue(maxsize=1)
        self._watched: str | None = None
        self._threads = [
            threading.Thread(target=self._change, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]

    def __enter__(self) -> Churn:
        self.seconds = time.monotonic()
        if self.rate > 0:
            for thread in self._threads:
                thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.monotonic() - self.seconds
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(CHANGE_TIMEOUT + 1)

    def _change(self) -> None:
        start = time.monotonic()
        for k in itertools.count():
            pause = start + k / self.rate - time.monotonic()
            if self._stop.wait(max(0.0, pause)):
                return
            name, new, started = self.changer.change(avoid=self._watched)
            self.changes += 1
            if self._watched is None:
                self._watched = name
                self._probe.put((name, new, started))

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                name, new, started = self._probe.get(timeout=0.1)
            except queue.Empty:
                continue
            if self.asker.wait_for(name, holds(new)) is None:
                self.delays.missed += 1
            else:
                self.delays.samples_ms.append((time.perf_counter() - started) * 1000)
            self._watched = None


# --------------------------------------------------------------------------- measuring


@dataclass
class RateRuns:
    """The runs at one change rate, over the rounds."""

    rate: float
    delays: Delays
    qps: list[float] = field(default_factory=list)
    server_cpu_pct: list[float] = field(default_factory=list)
    changes_per_s: list[float] = field(default_factory=list)

    def summary(self, base_qps: float | None) -> JSON:
        qps = statistics.median(self.qps)
        return {
            "rate": self.rate,
            "qps": qps,
            "qps_over_no_changes": qps / base_qps if base_qps else None,
            "server_cpu_pct": statistics.median(self.server_cpu_pct),
            "changes_per_s": statistics.median(self.changes_per_s),
            "visible": self.delays.summary() if self.rate else None,
        }


def measure_qps(
    proc: ServerProcess,
    port: int,
    changer: Changer | LocatorChanger,
    qfile: Path,
    args: argparse.Namespace,
) -> list[JSON]:
    """The rounds: in each, one max-throughput dnsperf run per change rate."""
    by_rate = {rate: RateRuns(rate, Delays(f"changes at {rate:g}/s")) for rate in args.rates}
    asker = Asker(port, changer.client)
    try:
        dnsperf.warm(port, qfile)
        for rnd in range(args.rounds):
            log(f"round {rnd + 1}/{args.rounds}")
            for rate, runs in by_rate.items():
                with Churn(changer, asker, rate) as churn:
                    result = dnsperf.run(
                        f"{rate:g} changes/s", port, qfile, args.seconds,
                        ["-c", "1", "-q", "100"], proc.cpu_seconds,
                    )  # fmt: skip
                runs.qps.append(result.qps)
                runs.server_cpu_pct.append(result.server_cpu_pct)
                runs.changes_per_s.append(churn.changes / churn.seconds)
                runs.delays.samples_ms += churn.delays.samples_ms
                runs.delays.missed += churn.delays.missed
                time.sleep(SETTLE)
    finally:
        asker.close()
    base = by_rate[0].qps if 0 in by_rate else None
    return [runs.summary(statistics.median(base) if base else None) for runs in by_rate.values()]


def apply_cost(
    proc: ServerProcess, port: int, changer: Changer | LocatorChanger, changes: int, rate: float
) -> JSON:
    """CPU seconds the server spends per change, with no query load: its CPU over `changes`
    changes at `rate` a second (each applied on its own), minus its idle CPU over as long."""
    span = changes / rate
    before = proc.cpu_seconds()
    time.sleep(span)
    idle_per_s = (proc.cpu_seconds() - before) / span
    asker = Asker(port, changer.client)
    try:
        before, start = proc.cpu_seconds(), time.monotonic()
        for k in range(changes):
            time.sleep(max(0.0, start + k / rate - time.monotonic()))
            name, new, _ = changer.change()
        shown = asker.wait_for(name, holds(new), timeout=10.0)
        elapsed = time.monotonic() - start
        cpu = proc.cpu_seconds() - before
    finally:
        asker.close()
    per_change_ms = 1000 * (cpu - idle_per_s * elapsed) / changes
    log(f"apply cost: {per_change_ms:.2f} ms CPU per change ({changes} changes, {cpu:.2f} s CPU)")
    return {
        "changes": changes,
        "rate": rate,
        "cpu_s": cpu,
        "idle_cpu_per_s": idle_per_s,
        "seconds": elapsed,
        "last_change_shown": shown is not None,
        "cpu_ms_per_change": per_change_ms,
    }


def measure_size(services: int, args: argparse.Namespace) -> JSON:
    """Start the stand-in and toposdns with `services` headless services; measure."""
    sizes = Sizes(services, services, args.nodes, args.namespaces, None, headless_every=1)
    cluster = generate(sizes, args.seed)
    result: JSON = {
        "services": services,
        "endpoint_pods": cluster.endpoint_pods,
        "locators": len(cluster.locators),
    }
    log(f"{services:,} headless services, {len(cluster.locators):,} locators")
    with live(args.show_log) as setup:
        load(setup.server, cluster)
        changer = (
            LocatorChanger(setup.server, cluster, args.nodes, args.seed)
            if args.kind == "locators"
            else Changer(setup.server, cluster, args.seed)
        )
        setup.server.start()
        proc = setup.start(args.toposdns_arg)
        result["ready_s"] = wait_ready(proc, setup.http_port, READY_TIMEOUT)
        if services in args.cost_sizes:
            result["apply_cost"] = apply_cost(
                proc, setup.dns_port, changer, args.cost_changes, args.cost_rate
            )
        if services in args.sizes:
            qfile = setup.workdir / "queries.txt"
            names = [fqdn(svc).rstrip(".") for svc in cluster.services]
            random.Random(args.seed).shuffle(names)
            qfile.write_text("".join(f"{name} A\n" for name in names))
            result["rates"] = measure_qps(proc, setup.dns_port, changer, qfile, args)
    return result


# --------------------------------------------------------------------------- report


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(result: JSON) -> str:
    lines = [f"{result['date']}, nproc {result['nproc']}, {result['cpu']}, "
             f"Python {result['python']}; medians of {result['rounds']} rounds of "
             f"{result['seconds']:g} s"]  # fmt: skip
    hdr = (
        f"{'services':>8} {'changes/s':>9} {'done/s':>7} {'QPS':>8} {'vs 0/s':>7} "
        f"{'cpu':>5} {'visible p50':>11} {'p99':>7} {'max':>7} {'probed':>6} {'missed':>6}"
    )
    lines += [hdr, "-" * len(hdr)]
    for size in result["sizes"]:
        for r in size.get("rates", []):
            v = r["visible"] or {}
            lines.append(
                f"{size['services']:>8,} {r['rate']:>9g} {r['changes_per_s']:>7.1f} "
                f"{r['qps']:>8,.0f} {fmt(r['qps_over_no_changes'], '.2f'):>7} "
                f"{r['server_cpu_pct']:>4.0f}% {fmt(v.get('p50_ms'), '.1f'):>11} "
                f"{fmt(v.get('p99_ms'), '.1f'):>7} {fmt(v.get('max_ms'), '.1f'):>7} "
                f"{v.get('events', 0):>6} {v.get('missed', 0):>6}"
            )
    costs = {s["services"]: s["apply_cost"] for s in result["sizes"] if "apply_cost" in s}
    for services, cost in costs.items():
        lines.append(
            f"apply cost at {services:,} services: {cost['cpu_ms_per_change']:.2f} ms CPU per "
            f"change ({cost['changes']} changes at {cost['rate']:g}/s, no queries"
            + ("" if cost["last_change_shown"] else "; the last change never showed")
            + ")"
        )
    if len(costs) > 1:
        small, large = min(costs), max(costs)
        ratio = costs[large]["cpu_ms_per_change"] / costs[small]["cpu_ms_per_change"]
        lines.append(f"apply cost at {large:,} / at {small:,} services: {ratio:.2f}x")
    return "\n".join(lines)


def sizes_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def rates_list(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument(
        "--sizes",
        type=sizes_list,
        default=[2000, 10000],
        help="headless services, for the QPS runs (default 2000,10000)",
    )
    p.add_argument(
        "--cost-sizes",
        type=sizes_list,
        default=[1000, 10000],
        help="headless services, for the apply cost (default 1000,10000)",
    )
    p.add_argument(
        "--rates",
        type=rates_list,
        default=[0, 2, 10, 50],
        help="EndpointSlice changes per second (default 0,2,10,50)",
    )
    p.add_argument("--kind", choices=("slices", "locators"), default="slices",
                   help="what changes: an endpoint address of a random headless service's "
                   "EndpointSlice, or a random pod's PodLocator moving to another node (the "
                   "probed change moves the prober's own locator to another zone)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=10.0, help="length of each dnsperf run")
    p.add_argument("--rounds", type=int, default=3, help="rounds over the rates; medians")
    p.add_argument("--cost-changes", type=int, default=200, help="changes for the apply cost")
    p.add_argument("--cost-rate", type=float, default=20.0, help="their rate, per second")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--show-log", action="store_true", help="print toposdns's log at the end")
    p.add_argument("--toposdns-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `toposdns serve` (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    sizes = [*args.sizes, *args.cost_sizes, args.nodes, args.namespaces, args.rounds,
             args.cost_changes]  # fmt: skip
    if min(sizes, default=1) < 1 or min(args.rates, default=0) < 0 or args.cost_rate <= 0:
        p.error("sizes, --rounds and --cost-* must be positive, rates not negative")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("dnsperf") is None:
        log("dnsperf not found (Debian package: dnsperf)")
        return 2
    result: JSON = {**machine(), "kind": args.kind, "rounds": args.rounds, "seconds": args.seconds}
    result["sizes"] = [
        measure_size(services, args) for services in sorted({*args.sizes, *args.cost_sizes})
    ]
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
