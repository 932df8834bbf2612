"""Bounded bursts of UDP queries: every one answered, and answered correctly."""

from __future__ import annotations

import selectors
import socket
import time

import dns.message
import dns.rcode
import pytest

from tests.integration.support import Server, addresses

pytestmark = pytest.mark.integration

BURST_DEADLINE = 10.0
WINDOW = 100  # queries in flight per socket, well inside the socket buffers

# (name, qtype, rcode, addresses)
QUESTIONS = [
    ("frontend.shop.svc.cluster.local.", "A", dns.rcode.NOERROR, {"10.96.10.10"}),
    ("web.shop.svc.cluster.local.", "A", dns.rcode.NOERROR, {"10.244.1.10", "10.244.2.11"}),
    ("api.shop.svc.cluster.local.", "AAAA", dns.rcode.NOERROR, {"fd00:10:96::20"}),
    ("nosuch.shop.svc.cluster.local.", "A", dns.rcode.NXDOMAIN, set()),
    ("Web-1.Web.Shop.svc.cluster.local.", "A", dns.rcode.NOERROR, {"10.244.2.11"}),
    ("workers.data.svc.cluster.local.", "A", dns.rcode.NOERROR, {"10.244.3.5", "10.244.3.6"}),
]
TEMPLATES = [dns.message.make_query(name, rtype).to_wire() for name, rtype, _, _ in QUESTIONS]


def query_bytes(qid: int) -> bytes:
    return qid.to_bytes(2, "big") + TEMPLATES[qid % len(QUESTIONS)][2:]


def check_reply(data: bytes, qid: int) -> None:
    name, rtype, rcode, expected = QUESTIONS[qid % len(QUESTIONS)]
    reply = dns.message.from_wire(data)
    assert reply.id == qid
    assert reply.rcode() == rcode, (qid, name)
    assert reply.question[0].name.to_text() == name
    assert addresses(reply, rtype) == expected, (qid, name)


def burst(server: Server, sources: list[str], per_source: int) -> dict[str, int]:
    """Send `per_source` queries from each source address, WINDOW in flight per socket.

    IDs are source_index * 10000 + n, so a reply that reached the wrong socket is caught.
    Returns the number of replies per source.
    """
    selector = selectors.DefaultSelector()
    state = {}
    try:
        for index, source in enumerate(sources):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            sock.bind((source, 0))
            sock.connect(server.address)
            sock.setblocking(False)
            state[sock] = {"base": index * 10000, "sent": 0, "got": set(), "source": source}
            selector.register(sock, selectors.EVENT_READ)

        def top_up(sock: socket.socket) -> None:
            info = state[sock]
            while info["sent"] < per_source and info["sent"] - len(info["got"]) < WINDOW:
                sock.send(query_bytes(info["base"] + info["sent"]))
                info["sent"] += 1

        for sock in state:
            top_up(sock)
        deadline = time.monotonic() + BURST_DEADLINE
        while any(len(info["got"]) < per_source for info in state.values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for key, _ in selector.select(min(remaining, 0.5)):
                sock = key.fileobj  # type: ignore[assignment]
                info = state[sock]
                for _ in range(WINDOW):  # drain what is queued, boundedly
                    try:
                        data = sock.recv(65535)
                    except BlockingIOError:
                        break
                    qid = int.from_bytes(data[:2], "big")
                    assert info["base"] <= qid < info["base"] + per_source, (
                        f"reply {qid} reached the socket of {info['source']}"
                    )
                    assert qid not in info["got"], f"two replies to {qid}"
                    check_reply(data, qid)
                    info["got"].add(qid)
                top_up(sock)
        return {info["source"]: len(info["got"]) for info in state.values()}
    finally:
        for sock in state:
            selector.unregister(sock)
            sock.close()
        selector.close()


def test_burst_of_2000_from_one_socket(shared_server: Server) -> None:
    started = time.monotonic()
    answered = burst(shared_server, ["127.0.0.1"], 2000)
    assert answered == {"127.0.0.1": 2000}
    assert time.monotonic() - started < BURST_DEADLINE


def test_burst_from_several_source_addresses(shared_server: Server) -> None:
    sources = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.1"]
    answered = burst(shared_server, sources, 500)
    assert answered == {source: 500 for source in sources}


def test_server_still_answers_after_bursts(shared_server: Server) -> None:
    burst(shared_server, ["127.0.0.5"], 200)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2.0)
        sock.sendto(query_bytes(0), shared_server.address)
        data, peer = sock.recvfrom(65535)
    assert peer == shared_server.address
    check_reply(data, 0)
