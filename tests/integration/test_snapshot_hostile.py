"""Snapshot files an attacker or a careless operator could write: each is refused with one log
line naming the file and what is wrong, the previous data keeps answering, and a large file is
read without stopping DNS."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import dns.exception
import dns.message
import dns.rcode
import pytest
import yaml

from tests.integration.support import (
    FIXTURE_SNAPSHOT,
    Server,
    StartServer,
    addresses,
    replace_file,
    udp,
)

pytestmark = pytest.mark.integration

RELOAD_TIMEOUT = 6.0  # a poll, a second to settle, the load
FIXTURE = FIXTURE_SNAPSHOT.read_text()


def assert_serving_fixture(server: Server) -> None:
    """The fixture's names answer as the fixture says."""
    for name, expected in (
        ("frontend.shop.svc.cluster.local.", {"10.96.10.10"}),
        ("web-0.web.shop.svc.cluster.local.", {"10.244.1.10"}),
    ):
        reply = udp(server, dns.message.make_query(name, "A"))
        assert reply.rcode() == dns.rcode.NOERROR and addresses(reply) == expected, name


def swap_in(path: Path, make: Callable[[Path], None]) -> None:
    """Make a new file next to `path` and rename it over `path`, as a ConfigMap update does."""
    temporary = path.with_name(path.name + ".new")
    make(temporary)
    os.replace(temporary, path)


def cut_mid_line(text: str) -> str:
    """The fixture cut inside a block scalar: still valid YAML, but not the file written."""
    return text[: text.index("clusterIP: 10.96.10.20") + len("clusterIP: 10.96.1")]


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("empty", lambda p: p.write_text(""), "empty; a snapshot holds at least one object"),
    ("cut YAML", lambda p: p.write_text(cut_mid_line(FIXTURE)), "ends mid-line"),
    (
        "cut JSON",
        lambda p: p.write_text(json.dumps(yaml.safe_load(FIXTURE))[:-40]),
        "not valid YAML or JSON",
    ),
    ("/dev/zero", lambda p: p.symlink_to("/dev/zero"), "not a regular file but a character device"),
    ("FIFO", os.mkfifo, "not a regular file but a FIFO"),
    (
        "too large",
        lambda p: p.write_text(FIXTURE + "#" * 300_000 + "\n"),
        "over the limit of 262144 bytes; raise --snapshot-max-bytes",
    ),
]


def test_unservable_files_are_refused_once_and_the_data_stays(start_server: StartServer) -> None:
    server = start_server("--snapshot-max-bytes", "256Ki")
    path = server.snapshot
    assert path is not None
    for label, make, reason in CASES:
        before = server.line_count()
        swap_in(path, make)
        line = server.wait_for_log(
            r"ERROR reload refused.*", timeout=RELOAD_TIMEOUT, start=before
        ).group(0)
        assert f"still serving the previous data: {path}: " in line, label
        assert reason in line, (label, line)
        assert_serving_fixture(server)
    # Each refusal was logged once, on one line, though the bad files stayed for seconds.
    errors = [line for line in server.log().splitlines() if "ERROR" in line]
    assert len(errors) == len(CASES), errors
    assert "Traceback" not in server.log()
    # A good file is served again.
    replace_file(path, FIXTURE.replace("10.96.10.10", "10.96.10.11"))
    server.wait_for_log(r"INFO reloaded .*: \d+ objects", timeout=RELOAD_TIMEOUT)
    reply = udp(server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
    assert addresses(reply) == {"10.96.10.11"}


def test_a_file_written_in_place_is_read_once_it_settles(start_server: StartServer) -> None:
    server = start_server()
    path = server.snapshot
    assert path is not None
    new = FIXTURE.replace("10.96.10.10", "10.96.10.11")
    lines = new.splitlines(keepends=True)
    before = server.line_count()
    # Written in place in 8 pieces, 0.3 s apart, each cut at a line: every piece on its own
    # is valid YAML, so only the settle rule keeps a half file from being served.
    with path.open("w") as file:
        for piece in range(8):
            file.writelines(lines[piece * len(lines) // 8 : (piece + 1) * len(lines) // 8])
            file.flush()
            assert_serving_fixture(server)
            time.sleep(0.3)
    assert server.line_count() == before, server.log()
    server.wait_for_log(r"INFO reloaded .*: \d+ objects", timeout=RELOAD_TIMEOUT, start=before)
    reply = udp(server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
    assert addresses(reply) == {"10.96.10.11"}
    assert len(server.log().splitlines()) == before + 1, server.log()


def bulk_services(count: int) -> str:
    """`count` headless services with five endpoints each, as YAML list items."""
    items = []
    for i in range(count):
        endpoints = "".join(
            f"  - addresses: [10.{100 + i // 250}.{i % 250}.{j}]\n"
            f"    conditions: {{ready: true}}\n    nodeName: node-{j}\n"
            for j in range(5)
        )
        items.append(
            f"- apiVersion: v1\n  kind: Service\n  metadata: {{name: svc-{i}, namespace: bulk}}\n"
            "  spec:\n    clusterIP: None\n    ports:\n    - {name: http, port: 80}\n"
            "- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata:\n"
            f"    name: svc-{i}-abcde\n    namespace: bulk\n"
            f"    labels: {{kubernetes.io/service-name: svc-{i}}}\n"
            f"  addressType: IPv4\n  ports:\n  - {{name: http, port: 80}}\n  endpoints:\n"
            + endpoints
        )
    return "".join(items)


def test_dns_answers_while_a_large_file_is_read(start_server: StartServer) -> None:
    server = start_server()
    path = server.snapshot
    assert path is not None
    before = server.line_count()
    big = FIXTURE + "- {apiVersion: v1, kind: Namespace, metadata: {name: bulk}}\n"
    replace_file(path, big + bulk_services(1000))  # ~0.8 MB: seconds of parsing
    query = dns.message.make_query("frontend.shop.svc.cluster.local.", "A")
    answered: list[float] = []
    failed = 0
    reloaded = None
    deadline = time.monotonic() + 90
    while reloaded is None and time.monotonic() < deadline:
        try:
            reply = udp(server, query, timeout=2.0)
            assert addresses(reply) == {"10.96.10.10"}
            answered.append(time.monotonic())
        except dns.exception.Timeout:
            failed += 1
        found = [line for line in server.log().splitlines()[before:] if "reloaded" in line]
        if found:
            reloaded = re.search(r"reloaded .*: (\d+) objects in ([\d.]+)s", found[0])
    assert reloaded is not None, f"not reloaded within 90 s:\n{server.log()}"
    assert int(reloaded.group(1)) == 2001 + len(yaml.safe_load(FIXTURE)["items"])
    took = float(reloaded.group(2))
    during = [at for at in answered if at >= answered[-1] - took]
    assert failed == 0, f"{failed} queries went unanswered while the file was read"
    assert len(during) > 1, "no query was asked while the file was read"
    reply = udp(server, dns.message.make_query("svc-999.bulk.svc.cluster.local.", "A"))
    assert len(addresses(reply)) == 5
    assert_serving_fixture(server)
