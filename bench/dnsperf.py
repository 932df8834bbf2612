"""dnsperf runs: one bounded run against a server on 127.0.0.1, its statistics parsed, and the
CPU used meanwhile by the server, by dnsperf and by everything else on the box.

dnsperf 2.10 has no percentile option; with `-v` it prints every response with its latency,
from which p50/p99/p99.9 are computed (lost queries count as infinitely slow).
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.harness import HOST, log, percentile


@dataclass
class PerfResult:
    qps: float
    run_s: float  # dnsperf's own run time: shorter than asked when -n ends the run
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


@dataclass
class CpuMark:
    """CPU counters at one moment: the server's, dnsperf's (reaped children) and the box's."""

    server: float
    children: float
    wall: float
    steal: int
    idle: int
    total: int

    @classmethod
    def now(cls, server_cpu: Callable[[], float]) -> CpuMark:
        # /proc/stat: user nice system idle iowait irq softirq steal (guest is in user/nice)
        vals = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(
            server=server_cpu(),
            children=usage.ru_utime + usage.ru_stime,
            wall=time.monotonic(),
            steal=vals[7] if len(vals) > 7 else 0,
            idle=vals[3] + vals[4],
            total=sum(vals[:8]),
        )


def command(port: int, qfile: Path, seconds: float, extra: Sequence[str]) -> list[str]:
    """dnsperf against 127.0.0.1:port for at most `seconds`, 2 s query timeout."""
    limit = ["-l", f"{seconds:g}"] if seconds > 0 else []
    return ["dnsperf", "-s", HOST, "-p", str(port), "-d", str(qfile), *limit, *extra, "-t", "2"]


def run(
    name: str,
    port: int,
    qfile: Path,
    seconds: float,
    extra: Sequence[str],
    server_cpu: Callable[[], float],
    verbose: bool = False,
    pin: Sequence[str] = (),
) -> PerfResult:
    """One dnsperf run; `server_cpu()` gives the server's CPU seconds so far; `pin` prefixes
    the command (taskset)."""
    argv = [*pin, *command(port, qfile, seconds, [*extra, *(["-v"] if verbose else [])])]
    log(f"{name}: {' '.join(argv)}")
    before = CpuMark.now(server_cpu)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30, check=False)
    after = CpuMark.now(server_cpu)
    if res.returncode != 0:
        raise RuntimeError(f"dnsperf failed ({res.returncode}): {res.stderr}{res.stdout[-2000:]}")
    out = parse(res.stdout.splitlines(), before, after, verbose)
    log(
        f"{name}: {out.qps:,.0f} qps, mean {out.mean_ms:.3f} ms, lost {out.lost}, "
        f"cpu server {out.server_cpu_pct:.0f}% dnsperf {out.dnsperf_cpu_pct:.0f}% "
        f"other {out.other_cpu_pct:.0f}% steal {out.steal_pct:.0f}%"
        + (f", p99 {out.p99_ms:.3f} ms" if out.p99_ms is not None else "")
    )
    return out


def read_output(lines: Iterable[str]) -> tuple[dict[str, str], list[float], int]:
    """dnsperf's statistics ("Queries sent" -> "1000"), and with `-v` the latency in ms of
    each response and the number of timeouts."""
    stats: dict[str, str] = {}
    latencies: list[float] = []
    timeouts = 0
    for line in lines:
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
    return stats, latencies, timeouts


def parse(lines: Iterable[str], before: CpuMark, after: CpuMark, verbose: bool) -> PerfResult:
    """dnsperf's report (and with `-v` its per-response lines) as a PerfResult."""
    stats, latencies, timeouts = read_output(lines)

    def num(key: str) -> float:
        return float(stats[key].split()[0])

    # "Average Latency (s):  0.000225 (min 0.000137, max 0.000323)"
    lat = stats["Average Latency (s)"].replace("(", " ").replace(")", " ").replace(",", " ")
    lat_parts = lat.split()
    wall = max(after.wall - before.wall, 1e-9)
    cpu_srv, cpu_perf = after.server - before.server, after.children - before.children
    ticks = max(1, after.total - before.total)
    steal = after.steal - before.steal
    busy = (ticks - (after.idle - before.idle) - steal) / ticks
    out = PerfResult(
        qps=num("Queries per second"),
        run_s=num("Run time (s)"),
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
        steal_pct=100 * steal / ticks,
        # Everything else that ran meanwhile (other jobs on the box): a noise indicator.
        other_cpu_pct=max(
            0.0, 100 * (os.cpu_count() or 1) * busy - 100 * (cpu_srv + cpu_perf) / wall
        ),
    )
    if verbose and latencies:
        # Lost queries count as infinitely slow, so a >1% loss shows up as p99 = inf.
        vals = sorted(latencies) + [float("inf")] * max(timeouts, out.lost)
        out.p50_ms = percentile(vals, 50)
        out.p99_ms = percentile(vals, 99)
        out.p999_ms = percentile(vals, 99.9)
    return out


def warm(port: int, qfile: Path, extra: Sequence[str] = (), pin: Sequence[str] = ()) -> None:
    """One pass over the query file, 20 queries outstanding."""
    argv = [*pin, *command(port, qfile, 0, ["-n", "1", "-q", "20", *extra])]
    subprocess.run(argv, capture_output=True, timeout=300, check=True)


def write_binary(path: Path, messages: Iterable[bytes]) -> None:
    """A query file for `dnsperf -B`: each message prefixed with its 2-byte length, as on TCP.
    dnsperf sends the bytes as they are, apart from the ID."""
    with open(path, "wb") as out:
        for wire in messages:
            out.write(len(wire).to_bytes(2, "big") + wire)
