"""Memory a filled reply cache holds, against its bound (`--cache-max-bytes`).

Builds the bench cluster (bench/cluster.py: 2,000 headless services, `pods insecure`) in this
process, then, for each bound, fills a fresh responder's reply cache with `--names` distinct
names (bench/queries.py `distinct_queries`: mostly first-time NXDOMAIN search-path names, then
pod names, endpoint names and services that exist or do not, A and AAAA), each asked twice so
that the replies built from templates are kept too, some in another letter case, some with a
client cookie. Each fill runs in a child process of its own (forked after the snapshot is
built), twice: once to read the growth of its RSS (`VmRSS`), once under tracemalloc to read
what Python allocated. It prints, per bound: what the cache counts as held (`bytes_held`), the
tracemalloc growth and the RSS growth, each as a share of the bound.

Run from the repository root:  python -m bench.cache_memory [--names 200000] [--bounds 8Mi,32Mi]
(see bench/README.md, "Memory a filled cache holds").
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import random
import sys
import time
import tracemalloc
from multiprocessing.connection import Connection
from pathlib import Path

import dns.edns
import dns.message

from bench.cluster import generate_cluster, snapshot_objects
from bench.queries import distinct_queries
from tests.helpers import config_of
from toposdns.resolve import resolver
from toposdns.serve.responder import UDP4, Responder
from toposdns.store.builder import build_snapshot
from toposdns.store.convert import convert_object
from toposdns.store.snapshot import Snapshot
from toposdns.wire import encode

MIB = 1 << 20


def rss() -> int:
    """This process's resident set, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def messages(names: list[tuple[str, str]], seed: int) -> list[bytes]:
    """Each name as a query: a fifth with a cookie, a tenth in random letter case."""
    rng = random.Random(seed)
    out = []
    for name, qtype in names:
        if rng.random() < 0.1:
            name = "".join(rng.choice((c.lower(), c.upper())) for c in name)
        query = dns.message.make_query(name, qtype, use_edns=False)
        if rng.random() < 0.2:
            cookie = dns.edns.GenericOption(dns.edns.COOKIE, rng.randbytes(8))
            query.use_edns(0, payload=1232, options=[cookie])
        out.append(query.to_wire())
    return out


def fill(
    snapshot: Snapshot, bound: int, queries: list[bytes], traced: bool, out: Connection
) -> None:
    """In a child: fill a responder's cache and send back what it held."""
    responder = Responder(config_of(pods="insecure"), snapshot, cache_max_bytes=bound)
    for data in queries[:1000]:  # the encoder's and the templates' memories, filled before
        responder.respond(data, UDP4, "127.0.0.2")
    responder.cache.clear()
    gc.collect()
    if traced:
        tracemalloc.start()
    before_rss, before_traced = rss(), tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    for data in queries:
        for _ in range(2):
            responder.respond(data, UDP4, "127.0.0.2")
    seconds = time.perf_counter() - started
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before_traced
    cache = responder.cache
    memos = deep_size(encode._names) + deep_size(encode._records) + deep_size(resolver._soas)
    out.send(
        (
            cache.bytes_held,
            grown,
            rss() - before_rss,
            cache.entries,
            cache.evictions,
            seconds,
            memos,
        )
    )


def deep_size(value: object, seen: set[int] | None = None) -> int:
    """What a memo of tuples, strings and bytes takes (sys.getsizeof, each object once)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return 0
    seen.add(id(value))
    total = sys.getsizeof(value)
    if isinstance(value, dict):
        total += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in value.items())
    elif isinstance(value, tuple | list):
        total += sum(deep_size(item, seen) for item in value)
    return total


def measure(snapshot: Snapshot, bound: int, queries: list[bytes], traced: bool) -> tuple:
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    child = context.Process(target=fill, args=(snapshot, bound, queries, traced, writer))
    child.start()
    result = reader.recv()
    child.join(60)
    return result


def size(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * factor
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--names", type=int, default=200_000, help="distinct names (default 200000)"
    )
    parser.add_argument("--bounds", default="8Mi,32Mi", help="cache bounds (default 8Mi,32Mi)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    cluster = generate_cluster(2000, 50, 20, args.seed)
    objects = snapshot_objects(cluster)["items"]
    assert isinstance(objects, list)
    snapshot = build_snapshot([convert_object(o) for o in objects], serial=1, synced=True)
    names = distinct_queries(cluster, args.names, 1, 0, args.seed).rounds[0]
    queries = messages(names, args.seed)
    print(f"{len(queries)} distinct names, each asked twice; {cluster.endpoints} endpoints")
    print(
        "| bound | counted (bytes_held) | tracemalloc growth | RSS growth | of which the "
        "encoder's and resolver's memos | entries | evictions |"
    )
    print("|---|---|---|---|---|---|---|")
    for text in args.bounds.split(","):
        bound = size(text)
        held, _, grown_rss, entries, evictions, seconds, memos = measure(
            snapshot, bound, queries, False
        )
        grown_traced = measure(snapshot, bound, queries, True)[1]
        print(
            f"| {text} | {held / MIB:.1f} MiB ({held / bound:.2f}x) "
            f"| {grown_traced / MIB:.1f} MiB ({grown_traced / bound:.2f}x) "
            f"| {grown_rss / MIB:.1f} MiB ({grown_rss / bound:.2f}x) "
            f"| {memos / MIB:.1f} MiB | {entries:,} | {evictions:,} |"
        )
        print(f"  (fill took {seconds:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
