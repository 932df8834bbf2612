"""bench/hostile.py end to end, on its quickest attack: the tenant's PodLocators against a pod
of another namespace. What the row says depends on the tree; that it was measured does not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.hostile import parse_args, run_attack, selected
from tests.server_process import REPO

pytestmark = pytest.mark.integration


def test_the_locator_attack_is_measured() -> None:
    args = parse_args(["--only", "locators"])
    [attack] = selected(args.only)
    row = run_attack(attack, args)
    assert not row.measured.startswith("could not run"), row.measured
    assert "SET-UP" not in row.measured and "barrier never showed" not in row.measured
    shop_pod, udp = row.victims
    assert shop_pod.asked == 15 and udp.asked > 0
    assert set(row.details["results"]) == {"exact address", "node-a's CIDR", "node label"}
    assert row.start.rss_mib > 0 and row.sample.rss_mib > 0
    assert row.sample.queues.error == ""


def test_the_command_line() -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bench.hostile", *argv],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert "--only" in run("--help").stdout
    listed = run("--list").stdout.split()
    assert {"slice", "orphans", "fairness-4", "ecs-nodelocal", "locators"} <= set(listed)
    wrong = run("--only", "nothing")
    assert wrong.returncode != 0 and "no attack named nothing" in wrong.stderr
