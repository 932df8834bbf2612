"""What `bench/run.py` asks: the query files of its scenarios.

- repeated: every service name (and with --srv its SRV name), in a fixed shuffled order;
- distinct: first-time names as a cluster's pods send them (see `distinct_queries`);
- ecs: the service names, each asked once from a client in every zone, every query carrying an
  EDNS Client Subnet option with the client's address (a binary file for `dnsperf -B`);
- cookie: the repeated file; dnsperf adds the COOKIE option itself (`-E 10:<hex>`).
"""

from __future__ import annotations

import ipaddress
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import dns.edns
import dns.message

from bench.cluster import ZONE, ZONES, Cluster, Node, dashed

#: (name without the final dot, query type), as a line of a dnsperf text file says it.
Query = tuple[str, str]

COOKIE = dns.edns.OptionType.COOKIE  # 10, RFC 7873
EDNS_PAYLOAD = 1232  # what dig and most stub resolvers offer today

WORDS = ("api", "auth", "cdn", "db", "events", "login", "metrics", "queue", "search", "static")
DOMAINS = ("example.com", "googleapis.com", "s3.amazonaws.com", "github.com", "corp.internal")
#: First addresses of the made-up pods and endpoints in distinct names (no real pod has them).
POD_BASE = int(ipaddress.IPv4Address("10.128.0.0"))
STRAY_BASE = int(ipaddress.IPv4Address("10.192.0.0"))


def repeated_queries(cluster: Cluster, with_srv: bool, seed: int) -> list[Query]:
    queries = [(svc.fqdn.rstrip("."), "A") for svc in cluster.services]
    if with_srv:
        queries += [(f"_http._tcp.{svc.fqdn.rstrip('.')}", "SRV") for svc in cluster.services]
    random.Random(seed + 1).shuffle(queries)
    return queries


def text_file(queries: list[Query]) -> str:
    return "".join(f"{name} {qtype}\n" for name, qtype in queries)


# --------------------------------------------------------------------------- distinct names


@dataclass
class DistinctNames:
    """Query files of first-time names: one per round, no query in two of them."""

    rounds: list[list[Query]]
    verify: list[Query]  # asked only by the correctness check, never in a measured run
    #: (name, address) of every pod name asked: Knot needs the records `--pods insecure` gives.
    pods: list[tuple[str, str]] = field(default_factory=list)


def distinct_queries(
    cluster: Cluster, per_round: int, rounds: int, verify: int, seed: int
) -> DistinctNames:
    """`rounds` files of `per_round` queries each, plus `verify` more for the correctness check,
    every (name, type) unique. Each lookup is asked for A and AAAA, as glibc and musl do.

    Most are first-time NXDOMAIN names from `ndots:5` search paths: a pod in namespace ns
    looking up `api-12.example.com` first asks `api-12.example.com.ns.svc.cluster.local`,
    `...svc.cluster.local` and `...cluster.local`. Then pod names `10-128-0-7.ns.pod.cluster.local`
    (answered, with `--pods insecure`), endpoint names of addresses no endpoint has, services
    that do not exist, and, up to 5% of the queries, the names that exist (each service and
    each endpoint name once, while they last).
    """
    rng = random.Random(seed + 3)
    total = per_round * rounds + verify
    names = DistinctNames(rounds=[], verify=[])
    existing = [[(svc.fqdn.rstrip("."), t) for t in ("A", "AAAA")] for svc in cluster.services]
    existing += [
        [(svc.endpoint_name(ep).rstrip("."), t) for t in ("A", "AAAA")]
        for svc in cluster.services
        for ep in svc.endpoints
    ]
    rng.shuffle(existing)
    lookups = existing[: total // 20 // 2]
    made = made_up_lookups(cluster, rng, names.pods)
    count = sum(len(lookup) for lookup in lookups)
    while count < total:
        lookup = next(made)
        lookups.append(lookup)
        count += len(lookup)
    rng.shuffle(lookups)
    flat = [query for lookup in lookups for query in lookup]
    names.rounds = [flat[i * per_round : (i + 1) * per_round] for i in range(rounds)]
    names.verify = flat[per_round * rounds : total]
    return names


def made_up_lookups(
    cluster: Cluster, rng: random.Random, pods: list[tuple[str, str]]
) -> Iterator[list[Query]]:
    """Endless lookups of names that were never asked before (each carries a fresh number);
    pod names go to `pods` with their address too."""
    both = ("A", "AAAA")

    def search_path(i: int) -> list[str]:
        host = f"{rng.choice(WORDS)}-{i}.{rng.choice(DOMAINS)}"
        ns = rng.choice(cluster.namespaces)
        return [f"{host}.{ns}.svc.{ZONE}", f"{host}.svc.{ZONE}", f"{host}.{ZONE}"]

    def pod(i: int) -> list[str]:
        ip = str(ipaddress.IPv4Address(POD_BASE + i))
        name = f"{dashed(ip)}.{rng.choice(cluster.namespaces)}.pod.{ZONE}"
        pods.append((f"{name}.", ip))
        return [name]

    def stray_endpoint(i: int) -> list[str]:
        svc = rng.choice(cluster.services)
        return [f"{dashed(str(ipaddress.IPv4Address(STRAY_BASE + i)))}.{svc.fqdn.rstrip('.')}"]

    def missing_service(i: int) -> list[str]:
        return [f"{rng.choice(WORDS)}-{i}.{rng.choice(cluster.namespaces)}.svc.{ZONE}"]

    # Lookups by kind; a search-path lookup is 6 queries, so it is about 2/3 of all queries.
    kinds: list[Callable[[int], list[str]]] = [search_path, pod, stray_endpoint, missing_service]
    weights = [40, 20, 15, 25]
    for i in range(1 << 22):  # the numbers keep the addresses inside their /10s
        kind = rng.choices(kinds, weights)[0]
        yield [(name, qtype) for name in kind(i) for qtype in both]


# --------------------------------------------------------------------------- EDNS options


def ecs_messages(cluster: Cluster, clients: Mapping[str, Node], seed: int) -> list[bytes]:
    """Each service's A query once from a client in every zone (a random node of that zone),
    with an EDNS Client Subnet option carrying the client's address as a /32."""
    rng = random.Random(seed + 4)
    by_zone = {zone: [a for a, node in clients.items() if node.zone == zone] for zone in ZONES}
    messages = []
    for svc in cluster.services:
        for addresses in by_zone.values():
            if addresses:
                messages.append(ecs_query(svc.fqdn, rng.choice(addresses)).to_wire())
    rng.shuffle(messages)
    return messages


def ecs_query(name: str, address: str, qtype: str = "A") -> dns.message.QueryMessage:
    option = dns.edns.ECSOption(address, 32)
    return dns.message.make_query(name, qtype, use_edns=0, payload=EDNS_PAYLOAD, options=[option])


def cookie_query(name: str, cookie: bytes, qtype: str = "A") -> dns.message.QueryMessage:
    option = dns.edns.GenericOption(COOKIE, cookie)
    return dns.message.make_query(name, qtype, use_edns=0, payload=EDNS_PAYLOAD, options=[option])
