"""A cached reply written for a query in another letter case, as the encoder would write it.

Lookups ignore letter case, but a reply writes names in the case asked: the question, owner names
that are the name asked, and the zone in the names it makes up (SOA, NS and SRV targets) are
copies of the query's name, or of a suffix of it. Every other byte of the reply is the same
whatever the case. So one reply, built once, serves every spelling of its name: where it copies
the name (`case_runs`, found once by comparing it with the reply to the same name in the other
case) the query's own letters go instead (`recase`). A reply to be compressed is compressed
from that, as the encoder compresses (`compress`): compression matches names by their bytes,
so which names point where depends on the case, but only through which labels of the name
asked are spelled as labels of the objects are (`label_facts`, `signature`). The compressed
form is made once for the queries alike in those, and recased for each (`packed`).

The caller decides which names this holds for (resolver `case_insensitive`): a name whose
answer itself depends on its case is built anew.
"""

from __future__ import annotations

from struct import pack

from toposdns.wire.codes import CNAME, MX, NS, OPT, POINTER, PTR, SOA, SRV, TC
from toposdns.wire.decode import HEADER_SIZE
from toposdns.wire.shuffle import Rotation

#: The case map of a reply: (offset, offset in the name's wire form, length) for each run of
#: bytes copied from the query's name, flattened.
Runs = tuple[int, ...]
#: The case maps of a `Rotation`'s parts: one per part that stays, a list per rotating group.
PartRuns = list[Runs | list[Runs]]

#: Types whose data holds names, as the encoder writes them (their other bytes as they are).
_NAMED_DATA = (SRV, SOA, MX, NS, CNAME, PTR)
_IN = b"\x00\x01"
_ROOT_OPT = b"\x00" + pack("!H", OPT)  # an OPT record's owner (the root) and type
#: What Python spends on a `Recasing` (with its tuple and list headers), and on each number
#: of its runs (a tuple slot and, past 256, an int), measured with tracemalloc.
RECASING_OVERHEAD = 120
RUN_OVERHEAD = 40


class Recasing:
    """Where a cached reply copies the name asked: in the reply (`runs`), and in each part of
    its rotation when its records take turns (`parts`; wire/shuffle.py `Rotation`). For a reply
    that does not rotate, also which labels of the name asked its compression compares with
    which others (`label_facts`), and the compressed forms made so far (`packs`)."""

    __slots__ = ("runs", "parts", "fixed", "pairs", "packs", "size")

    def __init__(
        self, runs: Runs, parts: PartRuns | None = None, facts: LabelFacts = ((), ())
    ) -> None:
        self.runs = runs
        self.parts = parts
        self.fixed, self.pairs = facts
        #: (serial, budget, with OPT, `signature`) -> (compressed reply, its case map).
        self.packs: dict[tuple[int, int, bool, tuple[bool, ...]], tuple[bytes, Runs]] = {}
        count = len(runs) + 4 * len(self.fixed) + 4 * len(self.pairs)  # numbers, headers
        for part in parts or ():
            if isinstance(part, tuple):
                count += len(part) + 2
            else:
                count += sum(len(group_runs) + 2 for group_runs in part) + 2
        #: The bytes it takes, as the reply cache counts them (`packs` included).
        self.size = RECASING_OVERHEAD + RUN_OVERHEAD * count


#: A reply that cannot be written for another letter case: it is built anew.
NOT_RECASED = Recasing(())


def case_runs(ours: bytes, theirs: bytes, name: bytes) -> Runs | None:
    """Where `ours`, bytes written for a query whose name is `name` (in wire form, with its
    root label), copies that name; `theirs` is the same written for the name with each letter
    in the other case. None unless they differ only there, each run ending a name (a copy of a
    suffix of the query's name, up to its root label)."""
    if len(ours) != len(theirs) or name.find(b"\x00") != len(name) - 1:
        return None  # a label holding a zero byte would hide where its name ends
    other = name.swapcase()
    runs: list[int] = []
    at = 0
    size = len(ours)
    while at < size:
        if ours[at] == theirs[at]:
            at += 1
            continue
        end = ours.find(b"\x00", at)  # the root label of the name this letter is in
        length = end - at
        start = len(name) - 1 - length
        if end < 0 or start < 0:
            return None
        if ours[at:end] != name[start : start + length]:
            return None
        if theirs[at:end] != other[start : start + length]:
            return None
        runs += (at, start, length)
        at = end
    return tuple(runs)


def recase(data: bytes, runs: Runs, name: bytes) -> bytes:
    """`data` with the runs `case_runs` found copied from `name` instead: the bytes as written
    for a query whose name is `name`."""
    if not runs:
        return data
    parts = []
    at = 0
    for i in range(0, len(runs), 3):
        start = runs[i]
        parts.append(data[at:start])
        offset = runs[i + 1]
        at = start + runs[i + 2]
        parts.append(name[offset : offset + runs[i + 2]])
    parts.append(data[at:])
    return b"".join(parts)


def rotation_runs(ours: Rotation, theirs: Rotation, name: bytes) -> PartRuns | None:
    """`case_runs` for each part of a rotating reply (`theirs`: the reply in the other case),
    or None."""
    if len(ours.parts) != len(theirs.parts):
        return None
    found: PartRuns = []
    for mine, other in zip(ours.parts, theirs.parts, strict=True):
        if isinstance(mine, bytes) and isinstance(other, bytes):
            runs = case_runs(mine, other, name)
            if runs is None:
                return None
            found.append(runs)
        elif isinstance(mine, list) and isinstance(other, list) and len(mine) == len(other):
            group = []
            for record, twin in zip(mine, other, strict=True):
                runs = case_runs(record, twin, name)
                if runs is None:
                    return None
                group.append(runs)
            found.append(group)
        else:
            return None
    return found


def rotated(rotation: Rotation, parts: PartRuns | None, name: bytes, turn: int) -> bytes:
    """A rotating reply in its order `turn` (wire/shuffle.py `Rotation.joined`), written for a
    query whose name is `name`, with the case maps `rotation_runs` found."""
    assert parts is not None
    out = []
    for part, runs in zip(rotation.parts, parts, strict=True):
        if isinstance(part, bytes):
            assert isinstance(runs, tuple)
            out.append(recase(part, runs, name))
        else:
            assert isinstance(runs, list)
            count = len(part)
            at = turn % count
            for i in range(count):
                j = (at + i) % count
                out.append(recase(part[j], runs[j], name))
    return b"".join(out)


def compress(whole: bytes, opt: bytes, limit: int, runs: Runs = (), name: bytes = b"") -> bytes:
    """An uncompressed reply (after its ID) compressed and cut to `limit` bytes as wire/encode.py
    writes it compressed: names point at the first place a suffix was written (its bytes
    alike), SRV targets are written whole and never pointed at, records that do not fit are
    dropped from the first that does not on, with TC set. `opt`, as wire/encode.py `fit` takes
    it, replaces the reply's OPT record (it has one if `opt` is not empty); `limit` counts the
    ID. With `runs`, the reply is compressed as `recase` writes it for `name`, recased only as
    far as it is read."""
    out, _ = _compressed(whole, len(opt), bool(opt), limit, runs, name, False)
    return bytes(out[2:]) + opt


def packed(case: Recasing, whole: bytes, serial: int, opt: bytes, limit: int, name: bytes) -> bytes:
    """`compress` for a reply that does not rotate, `case` its case map and `serial` the serial
    it carries: made once for the queries whose names compress alike (`signature`) and recased
    for each (`packs`, at most `PACKS`, counted in `case.size`)."""
    key = (serial, limit - len(opt), bool(opt), signature(case, name))
    found = case.packs.get(key)
    if found is None:
        out, runs = _compressed(whole, len(opt), bool(opt), limit, case.runs, name, True)
        found = bytes(out[2:]), tuple(runs)
        if len(case.packs) >= PACKS:
            for held in case.packs.values():
                case.size -= _pack_size(held)
            case.packs.clear()
        case.packs[key] = found
        case.size += _pack_size(found)
    return recase(found[0], found[1], name) + opt


def _pack_size(pack: tuple[bytes, Runs]) -> int:
    return PACK_OVERHEAD + len(pack[0]) + RUN_OVERHEAD * len(pack[1])


#: Compressed forms a case map keeps (per serial, buffer and `signature`), and what Python
#: spends on one beyond its bytes and runs (the tuples, the key, the table's slot).
PACKS = 8
PACK_OVERHEAD = 300
#: (offset, length, bytes) of a label of the name asked, and a label elsewhere in the reply
#: whose letters it matches but for their case; (offset, offset, length) of two labels of the
#: name asked alike.
LabelFacts = tuple[tuple[tuple[int, int, bytes], ...], tuple[tuple[int, int, int], ...]]


def label_facts(whole: bytes, runs: Runs, name: bytes) -> LabelFacts:
    """What decides how a reply compresses, asked in any case: a name's suffix points at an
    earlier one when their labels are alike byte for byte, and a label copied from the name
    asked (`runs`) is like a label of the objects (or another of the name asked) in some cases
    only. These are those pairs; `signature` says which hold for one query."""
    message = b"\x00\x00" + whole
    mine: dict[bytes, list[tuple[int, int]]] = {}
    at = 0
    while name[at]:
        length = name[at]
        mine.setdefault(name[at + 1 : at + 1 + length].lower(), []).append((at + 1, length))
        at += length + 1
    fixed: set[tuple[int, int, bytes]] = set()
    for start in _compressed_names(message):
        at = start
        while message[at]:
            length = message[at]
            label = message[at + 1 : at + 1 + length]
            if not _copied(runs, at - 1, at - 1 + length):
                for offset, size in mine.get(label.lower(), ()):
                    fixed.add((offset, size, label))
            at += length + 1
    pairs = tuple(
        (first[0], second[0], first[1])
        for alike in mine.values()
        for i, first in enumerate(alike)
        for second in alike[i + 1 :]
    )
    return tuple(sorted(fixed)), pairs


def signature(case: Recasing, name: bytes) -> tuple[bool, ...]:
    """Which of `label_facts` hold for a query whose name is `name`: queries alike in these
    compress a reply alike."""
    return tuple(name[at : at + size] == label for at, size, label in case.fixed) + tuple(
        name[first : first + size] == name[second : second + size]
        for first, second, size in case.pairs
    )


def _copied(runs: Runs, start: int, stop: int) -> bool:
    """Whether the reply's bytes from `start` to `stop` (after the ID) hold a copied letter."""
    for i in range(0, len(runs), 3):
        if runs[i] < stop and runs[i] + runs[i + 2] > start:
            return True
    return False


def _compressed_names(message: bytes) -> list[int]:
    """Where the names are that the encoder compresses (or points others at): the question,
    the owners and the names in NS, CNAME, PTR, MX and SOA data; not SRV targets."""
    found = [HEADER_SIZE]
    at = _past_name(message, HEADER_SIZE) + 4
    count = sum((message[i] << 8) | message[i + 1] for i in (6, 8, 10))
    for _ in range(count):
        if message[at : at + 3] == _ROOT_OPT:
            at += 11 + ((message[at + 9] << 8) | message[at + 10])
            continue
        found.append(at)
        at = _past_name(message, at)
        rtype = (message[at] << 8) | message[at + 1]
        stop = at + 10 + ((message[at + 8] << 8) | message[at + 9])
        data = at + 10
        if rtype in _NAMED_DATA and message[at + 2 : at + 4] == _IN and rtype != SRV:
            if rtype == MX:
                found.append(data + 2)
            else:
                found.append(data)
                if rtype == SOA:
                    found.append(_past_name(message, data))
        at = stop
    return found


def _compressed(
    whole: bytes,
    opt_size: int,
    with_opt: bool,
    limit: int,
    runs: Runs,
    name: bytes,
    collect: bool,
) -> tuple[bytearray, list[int]]:
    """`compress`'s message (with room for the ID, without the OPT record), and the case map
    of what it wrote (offsets after the ID) when `collect`."""
    message = b"\x00\x00" + whole
    source = _Recased(message, runs, name, collect)
    end = _past_name(message, HEADER_SIZE) + 4  # the question's end
    out = bytearray(message[:HEADER_SIZE])
    names: dict[bytes, int] = {}
    _name(out, source, HEADER_SIZE, names)
    source.copy(out, end - 4, end)
    answers = (message[6] << 8) | message[7]
    records = answers + ((message[8] << 8) | message[9])
    records_and_additional = records + ((message[10] << 8) | message[11])
    budget = limit - opt_size
    counts = [0, 0, 0]
    truncated = False
    at = end
    for index in range(records_and_additional):
        section = 0 if index < answers else 1 if index < records else 2
        if section == 2 and message[at : at + 3] == _ROOT_OPT:
            at += 11 + ((message[at + 9] << 8) | message[at + 10])
            continue  # the query's OPT goes in its place, last
        mark, noted = len(out), len(source.found)
        at = _name(out, source, at, names)
        rtype = (message[at] << 8) | message[at + 1]
        stop = at + 10 + ((message[at + 8] << 8) | message[at + 9])
        if rtype not in _NAMED_DATA or message[at + 2 : at + 4] != _IN:
            # Type, class, TTL, data length and data as they are: addresses, strings, and what
            # the encoder writes as given (a type without a form of its own, another class).
            source.copy(out, at, stop)
        else:
            source.copy(out, at, at + 8)  # type, class, TTL
            length_at = len(out)
            out += b"\x00\x00"
            at += 10
            if rtype == SRV:
                source.copy(out, at, at + 6)
                _name(out, source, at + 6, None)
            elif rtype == SOA:
                at = _name(out, source, at, names)
                at = _name(out, source, at, names)
                source.copy(out, at, stop)
            elif rtype == MX:
                source.copy(out, at, at + 2)
                _name(out, source, at + 2, names)
            else:
                _name(out, source, at, names)
            out[length_at : length_at + 2] = pack("!H", len(out) - length_at - 2)
        at = stop
        if len(out) > budget:
            del out[mark:]
            del source.found[noted:]
            truncated = True
            break
        counts[section] += 1
    flags = message[2] | (TC >> 8) if truncated else message[2]
    out[2:12] = bytes((flags, message[3])) + pack(
        "!4H", 1, counts[0], counts[1], counts[2] + (1 if with_opt else 0)
    )
    return out, source.found


class _Recased:
    """A message as `recase` writes it, read front to back, recased only where read; when
    collecting, the case map of what is copied out of it (`found`)."""

    __slots__ = ("message", "runs", "name", "next", "pieces", "collect", "found")

    def __init__(self, message: bytes, runs: Runs, name: bytes, collect: bool) -> None:
        self.message = message
        self.runs = runs  # their offsets count from after the ID: 2 less than the message's
        self.name = name
        self.next = 0  # the first run not wholly read yet
        #: The runs the last `read` copied in: (offset in what it gave, in the name, length).
        self.pieces: list[int] = []
        self.collect = collect
        self.found: list[int] = []

    def read(self, start: int, stop: int) -> bytes:
        """The bytes from `start` to `stop`, recased (no earlier than the last read)."""
        runs, i = self.runs, self.next
        while i < len(runs) and runs[i] + 2 + runs[i + 2] <= start:
            i += 3
        self.next = i
        if self.pieces:
            self.pieces = []
        if i >= len(runs) or runs[i] + 2 >= stop:
            return self.message[start:stop]
        parts = []
        at = start
        while i < len(runs) and runs[i] + 2 < stop:
            begin, offset, length = runs[i] + 2, runs[i + 1], runs[i + 2]
            if begin < at:  # begun in an earlier read
                offset, length, begin = offset + at - begin, length - (at - begin), at
            cut = min(length, stop - begin)
            parts.append(self.message[at:begin])
            parts.append(self.name[offset : offset + cut])
            if self.collect:
                self.pieces += (begin - start, offset, cut)
            at = begin + cut
            if cut < length:
                break  # the rest of this run is read next
            i += 3
        parts.append(self.message[at:stop])
        return b"".join(parts)

    def copy(self, out: bytearray, start: int, stop: int) -> None:
        """Append the bytes from `start` to `stop` to `out`, recased."""
        data = self.read(start, stop)
        self.note(len(out), len(data))
        out += data

    def note(self, at: int, size: int) -> None:
        """Having written the first `size` bytes of the last read at `at` in the output, note
        the runs among them (offsets after the ID)."""
        pieces = self.pieces
        for i in range(0, len(pieces), 3):
            if pieces[i] < size:
                cut = min(pieces[i + 2], size - pieces[i])
                self.found += (at + pieces[i] - 2, pieces[i + 1], cut)


def _past_name(message: bytes, at: int) -> int:
    """The offset after the uncompressed name at `at`."""
    while message[at]:
        at += message[at] + 1
    return at + 1


def _name(out: bytearray, source: _Recased, at: int, names: dict[bytes, int] | None) -> int:
    """Write the uncompressed name at `at` in the message `source` reads to `out`, pointing at
    a suffix already written (and noting the suffixes it writes) unless `names` is None; the
    offset after it."""
    end = _past_name(source.message, at)
    written = source.read(at, end)
    start = len(out)
    if names is None:
        source.note(start, len(written))
        out += written
        return end
    i = 0
    last = len(written) - 1
    while i < last:
        suffix = written[i:]
        pointer = names.get(suffix)
        if pointer is not None:
            source.note(start, i)
            out += pack("!H", (POINTER << 8) | pointer)
            return end
        if len(out) < 0x4000:
            names[suffix] = len(out)
        length = written[i] + 1
        out += written[i : i + length]
        i += length
    source.note(start, i)
    out.append(0)
    return end
