"""The default of `--workers`: CPU affinity and cgroup quotas, from fake /proc and /sys files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toposdns.workers.cpus import cgroup_cpus, usable_cpus

V1_MEMBERSHIP = "4:memory:/kubepods/pod1/c1\n3:cpu,cpuacct:/kubepods/pod1/c1\n1:name=systemd:/x\n"

# (name, /proc/self/cgroup, {file under /sys/fs/cgroup: text}, affinity, expected workers)
CASES = [
    ("no cgroup files: the affinity", None, {}, 8, 8),
    ("v2, no quota", "0::/\n", {"cpu.max": "max 100000\n"}, 8, 8),
    ("v2 container, 2 CPUs", "0::/\n", {"cpu.max": "200000 100000\n"}, 8, 2),
    ("v2, 2.5 CPUs round down", "0::/\n", {"cpu.max": "250000 100000\n"}, 8, 2),
    ("v2, half a CPU: at least 1", "0::/\n", {"cpu.max": "50000 100000\n"}, 8, 1),
    ("v2, the affinity is fewer", "0::/\n", {"cpu.max": "400000 100000\n"}, 3, 3),
    (
        "v2, the lowest along the path",
        "0::/kubepods/pod1/c1\n",
        {"kubepods/cpu.max": "300000 100000", "kubepods/pod1/c1/cpu.max": "max 100000"},
        8,
        3,
    ),
    (
        "v2, the host's path missing in the container: its root",
        "0::/kubepods/pod1/c1\n",
        {"cpu.max": "100000 100000"},
        8,
        1,
    ),
    ("v2, a broken file is no quota", "0::/\n", {"cpu.max": "garbage"}, 4, 4),
    ("v2, period 0 is no quota", "0::/\n", {"cpu.max": "100000 0"}, 4, 4),
    (
        "v1, the mount of cpu,cpuacct",
        V1_MEMBERSHIP,
        {
            "cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_quota_us": "200000",
            "cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_period_us": "100000",
        },
        8,
        2,
    ),
    (
        "v1 container: the mount point is its own cgroup",
        V1_MEMBERSHIP,
        {"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"},
        8,
        3,
    ),
    (
        "v1, quota -1 is none",
        V1_MEMBERSHIP,
        {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"},
        6,
        6,
    ),
    ("v1, no cpu controller", "4:memory:/\n", {"memory/cpu.cfs_quota_us": "100000"}, 5, 5),
]


@pytest.mark.parametrize(
    ("membership", "files", "affinity", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_usable_cpus(
    tmp_path: Path, membership: str | None, files: dict[str, str], affinity: int, expected: int
) -> None:
    if membership is not None:
        (tmp_path / "proc/self").mkdir(parents=True)
        (tmp_path / "proc/self/cgroup").write_text(membership)
    for name, text in files.items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert usable_cpus(tmp_path, affinity) == expected


def test_quota_as_a_fraction(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text("0::/\n")
    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("150000 100000\n")
    assert cgroup_cpus(tmp_path) == 1.5


def test_this_process() -> None:
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
