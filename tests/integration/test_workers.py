"""`toposdns serve --workers 2`: the kernel spreads queries over both workers, each change of
the one source reaches both, /metrics and /ready speak for both, a worker that dies comes back,
SIGTERM's lameduck covers them all, and the API server sees one client however many workers."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import dns.message
import pytest

from tests.integration.support import (
    FIXTURE_SNAPSHOT,
    STOP_TIMEOUT,
    Server,
    StartServer,
    addresses,
    copy_snapshot,
    http_get,
    replace_file,
    tcp,
    udp,
    wait_until,
)
from tests.integration.test_topology import TOPOLOGY, ask_with_ecs
from tests.kubeapi import FakeApiServer
from tests.objects import service
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

WEB = "web.shop.svc.cluster.local"
WEB_IPS = {"10.244.1.10", "10.244.2.11"}
SERVING = re.compile(r"worker (\d+) \(pid (\d+)\) serving")
#: Queries from this many source ports: all on one of two workers has odds of 2**-39.
SPREAD = 40


def start(start_server: StartServer, *args: str, snapshot: Path | None = None) -> Server:
    return start_server("--workers", "2", "--http", "127.0.0.1:0", *args, snapshot=snapshot)


def http_port(server: Server) -> int:
    return int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))


def worker_pids(server: Server) -> dict[int, int]:
    """The pid of each worker slot, as the latest "serving" line of each says."""
    pids: dict[int, int] = {}
    for line in server.log().splitlines():
        found = SERVING.search(line)
        if found:
            pids[int(found.group(1))] = int(found.group(2))
    return pids


def metric(text: str, name: str) -> dict[str, float]:
    """The samples of one metric: labels text -> value."""
    found = re.findall(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
    return {labels: float(value) for labels, value in found}


def metrics(port: int) -> str:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return text


def web_answers(server: Server, count: int = SPREAD) -> list[set[str]]:
    """The A records of web, asked from `count` source ports."""
    query = dns.message.make_query(WEB, "A")
    return [addresses(udp(server, query)) for _ in range(count)]


def test_every_worker_answers_and_metrics_add_up(start_server: StartServer) -> None:
    server = start(start_server)
    port = http_port(server)
    assert sorted(worker_pids(server)) == [1, 2]
    assert http_get(port, "/ready") == (200, "OK")
    query = dns.message.make_query(WEB, "A")
    for answer in web_answers(server):
        assert answer == WEB_IPS
    for _ in range(10):
        assert addresses(tcp(server, query)) == WEB_IPS
    text = metrics(port)
    per_worker = metric(text, "toposdns_worker_requests_total")
    assert set(per_worker) == {'{worker="1"}', '{worker="2"}'}
    assert all(count > 0 for count in per_worker.values()), per_worker
    requests = metric(text, "coredns_dns_requests_total")
    by_proto = Counter[str]()
    for labels, value in requests.items():
        by_proto[re.search(r'proto="(\w+)"', labels).group(1)] += value  # type: ignore[union-attr]
    assert by_proto == {"udp": SPREAD, "tcp": 10}
    assert sum(per_worker.values()) == SPREAD + 10
    assert sum(metric(text, "coredns_dns_request_duration_seconds_count").values()) == SPREAD + 10
    assert metric(text, "toposdns_worker_restarts_total") == {"": 0}


def test_a_file_change_reaches_every_worker(start_server: StartServer, tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    server = start(start_server, snapshot=snapshot)
    port = http_port(server)
    assert all(answer == WEB_IPS for answer in web_answers(server))  # cached in both workers
    replace_file(snapshot, FIXTURE_SNAPSHOT.read_text().replace("10.244.1.10", "10.244.1.99"))
    new = {"10.244.1.99", "10.244.2.11"}
    assert wait_until(lambda: new in web_answers(server, 1), timeout=5.0)
    # Once one worker has it, every worker has it within a second.
    assert wait_until(lambda: all(a == new for a in web_answers(server)), timeout=1.0)
    assert wait_until(lambda: http_get(port, "/ready") == (200, "OK"), timeout=1.0)


def test_topology_and_ecs_in_every_worker(start_server: StartServer, tmp_path: Path) -> None:
    server = start(
        start_server, "--ecs-trust", "127.0.0.100/32", snapshot=copy_snapshot(tmp_path, TOPOLOGY)
    )
    query = dns.message.make_query(WEB, "A")
    for _ in range(SPREAD // 2):
        near = udp(server, query)  # from 127.0.0.1: no locator, every endpoint
        assert addresses(near) == {"10.244.1.10", "10.244.3.10", "10.244.3.11"}
        placed = dns.query.udp(query, server.host, port=server.port, timeout=2, source="127.0.0.4")
        assert addresses(placed) == {"10.244.3.10", "10.244.3.11"}
        trusted = ask_with_ecs(server, "127.0.0.100", "127.0.0.2/32")
        assert addresses(trusted) == {"10.244.1.10"}
        untrusted = ask_with_ecs(server, "127.0.0.4", "127.0.0.2/32")
        assert addresses(untrusted) == {"10.244.3.10", "10.244.3.11"}
    # /explain answers from the supervisor's copy of the data, the same as the workers'.
    status, body = http_get(http_port(server), f"/explain?client=127.0.0.4&name={WEB}")
    assert status == 200
    assert {record.split()[-1] for record in json.loads(body)["answer"]} == {
        "10.244.3.10",
        "10.244.3.11",
    }


def test_forwarding_in_every_worker(start_server: StartServer) -> None:
    names = {("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"]}
    with stub_upstream(names) as upstream:
        server = start(start_server, "--upstream", f"127.0.0.1:{upstream.port}")
        query = dns.message.make_query("www.example.test", "A")
        for _ in range(SPREAD):
            assert addresses(udp(server, query)) == {"192.0.2.10"}
        # Each worker has a cache of its own: the upstream was asked once by each.
        assert [q[1] for q in upstream.queries].count("www.example.test") == 2
        text = metrics(http_port(server))
        hits = sum(metric(text, "coredns_cache_hits_total").values())
        assert hits + sum(metric(text, "coredns_cache_misses_total").values()) == SPREAD
        assert hits == SPREAD - 2


def test_a_killed_worker_is_started_again(start_server: StartServer) -> None:
    server = start(start_server)
    port = http_port(server)
    killed = worker_pids(server)[1]
    lines = server.line_count()
    os.kill(killed, signal.SIGKILL)
    server.wait_for_log(
        rf"worker 1 \(pid {killed}\) was killed by signal SIGKILL; starting it again", start=lines
    )
    server.wait_for_log(r"worker 1 \(pid \d+\) serving", start=lines)
    assert worker_pids(server)[1] != killed
    assert all(answer == WEB_IPS for answer in web_answers(server))
    assert wait_until(lambda: http_get(port, "/ready") == (200, "OK"), timeout=2.0)
    assert metric(metrics(port), "toposdns_worker_restarts_total") == {"": 1}


def test_a_worker_that_keeps_ending_is_started_again_with_backoff(
    start_server: StartServer,
) -> None:
    server = start(start_server)
    port = http_port(server)
    for delay in (1, 2, 4):  # each time soon after its start: the delay doubles
        killed = worker_pids(server)[1]
        lines = server.line_count()
        os.kill(killed, signal.SIGKILL)
        server.wait_for_log(
            rf"worker 1 \(pid {killed}\) was killed by signal SIGKILL; starting it again in "
            rf"{delay}s, as it ended soon after its start$",
            start=lines,
        )
        if delay == 4:
            status, reason = http_get(port, "/ready")
            assert status == 503 and re.fullmatch(
                r"workers not serving the latest data: 1 \(ended soon after its start; "
                r"starting again in [34]s of 4s\)",
                reason,
            ), reason
        server.wait_for_log(r"worker 1 \(pid \d+\) serving", start=lines, timeout=delay + 5)
    restarts = [line for line in server.log().splitlines() if "starting it again" in line]
    assert len(restarts) == 3  # one line per restart
    assert wait_until(lambda: http_get(port, "/ready") == (200, "OK"), timeout=2.0)


def test_sigterm_lameduck_covers_every_worker(start_server: StartServer) -> None:
    server = start(start_server, "--lameduck", "2s")
    port = http_port(server)
    pids = worker_pids(server).values()
    server.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert wait_until(lambda: http_get(port, "/ready") == (503, "Shutting down"), timeout=0.5)
    assert all(answer == WEB_IPS for answer in web_answers(server))  # both still answer
    assert server.proc.wait(STOP_TIMEOUT) == 0
    assert 1.8 < time.monotonic() - stopped < STOP_TIMEOUT
    assert not [pid for pid in pids if alive(pid)]


def test_a_second_signal_stops_every_worker_at_once(start_server: StartServer) -> None:
    server = start(start_server, "--lameduck", "30s")
    server.proc.send_signal(signal.SIGINT)
    server.wait_for_log("answering for 30s more")
    stopped = time.monotonic()
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(STOP_TIMEOUT) == 0
    assert time.monotonic() - stopped < 3


def test_workers_end_with_their_supervisor(tmp_path: Path) -> None:
    server = Server(copy_snapshot(tmp_path), ("--workers", "2"))
    try:
        server.wait_ready()
        pids = worker_pids(server).values()
        os.kill(server.pid, signal.SIGKILL)  # the supervisor only, no time to stop anything
        assert wait_until(lambda: not [pid for pid in pids if alive(pid)], timeout=1.0)
    finally:
        server.stop()


def alive(pid: int) -> bool:
    """True while a process (not yet reaped: a zombie counts as gone) runs."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return status != "Z"


# The API server sees one client, however many workers.


def api_requests(api: FakeApiServer, tmp_path: Path, workers: str) -> Counter[tuple[str, ...]]:
    """Serve from the API with `workers`, change a Service, count the requests made."""
    api.requests.clear()
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    server = Server(None, ("--kubeconfig", str(kubeconfig), "--workers", workers))
    try:
        server.wait_ready()
        api.wait_for_watches(4)
        ip = f"10.96.0.{int(workers) + 10}"
        api.modify(service("web", cluster_ip=ip))
        query = dns.message.make_query("web.shop.svc.cluster.local", "A")
        assert wait_until(lambda: all(addresses(udp(server, query)) == {ip} for _ in range(8)), 5)
    finally:
        assert server.stop(STOP_TIMEOUT) == 0, server.log()
    return Counter(
        (r.method, r.resource or r.path, "watch" if r.is_watch else "") for r in api.requests
    )


def test_the_api_server_sees_one_client(api: FakeApiServer, tmp_path: Path) -> None:
    alone = api_requests(api, tmp_path, "1")
    assert alone[("GET", "services", "watch")] == 1
    assert api_requests(api, tmp_path, "2") == alone


def test_workers_forked_before_the_first_sync_start_again_from_it(
    api: FakeApiServer, tmp_path: Path
) -> None:
    # Forked before the sync, workers get the rest of the data as messages: a copy each. Once
    # synced, the supervisor forks them again from the data, so that they share it.
    api.fail_next("services", 500, count=4)  # holds the first sync back past the timeout
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    options = ("--startup-timeout", "0.2", "--workers", "2", "--lameduck", "0.5")
    server = Server(None, ("--kubeconfig", str(kubeconfig), *options))
    try:
        server.wait_ready()
        first = worker_pids(server)
        server.wait_for_log(r"first sync done: replacing the workers", timeout=15)
        assert wait_until(
            lambda: all(worker_pids(server).get(slot) not in (None, first[slot]) for slot in first),
            timeout=15,
        ), server.log()
        query = dns.message.make_query(WEB, "A")
        assert wait_until(
            lambda: all(addresses(udp(server, query)) == {"10.96.0.5"} for _ in range(8)), 5
        )
        assert "starting it again" not in server.log()  # not counted as workers that died
    finally:
        assert server.stop(STOP_TIMEOUT) == 0, server.log()


def series(text: str) -> set[tuple[str, tuple[str, ...]]]:
    """Each sample's name and label names, for metrics a query can change (the supervisor's
    own view of its workers aside)."""
    found = set()
    for line in text.splitlines():
        if line.startswith("#") or not line or line.startswith("toposdns_worker_"):
            continue
        name, _, rest = line.partition("{")
        labels = re.findall(r'(\w+)="', rest) if rest else []
        found.add((name.split(" ")[0], tuple(labels)))
    return found


def test_the_same_series_with_one_worker_and_two(tmp_path: Path) -> None:
    """Every metric a DNS process counts reaches /metrics however many workers answer: the
    acl's and the unplaced Client Subnets' among them."""
    from tests.integration.support import CorefileServer, free_ports

    seen = []
    for workers in (1, 2):
        ports = free_ports("dns", "metrics")
        corefile = tmp_path / f"Corefile{workers}"
        corefile.write_text(
            f""".:{ports["dns"]} {{
    bind 127.0.0.1
    kubernetes cluster.local
    prometheus 127.0.0.1:{ports["metrics"]}
    acl {{
        block net 127.0.0.9/32
    }}
    toposdns {{
        snapshot {TOPOLOGY}
        workers {workers}
        ecs_trust 127.0.0.100/32
    }}
}}
"""
        )
        server = CorefileServer(corefile)
        try:
            server.wait_ready(30)
            for _ in range(SPREAD):  # over both workers, whichever the kernel picks
                udp(server, dns.message.make_query(WEB, "A"))
                blocked = dns.message.make_query(WEB, "A")
                reply = dns.query.udp(blocked, "127.0.0.1", port=server.port, source="127.0.0.9")
                assert reply.rcode() == dns.rcode.REFUSED
                ask_with_ecs(server, "127.0.0.100", "192.0.2.0/24")  # no locator holds it
            text = metrics(ports["metrics"])
            assert metric(text, "coredns_acl_blocked_requests_total")
            assert sum(metric(text, "coredns_acl_blocked_requests_total").values()) == SPREAD
            # Once per forwarder and prefix length in each process that met it.
            assert 1 <= metric(text, "toposdns_unplaced_client_subnets_total")[""] <= workers
            seen.append(series(text))
        finally:
            assert server.stop() == 0, server.log()
    one, two = seen
    assert one == two, (one - two, two - one)
