"""The UDP frontend: answer each datagram inline, from the wire cache when possible."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from time import perf_counter
from typing import Any, cast

from toposdns.resolve.client import NO_LABELS
from toposdns.serve.acl import Screen
from toposdns.serve.cache import Orderings, TopologyReplies
from toposdns.serve.query_metrics import FIRST_BOUND, count_hit
from toposdns.serve.responder import UDP4, Responder, Transport

log = logging.getLogger("toposdns")


class UdpProtocol(asyncio.DatagramProtocol):
    """One UDP socket. No task per packet: answers are computed in the callback, and only a
    query that needs an upstream gets a task."""

    def __init__(self, responder: Responder, kind: Transport) -> None:
        self.kind = kind
        # An IPv4 source is the locators' key as it is (IPv6 sockets may see mapped ones).
        self.plain_addresses = kind is UDP4
        self.use(responder)
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: set[asyncio.Task[None]] = set()
        #: CoreDNS's `acl`, checked before anything else: None, or what the client gets.
        self.screen: Screen | None = None

    def use(self, responder: Responder) -> None:
        """Answer with `responder` from the next datagram on (a reloaded configuration)."""
        self.responder = responder
        self.cache = responder.caches[self.kind].table  # only ever changed in place
        self.metrics = responder.metrics
        self.hits = self.metrics.hits_for(self.kind) if self.metrics is not None else {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        transport = self.transport
        assert transport is not None
        if self.screen is not None and (verdict := self.screen(data, addr[0])) is not None:
            if verdict:
                transport.sendto(verdict, addr)
            return
        metrics = self.metrics
        started = perf_counter() if metrics is not None else 0.0
        key = data[2:]
        hit = self.cache.get(key)
        if hit.__class__ is Orderings:  # --loadbalance: the same reply, its records in turn
            hit = hit.current()
        if hit.__class__ is bytes:  # the hot path: a reply that is the same for every client
            transport.sendto(data[:2] + hit, addr)
            if metrics is not None:
                # query_metrics.count_hit written out: the call would cost as much as the count.
                hits = self.hits.get(key)
                if hits is not None:
                    seconds = perf_counter() - started
                    if seconds <= FIRST_BOUND:
                        row = hits.row
                        row[0] += 1
                        row[1] += seconds
                    else:
                        metrics.slow_hit(hits, seconds)
            return
        responder = self.responder
        if hit.__class__ is TopologyReplies and self.plain_addresses:
            # This client's domain's reply; no options, so no Client Subnet to place it by.
            placed = responder.placer.placed.get(addr[0])
            locator = None if placed is None else placed.locator
            labels = NO_LABELS if locator is None else locator.labels
            cached = None if placed is None else hit.get(labels, responder.snapshot.serial)
            if cached is not None:
                reply, counts = cached
                transport.sendto(data[:2] + reply, addr)
                # topology_metrics.count written out: the call would cost as much as the count.
                counts[0] += 1
                if labels is NO_LABELS:  # no locator holds the client's address
                    counts[1] += 1
                if metrics is not None:
                    count_hit(metrics, self.hits, key, started)
                return
        answer = responder.respond(data, self.kind, addr[0], started)
        if isinstance(answer, bytes):
            transport.sendto(answer, addr)
        elif answer is not None:
            self.later(answer, addr)

    def later(self, answer: Coroutine[Any, Any, bytes | None], addr: Any) -> None:
        """Send a reply once its upstream lookup is done."""

        async def send() -> None:
            reply = await answer
            if reply is not None and self.transport is not None:
                self.transport.sendto(reply, addr)

        task = asyncio.create_task(send())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def error_received(self, exc: Exception) -> None:
        # ICMP errors for clients that went away: nothing to do, and not worth a log per packet.
        log.debug("udp error: %s", exc)
