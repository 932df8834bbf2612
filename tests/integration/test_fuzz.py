"""A short run of the fuzz campaign (bench/fuzz.py): 50,000 mutated and random packets over UDP
and TCP; the server stays up, answers correctly at every check, stays small, logs nothing."""

from __future__ import annotations

import pytest

from bench.fuzz import campaign
from tests.integration.support import StartServer

pytestmark = pytest.mark.integration


def test_fuzz_campaign(start_server: StartServer) -> None:
    server = start_server("--ecs-trust", "127.0.0.0/8", "--pods", "insecure")
    report = campaign(
        server.address,
        server.proc.pid,
        count=50_000,
        seed=13,
        check_every=10_000,
        duration=120,
        max_rss_mib=300,
        probe=("frontend.shop.svc.cluster.local", {"10.96.10.10"}),
    )
    assert report.packets == 50_000, f"only {report.packets} packets in 120 s"
    assert report.tcp_packets > 5_000 and report.tcp_connections > 50
    assert [check.packets for check in report.checks] == list(range(0, 50_001, 10_000))
    # The packets got everywhere: refused, answered, not found, not implemented, malformed.
    assert {"NOERROR", "NXDOMAIN", "REFUSED", "NOTIMP", "FORMERR"} <= set(report.rcodes)
    assert report.bad_replies == 0
    assert "Traceback" not in server.log() and " ERROR " not in server.log()
