"""Server CPU per cache hit, through the real UDP path, robust to a busy machine.

Throughput on a shared machine measures the neighbours as much as the server. This measures
what a hit costs the server instead: the cluster, snapshots and query files of `bench/run.py`
(same flags), each server started as `bench/run.py` starts it, then many bursts: the server is
stopped (SIGSTOP), a burst of queries is queued on its socket from 127.0.0.2, the server is
resumed and answers the whole burst; its CPU time (as the scheduler counts it) over all bursts,
divided by the replies received, is its CPU per query. Every burst finds the same queue, however
loaded the machine is, so the figure moves little with load (CPU caches shared with busy
neighbours still add some). The servers of one case run side by side and take turns burst by
burst, so what load remains falls on each alike: compare them within a case.

Cases: `repeated` (each service's A name, no EDNS) on toposdns and its variants (metrics,
--loadbalance, topology filtering) and on Knot; `random-case` (the same names, each in four
random letter cases, as 0x20-randomizing resolvers ask: toposdns writes the cached reply, in
the case first asked, in each other one); `cookie` (the same names with a client COOKIE);
`ecs` (trusted Client Subnet, clients in 3 zones). Every name is asked twice before the
measured bursts, so every measured query is answered from the cache.

Run from the repository root:  python -m bench.hit_cpu  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import signal
import socket
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import dns.edns
import dns.message

from bench.harness import HOST, ServerProcess
from bench.queries import COOKIE, ecs_messages, repeated_queries
from bench.run import CLIENT, parse_args, prepare, running

#: (case, server) pairs measured, in this order.
CASES = (
    ("repeated", "knot"),
    ("repeated", "toposdns"),
    ("repeated", "toposdns-unbatched"),
    ("repeated", "toposdns-metrics"),
    ("repeated", "toposdns-loadbalance"),
    ("repeated", "toposdns-topology"),
    ("repeated", "toposdns-soft"),
    ("random-case", "knot"),
    ("random-case", "toposdns"),
    ("random-case", "toposdns-loadbalance"),
    ("cookie", "knot"),
    ("cookie", "toposdns"),
    ("cookie", "toposdns-unbatched"),
    ("ecs", "knot"),
    ("ecs", "toposdns-ecs"),
)
#: Queries per burst: well within the server socket's receive buffer.
BURST = 150


def burst(server: ServerProcess, client: socket.socket, port: int, queries: Sequence[bytes]) -> int:
    """Queue `queries` while the server is stopped, resume it; the replies received."""
    server.send_signal(signal.SIGSTOP)
    try:
        for query in queries:
            client.sendto(query, (HOST, port))
    finally:
        server.send_signal(signal.SIGCONT)
    got = 0
    try:
        while got < len(queries):
            client.recv(65535)
            got += 1
    except TimeoutError:
        pass
    return got


def cpu_seconds(server: ServerProcess) -> float:
    """CPU seconds the server's threads have run, as the scheduler counts them: nanoseconds
    (/proc/PID/task/TID/schedstat), where /proc/PID/stat counts 10 ms ticks given to whoever
    runs when one falls, which spreads a few hundred bursts' figure by ±15%."""
    total = 0
    for pid in server.processes():
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(stat.read_text().split()[0])
            except (OSError, ValueError, IndexError):  # a thread gone; no schedstat
                continue
    return total / 1e9 if total else server.cpu_seconds()


def measure(
    servers: Sequence[tuple[ServerProcess, int]],
    queries: Sequence[bytes],
    bursts: int,
    rounds: int,
) -> list[list[float]]:
    """CPU microseconds per reply of each server, one figure per round of `bursts` bursts.
    The servers take turns burst by burst, with the same queries: a neighbour's load falls on
    all of them alike, so their ratios hold better than their figures."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        client.bind((CLIENT, 0))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        client.settimeout(1)
        for server, port in servers:
            for _ in range(2):  # fill the caches: every measured query is a hit
                for start in range(0, len(queries), BURST):
                    burst(server, client, port, queries[start : start + BURST])
        rng = random.Random(1)
        figures: list[list[float]] = [[] for _ in servers]
        for _ in range(rounds):
            before = [cpu_seconds(server) for server, _ in servers]
            answered = [0] * len(servers)
            for _ in range(bursts):
                start = rng.randrange(len(queries) - BURST)
                for i, (server, port) in enumerate(servers):
                    answered[i] += burst(server, client, port, queries[start : start + BURST])
            for i, (server, _) in enumerate(servers):
                spent = cpu_seconds(server) - before[i]
                figures[i].append(1e6 * spent / max(answered[i], 1))
        return figures


def wire(name: str, cookie: bytes | None = None) -> bytes:
    """An A query for `name` as dnsperf sends it (RD set; with `cookie`, EDNS and a COOKIE)."""
    query = dns.message.make_query(name, "A")
    if cookie is not None:
        query.use_edns(0, payload=1232, options=[dns.edns.GenericOption(COOKIE, cookie)])
    return query.to_wire()


def random_case(name: str, rng: random.Random) -> str:
    """`name` with each letter in upper or lower case at random."""
    return "".join(rng.choice((c.lower(), c.upper())) for c in name)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bursts", type=int, default=300, help="bursts of 150 queries per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per server (median shown)")
    ap.add_argument("--port-base", type=int, default=15353)
    ap.add_argument("--servers", help="comma-separated subset of the servers in CASES")
    ours = ap.parse_args(argv)
    args = parse_args(["--scenarios", "repeated,ecs,cookie", "--port-base", str(ours.port_base)])
    wanted = set(ours.servers.split(",")) if ours.servers else None
    workdir = Path(tempfile.mkdtemp(prefix="toposdns-hit-cpu-"))
    try:
        setup = prepare(args, workdir)
        names = [name for name, _ in repeated_queries(setup.cluster, False, args.seed)]
        rng = random.Random(args.seed)
        queries = {
            "repeated": [wire(name) for name in names],
            # Four spellings of each name: the cached reply is in the first one asked.
            "random-case": [wire(random_case(name, rng)) for _ in range(4) for name in names],
            "cookie": [wire(name, setup.cookie) for name in names],
            "ecs": ecs_messages(setup.cluster, setup.clients, args.seed),
        }
        print(f"{'case':11} {'server':21} {'CPU µs per query':>17}  rounds", file=sys.stderr)
        for case in dict.fromkeys(case for case, _ in CASES):
            names = [n for c, n in CASES if c == case and (wanted is None or n in wanted)]
            with contextlib.ExitStack() as stack:
                servers = []
                for name in names:
                    command, port = setup.commands[name]
                    servers.append((stack.enter_context(running(name, command, port)), port))
                figures = measure(servers, queries[case], ours.bursts, ours.rounds)
            for name, rounds in zip(names, figures, strict=True):
                shown = ", ".join(f"{f:.2f}" for f in rounds)
                median = statistics.median(rounds)
                print(f"{case:11} {name:21} {median:17.2f}  {shown}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
