"""The batched UDP frontend answers byte for byte as the event loop's transport does, over IPv4
and IPv6, one query at a time and in bursts that take several batches."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import dns.edns
import dns.flags
import dns.message
import pytest

from tests.integration.support import FIXTURE_SNAPSHOT, StartServer, copy_snapshot

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).parents[2] / "examples"
ECS = 8  # EDNS Client Subnet
COOKIE = 10
BIG = "big.data.svc.cluster.local."  # in the fixture snapshot


def queries() -> list[bytes]:
    """Queries whose replies take every path: the wire cache, the responder, truncation,
    EDNS options, topology by source and by trusted Client Subnet, errors."""
    made = [
        dns.message.make_query("web.shop.svc.cluster.local.", "A"),
        dns.message.make_query("WeB.Shop.svc.cluster.local.", "A"),
        dns.message.make_query("web.shop.svc.cluster.local.", "AAAA", use_edns=0),
        dns.message.make_query("_http._tcp.web.shop.svc.cluster.local.", "SRV"),
        dns.message.make_query("nosuch.shop.svc.cluster.local.", "A"),
        dns.message.make_query("example.org.", "A"),
        dns.message.make_query(BIG, "A", use_edns=0, payload=512),  # 60 addresses: truncated
        dns.message.make_query(
            "web.shop.svc.cluster.local.",
            "A",
            use_edns=0,
            options=[dns.edns.GenericOption(COOKIE, bytes(range(8)))],
        ),
    ]
    for subnet in ("10.244.1.0", "10.244.3.0"):  # node-a's pods, node-c's
        made.append(
            dns.message.make_query(
                "web.shop.svc.cluster.local.",
                "A",
                use_edns=0,
                options=[dns.edns.ECSOption(subnet, 24)],
            )
        )
    wires = [query.to_wire() for query in made]
    for index, wire in enumerate(wires):  # fixed IDs, so that replies compare as bytes
        wires[index] = struct.pack("!H", index + 1) + wire[2:]
    header = struct.pack("!HHHHHH", 77, 0x0100, 1, 0, 0, 0)
    return [*wires, header + b"\x03bad", header[:2]]  # FORMERR; too short: no reply


def ask(host: str, port: int, data: bytes, source: str) -> bytes | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.settimeout(0.5 if len(data) < 12 else 2.0)
        sock.sendto(data, (host, port))
        try:
            return sock.recv(65535)
        except TimeoutError:
            return None


@pytest.mark.parametrize(
    ("host", "sources", "snapshot"),
    [
        ("127.0.0.1", ["127.0.0.1", "127.0.0.4"], EXAMPLES / "topology.yaml"),  # 127.0.0.4: node-c
        ("::1", ["::1"], FIXTURE_SNAPSHOT),
    ],
)
def test_both_frontends_reply_the_same_bytes(
    start_server: StartServer, tmp_path: Path, host: str, sources: list[str], snapshot: Path
) -> None:
    replies = {}
    for batch in ("on", "off"):
        server = start_server(
            "--listen",
            f"[{host}]:0" if ":" in host else f"{host}:0",
            "--ecs-trust",
            "127.0.0.0/8,::1/128",
            "--udp-batch",
            batch,
            snapshot=copy_snapshot(tmp_path, snapshot),
        )
        assert "not built" not in server.log()  # on: the extension answers
        # The zone's SOA serial is each server's own (its start): compared as a placeholder.
        apex = dns.message.make_query("cluster.local.", "SOA").to_wire()
        soa = dns.message.from_wire(ask(host, server.port, apex, sources[0]) or b"")
        serial = struct.pack("!I", soa.answer[0][0].serial)
        replies[batch] = [
            None if reply is None else reply.replace(serial, b"SOA#")
            for _ in range(2)  # the second round from the caches
            for source in sources
            for query in queries()
            for reply in [ask(host, server.port, query, source)]
        ]
    assert replies["on"] == replies["off"]
    answered = [reply for reply in replies["on"] if reply is not None]
    assert len(answered) == len(replies["on"]) - 2 * len(sources)  # only the short packets
    if snapshot == FIXTURE_SNAPSHOT:
        big = [dns.message.from_wire(r) for r in answered if r[:2] == struct.pack("!H", 7)]
        assert big and all(r.flags & dns.flags.TC for r in big)


def test_a_burst_takes_several_batches(start_server: StartServer) -> None:
    server = start_server()
    count = 600  # more than ROUNDS x SLOTS: the rest waits for the next readiness event
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.3", 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.settimeout(2.0)
        for ident in range(count):
            query = dns.message.make_query("web.shop.svc.cluster.local.", "A", id=ident)
            sock.sendto(query.to_wire(), server.address)
        seen = set()
        while len(seen) < count:
            reply = dns.message.from_wire(sock.recv(65535))
            assert reply.answer, reply
            seen.add(reply.id)
    assert seen == set(range(count))
