"""Where a toposdns server's startup CPU went, by phase, from a py-spy recording.

    py-spy record --subprocesses --rate 100 --format raw -o /tmp/startup.raw -- \\
        python -m bench.workers --workers 1 --placement pods --nodes 5000 --locators 150000 \\
        --services 10000 --slices 10000 --toposdns-arg=--startup-timeout=60
    python -m bench.startup_phases /tmp/startup.raw [PID]

Reads py-spy's raw (collapsed) stacks, keeps those of the `toposdns serve` process (of PID,
when given: a `--workers 1,2` run has two), leaves out idle samples (the event loop polling,
executor threads waiting) and those answering queries after ready, and prints each phase's
share of the rest, then the 25 busiest lines. Sampled wall time on a busy machine: the shares
are what to compare, not the totals.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

#: Phases in the order they are matched: a sample counts for the first whose frame it holds.
PHASES = (
    ("imports", ("_find_and_load",)),
    ("decoding pages (orjson, msgspec)", ("decode (toposdns/kube/client.py", "decode_page (")),
    ("converting EndpointSlices", ("_endpoint_slice (", "_common_endpoint")),
    ("converting PodLocators", ("_common_pod_locator", "_pod_locator (")),
    ("converting Services", ("_service (",)),
    # Compiled, the converters leave no frames of their own: their callers' and those they call.
    ("converting (compiled: every kind)", ("KubeSource.convert", "PodLocator.__", "labels_with")),
    ("indexing (replace_all)", ("replace_all",)),
    ("building snapshots", ("StoreBuilder.snapshot",)),
    ("DNS programming latency", ("time_programming",)),
    ("HTTP requests and reading (aiohttp)", ("aiohttp", "Reflector.request")),
    ("the list loop (freeing each page, per-object calls)", ("Reflector.list",)),
)
IDLE = ("_worker (concurrent/futures/thread.py:81)", "Runner.run (asyncio/runners.py:118)")
ANSWERING = ("UdpProtocol", "TcpProtocol", "Responder.", "HttpServer", "RequestHandler")


def summarise(lines: list[str], pid: str | None) -> list[str]:
    """The report for the raw stacks in `lines`."""
    phases: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        if len(frames) < 2 or "toposdns serve" not in frames[1]:
            continue
        if pid is not None and not frames[1].startswith(f"process {pid}:"):
            continue
        if frames[-1].startswith(IDLE) or any(f.startswith(ANSWERING) for f in frames):
            continue
        samples = int(count)
        total += samples
        phase = next(
            (name for name, marks in PHASES if any(m in f for f in frames for m in marks)),
            "other",
        )
        phases[phase] += samples
        leaves[frames[-1]] += samples
    if not total:
        return ["no samples of a `toposdns serve` process"]
    report = [f"{total} samples of the server starting"]
    report += [f"{n / total:6.1%}  {name}" for name, n in phases.most_common()]
    report.append("busiest lines:")
    report += [f"{n / total:6.1%}  {leaf}" for leaf, n in leaves.most_common(25)]
    return report


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    lines = Path(argv[0]).read_text().splitlines()
    print("\n".join(summarise(lines, argv[1] if len(argv) > 1 else None)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
