"""Nodes' pod ranges: canonical prefixes, longest-prefix placement, and ranges learned from pods.

A node locator carries its node's pod ranges (`cidrs`), and the DNS server places an address by
an exact `addresses` match first, else by the longest prefix that contains it (two locators with
that same prefix place nobody). The controller asks the same question of the node locators it
wants (`PrefixIndex`), to know which pods they already place and which need a locator of their
own.

For CNIs that leave `Node.spec.podCIDRs` empty (Calico's IPAM blocks, the AWS VPC CNI's prefix
delegation), `learn` derives each node's ranges from where its pods' addresses are: aligned
prefixes from /24 to /26 (IPv4) or /64 to /120 (IPv6), chosen so that as few pods as possible
fall inside another node's prefix (those get an exact locator, which wins).
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

#: (IP version, prefix length, network as an integer).
Prefix = tuple[int, int, int]
#: (IP version, address as an integer).
Point = tuple[int, int]

BITS = {4: 32, 6: 128}
#: The CRD's bound: at least /8 for IPv4 and /32 for IPv6.
MIN_LENGTH = {4: 8, 6: 32}
#: What `learn` may choose: the shortest and the longest prefix, by IP version. A learning
#: group is one shortest prefix; groups are learnt independently of each other.
LEARN_LENGTHS = {4: (24, 26), 6: (64, 120)}
#: The CRD's bound on `cidrs`.
MAX_CIDRS = 64

_LINK_LOCAL_V4 = ipaddress.ip_network("169.254.0.0/16")


def usable_cidr(text: Any) -> str | None:
    """A prefix in canonical network form if a locator may carry it, else None.

    Host bits are cleared (`10.244.3.7/24` is `10.244.3.0/24`, as Kubernetes reads a podCIDR);
    the CRD's refusals apply: shorter than /8 (IPv4) or /32 (IPv6), loopback, link-local,
    multicast or unspecified ranges."""
    if not isinstance(text, str) or "/" not in text:
        return None
    try:
        net = ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        return None
    first = net.network_address
    if net.prefixlen < MIN_LENGTH[net.version]:
        return None
    if first.is_loopback or first.is_link_local or first.is_multicast or first.is_unspecified:
        return None
    if net.version == 4 and (int(first) == 0xFFFFFFFF or net.overlaps(_LINK_LOCAL_V4)):
        return None
    return str(net)


def prefix_of(text: str) -> Prefix:
    """The prefix of a canonical CIDR text."""
    net = ipaddress.ip_network(text)
    return net.version, net.prefixlen, int(net.network_address)


def text_of(prefix: Prefix) -> str:
    """The canonical text of a prefix."""
    version, length, value = prefix
    address = ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)
    return f"{address}/{length}"


def point_of(text: str) -> Point:
    """The version and integer of an address text."""
    address = ipaddress.ip_address(text)
    return address.version, int(address)


def contains(prefix: Prefix, point: Point) -> bool:
    """True if the address lies inside the prefix."""
    version, length, value = prefix
    shift = BITS[version] - length
    return point[0] == version and point[1] >> shift == value >> shift


def group_of(point: Point) -> Prefix:
    """The learning group of an address: its enclosing shortest learnable prefix."""
    version, value = point
    length = LEARN_LENGTHS[version][0]
    shift = BITS[version] - length
    return version, length, value >> shift << shift


def groups_within(prefix: Prefix, groups: Iterable[Prefix]) -> list[Prefix]:
    """Which of `groups` overlap `prefix` (the group holding it, or the groups inside it)."""
    version, length, _ = prefix
    top = LEARN_LENGTHS[version][0]
    if length >= top:
        return [group_of((version, prefix[2]))]
    return [g for g in groups if g[0] == version and contains(prefix, (version, g[2]))]


class PrefixIndex:
    """Which owners (node names) hold each prefix, answering longest-prefix questions."""

    def __init__(self) -> None:
        self._owners: dict[Prefix, set[str]] = {}
        #: Prefix lengths in use, per IP version, with how many prefixes have each.
        self._lengths: dict[int, Counter[int]] = {4: Counter(), 6: Counter()}
        self._order: dict[int, list[int]] = {4: [], 6: []}

    def add(self, prefix: Prefix, owner: str) -> None:
        """`owner` holds `prefix` too."""
        owners = self._owners.setdefault(prefix, set())
        if not owners:
            self._count(prefix, 1)
        owners.add(owner)

    def remove(self, prefix: Prefix, owner: str) -> None:
        """`owner` no longer holds `prefix`."""
        owners = self._owners.get(prefix)
        if owners is None or owner not in owners:
            return
        owners.discard(owner)
        if not owners:
            del self._owners[prefix]
            self._count(prefix, -1)

    def owners(self, point: Point) -> frozenset[str]:
        """The owners of the longest prefix holding the address (none: no prefix holds it;
        two or more: that prefix is claimed twice, and places nobody)."""
        version, value = point
        bits = BITS[version]
        for length in self._order[version]:
            shift = bits - length
            found = self._owners.get((version, length, value >> shift << shift))
            if found:
                return frozenset(found)
        return frozenset()

    def _count(self, prefix: Prefix, delta: int) -> None:
        version, length, _ = prefix
        lengths = self._lengths[version]
        lengths[length] += delta
        if lengths[length] <= 0:
            del lengths[length]
        self._order[version] = sorted(lengths, reverse=True)


Assignment = dict[Prefix, str]


def learn(
    group: Prefix,
    points: Sequence[tuple[int, str]],
    eligible: Callable[[str], bool],
    previous: Mapping[Prefix, str],
) -> Assignment:
    """The prefixes inside `group` to give to nodes, learnt from the pods' addresses there.

    `points` are (address as an integer, node name) sorted by address: every pod address in
    the group, whatever its node. A prefix goes to the node with the most pods in it (among the
    `eligible` nodes); the choice minimises the pods that fall inside another node's prefix, or
    in none (each costs an exact locator). Ties keep what is already in `previous` (the
    assignment last written, which makes a restart write nothing), then prefer the shorter
    prefix, then the node whose name sorts first: the result is a function of the pods and of
    `previous` alone. A prefix with no pods keeps a previous owner, as an IPAM block keeps its
    node while it is empty, so that pods coming and going in a rollout rewrite nothing."""
    version, top, _ = group
    bits = BITS[version]
    deepest = LEARN_LENGTHS[version][1]
    prior = {p: n for p, n in previous.items() if eligible(n) and contains(group, (p[0], p[2]))}
    values = [value for value, _ in points]
    Option = tuple[int, list[tuple[Prefix, str]]]

    def kept_in(prefix: Prefix) -> list[tuple[Prefix, str]]:
        return [
            (p, n)
            for p, n in prior.items()
            if p[1] >= prefix[1] and contains(prefix, (version, p[2]))
        ]

    def best(options: list[Option]) -> Option:
        # Fewest exceptions; then most of the previous assignment kept; then fewest prefixes
        # (the first option listed, the whole prefix, wins what is left).
        return min(
            options, key=lambda o: (o[0], -sum(prior.get(p) == n for p, n in o[1]), len(o[1]))
        )

    def solve(lo: int, hi: int, length: int, net: int) -> Option:
        """(exceptions, assignments) of the prefix net/length, holding points[lo:hi]."""
        here: Prefix = (version, length, net)
        if lo == hi:
            return 0, kept_in(here)
        counts = Counter(node for _, node in points[lo:hi])
        learning = {n: c for n, c in counts.items() if eligible(n)}
        if not learning:
            return 0, []  # only pods that ranges of their own nodes place
        most = max(learning.values())
        tied = sorted(n for n, c in learning.items() if c == most)
        owner = prior.get(here)
        options: list[Option] = [(hi - lo - most, [(here, owner if owner in tied else tied[0])])]
        if length >= deepest:
            # Or left out: its learning nodes' pods then need exact locators.
            options.append((sum(learning.values()), []))
            return best(options)
        # Skip the levels where every point lies in one half and no previous prefix lies
        # within: such a prefix and its occupied half hold the same pods.
        first, last = values[lo], values[hi - 1]
        common = min(bits - (first ^ last).bit_length(), deepest)
        if common > length + 1 and not kept_in(here):
            shift = bits - common
            options.append(solve(lo, hi, common, first >> shift << shift))
        else:
            half = 1 << (bits - length - 1)
            mid = bisect_left(values, net | half, lo, hi)
            left = solve(lo, mid, length + 1, net)
            right = solve(mid, hi, length + 1, net | half)
            options.append((left[0] + right[0], left[1] + right[1]))
        return best(options)

    return dict(solve(0, len(points), top, group[2])[1])
