"""The compiled build against the plain one: the same queries to both servers, byte for byte.

The source tree's `toposdns` has its per-query modules compiled with mypyc (setup.py); a copy
of the tree without the .so files is the same code as plain Python. Both serve the fixture
snapshot; every query goes to both, over UDP from two clients (two places in the topology) and
over TCP, with the same ID, and the replies must be the same bytes. The queries are the
differential test's generator (every name form, qtype, EDNS option, malformed messages) plus
each name of the fixture asked with the common types.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from pathlib import Path

import dns.message
import pytest
import yaml

from tests import build_form
from tests.integration.support import (
    FIXTURE_SNAPSHOT,
    STOP_TIMEOUT,
    Server,
    copy_snapshot,
    recv_exact,
    udp,
)
from tests.unit.test_differential import Queries

pytestmark = pytest.mark.integration

SEED = 20261125
GENERATED = 400
#: The fixture's clients: node-a's pod and one no locator holds.
SOURCES = ("127.0.0.1", "127.0.0.2")
QTYPES = (1, 28, 33, 12, 16, 255, 6)  # A, AAAA, SRV, PTR, TXT, ANY, SOA


def fixture_names() -> list[tuple[str, ...]]:
    """Every Service of the fixture, and its headless endpoints' names, as labels."""
    names = []
    for item in yaml.safe_load(FIXTURE_SNAPSHOT.read_text())["items"]:
        meta = item["metadata"]
        if item["kind"] == "Service":
            names.append((meta["name"], meta["namespace"], "svc", "cluster", "local"))
        elif item["kind"] == "EndpointSlice":
            service = meta["labels"]["kubernetes.io/service-name"]
            for endpoint in item.get("endpoints", []):
                host = endpoint.get("hostname") or endpoint["addresses"][0].replace(".", "-")
                names.append((host, service, meta["namespace"], "svc", "cluster", "local"))
    return names


def messages() -> list[bytes]:
    rng = random.Random(SEED)
    queries = Queries(rng, (("cluster", "local"),))
    found = [queries.message() for _ in range(GENERATED)]
    for labels in fixture_names():
        found += [Queries.pack(0x0100, labels, qtype, 1, b"") for qtype in QTYPES]
    # Each with its own ID (the generator leaves it 0), the same to both servers.
    return [rng.randbytes(2) + message[2:] for message in found]


def dropped(message: bytes) -> bool:
    """Shorter than a header, or a response: no reply from either (waiting for none is slow)."""
    return len(message) < 12 or bool(message[2] & 0x80)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """(compiled, plain): the tree's server and a plain-Python copy's, on the same snapshot."""
    if not any(map(build_form.is_compiled, build_form.origins().values())):
        pytest.skip("this tree runs plain Python (not built, or its build fell back)")
    plain = build_form.copy_plain(tmp_path_factory.mktemp("plain"), "toposdns")
    snapshot = copy_snapshot(tmp_path_factory.mktemp("snapshot"))
    started = [Server(snapshot), Server(snapshot, tree=plain)]
    try:
        for server in started:
            server.wait_ready()
        yield started[0], started[1]
    finally:
        codes = [server.stop(STOP_TIMEOUT) for server in started]
    assert codes == [0, 0], [server.tail() for server in started]


def mapped_mypyc_modules(server: Server) -> set[str]:
    """The modules built by mypyc (and its runtime library) the server's process has loaded."""
    maps = Path(f"/proc/{server.pid}/maps").read_text().splitlines()
    loaded = {Path(line.split()[-1]) for line in maps if line.endswith(".so")}
    return {p.name for p in loaded if build_form.is_mypyc_output(p.parent, p.name)}


def ask_both(servers: tuple[Server, Server], message: bytes, source: str) -> list[bytes | None]:
    """One datagram to each server from `source`; their replies (None: none within 2 s)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in servers]
    try:
        for sock, server in zip(sockets, servers, strict=True):
            sock.bind((source, 0))
            sock.settimeout(2.0)
            sock.sendto(message, server.address)
        replies: list[bytes | None] = []
        for sock in sockets:
            try:
                replies.append(sock.recv(65535))
            except TimeoutError:
                replies.append(None)
        return replies
    finally:
        for sock in sockets:
            sock.close()


def tcp_replies(address: tuple[str, int], batch: list[bytes]) -> list[bytes | None]:
    """Each message on one connection, in turn; None where the server closed it instead."""
    replies: list[bytes | None] = []
    with socket.create_connection(address, timeout=2.0) as sock:
        for message in batch:
            sock.sendall(len(message).to_bytes(2, "big") + message)
            try:
                replies.append(recv_exact(sock, int.from_bytes(recv_exact(sock, 2), "big")))
            except ConnectionError:
                replies.append(None)
                break
    return replies


def test_the_two_servers_run_the_two_builds(servers: tuple[Server, Server]) -> None:
    compiled, plain = servers
    mypyc = mapped_mypyc_modules(compiled)
    assert any(name.startswith(f"{build_form.GROUP}__mypyc.") for name in mypyc), mypyc
    assert not mapped_mypyc_modules(plain)


def soa_serial(server: Server) -> bytes:
    """The SOA serial the server took when it loaded the file (the time, in seconds)."""
    reply = udp(server, dns.message.make_query("cluster.local.", "SOA"))
    return bytes(reply.answer[0][0].serial.to_bytes(4, "big"))


def test_compiled_and_plain_replies_are_the_same_bytes(servers: tuple[Server, Server]) -> None:
    batch = [message for message in messages() if not dropped(message)]
    # The one difference allowed: two servers that loaded the file in different seconds.
    serials = (soa_serial(servers[1]), soa_serial(servers[0]))
    differ = []
    for source in SOURCES:
        for message in batch:
            replies = ask_both(servers, message, source)
            if replies[1] is not None:
                replies[1] = replies[1].replace(*serials)
            if replies[0] != replies[1] or replies[0] is None:
                differ.append(f"UDP from {source}: {message.hex()}: {replies}")
    # TCP: a share of them, on one connection per server.
    framed = batch[:: max(1, len(batch) // 200)]
    by_tcp = [tcp_replies(server.address, framed) for server in servers]
    for message, compiled, plain in zip(framed, *by_tcp, strict=False):
        if compiled != (plain and plain.replace(*serials)):
            differ.append(f"TCP: {message.hex()}: {[compiled, plain]}")
    assert len(by_tcp[0]) == len(by_tcp[1])
    assert not differ, f"{len(differ)} of {2 * len(batch)} differ; the first: {differ[:3]}"
