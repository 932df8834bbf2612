"""How many CPUs this process may use: the default of `--workers`.

The fewer of the CPUs its affinity allows (`taskset`, a CPU manager's exclusive CPUs) and the
CPUs its cgroup's quota pays for (a container's CPU limit: cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us` / `cpu.cfs_period_us`, the lowest along the cgroup's path), rounded down,
at least 1.
"""

from __future__ import annotations

import math
import os
from pathlib import Path


def usable_cpus(root: Path = Path("/"), affinity: int | None = None) -> int:
    """CPUs this process may use, rounded down, at least 1. `root` and `affinity` stand in for
    the file system and `os.sched_getaffinity` in tests."""
    count = len(os.sched_getaffinity(0)) if affinity is None else affinity
    quota = cgroup_cpus(root)
    if quota is not None:
        count = min(count, math.floor(quota))
    return max(1, count)


def cgroup_cpus(root: Path = Path("/")) -> float | None:
    """The CPUs the cgroup quota allows (quota / period) for this process, the lowest of its
    cgroup and their parents; None when there is no quota (or no cgroup file system)."""
    try:
        membership = (root / "proc/self/cgroup").read_text()
    except OSError:
        return None
    found: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # cgroup v2, the unified hierarchy
            for directory in _up_from(root / "sys/fs/cgroup", path):
                found += _v2_quota(directory / "cpu.max")
        elif "cpu" in controllers.split(","):  # cgroup v1, the cpu controller's hierarchy
            for mount in dict.fromkeys((controllers, "cpu")):
                for directory in _up_from(root / "sys/fs/cgroup" / mount, path):
                    found += _v1_quota(directory)
    return min(found) if found else None


def _up_from(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and each parent up to the mount point. In a container the path
    (from the host's view) may not exist: the mount point itself is then the container's."""
    parts = [part for part in path.split("/") if part]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_quota(path: Path) -> list[float]:
    """[quota / period] from a `cpu.max` ("max 100000" is none), or [] without one."""
    try:
        quota, period = path.read_text().split()[:2]
        return [] if quota == "max" else [int(quota) / int(period)]
    except (OSError, ValueError, ZeroDivisionError):
        return []


def _v1_quota(directory: Path) -> list[float]:
    """[quota / period] from `cpu.cfs_quota_us` (-1 is none), or [] without one."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return []
    return [quota / period] if quota > 0 and period > 0 else []
