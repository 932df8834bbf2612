"""Replies kept by query key, bounded in bytes, and what each one was built from.

The key is the query after its ID, its name in lower case, without the EDNS buffer size and
options (wire/edns.py `split_query`). A value is one of:

- `Cached`: one reply (after its ID), whole, in the letter case of the query that built it,
  the same for every client: the frontends cut it to each query's size limit and give it the
  query's ID and OPT record, and the letters of a query in another case where it copies the
  name asked (its `case`, wire/case.py). It may carry the zone's SOA serial, rewritten in
  place when the snapshot's serial moves on, and with `--loadbalance` a `Rotation` of its
  address records.
  It holds the counters of its hits (serve/query_metrics.py `Hits`), set and dropped with it;
- `TopologyReplies`: one `Cached` per client signature, for names whose answer depends on the
  client (a headless service with a topology policy).

Beside them, per transport, the replies as the queries that hit them got them (`Rendered`):
with their OPT record, the options they echo, cut to their limit, under the query's whole
message after its ID. Clients repeat their own options (a stub resolver its cookie, a forwarder
its clients' Client Subnets), so a query with options that was answered once from the cache is
answered the next time by one lookup, as a plain query is. They are all forgotten with each new
snapshot, and whenever they would take more than an eighth of the bound.

Each entry is listed under the `Dependency` words its answer read (resolver `Answer.depends`).
A new snapshot that follows the previous one drops only the entries under the words it changed;
any other snapshot empties the cache.

The cache holds at most `max_bytes`, counted as the bytes of keys, replies and names plus what
Python spends on each entry and each dependency word (`ENTRY_OVERHEAD`, `WORD_OVERHEAD`,
measured with tracemalloc: tests/unit/test_cache.py holds them to it), with the memos above
(rendered replies, EDNS options, case maps). From the bound it first sets aside the bitmap
that marks the names asked once (`again`) and the templates' share (serve/negative.py's
endpoint names): the rest is its `room`. Past that, the oldest entries go first, an eighth of
the room at a time so that eviction costs little per insert; a reply larger than
`max_reply_bytes` is never kept. A flood of names that are each asked once therefore costs
CPU, never memory, and cannot push out more than the cache's bound.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from struct import pack

from toposdns.options import Origin, Plugin, Setting, sets, size
from toposdns.resolve.client import NO_LABELS
from toposdns.serve.query_metrics import Hits
from toposdns.serve.transport import TRANSPORTS
from toposdns.store.snapshot import Dependency
from toposdns.store.topology import Labels, Policy
from toposdns.store.turns import take_turn
from toposdns.wire.case import Recasing, recase, rotated
from toposdns.wire.decode import serial_offset
from toposdns.wire.edns import NO_OPTIONS, EchoedOptions
from toposdns.wire.shuffle import Rotation

#: What Python spends on an entry beyond the bytes of its key, replies and question: the
#: `Cached` object, the bytes objects' headers, the table's slot and the tuple of its words.
#: Measured (tracemalloc, CPython 3.11-3.13, 64-bit) and rounded up.
ENTRY_OVERHEAD = 300
#: And per dependency word: its place in the index (a set entry, amortized) and the word.
WORD_OVERHEAD = 190
#: A `TopologyReplies` holder, beyond the `Cached` per signature it holds.
TOPOLOGY_OVERHEAD = 600
#: A label set a `TopologyReplies` remembers: its slot in `by_labels`, the int key, its slot
#: in `held` (measured: 77 to 100 bytes as they fill).
LABELS_OVERHEAD = 92
#: A `Turns` beyond its replies: the object, its tuple of ROTATION references and its counter.
TURNS_OVERHEAD = 1000
#: A `Rendered` reply beyond the bytes of its query and reply: the object, the bytes objects'
#: headers and the table's slot.
RENDERED_OVERHEAD = 250
#: Queries longer than this (after the ID) get their reply rendered each time, never kept: a
#: plain query with the options a client needs (a cookie, a Client Subnet) is under 420 bytes.
RENDERED_QUERY_BYTES = 512
#: EDNS options longer than this are read for each query, never remembered (a cookie and a
#: Client Subnet take under 80 bytes).
REMEMBERED_OPTIONS_BYTES = 128
#: A remembered option set beyond its bytes and those it echoes: the `EchoedOptions`, the bytes
#: objects' headers and the table's slot; and a Client Subnet's (address, prefix) beyond the
#: address's characters.
OPTIONS_OVERHEAD = 110
SUBNET_OVERHEAD = 135

#: Of the bound, the share of the bitmap of keys asked once (`ReplyCache.again`), and of the
#: templates' memory of endpoint names (serve/negative.py), each set aside whole.
SEEN_SHARE = 64
NAMES_SHARE = 16

#: The bound when the container sets none (and the floor of any derived one).
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
MIN_MAX_BYTES = 1024 * 1024
#: Of the container's memory limit, the share the reply caches take (all workers together).
MEMORY_SHARE = 8


@dataclass(frozen=True, slots=True)
class CacheBoundOptions:
    """How much memory each DNS process's caches may take (toposdns's own settings, in its
    Corefile directive): None derives the bound from the container's memory limit."""

    #: Bytes of in-zone replies (`--cache-max-bytes`).
    max_bytes: int | None = None
    #: Bytes of forwarded replies (`--forward-cache-max-bytes`).
    forward_max_bytes: int | None = None


def _bound(words: Sequence[str], origin: Origin) -> int:
    value = size(words, origin)
    if value < MIN_MAX_BYTES:
        raise origin.error("must be at least 1Mi, e.g. 16Mi")
    return value


CACHE_BOUNDS: Plugin[CacheBoundOptions] = Plugin(
    "cache_bounds",
    CacheBoundOptions,
    (
        Setting(
            "cache_max_bytes",
            sets("max_bytes", _bound),
            "--cache-max-bytes",
            "SIZE",
            "keep at most this much of in-zone replies per DNS process, e.g. 16Mi (default: an "
            "eighth of the container's memory limit, shared by the workers; 32Mi without one)",
        ),
        Setting(
            "forward_cache_max_bytes",
            sets("forward_max_bytes", _bound),
            "--forward-cache-max-bytes",
            "SIZE",
            "keep at most this much of forwarded replies per DNS process, e.g. 8Mi (default: a "
            "sixteenth of the container's memory limit, shared by the workers; 16Mi without "
            "one)",
        ),
    ),
    directive="toposdns",
)


class Cached:
    """One cached reply (after its ID) and what it takes to serve it."""

    __slots__ = (
        "reply",
        "compressed",
        "question",
        "serial",
        "offsets",
        "rotation",
        "compressed_rotation",
        "hits",
        "row",
        "words",
        "size",
        "small",
        "packed",
        "case",
        "turns",
    )

    def __init__(
        self,
        reply: bytes,
        compressed: bytes | None,
        question: bytes,
        words: tuple[Dependency, ...],
        serial: int = -1,
        rotate: bool = False,
        hits: tuple[Hits, ...] | None = None,
    ) -> None:
        #: The reply, uncompressed, ending in its OPT record without options (if it has one).
        self.reply = reply
        #: The same, compressed, for the queries whose limit the uncompressed one passes.
        self.compressed = compressed
        #: True when the two are one object: a reply too large to go uncompressed to any
        #: query, kept compressed and cut to the largest message (wire/encode.py
        #: `encode_forms`); counted and rotated once.
        self.packed = compressed is reply
        #: The question as the query that built it asked it: the case its names are in.
        self.question = question
        #: The SOA serial the reply carries, or -1 when it carries none to rewrite.
        self.serial = serial
        #: Where the serial is in `reply` and `compressed`, found when first rewritten.
        self.offsets: tuple[int, int] | None = None
        #: With `--loadbalance`, each form's records in turn (wire/shuffle.py `Rotation`).
        self.rotation = Rotation.of(reply) if rotate else None
        self.compressed_rotation = (
            Rotation.of(compressed)
            if rotate and compressed is not None and not self.packed
            else None
        )
        #: The counters of its hits, one row per transport (None without metrics).
        self.hits = hits
        #: A topology-filtered reply's `TopologyCounts` row (set when kept); else None.
        self.row: list[int] | None = None
        self.words = words
        self.size = (
            len(reply)
            + (len(compressed) if compressed is not None and not self.packed else 0)
            + len(question)
            + (self.rotation.held() if self.rotation is not None else 0)
            + (self.compressed_rotation.held() if self.compressed_rotation is not None else 0)
            + ENTRY_OVERHEAD
            + WORD_OVERHEAD * len(words)
        )
        #: Served as it is to a query without OPT record (the UDP frontend's fast path, which
        #: finds it by the query's raw bytes: only a reply to a lower-case name qualifies).
        name = question[:-4]
        self.small = serial < 0 and len(reply) <= 510 and name == name.lower()
        #: Where the reply copies the name asked, to write it for another letter case (found
        #: when first asked so; `NOT_RECASED` when it cannot be), or None.
        self.case: Recasing | None = None
        #: Topology weights on A and AAAA: the replies of the client's rotation, one per
        #: turn, of which this is one; None for a reply that is the same each time.
        self.turns: Turns | None = None

    def current(self, serial: int) -> bytes:
        """The reply with this serial (rewritten once per serial, not per hit) and, with
        `--loadbalance`, its records in the next order."""
        if self.serial >= 0 and serial != self.serial:
            self.rewrite(serial)
        rotation = self.rotation
        return self.reply if rotation is None else rotation.next()

    def recased(self, serial: int, name: bytes) -> bytes:
        """The reply as `current` gives it, written for a query whose name, in wire form, is
        `name` (its `case` found, not `NOT_RECASED`)."""
        case = self.case
        assert case is not None
        if self.serial >= 0 and serial != self.serial:
            self.rewrite(serial)
        rotation = self.rotation
        if rotation is None:
            return recase(self.reply, case.runs, name)
        turn = rotation.turn = rotation.turn + 1
        return rotated(rotation, case.parts, name, turn)

    def rewrite(self, serial: int) -> None:
        """Give the reply (both forms) the new serial in place."""
        if self.offsets is None:
            self.offsets = (_serial_at(self.reply), _serial_at(self.compressed))
        stamp = pack("!I", serial & 0xFFFFFFFF)
        at, compressed_at = self.offsets
        if at >= 0:
            self.reply = self.reply[:at] + stamp + self.reply[at + 4 :]
        if self.packed:
            self.compressed = self.reply
        elif compressed_at >= 0 and self.compressed is not None:
            self.compressed = (
                self.compressed[:compressed_at] + stamp + self.compressed[compressed_at + 4 :]
            )
        self.serial = serial


class Turns:
    """A client signature's replies to an A or AAAA query of a service with topology weights:
    one per turn of its rotation (each tier's reply, as often as its share), and the counter of
    turns that the resolver's path moves on too (store/topology.py `TurnCounts`). A hit takes
    the next turn (`next`, inlined by the UDP frontend), as `Rotation` gives `--loadbalance`'s
    next order."""

    __slots__ = ("replies", "counter", "small")

    def __init__(self, replies: tuple[Cached, ...], counter: list[int]) -> None:
        self.replies = replies
        self.counter = counter
        #: Whether every turn's reply is `small`: the UDP frontend's own path then serves each.
        self.small = all(reply.small for reply in replies)

    def peek(self) -> Cached:
        """The reply of the next turn, the counter left where it is."""
        turn = self.counter[0]
        return self.replies[turn if turn < len(self.replies) else 0]

    def next(self) -> Cached:
        """The reply of the next turn; the counter moves on (store/topology.py `take_turn`)."""
        return self.replies[take_turn(self.counter, len(self.replies))]

    def take_small(self) -> Cached | None:
        """The reply of the next turn, the turn taken, when every turn's reply is `small`: the
        UDP frontend's own path then serves it; else None, and the responder takes the turn.
        One call from that path, which is not compiled, where reading the counter there cost
        as much as the rest of a hit."""
        return self.next() if self.small else None


def _serial_at(reply: bytes | None) -> int:
    """Where the SOA serial is in a reply after its ID, or -1."""
    if reply is None:
        return -1
    try:
        return serial_offset(b"\x00\x00" + reply) - 2
    except ValueError:  # no SOA in it
        return -1


class TopologyReplies:
    """Replies to one query whose answer depends on the client, by client signature."""

    __slots__ = ("policy", "replies", "by_labels", "held", "words", "size")

    #: How many label sets an entry remembers directly (more are still answered, just slower).
    REMEMBERED = 256

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.replies: dict[tuple[object, ...], Cached] = {}
        #: id(labels) -> reply. Equal label sets are one interned object (store/convert.py);
        #: `held` keeps each remembered one alive, so its id cannot pass to another object.
        self.by_labels: dict[int, Cached] = {}
        self.held: list[Labels] = []
        self.words: tuple[Dependency, ...] = ()
        self.size = TOPOLOGY_OVERHEAD


Entry = Cached | TopologyReplies


class Rendered:
    """A cached reply as one query's exact bytes got it, and what its hits count in."""

    __slots__ = ("reply", "source", "hits", "whole", "row", "unplaced")

    def __init__(
        self,
        reply: bytes,
        source: str | None,
        hits: Hits | None,
        whole: bool,
        row: list[int] | None,
        unplaced: bool,
    ) -> None:
        #: The reply after its ID.
        self.reply = reply
        #: The client it was placed for, when the answer depends on the client; else None.
        self.source = source
        #: The metrics row of the entry's hits on this transport (None without metrics), and
        #: whether this query and reply have the sizes that row counts (else counted in full).
        self.hits = hits
        self.whole = whole
        #: The `TopologyCounts` row of a topology-filtered answer, and whether no locator
        #: placed the client.
        self.row = row
        self.unplaced = unplaced


class ReplyCache:
    """The cached replies, the index of what they depend on, and their size in bytes.

    `hits`, `misses` and `evictions` count as they happen (the frontends add their hits);
    `entries` and `bytes_held` are read off when needed, for metrics.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, set_aside: int = 0) -> None:
        self.max_bytes = max_bytes
        #: The keys of template replies not kept yet (`again`): a bitmap of their hashes.
        self.seen = bytearray(max(4096, max_bytes // SEEN_SHARE))
        self.seen_count = 0
        #: What the bound leaves to the entries and the memos below (`bytes_held`): the rest
        #: after the bitmap and `set_aside` bytes that others count (the templates' memory).
        self.room = max_bytes - len(self.seen) - set_aside
        #: Replies larger than this are not kept: a few must not take the room of many.
        self.max_reply_bytes = max(4096, min(65536, max_bytes // 256))
        #: Query key -> entry. Frontends hold a reference: it is only ever emptied in place.
        self.table: dict[bytes, Entry] = {}
        #: Word -> the key, or the set of keys, of the entries that read it (most words are
        #: read by one entry: a set for each would cost more than the entry).
        self.dependents: dict[Dependency, bytes | set[bytes]] = {}
        self.bytes_held = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        #: Per transport (`Transport.slot`): a query after its ID -> its reply as rendered.
        #: Frontends may hold a reference: they are only ever emptied in place.
        self.renders: tuple[dict[bytes, Rendered], ...] = tuple({} for _ in TRANSPORTS)
        #: The bytes they take, counted in `bytes_held` too.
        self.rendered_bytes = 0
        #: Raw EDNS options -> what a reply echoes of them (most clients repeat theirs), at
        #: most a sixteenth of the bound; the bytes they take, counted in `bytes_held` too.
        self.options: dict[bytes, EchoedOptions] = {b"": NO_OPTIONS}
        self.options_bytes = 0

    @property
    def entries(self) -> int:
        """Replies kept (a topology-filtered name counts once)."""
        return len(self.table)

    def store(
        self,
        key: bytes,
        cached: Cached,
        policy: Policy | None = None,
        labels: Labels = NO_LABELS,
        row: list[int] | None = None,
    ) -> bool:
        """Keep a reply (a topology-filtered one under `policy` for clients with `labels`, with
        the counts `row` its answers count in); False when it is too large to keep."""
        if len(cached.reply) > self.max_reply_bytes:
            return False
        table = self.table
        entry = table.get(key)
        if policy is None:
            if entry is not None:
                self.drop(key)
            table[key] = cached
            self.index(key, cached.words)
            self.bytes_held += cached.size + len(key)
        else:
            if not isinstance(entry, TopologyReplies):
                if entry is not None:
                    self.drop(key)
                entry = table[key] = TopologyReplies(policy)
                self.bytes_held += entry.size + len(key)
            signature = policy.signature(labels)
            old = entry.replies.get(signature)
            if old is not None:  # what the remembered labels point at goes
                forgotten = old.size + LABELS_OVERHEAD * len(entry.held)
                entry.size -= forgotten
                self.bytes_held -= forgotten
                entry.by_labels.clear()
                entry.held.clear()
            cached.row = row or [0, 0]
            entry.replies[signature] = cached
            entry.size += cached.size
            self.bytes_held += cached.size
            new = tuple(word for word in cached.words if word not in entry.words)
            entry.words += new
            self.index(key, new)
        if self.bytes_held > self.room:
            self.evict()
        return True

    def choose(self, entry: TopologyReplies, labels: Labels) -> Cached | None:
        """The reply of `entry` for a client with these labels, if one is cached (its `row`
        is the `TopologyCounts` row its answers count in). Remembered by the labels' identity (the
        UDP frontend looks there first), counted in the bound."""
        found = entry.by_labels.get(id(labels))
        if found is not None:
            return found
        found = entry.replies.get(entry.policy.signature(labels))
        if found is not None and len(entry.held) < entry.REMEMBERED:
            entry.by_labels[id(labels)] = found
            entry.held.append(labels)
            entry.size += LABELS_OVERHEAD
            self.bytes_held += LABELS_OVERHEAD
            if self.bytes_held > self.max_bytes:
                self.evict()
        return found

    def grow(self, entry: Entry, cached: Cached, size: int) -> None:
        """Count `size` more bytes held by `cached`, a reply of `entry` (itself, or one of a
        `TopologyReplies`)."""
        cached.size += size
        if entry is not cached:
            entry.size += size
        self.bytes_held += size
        if self.bytes_held > self.room:
            self.evict()

    def remember(self, slot: int, query: bytes, rendered: Rendered) -> None:
        """Keep a reply as rendered for a query (its bytes after the ID) on one transport,
        unless the query is longer than a client needs (`RENDERED_QUERY_BYTES`)."""
        if len(query) > RENDERED_QUERY_BYTES:
            return
        size = len(query) + len(rendered.reply) + RENDERED_OVERHEAD
        if self.rendered_bytes + size > self.max_bytes // 8:
            self.forget_rendered()
        self.renders[slot][query] = rendered
        self.rendered_bytes += size
        self.bytes_held += size
        if self.bytes_held > self.room:
            self.evict()

    def forget_rendered(self) -> None:
        """Forget every reply as rendered (a new snapshot can change them all)."""
        for renders in self.renders:
            renders.clear()
        self.bytes_held -= self.rendered_bytes
        self.rendered_bytes = 0

    def remember_options(self, options: bytes, echo: EchoedOptions) -> None:
        """Remember what a reply echoes of a query's raw EDNS options, unless they are longer
        than a client needs (`REMEMBERED_OPTIONS_BYTES`)."""
        if len(options) > REMEMBERED_OPTIONS_BYTES:
            return
        size = len(options) + len(echo.plain) + OPTIONS_OVERHEAD
        if echo.subnet is not None:
            size += len(echo.scoped) + len(echo.subnet[0]) + SUBNET_OVERHEAD
        if self.options_bytes + size > self.max_bytes // 16:
            self.forget_options()
        self.options[options] = echo
        self.options_bytes += size
        self.bytes_held += size
        if self.bytes_held > self.room:
            self.evict()

    def forget_options(self) -> None:
        """Forget every remembered option set but the empty one."""
        self.options.clear()
        self.options[b""] = NO_OPTIONS
        self.bytes_held -= self.options_bytes
        self.options_bytes = 0

    def index(self, key: bytes, words: Iterable[Dependency]) -> None:
        """List a key under the words its answer read."""
        dependents = self.dependents
        for word in words:
            keys = dependents.get(word)
            if keys is None:
                dependents[word] = key
            elif isinstance(keys, set):
                keys.add(key)
            elif keys != key:
                dependents[word] = {keys, key}

    def drop(self, key: bytes) -> None:
        """Drop one entry and its place in the index."""
        entry = self.table.pop(key, None)
        if entry is None:
            return
        self.bytes_held -= entry.size + len(key)
        dependents = self.dependents
        for word in entry.words:
            keys = dependents.get(word)
            if isinstance(keys, set):
                keys.discard(key)
                if not keys:
                    del dependents[word]
            elif keys == key:
                del dependents[word]

    def evict(self) -> None:
        """Forget the rendered replies, then drop the oldest entries until an eighth of the
        room is free."""
        self.forget_rendered()
        target = self.room - self.room // 8
        table = self.table
        while self.bytes_held > target and table:
            for key in list(islice(table, 256)):
                self.drop(key)
                self.evictions += 1
                if self.bytes_held <= target:
                    break

    def invalidate(self, changes: Iterable[Dependency]) -> None:
        """Drop the entries that read anything `changes` names."""
        dependents = self.dependents
        for word in changes:
            keys = dependents.get(word)
            if isinstance(keys, bytes):
                self.drop(keys)
            elif keys is not None:
                for key in list(keys):
                    self.drop(key)

    def again(self, key: bytes) -> bool:
        """Whether a key whose reply came from templates was asked before (since the bitmap
        was last emptied, when a sixteenth of its bits were set: a key asked once is taken
        for one asked again at most one time in sixteen). Most such names are asked once
        (search-path expansions of names outside the cluster): keeping each would cost more
        than its template (the insert, its dependencies, the eviction it causes) and push out
        replies that are asked again. A name asked a second time is kept, and its next
        queries are hits."""
        seen = self.seen
        bits = len(seen) << 3
        at = hash(key) % bits  # cached in the key: its table lookup computed it
        bit = 1 << (at & 7)
        if seen[at >> 3] & bit:
            return True
        if self.seen_count >= bits >> 4:
            seen = self.seen = bytearray(len(seen))
            self.seen_count = 0
        seen[at >> 3] |= bit
        self.seen_count += 1
        return False

    def clear(self) -> None:
        """Drop everything (a key asked after this counts as asked first)."""
        self.table.clear()
        self.dependents.clear()
        self.forget_rendered()
        self.forget_options()
        self.bytes_held = 0
        self.seen = bytearray(len(self.seen))
        self.seen_count = 0


def container_memory_limit(root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit of this container (cgroup v2 `memory.max`, else v1
    `memory.limit_in_bytes`), or None when there is none."""
    for name in ("memory.max", "memory/memory.limit_in_bytes", "memory.limit_in_bytes"):
        try:
            with open(os.path.join(root, name)) as file:
                text = file.read().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        # cgroup v1 says "no limit" with a huge number (a page-rounded 2**63 - 1).
        return value if value < 1 << 60 else None
    return None


def default_max_bytes(share: int, workers: int, fallback: int, root: str = "/sys/fs/cgroup") -> int:
    """A cache's default bound: 1/`share` of the container's memory limit, split between the
    `workers` that each keep one; `fallback` per worker without a limit."""
    limit = container_memory_limit(root)
    if limit is None:
        return fallback
    return max(MIN_MAX_BYTES, limit // share // max(1, workers))
