"""The batched UDP frontend: recvmmsg and sendmmsg around the UDP frontend's per-datagram logic.

uvloop reads each datagram with its own system call and sends each reply with another. Here,
on each readiness event, the socket is read `SLOTS` datagrams per `recvmmsg` until it is empty
(or `ROUNDS` reads have been made, so that TCP and timers get their turn under a flood), each
datagram is answered by `UdpProtocol.datagram_received` as the uvloop frontend answers it, and
the replies of each read go out in one `sendmmsg`. Replies that wait for an upstream are sent
when they are ready, one call each. Needs the `datagrams` C extension (built by setup.py).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket

from toposdns.serve.udp import UdpProtocol

log = logging.getLogger("toposdns")

try:
    from toposdns.serve.datagrams import Datagrams
except ImportError as error:  # not built (no C compiler): the event loop's transport answers
    MISSING: str | None = str(error)
else:
    MISSING = None
_warned = False

#: Datagrams read per system call, as many as libuv reads per readiness event.
SLOTS = 32
#: Reads per readiness event at most.
ROUNDS = 8


def wanted(setting: str) -> bool:
    """Whether to answer UDP in batches: `--udp-batch on` and the extension built. The first
    time it is on but not built, one warning line (workers inherit it from the supervisor)."""
    global _warned
    if setting != "on":
        return False
    if MISSING is not None and not _warned:
        _warned = True
        log.warning(
            "--udp-batch on: the C extension toposdns.serve.datagrams is not built (%s); "
            "answering UDP one datagram per system call. Install with a C compiler to build it",
            MISSING,
        )
    return MISSING is None


class BatchedUdp:
    """One UDP socket answered in batches by `protocol` (whose transport this becomes)."""

    def __init__(self, protocol: UdpProtocol, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.protocol = protocol
        self.datagrams = Datagrams(sock.fileno(), sock.family, SLOTS)
        #: Replies the kernel refused so far, and whether the last send refused any: a change
        #: of state is logged, never a packet.
        self.dropped = 0
        self.dropping = False
        host, port = sock.getsockname()[:2]
        self.where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        protocol.connection_made(self.datagrams)  # type: ignore[arg-type]

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer from now on, whenever the socket is readable."""
        loop.add_reader(self.sock.fileno(), self.ready)

    def close(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop answering and close the socket."""
        loop.remove_reader(self.sock.fileno())
        self.protocol.transport = None
        self.sock.close()

    def ready(self) -> None:
        """Answer what is queued on the socket, a batch at a time."""
        datagrams = self.datagrams
        answer = self.protocol.datagram_received
        for _ in range(ROUNDS):
            try:
                batch = datagrams.recv()
            except OSError as exc:  # as uvloop does: not worth a line per packet
                log.debug("udp error: %s", exc)
                return
            try:
                for data, addr in batch:
                    answer(data, addr)
            finally:
                datagrams.flush()
            if len(batch) < SLOTS:
                break
        if datagrams.dropped != self.dropped or self.dropping:
            self.note_drops()

    def note_drops(self) -> None:
        """One line when replies start being dropped, one when all are sent again."""
        datagrams = self.datagrams
        dropping = datagrams.dropped != self.dropped
        if dropping and not self.dropping:
            code = datagrams.last_error
            full = code in (errno.EAGAIN, errno.ENOBUFS)
            log.warning(
                "UDP replies dropped on %s: %s (%s): %s",
                self.where,
                os.strerror(code),
                errno.errorcode.get(code, str(code)),
                "the socket's send buffer is full: raise net.core.wmem_max, or add workers"
                if full
                else "the kernel refused them",
            )
        elif self.dropping and not dropping:
            log.info("UDP replies sent again on %s", self.where)
        self.dropped = datagrams.dropped
        self.dropping = dropping
