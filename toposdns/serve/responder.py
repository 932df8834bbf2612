"""Bytes in, bytes out: decode, resolve, encode, and the caches that keep this off the hot path.

Two caches, both emptied whenever a new snapshot arrives:

- the *wire* cache maps a query's bytes after its ID to the reply's bytes after the ID, one per
  transport (the reply size limits differ). A hit costs one dict lookup and a concatenation.
  Only queries without EDNS options go in, since options such as cookies differ per client.
- the *answer* cache maps (name as asked, qtype) to the resolver's Answer, so queries that miss
  the wire cache (cookies, odd flags) are only re-encoded, not re-resolved.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cachetools import LRUCache

from toposdns.resolve.answer import REFUSED, SERVFAIL, Answer, Name, name_text, type_name
from toposdns.resolve.resolver import ResolverConfig, resolve
from toposdns.store.snapshot import Snapshot
from toposdns.wire.decode import Dropped, Query, Rejected, decode_query
from toposdns.wire.encode import (
    FRAGMENT_LIMIT_V4,
    FRAGMENT_LIMIT_V6,
    MAX_TCP_SIZE,
    encode_badvers,
    encode_bare,
    encode_rejection,
    encode_reply,
    udp_limit,
)

log = logging.getLogger("toposdns")

CLASS_IN = 1
WIRE_CACHE_SIZE = 100_000
ANSWER_CACHE_SIZE = 50_000


@dataclass(frozen=True, slots=True)
class Transport:
    """How a query arrived, which decides the reply's size limits."""

    name: str
    tcp: bool
    fragment_limit: int


UDP4 = Transport("udp4", False, FRAGMENT_LIMIT_V4)
UDP6 = Transport("udp6", False, FRAGMENT_LIMIT_V6)
TCP = Transport("tcp", True, 0)


class Responder:
    """Answers raw queries from the current snapshot."""

    def __init__(self, config: ResolverConfig, snapshot: Snapshot) -> None:
        self.config = config
        self.snapshot = snapshot
        #: Per-transport wire caches; frontends hold references, so they are cleared in place.
        self.wire: dict[Transport, dict[bytes, bytes]] = {UDP4: {}, UDP6: {}, TCP: {}}
        self.answers: LRUCache[tuple[Name, int], Answer] = LRUCache(ANSWER_CACHE_SIZE)

    def update(self, snapshot: Snapshot) -> None:
        """Serve from a new snapshot; every cached reply is dropped."""
        self.snapshot = snapshot
        for cache in self.wire.values():
            cache.clear()
        self.answers.clear()

    def respond(self, data: bytes, transport: Transport) -> bytes | None:
        """The reply to one query message, or None when it gets none."""
        try:
            query = decode_query(data)
        except Dropped:
            return None
        except Rejected as rejected:
            return encode_rejection(rejected.data, rejected.rcode)
        try:
            reply = self.reply(query, transport)
        except Exception:
            log.exception(
                "internal error answering %s %s; replied SERVFAIL",
                name_text(query.name),
                type_name(query.qtype),
            )
            return encode_bare(query, SERVFAIL)
        if query.edns is None or not query.edns.options:
            cache = self.wire[transport]
            if len(cache) >= WIRE_CACHE_SIZE:
                cache.clear()  # cheaper than LRU bookkeeping on every hit
            cache[data[2:]] = reply[2:]
        return reply

    def reply(self, query: Query, transport: Transport) -> bytes:
        """Encode the reply to a decoded query."""
        if query.qclass != CLASS_IN:
            return encode_bare(query, REFUSED)
        if query.edns is not None and query.edns.version != 0:
            return encode_badvers(query)
        answer = self.answer(query.name, query.qtype)
        limit = MAX_TCP_SIZE if transport.tcp else udp_limit(query.edns)
        return encode_reply(query, answer, limit, transport.fragment_limit)

    def answer(self, name: Name, qtype: int) -> Answer:
        """The resolver's answer, cached until the next snapshot."""
        key = (name, qtype)
        answer = self.answers.get(key)
        if answer is None:
            answer = resolve(name, qtype, self.snapshot, self.config)
            self.answers[key] = answer
        return answer
