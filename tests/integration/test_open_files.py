"""Open files: under a hard limit of 1024, a flood of forwarded queries towards a slow upstream,
with hundreds of TCP clients connected, takes no descriptor the DNS listeners need: in-zone
answers over UDP and TCP keep coming."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import time
from pathlib import Path

import dns.message
import pytest

from tests.integration.support import STOP_TIMEOUT, Server, copy_snapshot, tcp, udp
from tests.upstream import stub_upstream

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)"),
]

FLOOD = 2500
HELD = 300


def test_in_zone_answers_survive_a_forwarding_flood_at_1024_open_files(tmp_path: Path) -> None:
    with stub_upstream({}, mode="slow", delay=4.0) as upstream:
        server = Server(
            copy_snapshot(tmp_path),
            ("--upstream", f"127.0.0.1:{upstream.port}"),
            wrapper=("prlimit", "--nofile=1024:1024", "--"),
        )
        try:
            server.wait_ready()
            line = server.wait_for_log(r"open files: limit 1024; at most (\d+) forwarded", 1)
            assert 0 < int(line.group(1)) < 1000
            with (
                contextlib.ExitStack() as held,
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as flood,
            ):
                for i in range(HELD):  # TCP clients: a descriptor each, from 5 addresses
                    # (each within its share of the connections; the client asking is another)
                    source = (f"127.0.1.{10 + i % 5}", 0)
                    held.enter_context(
                        socket.create_connection(server.address, timeout=2, source_address=source)
                    )
                for i in range(FLOOD):  # each one a socket upstream until the bound
                    query = dns.message.make_query(f"n{i}.flood.test", "A")
                    flood.sendto(query.to_wire(), server.address)
                time.sleep(0.5)  # the sockets are open and waiting for the slow upstream
                name = "web.shop.svc.cluster.local"
                started = time.monotonic()
                answered = [
                    bool(send(server, dns.message.make_query(name, "A"), timeout=2.0).answer)
                    for _ in range(8)
                    for send in (udp, tcp)
                ]
                assert answered == [True] * 16, server.tail()
                assert time.monotonic() - started < 8
            assert not re.search("Too many open files", server.log()), server.tail()
        finally:
            assert server.stop(STOP_TIMEOUT) == 0, server.tail()
