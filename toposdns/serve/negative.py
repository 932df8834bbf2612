"""NXDOMAIN for first-time names, without decoding or resolving them in full.

Most names a cluster DNS sees for the first time are search-path expansions
(`api.example.com.<ns>.svc.cluster.local` and the like) that do not exist. For an A or AAAA
question the resolver's `absent` tells that from a few of its labels, and the reply is the
question as sent plus the zone's SOA, from bytes kept per zone spelling and serial. Anything it
cannot tell goes the ordinary way; the differential test holds both to resolve + encode.
"""

from __future__ import annotations

from struct import pack

from toposdns.resolve.resolver import REVERSE_ZONES, ResolverConfig, absent, zone_soa
from toposdns.store.snapshot import Dependency, Snapshot
from toposdns.wire.codes import AA, AAAA, COPIED_FLAGS, NXDOMAIN, QR, SERVFAIL, A, Name
from toposdns.wire.decode import read_name
from toposdns.wire.edns import plain_question_end
from toposdns.wire.encode import bare_opt, name_wire, record_wire

_REVERSE = tuple(name_wire(zone) for zone in REVERSE_ZONES)
_IN = b"\x00\x01"


def _wire(zone: Name) -> tuple[bytes, int]:
    return name_wire(zone), len(zone)


class Negatives:
    """Builds NXDOMAIN (SERVFAIL before the first sync) replies from templates."""

    def __init__(self, config: ResolverConfig) -> None:
        self.config = config
        #: The zones' lower-case wire forms and label counts, longest first: the zone a name is
        #: in is the longest that holds it (resolver `match_zone`).
        self.zones = sorted(map(_wire, config.zones), key=lambda zone: -zone[1])
        self.fallthrough = [_wire(zone) for zone in config.fallthrough]
        #: SOA records by (zone as asked, serial).
        self.soas: dict[tuple[bytes, int], bytes] = {}

    def reply(
        self, data: bytes, key: bytes, snapshot: Snapshot, limit: int
    ) -> tuple[bytes, int, frozenset[Dependency]] | None:
        """(reply, qtype, dependencies) for a plain query whose name certainly does not exist,
        or None. `key` is the query's cache key (wire/edns.py `split_query`)."""
        has_opt = data[11] == 1
        end = plain_question_end(data, key) - 4  # past the name
        qtype = (data[end] << 8) | data[end + 1]
        if qtype != A and qtype != AAAA or data[end + 2 : end + 4] != _IN:
            return None
        if has_opt and data[end + 10]:  # EDNS version other than 0: BADVERS
            return None
        starts = []  # where each label of the name starts, from the name's first byte
        offset = 12
        length = data[12]
        while length:
            starts.append(offset - 12)
            offset += length + 1
            length = data[offset]
        name = data[12:end]
        if not name.isascii():  # the resolver lower-cases beyond ASCII
            return None
        lower = name.lower()
        zone = _match(lower, starts, self.zones)
        if zone is None or self.fallthrough and _match(lower, starts, self.fallthrough) is not None:
            return None
        count = len(starts) - zone  # labels left of the zone
        text = lower.decode()
        tail = tuple(text[at + 1 : at + 1 + lower[at]] for at in starts[max(0, count - 5) : count])
        reverse = len(starts) >= 2 and lower[starts[-2] :] in _REVERSE
        depends = absent(tail, count, reverse, snapshot, self.config)
        if depends is None:
            return None
        rcode = NXDOMAIN if snapshot.synced else SERVFAIL
        flags = QR | (((data[2] << 8) | data[3]) & COPIED_FLAGS) | AA | rcode
        zone_at = starts[count] if count < len(starts) else len(name) - 1
        opt = b""
        if has_opt:  # the OPT's class is the buffer size; the TTL's third byte holds DO
            opt = bare_opt((data[end + 7] << 8) | data[end + 8], data[end + 11] << 8)
        reply = b"".join(
            (
                data[:2],
                pack("!5H", flags, 1, 0, 1, 1 if has_opt else 0),
                data[12 : end + 4],
                self.soa(name[zone_at:], snapshot),
                opt,
            )
        )
        return (reply, qtype, depends) if len(reply) <= limit else None

    def soa(self, zone: bytes, snapshot: Snapshot) -> bytes:
        """The zone's SOA record (resolver `zone_soa`) in wire form, its owner the zone as
        asked (`zone`, in wire form too)."""
        key = (zone, snapshot.serial)
        record = self.soas.get(key)
        if record is None:
            labels = read_name(zone, 0)[0]
            record = record_wire(zone_soa(labels, snapshot.serial, self.config.ttl))
            if len(self.soas) >= 1024:  # one per zone spelling and serial: few at a time
                self.soas.clear()
            self.soas[key] = record
        return record


def _match(lower: bytes, starts: list[int], zones: list[tuple[bytes, int]]) -> int | None:
    """The label count of the longest of `zones` that holds the name, or None."""
    for wire, labels in zones:
        if labels <= len(starts):
            at = starts[len(starts) - labels] if labels else len(lower) - 1
            if lower[at:] == wire:
                return labels
    return None
