"""Place a querying client: which address identifies it, and the node labels it gets.

The same rules as resolve/client.py (`client_address`, `identify`), without parsing addresses
per query: the kernel already writes source addresses canonically, Client Subnet addresses are
made canonical when read (wire/edns.py), and whether a source is a trusted ECS forwarder is
decided once per source address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from toposdns.resolve.client import (
    NO_LABELS,
    Trust,
    TrustedService,
    endpoint_addresses,
    plain_address,
)
from toposdns.store.model import PodLocator
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels

#: Source addresses remembered before the memo is emptied (clients of one DNS pod are bounded
#: by the cluster's pods, but a spoofed flood must not grow it without end).
REMEMBERED_SOURCES = 65_536


class Placer:
    """Places clients by source address, or by Client Subnet from trusted forwarders."""

    def __init__(self, trust: tuple[Trust, ...] = ()) -> None:
        self.trust = tuple(t for t in trust if not isinstance(t, TrustedService))
        self.services = tuple(t for t in trust if isinstance(t, TrustedService))
        #: The trusted Services' endpoint addresses in the snapshot served (see `follow`).
        self.trusted: frozenset[str] = frozenset()
        #: Source address -> (the address locators index it under, may its ECS be believed).
        self.sources: dict[str, tuple[str, bool]] = {}

    def follow(self, snapshot: Snapshot) -> None:
        """Trust the trusted Services' endpoints as this snapshot has them: a forwarder pod
        that goes away is trusted no longer, and a new one from its first query."""
        if not self.services:
            return
        trusted = frozenset().union(*(endpoint_addresses(snapshot, s) for s in self.services))
        if trusted != self.trusted:
            self.trusted = trusted
            self.sources.clear()

    def place(
        self, locators: Mapping[str, PodLocator], source: str, subnet: str | None
    ) -> tuple[Labels, bool]:
        """The client's labels (empty when no locator holds its address), and whether its
        address came from the Client Subnet `subnet`."""
        known = self.sources.get(source)
        if known is None:
            known = self.learn(source)
        address, trusted = known
        via_ecs = trusted and subnet is not None
        locator = locators.get(subnet if via_ecs else address)  # type: ignore[arg-type]
        return (NO_LABELS if locator is None else locator.node_labels), via_ecs

    def locate(
        self, locators: Mapping[str, PodLocator], source: str, subnet: str | None
    ) -> tuple[PodLocator | None, bool]:
        """`place` for callers that need the locator itself (--autopath: its namespace)."""
        known = self.sources.get(source)
        if known is None:
            known = self.learn(source)
        address, trusted = known
        via_ecs = trusted and subnet is not None
        return locators.get(subnet if via_ecs else address), via_ecs  # type: ignore[arg-type]

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
