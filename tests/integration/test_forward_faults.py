"""Forwarding against upstreams that misbehave, loop, or are slow under a flood: every failure
fails over, no reply to another question gets through, loops and floods do bounded work, local
shortages are not blamed on the upstream, health does not flap. After each, the server still
answers the names of its zones."""

from __future__ import annotations

import contextlib
import os
import re
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import pytest

from tests.integration.support import (
    FIXTURE_SNAPSHOT,
    REPO,
    Server,
    StartServer,
    addresses,
    copy_snapshot,
    framed,
    free_ports,
    raw_udp,
    recv_framed,
    tcp,
    udp,
    wait_until,
)
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

RECORDS = {("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"]}
IN_ZONE = "frontend.shop.svc.cluster.local."


def assert_answers_in_zone(server: Server) -> None:
    """The cluster names are answered over UDP and TCP, whatever the upstreams do."""
    query = dns.message.make_query(IN_ZONE, "A")
    assert addresses(udp(server, query)) == {"10.96.10.10"}
    assert addresses(tcp(server, query)) == {"10.96.10.10"}


def ask(
    server: Server, name: str, over_tcp: bool = False, timeout: float = 6.0
) -> dns.message.Message:
    query = dns.message.make_query(name, "A")
    return (tcp if over_tcp else udp)(server, query, timeout)


def open_files(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def free_port() -> int:
    """A port free for UDP and TCP on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


# Each way an upstream can fail, by the transport that shows it. Over UDP a short reply or one
# with another ID is skipped, as by CoreDNS, so it fails as silence does.
FAILURES = {
    "udp": ["midreply", "garbage", "wrong_question", "silent"],
    "tcp": ["close", "midreply", "short", "garbage", "wrong_id", "wrong_question"],
}


@pytest.mark.parametrize("proto", ["udp", "tcp"])
def test_every_failure_fails_over_to_the_healthy_upstream(
    start_server: StartServer, proto: str
) -> None:
    with contextlib.ExitStack() as stack:
        bad = [stack.enter_context(stub_upstream(RECORDS, mode)) for mode in FAILURES[proto]]
        good = stack.enter_context(stub_upstream(RECORDS))
        ports = [stub.port for stub in [*bad, good]]
        server = start_server("--upstream", ",".join(f"127.0.0.1:{port}" for port in ports))
        over_tcp = proto == "tcp"
        for i in range(16):  # in random order, every broken upstream is met (but 1 in 10^4)
            reply = ask(server, f"n{i}.example.test", over_tcp)
            assert reply.rcode() == dns.rcode.NXDOMAIN, reply  # the good upstream's answer
        assert ask(server, "www.example.test", over_tcp).answer[0].to_text().endswith("192.0.2.10")
        assert all(stub.tcp_accepted if over_tcp else stub.names() for stub in bad)
        log = server.log()
        assert "Traceback" not in log and "healthy again" not in log
        for stub in bad:
            assert log.count(f"upstream 127.0.0.1:{stub.port} is unhealthy") <= 1
        assert_answers_in_zone(server)


def test_a_reply_to_another_question_is_formerr_and_not_cached(start_server: StartServer) -> None:
    with stub_upstream(RECORDS, "wrong_question") as evil:
        server = start_server("--upstream", f"127.0.0.1:{evil.port}")
        for _ in range(2):
            reply = ask(server, "bank.example.com")
            assert reply.rcode() == dns.rcode.FORMERR and not reply.answer
        assert evil.names().count("bank.example.com") >= 2  # asked again: nothing was cached
        assert_answers_in_zone(server)


def test_a_lone_upstream_sending_garbage_gives_servfail_without_tracebacks(
    start_server: StartServer,
) -> None:
    with stub_upstream(RECORDS, "garbage") as broken:
        server = start_server("--upstream", f"127.0.0.1:{broken.port}")
        for i in range(3):
            assert ask(server, f"x{i}.example.test").rcode() == dns.rcode.SERVFAIL
        server.wait_for_log(rf"upstream 127\.0\.0\.1:{broken.port} is unhealthy over udp")
        assert "Traceback" not in server.log()
        assert server.log().count("is unhealthy") == 1
        assert_answers_in_zone(server)


def test_tcp_broken_upstream_is_down_for_tcp_only_and_does_not_flap(
    start_server: StartServer,
) -> None:
    with stub_upstream(RECORDS, "answer", tcp_mode="close") as half:
        server = start_server("--upstream", f"127.0.0.1:{half.port}")
        assert ask(server, "a.example.test", over_tcp=True).rcode() == dns.rcode.SERVFAIL
        assert ask(server, "b.example.test", over_tcp=True).rcode() == dns.rcode.SERVFAIL
        server.wait_for_log(rf"upstream 127\.0\.0\.1:{half.port} is unhealthy over tcp")
        time.sleep(1.5)  # three probe rounds
        assert server.log().count("is unhealthy") == 1
        assert "healthy again" not in server.log()
        assert ask(server, "www.example.test").answer  # UDP still goes to it
        assert_answers_in_zone(server)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_loop_at_startup_stops_the_server_naming_the_upstream(workers: str) -> None:
    port = free_port()
    upstream = ("--upstream", f"127.0.0.1:{port}")
    server = Server(
        FIXTURE_SNAPSHOT, ("--listen", f"127.0.0.1:{port}", *upstream, "--workers", workers)
    )
    try:
        assert server.proc.wait(10) == 1
        server.wait_for_log(
            rf"Loop \(127\.0\.0\.1:{port} -> 127\.0\.0\.1:{port}\) detected: the query "
            r'"HINFO \d+\.\d+\." sent to upstream'
        )
        assert server.log().count("Loop (") == 1 and "Traceback" not in server.log()
    finally:
        server.stop()


@pytest.mark.parametrize("new_ids", [False, True], ids=["same-id", "new-id"])
def test_a_loop_after_startup_does_bounded_work(start_server: StartServer, new_ids: bool) -> None:
    with stub_upstream(RECORDS, "relay") as relay:
        server = start_server("--upstream", f"127.0.0.1:{relay.port}")
        # The startup check saw an upstream that answered; now it sends everything back here.
        server.wait_for_log(r"serving DNS")
        wait_until(lambda: "HINFO" in {q[2] for q in relay.queries}, timeout=3)
        time.sleep(0.2)
        relay.relay_to, relay.new_ids = server.address, new_ids
        if not new_ids:
            # Like a Service address that leads back to this pod: the same ID comes back.
            for i in range(3):
                query = dns.message.make_query(f"loop{i}.example.test.", "A")
                assert udp(server, query).rcode() == dns.rcode.SERVFAIL
            assert relay.relayed == 3  # each query went round once
            server.wait_for_log(f"forwarding loop: a query sent to upstream 127.0.0.1:{relay.port}")
            assert server.log().count("forwarding loop") == 1
        else:
            # A resolver in between changes the ID: the question, already on its way, is not
            # sent again: the query waits for the first (which ends with its time budget).
            query = dns.message.make_query("loop.example.test.", "A")
            raw_udp(server, query.to_wire(), timeout=1.0)
            assert relay.relayed == 1
        assert "Traceback" not in server.log()
        relay.relay_to = None
        assert_answers_in_zone(server)


def test_a_flood_against_a_slow_upstream_is_refused_beyond_max_concurrent(
    start_server: StartServer,
) -> None:
    with stub_upstream(RECORDS, "slow", delay=1.5) as slow:
        server = start_server("--upstream", f"127.0.0.1:{slow.port}", "--max-concurrent", "50")
        before = open_files(server)
        rcodes: dict[int, int] = {}
        most = 0

        def receive(sock: socket.socket, timeout: float) -> None:
            """Count replies until none comes for `timeout` or all 400 are in."""
            sock.settimeout(timeout)
            with contextlib.suppress(TimeoutError):
                while sum(rcodes.values()) < 400:
                    rcode = dns.message.from_wire(sock.recv(4096)).rcode()
                    rcodes[rcode] = rcodes.get(rcode, 0) + 1

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            for i in range(400):
                query = dns.message.make_query(f"f{i}.example.test.", "A")
                sock.sendto(query.to_wire(), server.address)
                if i % 50 == 49:
                    receive(sock, 0.001)  # the REFUSED ones, before the socket buffer fills
                    most = max(most, open_files(server))
            assert_answers_in_zone(server)  # while 50 wait on the upstream
            receive(sock, 2.0)
        assert most <= before + 50 + 5, (before, most)
        assert rcodes == {dns.rcode.NXDOMAIN: 50, dns.rcode.REFUSED: 350}, rcodes
        server.wait_for_log(r"50 queries in flight \(--max-concurrent\); refusing more")
        assert_answers_in_zone(server)


def test_running_out_of_files_is_not_the_upstreams_fault(start_server: StartServer) -> None:
    with stub_upstream(RECORDS, "slow", delay=1.0) as slow:
        server = start_server("--upstream", f"127.0.0.1:{slow.port}")
        limit = open_files(server) + 20
        resource.prlimit(server.proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for i in range(100):
                sock.sendto(
                    dns.message.make_query(f"e{i}.example.test.", "A").to_wire(), server.address
                )
            server.wait_for_log(r"cannot forward: Too many open files here")
            assert addresses(udp(server, dns.message.make_query(IN_ZONE, "A"))) == {"10.96.10.10"}
        assert wait_until(lambda: open_files(server) < limit - 10, timeout=5)
        assert ask(server, "www.example.test").answer
        server.wait_for_log("forwarding works again")
        assert "unhealthy" not in server.log() and "Traceback" not in server.log()
        assert server.log().count("Too many open files") == 1
        assert_answers_in_zone(server)


def test_a_pipelining_tcp_client_holds_a_bounded_number_of_upstream_connections(
    start_server: StartServer,
) -> None:
    with stub_upstream(RECORDS, "slow", delay=0.2) as slow:
        server = start_server("--upstream", f"127.0.0.1:{slow.port}")
        queries = [dns.message.make_query(f"p{i}.example.test.", "A") for i in range(128)]
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(b"".join(framed(q) for q in queries))
            assert_answers_in_zone(server)  # other clients are not held up
            replies = [recv_framed(sock) for _ in queries]
        assert sorted(r.id for r in replies) == sorted(q.id for q in queries)
        assert all(r.rcode() == dns.rcode.NXDOMAIN for r in replies)
        assert 1 < slow.tcp_most_open <= 32
        assert_answers_in_zone(server)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("where", ["stub-domain", "other-port"])
def test_a_loop_through_any_server_blocks_upstream_stops_the_server(
    tmp_path: Path, where: str, workers: int
) -> None:
    # CoreDNS runs `loop` in each server block, its probe under the block's zone: a stub
    # domain's upstream, or a block's on another port, that sends it back here is a loop too.
    ports = free_ports("one", "two")
    one, two = ports["one"], ports["two"]
    looping = one if where == "stub-domain" else two
    with stub_upstream(RECORDS) as fine:
        other = fine.port
        done = run_corefile(
            tmp_path,
            f""".:{one} {{
    bind 127.0.0.1
    kubernetes cluster.local
    toposdns {{
        snapshot {copy_snapshot(tmp_path)}
        workers {workers}
    }}
}}
consul.local:{one} {{
    forward . 127.0.0.1:{looping if where == "stub-domain" else other}
}}
example.org:{two} {{
    forward . 127.0.0.1:{looping if where == "other-port" else other}
}}
""",
        )
    assert done.returncode == 1, done.stderr
    zone = "consul.local" if where == "stub-domain" else "example.org"
    found = re.search(
        rf"Loop \(127\.0\.0\.1:{looping} -> \S+\) detected: the query "
        rf'"HINFO \d+\.\d+\.{re.escape(zone)}\." sent to upstream',
        done.stderr,
    )
    assert found is not None, done.stderr
    assert done.stderr.count("Loop (") == 1 and "Traceback" not in done.stderr


def run_corefile(directory: Path, text: str) -> subprocess.CompletedProcess[str]:
    """`toposdns -conf` on a Corefile of `text`, run until it ends (30 s at most)."""
    path = directory / "Corefile"
    path.write_text(text)
    return subprocess.run(
        [sys.executable, "-m", "toposdns", "-conf", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
