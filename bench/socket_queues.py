"""Kernel memory held by a server's TCP sockets, for `bench/hostile.py`, from `ss -tanp`.

Every TCP socket whose local address is one of the server's, except listeners (their Recv-Q
counts connections waiting to be accepted, not bytes) and TIME-WAIT (no queues): how many, how
many are the server's own, how many are orphans (closed by the server, so no process holds them,
while the kernel still sends what was queued: FIN-WAIT-1, FIN-WAIT-2, CLOSING, LAST-ACK), and the
bytes in their receive and send queues (Recv-Q, Send-Q). Connections the kernel has made but the
server not yet accepted belong to no process either, and are neither. Only the server's side is
counted, not the clients' sockets to it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from bench.harness import HOST

SKIPPED_STATES = {"LISTEN", "TIME-WAIT", "UNCONN"}
CLOSING_STATES = {"FIN-WAIT-1", "FIN-WAIT-2", "CLOSING", "LAST-ACK"}
PID = re.compile(r"pid=(\d+)")


@dataclass
class SocketQueues:
    """The server side of the connections to some ports."""

    sockets: int = 0
    #: Sockets the server has closed and the kernel still holds (bytes queued, or closing).
    orphans: int = 0
    #: Orphans with bytes still in a queue: memory the server's connection cap never counts.
    orphans_holding: int = 0
    #: Sockets of the server's own process (the ones its cap can count).
    owned: int = 0
    recv_q: int = 0
    send_q: int = 0
    error: str = ""

    @property
    def queued(self) -> int:
        return self.recv_q + self.send_q

    def text(self) -> str:
        if self.error:
            return f"? ({self.error})"
        return f"{self.queued / 1024:,.0f} KiB ({self.sockets} sockets, {self.orphans} orphans)"

    def summary(self) -> dict[str, object]:
        return {
            "sockets": self.sockets,
            "owned": self.owned,
            "orphans": self.orphans,
            "orphans_holding_bytes": self.orphans_holding,
            "recv_q_bytes": self.recv_q,
            "send_q_bytes": self.send_q,
            **({"error": self.error} if self.error else {}),
        }


def socket_queues(ports: Iterable[int], pids: Iterable[int], host: str = HOST) -> SocketQueues:
    """The server side of every TCP socket on `host`:`ports`; `pids` are the server's
    processes."""
    try:
        done = subprocess.run(
            ["ss", "-Htanp"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return SocketQueues(error=f"ss: {exc}")
    return count_queues(done.stdout, [f"{host}:{port}" for port in ports], pids)


def count_queues(listing: str, local: Iterable[str], pids: Iterable[int]) -> SocketQueues:
    """Count the sockets of `ss -Htanp` output whose local address is one of `local`
    (`127.0.0.1:53`); those of `pids` are the server's own."""
    wanted = set(local)
    mine = {str(pid) for pid in pids}
    found = SocketQueues()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] in SKIPPED_STATES:
            continue
        if fields[3] not in wanted:  # a client's socket has the server's address as its peer
            continue
        recv_q, send_q = int(fields[1]), int(fields[2])
        owners = set(PID.findall(line))
        found.sockets += 1
        found.recv_q += recv_q
        found.send_q += send_q
        if owners & mine:
            found.owned += 1
        elif not owners and fields[0] in CLOSING_STATES:
            found.orphans += 1
            if recv_q or send_q:
                found.orphans_holding += 1
    return found
