"""The pure parts of bench/hostile.py: the stand-in forwarder's `rewrite edns0 subnet` (CoreDNS's
plugin/rewrite semantics, as a table), the count of a server's sockets from `ss` output, and
that the shipped CoreDNS and NodeLocal configurations name the rewrite mode the bench follows."""

from __future__ import annotations

import dns.edns
import dns.message
import pytest

from bench.ecs_forwarder import MODES, rewrite_subnet
from bench.hostile import shipped_rewrite
from bench.socket_queues import count_queues
from tests.server_process import REPO

POD = "10.244.1.7"
FORGED = "10.244.2.9"

# mode, the Client Subnet address the pod sent (None: no option), what goes upstream
REWRITES = [
    ("set", None, POD),
    ("set", FORGED, POD),
    ("append", None, POD),
    ("append", FORGED, FORGED),
    ("replace", None, None),
    ("replace", FORGED, POD),
    (None, None, None),
    (None, FORGED, FORGED),
]


def subnets(query: dns.message.Message) -> list[tuple[str, int]]:
    return [
        (option.address, option.srclen)
        for option in query.options
        if isinstance(option, dns.edns.ECSOption)
    ]


@pytest.mark.parametrize(("mode", "sent", "forwarded"), REWRITES)
def test_rewrite_edns0_subnet(mode: str | None, sent: str | None, forwarded: str | None) -> None:
    options: list[dns.edns.Option] = [dns.edns.ECSOption(sent, 32)] if sent else []
    query = dns.message.make_query(
        "web.shop.svc.cluster.local.", "A", use_edns=0 if sent else False, options=options
    )
    rewrite_subnet(query, mode, POD)
    assert subnets(query) == ([] if forwarded is None else [(forwarded, 32)])
    if forwarded is not None and sent is None:
        assert query.payload == 4096  # the OPT record CoreDNS adds (setupEdns0Opt)


SS = """\
LISTEN     0      1024   127.0.0.1:5353   0.0.0.0:*         users:(("python",pid=100,fd=3))
ESTAB      0      0      127.0.0.1:5353   127.0.2.1:40000   users:(("python",pid=100,fd=9))
FIN-WAIT-1 0      212992 127.0.0.1:5353   127.0.2.1:40001
FIN-WAIT-2 0      0      127.0.0.1:5353   127.0.2.1:40002
ESTAB      60     0      127.0.0.1:5353   127.0.2.1:40003
TIME-WAIT  0      0      127.0.0.1:5353   127.0.2.1:40004
ESTAB      0      4096   127.0.2.1:40000  127.0.0.1:5353    users:(("python",pid=200,fd=7))
ESTAB      0      100    127.0.0.1:9999   127.0.2.1:40005   users:(("python",pid=300,fd=4))
ESTAB      5      0      127.0.0.1:8080   127.0.3.1:40006   users:(("python",pid=101,fd=11))
"""


def test_the_server_side_of_its_ports_is_counted() -> None:
    found = count_queues(SS, ["127.0.0.1:5353", "127.0.0.1:8080"], [100, 101])
    # Not the listener, TIME-WAIT, the client's end or another server's port.
    assert found.sockets == 5
    assert found.owned == 2
    assert (found.orphans, found.orphans_holding) == (2, 1)  # not the one not yet accepted
    assert (found.recv_q, found.send_q) == (65, 212992)


@pytest.mark.parametrize("hop", ["coredns", "nodelocal"])
def test_the_shipped_configuration_names_a_rewrite_mode(hop: str) -> None:
    mode, where = shipped_rewrite(hop)
    assert mode in MODES, where
    path, _, line = where.rpartition(":")
    assert "rewrite edns0 subnet" in (REPO / path).read_text().splitlines()[int(line) - 1]
