"""Search path completion on the server, as CoreDNS's `autopath @kubernetes` (the pure part).

The kubelet gives a pod in namespace NS the search path `NS.svc.ZONE svc.ZONE ZONE` followed by
the node's search domains, with `ndots:5`. So a pod that looks up `api.example.com` first asks
for `api.example.com.NS.svc.ZONE`, then for each name of the path in turn, A and AAAA each time.
When a PodLocator tells the server the pod's namespace, the server can walk that path itself on
the first query and answer it with what the last one would get, behind a CNAME from the name
asked to the name found (CoreDNS plugin/autopath/autopath.go and cname.go, and the search path of
plugin/kubernetes/autopath.go AutoPath).

The walk tries `BASE.<domain>` for each domain of the path, then BASE alone (BASE is the name
asked without `NS.svc.ZONE`), and stops at the first name that is not NXDOMAIN. When every name
is NXDOMAIN, the client gets the reply to the first one and walks the path itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from toposdns.resolve.answer import RR, Answer
from toposdns.resolve.qname import SVC
from toposdns.resolve.resolver import ResolverConfig, match_zone
from toposdns.wire.codes import CNAME, NXDOMAIN, Name


def search_path(namespace: str, zone: Name, node_search: tuple[Name, ...]) -> tuple[Name, ...]:
    """A pod's search path as the kubelet writes it, then the root: the name as asked."""
    return ((namespace, SVC) + zone, (SVC,) + zone, zone, *node_search, ())


def candidates(name: Name, namespace: str, config: ResolverConfig) -> tuple[Name, ...] | None:
    """The names autopath tries, in order, for `name` asked by a pod in `namespace`; None when
    the name is not below the pod's first search domain `namespace.svc.<zone>`.

    The part of the name before that domain keeps its letter case; the domains are lower case.
    (CoreDNS answers SERVFAIL for `namespace.svc.<zone>` itself, which dnsutil.TrimZone cannot
    cut; here that name gets its plain answer.)
    """
    lower = tuple(label.lower() for label in name)
    zone_len = match_zone(lower, config.zones)
    if zone_len is None:
        return None
    first = (namespace, SVC) + lower[len(lower) - zone_len :]
    if len(lower) <= len(first) or lower[len(lower) - len(first) :] != first:
        return None
    base = name[: len(name) - len(first)]
    search = search_path(namespace, first[2:], config.autopath_search)
    return tuple(base + domain for domain in search)


def first_candidate(name: Name, config: ResolverConfig) -> Name | None:
    """The first name autopath would try for `name` for a pod in the namespace the name
    names (`X.NS.svc.<zone>`), or None when no pod's search path starts above it."""
    lower = tuple(label.lower() for label in name)
    zone_len = match_zone(lower, config.zones)
    if zone_len is None or len(lower) < zone_len + 3 or lower[-zone_len - 1] != SVC:
        return None
    found = candidates(name, lower[-zone_len - 2], config)
    return None if found is None else found[0]


def goes_on(answer: Answer) -> bool:
    """True when the walk tries the next name: the cluster does not have this one."""
    return answer.rcode == NXDOMAIN


def first_other(owners: Iterable[Name], original: Name) -> int | None:
    """Index of the first record whose owner is not the name asked, letter case aside."""
    wanted = tuple(label.lower() for label in original)
    for index, owner in enumerate(owners):
        if tuple(label.lower() for label in owner) != wanted:
            return index
    return None


def completed(answer: Answer, original: Name) -> Answer:
    """A found name's answer as the client that asked `original` gets it: led by a CNAME from
    `original` to the owner of the first record named otherwise, with that record's TTL
    (cname.go). An answer without such a record is left as it is."""
    at = first_other((rr.name for rr in answer.answer), original)
    if at is None:
        return answer
    target = answer.answer[at]
    return answer._replace(answer=(RR(original, CNAME, target.ttl, target.name),) + answer.answer)


def answered_alike(name: Name, first: Name, answer: Answer) -> bool:
    """True when autopath's reply to `name` is its plain reply: the first name tried is the name
    as asked, letter for letter, and it exists, and no CNAME would lead the answer."""
    return (
        name == first
        and not goes_on(answer)
        and not answer.fallthrough
        and first_other((rr.name for rr in answer.answer), name) is None
    )
