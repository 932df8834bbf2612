"""Place a querying client: which address identifies it, and the node labels it gets.

The same rules as resolve/client.py (`client_address`, `identify`), without parsing addresses
per query: the kernel already writes source addresses canonically, Client Subnet addresses are
made canonical when read (wire/edns.py), and whether a source is a trusted ECS forwarder is
decided once per source address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from toposdns.resolve.client import NO_LABELS, Network, plain_address
from toposdns.store.model import PodLocator
from toposdns.store.topology import Labels

#: Source addresses remembered before the memo is emptied (clients of one DNS pod are bounded
#: by the cluster's pods, but a spoofed flood must not grow it without end).
REMEMBERED_SOURCES = 65_536


class Placer:
    """Places clients by source address, or by Client Subnet from trusted forwarders."""

    def __init__(self, trust: tuple[Network, ...] = ()) -> None:
        self.trust = trust
        #: Source address -> (the address locators index it under, may its ECS be believed).
        self.sources: dict[str, tuple[str, bool]] = {}

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
            known = (str(ip), any(ip in network for network in self.trust))
        self.sources[source] = known
        return known
