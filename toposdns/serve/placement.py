"""Place a querying client: which address identifies it, and the node labels it gets.

This is the one place that decides which address identifies a client (its source, or the
Client Subnet address when the source is a trusted forwarder); where that address or prefix is
placed is the store's rule (`place`). Both are remembered so that a query costs two dictionary
lookups once its source has been seen: the kernel already writes source addresses canonically,
Client Subnet addresses are made canonical when read (wire/edns.py), whether a source is a
trusted ECS forwarder is decided once per source address, and where an address or prefix is
placed is decided once per snapshot change that could move it (`update`).
"""

from __future__ import annotations

import ipaddress
import logging

from toposdns.metrics import UNPLACED_SUBNETS
from toposdns.resolve.client import (
    NO_LABELS,
    Trust,
    TrustedService,
    endpoint_addresses,
    plain_address,
)
from toposdns.store.model import PodLocator
from toposdns.store.placement import BITS, Placement
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels

log = logging.getLogger("toposdns")

#: Source addresses (and places) remembered before the memo is emptied (clients of one DNS pod
#: are bounded by the cluster's pods, but a spoofed flood must not grow it without end).
REMEMBERED_SOURCES = 65_536

#: What a client is placed by: its address, or a Client Subnet prefix shorter than a host.
Where = str | tuple[str, int]


class Placer:
    """Places clients by source address, or by Client Subnet from trusted forwarders."""

    def __init__(self, trust: tuple[Trust, ...] = (), snapshot: Snapshot | None = None) -> None:
        self.trust = tuple(t for t in trust if not isinstance(t, TrustedService))
        self.services = tuple(t for t in trust if isinstance(t, TrustedService))
        #: The trusted Services' endpoint addresses in the snapshot served (see `follow`).
        self.trusted: frozenset[str] = frozenset()
        self.snapshot = Snapshot()
        #: Source address -> (the address locators index it under, may its ECS be believed).
        self.sources: dict[str, tuple[str, bool]] = {}
        #: Address, or (address, prefix length) of a short Client Subnet -> its placement.
        self.placed: dict[Where, Placement] = {}
        #: (forwarder, prefix length) already reported for sending a prefix nobody holds whole.
        self.reported: set[tuple[str, int]] = set()
        if snapshot is not None:
            self.update(snapshot)

    def update(self, snapshot: Snapshot) -> None:
        """Place from a new snapshot, forgetting the placements it may have moved."""
        previous, self.snapshot = self.snapshot, snapshot
        self.follow(snapshot)
        changed = snapshot.changed_since(previous)
        if changed is None:
            self.placed.clear()
            return
        for change in changed:
            if change[0] == "loc":
                self.placed.pop(change[1], None)
            elif change[0] == "cidr":
                # A prefix moves every place inside it; such changes come with nodes, rarely.
                self.placed.clear()
                return

    def follow(self, snapshot: Snapshot) -> None:
        """Trust the trusted Services' endpoints as this snapshot has them: a forwarder pod
        that goes away is trusted no longer, and a new one from its first query."""
        if not self.services:
            return
        trusted = frozenset().union(*(endpoint_addresses(snapshot, s) for s in self.services))
        if trusted != self.trusted:
            self.trusted = trusted
            self.sources.clear()

    def place(self, source: str, subnet: tuple[str, int] | None) -> tuple[Labels, bool]:
        """The client's labels (empty when no locator places it), and whether its address
        came from the Client Subnet `subnet` (address, source prefix length)."""
        locator, via_ecs = self.locate(source, subnet)
        return (NO_LABELS if locator is None else locator.labels), via_ecs

    def locate(self, source: str, subnet: tuple[str, int] | None) -> tuple[PodLocator | None, bool]:
        """`place` for callers that need the locator itself (--autopath: its namespace)."""
        where, via_ecs = self.where(source, subnet)
        placement = self.placed.get(where)
        if placement is None:
            placement = self.learn_place(where, source)
        elif placement.locator is None and type(where) is tuple and not placement.conflict:
            # Placements are remembered per prefix, reports per forwarder: another forwarder
            # sending a prefix already seen is reported too (a set lookup, for these only).
            self.report(source, where[1])
        return placement.locator, via_ecs

    def where(self, source: str, subnet: tuple[str, int] | None) -> tuple[Where, bool]:
        """What places the client, and whether it is a Client Subnet."""
        known = self.sources.get(source)
        if known is None:
            known = self.learn(source)
        address, trusted = known
        if not trusted or subnet is None:
            return address, False
        address, length = subnet
        # A host-long prefix is the address itself, and shares its placement.
        return (address if length >= BITS[6 if ":" in address else 4] else subnet), True

    def learn_place(self, where: Where, source: str) -> Placement:
        """Work out and remember where an address or prefix is placed."""
        if len(self.placed) >= REMEMBERED_SOURCES:
            self.placed.clear()
        if isinstance(where, str):
            placement = self.snapshot.place(where)
        else:
            placement = self.snapshot.place(*where)
            if placement.locator is None and not placement.conflict:
                self.report(source, where[1])
        self.placed[where] = placement
        return placement

    def report(self, forwarder: str, length: int) -> None:
        """Log and count, once per forwarder and prefix length, a Client Subnet that no
        locator's CIDR holds whole."""
        if (forwarder, length) in self.reported or len(self.reported) >= REMEMBERED_SOURCES:
            return
        self.reported.add((forwarder, length))
        UNPLACED_SUBNETS.inc()
        log.warning(
            "forwarder %s sends /%d Client Subnets that no PodLocator CIDR holds whole: its "
            "clients are unplaced; have it send /32 and /128 (CoreDNS: rewrite edns0 subnet "
            "set 32 128), or give the locators the node CIDRs that hold those prefixes",
            forwarder,
            length,
        )

    def learn(self, source: str) -> tuple[str, bool]:
        """Work out and remember what a source address is."""
        if len(self.sources) >= REMEMBERED_SOURCES:
            self.sources.clear()
        plain = plain_address(source)
        try:
            ip = ipaddress.ip_address(plain)
        except ValueError:
            known = (plain, False)
        else:
            canonical = str(ip)
            trusted = canonical in self.trusted or any(ip in network for network in self.trust)
            known = (canonical, trusted)
        self.sources[source] = known
        return known
