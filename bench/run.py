"""Benchmark toposdns against Knot DNS on the same records, in four scenarios.

The script generates a deterministic cluster (namespaces, headless services, EndpointSlices,
PodLocators), writes it both as a toposdns snapshot (JSON) and as a Knot zone file, starts
each server on 127.0.0.1, checks that they give the same answers, and measures them with
dnsperf, rounds alternating between the servers:

- repeated: the service names over and over (max throughput, and latency at a fixed rate),
  also with topology filtering on and with metrics on;
- distinct: first-time names as pods send them, mostly NXDOMAIN search-path names;
- ecs: every query with EDNS Client Subnet from a trusted source, clients in 3 zones;
- cookie: every query with a client COOKIE option.

With `--workers N` both servers use N cores: toposdns `--workers N`, Knot `udp-workers: N`
(and dnsperf 4 clients per worker, since the kernel sends each client's port to one worker);
`--server-cpus` and `--load-cpus` pin the servers and dnsperf to CPUs (taskset).

Run from the repository root:  python -m bench.run  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from bench import dnsperf
from bench.cluster import (
    TTL,
    ZONE,
    Cluster,
    Node,
    Service,
    ecs_clients,
    generate_cluster,
    knot_conf,
    snapshot_objects,
    srv_weight,
    tier_answers,
    topology_answer,
    zone_text,
)
from bench.dnsperf import PerfResult
from bench.harness import HOST, ServerProcess, log, machine, toposdns_command
from bench.queries import (
    COOKIE,
    DistinctNames,
    cookie_query,
    distinct_queries,
    ecs_messages,
    ecs_query,
    repeated_queries,
    text_file,
)

#: Every dnsperf query comes from this loopback address; the topology variant places it.
CLIENT = "127.0.0.2"
ECS_TRUST = "127.0.0.0/8"
SCENARIOS = ("repeated", "distinct", "ecs", "cookie")
#: toposdns variants measured against the plain one in the repeated scenario.
VARIANTS = {
    "toposdns-topology": "topology filtering on",
    "toposdns-soft": "soft topology on (weights 80,15,5 between the tiers)",
    "toposdns-metrics": "metrics on",
    "toposdns-loadbalance": "--loadbalance on",
    "toposdns-unbatched": "--udp-batch off",
}
SERVERS = ("knot", "toposdns", *VARIANTS, "toposdns-ecs")


@dataclass
class Scenario:
    """One load: its query files (one per round, or one for all), the dnsperf options, and the
    servers it runs against (Knot, the toposdns server it is compared with, variants)."""

    name: str
    title: str
    toposdns: str
    files: list[Path]
    extra: list[str] = field(default_factory=list)
    fixed: bool = False  # also a fixed-rate latency run
    variants: tuple[str, ...] = ()
    target: float = 0.8  # the target ratio to Knot
    names_per_file: int = 0

    def servers(self, running: Collection[str]) -> list[str]:
        return [s for s in ("knot", self.toposdns, *self.variants) if s in running]

    def file(self, rnd: int) -> Path:
        return self.files[rnd % len(self.files)]


# --------------------------------------------------------------------------- asking


def ask(port: int, query: dns.message.Message, source: str = CLIENT) -> tuple[str, frozenset[str]]:
    """(rcode, the rdata of the answer's records of the asked type); ("TIMEOUT", {}) if none.
    Over UDP, and again over TCP when the reply is truncated (as dig does)."""
    try:
        reply, _ = dns.query.udp_with_fallback(query, HOST, port=port, timeout=2, source=source)
    except (dns.exception.Timeout, OSError):
        return "TIMEOUT", frozenset()
    rdtype = query.question[0].rdtype
    found = frozenset(
        rd.to_text() for rrset in reply.answer if rrset.rdtype == rdtype for rd in rrset
    )
    return dns.rcode.to_text(reply.rcode()), found


def answers(port: int) -> bool:
    """True if something on 127.0.0.1:port answers a DNS query over UDP."""
    probe = dns.message.make_query(f"{ZONE}.", "SOA")
    try:
        dns.query.udp(probe, HOST, port=port, timeout=0.3)
    except (dns.exception.DNSException, OSError):
        return False
    return True


def port_free(port: int) -> bool:
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                return False
    return True


@contextmanager
def running(name: str, command: Sequence[str], port: int) -> Iterator[ServerProcess]:
    """A server process answering on `port`, stopped (SIGTERM, then SIGKILL) on exit."""
    if not port_free(port):
        raise RuntimeError(f"port {port} is already in use")
    log(f"starting {name}: {' '.join(command)}")
    proc = ServerProcess(command)
    try:
        took = proc.wait_until(lambda: answers(port), timeout=120, interval=0.2)
        log(f"{name} answers after {took:.1f}s")
        yield proc
    finally:
        proc.stop()


# --------------------------------------------------------------------------- correctness


def mismatch(what: str, got: object, want: object) -> int:
    log(f"MISMATCH {what}: got {got}, want {want}")
    return 1


def verify_repeated(
    cluster: Cluster, ports: dict[str, int], count: int, srv: bool, seed: int
) -> int:
    """Every server answers the generated addresses (the topology variant: those of the tier of
    CLIENT's node); with --srv the SRV records too. Returns the number of mismatches."""
    sample = random.Random(seed + 2).sample(cluster.services, min(count, len(cluster.services)))
    bad = 0
    for svc in sample:
        for name, port in ports.items():
            topology = name in ("toposdns-topology", "toposdns-soft")
            want = topology_answer(svc, cluster.nodes[0]) if topology else svc_ips(svc)
            got = ask(port, dns.message.make_query(svc.fqdn, "A"))
            if name == "toposdns-soft":  # any tier's own endpoints, by the rotation's turn
                tiers = tier_answers(svc, cluster.nodes[0])
                if got[0] != "NOERROR" or got[1] not in tiers:
                    bad += mismatch(f"{name} {svc.fqdn} A", got, tiers)
            elif got != ("NOERROR", want):
                bad += mismatch(f"{name} {svc.fqdn} A", got, want)
            if srv and not topology:
                weight = srv_weight(len(svc.endpoints))
                srvs = frozenset(f"0 {weight} 80 {svc.endpoint_name(ep)}" for ep in svc.endpoints)
                got = ask(port, dns.message.make_query(f"_http._tcp.{svc.fqdn}", "SRV"))
                if got != ("NOERROR", srvs):
                    bad += mismatch(f"{name} _http._tcp.{svc.fqdn} SRV", got, srvs)
    log(f"repeated: verified {len(sample)} names on {', '.join(ports)}: {bad} mismatches")
    return bad


def svc_ips(svc: Service) -> frozenset[str]:
    return frozenset(ep.ip for ep in svc.endpoints)


def verify_same(what: str, ports: dict[str, int], queries: Sequence[dns.message.Message]) -> int:
    """Every server gives the same rcode and answer as the first (Knot) to each query."""
    bad = 0
    reference, *others = ports.items()
    for query in queries:
        want = ask(reference[1], query)
        for name, port in others:
            got = ask(port, query)
            if got != want:
                bad += mismatch(f"{name} vs {reference[0]} {query.question[0]}", got, want)
    log(f"{what}: compared {len(queries)} queries on {', '.join(ports)}: {bad} mismatches")
    return bad


def verify_ecs(
    cluster: Cluster, clients: dict[str, Node], ports: dict[str, int], count: int, seed: int
) -> int:
    """toposdns answers the tier of the ECS address's node; Knot every address."""
    rng = random.Random(seed + 5)
    bad = 0
    for svc in rng.sample(cluster.services, min(count, len(cluster.services))):
        address = rng.choice(list(clients))
        for name, port in ports.items():
            want = svc_ips(svc) if name == "knot" else topology_answer(svc, clients[address])
            got = ask(port, ecs_query(svc.fqdn, address))
            if got != ("NOERROR", want):
                bad += mismatch(f"{name} {svc.fqdn} A with ECS {address}/32", got, want)
    log(f"ecs: verified {count} names on {', '.join(ports)}: {bad} mismatches")
    return bad


# --------------------------------------------------------------------------- set-up


@dataclass
class Setup:
    """Everything written to the work directory, and the servers to start."""

    cluster: Cluster
    clients: dict[str, Node]
    distinct: DistinctNames | None
    scenarios: list[Scenario]
    commands: dict[str, tuple[list[str], int]]  # server -> (command, DNS port)
    cookie: bytes


def prepare(args: argparse.Namespace, workdir: Path) -> Setup:
    """Generate the cluster, write its snapshots, zone, Knot config and query files."""
    t0 = time.monotonic()
    cluster = generate_cluster(args.services, args.namespaces, args.nodes, args.seed)
    clients = ecs_clients(cluster)
    distinct = None
    if "distinct" in args.scenarios:
        # The correctness check asks names of its own, so the measured ones stay first-time.
        verify = 10 * args.verify
        distinct = distinct_queries(cluster, args.distinct, args.rounds, verify, args.seed)
    snapshots = {
        "snapshot.json": snapshot_objects(cluster),
        "snapshot-topology.json": snapshot_objects(cluster, True, {CLIENT: cluster.nodes[0]}),
        "snapshot-soft.json": snapshot_objects(cluster, True, {CLIENT: cluster.nodes[0]}, True),
        "snapshot-ecs.json": snapshot_objects(cluster, True, clients),
    }
    for name, doc in snapshots.items():
        (workdir / name).write_text(json.dumps(doc, separators=(",", ":")))
    zonefile = workdir / f"{ZONE}.zone"
    zonefile.write_text(zone_text(cluster, args.srv, distinct.pods if distinct else ()))
    for sub in ("knot-run", "knot-db"):
        (workdir / sub).mkdir()
    conf = workdir / "knot.conf"
    conf.write_text(knot_conf(str(workdir), HOST, args.port_base, str(zonefile), args.workers))
    cookie = random.Random(args.seed + 6).randbytes(8)  # fixed per run, as dig's
    scenarios = write_scenarios(args, workdir, cluster, clients, distinct, cookie)
    log(
        f"generated {len(cluster.services)} services, {cluster.endpoints} endpoints, "
        f"{len(cluster.nodes)} nodes and the query files in {time.monotonic() - t0:.1f}s"
    )
    commands = server_commands(args, workdir, conf)
    return Setup(cluster, clients, distinct, scenarios, commands, cookie)


def write_scenarios(
    args: argparse.Namespace,
    workdir: Path,
    cluster: Cluster,
    clients: dict[str, Node],
    distinct: DistinctNames | None,
    cookie: bytes,
) -> list[Scenario]:
    repeated = workdir / "repeated.txt"
    repeated.write_text(text_file(repeated_queries(cluster, args.srv, args.seed)))
    scenarios = []
    for name in args.scenarios:
        if name == "repeated":
            scenarios.append(
                Scenario(name, "repeated names", "toposdns", [repeated], fixed=True,
                         variants=tuple(VARIANTS), target=0.9)
            )  # fmt: skip
        elif name == "distinct" and distinct is not None:
            files = []
            for rnd, queries in enumerate(distinct.rounds):
                files.append(workdir / f"distinct-{rnd + 1}.txt")
                files[-1].write_text(text_file(queries))
            # -n 1: one pass at most, so no name is asked twice; a fast server ends early.
            title = f"{args.distinct:,} distinct names a round"
            scenarios.append(
                Scenario(
                    name,
                    title,
                    "toposdns",
                    files,
                    ["-n", "1"],
                    target=0.6,
                    names_per_file=args.distinct,
                )  # fmt: skip
            )
        elif name == "ecs":
            ecs = workdir / "ecs.bin"
            dnsperf.write_binary(ecs, ecs_messages(cluster, clients, args.seed))
            title = "trusted ECS, clients in 3 zones"
            scenarios.append(Scenario(name, title, "toposdns-ecs", [ecs], ["-B"]))
        elif name == "cookie":
            extra = ["-E", f"{int(COOKIE)}:{cookie.hex()}"]
            scenarios.append(Scenario(name, "client COOKIE", "toposdns", [repeated], extra))
    return scenarios


def server_commands(
    args: argparse.Namespace, workdir: Path, conf: Path
) -> dict[str, tuple[list[str], int]]:
    """Each server's command line and DNS port (Knot on --port-base, toposdns on the next)."""
    base = args.port_base

    def toposdns(snapshot: str, port: int, *extra: str) -> tuple[list[str], int]:
        serve = ["serve", "--snapshot", str(workdir / snapshot), "--listen", f"{HOST}:{port}",
                 "--zone", ZONE, "--ttl", str(TTL), "--pods", "insecure",
                 "--workers", str(args.workers), *extra]  # fmt: skip
        return [*pinned(args.server_cpus), *toposdns_command(*serve)], port

    return {
        "knot": ([*pinned(args.server_cpus), "knotd", "-c", str(conf)], base),
        "toposdns": toposdns("snapshot.json", base + 1),
        "toposdns-topology": toposdns("snapshot-topology.json", base + 2),
        "toposdns-metrics": toposdns("snapshot.json", base + 3, "--http", f"{HOST}:{base + 4}"),
        "toposdns-ecs": toposdns("snapshot-ecs.json", base + 5, "--ecs-trust", ECS_TRUST),
        "toposdns-loadbalance": toposdns("snapshot.json", base + 6, "--loadbalance"),
        "toposdns-unbatched": toposdns("snapshot.json", base + 7, "--udp-batch", "off"),
        "toposdns-soft": toposdns("snapshot-soft.json", base + 8),
    }


def pinned(cpus: str | None) -> list[str]:
    """The prefix that runs a command on these CPUs only (taskset), or none."""
    return ["taskset", "-c", cpus] if cpus else []


# --------------------------------------------------------------------------- measuring

#: scenario -> server -> "max" / "fixed" -> one result per round
Runs = dict[str, dict[str, dict[str, list[PerfResult]]]]


def verify(args: argparse.Namespace, setup: Setup, ports: dict[str, int]) -> int:
    """The correctness checks of the chosen scenarios; the number of mismatches."""
    cluster, bad = setup.cluster, 0
    for scenario in setup.scenarios:
        on = {s: ports[s] for s in scenario.servers(ports)}
        if scenario.name == "repeated":
            bad += verify_repeated(cluster, on, args.verify, args.srv, args.seed)
        elif scenario.name == "distinct" and setup.distinct is not None and len(on) > 1:
            queries = [dns.message.make_query(n, t) for n, t in setup.distinct.verify]
            bad += verify_same("distinct", on, queries)
        elif scenario.name == "ecs":
            bad += verify_ecs(cluster, setup.clients, on, args.verify, args.seed)
        elif scenario.name == "cookie" and len(on) > 1:
            services = random.Random(args.seed + 7).sample(cluster.services, args.verify)
            queries = [cookie_query(svc.fqdn, setup.cookie) for svc in services]
            bad += verify_same("cookie", on, queries)
    return bad


def measure(
    args: argparse.Namespace,
    scenarios: list[Scenario],
    procs: dict[str, ServerProcess],
    ports: dict[str, int],
) -> Runs:
    """Warm every server, then the rounds: in each, every scenario runs on each of its servers
    in turn (max throughput, then fixed rate where the scenario has it)."""
    runs: Runs = {
        s.name: {srv: {"max": [], "fixed": []} for srv in s.servers(ports)} for s in scenarios
    }
    pin = pinned(args.load_cpus)
    for scenario in scenarios:
        if scenario.name != "distinct":  # first-time names must stay first-time
            for server in scenario.servers(ports):
                warm = ["-a", CLIENT, *scenario.extra]
                dnsperf.warm(ports[server], scenario.file(0), warm, pin)
    closed = ["-c", str(args.clients), "-q", str(args.outstanding)]
    fixed = [
        "-c",
        "1" if args.workers == 1 else str(args.clients),
        "-q",
        "1000",
        "-Q",
        str(args.rate),
    ]
    for rnd in range(args.rounds):
        log(f"round {rnd + 1}/{args.rounds}")
        for scenario in scenarios:
            kinds = [("max", closed, False)] + ([("fixed", fixed, True)] if scenario.fixed else [])
            for kind, load, verbose in kinds:
                for server in scenario.servers(ports):
                    result = dnsperf.run(
                        f"{scenario.name}/{server}", ports[server], scenario.file(rnd),
                        args.seconds, ["-a", CLIENT, *scenario.extra, *load],
                        procs[server].cpu_seconds, verbose, pin,
                    )  # fmt: skip
                    runs[scenario.name][server][kind].append(result)
    return runs


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of: "
                    + ", ".join(SCENARIOS))  # fmt: skip
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=30)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each dnsperf run")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (servers alternate); medians")
    ap.add_argument("--distinct", type=int, default=200_000, help="distinct queries per round")
    ap.add_argument("--port-base", type=int, default=15353, help="knot: base, toposdns: base+1..5")
    ap.add_argument("--clients", type=int, help="dnsperf -c for the max-QPS run (default 1, "
                    "4 per worker with --workers)")  # fmt: skip
    ap.add_argument("--outstanding", type=int, default=100, help="dnsperf -q for max-QPS run")
    ap.add_argument("--rate", type=int, default=5000, help="fixed QPS for the latency run")
    ap.add_argument("--srv", action="store_true", help="also query _http._tcp SRV names")
    ap.add_argument("--verify", type=int, default=20, help="names to compare per scenario")
    ap.add_argument("--servers", default=",".join(SERVERS), help="comma list of: "
                    + ", ".join(SERVERS))  # fmt: skip
    ap.add_argument("--workers", type=int, default=1, help="toposdns --workers N, Knot "
                    "udp-workers: N (default 1)")  # fmt: skip
    ap.add_argument("--server-cpus", metavar="LIST", help="run the servers on these CPUs (taskset)")
    ap.add_argument("--load-cpus", metavar="LIST", help="run dnsperf on these CPUs (taskset)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--json", action="store_true", help="print results as JSON on stdout")
    args = ap.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    for value, known, flag in ((args.scenarios, SCENARIOS, "--scenarios"),
                               (args.servers, SERVERS, "--servers")):  # fmt: skip
        if unknown := set(value) - set(known):
            ap.error(f"{flag}: unknown {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    if min(args.services, args.namespaces, args.nodes, args.rounds, args.distinct) < 1:
        ap.error("sizes and --rounds must be positive")
    args.verify = min(args.verify, args.services)
    if args.workers < 1:
        ap.error("--workers must be at least 1")
    if args.clients is None:
        args.clients = 1 if args.workers == 1 else 4 * args.workers
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("knotd", "dnsperf"):
        if shutil.which(tool) is None:
            log(f"{tool} not found (Debian packages: knot, dnsperf)")
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-bench-"))
    log(f"work dir {workdir}")
    try:
        setup = prepare(args, workdir)
        needed = {s for scenario in setup.scenarios for s in scenario.servers(SERVERS)}
        names = [s for s in SERVERS if s in needed and s in args.servers]
        ports = {name: setup.commands[name][1] for name in names}
        with ExitStack() as stack:
            # All servers run for the whole benchmark (idle ones cost nothing) so that rounds
            # can alternate between them: on a VM with CPU steal this spreads the noise evenly.
            procs = {
                name: stack.enter_context(running(name, *setup.commands[name])) for name in names
            }
            mismatches = verify(args, setup, ports)
            runs = measure(args, setup.scenarios, procs, ports)
        report(args, setup, runs, mismatches)
        return 1 if mismatches else 0
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- report


@dataclass
class Summary:
    """Medians over the rounds of one server in one scenario."""

    qps: float
    run_s: float
    mean_ms: float
    server_cpu_pct: float
    dnsperf_cpu_pct: float
    qps_per_core: float
    lost: int
    steal_pct: float
    other_cpu_pct: float
    fixed_qps: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    lost_fixed: int = 0


def median_or_none(vals: Sequence[float | None]) -> float | None:
    known = [v for v in vals if v is not None]
    return statistics.median(known) if known else None


def summarize(runs: dict[str, list[PerfResult]]) -> Summary:
    mx, fx = runs["max"], runs["fixed"]
    out = Summary(
        qps=statistics.median(r.qps for r in mx),
        run_s=statistics.median(r.run_s for r in mx),
        mean_ms=statistics.median(r.mean_ms for r in mx),
        server_cpu_pct=statistics.median(r.server_cpu_pct for r in mx),
        dnsperf_cpu_pct=statistics.median(r.dnsperf_cpu_pct for r in mx),
        # Queries per second of server CPU time: comparable even when the box, not the
        # server, limits the max-QPS run (a server below ~95% CPU there is not saturated).
        qps_per_core=statistics.median(100 * r.qps / max(r.server_cpu_pct, 1e-9) for r in mx),
        lost=sum(r.lost for r in mx),
        steal_pct=statistics.mean(r.steal_pct for r in mx + fx),
        other_cpu_pct=statistics.mean(r.other_cpu_pct for r in mx + fx),
    )
    if fx:
        out.fixed_qps = statistics.median(r.qps for r in fx)
        out.p50_ms = median_or_none([r.p50_ms for r in fx])
        out.p99_ms = median_or_none([r.p99_ms for r in fx])
        out.lost_fixed = sum(r.lost for r in fx)
    return out


@dataclass
class Outcome:
    """One scenario's summaries, and toposdns's ratio to Knot."""

    scenario: Scenario
    servers: dict[str, Summary]

    @property
    def toposdns(self) -> Summary | None:
        return self.servers.get(self.scenario.toposdns)

    @property
    def knot(self) -> Summary | None:
        return self.servers.get("knot")

    def ratio(self) -> float | None:
        return self.toposdns.qps / self.knot.qps if self.toposdns and self.knot else None

    def variants(self) -> dict[str, float]:
        """Each variant's QPS over the plain toposdns server's."""
        base = self.toposdns
        return {
            v: self.servers[v].qps / base.qps
            for v in self.scenario.variants
            if base and v in self.servers
        }

    def doc(self) -> dict[str, object]:
        return {
            "title": self.scenario.title,
            "toposdns": self.scenario.toposdns,
            "target": self.scenario.target,
            "ratio_qps": self.ratio(),
            "variants_over_plain": self.variants(),
            "summary": {name: asdict(s) for name, s in self.servers.items()},
        }


def fmt(v: float | None, spec: str = ".3f") -> str:
    if v is None:
        return "-"
    return "inf" if v == float("inf") else format(v, spec)


def report(args: argparse.Namespace, setup: Setup, runs: Runs, mismatches: int) -> None:
    outcomes = [
        Outcome(s, {srv: summarize(r) for srv, r in runs[s.name].items()}) for s in setup.scenarios
    ]
    cluster = setup.cluster
    if args.json:
        doc = {
            **machine(),
            "params": {k: v for k, v in vars(args).items() if k not in ("json", "keep")},
            "services": len(cluster.services),
            "endpoints": cluster.endpoints,
            "mismatches": mismatches,
            "scenarios": {o.scenario.name: o.doc() for o in outcomes},
            "runs": {
                scenario: {srv: {k: [asdict(r) for r in v] for k, v in by.items()}
                           for srv, by in servers.items()}
                for scenario, servers in runs.items()
            },
        }  # fmt: skip
        print(json.dumps(doc, indent=2))
    out = sys.stderr if args.json else sys.stdout  # with --json the tables go to stderr
    print(
        f"\n{len(cluster.services)} headless services, {cluster.endpoints} endpoints; medians "
        f"of {args.rounds} rounds of {args.seconds:g}s; max: dnsperf -c {args.clients} "
        f"-q {args.outstanding}; latency: dnsperf -Q {args.rate}; {args.workers} worker(s) "
        f"each (toposdns --workers, Knot udp-workers)",
        file=out,
    )
    print(detail_table(outcomes), file=out)
    print(summary_table(outcomes), file=out)
    print(f"correctness: {mismatches} mismatches", file=out)


def detail_table(outcomes: Sequence[Outcome]) -> str:
    hdr = (
        f"{'scenario':<9} {'server':<17} {'max QPS':>9} {'run s':>6} {'mean ms':>8} "
        f"{'cpu srv/perf':>13} {'QPS/core':>9} {'p50 ms':>7} {'p99 ms':>7} {'@QPS':>6} "
        f"{'lost':>5} {'other':>6} {'steal':>6}"
    )
    lines = [hdr, "-" * len(hdr)]
    for outcome in outcomes:
        for name, s in outcome.servers.items():
            cpu = f"{s.server_cpu_pct:.0f}%/{s.dnsperf_cpu_pct:.0f}%"
            lines.append(
                f"{outcome.scenario.name:<9} {name:<17} {s.qps:>9,.0f} {s.run_s:>6.1f} "
                f"{s.mean_ms:>8.3f} {cpu:>13} {s.qps_per_core:>9,.0f} {fmt(s.p50_ms):>7} "
                f"{fmt(s.p99_ms):>7} {fmt(s.fixed_qps, ',.0f'):>6} {s.lost + s.lost_fixed:>5} "
                f"{s.other_cpu_pct:>5.0f}% {s.steal_pct:>5.0f}%"
            )
    return "\n".join(lines)


def summary_table(outcomes: Sequence[Outcome]) -> str:
    lines = ["", f"{'scenario':<36} {'toposdns':>9} {'Knot':>9} {'ratio':>6} {'target':>7}"]
    notes = []
    for o in outcomes:
        topo, knot = o.toposdns, o.knot
        lines.append(
            f"{o.scenario.title:<36} {fmt(topo.qps if topo else None, ',.0f'):>9} "
            f"{fmt(knot.qps if knot else None, ',.0f'):>9} {fmt(o.ratio(), '.2f'):>6} "
            f"{'>= ' + format(o.scenario.target, '.1f'):>7}"
        )
        for name, value in o.variants().items():
            notes.append(f"{name}: {value:.3f} x the plain toposdns QPS ({VARIANTS[name]})")
        if topo and topo.p99_ms is not None:
            notes.append(
                f"{o.scenario.title}: p99 at {fmt(topo.fixed_qps, ',.0f')} QPS: toposdns "
                f"{fmt(topo.p99_ms)} ms, Knot {fmt(knot.p99_ms if knot else None)} ms"
            )
        if o.scenario.names_per_file and topo:
            notes.append(
                f"{o.scenario.title}: no name asked twice (dnsperf -n 1); a run lasted "
                f"{topo.run_s:.1f} s on toposdns, {fmt(knot.run_s if knot else None, '.1f')} s "
                "on Knot"
            )
    return "\n".join(lines + notes)


if __name__ == "__main__":
    raise SystemExit(main())
