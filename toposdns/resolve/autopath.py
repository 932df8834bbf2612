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

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from toposdns.options import ConfigError, Origin, Plugin, Setting, domain, file, sets
from toposdns.resolve.answer import Answer
from toposdns.resolve.qname import SVC
from toposdns.resolve.resolver import Decision, ResolverConfig, match_zone, resolve
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Labels
from toposdns.store.turns import TurnCounts
from toposdns.wire.codes import CNAME, NXDOMAIN, Name
from toposdns.wire.records import RR

#: Where the node's search domains come from: the server's own resolv.conf, the node's when the
#: pod has `dnsPolicy: Default` (CoreDNS's kubernetes plugin reads the same file).
DEFAULT_RESOLV_CONF = Path("/etc/resolv.conf")
#: The kubelet writes at most 32 names in a pod's search line (MaxDNSSearchPaths).
MAX_SEARCH_DOMAINS = 32
#: A resolv.conf is a few lines; reading more than this is a mistake in the path.
MAX_RESOLV_CONF_BYTES = 65536
#: The longest name in DNS, in wire bytes (RFC 1035 section 2.3.4).
MAX_NAME_WIRE = 255


@dataclass(frozen=True, slots=True)
class AutopathOptions:
    """CoreDNS's `autopath @kubernetes` (`--autopath`)."""

    enabled: bool = False
    #: The file whose `search` line gives the node's search domains (None: DEFAULT_RESOLV_CONF,
    #: and none when it is missing, as in CoreDNS).
    resolv_conf: Path | None = None
    #: The node's search domains, which the kubelet appends to every pod's search path: read
    #: from `resolv_conf` once the options are checked.
    search: tuple[Name, ...] = ()


#: Autopath off, as without the directive.
NO_AUTOPATH = AutopathOptions()


def _enabled(words: Sequence[str], origin: Origin) -> bool:
    if list(words) not in ([], ["@kubernetes"]):
        raise origin.error(
            "only `autopath @kubernetes` is supported: the search paths of the pods the "
            "kubernetes plugin places"
        )
    return True


def _check(options: AutopathOptions, origin: Origin) -> AutopathOptions:
    if not options.enabled:
        if options.resolv_conf is not None:
            raise ConfigError("--autopath-resolv-conf: only read with --autopath; add --autopath")
        return options
    return replace(options, search=read_search_domains(options.resolv_conf))


AUTOPATH: Plugin[AutopathOptions] = Plugin(
    "autopath",
    AutopathOptions,
    (
        Setting(
            "",
            sets("enabled", _enabled),
            "--autopath",
            help="for a pod a PodLocator places in namespace NS, answer X.NS.svc.ZONE, when it "
            "does not exist, with the first name of the pod's search path that does, behind a "
            "CNAME (CoreDNS `autopath @kubernetes`)",
        ),
        Setting(
            None,
            sets("resolv_conf", file("/etc/resolv.conf")),
            "--autopath-resolv-conf",
            "FILE",
            "with --autopath: the node's search domains come from this file's `search` line "
            f"(default {DEFAULT_RESOLV_CONF})",
        ),
    ),
    _check,
)


def parse_search_domains(text: str, source: str) -> tuple[Name, ...]:
    """The search domains of a resolv.conf, lower-cased: the last `search` or `domain` line
    counts, as for the resolver (and miekg/dns's ClientConfigFromReader)."""
    found: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "search":
            found = fields[1:]
        elif fields and fields[0] == "domain":
            found = fields[1:2]
    if len(found) > MAX_SEARCH_DOMAINS:
        raise ConfigError(
            f"{source}: {len(found)} search domains; a pod's search line holds at most "
            f"{MAX_SEARCH_DOMAINS}"
        )
    origin = Origin("search domain", place=source)
    return tuple(domain(name, origin) for name in found if name != ".")


def read_search_domains(path: Path | None) -> tuple[Name, ...]:
    """The node's search domains. A missing default file gives none, as in CoreDNS; a file
    named in the configuration must be readable. (Configuration is read once, before any
    query: this is the only file the answer options read.)"""
    try:
        with open(path or DEFAULT_RESOLV_CONF, "rb") as file:
            data = file.read(MAX_RESOLV_CONF_BYTES + 1)
    except OSError as exc:
        if path is None:
            return ()
        raise ConfigError(
            f"--autopath-resolv-conf {path}: cannot read it ({exc.strerror or exc}); "
            "name the node's resolv.conf"
        ) from None
    source = str(path or DEFAULT_RESOLV_CONF)
    if len(data) > MAX_RESOLV_CONF_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_RESOLV_CONF_BYTES} bytes: not a resolv.conf")
    return parse_search_domains(data.decode("latin-1"), source)


def search_path(namespace: str, zone: Name, node_search: tuple[Name, ...]) -> tuple[Name, ...]:
    """A pod's search path as the kubelet writes it, then the root: the name as asked."""
    return ((namespace, SVC) + zone, (SVC,) + zone, zone, *node_search, ())


def candidates(
    name: Name, namespace: str, config: ResolverConfig, search: tuple[Name, ...]
) -> tuple[Name, ...] | None:
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
    path = search_path(namespace, first[2:], search)
    return tuple(base + suffix for suffix in path)


def first_candidate(name: Name, config: ResolverConfig) -> Name | None:
    """The first name autopath would try for `name` for a pod in the namespace the name
    names (`X.NS.svc.<zone>`), or None when no pod's search path starts above it."""
    lower = tuple(label.lower() for label in name)
    zone_len = match_zone(lower, config.zones)
    if zone_len is None or len(lower) < zone_len + 3 or lower[-zone_len - 1] != SVC:
        return None
    found = candidates(name, lower[-zone_len - 2], config, ())
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


def walk(
    names: Sequence[Name], start: int, local: Callable[[Name], Answer | None]
) -> Iterator[tuple[int, Answer | None]]:
    """The search-path walk from `names[start]`, as autopath and `explain` take it: each name
    tried, with the zones' answer (None when only the upstreams can answer it), up to the first
    that exists or that the upstreams must answer. Names too long for DNS are skipped."""
    for index in range(start, len(names)):
        if sum(len(label) + 1 for label in names[index]) + 1 > MAX_NAME_WIRE:
            continue  # no server can have it
        answer = local(names[index])
        yield index, answer
        if answer is None or not goes_on(answer):
            return


def local_answer(
    name: Name,
    qtype: int,
    snapshot: Snapshot,
    config: ResolverConfig,
    labels: Labels,
    decisions: list[Decision] | None = None,
    turns: TurnCounts | None = None,
) -> Answer | None:
    """The zones' answer for a name on the walk, or None when the upstreams must answer it
    (`turns`: the server's rotations of topology weights, which a name found moves on)."""
    if match_zone(tuple(label.lower() for label in name), config.zones) is None:
        return None
    answer = resolve(name, qtype, snapshot, config, labels, decisions, turns=turns)
    return None if answer.fallthrough else answer
