"""Replies kept by query key, per transport, and what each one was built from.

The key is the query after its ID, without EDNS options (wire/edns.py `split_query`). A value is
one of:

- `bytes`: the reply after its ID, the same for every client (the hot path's case);
- `SerialReply`: a reply carrying the zone's SOA (negative answers, SOA queries); its serial is
  rewritten in place when the snapshot's serial moves on, so a change does not empty it;
- `Orderings`: with `--loadbalance`, a reply whose address records are served in varying order;
- `TopologyReplies`: one reply per client signature, for names whose answer depends on the
  client (a headless service with a topology policy).

Each entry is listed under the `Dependency` words its answer read (resolver `Answer.depends`).
A new snapshot that follows the previous one drops only the entries under the words it changed;
any other snapshot empties the cache. A full table is emptied whole: cheaper than LRU bookkeeping
on every hit, and refilled by the queries that still come.
"""

from __future__ import annotations

from collections.abc import Iterable
from struct import pack

from toposdns.store.snapshot import Dependency
from toposdns.store.topology import Labels, Policy
from toposdns.wire.decode import serial_offset
from toposdns.wire.shuffle import shuffle_reply

#: Entries per transport before the table is emptied.
TABLE_SIZE = 100_000


class SerialReply:
    """A reply (after its ID) whose bytes carry the SOA serial `serial`."""

    __slots__ = ("reply", "serial", "offset")

    def __init__(self, reply: bytes, serial: int) -> None:
        self.reply = reply
        self.serial = serial
        #: Where the serial is, found the first time it must be rewritten (most negative
        #: replies are never asked for again).
        self.offset = -1

    def current(self, serial: int) -> bytes:
        """The reply with this serial (rewritten once per serial, not per hit)."""
        if serial != self.serial:
            if self.offset < 0:
                try:
                    self.offset = serial_offset(b"\x00\x00" + self.reply) - 2
                except ValueError:  # the SOA did not fit in the reply: nothing to rewrite
                    self.offset = len(self.reply)
            at = self.offset
            if at < len(self.reply):
                serial_bytes = pack("!I", serial & 0xFFFFFFFF)
                self.reply = self.reply[:at] + serial_bytes + self.reply[at + 4 :]
            self.serial = serial
        return self.reply


class Orderings:
    """A reply whose records' order varies from reply to reply (`--loadbalance`).

    A few orderings are made with CoreDNS's shuffle (wire/shuffle.py) and served in turn, and
    every `REFRESH` replies one of them is made anew: a hit costs a counter, not a shuffle, and
    over time the orders are spread as CoreDNS's shuffle spreads them.
    """

    __slots__ = ("base", "variants", "turn")

    COUNT = 4
    REFRESH = 256

    def __init__(self, base: bytes) -> None:
        self.base = base
        self.variants = [self.shuffled() for _ in range(self.COUNT)]
        self.turn = 0

    @classmethod
    def of(cls, reply: bytes) -> Orderings | None:
        """Orderings of a reply (after its ID), or None if its order never varies."""
        return cls(reply) if shuffle_reply(b"\x00\x00" + reply) is not None else None

    def shuffled(self) -> bytes:
        varied = shuffle_reply(b"\x00\x00" + self.base)
        return self.base if varied is None else varied[2:]

    def current(self, serial: int = 0) -> bytes:
        """The next ordering (`serial` is for the interface SerialReply shares)."""
        turn = self.turn = self.turn + 1
        if turn % self.REFRESH == 0:
            self.variants[turn // self.REFRESH % self.COUNT] = self.shuffled()
        return self.variants[turn % self.COUNT]


Reply = bytes | SerialReply | Orderings


#: A topology-filtered reply and the `TopologyCounts` row its answers count in.
TopologyReply = tuple[Reply, list[int]]


class TopologyReplies:
    """Replies to one query whose answer depends on the client, by client signature."""

    __slots__ = ("policy", "replies", "by_labels", "held")

    #: How many label sets an entry remembers directly (more are still answered, just slower).
    REMEMBERED = 256

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.replies: dict[tuple[object, ...], TopologyReply] = {}
        #: id(labels) -> reply. Equal label sets are one interned object (store/convert.py);
        #: `held` keeps each remembered one alive, so its id cannot pass to another object.
        self.by_labels: dict[int, TopologyReply] = {}
        self.held: list[Labels] = []

    def get(self, labels: Labels, serial: int) -> tuple[bytes, list[int]] | None:
        """The reply for a client with these labels, if one is cached, and its counts row."""
        found = self.by_labels.get(id(labels))
        if found is None:
            found = self.replies.get(self.policy.signature(labels))
            if found is None:
                return None
            if len(self.held) < self.REMEMBERED:
                self.by_labels[id(labels)] = found
                self.held.append(labels)
        reply, row = found
        if reply.__class__ is bytes:
            return found  # type: ignore[return-value]
        return reply.current(serial), row  # type: ignore[union-attr]


Entry = bytes | SerialReply | Orderings | TopologyReplies


class ReplyCache:
    """The cached replies of one transport, and the index of what they depend on."""

    def __init__(self, size: int = TABLE_SIZE) -> None:
        self.size = size
        #: Query key -> entry. Frontends hold a reference: it is only ever emptied in place.
        self.table: dict[bytes, Entry] = {}
        self.dependents: dict[Dependency, set[bytes]] = {}

    def store(
        self,
        key: bytes,
        reply: Reply,
        policy: Policy | None,
        labels: Labels,
        depends: Iterable[Dependency],
        row: list[int] | None = None,
    ) -> bool:
        """Keep a reply (after its ID); a topology-filtered one (`policy`) with the counts `row`
        its hits count in. Returns True if the table had to be emptied first."""
        table = self.table
        emptied = len(table) >= self.size
        if emptied:
            self.clear()
        if policy is None:
            table[key] = reply
        else:
            entry = table.get(key)
            if not isinstance(entry, TopologyReplies):
                entry = table[key] = TopologyReplies(policy)
            entry.replies[policy.signature(labels)] = (reply, row or [0, 0])
        dependents = self.dependents
        for word in depends:
            keys = dependents.get(word)
            if keys is None:
                dependents[word] = {key}
            else:
                keys.add(key)
        return emptied

    def invalidate(self, changes: Iterable[Dependency]) -> None:
        """Drop the entries that read anything `changes` names."""
        table = self.table
        dependents = self.dependents
        for word in changes:
            for key in dependents.pop(word, ()):
                table.pop(key, None)

    def clear(self) -> None:
        """Drop everything."""
        self.table.clear()
        self.dependents.clear()
