"""The pure parts of bench/hostile.py: the count of a server's sockets from `ss` output, and
the shipped forwarder configurations it plays (found where they are shipped)."""

from __future__ import annotations

from bench.hostile import shipped_block, trusted_services
from bench.socket_queues import count_queues

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
    # Orphans are the sockets it closed; the one it has not accepted yet is none.
    assert (found.orphans, found.orphans_holding) == (2, 1)
    assert (found.recv_q, found.send_q) == (65, 212992)


def test_the_shipped_forwarders_are_found() -> None:
    for hop in ("coredns", "nodelocal"):
        directives, where = shipped_block(hop)
        names = [words[0] for words, _ in directives]
        assert "forward" in names and "rewrite" in names, (hop, where, names)
    assert trusted_services(), "the coredns-forward overlay trusts no Service's endpoints"
