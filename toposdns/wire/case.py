"""A cached reply written for a query in another letter case, as the encoder would write it.

Lookups ignore letter case, but a reply writes names in the case asked: the question, owner names
that are the name asked, and the zone in the names it makes up (SOA, NS and SRV targets) are
copies of the query's name, or of a suffix of it. Every other byte of the reply is the same
whatever the case. So one reply, built once, serves every spelling of its name: where it copies
the name (`case_runs`, found once by comparing it with the reply to the same name in the other
case) the query's own letters go instead (`recase`). A reply to be compressed is compressed
from that, as the encoder compresses (`compress`): compression matches names by their bytes,
so which names point where depends on the case.

The caller decides which names this holds for (resolver `case_insensitive`): a name whose
answer itself depends on its case is built anew.
"""

from __future__ import annotations

from struct import pack

from toposdns.wire.codes import AAAA, CNAME, HINFO, NS, OPT, POINTER, PTR, SOA, SRV, TC, TXT, A
from toposdns.wire.decode import HEADER_SIZE, question_end, record_spans
from toposdns.wire.shuffle import Rotation

#: The case map of a reply: (offset, offset in the name's wire form, length) for each run of
#: bytes copied from the query's name, flattened.
Runs = tuple[int, ...]
#: The case maps of a `Rotation`'s parts: one per part that stays, a list per rotating group.
PartRuns = list[Runs | list[Runs]]

_RAW_DATA = (A, AAAA, TXT, HINFO)
_ONE_NAME = (NS, CNAME, PTR)
#: What Python spends on a `Recasing` (with its tuple and list headers), and on each number
#: of its runs (a tuple slot and, past 256, an int), measured with tracemalloc.
RECASING_OVERHEAD = 120
RUN_OVERHEAD = 40


class Recasing:
    """Where a cached reply copies the name asked: in the reply (`runs`), and in each part of
    its rotation when its records take turns (`parts`; wire/shuffle.py `Rotation`)."""

    __slots__ = ("runs", "parts", "size")

    def __init__(self, runs: Runs, parts: PartRuns | None = None) -> None:
        self.runs = runs
        self.parts = parts
        count = len(runs)  # numbers, with a tuple's header counted as two
        for part in parts or ():
            if isinstance(part, tuple):
                count += len(part) + 2
            else:
                count += sum(len(group_runs) + 2 for group_runs in part) + 2
        #: The bytes it takes, as the reply cache counts them.
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


def compress(whole: bytes, opt: bytes, limit: int) -> bytes | None:
    """An uncompressed reply (after its ID) compressed and cut to `limit` bytes as wire/encode.py
    writes it compressed: names point at the first place a suffix was written (its bytes
    alike), SRV targets are written whole and never pointed at, records that do not fit are
    dropped from the first that does not on, with TC set. `opt`, as wire/encode.py `fit` takes
    it, replaces the reply's OPT record (it has one if `opt` is not empty); `limit` counts the
    ID. None for a record of a type the encoder never writes (the caller builds the reply)."""
    message = b"\x00\x00" + whole
    spans = record_spans(message)
    end = question_end(message)
    out = bytearray(message[:HEADER_SIZE])
    names: dict[bytes, int] = {}
    _name(out, message, HEADER_SIZE, names)
    out += message[end - 4 : end]
    budget = limit - len(opt)
    counts = [0, 0, 0]
    truncated = False
    for start, ttl_at, stop, rtype, section in spans:
        if rtype == OPT and section == 2:
            continue  # `opt` goes in its place, last
        mark = len(out)
        _name(out, message, start, names)
        out += message[ttl_at - 4 : ttl_at + 4]  # type, class, TTL
        length_at = len(out)
        out += b"\x00\x00"
        at = ttl_at + 6
        if rtype in _RAW_DATA:
            out += message[at:stop]
        elif rtype == SRV:
            out += message[at : at + 6]
            _name(out, message, at + 6, None)
        elif rtype == SOA:
            at = _name(out, message, at, names)
            at = _name(out, message, at, names)
            out += message[at:stop]
        elif rtype in _ONE_NAME:
            _name(out, message, at, names)
        else:
            return None
        out[length_at : length_at + 2] = pack("!H", len(out) - length_at - 2)
        if len(out) > budget:
            del out[mark:]
            truncated = True
            break
        counts[section] += 1
    out += opt
    flags = message[2] | (TC >> 8) if truncated else message[2]
    out[2:12] = bytes((flags, message[3])) + pack(
        "!4H", 1, counts[0], counts[1], counts[2] + (1 if opt else 0)
    )
    return bytes(out[2:])


def _name(out: bytearray, message: bytes, at: int, names: dict[bytes, int] | None) -> int:
    """Write the uncompressed name at `at` in `message` to `out`, pointing at a suffix already
    written (and noting the suffixes it writes) unless `names` is None; the offset after it."""
    end = at
    while message[end]:
        end += message[end] + 1
    while at < end:
        suffix = message[at : end + 1]
        if names is not None:
            pointer = names.get(suffix)
            if pointer is not None:
                out += pack("!H", (POINTER << 8) | pointer)
                return end + 1
            if len(out) < 0x4000:
                names[suffix] = len(out)
        length = message[at] + 1
        out += message[at : at + length]
        at += length
    out.append(0)
    return end + 1
