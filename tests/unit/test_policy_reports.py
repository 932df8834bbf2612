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


def weighted(weights: str) -> dict[str, Any]:
    return service(
        cluster_ip="None",
        ports=(),
        topologyKeys=["topology.kubernetes.io/zone", "*"],
        annotations={"toposdns.io/topology-weights": weights},
    )


def test_invalid_soft_annotation_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    bad = snapshot_of([NS, weighted("80,30")])
    worse = snapshot_of([NS, weighted("80")])
    good = snapshot_of([NS, weighted("80,20")])
    before = INVALID_POLICIES._value.get()
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        report_invalid_policies(Snapshot(), bad)
        report_invalid_policies(bad, snapshot_of([NS, weighted("80,30")]))
        report_invalid_policies(bad, worse)
        report_invalid_policies(worse, good)
    assert INVALID_POLICIES._value.get() - before == 2
    assert [r.getMessage() for r in caplog.records] == [
        "Service shop/web: soft-topology annotation ignored, answering by the hard policy "
        "(mode: hard): metadata.annotations[toposdns.io/topology-weights]: Invalid value: "
        '"80,30": the weights must add up to 100, not 110',
        "Service shop/web: soft-topology annotation ignored, answering by the hard policy "
        "(mode: hard): metadata.annotations[toposdns.io/topology-weights]: Invalid value: "
        '"80": must have one weight per tier, 2 for [topology.kubernetes.io/zone, *]',
    ]


def test_soft_annotation_without_policy_logged(caplog: pytest.LogCaptureFixture) -> None:
    plain = service(
        cluster_ip="None", ports=(), annotations={"toposdns.io/topology-srv": "priority"}
    )
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        report_invalid_policies(Snapshot(), snapshot_of([NS, plain]))
    assert len(caplog.records) == 1
    assert "answering by the service without a policy" in caplog.records[0].getMessage()
    assert "needs a valid topology policy" in caplog.records[0].getMessage()
