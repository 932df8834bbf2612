"""What a Corefile with several server blocks and plugins before `kubernetes` costs on cluster
names, against the same server with none.

Two toposdns servers answer the same generated cluster (bench/cluster.py) in one process each:
`plain` from flags, and `chain` from a Corefile whose kubernetes block also holds `hosts`,
`template` and (where this tree has it) `rewrite`, beside two more server blocks (a stub domain
that forwards, and a zone answered by a template). dnsperf asks both, alternately, the repeated
cluster names of `python -m bench.run`; the table gives each round's QPS and server CPU per
query, and the ratio of the medians.

Run from the repository root:  python -m bench.chain_cost  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

import dns.message

from bench import dnsperf
from bench.cluster import TTL, ZONE, generate_cluster, snapshot_objects
from bench.harness import HOST, log, machine, toposdns_command
from bench.queries import repeated_queries, text_file
from bench.run import CLIENT, ask, running
from toposdns.corefile import DIRECTIVES

#: The plugins before `kubernetes` in the chain Corefile, with what they hold: names none of
#: the measured queries asks, so that each is asked and passes every query on.
CHAIN_PLUGINS = """\
    hosts {{
        192.0.2.1 node-1
        192.0.2.2 node-2
        fallthrough
    }}
    template ANY ANY internal.cloudapp.net {{
        match "^(?:[^.]+\\.){{4,}}internal\\.cloudapp\\.net\\.$"
        rcode NXDOMAIN
        fallthrough
    }}
"""
REWRITE = "    rewrite name exact old-name.{zone} web.default.svc.{zone}\n"


def chain_corefile(port: int, snapshot: Path) -> str:
    """The kubernetes block with hosts, template (and rewrite), and two more server blocks."""
    rewrite = REWRITE.format(zone=ZONE) if "rewrite" in DIRECTIVES else ""
    return f""".:{port} {{
    bind {HOST}
    errors
    kubernetes {ZONE} {{
        pods insecure
        ttl {TTL}
    }}
{rewrite}{CHAIN_PLUGINS.format()}    toposdns {{
        snapshot {snapshot}
        workers 1
    }}
}}
consul.local:{port} {{
    errors
    forward . 127.0.0.1:9
}}
example.org:{port} {{
    template IN A example.org {{
        answer "{{{{ .Name }}}} 60 IN A 192.0.2.53"
    }}
}}
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--services", type=int, default=1000)
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each dnsperf run")
    ap.add_argument("--rounds", type=int, default=5, help="rounds, the servers alternating")
    ap.add_argument("--port-base", type=int, default=15400)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--outstanding", type=int, default=100)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if shutil.which("dnsperf") is None:
        log("dnsperf not found (Debian package: dnsperf)")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-chain-"))
    try:
        cluster = generate_cluster(args.services, args.namespaces, args.nodes, args.seed)
        snapshot = workdir / "snapshot.json"
        snapshot.write_text(json.dumps(snapshot_objects(cluster), separators=(",", ":")))
        queries = workdir / "repeated.txt"
        queries.write_text(text_file(repeated_queries(cluster, False, args.seed)))
        plain_port, chain_port = args.port_base, args.port_base + 1
        corefile = workdir / "Corefile"
        corefile.write_text(chain_corefile(chain_port, snapshot))
        plain = [
            *toposdns_command("serve", "--snapshot", str(snapshot), "--listen",
                              f"{HOST}:{plain_port}", "--zone", ZONE, "--ttl", str(TTL),
                              "--pods", "insecure", "--workers", "1"),
        ]  # fmt: skip
        chained = [*toposdns_command("-conf", str(corefile))]
        results: dict[str, list[dnsperf.PerfResult]] = {"plain": [], "chain": []}
        with ExitStack() as stack:
            procs = {
                "plain": (stack.enter_context(running("plain", plain, plain_port)), plain_port),
                "chain": (stack.enter_context(running("chain", chained, chain_port)), chain_port),
            }
            mismatches = 0
            for svc in cluster.services[:50]:  # both answer the cluster's names alike
                query = dns.message.make_query(svc.fqdn, "A")
                answers = {name: ask(port, query) for name, (_, port) in procs.items()}
                if answers["plain"] != answers["chain"] or answers["plain"][0] != "NOERROR":
                    log(f"MISMATCH {svc.fqdn}: {answers}")
                    mismatches += 1
            for _, port in procs.values():
                dnsperf.warm(port, queries, ["-a", CLIENT])
            load = ["-a", CLIENT, "-c", str(args.clients), "-q", str(args.outstanding)]
            for rnd in range(args.rounds):
                log(f"round {rnd + 1}/{args.rounds}")
                for name, (proc, port) in procs.items():
                    results[name].append(
                        dnsperf.run(name, port, queries, args.seconds, load, proc.cpu_seconds)
                    )
        report(results)
        return 1 if mismatches else 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def report(results: dict[str, list[dnsperf.PerfResult]]) -> None:
    """Each round's QPS and CPU per query, and the medians' ratio."""
    print(f"\nmachine: {machine()}")
    print("\n| round | plain QPS | chain QPS | plain µs CPU/query | chain µs CPU/query |")
    print("|---:|---:|---:|---:|---:|")
    for rnd, (plain, chain) in enumerate(zip(results["plain"], results["chain"], strict=True)):
        print(
            f"| {rnd + 1} | {plain.qps:,.0f} | {chain.qps:,.0f} | {cpu_per_query(plain):.1f} "
            f"| {cpu_per_query(chain):.1f} |"
        )
    medians = {name: statistics.median(r.qps for r in runs) for name, runs in results.items()}
    print(f"\nmedian QPS: plain {medians['plain']:,.0f}, chain {medians['chain']:,.0f}")
    print(f"chain / plain: {medians['chain'] / medians['plain']:.3f}")


def cpu_per_query(result: dnsperf.PerfResult) -> float:
    """The server's CPU per completed query, in microseconds."""
    seconds = result.server_cpu_pct / 100 * result.run_s
    return 1e6 * seconds / max(result.completed, 1)


if __name__ == "__main__":
    raise SystemExit(main())
