"""Peak memory while a snapshot file loads, against the memory the loaded data keeps.

Writes the benchmark cluster as one `kind: List` (what `kubectl get -o yaml` prints) of about
`--megabytes` MB, in YAML or JSON, then loads it in a fresh process (`load_snapshot`, as
`toposdns serve --snapshot` does at start) and reports the RSS before, the peak (VmHWM) and
the RSS after, with the bound the loader keeps to: peak <= 2 x after + 64 MB.

Run from the repository root:  python -m bench.snapshot_memory  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.cluster import generate_cluster, snapshot_objects

MB = 1024 * 1024
#: Objects per service in the benchmark cluster, as YAML: about 4.4 KB.
BYTES_PER_SERVICE = 4400

MEASURE = """
import gc, sys
from pathlib import Path
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
from toposdns.source.snapshot_file import load_snapshot
before = rss("VmRSS:")
snapshot = load_snapshot(Path(sys.argv[1]), max_bytes=int(sys.argv[2]))
gc.collect()
print(before, rss("VmHWM:"), rss("VmRSS:"), len(snapshot.services))
"""


class _NoAliases(yaml.CSafeDumper):
    """Every object written out in full, as kubectl writes them (and older loaders read)."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def write_snapshot(path: Path, megabytes: int, fmt: str) -> None:
    """Write a snapshot of about `megabytes` MB."""
    cluster = generate_cluster(megabytes * MB // BYTES_PER_SERVICE, 50, 20, seed=1)
    objects = snapshot_objects(cluster, topology=True)
    with path.open("w") as out:
        if fmt == "json":
            json.dump(objects, out)
        else:
            yaml.dump(objects, out, Dumper=_NoAliases, sort_keys=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=50)
    parser.add_argument("--format", choices=("yaml", "json"), default="yaml")
    parser.add_argument(
        "--keep", type=Path, metavar="FILE", help="write the snapshot here (reused if it exists)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        path = args.keep or Path(workdir) / f"snapshot.{args.format}"
        if not path.exists():
            write_snapshot(path, args.megabytes, args.format)
        size = path.stat().st_size
        limit = max(64 * MB, size + 1)
        run = subprocess.run(
            [sys.executable, "-c", MEASURE, str(path), str(limit)], capture_output=True, text=True
        )
        if run.returncode:
            raise SystemExit(f"loading failed:\n{run.stderr}")
        out = run.stdout.split()
    before, peak, after, services = (int(field) for field in out)
    bound = 2 * after + 64 * MB
    print(
        f"{args.format} file {size / MB:.1f} MB, {services} services: RSS before {before / MB:.0f} "
        f"MB, peak {peak / MB:.0f} MB, after {after / MB:.0f} MB; bound 2 x after + 64 = "
        f"{bound / MB:.0f} MB: {'within' if peak <= bound else 'OVER'}"
    )


if __name__ == "__main__":
    main()
