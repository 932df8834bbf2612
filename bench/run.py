"""Benchmark toposdns against Knot DNS on the same set of headless-service records.

The script generates a deterministic cluster (namespaces, headless services, EndpointSlices,
PodLocators), writes it both as a toposdns snapshot (JSON) and as a Knot zone file, starts
each server on 127.0.0.1, checks that both give the same answers, and measures them with
dnsperf: maximum throughput (closed loop) and latency at a fixed query rate.

Run from the repository root:  python bench/run.py  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import random
import resource
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ZONE = "cluster.local"
TTL = 5
SOA_SERIAL = 1
REGION = "region-1"
ZONES = ("zone-a", "zone-b", "zone-c")
HOST = "127.0.0.1"
QTYPE_A = 1
QTYPE_SOA = 6


#: Every dnsperf query comes from this loopback address; the topology variant places it.
CLIENT = "127.0.0.2"
TOPOLOGY_KEYS = ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]
#: toposdns variants measured against the plain one in the same run.
VARIANTS = {"toposdns-topology": "topology filtering on", "toposdns-metrics": "metrics on"}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- cluster model


@dataclass(frozen=True)
class Node:
    name: str
    zone: str
    ip: str

    @property
    def labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "topology.kubernetes.io/zone": self.zone,
            "topology.kubernetes.io/region": REGION,
        }


@dataclass(frozen=True)
class Endpoint:
    ip: str
    node: Node
    pod: str


@dataclass
class Service:
    name: str
    namespace: str
    endpoints: list[Endpoint] = field(default_factory=list)

    @property
    def fqdn(self) -> str:
        return f"{self.name}.{self.namespace}.svc.{ZONE}."


@dataclass
class Cluster:
    nodes: list[Node]
    namespaces: list[str]
    services: list[Service]


def generate_cluster(n_services: int, n_namespaces: int, n_nodes: int, seed: int) -> Cluster:
    """Deterministic cluster: services round-robin over namespaces, 3-10 pods each."""
    rng = random.Random(seed)
    nodes = [
        Node(name=f"node-{i:02d}", zone=ZONES[i % len(ZONES)], ip=f"172.18.0.{10 + i}")
        for i in range(n_nodes)
    ]
    namespaces = [f"ns{i}" for i in range(n_namespaces)]
    # Each node owns a /16 of pod addresses (10.(64+i).0.0/16), allocated sequentially.
    pod_nets = [ipaddress.IPv4Network(f"10.{64 + i}.0.0/16") for i in range(n_nodes)]
    next_host = [1] * n_nodes
    services: list[Service] = []
    for i in range(n_services):
        svc = Service(name=f"svc{i}", namespace=namespaces[i % n_namespaces])
        for k in range(rng.randint(3, 10)):
            ni = rng.randrange(n_nodes)
            ip = str(pod_nets[ni].network_address + next_host[ni])
            next_host[ni] += 1
            svc.endpoints.append(Endpoint(ip=ip, node=nodes[ni], pod=f"{svc.name}-pod-{k}"))
        services.append(svc)
    return Cluster(nodes=nodes, namespaces=namespaces, services=services)


def snapshot_objects(cluster: Cluster, topology: bool = False) -> dict[str, object]:
    """The cluster as a Kubernetes `kind: List` of the objects toposdns reads.

    With `topology`, every service asks for [hostname, zone, "*"] and the benchmark's client
    address (CLIENT) is placed on the first node, so every answer goes through the filter.
    """
    items: list[dict[str, object]] = []
    for ns in cluster.namespaces:
        items.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for svc in cluster.services:
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": svc.name, "namespace": svc.namespace},
                "spec": {
                    "type": "ClusterIP",
                    "clusterIP": "None",
                    "clusterIPs": ["None"],
                    "selector": {"app": svc.name},
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 80}],
                    **({"topologyKeys": TOPOLOGY_KEYS} if topology else {}),
                },
            }
        )
        items.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{svc.name}-abcde",
                    "namespace": svc.namespace,
                    "labels": {"kubernetes.io/service-name": svc.name},
                },
                "addressType": "IPv4",
                "endpoints": [
                    {
                        "addresses": [ep.ip],
                        "nodeName": ep.node.name,
                        "zone": ep.node.zone,
                        "conditions": {"ready": True},
                        "targetRef": {"kind": "Pod", "namespace": svc.namespace, "name": ep.pod},
                    }
                    for ep in svc.endpoints
                ],
                "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
            }
        )
        for ep in svc.endpoints:
            items.append(
                {
                    "apiVersion": "toposdns.io/v1alpha1",
                    "kind": "PodLocator",
                    "metadata": {
                        "name": ep.pod,
                        "namespace": svc.namespace,
                        "labels": {"toposdns.io/locator": "pod"},
                    },
                    "addresses": [ep.ip],
                    "nodeName": ep.node.name,
                    "nodeLabels": ep.node.labels,
                }
            )
    for node in cluster.nodes:
        items.append(
            {
                "apiVersion": "toposdns.io/v1alpha1",
                "kind": "PodLocator",
                "metadata": {
                    "name": node.name,
                    "namespace": "kube-system",
                    "labels": {"toposdns.io/locator": "node"},
                },
                "addresses": [node.ip],
                "nodeName": node.name,
                "nodeLabels": node.labels,
            }
        )
    if topology:
        first = cluster.nodes[0]
        items.append(
            {
                "apiVersion": "toposdns.io/v1alpha1",
                "kind": "PodLocator",
                "metadata": {"name": "bench-client", "namespace": cluster.namespaces[0]},
                "addresses": [CLIENT],
                "nodeName": first.name,
                "nodeLabels": first.labels,
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def dashed(ip: str) -> str:
    return ip.replace(".", "-")


def srv_weight(n: int) -> int:
    """CoreDNS gives each of n equal-priority SRV records weight floor(100 / n)."""
    return 100 // n


def zone_text(cluster: Cluster, with_srv: bool) -> str:
    lines = [
        f"$ORIGIN {ZONE}.",
        f"$TTL {TTL}",
        f"@ {TTL} IN SOA ns.dns.{ZONE}. hostmaster.{ZONE}. {SOA_SERIAL} 7200 1800 86400 {TTL}",
        f"@ {TTL} IN NS ns.dns.{ZONE}.",
        f"ns.dns {TTL} IN A 127.0.0.1",
    ]
    for svc in cluster.services:
        for ep in svc.endpoints:
            lines.append(f"{svc.fqdn} {TTL} IN A {ep.ip}")
        if with_srv:
            weight = srv_weight(len(svc.endpoints))
            for ep in svc.endpoints:
                target = f"{dashed(ep.ip)}.{svc.fqdn}"
                lines.append(f"_http._tcp.{svc.fqdn} {TTL} IN SRV 0 {weight} 80 {target}")
                lines.append(f"{target} {TTL} IN A {ep.ip}")
    return "\n".join(lines) + "\n"


def knot_conf(workdir: Path, port: int, zonefile: Path) -> str:
    return f"""\
server:
    rundir: "{workdir / "knot-run"}"
    listen: {HOST}@{port}
    udp-workers: 1
    tcp-workers: 1
    background-workers: 1

log:
  - target: stderr
    any: warning

database:
    storage: "{workdir / "knot-db"}"

template:
  - id: default
    storage: "{workdir}"
    semantic-checks: off
    journal-content: none
    zonefile-sync: -1

zone:
  - domain: {ZONE}.
    file: "{zonefile}"
"""


def query_lines(cluster: Cluster, with_srv: bool, seed: int) -> list[str]:
    lines = [f"{svc.fqdn.rstrip('.')} A" for svc in cluster.services]
    if with_srv:
        lines += [f"_http._tcp.{svc.fqdn.rstrip('.')} SRV" for svc in cluster.services]
    random.Random(seed + 1).shuffle(lines)
    return lines


# --------------------------------------------------------------------------- processes


def dns_query(name: str, qtype: int, qid: int) -> bytes:
    header = struct.pack("!HHHHHH", qid, 0x0000, 1, 0, 0, 0)
    qname = b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split("."))
    return header + qname + b"\x00" + struct.pack("!HH", qtype, 1)


def answers(port: int, name: str = f"{ZONE}.", qtype: int = QTYPE_SOA) -> bool:
    """True if something on 127.0.0.1:port sends a DNS response to a UDP query."""
    qid = random.randrange(1 << 16)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(0.3)
        try:
            sock.sendto(dns_query(name, qtype, qid), (HOST, port))
            data, _ = sock.recvfrom(4096)
        except OSError:
            return False
    return len(data) >= 12 and struct.unpack("!H", data[:2])[0] == qid and bool(data[2] & 0x80)


def port_free(port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                return False
    return True


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user+sys) of pid and its live descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        total += cpu.get(p, 0.0)
        stack.extend(c for c, pp in parents.items() if pp == p)
    return total


class Server:
    """A server subprocess in its own session, always killed on exit."""

    def __init__(self, name: str, argv: Sequence[str], port: int, logfile: Path, cwd: Path):
        self.name, self.argv, self.port, self.logfile, self.cwd = name, argv, port, logfile, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float) -> None:
        if not port_free(self.port):
            raise RuntimeError(f"port {self.port} is already in use")
        log(f"starting {self.name}: {' '.join(self.argv)}")
        with open(self.logfile, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        t0 = time.monotonic()
        while time.monotonic() - t0 < ready_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            if answers(self.port):
                log(f"{self.name} answers after {time.monotonic() - t0:.1f}s")
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer within {ready_timeout}s:\n{self.tail()}")

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.proc.pid) if self.proc else 0.0

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is our child's pid
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


@contextmanager
def running(server: Server, ready_timeout: float) -> Iterator[Server]:
    try:
        server.start(ready_timeout)
        yield server
    finally:
        server.stop()


# --------------------------------------------------------------------------- dnsperf


@dataclass
class PerfResult:
    qps: float
    mean_ms: float
    min_ms: float
    max_ms: float
    stddev_ms: float
    sent: int
    completed: int
    lost: int
    rcodes: str
    server_cpu_pct: float
    dnsperf_cpu_pct: float
    steal_pct: float
    other_cpu_pct: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None


def cpu_ticks() -> tuple[int, int, int]:
    """(steal, idle, total) jiffies summed over all CPUs since boot, from /proc/stat."""
    vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    return (vals[7] if len(vals) > 7 else 0), vals[3] + vals[4], sum(vals[:8])


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    idx = min(len(sorted_vals) - 1, max(0, int(q * len(sorted_vals) + 0.5) - 1))
    return sorted_vals[idx]


def dnsperf(
    server: Server, qfile: Path, seconds: float, extra: Sequence[str], verbose: bool = False
) -> PerfResult:
    argv = ["dnsperf", "-s", HOST, "-p", str(server.port), "-d", str(qfile), "-l", str(seconds)]
    argv += ["-a", CLIENT]
    argv += [*extra, "-t", "2"] + (["-v"] if verbose else [])
    log(f"{server.name}: {' '.join(argv)}")
    cpu_srv0, cpu_perf0, t0 = server.cpu_seconds(), children_cpu(), time.monotonic()
    steal0, idle0, total0 = cpu_ticks()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=False)
    wall = time.monotonic() - t0
    cpu_srv, cpu_perf = server.cpu_seconds() - cpu_srv0, children_cpu() - cpu_perf0
    steal1, idle1, total1 = cpu_ticks()
    ticks = max(1, total1 - total0)
    busy_pct = 100 * (os.cpu_count() or 1) * (ticks - (idle1 - idle0) - (steal1 - steal0)) / ticks
    if res.returncode != 0:
        raise RuntimeError(f"dnsperf failed ({res.returncode}): {res.stderr}{res.stdout[-2000:]}")
    stats: dict[str, str] = {}
    latencies: list[float] = []
    timeouts = 0
    for line in res.stdout.splitlines():
        if line.startswith("> "):
            parts = line.split()
            if parts[1] == "T":
                timeouts += 1
            else:
                try:
                    latencies.append(float(parts[-1]) * 1000)
                except ValueError:
                    pass
        elif ":" in line and line.startswith("  "):
            key, _, val = line.strip().partition(":")
            stats[key] = val.strip()

    def num(key: str) -> float:
        return float(stats[key].split()[0])

    lat = stats["Average Latency (s)"]  # "0.000225 (min 0.000137, max 0.000323)"
    lat_parts = lat.replace("(", " ").replace(")", " ").replace(",", " ").split()
    out = PerfResult(
        qps=num("Queries per second"),
        mean_ms=float(lat_parts[0]) * 1000,
        min_ms=float(lat_parts[2]) * 1000,
        max_ms=float(lat_parts[4]) * 1000,
        stddev_ms=num("Latency StdDev (s)") * 1000,
        sent=int(num("Queries sent")),
        completed=int(num("Queries completed")),
        lost=int(num("Queries lost")),
        rcodes=stats.get("Response codes", ""),
        server_cpu_pct=100 * cpu_srv / wall,
        dnsperf_cpu_pct=100 * cpu_perf / wall,
        steal_pct=100 * (steal1 - steal0) / ticks,
        # Everything else that ran meanwhile (other jobs on the box): a noise indicator.
        other_cpu_pct=max(0.0, busy_pct - 100 * (cpu_srv + cpu_perf) / wall),
    )
    if verbose and latencies:
        # Lost queries count as infinitely slow, so a >1% loss shows up as p99 = inf.
        vals = sorted(latencies) + [float("inf")] * max(timeouts, out.lost)
        out.p50_ms = percentile(vals, 0.50)
        out.p99_ms = percentile(vals, 0.99)
        out.p999_ms = percentile(vals, 0.999)
    log(
        f"{server.name}: {out.qps:,.0f} qps, mean {out.mean_ms:.3f} ms, lost {out.lost}, "
        f"cpu server {out.server_cpu_pct:.0f}% dnsperf {out.dnsperf_cpu_pct:.0f}% "
        f"other {out.other_cpu_pct:.0f}% steal {out.steal_pct:.0f}%"
        + (f", p99 {out.p99_ms:.3f} ms" if out.p99_ms is not None else "")
    )
    return out


def warm(server: Server, qfile: Path) -> None:
    argv = ["dnsperf", "-s", HOST, "-p", str(server.port), "-d", str(qfile), "-n", "1"]
    subprocess.run(argv + ["-q", "20", "-t", "2"], capture_output=True, timeout=120, check=True)


# --------------------------------------------------------------------------- correctness


def dig_set(port: int, name: str, qtype: str) -> set[str]:
    argv = ["dig", f"@{HOST}", "-p", str(port), name, qtype, "+short", "+tries=2", "+time=2"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    return {line.strip() for line in res.stdout.splitlines() if line.strip()}


def verify(cluster: Cluster, servers: Sequence[Server], count: int, srv: bool, seed: int) -> int:
    """Compare answers of every server with the expected data; return number of mismatches."""
    rng = random.Random(seed + 2)
    sample = rng.sample(cluster.services, min(count, len(cluster.services)))
    bad = 0
    for svc in sample:
        checks: list[tuple[str, str, set[str]]] = [(svc.fqdn, "A", {ep.ip for ep in svc.endpoints})]
        if srv:
            w = srv_weight(len(svc.endpoints))
            want = {f"0 {w} 80 {dashed(ep.ip)}.{svc.fqdn}" for ep in svc.endpoints}
            checks.append((f"_http._tcp.{svc.fqdn}", "SRV", want))
        for name, qtype, want in checks:
            for server in servers:
                got = dig_set(server.port, name, qtype)
                if got != want:
                    bad += 1
                    log(f"MISMATCH {server.name} {name} {qtype}: got {sorted(got)}")
    log(f"verified {len(sample)} names on {', '.join(s.name for s in servers)}: {bad} mismatches")
    return bad


# --------------------------------------------------------------------------- main


@dataclass
class Summary:
    """Medians over the rounds of one server."""

    qps: float
    mean_ms: float
    server_cpu_pct: float
    dnsperf_cpu_pct: float
    qps_per_core: float
    fixed_qps: float
    p50_ms: float | None
    p99_ms: float | None
    lost_fixed: int
    steal_pct: float
    other_cpu_pct: float


def median_or_none(vals: Sequence[float | None]) -> float | None:
    known = [v for v in vals if v is not None]
    return statistics.median(known) if known else None


def summarize(runs: dict[str, list[PerfResult]]) -> Summary:
    mx, fx = runs["max"], runs["fixed"]
    return Summary(
        qps=statistics.median(r.qps for r in mx),
        mean_ms=statistics.median(r.mean_ms for r in mx),
        server_cpu_pct=statistics.median(r.server_cpu_pct for r in mx),
        dnsperf_cpu_pct=statistics.median(r.dnsperf_cpu_pct for r in mx),
        # Queries per second of server CPU time: comparable even when the box, not the
        # server, limits the max-QPS run (a server below ~95% CPU there is not saturated).
        qps_per_core=statistics.median(100 * r.qps / max(r.server_cpu_pct, 1e-9) for r in mx),
        fixed_qps=statistics.median(r.qps for r in fx),
        p50_ms=median_or_none([r.p50_ms for r in fx]),
        p99_ms=median_or_none([r.p99_ms for r in fx]),
        lost_fixed=sum(r.lost for r in fx),
        steal_pct=statistics.mean(r.steal_pct for r in mx + fx),
        other_cpu_pct=statistics.mean(r.other_cpu_pct for r in mx + fx),
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=30)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each dnsperf run")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (servers alternate); medians")
    ap.add_argument("--port-base", type=int, default=15353, help="knot: base, toposdns: base+1")
    ap.add_argument("--clients", type=int, default=1, help="dnsperf -c for the max-QPS run")
    ap.add_argument("--outstanding", type=int, default=100, help="dnsperf -q for max-QPS run")
    ap.add_argument("--rate", type=int, default=5000, help="fixed QPS for the latency run")
    ap.add_argument("--srv", action="store_true", help="also query _http._tcp SRV names")
    ap.add_argument("--verify", type=int, default=20, help="names to compare with dig")
    ap.add_argument(
        "--servers",
        default="knot,toposdns,toposdns-topology,toposdns-metrics",
        help="comma list of: knot, toposdns, toposdns-topology, toposdns-metrics",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("knotd", "dnsperf", "dig"):
        if shutil.which(tool) is None:
            log(f"{tool} not found (Debian packages: knot, dnsperf, bind9-dnsutils)")
            return 2
    wanted = [s.strip() for s in args.servers.split(",") if s.strip()]

    workdir = Path(tempfile.mkdtemp(prefix="toposdns-bench-"))
    log(f"work dir {workdir}")
    try:
        t0 = time.monotonic()
        cluster = generate_cluster(args.services, args.namespaces, args.nodes, args.seed)
        snapshot = workdir / "snapshot.json"
        snapshot.write_text(json.dumps(snapshot_objects(cluster), separators=(",", ":")))
        topo_snapshot = workdir / "snapshot-topology.json"
        topo_snapshot.write_text(
            json.dumps(snapshot_objects(cluster, topology=True), separators=(",", ":"))
        )
        zonefile = workdir / "cluster.local.zone"
        zonefile.write_text(zone_text(cluster, args.srv))
        for sub in ("knot-run", "knot-db"):
            (workdir / sub).mkdir()
        conf = workdir / "knot.conf"
        conf.write_text(knot_conf(workdir, args.port_base, zonefile))
        qfile = workdir / "queries.txt"
        qfile.write_text("\n".join(query_lines(cluster, args.srv, args.seed)) + "\n")
        n_ep = sum(len(s.endpoints) for s in cluster.services)
        log(
            f"generated {len(cluster.services)} services, {n_ep} endpoints, "
            f"{len(cluster.nodes)} nodes in {time.monotonic() - t0:.1f}s "
            f"(snapshot {snapshot.stat().st_size / 1e6:.1f} MB)"
        )
        known = {
            "knot": Server(
                "knot", ["knotd", "-c", str(conf)], args.port_base, workdir / "knot.log", workdir
            ),
            "toposdns": toposdns_server("toposdns", snapshot, args.port_base + 1, workdir),
            "toposdns-topology": toposdns_server(
                "toposdns-topology", topo_snapshot, args.port_base + 2, workdir),
            "toposdns-metrics": toposdns_server(
                "toposdns-metrics", snapshot, args.port_base + 3, workdir,
                "--http", f"{HOST}:{args.port_base + 4}"),
        }  # fmt: skip
        servers = [known[name] for name in wanted]
        runs: dict[str, dict[str, list[PerfResult]]] = {
            s.name: {"max": [], "fixed": []} for s in servers
        }
        with ExitStack() as stack:
            # All servers run for the whole benchmark (idle ones cost nothing) so that rounds
            # can alternate between them: on a VM with CPU steal this spreads the noise evenly.
            for server in servers:
                stack.enter_context(running(server, ready_timeout=120))
            mismatches = verify(cluster, servers, args.verify, args.srv, args.seed)
            for server in servers:
                warm(server, qfile)
            closed = ["-c", str(args.clients), "-q", str(args.outstanding)]
            fixed = ["-c", "1", "-q", "1000", "-Q", str(args.rate)]
            for rnd in range(args.rounds):
                log(f"round {rnd + 1}/{args.rounds}")
                for server in servers:
                    runs[server.name]["max"].append(dnsperf(server, qfile, args.seconds, closed))
                for server in servers:
                    res = dnsperf(server, qfile, args.seconds, fixed, verbose=True)
                    runs[server.name]["fixed"].append(res)
        report(args, cluster, runs, mismatches, n_ep)
        return 1 if mismatches else 0
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def toposdns_server(name: str, snapshot: Path, port: int, workdir: Path, *extra: str) -> Server:
    argv = [
        sys.executable, "-m", "toposdns", "serve", "--snapshot", str(snapshot),
        "--listen", f"{HOST}:{port}", "--zone", ZONE, "--ttl", str(TTL), *extra,
    ]  # fmt: skip
    return Server(name, argv, port, workdir / f"{name}.log", REPO_ROOT)


def machine() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model}


def fmt(v: float | None, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    return "inf" if v == float("inf") else format(v, spec)


def report(
    args: argparse.Namespace,
    cluster: Cluster,
    runs: dict[str, dict[str, list[PerfResult]]],
    mismatches: int,
    n_endpoints: int,
) -> None:
    summary = {name: summarize(r) for name, r in runs.items()}
    ratio: dict[str, float | None] = {}
    if "knot" in summary and "toposdns" in summary:
        k, t = summary["knot"], summary["toposdns"]
        ratio = {
            "qps": t.qps / k.qps,
            "mean_ms": t.mean_ms / k.mean_ms,
            "qps_per_core": t.qps_per_core / k.qps_per_core,
            "p99_ms": None,
        }
        if t.p99_ms is not None and k.p99_ms:
            ratio["p99_ms"] = t.p99_ms / k.p99_ms
    variants = {
        name: summary[name].qps / summary["toposdns"].qps
        for name in VARIANTS
        if name in summary and "toposdns" in summary
    }
    if args.json:
        doc = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(),
            "params": {
                "services": len(cluster.services),
                "endpoints": n_endpoints,
                "namespaces": len(cluster.namespaces),
                "nodes": len(cluster.nodes),
                "seconds": args.seconds,
                "rounds": args.rounds,
                "clients": args.clients,
                "outstanding": args.outstanding,
                "rate": args.rate,
                "srv": args.srv,
            },
            "mismatches": mismatches,
            "summary": {n: asdict(s) for n, s in summary.items()},
            "ratio_toposdns_over_knot": ratio,
            "qps_ratio_over_plain_toposdns": variants,
            "runs": {n: {k: [asdict(x) for x in v] for k, v in r.items()} for n, r in runs.items()},
        }
        print(json.dumps(doc, indent=2, default=str))
    out = sys.stderr if args.json else sys.stdout  # with --json the table goes to stderr
    print(
        f"\n{len(cluster.services)} headless services, {n_endpoints} endpoints; medians of "
        f"{args.rounds} rounds of {args.seconds:g}s; max: dnsperf -c {args.clients} "
        f"-q {args.outstanding}; latency: dnsperf -Q {args.rate}",
        file=out,
    )
    hdr = (
        f"{'server':<17} {'max QPS':>9} {'mean ms':>8} {'cpu srv/perf':>13} {'QPS/core':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'@QPS':>6} {'lost':>5} {'other':>6} {'steal':>6}"
    )
    print(hdr, file=out)
    print("-" * len(hdr), file=out)
    for name, s in summary.items():
        cpu = f"{s.server_cpu_pct:.0f}%/{s.dnsperf_cpu_pct:.0f}%"
        print(
            f"{name:<17} {s.qps:>9,.0f} {s.mean_ms:>8.3f} {cpu:>13} {s.qps_per_core:>9,.0f} "
            f"{fmt(s.p50_ms):>7} "
            f"{fmt(s.p99_ms):>7} {s.fixed_qps:>6,.0f} {s.lost_fixed:>5} "
            f"{s.other_cpu_pct:>5.0f}% {s.steal_pct:>5.0f}%",
            file=out,
        )
    if ratio:
        print(
            f"{'toposdns/knot':<17} {fmt(ratio['qps']):>9} {fmt(ratio['mean_ms'], '.2f'):>8} "
            f"{'':>13} {fmt(ratio['qps_per_core']):>9} {'':>7} {fmt(ratio['p99_ms'], '.2f'):>7}",
            file=out,
        )
    for name, value in variants.items():
        print(f"{name}: {value:.3f} x the plain toposdns QPS ({VARIANTS[name]})", file=out)
    print(f"correctness: {mismatches} mismatches over {args.verify} names per server", file=out)


if __name__ == "__main__":
    raise SystemExit(main())
