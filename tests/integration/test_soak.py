"""70 s of bench/soak.py: the server under checked load, 10 EndpointSlice and 5 PodLocator
changes a second, and a fault every 9 s (a watch drop, a 410, a silent upstream, a garbling
upstream, a worker SIGKILL, a TCP slowloris, a broken Corefile then a good one). Every answer
must be right; outside the fault windows every query must be answered; the broken Corefile is
refused and the good one answered by both workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_process import REPO

pytestmark = pytest.mark.integration


def test_a_minute_and_more_of_soak(tmp_path: Path) -> None:
    figures = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--duration", "70", "--checked-qps", "50",
         "--fault-every", "9", "--json", str(figures), "--show-log"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert figures.exists(), done.stderr[-3000:]
    result = json.loads(figures.read_text())
    assert result["faults"] == [
        "watch-drop", "gone-410", "upstream-dies", "upstream-garbage", "worker-kill", "slowloris",
        "corefile-reload",
    ]  # fmt: skip
    updates = result["corefile_updates"]
    assert (updates["updates"], updates["applied"]) == (1, 1), updates
    assert (updates["broken"], updates["broken_refused"]) == (1, 1), updates
    assert result["queries"] >= 300, result["minutes"]  # 50 a second, fewer on a busy machine
    assert result["wrong"] == 0, result["examples"]
    assert result["unanswered"] == 0, result["examples"]
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
