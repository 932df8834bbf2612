"""EDNS options a pod makes up, through the real server: distinct large options take no memory
past the cache's bound, and what a reply echoes of them never takes it past the UDP limit."""

from __future__ import annotations

import random
import socket
from struct import pack

import dns.message
import pytest

from tests.integration.support import Server, StartServer

pytestmark = pytest.mark.integration

NAME = "frontend.shop.svc.cluster.local"
#: Queries in the flood, and the bytes of the option each carries (all different).
FLOOD = 2000
OPTION_BYTES = 30_000


def query(qid: int, options: bytes, size: int = 1232) -> bytes:
    """An A query for NAME whose OPT record (buffer `size`) carries the raw `options`."""
    plain = dns.message.make_query(NAME, "A", use_edns=False)
    plain.id = qid
    wire = plain.to_wire()
    opt = b"\0" + pack("!HHIH", 41, size, 0, len(options)) + options
    return wire[:11] + b"\x01" + wire[12:] + opt


def ask_each(server: Server, queries: list[bytes], source: str) -> list[bytes]:
    """Send each query and wait for its reply (lockstep, so none is dropped for want of room)."""
    replies = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.settimeout(2.0)
        for data in queries:
            sock.sendto(data, server.address)
            reply, _ = sock.recvfrom(65535)
            replies.append(reply)
    return replies


@pytest.mark.parametrize("code", [12, 65001], ids=["PADDING", "unknown option"])
def test_distinct_large_options_keep_memory_within_the_bound(
    start_server: StartServer, code: int
) -> None:
    server = start_server("--cache-max-bytes", "1Mi", "--forward-cache-max-bytes", "1Mi")
    rng = random.Random(code)
    ask_each(server, [query(i, b"") for i in range(50)], "127.0.0.2")  # warmed up
    _, before = server.memory()
    flood = [
        query(i % 65536, pack("!HH", code, OPTION_BYTES) + rng.randbytes(OPTION_BYTES))
        for i in range(FLOOD)
    ]
    replies = ask_each(server, flood, "127.0.0.3")
    _, after = server.memory()
    # 60 MB of options went in; what stays is within the caches' 2 MiB and the allocator's slack.
    assert after - before < 16, (before, after)
    parsed = dns.message.from_wire(replies[-1])
    assert parsed.answer and not parsed.options  # answered, nothing echoed of the option
    assert max(map(len, replies)) <= 1232


def test_a_large_padding_option_leaves_the_udp_reply_within_its_limit(
    start_server: StartServer,
) -> None:
    server = start_server()
    cookie = pack("!HH", 10, 8) + b"cookie-1"
    for padding, size in ((60_000, 65535), (1200, 1232), (100, 1232)):
        data = query(7, cookie + pack("!HH", 12, padding) + bytes(padding), size)
        (reply,) = ask_each(server, [data], "127.0.0.4")
        parsed = dns.message.from_wire(reply)
        assert len(reply) <= 1232 and parsed.answer, (padding, len(reply))
        echoed = {option.otype: option.to_wire() for option in parsed.options}
        # A client's small padding comes back as CoreDNS echoes it; a large one is left out.
        assert echoed == (
            {10: b"cookie-1", 12: bytes(padding)} if padding < 200 else {10: b"cookie-1"}
        )
