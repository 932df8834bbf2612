"""The child process of `python -m bench.live --profile DIR`: the real client and KubeSource,
synced once against the stand-in, in this process.

    python -m bench.sync_profile MODE KUBECONFIG OUT

MODE "plain": wall time, RSS at each step and garbage-collector time; "cpu": the same under
cProfile (stats to OUT, top 25 printed); "memory": tracemalloc from after the imports to the
sync (top allocation sites to OUT).
"""

from __future__ import annotations

import asyncio
import contextlib
import cProfile
import gc
import io
import math
import pstats
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # not bench.harness: its imports would count

SYNC_TIMEOUT = 120.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


class GcTimes:
    """Seconds of each garbage collection by generation, while installed in gc.callbacks."""

    def __init__(self) -> None:
        self.seconds: dict[int, list[float]] = {0: [], 1: [], 2: []}
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds[info["generation"]].append(time.perf_counter() - self._started)

    def describe(self) -> str:
        return "garbage collections during the sync: " + ", ".join(
            f"gen{g} {len(t)}x {sum(t):.2f} s (max {max(t, default=0):.3f} s)"
            for g, t in self.seconds.items()
        )


async def sync(kubeconfig: Path, mode: str, report: list[str], out: Path) -> None:
    """Connect, run a KubeSource until its first synced snapshot, and report on it."""
    from toposdns.kube.client import apis_of, connect
    from toposdns.source.kube import KubeSource
    from toposdns.store.snapshot import Snapshot

    ready = asyncio.Event()
    holder: list[Snapshot] = []

    def publish(snapshot: Snapshot) -> None:
        holder[:] = [snapshot]  # the server keeps only the latest
        if snapshot.synced:
            ready.set()

    api_client = await connect(kubeconfig)
    report.append(f"RSS after connect {rss_mb():.0f} MB")
    gc_times = GcTimes()
    try:
        task = asyncio.create_task(
            KubeSource(apis_of(api_client), publish, on_page=gc.freeze).run()
        )
        start = time.perf_counter()
        if mode == "plain":
            gc.callbacks.append(gc_times)
        gc.disable()  # as `serve` does until the first sync
        try:
            async with asyncio.timeout(SYNC_TIMEOUT):
                await ready.wait()
            gc.enable()
            report.append(f"sync took {time.perf_counter() - start:.2f} s ({mode})")
            if mode == "plain":
                gc.callbacks.remove(gc_times)
                report.append(gc_times.describe())
            report.append(f"RSS after sync {rss_mb():.0f} MB")
            gc.collect()
            report.append(f"RSS after sync and gc.collect() {rss_mb():.0f} MB")
            if mode == "memory":
                report.extend(memory_report(out))
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await api_client.close()


def memory_report(out: Path) -> list[str]:
    """The top allocation sites still alive, written to `out` and returned."""
    snap = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    lines = [
        f"tracemalloc since imports: {current / 2**20:.0f} MB live, {peak / 2**20:.0f} MB peak",
        "top allocation sites still alive after the sync:",
    ]
    for stat in snap.statistics("lineno")[:20]:
        frame = stat.traceback[0]
        lines.append(
            f"{stat.size / 2**20:8.1f} MB {stat.count:>9,} blocks  "
            f"{frame.filename.removeprefix(str(REPO) + '/')}:{frame.lineno}"
        )
    out.write_text("\n".join(lines[1:]) + "\n")
    return lines


def cpu_report(profiler: cProfile.Profile, out: Path) -> list[str]:
    profiler.dump_stats(out)
    lines = []
    for key in ("tottime", "cumulative"):
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats(key).print_stats(25)
        lines.append(f"--- top 25 by {key} ---")
        lines.append(text.getvalue().split("\n\n", 2)[-1].replace(str(REPO) + "/", ""))
    return lines


def main(argv: list[str]) -> int:
    mode, kubeconfig, out = argv
    report = [f"RSS bare interpreter {rss_mb():.0f} MB"]
    import toposdns.kube.client  # noqa: F401
    import toposdns.source.kube  # noqa: F401  (here: before tracemalloc starts)

    report.append(f"RSS after imports {rss_mb():.0f} MB")
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    profiler = cProfile.Profile() if mode == "cpu" else None
    if mode == "memory":
        tracemalloc.start(1)
    if profiler is not None:
        profiler.enable()
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(sync(Path(kubeconfig), mode, report, Path(out)))
    if profiler is not None:
        profiler.disable()
        report.extend(cpu_report(profiler, Path(out)))
    print("\n".join(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
