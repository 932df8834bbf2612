"""A picture of the Grafana dashboard (manifests/monitoring/dashboard.yaml) without Grafana:
every panel's PromQL evaluated by a real Prometheus over a short run of a real server, each
drawn as a small line chart in one grid, `docs/dashboard.png`.

It starts toposdns on a snapshot of topology-aware headless services (bench/cluster.py's
generator; one in four soft, weighted between tiers, and one in four with a minimum of endpoints,
so spilling over), its clients placed by PodLocators, forwarding to a stub upstream and to a
silent one (so the forward panels have a health check to fail); starts `prometheus` with a
temporary config that scrapes the server's `--http` every second as `job="kube-dns"`; sends a
bounded mixed load for `--seconds` from several 127.x addresses (service names from placed and
unplaced clients, endpoint, SRV and AAAA names, NXDOMAINs, trusted ECS, some with a prefix no
locator holds, forwarded names, one query in ten over TCP). Halfway it rewrites the snapshot
with an invalid policy, two locators claiming one CIDR and a locator outside the believed
namespace: the per-hour panels count what a change brings. Then each target's query goes
through Prometheus's `query_range`, `$__rate_interval` filled in as Grafana does (the larger of
four scrape intervals and the step plus one scrape interval), and matplotlib (Agg) draws them.

Needs `/usr/bin/prometheus` (Debian `prometheus`) and the `bench` extra for matplotlib:
`pip install '.[test,bench]'`. From the repository root:

    python -m bench.dashboard                       # ~75 s of load, writes docs/dashboard.png
    python -m bench.dashboard --seconds 20 --out /tmp/board.png

Every process it starts runs in its own process group and is stopped in a `finally`; every
query and HTTP call has a time limit. It measures nothing: the numbers are a loaded box's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import socket
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dns.edns
import dns.exception
import dns.message
import dns.query
import yaml

from bench.cluster import (
    SOFT_WEIGHTS,
    ZONE,
    Cluster,
    Node,
    ecs_clients,
    generate_cluster,
    locator_object,
    service_object,
    snapshot_objects,
)
from bench.harness import HOST, REPO, ServerProcess, free_port, log, stub_upstream
from bench.harness import toposdns_command as toposdns

DASHBOARD = REPO / "manifests" / "monitoring" / "dashboard.yaml"
PROMETHEUS = "/usr/bin/prometheus"
SCRAPE_SECONDS = 1
#: The charts' resolution, as Grafana's step for a short range on a small panel.
STEP_SECONDS = 2
#: Placed clients (one per node of the first few), and unplaced ones in two /24s.
PLACED = [f"127.0.1.{i}" for i in range(1, 7)]
UNPLACED = ["127.0.9.1", "127.0.9.2", "127.0.10.1"]
#: What the stub upstream answers; any other outside name is NXDOMAIN there.
UPSTREAM = {
    ("api.example.com", "A"): ["api.example.com. 60 IN A 192.0.2.80"],
    ("www.example.org", "A"): ["www.example.org. 60 IN A 192.0.2.81"],
}
#: The load's pace: queries a second, at most (sequential, each waits for its reply).
RATE = 150
#: Spill-overs: a Service with this annotation takes farther tiers until it has that many.
MIN_ENDPOINTS = "toposdns.io/topology-min-endpoints"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=75.0, help="load duration (10-600)")
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png")
    args = parser.parse_args(argv)
    if not 10 <= args.seconds <= 600:
        parser.error("--seconds must be between 10 and 600")
    return args


# --------------------------------------------------------------------------- the cluster


def snapshot(cluster: Cluster, clients: dict[str, Node], changed: bool) -> dict[str, Any]:
    """The served objects: every service topology-aware, one in four soft. `changed` adds what
    the per-hour panels count: an invalid policy (soft weights without topology keys), two
    PodLocators claiming one address, one PodLocator outside the believed namespace."""
    doc = snapshot_objects(cluster, True, clients)
    items: list[Any] = doc["items"]  # type: ignore[assignment]
    soft = {svc.name for svc in cluster.services[::4]}
    spilling = {svc.name for svc in cluster.services[2::4]}
    for item in items:
        if item["kind"] == "Service" and item["metadata"]["name"] in soft:
            item["metadata"]["annotations"] = dict(SOFT_WEIGHTS)
        elif item["kind"] == "Service" and item["metadata"]["name"] in spilling:
            item["metadata"]["annotations"] = {MIN_ENDPOINTS: "3"}
    if changed:
        bad = cluster.services[1]
        invalid = service_object(bad, topology=False, soft=True)
        invalid["metadata"]["name"] = "soft-without-keys"  # type: ignore[index]
        items.append(invalid)
        one, two = cluster.nodes[0], cluster.nodes[1]
        for name, node in (("claim-a", one), ("claim-b", two)):
            items.append(locator_object(name, "ns0", "10.250.0.1", node))
            items[-1]["cidrs"] = ["10.250.0.0/24"]
        stray = locator_object("stray", "ns0", "10.250.0.2", one)
        stray["metadata"]["namespace"] = "default"  # type: ignore[index]
        items.append(stray)
    return doc


# --------------------------------------------------------------------------- processes


@contextlib.contextmanager
def process(name: str, command: Sequence[str], ready: str) -> Iterator[ServerProcess]:
    """A child process, ready when `ready` (an http URL) answers 200; stopped on exit."""
    log(f"starting {name}")
    proc = ServerProcess(command)
    try:
        took = proc.wait_until(lambda: http_ok(ready), timeout=60, interval=0.3)
        log(f"{name} ready after {took:.1f}s")
        yield proc
    finally:
        proc.stop()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status) == 200
    except OSError:
        return False


def prometheus_config(workdir: Path, metrics_port: int) -> Path:
    config = {
        "global": {"scrape_interval": f"{SCRAPE_SECONDS}s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "kube-dns", "static_configs": [{"targets": [f"{HOST}:{metrics_port}"]}]}
        ],
    }
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


# --------------------------------------------------------------------------- the load


def queries(
    cluster: Cluster, ecs: list[str], rng: random.Random
) -> Iterator[tuple[str, dns.message.Message, bool]]:
    """Endless (source address, query, over TCP) of the mix the docstring names."""
    while True:
        svc = rng.choice(cluster.services)
        ep = rng.choice(svc.endpoints)
        roll = rng.random()
        source = rng.choice(PLACED)
        options: list[dns.edns.Option] = []
        if roll < 0.35:
            name, qtype = svc.fqdn, "A"
        elif roll < 0.45:
            name, qtype = svc.fqdn, "AAAA"
        elif roll < 0.5:
            name, qtype = f"_http._tcp.{svc.fqdn}", "SRV"
        elif roll < 0.55:
            name, qtype = f"{ep.ip.replace('.', '-')}.{svc.fqdn}", "A"
        elif roll < 0.65:
            name, qtype, source = svc.fqdn, "A", rng.choice(UNPLACED)
        elif roll < 0.75:
            name, qtype = svc.fqdn, "A"
            # Now and then a shorter prefix, which no locator's CIDR holds whole: unplaced.
            options = [dns.edns.ECSOption(rng.choice(ecs), rng.choice((32, 32, 32, 24, 16)))]
        elif roll < 0.85:
            name, qtype = f"missing-{rng.randrange(10_000)}.{svc.namespace}.svc.{ZONE}.", "A"
        elif roll < 0.92:
            name, qtype = rng.choice(["api.example.com.", "www.example.org."]), "A"
        else:
            name, qtype = f"nx-{rng.randrange(1000)}.example.com.", "A"
        query = dns.message.make_query(name, qtype, use_edns=0, payload=1232, options=options)
        yield source, query, rng.random() < 0.1


def load(
    port: int, cluster: Cluster, seconds: float, seed: int, halfway: Callable[[], None]
) -> int:
    """Send the mix for `seconds`, at most RATE a second; call `halfway()` once midway."""
    rng = random.Random(seed)
    ecs = list(ecs_clients(cluster))
    start = due = time.monotonic()
    sent = 0
    changed = False
    for source, query, tcp in queries(cluster, ecs, rng):
        now = time.monotonic()
        if now - start >= seconds:
            break
        if not changed and now - start >= seconds / 2:
            halfway()
            changed = True
        # Paced from the last send, not from the start: a stall is not made up in a burst.
        slot = max(due, now)
        time.sleep(slot - now)
        due = slot + 1 / RATE
        with contextlib.suppress(dns.exception.DNSException, OSError):
            if tcp:
                dns.query.tcp(query, HOST, port=port, timeout=1, source=source)
            else:
                dns.query.udp(query, HOST, port=port, timeout=1, source=source)
        sent += 1
    return sent


# --------------------------------------------------------------------------- the panels


@dataclass
class Series:
    legend: str
    times: list[float]
    values: list[float]


@dataclass
class Panel:
    row: str
    title: str
    unit: str
    series: list[Series]


def panels() -> list[tuple[str, dict[str, Any]]]:
    """(row title, panel) of every drawn panel of the dashboard, in order."""
    config_map = yaml.safe_load(DASHBOARD.read_text())
    ((_, text),) = config_map["data"].items()
    row = ""
    found = []
    for panel in json.loads(text)["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
        else:
            found.append((row, panel))
    return found


def rate_interval(step: int, scrape: int) -> str:
    """Grafana's `$__rate_interval`: max(step + scrape interval, 4 x scrape interval)."""
    return f"{max(step + scrape, 4 * scrape)}s"


def query_range(base: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode(
        {"query": expr, "start": start, "end": end, "step": f"{STEP_SECONDS}s"}
    )
    with urllib.request.urlopen(f"{base}/api/v1/query_range?{params}", timeout=10) as reply:
        body = json.loads(reply.read())
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {expr!r}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def legend(template: str, labels: dict[str, str]) -> str:
    """Grafana's legend format: `{{label}}` replaced by the series' label."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


def evaluate(base: str, origin: float, start: float, end: float) -> list[Panel]:
    """Every panel's every target over [start, end], times in seconds since `origin`."""
    interval = rate_interval(STEP_SECONDS, SCRAPE_SECONDS)
    drawn = []
    for row, raw in panels():
        series = []
        for target in raw.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", interval)
            for result in query_range(base, expr, start, end):
                points = [(float(t), float(v)) for t, v in result["values"]]
                times = [t - origin for t, _ in points]
                series.append(
                    Series(
                        legend(target.get("legendFormat", ""), result["metric"]),
                        times,
                        [v for _, v in points],
                    )
                )
        unit = raw.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        drawn.append(Panel(row, raw["title"], unit, series))
    return drawn


def draw(drawn: Sequence[Panel], out: Path, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 4
    rows = -(-len(drawn) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(16, 2.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, drawn, strict=False):
        # The row's first word (DNS, Topology) says which part of the dashboard it is from.
        ax.set_title(f"{panel.row.split()[0]} · {panel.title}", fontsize=9, loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if not panel.series:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            continue
        for series in panel.series[:8]:
            ax.plot(series.times, series.values, linewidth=1, label=series.legend or None)
        if panel.unit:
            ax.set_ylabel(panel.unit, fontsize=7)
        ax.set_ylim(bottom=0)
        labels = [s.legend for s in panel.series[:8]]
        if any(labels):
            columns = 2 if max(map(len, labels)) < 20 else 1
            ax.legend(fontsize=6, loc="upper left", ncol=columns, framealpha=0.6)
    for ax in list(axes.flat)[len(drawn) :]:
        ax.axis("off")
    fig.suptitle(f"toposdns dashboard: {subtitle}", fontsize=11)
    fig.supxlabel("seconds since the load began", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=60)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(PROMETHEUS).exists() and shutil.which("prometheus") is None:
        log(f"{PROMETHEUS} not found: install Debian's `prometheus` package")
        return 2
    import matplotlib  # noqa: F401  (fail before the run, not after it)

    cluster = generate_cluster(args.services, 5, 9, args.seed)
    clients = {address: cluster.nodes[i] for i, address in enumerate(PLACED)}
    clients |= ecs_clients(cluster)
    with tempfile.TemporaryDirectory(prefix="toposdns-dashboard-") as tmp:
        workdir = Path(tmp)
        snap = workdir / "snapshot.json"
        snap.write_text(json.dumps(snapshot(cluster, clients, changed=False)))

        def change() -> None:
            log("rewriting the snapshot: an invalid policy, a conflict, an ignored locator")
            tmp_snap = workdir / "snapshot.json.new"
            tmp_snap.write_text(json.dumps(snapshot(cluster, clients, changed=True)))
            tmp_snap.replace(snap)

        dns_port, http_port, prom_port = (
            free_port(socket.SOCK_DGRAM),
            free_port(),
            free_port(),
        )
        with (
            stub_upstream(UPSTREAM) as good,
            stub_upstream({}, mode="silent") as silent,
        ):
            serve = toposdns(
                "serve", "--snapshot", str(snap), "--listen", f"{HOST}:{dns_port}",
                "--http", f"{HOST}:{http_port}", "--zone", ZONE, "--pods", "insecure",
                "--ecs-trust", "127.0.0.0/8", "--locator-namespaces", "toposdns",
                "--upstream", f"{HOST}:{good.port},{HOST}:{silent.port}",
            )  # fmt: skip
            prom = [
                PROMETHEUS,
                f"--config.file={prometheus_config(workdir, http_port)}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address={HOST}:{prom_port}",
            ]
            base = f"http://{HOST}:{prom_port}"
            with (
                process("toposdns", serve, f"http://{HOST}:{http_port}/ready"),
                process("prometheus", prom, f"{base}/-/ready"),
            ):
                time.sleep(3 * SCRAPE_SECONDS)  # a few scrapes before the load
                start = time.time()
                log(f"load for {args.seconds:.0f}s from {len(PLACED + UNPLACED)} addresses")
                sent = load(dns_port, cluster, args.seconds, args.seed, change)
                end = time.time()
                time.sleep(3 * SCRAPE_SECONDS)  # the last scrapes
                log(f"sent {sent} queries; evaluating the panels")
                drawn = evaluate(base, start, start - 10, end + 2)
    for panel in drawn:
        log(f"{panel.title}: {len(panel.series)} series" + ("" if panel.series else " (EMPTY)"))
    subtitle = f"{args.seconds:.0f} s of mixed load, {sent} queries, {time.strftime('%Y-%m-%d')}"
    draw(drawn, args.out, subtitle)
    log(f"wrote {args.out} ({args.out.stat().st_size // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
