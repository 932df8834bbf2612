"""`--workers 2` when the API server holds the first sync past --startup-timeout: the workers
start on unsynced data, and from the moment /ready is 200 every answer comes from the synced
data (the topology-filtered ones included) in both workers, and follows changes at once."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import pytest

from tests.integration.support import STOP_TIMEOUT, Server, addresses, http_get, wait_until
from tests.integration.test_live import ON_NODE_A, TRUE_ANSWERS, trusted_cluster
from tests.kubeapi import FakeApiServer
from tests.objects import endpoint, endpoint_slice

pytestmark = pytest.mark.integration

DB = "db.shop.svc.cluster.local"
#: How long the stand-in holds the PodLocator list: well past the startup timeout.
HELD = 4.0
STARTUP_TIMEOUT = "1"
#: Queries per client and round, each from a port of its own: all on one of two workers has
#: odds of 2**-19.
SPREAD = 20
#: Each worker started before the sync leaves through a lameduck this long.
LAMEDUCK = "2"
#: How long answers are checked after the change's second: past two lameducks.
WATCHED = 3.5
SERVING = re.compile(r"worker \d \(pid \d+\) serving")
#: The endpoint added in the first moments after /ready: in z1, with the one there already.
ADDED = "10.244.1.11"


def db_answers(server: Server, client: str) -> list[list[str]]:
    """db's A records as `client` sees them, asked from SPREAD source ports."""
    return [sorted(addresses(ask_db(server, client))) for _ in range(SPREAD)]


def ask_db(server: Server, client: str) -> dns.message.Message:
    """db's reply to `client`, asked again (from another port) when none came, as a stub
    resolver does: a datagram still queued on a worker's socket as the worker leaves is lost
    (the kernel gives the next ones to the sockets left), so a query may go unanswered then."""
    query = dns.message.make_query(DB, "A")
    try:
        return dns.query.udp(query, server.host, 2.0, server.port, source=client)
    except dns.exception.Timeout:
        return dns.query.udp(query, server.host, 2.0, server.port, source=client)


Answers = dict[str, list[str]]


def wrong_answers(server: Server, http: int, accepted: tuple[Answers, ...]) -> list[str]:
    """What is wrong, asked now: /ready not 200, or an answer to a client that is none of its
    `accepted` ones."""
    wrong = []
    status = http_get(http, "/ready")
    if status != (200, "OK"):
        wrong.append(f"/ready {status}")
    for client in accepted[0]:
        right = [answers[client] for answers in accepted]
        wrong += [f"{client} got {got}" for got in db_answers(server, client) if got not in right]
    return wrong


def check_for(seconds: float, server: Server, http: int, *accepted: Answers) -> None:
    """Ask every client, round after round, for `seconds` (at least once): each answer is one
    of the `accepted`, and /ready stays 200."""
    deadline = time.monotonic() + seconds
    while True:
        wrong = wrong_answers(server, http, accepted)
        assert not wrong, f"{wrong[:6]} ({len(wrong)} wrong)\n{server.log()}"
        if time.monotonic() >= deadline:
            return


def test_every_answer_is_synced_from_the_moment_ready(api: FakeApiServer, tmp_path: Path) -> None:
    for obj in trusted_cluster():
        api.add(obj)
    api.hold_list("podlocators", HELD)  # no client is placed until it answers
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    options = ("--workers", "2", "--http", "127.0.0.1:0", "--lameduck", LAMEDUCK)
    server = Server(
        None, ("--kubeconfig", str(kubeconfig), "--startup-timeout", STARTUP_TIMEOUT, *options)
    )
    try:
        server.wait_ready()  # serving, before the sync
        http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        assert http_get(http, "/ready") == (503, "kubernetes")
        for client in TRUE_ANSWERS:  # clients ask meanwhile (and caches hold the answers)
            db_answers(server, client)
        assert wait_until(lambda: http_get(http, "/ready")[0] == 200, HELD + 5, interval=0.02)
        check_for(0, server, http, TRUE_ANSWERS)  # the first moment

        slice_ = endpoint_slice(
            "db",
            "shop",
            [
                endpoint("10.244.1.10", nodeName="node-a", zone="z1"),
                endpoint(ADDED, nodeName="node-a", zone="z1"),
                endpoint("10.244.2.10", nodeName="node-b", zone="z2"),
            ],
        )
        api.modify(slice_)
        changed = time.monotonic()
        with_added = TRUE_ANSWERS | {ON_NODE_A: sorted(["10.244.1.10", ADDED])}
        # Until a second has passed, either is right; after, only the change.
        check_for(changed + 1.0 - time.monotonic(), server, http, TRUE_ANSWERS, with_added)
        check_for(WATCHED, server, http, with_added)
        # Both workers started before the sync were replaced meanwhile, by ones forked after it.
        assert wait_until(lambda: len(SERVING.findall(server.log())) == 4, 5), server.log()
    finally:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            server.wait_for_log(f"answering for {LAMEDUCK}s more")
        assert server.stop(STOP_TIMEOUT) == 0, server.log()  # a second signal: at once
