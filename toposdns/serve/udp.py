"""The UDP frontend: answer each datagram inline, from the wire cache when possible."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

from toposdns.serve.responder import Responder, Transport

log = logging.getLogger("toposdns")


class UdpProtocol(asyncio.DatagramProtocol):
    """One UDP socket. No task per packet: the answer is computed in the callback."""

    def __init__(self, responder: Responder, kind: Transport) -> None:
        self.responder = responder
        self.kind = kind
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        assert self.transport is not None
        responder = self.responder
        reply = responder.cached(data, self.kind, addr[0])
        if reply is None:
            reply = responder.respond(data, self.kind, addr[0])
            if reply is None:
                return
        self.transport.sendto(reply, addr)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors for clients that went away: nothing to do, and not worth a log per packet.
        log.debug("udp error: %s", exc)
