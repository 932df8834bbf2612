"""Answer a question from a snapshot, exactly as CoreDNS's `kubernetes` plugin does.

This is a pure function of (question, snapshot, config): no I/O, no clock. Its structure follows
CoreDNS so that each rule can be checked against its source (docs/coredns-compatibility.md):

- `resolve` is `handler.go` ServeDNS: zone match, dispatch on the qtype, negative answers;
- `_Lookup.services` / `records` / `find_services` / `find_pods` are `kubernetes.go`;
- `_Lookup.address` / `srv` / `ptr` / `ns` are `plugin/backend_lookup.go`.

A lookup produces *entries* (CoreDNS's `msg.Service`): a host, which is an IP or a CNAME
target, a port, and the owner name an SRV record would point at.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, replace
from socket import AF_INET, inet_pton

from toposdns.options import (
    ConfigError,
    Origin,
    Plugin,
    Setting,
    adds,
    choice,
    domain,
    domain_as_written,
    integer,
    none,
    sets,
)
from toposdns.resolve.answer import Answer, Chase
from toposdns.resolve.qname import (
    PIN,
    POD,
    PREFER,
    SVC,
    ZONE_ANCHOR,
    InvalidName,
    Request,
    parse_request,
)
from toposdns.store.model import (
    CLUSTER_IP,
    EXTERNAL_NAME,
    HEADLESS,
    Endpoint,
    EndpointSlice,
    Port,
    Service,
    canonical_ip,
)
from toposdns.store.snapshot import Dependency, Snapshot
from toposdns.store.topology import (
    Labels,
    Policy,
    Selection,
    endpoint_labels,
    schedule_of,
    select,
)
from toposdns.store.turns import TurnCounts, take_turn
from toposdns.wire.codes import (
    AAAA,
    AXFR,
    CNAME,
    IXFR,
    NOERROR,
    NS,
    NXDOMAIN,
    PTR,
    REFUSED,
    SERVFAIL,
    SOA,
    SRV,
    TXT,
    A,
    Name,
)
from toposdns.wire.encode import MAX_TCP_SIZE
from toposdns.wire.records import RR, Soa, Srv

#: The least a record of a reply takes besides its rdata: its owner name, compressed to a
#: pointer at least (no owner here is the root), then type, class, TTL and rdata length.
_RR_LEAST = 12
#: The port of an entry that has none (CoreDNS's `msg.Service` Port 0).
_PORT_ZERO = (0,)

DNS_SCHEMA_VERSION = "1.1.0"
DNS_VERSION_TTL = 28800
REVERSE_ZONES = (("in-addr", "arpa"), ("ip6", "arpa"))
# CoreDNS stops following in-zone CNAMEs once more than this many are in the answer
# (backend_lookup.go maxCnameChainLength, 10 since v1.12.1): at most 11 CNAMEs then.
MAX_CNAME_CHAIN = 10


@dataclass(frozen=True, slots=True)
class ResolverConfig:
    """The options that change answers (CoreDNS's `kubernetes` stanza)."""

    #: Served zones as lower-case labels, in configured order.
    zones: tuple[Name, ...] = (("cluster", "local"), ("in-addr", "arpa"), ("ip6", "arpa"))
    ttl: int = 5
    pods: str = "disabled"  # disabled | insecure | verified
    endpoint_pod_names: bool = False
    #: CoreDNS's `namespaces` option: when set, only these namespaces are served.
    namespaces: frozenset[str] = frozenset()
    #: This server's own non-loopback addresses, for apex NS and `ns.dns.<zone>` (local.go).
    ns_addresses: tuple[str, ...] = ()
    #: The first non-reverse zone, in its configured case: PTR answers point into it.
    primary_zone: Name = ("cluster", "local")
    #: `fallthrough` zones as lower-case labels (the root, (), holds every name): there a name
    #: the cluster does not have goes on to the upstreams instead of getting NXDOMAIN.
    fallthrough: tuple[Name, ...] = ()
    #: CoreDNS's `zonal`: headless services also answer `<zone>.pin|prefer._zone.<svc>…`.
    zonal: bool = False
    #: CoreDNS's `ignore empty_service`: a ClusterIP service without a ready endpoint address
    #: is NXDOMAIN, so a search path goes on to its next domain.
    ignore_empty_service: bool = False
    #: CoreDNS's `noendpoints`: no endpoint data at all, so endpoint names and headless
    #: services are NXDOMAIN, and PTR and NS answer from Services only.
    noendpoints: bool = False


POD_MODES = ("disabled", "insecure", "verified")


def _zones(options: ResolverConfig, words: Sequence[str], origin: Origin) -> ResolverConfig:
    """`kubernetes ZONES...` (`--zone`): the zones, lower-cased, and the first forward zone in
    its written case, which PTR answers point into."""
    zones: list[Name] = []
    primary: Name | None = None
    for word in words:
        labels = domain_as_written(word, origin)
        lower = domain(word, origin)
        if lower in zones:
            continue
        zones.append(lower)
        if primary is None and lower[-2:] not in REVERSE_ZONES:
            primary = labels
    if not zones:
        return options
    if primary is None:
        raise origin.error("at least one zone must be a forward zone, e.g. cluster.local")
    return replace(options, zones=tuple(zones), primary_zone=primary)


def _fallthrough(words: Sequence[str], origin: Origin) -> tuple[Name, ...]:
    """`fallthrough [ZONES...]`: no zone (or `.`) is every zone, the root."""
    return tuple(dict.fromkeys(domain(word, origin) for word in words or ["."]))


def _namespaces(words: Sequence[str], origin: Origin) -> frozenset[str]:
    if not words:
        raise origin.error("expected at least one namespace, e.g. default")
    return frozenset(words)


def _check(options: ResolverConfig, origin: Origin) -> ResolverConfig:
    """A `fallthrough` zone must overlap a served zone, or nothing could fall through."""
    options = replace(options, fallthrough=tuple(dict.fromkeys(options.fallthrough)))
    for labels in options.fallthrough:
        if not any(
            labels[len(labels) - len(zone) :] == zone or zone[len(zone) - len(labels) :] == labels
            for zone in options.zones
        ):
            served = ", ".join(".".join(zone) or "." for zone in options.zones)
            raise origin.error(
                f"fallthrough {'.'.join(labels) or '.'}: holds no name of the served zones "
                f"({served}); name one of them or a zone inside one, e.g. in-addr.arpa"
            )
    if options.zonal and options.noendpoints:
        # CoreDNS's setup.go refuses the pair: zonal answers come from the endpoints.
        if origin.place:
            raise ConfigError(
                f"{origin.place}: kubernetes: zonal requires the endpoint cache; remove noendpoints"
            )
        raise ConfigError("--zonal: requires the EndpointSlice watch; remove --noendpoints")
    return options


def _ignore(words: Sequence[str], origin: Origin) -> bool:
    """`ignore empty_service` (`--ignore-empty-service`); a bare `ignore` changes nothing, as
    in CoreDNS."""
    if not origin.place:
        return True  # the flag
    if words and list(words) != ["empty_service"]:
        raise origin.error("unable to parse ignore value; the one value is empty_service")
    return bool(words)


#: The `kubernetes` plugin's answer options, as its Corefile block and `serve`'s flags set them.
KUBERNETES: Plugin[ResolverConfig] = Plugin(
    "kubernetes",
    ResolverConfig,
    (
        Setting(
            "",
            _zones,
            "--zone",
            "ZONE[,ZONE]",
            "zones to serve, repeatable (default {default})",
            shows="zones",
            repeat="join",
        ),
        Setting(
            "ttl",
            sets("ttl", integer(0, 3600, "30")),
            "--ttl",
            "SECONDS",
            "TTL of answers, 0 to 3600 (default {default})",
            shows="ttl",
        ),
        Setting(
            "pods",
            sets("pods", choice(*POD_MODES)),
            "--pods",
            "|".join(POD_MODES),
            "pod records <a-b-c-d>.<ns>.pod.<zone> (default {default})",
            shows="pods",
        ),
        Setting(
            "endpoint_pod_names",
            sets("endpoint_pod_names", none),
            "--endpoint-pod-names",
            help="name endpoints without a hostname after their pod",
        ),
        Setting(
            "namespaces",
            sets("namespaces", _namespaces),
            "--namespaces",
            "NS[,NS]",
            "serve only these namespaces (CoreDNS `namespaces`)",
        ),
        Setting(
            "fallthrough",
            adds("fallthrough", _fallthrough),
            "--fallthrough",
            "ZONE[,ZONE]",
            "names in these zones that the cluster does not have go to the upstreams instead of "
            "NXDOMAIN (SERVFAIL without upstreams); no zone: every zone (CoreDNS `fallthrough`)",
            repeat="each",
            optional=True,
        ),
        Setting(
            "zonal",
            sets("zonal", none),
            "--zonal",
            help="headless services also answer <zone>.pin._zone.<svc>.<ns>.svc.<zone> (that "
            "topology zone's endpoints) and <zone>.prefer._zone... (all when it has none) "
            "(CoreDNS `zonal`)",
        ),
        Setting(
            "ignore",
            sets("ignore_empty_service", _ignore),
            "--ignore-empty-service",
            help="NXDOMAIN for ClusterIP services without a ready endpoint, so that a search "
            "path goes on (CoreDNS `ignore empty_service`)",
        ),
        Setting(
            "noendpoints",
            sets("noendpoints", none),
            "--noendpoints",
            help="watch no EndpointSlices: endpoint names and headless services are NXDOMAIN "
            "(CoreDNS `noendpoints`)",
        ),
    ),
    _check,
)


class NotFound(LookupError):
    """CoreDNS's errNoItems / errNsNotExposed: the name does not exist (NXDOMAIN)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    """CoreDNS's `msg.Service` for each of `ports`: one per address, not per (address, port),
    so that a slice of 1,000 endpoints and 100 ports makes 1,000 of them, not 100,000."""

    host: str  # an IP address, or for ExternalName the CNAME target
    ports: tuple[int, ...]  # the matching ports, in order; -1 is CoreDNS's "no port"
    key: Name  # the name SRV and NS records point at
    is_ip: bool = True
    endpoint: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """How a headless service chose endpoints for the client (what `explain` shows)."""

    service: Service
    policy: Policy
    client: Labels
    candidates: tuple[tuple[Endpoint, Labels], ...]
    selection: Selection


def resolve(
    name: Name,
    qtype: int,
    snapshot: Snapshot,
    config: ResolverConfig,
    client: Labels | None = None,
    trace: list[Decision] | None = None,
    limit: int = MAX_TCP_SIZE,
    turns: TurnCounts | None = None,
    group: int = -1,
) -> Answer:
    """Answer one question. `name` is the query name's labels exactly as asked.

    `client` is the asking client's node labels (empty or None when unknown). When the answer
    depends on them, `Answer.policy` says which policy it followed and `Answer.tier` which of
    its tiers matched; `trace`, when given, collects each topology decision.

    `limit` is the largest reply the answer goes out in (a UDP client's buffer; by default
    65,535 bytes, TCP's, which serves every transport). A section stops at the record that
    takes the records before it, compressed as tightly as they could be, past that size: the
    records after it would be cut from any reply (wire/encode.py truncates from the end), so
    the reply is the same as that of the whole answer, cut, without building them.

    A and AAAA of a service with topology weights answer one tier per reply, in turn
    (`Answer.schedule`): the next turn of the client's rotation in `turns` (which moves on),
    turn 0 without it, or with `group` >= 0 that tier (`Selection.rotation`'s index) as it is.
    """
    lower = tuple(map(str.lower, name))
    zone_len = match_zone(lower, config.zones)
    if zone_len is None or qtype in (AXFR, IXFR):
        # Not ours, or a zone transfer (CoreDNS needs its transfer plugin): a bare REFUSED.
        return Answer(REFUSED, authoritative=False)
    zone = name[len(name) - zone_len :]
    zone_lower = lower[len(name) - zone_len :]
    # The reply's header and question (written whole) come before any record.
    room = limit - 12 - _name_length(name) - 4
    lookup = _Lookup(snapshot, config, zone, zone_lower, client or {}, trace, room)
    lookup.turns, lookup.group = turns, group
    soa = lookup.soa()
    try:
        records, extra = lookup.dispatch(name, lower, qtype)
    except (NotFound, InvalidName):
        depends = frozenset(lookup.depends)
        if match_zone(lower, config.fallthrough) is not None:
            # handler.go hands the query to the next plugin (`forward`) before it looks at the
            # sync state. With no next plugin the server answers SERVFAIL
            # (plugin.NextOrFailure): this answer as it stands.
            return Answer(SERVFAIL, authoritative=False, depends=depends, fallthrough=True)
        # Until the first sync, a name that was not found may yet appear: SERVFAIL, not NXDOMAIN.
        rcode = NXDOMAIN if snapshot.synced else SERVFAIL
        return Answer(rcode, authority=(soa,), depends=depends)
    depends = frozenset(lookup.depends)
    if not records:
        if lookup.policy is not None:
            # A NODATA for this client only: a negative TTL of 0, so that a resolver that
            # ignores the ECS scope of negative answers cannot serve it to other clients.
            soa = zone_soa(zone, snapshot.serial, 0)
        return Answer(
            NOERROR,
            authority=(soa,),
            policy=lookup.policy,
            tier=lookup.tier,
            soft=lookup.soft,
            depends=depends,
            schedule=lookup.schedule,
            counter=lookup.counter,
        )
    chase = None if lookup.chase is None else Chase(lookup.chase, qtype, soa)
    return Answer(
        NOERROR,
        _dedup(records),
        (),
        _dedup(extra),
        policy=lookup.policy,
        tier=lookup.tier,
        soft=lookup.soft,
        chase=chase,
        depends=depends,
        schedule=lookup.schedule,
        counter=lookup.counter,
    )


def absent(
    tail: Name, count: int, reverse: bool, snapshot: Snapshot, config: ResolverConfig
) -> frozenset[Dependency] | None:
    """For an A or AAAA question: what tells that its name does not exist (its NXDOMAIN
    answer's dependencies), or None when only `resolve` can tell.

    `tail` is the last (up to five) of the name's lower-cased labels left of its zone, `count`
    how many such labels there are, `reverse` whether the name is under in-addr.arpa or
    ip6.arpa. These are the first steps `_Lookup.records`, `find_pods` and `find_services` take
    for such a name, in their order; a name that gets past them has records, or NODATA, or is
    the server's own `ns.dns` name. The differential test holds this to `resolve`.
    """
    kind = tail[-1] if tail else ""
    if kind != SVC and kind != POD:
        # parse.go: not a service or pod name (the apex and `ns.dns` have records).
        return None if count == 0 or (count == 2 and tail == ("ns", "dns")) else _NOTHING
    if count == 1:
        return None  # `svc.<zone>`, `pod.<zone>`: NODATA
    if count > 5 and not (
        config.zonal and kind == SVC and tail[-4] == ZONE_ANCHOR and tail[-5] in (PIN, PREFER)
    ):
        return _NOTHING  # more than two labels before the service, and not a zonal name
    if reverse:
        return _NOTHING
    namespace = tail[-2]
    listed = config.namespaces
    in_namespace = frozenset({("ns", namespace)})
    if namespace not in snapshot.namespaces or (listed and namespace not in listed):
        return in_namespace
    if kind == POD:
        return in_namespace if config.pods == "disabled" else None
    if count == 2:
        return None
    svc = snapshot.services.get((namespace, tail[-3]))
    if svc is not None and (count != 4 or tail[0] in endpoint_hostnames(svc, snapshot, config)):
        return None
    return in_namespace | {("svc", namespace, tail[-3])}


def endpoint_hostnames(svc: Service, snapshot: Snapshot, config: ResolverConfig) -> frozenset[str]:
    """The endpoint labels that name an entry of the service, in lower case (`find_services`
    with an endpoint label: the hostname of an address in a slice with ports)."""
    if svc.kind == EXTERNAL_NAME or config.noendpoints:
        return _NO_NAMES
    pod_names = config.endpoint_pod_names
    return frozenset(
        endpoint_hostname(ep, address, pod_names).lower()
        for eps in snapshot.slices.get((svc.namespace, svc.name), ())
        if eps.ports
        for ep in eps.endpoints
        for address in ep.addresses
    )


_NO_NAMES: frozenset[str] = frozenset()


def pod_address(tail: Name, count: int, config: ResolverConfig) -> bytes | None:
    """For an A or AAAA question whose name `absent` let through: the address a pod name
    stands for under `pods insecure`, packed (its records: that address, or NODATA for the
    other family), or None when only `resolve` can tell. It depends on the namespace alone."""
    if config.pods != "insecure" or count < 3 or tail[-1] != POD:
        return None
    return packed_pod_address(tail[-3])


def packed_pod_address(label: str) -> bytes | None:
    """The address a pod name's first label stands for (`10-1-2-3`, `fd00--4`), packed, or
    None when it stands for none (the name does not exist)."""
    address = _pod_address(label)
    try:
        if ":" not in address:
            # inet_pton reads a dotted quad as strictly as ipaddress (no leading zeros).
            return inet_pton(AF_INET, address)
        parsed = ipaddress.IPv6Address(address)
    except (OSError, ValueError):
        return None
    return None if parsed.scope_id else parsed.packed


_NOTHING: frozenset[Dependency] = frozenset()


def match_zone(lower: Name, zones: tuple[Name, ...]) -> int | None:
    """Length of the longest served zone that `lower` is in, or None."""
    best: int | None = None
    for zone in zones:
        n = len(zone)
        if (best is None or n > best) and lower[len(lower) - n :] == zone:
            best = n
    return best


def case_insensitive(lower: Name, zones: tuple[Name, ...]) -> bool:
    """Whether a name in the zones gets the same answer in whatever letter case it is asked,
    but for the case of the names the answer writes (so that a reply can be written anew for
    another case from one built in the first: wire/case.py). True of every name but a zone's
    apex and `ns.dns.<zone>`, which `_Lookup.dispatch` and `services` compare, lower-cased,
    with the zone as asked (CoreDNS's quirk)."""
    zone_len = match_zone(lower, zones)
    if zone_len is None:
        return False
    return len(lower) != zone_len and not (
        len(lower) == zone_len + 2 and lower[:2] == ("ns", "dns")
    )


def is_reverse(lower: Name) -> bool:
    """True for names under in-addr.arpa or ip6.arpa."""
    return lower[-2:] in REVERSE_ZONES


def reverse_address(lower: Name) -> str | None:
    """The address a full in-addr.arpa / ip6.arpa name stands for, or None (dnsutil)."""
    if lower[-2:] == ("in-addr", "arpa") and len(lower) == 6:
        text = ".".join(reversed(lower[:4]))
    elif lower[-2:] == ("ip6", "arpa") and len(lower) == 34:
        nibbles = "".join(reversed(lower[:32]))
        text = ":".join(nibbles[i : i + 4] for i in range(0, 32, 4))
    else:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def endpoint_hostname(endpoint: Endpoint, address: str, pod_names: bool) -> str:
    """The label an endpoint answers under: hostname, else pod name (option), else dashed IP."""
    if endpoint.hostname:
        return endpoint.hostname
    if pod_names and endpoint.pod_name:
        return endpoint.pod_name
    if "." in address:
        return address.replace(".", "-")
    dashed = address.replace(":", "-")
    return dashed + "0" if dashed.endswith("-") else dashed


def _match_port(request: Request, port: Port) -> bool:
    return (not request.port or request.port == port.name.lower()) and (
        not request.protocol or request.protocol == port.protocol.lower()
    )


def _dedup(records: list[RR]) -> tuple[RR, ...]:
    return tuple(dict.fromkeys(records))


def _pod_address(label: str) -> str:
    # Three dashes and no "--" is IPv4; anything else is read as IPv6 (CoreDNS findPods).
    if label.count("-") == 3 and "--" not in label:
        return label.replace("-", ".")
    return label.replace("-", ":")


def _ip_family(ip: str) -> int:
    """The record type of an address (a host that is known to be one)."""
    return AAAA if ":" in ip else A


def _family(host: str) -> int | None:
    try:
        return A if ipaddress.ip_address(host).version == 4 else AAAA
    except ValueError:
        return None


def zone_soa(zone: Name, serial: int, ttl: int) -> RR:
    """A zone's SOA record, as CoreDNS writes it (backend_lookup.go SOA); `zone` as asked."""
    key = (zone, serial, ttl)
    soa = _soas.get(key)
    if soa is None:
        mname, rname = ("ns", "dns") + zone, ("hostmaster",) + zone
        data = Soa(mname, rname, serial & 0xFFFFFFFF, 7200, 1800, 86400, ttl)
        soa = RR(zone, SOA, min(ttl, 300), data)
        if len(_soas) >= 1024:  # one per zone spelling and serial: few at any time
            _soas.clear()
        _soas[key] = soa
    return soa


#: SOA records already made, by (zone as asked, serial, TTL): the same record object answers
#: every negative reply until the next change, and is encoded once (wire/encode.py).
_soas: dict[tuple[Name, int, int], RR] = {}


class _Lookup:
    """One query's view of the snapshot: the matched zone, as cased in the query."""

    # One is made per query that misses the cache.
    __slots__ = (
        "snap", "cfg", "zone", "zone_lower", "ttl", "client", "trace", "policy", "tier", "chase",
        "depends", "room", "qtype", "srv_groups", "soft", "turns", "group", "schedule", "counter",
    )  # fmt: skip

    def __init__(
        self,
        snapshot: Snapshot,
        config: ResolverConfig,
        zone: Name,
        zone_lower: Name,
        client: Labels,
        trace: list[Decision] | None,
        room: int,
    ) -> None:
        self.snap = snapshot
        self.cfg = config
        self.zone = zone
        self.zone_lower = zone_lower
        self.ttl = config.ttl
        self.client = client
        self.trace = trace
        #: The topology policy the answer followed, if it depends on the client.
        self.policy: Policy | None = None
        #: The tier of that policy that matched (Selection.tier).
        self.tier = ""
        #: The question's type: soft topology answers SRV with more tiers than A and AAAA.
        self.qtype = 0
        #: SRV priorities or weights by tier: id(endpoint) -> (priority, group, the weight
        #: its group shares), from `Selection.srv`; empty when SRV answers as CoreDNS does.
        self.srv_groups: dict[int, tuple[int, int, int]] = {}
        #: What soft topology did (Answer.soft).
        self.soft = ""
        #: Weights for A and AAAA (`resolve`): the rotations' turns, the tier asked for (-1:
        #: the next turn), and the schedule and counter of the rotation answered.
        self.turns: TurnCounts | None = None
        self.group = -1
        self.schedule: tuple[int, ...] = ()
        self.counter: list[int] | None = None
        #: An out-of-zone CNAME target to resolve upstream.
        self.chase: Name | None = None
        #: What of the snapshot the answer read (store/snapshot.py `Dependency`).
        self.depends: set[Dependency] = set()
        #: The bytes a reply has for records: a section stops once the least its records
        #: take passes it (`resolve`).
        self.room = room

    def soa(self) -> RR:
        """The zone's SOA, as asked."""
        return zone_soa(self.zone, self.snap.serial, self.ttl)

    def dispatch(self, name: Name, lower: Name, qtype: int) -> tuple[list[RR], list[RR]]:
        """The qtype switch of handler.go; raises NotFound/InvalidName for NXDOMAIN."""
        self.qtype = qtype
        if qtype in (A, AAAA):
            return self.address(name, lower, qtype, []), []
        if qtype == TXT:
            return self.txt(name, lower), []
        if qtype == CNAME:
            entries = self.services(lower, qtype)
            return [RR(name, CNAME, self.ttl, _labels(e.host)) for e in entries if not e.is_ip], []
        if qtype == PTR:
            return self.ptr(name, lower), []
        if qtype == SRV:
            return self.srv(name, lower)
        if qtype == SOA:
            return ([self.soa()] if lower == self.zone_lower else []), []
        # The apex test compares the lower-cased name with the zone as asked (a CoreDNS quirk:
        # a mixed-case apex NS query falls through to NODATA).
        if qtype == NS and lower == self.zone:
            return self.ns(name)
        # Anything else: a fake A lookup tells NXDOMAIN from NODATA; no records either way.
        self.address(name, lower, A, [])
        return [], []

    # kubernetes.go

    def services(self, lower: Name, qtype: int) -> list[_Entry]:
        """kubernetes.go Services: the entries a name holds, for the A/AAAA/SRV/... paths."""
        if lower[:2] == ("ns", "dns") and lower[2:] == self.zone:
            return [e for e in self.ns_entries() if _ip_family(e.host) == qtype]
        entries = self.records(lower)
        if qtype == SRV:
            entries = [e for e in entries if e.is_ip]  # no SRV for ExternalName
        return entries

    def records(self, lower: Name, filtered: bool = True) -> list[_Entry]:
        """kubernetes.go Records: parse, then find pods or services. `filtered`: a headless
        service's entries are those its topology policy picks for the client."""
        request = parse_request(lower[: len(lower) - len(self.zone)], self.cfg.zonal)
        if not request.kind:
            return []
        if is_reverse(lower):
            raise NotFound
        if not self.exposed(request.namespace):
            raise NotFound
        if request.kind == POD:
            return self.find_pods(request)
        return self.find_services(request, filtered)

    def exposed(self, namespace: str) -> bool:
        """A namespace is served if it exists and, with `namespaces` set, is listed."""
        listed = self.cfg.namespaces
        self.depends.add(("ns", namespace))
        return namespace in self.snap.namespaces and (not listed or namespace in listed)

    def find_pods(self, request: Request) -> list[_Entry]:
        mode = self.cfg.pods
        if mode == "disabled":
            raise NotFound
        if not request.service:
            return []
        address = _pod_address(request.service)
        try:
            ip = canonical_ip(address)
        except ValueError:
            raise NotFound from None
        if mode == "verified":
            self.depends.add(("loc", ip))
            if not self.snap.holds_pod(request.namespace, ip):
                raise NotFound
        key = (request.service, request.namespace, POD) + self.zone
        return [_Entry(ip, _PORT_ZERO, key)]

    def find_services(self, request: Request, filtered: bool = True) -> list[_Entry]:
        if not request.service:
            return []
        self.depends.add(("svc", request.namespace, request.service))
        svc = self.snap.services.get((request.namespace, request.service))
        if svc is None:
            raise NotFound
        if self.cfg.ignore_empty_service and svc.kind == CLUSTER_IP:
            if not any(ep.addresses for eps in self.slices(svc) for ep in eps.endpoints):
                raise NotFound  # no ready endpoint address: let the search path go on
        if request.topology_zone and svc.kind != HEADLESS:
            raise NotFound  # zone-scoped names are defined for headless services only
        base = (svc.name, svc.namespace, SVC) + self.zone
        if svc.kind == EXTERNAL_NAME:
            if request.endpoint or request.port or request.protocol:
                raise NotFound
            if _family(svc.external_name) is not None:
                raise NotFound  # an IP in externalName is ignored
            return [_Entry(svc.external_name, _PORT_ZERO, base, is_ip=False)]
        entries: list[_Entry] = []
        if svc.kind == HEADLESS or request.endpoint:
            if request.topology_zone:
                return self.zonal(svc, request, base)
            entries = self.endpoints(svc, request, base)
            if not entries:
                raise NotFound
            if svc.kind == HEADLESS and not request.endpoint and filtered:
                return self.filter(svc, entries)
            return entries
        matched = False
        for port in svc.ports:
            if _match_port(request, port):
                matched = True
                numbers = (port.port,)
                entries.extend(_Entry(ip, numbers, base) for ip in svc.cluster_ips)
        if not matched:
            raise NotFound
        return entries

    def slices(self, svc: Service) -> tuple[EndpointSlice, ...]:
        """The service's EndpointSlices; none with `noendpoints`, which watches none."""
        if self.cfg.noendpoints:
            return ()
        return self.snap.slices.get((svc.namespace, svc.name), ())

    def endpoints(
        self, svc: Service, request: Request, base: Name, topology_zone: str | None = None
    ) -> list[_Entry]:
        """One entry per (ready address, matching port); `topology_zone`, when given, keeps
        the endpoints in that zone only."""
        entries: list[_Entry] = []
        pod_names = self.cfg.endpoint_pod_names
        for eps in self.slices(svc):
            numbers = tuple(port.port for port in eps.ports if _match_port(request, port))
            if not numbers:
                continue
            for ep in eps.endpoints:
                if topology_zone is not None and ep.zone.lower() != topology_zone:
                    continue
                for address in ep.addresses:
                    hostname = endpoint_hostname(ep, address, pod_names)
                    if request.endpoint and request.endpoint != hostname.lower():
                        continue
                    entries.append(_Entry(address, numbers, (hostname,) + base, endpoint=ep))
        return entries

    def zonal(self, svc: Service, request: Request, base: Name) -> list[_Entry]:
        """A zone-scoped name: the endpoints in the zone it names (none is NODATA: the name
        exists), or with `prefer` every endpoint when the zone has none. The client chose the
        zone in the name, so no topology policy applies."""
        entries = self.endpoints(svc, request, base, request.topology_zone)
        if not entries and request.prefer:
            entries = self.endpoints(svc, request, base)
        return entries

    def filter(self, svc: Service, entries: list[_Entry]) -> list[_Entry]:
        """Keep the entries of the endpoints the service's topology policy picks for the client.

        Only the headless service name is filtered; endpoint names, PTR and ClusterIP services
        answer the same for everyone.
        """
        policy = self.snap.policies.get((svc.namespace, svc.name))
        if policy is None:
            return entries
        snap = self.snap
        candidates = tuple(
            (ep, endpoint_labels(ep, snap.locators, snap.node_locators))
            for eps in self.slices(svc)
            for ep in eps.endpoints
        )
        for ep, _ in candidates:  # where each endpoint runs is read from the locators
            self.depends.update(("loc", canonical_ip(address)) for address in ep.addresses)
            if ep.node_name:
                self.depends.add(("node", ep.node_name))
        selection = select(policy, self.client, candidates)
        if self.trace is not None:
            self.trace.append(Decision(svc, policy, self.client, candidates, selection))
        if not policy.active:
            return entries
        self.policy = policy
        self.tier = selection.tier
        self.soft = "spill-over" if selection.spilled else ""
        if selection.srv and self.qtype == SRV:
            if policy.weights:
                self.soft = "weighted"
            groups = self.srv_groups = {
                id(candidates[i][0]): (priority, group, share)
                for i, priority, group, share in selection.srv
            }
            return [entry for entry in entries if id(entry.endpoint) in groups]
        held = selection.chosen
        if selection.rotation and self.qtype in (A, AAAA):
            group = self.rotate(svc, policy, selection)
            held = selection.rotation[group][1]
            self.tier = selection.taken[group]
            self.soft = "weighted"
        chosen = {id(candidates[i][0]) for i in held}
        return [entry for entry in entries if id(entry.endpoint) in chosen]

    def rotate(self, svc: Service, policy: Policy, selection: Selection) -> int:
        """Which of `selection.rotation`'s tiers answers this A or AAAA query: the group asked
        for, else its rotation's next turn (docs/topology.md, "Soft topology")."""
        schedule = schedule_of(tuple(share for share, _ in selection.rotation))
        counter = None
        if self.turns is not None:
            key = (svc.namespace, svc.name, self.qtype, policy.signature(self.client))
            counter = self.turns.counter(key)
        self.schedule, self.counter = schedule, counter
        if 0 <= self.group < len(selection.rotation):
            return self.group
        return schedule[take_turn(counter, len(schedule)) if counter is not None else 0]

    def ns_entries(self) -> list[_Entry]:
        """ns.go nsAddrs: this server's own Service if it finds its endpoint, else ns.dns.<zone>."""
        entries: list[_Entry] = []
        pod_names = self.cfg.endpoint_pod_names
        done: set[int] = set()
        for own in () if self.cfg.noendpoints else self.cfg.ns_addresses:
            self.depends.add(("ip", canonical_ip(own)))
            for eps, _ep, _address in self.snap.endpoints_at(canonical_ip(own)):
                self.depends.add(("svc", eps.namespace, eps.service))
                svc = self.snap.services.get((eps.namespace, eps.service))
                if svc is None or id(eps) in done:
                    # A slice met again (it holds an own address twice) would only repeat its
                    # entries, which the answer drops: once per slice, not once per address.
                    continue
                done.add(id(eps))
                base = (svc.name, svc.namespace, SVC) + self.zone
                if svc.kind == HEADLESS:
                    for ep in eps.endpoints:
                        for address in ep.addresses:
                            hostname = endpoint_hostname(ep, address, pod_names)
                            entries.append(_Entry(address, _PORT_ZERO, (hostname,) + base))
                else:
                    entries.extend(_Entry(ip, _PORT_ZERO, base) for ip in svc.cluster_ips)
        if not entries:
            key = ("ns", "dns") + self.zone
            entries = [_Entry(ip, _PORT_ZERO, key) for ip in self.cfg.ns_addresses]
        return entries

    # backend_lookup.go

    def address(self, name: Name, lower: Name, qtype: int, previous: list[RR]) -> list[RR]:
        """A and AAAA records, following ExternalName CNAMEs that stay inside the zone."""
        records: list[RR] = []
        seen: set[str] = set()
        least = _RR_LEAST + (4 if qtype == A else 16)
        for entry in self.services(lower, qtype):
            if entry.is_ip:
                if _ip_family(entry.host) == qtype and entry.host not in seen:
                    seen.add(entry.host)
                    records.append(RR(name, qtype, self.ttl, entry.host))
                    self.room -= least
                    if self.room < 0:
                        break  # no reply can hold more of them
                continue
            target = _labels(entry.host)
            target_lower = tuple(label.lower() for label in target)
            if target_lower[len(target_lower) - len(lower) :] == lower:
                continue  # the target is at or below the name: a loop
            cname = RR(name, CNAME, self.ttl, target)
            if len(previous) > MAX_CNAME_CHAIN or any(r.rdata == target for r in previous):
                continue
            if target_lower[len(target_lower) - len(self.zone) :] != self.zone_lower:
                # Out of zone: the server asks its upstream (Answer.chase); without one, the
                # CNAME stands alone.
                records.append(cname)
                self.chase = target
                continue
            try:
                chased = self.address(target, target_lower, qtype, previous + [cname])
            except (NotFound, InvalidName):
                continue
            if chased:
                records.append(cname)
                records.extend(chased)
        return records

    def txt(self, name: Name, lower: Name) -> list[RR]:
        """dns-version is the only TXT; other existing names are NODATA, the rest NXDOMAIN."""
        if lower[: len(lower) - len(self.zone)] == ("dns-version",):
            return [RR(name, TXT, DNS_VERSION_TTL, (DNS_SCHEMA_VERSION,))]
        try:
            # Whether the name exists does not depend on who asks: look before filtering.
            exists = bool(self.records(lower, filtered=False)) or self.zonal_name(lower)
        except (NotFound, InvalidName):
            exists = False
        if not exists:
            raise NotFound
        return []

    def zonal_name(self, lower: Name) -> bool:
        """A zone-scoped name of a headless service exists even when its zone holds no
        endpoint: TXT there is NODATA, as for every other type (kubernetes.go Services)."""
        base = lower[: len(lower) - len(self.zone)]
        return self.cfg.zonal and bool(parse_request(base, zonal=True).topology_zone)

    def srv(self, name: Name, lower: Name) -> tuple[list[RR], list[RR]]:
        """SRV records with CoreDNS's weights, and the targets' addresses as additional records.

        Records stop where no reply could hold more (`room`): the answer's records once those
        built pass it (the rest would be cut, and the additional records with them), the
        additional ones once the two sections' records pass it."""
        entries = self.services(lower, SRV)
        # The weight counts every entry, duplicates and sentinel ports included (backend_lookup.go).
        count = 0
        for entry in entries:
            count += len(entry.ports)
        weight = max(1, int(100.0 / (100.0 * count) * 100.0)) if count else 0
        groups = self.srv_groups
        # Soft topology: each group's weight is shared as CoreDNS shares 100 among a name's
        # entries (floor(100/N) for a group of N entries, priority by tier).
        counts: dict[int, int] = {}
        for entry in entries if groups else ():
            group = groups[id(entry.endpoint)][1]
            counts[group] = counts.get(group, 0) + len(entry.ports)
        records: list[RR] = []
        extra: list[RR] = []
        targets: set[tuple[Name, int]] = set()
        glued: set[tuple[Name, str]] = set()
        room = self.room
        used = 0  # the least the answer's records take
        glue = 0  # and the additional ones
        for entry in entries:
            key = entry.key
            least = 0
            priority = 0
            if groups:
                priority, group, share = groups[id(entry.endpoint)]
                n = counts[group]
                if share == 100:  # CoreDNS's own arithmetic, float rounding and all
                    weight = max(1, int(100.0 / (100.0 * n) * 100.0))
                else:  # exact: in floats 57/100*100 is 56.99999999999999
                    weight = max(1, share // n) if share else 0
            for port in entry.ports:
                if port == -1:
                    continue
                if (key, port) not in targets:
                    targets.add((key, port))
                    records.append(RR(name, SRV, self.ttl, Srv(priority, weight, port, key)))
                    # SRV rdata: priority, weight, port and the target, never compressed.
                    least = least or _RR_LEAST + 6 + _name_length(key)
                    used += least
                    if used > room:
                        return records, extra
                if (key, entry.host) not in glued and used + glue <= room:
                    glued.add((key, entry.host))
                    family = _ip_family(entry.host)
                    extra.append(RR(key, family, self.ttl, entry.host))
                    glue += _RR_LEAST + (4 if family == A else 16)
        return records, extra

    def ptr(self, name: Name, lower: Name) -> list[RR]:
        """Reverse lookups: the first Service holding the IP, else every endpoint holding it."""
        ip = reverse_address(lower)
        if ip is None:
            self.records(lower)  # may raise NotFound: NXDOMAIN; otherwise NODATA
            return []
        primary = self.cfg.primary_zone
        listed = self.cfg.namespaces
        self.depends.add(("ip", ip))
        services = [
            svc
            for svc in self.snap.service_ips.get(ip, ())
            if not listed or svc.namespace in listed
        ]
        targets: dict[Name, None] = {}
        if services:
            targets[(services[0].name, services[0].namespace, SVC) + primary] = None
        elif not self.cfg.noendpoints:
            pod_names = self.cfg.endpoint_pod_names
            # Each distinct target takes a record (its name compressed to a pointer at least).
            most = self.room // (_RR_LEAST + 2) + 1
            for eps, ep, address in self.snap.endpoints_at(ip):
                if listed and eps.namespace not in listed:
                    continue
                hostname = endpoint_hostname(ep, address, pod_names)
                targets[(hostname, eps.service, eps.namespace, SVC) + primary] = None
                if len(targets) >= most:
                    break  # no reply can hold more of them
        if not targets:
            raise NotFound
        return [RR(name, PTR, self.ttl, target) for target in targets]

    def ns(self, name: Name) -> tuple[list[RR], list[RR]]:
        """Apex NS: one NS per distinct target, with every address as glue (each once); as many
        as a reply can hold (`srv`)."""
        records: list[RR] = []
        extra: list[RR] = []
        targets: set[Name] = set()
        glued: set[tuple[Name, str]] = set()
        used = glue = 0
        for entry in self.ns_entries():
            if (entry.key, entry.host) not in glued and used + glue <= self.room:
                glued.add((entry.key, entry.host))
                family = _ip_family(entry.host)
                extra.append(RR(entry.key, family, self.ttl, entry.host))
                glue += _RR_LEAST + (4 if family == A else 16)
            if entry.key not in targets:
                targets.add(entry.key)
                records.append(RR(name, NS, self.ttl, entry.key))
                used += _RR_LEAST + 2  # the target compressed to a pointer at least
                if used > self.room:
                    break
        return records, extra


def _name_length(name: Name) -> int:
    """The bytes of a name on the wire, uncompressed: a length byte per label, the root's."""
    length = len(name) + 1
    for label in name:
        length += len(label)
    return length


def _labels(host: str) -> Name:
    """A host name as labels; a trailing dot is optional (CoreDNS makes it fully qualified)."""
    return tuple(host.rstrip(".").split(".")) if host.strip(".") else ()
