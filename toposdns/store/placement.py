"""Which PodLocator places an address, or a Client Subnet prefix: the one rule every path that
places a client uses (the server, explain, the tests' reference).

0. Only the locators of the believed namespaces count (`believed`: the controller's, by
   default; the store never indexes the others).
1. A locator holding the address exactly (`addresses`; a pod's over a node's).
2. Otherwise the locator with the longest prefix (`cidrs`) containing it.
3. Two locators claiming that same longest prefix: nobody inside it is placed.

A prefix shorter than a host (a Client Subnet of /24, say) is placed by the longest locator
prefix that holds all of it; exact addresses inside it do not count, since they name single
hosts. The prefixes are indexed per family and length (`Prefixes`), so a lookup costs one hash
lookup per distinct length in use (one or two in a cluster whose nodes share a mask size).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import NamedTuple, TypeAlias

from immutables import Map

from toposdns.store.model import PodLocator


class Placement(NamedTuple):
    """Where an address or prefix is placed, and why."""

    locator: PodLocator | None
    #: What placed it: the address itself, or the locator's CIDR (also the CIDR in conflict);
    #: "" when nothing did.
    via: str = ""
    #: The locators claiming the longest prefix that holds it, when they are several.
    conflict: tuple[PodLocator, ...] = ()


UNPLACED = Placement(None)

#: (IP version, prefix length) -> network address as an integer -> the placement it gives (its
#: locator, or its claimants in conflict): one object shared by every address placed there.
PrefixMap: TypeAlias = Map[tuple[int, int], Map[int, Placement]]
#: Bits per IP version.
BITS = {4: 32, 6: 128}


class Prefixes(NamedTuple):
    """The locators' CIDRs, as the snapshot holds them (immutable, shared between snapshots)."""

    by_length: PrefixMap = Map()
    #: IP version -> the prefix lengths in use, longest first.
    lengths: Mapping[int, tuple[int, ...]] = {}


NO_PREFIXES = Prefixes()


#: The word of `--locator-namespaces` that believes the PodLocators of every namespace.
EVERY_NAMESPACE = "*"
#: Every namespace believed: the store's default, where no configuration says otherwise.
EVERYWHERE: frozenset[str] = frozenset({EVERY_NAMESPACE})


def believed(namespaces: frozenset[str], locator: PodLocator) -> bool:
    """True if `locator` may place clients and endpoints: it lives in one of `namespaces`, or
    they include every namespace ("*").

    Whoever may write a PodLocator chooses where the clients it claims run, so only the
    namespaces whose writers are trusted count: the controller's own, by default. A locator
    anywhere else is not believed at all, neither its addresses nor its CIDRs nor its node
    label: it is held only to be shown (`explain`) and reported once."""
    return locator.namespace in namespaces or EVERY_NAMESPACE in namespaces


def place(
    locators: Mapping[str, PodLocator],
    prefixes: Prefixes,
    address: str,
    length: int | None = None,
) -> Placement:
    """Place `address` (canonical text), or the prefix `address/length` when `length` is
    shorter than a host."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return UNPLACED
    host = BITS[ip.version]
    if length is None or length >= host:
        locator = locators.get(address)
        if locator is not None:
            return Placement(locator, address)
        length = host
    value = int(ip)
    for prefix in prefixes.lengths.get(ip.version, ()):
        if prefix > length:
            continue  # would hold only part of the prefix asked about
        network = value >> (host - prefix) << (host - prefix)
        placement = prefixes.by_length[ip.version, prefix].get(network)
        if placement is not None:
            return placement
    return UNPLACED


def _claimants(placement: Placement) -> tuple[PodLocator, ...]:
    """The locators claiming the prefix of a placement by prefix."""
    if placement.conflict:
        return placement.conflict
    return () if placement.locator is None else (placement.locator,)


def _claimed(cidr: str, claims: tuple[PodLocator, ...]) -> Placement:
    """The placement a prefix claimed by `claims` (one or more) gives."""
    return Placement(claims[0], cidr) if len(claims) == 1 else Placement(None, cidr, claims)


def parse_cidr(cidr: str) -> tuple[int, int, int]:
    """(IP version, prefix length, network as an integer) of a canonical CIDR."""
    network = ipaddress.ip_network(cidr)
    return network.version, network.prefixlen, int(network.network_address)


def add_prefix(prefixes: Prefixes, cidr: str, locator: PodLocator) -> Prefixes:
    """`prefixes` with `locator` claiming `cidr` too."""
    version, length, network = parse_cidr(cidr)
    table = prefixes.by_length.get((version, length), Map())
    held = table.get(network)
    claims = (() if held is None else _claimants(held)) + (locator,)
    # The order of claimants must not depend on event order: every replica sees one conflict.
    claims = tuple(sorted(claims, key=lambda claim: (claim.namespace, claim.name)))
    placement = _claimed(cidr, claims)
    by_length = prefixes.by_length.set((version, length), table.set(network, placement))
    if (version, length) in prefixes.by_length:
        return Prefixes(by_length, prefixes.lengths)
    return Prefixes(by_length, _lengths(by_length))


def remove_prefix(prefixes: Prefixes, cidr: str, locator: PodLocator) -> Prefixes:
    """`prefixes` without `locator`'s claim on `cidr`."""
    version, length, network = parse_cidr(cidr)
    table = prefixes.by_length.get((version, length))
    if table is None or network not in table:
        return prefixes
    held = table[network]
    rest = tuple(claim for claim in _claimants(held) if claim is not locator)
    table = table.set(network, _claimed(held.via, rest)) if rest else table.delete(network)
    if table:
        return Prefixes(prefixes.by_length.set((version, length), table), prefixes.lengths)
    by_length = prefixes.by_length.delete((version, length))
    return Prefixes(by_length, _lengths(by_length))


def prefix_conflicts(
    old: Prefixes, new: Prefixes, changed: Iterable[str] | None = None
) -> list[tuple[str, tuple[PodLocator, ...]]]:
    """The prefixes two or more locators claim in `new` with other claimants than in `old`:
    each conflict is reported once. `changed`: the only prefixes that may differ (default: look
    at every one)."""
    if changed is None:
        changed = (
            placement.via
            for table in new.by_length.values()
            for placement in table.values()
            if placement.conflict
        )
    found = []
    for cidr in changed:
        holders = _claims(new, cidr)
        if len(holders) > 1 and holders != _claims(old, cidr):
            found.append((cidr, holders))
    return found


def _claims(prefixes: Prefixes, cidr: str) -> tuple[PodLocator, ...]:
    version, length, network = parse_cidr(cidr)
    placement = prefixes.by_length.get((version, length), Map()).get(network)
    return () if placement is None else _claimants(placement)


def _lengths(by_length: PrefixMap) -> dict[int, tuple[int, ...]]:
    lengths: dict[int, list[int]] = {}
    for version, length in by_length:
        lengths.setdefault(version, []).append(length)
    return {version: tuple(sorted(found, reverse=True)) for version, found in lengths.items()}
