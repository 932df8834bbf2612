"""Invalid topology policies are logged and counted once per change, not per query or reload."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.helpers import snapshot_of
from tests.objects import namespace, service
from toposdns.metrics import INVALID_POLICIES
from toposdns.server import report_invalid_policies
from toposdns.store.snapshot import Snapshot

NS = namespace("shop")


def web(keys: list[str]) -> dict[str, Any]:
    return service(cluster_ip="None", ports=(), topologyKeys=keys)


def test_logged_and_counted_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    bad = snapshot_of([NS, web(["*", "kubernetes.io/hostname"])])
    worse = snapshot_of([NS, web(["*", "*"])])
    good = snapshot_of([NS, web(["kubernetes.io/hostname", "*"])])
    before = INVALID_POLICIES._value.get()
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        report_invalid_policies(Snapshot(), bad)
        report_invalid_policies(bad, snapshot_of([NS, web(["*", "kubernetes.io/hostname"])]))
        report_invalid_policies(bad, worse)
        report_invalid_policies(worse, good)
    assert INVALID_POLICIES._value.get() - before == 2
    assert len(caplog.records) == 2
    assert "Service shop/web: topologyKeys policy ignored" in caplog.records[0].getMessage()
    assert '"*" must be the last value specified' in caplog.records[0].getMessage()
