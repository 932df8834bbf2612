"""The cluster DNS name grammar (CoreDNS `plugin/kubernetes/parse.go`).

A name under a zone is read right to left: `svc` or `pod`, then the namespace, then the
service (or the dashed pod IP). What is left decides the form:

    nothing          <svc>.<ns>.svc.<zone>
    one label        <endpoint>.<svc>.<ns>.svc.<zone>
    two labels       _<port>._<proto>.<svc>.<ns>.svc.<zone>  (a leading "_" is optional)
    three or more    invalid: NXDOMAIN, except with the `zonal` option:
                     <topology zone>.pin|prefer._zone.<svc>.<ns>.svc.<zone>

For pods the same shapes parse, and one or two labels left of the dashed IP are ignored. A
topology zone may hold dots (`corp.example.com.pin._zone…`): it is every label left of the
directive, joined.
"""

from __future__ import annotations

from typing import NamedTuple

SVC = "svc"
POD = "pod"
#: The label that anchors a zone-scoped name, three labels left of the service.
ZONE_ANCHOR = "_zone"
#: Zone-scoped directives: `pin` answers the zone's endpoints only (NODATA when it has none),
#: `prefer` falls back to every endpoint of the service when the zone has none.
PIN = "pin"
PREFER = "prefer"


class InvalidName(ValueError):
    """The name cannot exist in a cluster zone (answered NXDOMAIN)."""


class Request(NamedTuple):
    """A parsed cluster name; every field lower-cased, "" when absent."""

    kind: str = ""  # "svc", "pod", or "" for the apex and other empty bases
    namespace: str = ""
    service: str = ""
    endpoint: str = ""
    port: str = ""
    protocol: str = ""
    #: A zone-scoped name's topology zone (only with `zonal`), and whether it says `prefer`.
    topology_zone: str = ""
    prefer: bool = False


def parse_request(base: tuple[str, ...], zonal: bool = False) -> Request:
    """Parse the labels left of the zone (lower-cased) into a Request.

    An empty base, or one that is just `svc` or `pod`, is a name that exists with no records.
    `zonal` reads the zone-scoped names of CoreDNS's `zonal` option.
    """
    if not base or base == (SVC,) or base == (POD,):
        return Request()
    kind = base[-1]
    if kind not in (SVC, POD):
        raise InvalidName(f"{kind!r} is neither svc nor pod")
    rest = base[:-1]
    namespace = rest[-1]
    service = rest[-2] if len(rest) >= 2 else ""
    extra = rest[:-2]
    if len(extra) > 2:
        if not zonal or kind != SVC or extra[-1] != ZONE_ANCHOR or extra[-2] not in (PIN, PREFER):
            raise InvalidName("too many labels before the service name")
        zone = ".".join(extra[:-2])
        return Request(kind, namespace, service, topology_zone=zone, prefer=extra[-2] == PREFER)
    if kind == POD or not extra:
        return Request(kind, namespace, service)
    if len(extra) == 1:
        return Request(kind, namespace, service, endpoint=extra[0])
    return Request(kind, namespace, service, port=_strip(extra[0]), protocol=_strip(extra[1]))


def _strip(label: str) -> str:
    return label[1:] if label.startswith("_") else label
