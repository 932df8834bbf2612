"""Replies to first-time names from templates, without decoding or resolving them in full.

Most names a cluster DNS sees for the first time are search-path expansions
(`api.example.com.<ns>.svc.cluster.local` and the like) that do not exist, endpoint names of
addresses no endpoint has, services that do not exist, and pod names. For an A or AAAA question
the resolver tells from a few of its labels whether the name certainly does not exist (`absent`)
or is a pod name under `pods insecure` (`pod_address`). The reply is then the question as sent
and either the zone's SOA (NXDOMAIN, or NODATA for a pod name of the other family) or the pod's
one address record, its owner the name as asked, from bytes kept per zone spelling and serial.
Anything else goes the ordinary way; the differential test holds both to resolve + encode.

A query without OPT record (`Negatives.plain`) is read off its bytes alone: one walk of its name
gives its cache key and the labels the decision reads, and the common shapes (search-path
names, services that do not exist, endpoint names, pod names) are decided on those bytes, with
one lookup for the namespace and one for the service.
"""

from __future__ import annotations

from struct import pack

from toposdns.resolve.qname import POD, SVC
from toposdns.resolve.resolver import (
    REVERSE_ZONES,
    ResolverConfig,
    absent,
    endpoint_hostnames,
    packed_pod_address,
    pod_address,
    zone_soa,
)
from toposdns.store.model import EndpointSlice, Service
from toposdns.store.snapshot import Dependency, Snapshot
from toposdns.wire.codes import AA, AAAA, COPIED_FLAGS, NOERROR, NXDOMAIN, QR, SERVFAIL, A, Name
from toposdns.wire.decode import read_name
from toposdns.wire.encode import bare_opt, name_wire, record_wire

_REVERSE = tuple(name_wire(zone) for zone in REVERSE_ZONES)
_A_IN = b"\x00\x01\x00\x01"
_AAAA_IN = b"\x00\x1c\x00\x01"
#: The question's type and class (IN) the templates answer, and the type.
_QTYPES = {_A_IN: A, _AAAA_IN: AAAA}
_ONE_QUESTION = b"\x00\x01\x00\x00\x00\x00\x00\x00"
_SVC = SVC.encode()
_POD = POD.encode()
_NS_DNS = name_wire(("ns", "dns"))[:-1]
_NOTHING: frozenset[Dependency] = frozenset()
#: What Python spends on a service's endpoint labels kept (`Negatives.hostnames`) beyond
#: their characters: per service (its tuples, the set, the table's slot) and per label (the
#: string's header, its slot in the set); measured with tracemalloc.
KNOWN_OVERHEAD = 160
LABEL_OVERHEAD = 115
#: The bytes they may take by default (the responder gives them a share of the cache's bound).
KNOWN_BYTES = 2 << 20


def _wire(zone: Name) -> tuple[bytes, int]:
    return name_wire(zone), len(zone)


class Negatives:
    """Builds NXDOMAIN (SERVFAIL before the first sync), NODATA and pod-name replies from
    templates."""

    def __init__(self, config: ResolverConfig, memory: int = KNOWN_BYTES) -> None:
        self.config = config
        #: The bytes the endpoint labels kept (`known`) may take, and take.
        self.memory = memory
        self.known_bytes = 0
        #: The zones' lower-case wire forms and label counts, longest first: the zone a name is
        #: in is the longest that holds it (resolver `match_zone`).
        self.zones = sorted(map(_wire, config.zones), key=lambda zone: -zone[1])
        self.fallthrough = [_wire(zone) for zone in config.fallthrough]
        #: SOA records by (zone as asked, serial).
        self.soas: dict[tuple[bytes, int], bytes] = {}
        #: Endpoint labels by service, with the service and slices they were read from.
        self.known: dict[
            tuple[str, str],
            tuple[Service, tuple[EndpointSlice, ...] | None, frozenset[str], int],
        ] = {}
        #: An answer record's type, class, TTL and data length, by record type.
        self.heads = {
            A: pack("!HHIH", A, 1, config.ttl, 4),
            AAAA: pack("!HHIH", AAAA, 1, config.ttl, 16),
        }

    def reply(
        self, data: bytes, key: bytes, snapshot: Snapshot, limit: int
    ) -> tuple[bytes, int, frozenset[Dependency]] | None:
        """(reply, qtype, dependencies) for a plain A or AAAA query whose name certainly does
        not exist or is a pod name, or None. `key` is the query's cache key (wire/edns.py
        `split_query`): the name in it is in lower case already."""
        has_opt = data[11] == 1
        end = len(key) - (9 if has_opt else 2)  # past the name, in `data`
        kind = key[end - 2 : end + 2]
        qtype = _QTYPES.get(kind)
        if qtype is None:
            return None
        if has_opt and data[end + 10]:  # EDNS version other than 0: BADVERS
            return None
        lower = key[10 : end - 2]
        starts = []  # where each label of the name starts
        at = 0
        length = lower[0]
        while length:
            starts.append(at)
            at += length + 1
            length = lower[at]
        verdict = self.verdict(lower, starts, snapshot)
        if verdict is None:
            return None
        zone_at, depends, address = verdict
        opt = b""
        if has_opt:  # the OPT's class is the buffer size; the TTL's third byte holds DO
            opt = bare_opt((data[end + 7] << 8) | data[end + 8], data[end + 11] << 8)
        reply = self.written(data, end, qtype, zone_at, address, opt, snapshot)
        return (reply, qtype, depends) if len(reply) <= limit else None

    def plain(
        self, data: bytes, snapshot: Snapshot
    ) -> tuple[bytes, tuple[bytes, int, frozenset[Dependency]] | None] | None:
        """`reply` for an A or AAAA query without OPT record, the shape stub resolvers send,
        read from its bytes alone: (its cache key, (reply, qtype, dependencies) or None when
        only the resolver can tell), or None for any other message. It accepts what
        wire/edns.py `split_query` accepts without OPT, and its key is `plain_key`'s; it walks
        the name once, for both."""
        size = len(data)
        if size < 17 or data[2] & 0xF8 or data[4:12] != _ONE_QUESTION:
            return None
        kind = data[-4:]
        qtype = _QTYPES.get(kind)
        if qtype is None:
            return None
        starts = []  # where each label of the name starts, from the name's first byte
        at = 12
        length = data[12]
        while length:
            if length > 63:  # a compression pointer or an unknown label type
                return None
            starts.append(at - 12)
            at += length + 1
            if at > 266 or at >= size:  # names end within 255 octets
                return None
            length = data[at]
        if at + 5 != size:
            return None
        key = data[2:-4].lower() + kind
        verdict = self.verdict(key[10:-4], starts, snapshot)
        if verdict is None:
            return key, None
        zone_at, depends, address = verdict
        return key, (
            self.written(data, at + 1, qtype, zone_at, address, b"", snapshot),
            qtype,
            depends,
        )

    def verdict(
        self, lower: bytes, starts: list[int], snapshot: Snapshot
    ) -> tuple[int, frozenset[Dependency], bytes | None] | None:
        """(where the zone starts in the name, the reply's dependencies, the pod's address or
        None for NXDOMAIN) for a name, in lower case and wire form, that certainly does not
        exist or is a pod name; None when only the resolver can tell. `starts`: where each
        of its labels starts."""
        if not lower.isascii():  # the resolver lower-cases beyond ASCII
            return None
        zone = _match(lower, starts, self.zones)
        if zone is None or self.fallthrough and _match(lower, starts, self.fallthrough) is not None:
            return None
        count = len(starts) - zone  # labels left of the zone
        zone_at = starts[count] if count < len(starts) else len(lower) - 1
        if count == 0:
            return None  # the apex has records
        last = starts[count - 1]
        kind = lower[last + 1 : zone_at]
        if kind != _SVC and kind != _POD:
            # Most search-path names: `absent`'s first step, on bytes (the server's own name
            # `ns.dns` has records).
            if count == 2 and lower[starts[0] : zone_at] == _NS_DNS:
                return None
            return zone_at, _NOTHING, None
        config = self.config
        if count > 1 and (count <= 5 or kind == _POD or not config.zonal):
            # `absent` and `pod_address` on bytes, for the other search-path names, services
            # that do not exist, endpoint names and pod names.
            if count > 5 or lower[starts[-2] :] in _REVERSE:
                return zone_at, _NOTHING, None
            namespace = lower[starts[count - 2] + 1 : last].decode()
            listed = config.namespaces
            in_namespace = frozenset({("ns", namespace)})
            if namespace not in snapshot.namespaces or listed and namespace not in listed:
                return zone_at, in_namespace, None
            if kind == _POD:
                if config.pods == "disabled":
                    return zone_at, in_namespace, None
                if config.pods != "insecure" or count < 3:
                    return None
                label = lower[starts[count - 3] + 1 : starts[count - 2]].decode()
                address = packed_pod_address(label)
                return None if address is None else (zone_at, in_namespace, address)
            if count == 2:
                return None  # NODATA
            service = lower[starts[count - 3] + 1 : starts[count - 2]].decode()
            svc = snapshot.services.get((namespace, service))
            if svc is not None and (
                count != 4 or lower[1 : starts[1]].decode() in self.hostnames(svc, snapshot)
            ):
                return None
            return zone_at, frozenset({("ns", namespace), ("svc", namespace, service)}), None
        tail = tuple(  # the zonal names of services, `svc.<zone>` and `pod.<zone>`
            [
                lower[at + 1 : at + 1 + lower[at]].decode()
                for at in starts[max(0, count - 5) : count]
            ]
        )
        reverse = len(starts) >= 2 and lower[starts[-2] :] in _REVERSE
        depends = absent(tail, count, reverse, snapshot, config)
        if depends is not None:
            return zone_at, depends, None
        address = pod_address(tail, count, config)
        if address is None:
            return None
        return zone_at, frozenset({("ns", tail[-2])}), address

    def hostnames(self, svc: Service, snapshot: Snapshot) -> frozenset[str]:
        """The service's endpoint labels (resolver `endpoint_hostnames`), kept while the
        service and its slices stay the same objects: endpoint names of addresses no endpoint
        has are asked of the same services over and over."""
        key = (svc.namespace, svc.name)
        slices = snapshot.slices.get(key)
        known = self.known.get(key)
        if known is not None and known[0] is svc and known[1] is slices:
            return known[2]
        names = endpoint_hostnames(svc, snapshot, self.config)
        size = KNOWN_OVERHEAD + sum(len(name) + LABEL_OVERHEAD for name in names)
        if known is not None:
            self.known_bytes -= known[3]
            del self.known[key]
        if self.known_bytes + size > self.memory:
            self.known.clear()
            self.known_bytes = 0
        if size <= self.memory:
            self.known[key] = (svc, slices, names, size)
            self.known_bytes += size
        return names

    def written(
        self,
        data: bytes,
        end: int,
        qtype: int,
        zone_at: int,
        address: bytes | None,
        opt: bytes,
        snapshot: Snapshot,
    ) -> bytes:
        """The reply to `data`, whose name ends at `end`: the pod's address for its own family,
        else the zone's SOA (NXDOMAIN, SERVFAIL before the first sync, NODATA for a pod name of
        the other family); the question as asked, the zone at `zone_at` in its name."""
        flags = QR | (((data[2] << 8) | data[3]) & COPIED_FLAGS) | AA
        additional = 1 if opt else 0
        if address is not None:
            if len(address) == (16 if qtype == AAAA else 4):
                head = pack("!5H", flags | NOERROR, 1, 1, 0, additional)
                record = data[12:end] + self.heads[qtype] + address
                return b"".join((data[:2], head, data[12 : end + 4], record, opt))
            rcode = NOERROR
        else:
            rcode = NXDOMAIN if snapshot.synced else SERVFAIL
        head = pack("!5H", flags | rcode, 1, 0, 1, additional)
        record = self.soa(data[12 + zone_at : end], snapshot)
        return b"".join((data[:2], head, data[12 : end + 4], record, opt))

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
