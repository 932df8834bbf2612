"""Who is asking: the client's address, and the node labels its PodLocator gives it.

The address is the EDNS Client Subnet address when the packet carries one and comes from a
trusted forwarder (`--ecs-trust` networks, or the endpoints of an `--ecs-trust-service`), else
the packet's source. The store's `place` finds the PodLocator that places it (its exact
address, else the longest CIDR holding it); an unknown address has no labels
(docs/topology.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from toposdns.store.model import PodLocator
from toposdns.store.placement import UNPLACED, Placement
from toposdns.store.snapshot import Snapshot

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
NO_LABELS: Mapping[str, str] = {}


class TrustedService(NamedTuple):
    """A Service whose endpoints are trusted ECS forwarders (`--ecs-trust-service NS/NAME`)."""

    namespace: str
    name: str


#: What `--ecs-trust` and `--ecs-trust-service` give: networks, and Services whose endpoints
#: are trusted as they come and go.
Trust = Network | TrustedService


def endpoint_addresses(snapshot: Snapshot, service: TrustedService) -> frozenset[str]:
    """The canonical addresses of a Service's ready endpoints in this snapshot."""
    found = set()
    for slice_ in snapshot.slices.get((service.namespace, service.name), ()):
        for endpoint in slice_.endpoints:
            for address in endpoint.addresses:
                try:
                    found.add(str(ipaddress.ip_address(address)))
                except ValueError:
                    continue  # an FQDN slice: not an address a query comes from
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Client:
    """A placed client. `labels` is empty when no locator places its address."""

    address: str
    labels: Mapping[str, str] = field(default_factory=dict)
    locator: PodLocator | None = None
    #: True when the address came from EDNS Client Subnet.
    via_ecs: bool = False
    #: The Client Subnet's prefix length, when shorter than a host.
    length: int | None = None
    #: What placed it (its address, or the locator's CIDR) and the locators claiming the same
    #: longest prefix when nobody is placed for that reason.
    placement: Placement = UNPLACED


def plain_address(source: str) -> str:
    """A socket address as the locators index it: no zone index, no IPv4-mapped prefix."""
    source = source.split("%", 1)[0]
    if source.startswith("::ffff:") and "." in source:
        return source[7:]
    return source


def identify(
    snapshot: Snapshot, address: str, via_ecs: bool = False, length: int | None = None
) -> Client:
    """Place an address, or the Client Subnet `address/length`, with the snapshot's
    locators."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return Client(address, via_ecs=via_ecs)
    key = str(ip)
    if length is not None and length >= ip.max_prefixlen:
        length = None
    placement = snapshot.place(key, length)
    locator = placement.locator
    labels = NO_LABELS if locator is None else locator.labels
    return Client(key, labels, locator, via_ecs, length, placement)
