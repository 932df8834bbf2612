"""Vary the order of address records from reply to reply, as CoreDNS's `loadbalance` does.

`loadbalance round_robin` (CoreDNS plugin/loadbalance/loadbalance.go) rewrites every NOERROR
reply but zone transfers, each section on its own: a section of two or more records that are all
A, or all AAAA, is shuffled whole; any other section is regrouped as its CNAME records, then the
records of other types, then the A and AAAA records shuffled together, then the MX records
shuffled, each group otherwise in its order. So SRV records keep their order and weights.

This works on an encoded reply, so it applies alike to answers from the zones, from the caches
and from the upstreams. The OPT record stays last, where CoreDNS adds it after the shuffle (an
upstream's OPT, which CoreDNS would sort with the other records, stays last too). A reply whose
names point only into the question, or nowhere, as toposdns writes them, is reordered by moving
record bytes; one whose names point into other records is parsed and packed again with dnslib.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from math import lcm
from struct import error as StructError
from struct import unpack_from

import dnslib
from dnslib.buffer import BufferError as PacketError

from toposdns.wire.codes import AAAA, AXFR, CNAME, IXFR, MX, NOERROR, OPT, A
from toposdns.wire.decode import HEADER_SIZE, question_end, read_name, record_spans

TSIG = 250
#: The furthest a compression pointer reaches (14 bits of offset).
_POINTER_REACH = 0x3FFF
#: Records that must end the additional section (RFC 6891, RFC 8945): never moved.
PSEUDO = frozenset({OPT, TSIG})
#: Where names sit in the rdata of the types whose names may be compressed (RFC 3597 §4):
#: the bytes before the first name, and how many names follow one another.
NAME_FIELDS = {
    2: (0, 1), 3: (0, 1), 4: (0, 1), 5: (0, 1), 6: (0, 2), 7: (0, 1), 8: (0, 1), 9: (0, 1),
    12: (0, 1), 14: (0, 2), 15: (2, 1), 17: (0, 2), 18: (2, 1), 21: (2, 1), 26: (2, 2),
    33: (6, 1),
}  # fmt: skip

#: A random 16-bit number, as miekg/dns's dns.Id() that CoreDNS draws from.
Draw = Callable[[], int]


def _draw() -> int:
    return random.getrandbits(16)


def order(rtypes: Sequence[int], draw: Draw = _draw) -> list[int]:
    """The new order of one section's records, given their types, as indexes into it.

    CoreDNS shuffles a section of only A (or only AAAA) records whole; that is the general case
    below with nothing but addresses, drawing the same numbers.
    """
    cnames, rest, addresses, mail = _groups(rtypes)
    _shuffle(addresses, draw)
    _shuffle(mail, draw)
    return cnames + rest + addresses + mail


def varies(rtypes: Sequence[int]) -> bool:
    """True when `order` can give these records another order than they have."""
    cnames, rest, addresses, mail = _groups(rtypes)
    grouped = cnames + rest + addresses + mail
    return len(addresses) > 1 or len(mail) > 1 or grouped != sorted(grouped)


def _groups(rtypes: Sequence[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """Indexes of the CNAME, other, address and MX records, each in their order."""
    groups: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
    for index, rtype in enumerate(rtypes):
        group = 0 if rtype == CNAME else 2 if rtype in (A, AAAA) else 3 if rtype == MX else 1
        groups[group].append(index)
    return groups


def _shuffle(items: list[int], draw: Draw) -> None:
    """CoreDNS's roundRobinShuffle: a coin for two, else a swap per place with draw() % n."""
    count = len(items)
    if count == 2:
        if draw() % 2 == 0:
            items.reverse()
    elif count > 2:
        for j in range(count):
            p = j + draw() % (count - j)
            items[j], items[p] = items[p], items[j]


def shuffle_reply(reply: bytes, draw: Draw = _draw) -> bytes | None:
    """The reply with its records in a new order, or None when their order never varies (an
    error, a transfer, no section with records to move) or the reply cannot be read."""
    if len(reply) < HEADER_SIZE or reply[3] & 0x0F != NOERROR:
        return None
    try:
        end_of_question = question_end(reply)
        (qtype,) = unpack_from("!H", reply, end_of_question - 4)
        spans = record_spans(reply)
        contained = _self_contained(reply, spans, end_of_question)
    except (ValueError, IndexError, StructError):
        return None
    # An OPT's TTL field holds the rest of the rcode: BADVERS, BADCOOKIE... are not NOERROR.
    if qtype in (AXFR, IXFR) or any(rtype == OPT and reply[at] for _, at, _, rtype, _ in spans):
        return None
    sections: tuple[list[int], list[int], list[int]] = ([], [], [])
    pseudo = []
    for index, (_, _, _, rtype, section) in enumerate(spans):
        if section == 2 and rtype in PSEUDO:
            pseudo.append(index)
        else:
            sections[section].append(index)
    types = [[spans[i][3] for i in section] for section in sections]
    if not any(varies(section_types) for section_types in types):
        return None
    new = [
        section[i]
        for section, section_types in zip(sections, types, strict=True)
        for i in order(section_types, draw)
    ] + pseudo
    if not contained:
        return _repacked(reply, new)
    end = spans[-1][2]
    moved = b"".join(reply[spans[i][0] : spans[i][2]] for i in new)
    return reply[:end_of_question] + moved + reply[end:]


def _self_contained(reply: bytes, spans: list[tuple[int, int, int, int, int]], floor: int) -> bool:
    """True when no name of a record points at or past `floor`, into the records."""
    for start, ttl_at, end, rtype, _ in spans:
        if _points_past(reply, start, floor):
            return False
        fields = NAME_FIELDS.get(rtype)
        if fields is None:
            continue
        offset = ttl_at + 6 + fields[0]
        for _ in range(fields[1]):
            if offset >= end or _points_past(reply, offset, floor):
                return False
            offset = read_name(reply, offset)[1]
    return True


def _points_past(reply: bytes, offset: int, floor: int) -> bool:
    """True when the name at `offset` ends in a pointer at or past `floor`."""
    while reply[offset] and reply[offset] & 0xC0 != 0xC0:
        offset += 1 + reply[offset]
    if not reply[offset]:
        return False
    return ((reply[offset] & 0x3F) << 8 | reply[offset + 1]) >= floor


def _repacked(reply: bytes, new: list[int]) -> bytes | None:
    """The records in the new order, names compressed again; None if that would not fit where
    the reply fitted, or dnslib cannot read it or write it back: past 16 KiB it would point at
    names it wrote beyond 0x3FFF, which a pointer cannot reach (its pointers wrap around)."""
    if len(reply) > _POINTER_REACH:
        return None
    try:
        message = dnslib.DNSRecord.parse(reply)
        records = message.rr + message.auth + message.ar
        if len(records) != len(new):
            return None
        counts = (len(message.rr), len(message.auth))
        ordered = [records[i] for i in new]
        message.rr = ordered[: counts[0]]
        message.auth = ordered[counts[0] : counts[0] + counts[1]]
        message.ar = ordered[counts[0] + counts[1] :]
        packed = bytes(message.pack())
    except (dnslib.DNSError, PacketError, ValueError, IndexError, StructError, UnicodeError):
        return None
    return packed if len(packed) <= len(reply) else None


class Rotation:
    """A cached reply whose address records take turns at the front (`--loadbalance` on the
    cache's path). Each section is grouped once as `order` groups it; then, reply after reply,
    each group of address (and of MX) records is rotated by one: over any n replies each of
    a group's n records comes first once. That is the balance clients need (most take the
    first address), at the cost of a join per reply, where a shuffle per reply would cost a
    parse and draws only a random balance."""

    __slots__ = ("parts", "turn", "orders")

    #: Every order of a reply is made once when they take at most this many bytes together.
    MADE_ONCE = 16_384

    def __init__(self, parts: list[bytes | list[bytes]]) -> None:
        #: Bytes that stay, and groups of records that rotate, in reply order.
        self.parts = parts
        self.turn = 0
        #: Every order the reply takes, in turn, when few enough to keep: a reply is then one
        #: index (the UDP frontend's fast path reads them), else one join.
        self.orders: tuple[bytes, ...] = ()
        period = lcm(*(len(part) for part in parts if isinstance(part, list)))
        if period * self.size() <= self.MADE_ONCE:
            self.orders = tuple(self.joined(turn) for turn in range(period))

    @classmethod
    def of(cls, reply: bytes) -> Rotation | None:
        """The rotation of an uncompressed reply (after its ID), or None if its order never
        varies, it is not a NOERROR reply, or names in it point into its records."""
        message = b"\x00\x00" + reply
        if len(message) < HEADER_SIZE or message[3] & 0x0F != NOERROR:
            return None
        try:
            end_of_question = question_end(message)
            (qtype,) = unpack_from("!H", message, end_of_question - 4)
            spans = record_spans(message)
            if not _self_contained(message, spans, end_of_question):
                return None
        except (ValueError, IndexError, StructError):
            return None
        if qtype in (AXFR, IXFR) or any(
            rtype == OPT and message[at] for _, at, _, rtype, _ in spans
        ):
            return None
        parts: list[bytes | list[bytes]] = [message[2:end_of_question]]
        rotates = False
        for section in range(3):
            indexes = [i for i, span in enumerate(spans) if span[4] == section]
            pseudo = [i for i in indexes if section == 2 and spans[i][3] in PSEUDO]
            indexes = [i for i in indexes if i not in pseudo]
            cnames, rest, addresses, mail = _groups([spans[i][3] for i in indexes])
            for group, rotating in (
                (cnames, False),
                (rest, False),
                (addresses, True),
                (mail, True),
            ):
                records = [message[spans[indexes[g]][0] : spans[indexes[g]][2]] for g in group]
                if rotating and len(records) > 1:
                    parts.append(records)
                    rotates = True
                elif records:
                    parts.append(b"".join(records))
            parts += [message[spans[i][0] : spans[i][2]] for i in pseudo]
        if not rotates:
            return None
        merged: list[bytes | list[bytes]] = []
        for part in parts:
            if isinstance(part, bytes) and merged and isinstance(merged[-1], bytes):
                merged[-1] += part
            else:
                merged.append(part)
        return cls(merged)

    def next(self) -> bytes:
        """The reply (after its ID) in the next order."""
        turn = self.turn = self.turn + 1
        orders = self.orders
        return orders[turn % len(orders)] if orders else self.joined(turn)

    def joined(self, turn: int) -> bytes:
        """The reply with each group rotated `turn` places."""
        out: list[bytes] = []
        for part in self.parts:
            if isinstance(part, bytes):
                out.append(part)
            else:
                at = turn % len(part)
                out += part[at:]
                out += part[:at]
        return b"".join(out)

    def size(self) -> int:
        """Bytes of one order (the cache counts `held`)."""
        return sum(
            len(part) if isinstance(part, bytes) else sum(map(len, part)) for part in self.parts
        )

    def held(self) -> int:
        """Bytes held, for the cache's accounting: the parts, and the orders made once."""
        return self.size() + sum(map(len, self.orders))
