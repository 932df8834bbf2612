"""The UDP frontend: answer each datagram inline, from the wire cache when possible."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from time import perf_counter
from typing import Any, cast

from toposdns.resolve.client import NO_LABELS
from toposdns.serve.acl import Screen
from toposdns.serve.cache import Cached, TopologyReplies
from toposdns.serve.query_metrics import FIRST_BOUND
from toposdns.serve.responder import UDP4, Responder, Transport

log = logging.getLogger("toposdns")

#: With metrics on, one fast-path cache hit in this many is timed (every other query is). A
#: clock read costs as much as such a hit where the clock is a system call (as on many VMs),
#: and a hit takes the same few microseconds every time: an untimed hit counts the duration of
#: the last timed one, which keeps each bucket's count an unbiased estimate and the number of
#: queries exact.
TIMED_EVERY = 16


class UdpProtocol(asyncio.DatagramProtocol):
    """One UDP socket. No task per packet: answers are computed in the callback, and only a
    query that needs an upstream gets a task."""

    def __init__(self, responder: Responder, kind: Transport) -> None:
        self.kind = kind
        #: An IPv6 socket, where IPv4 clients arrive IPv4-mapped when it is bound to `::`.
        self.mapping = kind.family == 2
        self.use(responder)
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: set[asyncio.Task[None]] = set()
        #: CoreDNS's `acl`, checked before anything else: None, or what the client gets.
        self.screen: Screen | None = None

    def use(self, responder: Responder) -> None:
        """Answer with `responder` from the next datagram on (a reloaded configuration)."""
        self.responder = responder
        self.reply_cache = responder.cache
        self.table = responder.cache.table  # only ever changed in place
        #: Where each client is placed, remembered per snapshot (also only changed in place).
        self.placed = responder.placer.placed
        self.metrics = responder.metrics
        #: Fast-path hits until the next timed one, and the last timed hit's duration.
        self.untimed = 0
        self.hit_seconds = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Any) -> None:
        transport = self.transport
        assert transport is not None
        source = addr[0]
        kind = self.kind
        if self.mapping and source.startswith("::ffff:") and "." in source:
            # An IPv4 client of a socket bound to `::` (transport.py `unmapped`, inlined): an
            # IPv4 client to every rule, metric and size limit, as on an IPv4 socket. Replies
            # still go to `addr`.
            source, kind = source[7:], UDP4
        if self.screen is not None and (verdict := self.screen(data, source)) is not None:
            if verdict:
                transport.sendto(verdict, addr)
            return
        metrics = self.metrics
        started = 0.0
        if metrics is not None:
            self.untimed -= 1
            if self.untimed < 0:
                self.untimed = TIMED_EVERY - 1
                started = perf_counter()
        # The hot path: a query without OPT record, its name in lower case, whose reply is
        # cached whole within 512 bytes and in lower case too (`Cached.small`). Its bytes after
        # the ID are then its key as they are (wire/edns.py plain_key); any other query misses
        # here and the responder folds its key.
        entry = self.table.get(data[2:])
        counts = None
        if entry.__class__ is TopologyReplies and kind is UDP4:
            # This client's domain's reply; no options, so no Client Subnet to place it by. An
            # IPv4 source is the locators' key as it is (an IPv6 one may carry a zone index).
            placement = self.placed.get(source)
            if placement is not None:  # else the responder places it first
                locator = placement.locator
                labels = NO_LABELS if locator is None else locator.labels
                # ReplyCache.choose, its memo looked up inline: the call costs as much.
                found = entry.by_labels.get(id(labels))
                if found is None:
                    found = self.reply_cache.choose(entry, labels)
                turns = None if found is None else found.turns
                if turns is not None:
                    # Topology weights: this turn's reply, its turn taken, when this path serves
                    # it (no OPT record, every turn's reply small); else the responder's turn.
                    found = None if data[11] else turns.take_small()
                if found is not None:
                    entry, counts = found, found.row
        if type(entry) is Cached and entry.small and not data[11]:
            cached = entry  # the raw key matched its lower-cased key: the same case
            rotation = cached.rotation
            if rotation is None:
                transport.sendto(data[:2] + cached.reply, addr)
            elif rotation.orders:  # --loadbalance: the next order, Rotation.next inlined
                turn = rotation.turn = rotation.turn + 1
                orders = rotation.orders
                transport.sendto(data[:2] + orders[turn % len(orders)], addr)
            else:
                transport.sendto(data[:2] + rotation.next(), addr)
            self.reply_cache.hits += 1
            if counts is not None:
                # topology_metrics.count written out: the call costs as much as the count.
                counts[0] += 1
                if labels is NO_LABELS:  # no locator holds the client's address
                    counts[1] += 1
            if metrics is not None and cached.hits is not None:
                # query_metrics.count_hit written out, for the same reason; timed or not.
                hits = cached.hits[kind.slot]
                if started:
                    seconds = self.hit_seconds = perf_counter() - started
                else:
                    seconds = self.hit_seconds
                if seconds <= FIRST_BOUND:
                    row = hits.row
                    row[0] += 1
                    row[1] += seconds
                else:
                    metrics.slow_hit(hits, seconds)
            return
        if metrics is not None:  # every other query is timed, and the next hit too
            self.untimed = 0
            started = started or perf_counter()
        answer = self.responder.respond(data, kind, source, started)
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
