"""What `/metrics` scrapes cost while the reply cache is full, and what they do to DNS latency.

Starts `toposdns serve --http` on the benchmark cluster, fills its reply cache with first-time
names (one dnsperf pass over `--names` distinct names), then measures:

1. the time of one scrape (`--scrapes` GETs of /metrics, one after another: median and max);
2. DNS latency at a fixed rate (`dnsperf -Q RATE -v`, the repeated service names) with no
   scraper, then with `--scrapers` threads scraping /metrics back to back: p50/p99 of each,
   and how many scrapes the threads made.

Run from the repository root:  python -m bench.scrape  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench import dnsperf
from bench.cluster import ZONE, generate_cluster, snapshot_objects
from bench.harness import HOST, free_port, log, machine, toposdns_command
from bench.queries import distinct_queries, repeated_queries, text_file
from bench.run import running


def scrape(port: int) -> float:
    """One GET of /metrics; its seconds."""
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10) as reply:
        reply.read()
    return time.perf_counter() - started


def scrapers(
    port: int, count: int, stop: threading.Event
) -> tuple[list[threading.Thread], list[int]]:
    """`count` threads scraping back to back until `stop`; the list counts their scrapes."""
    done = [0] * count

    def loop(index: int) -> None:
        while not stop.is_set():
            scrape(port)
            done[index] += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, done


def latency(name: str, port: int, qfile: Path, rate: int, seconds: float) -> dnsperf.PerfResult:
    extra = ["-c", "1", "-q", "1000", "-Q", str(rate)]
    return dnsperf.run(name, port, qfile, seconds, extra, lambda: 0.0, verbose=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--names", type=int, default=100_000, help="distinct names filling the cache")
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--scrapers", type=int, default=4)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="toposdns-scrape-"))
    cluster = generate_cluster(args.services, 20, 30, 42)
    (workdir / "snapshot.json").write_text(json.dumps(snapshot_objects(cluster)))
    fill = workdir / "distinct.txt"
    fill.write_text(text_file(distinct_queries(cluster, args.names, 1, 0, 42).rounds[0]))
    repeated = workdir / "repeated.txt"
    repeated.write_text(text_file(repeated_queries(cluster, False, 42)))
    port, http = free_port(), free_port()
    serve = toposdns_command(
        "serve", "--snapshot", str(workdir / "snapshot.json"), "--listen", f"{HOST}:{port}",
        "--zone", ZONE, "--http", f"{HOST}:{http}", "--workers", "1",
    )  # fmt: skip
    with running("toposdns", serve, port):
        dnsperf.warm(port, repeated)
        dnsperf.run("fill", port, fill, 0, ["-n", "1", "-c", "1", "-q", "100"], lambda: 0.0)
        times = sorted(scrape(http) for _ in range(args.scrapes))
        quiet = latency("no scraper", port, repeated, args.rate, args.seconds)
        stop = threading.Event()
        threads, done = scrapers(http, args.scrapers, stop)
        try:
            busy = latency(f"{args.scrapers} scrapers", port, repeated, args.rate, args.seconds)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=15)
    result = {
        "machine": machine(),
        "cached_names": args.names,
        "scrape_ms": {"median": statistics.median(times) * 1e3, "max": times[-1] * 1e3},
        "p99_ms": {"no scraper": quiet.p99_ms, f"{args.scrapers} scrapers": busy.p99_ms},
        "p50_ms": {"no scraper": quiet.p50_ms, f"{args.scrapers} scrapers": busy.p50_ms},
        "scrapes_per_second": sum(done) / args.seconds,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        log(
            f"one scrape with {args.names:,} first-time names cached: median "
            f"{result['scrape_ms']['median']:.1f} ms, max {result['scrape_ms']['max']:.1f} ms"
        )
        log(f"DNS at {args.rate} QPS, p50/p99: {quiet.p50_ms:.3f}/{quiet.p99_ms:.3f} ms alone, "
            f"{busy.p50_ms:.3f}/{busy.p99_ms:.3f} ms with {args.scrapers} scrapers "
            f"({result['scrapes_per_second']:.0f} scrapes/s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
