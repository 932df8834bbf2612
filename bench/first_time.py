"""CPU per first-time query, in process: `bench/run.py`'s *distinct* queries through `Responder`.

The same cluster and the same generated first-time names as `python -m bench.run --scenarios
distinct` (search-path names, pod names, endpoint names of addresses no endpoint has, services
that do not exist, the names that exist), as dnsperf sends them (no EDNS), each asked once of a
fresh responder (`--pods insecure`, as the benchmark's server; the cyclic collector's heap frozen
after the load, as the server freezes it). Reported:

- CPU microseconds per query (`time.process_time`, the fastest of `--repeat` passes), for the
  whole file in its order and for each name shape alone: robust to a loaded machine where QPS
  is not, since it counts this process's CPU only;
- with `--profile`, where the time goes (cProfile, cumulative): the cheap first look
  (`split_query`), the templates (serve/negative.py), decoding, placement, resolving,
  encoding, the cache insert and the reply's rendering.

Run from the repository root:  python -m bench.first_time  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection
from pathlib import Path

import dns.message

from bench.cluster import ZONE, generate_cluster, snapshot_objects
from bench.queries import distinct_queries
from toposdns.resolve.resolver import ResolverConfig
from toposdns.serve.responder import UDP4, Responder
from toposdns.source.snapshot_file import load_snapshot
from toposdns.store.snapshot import Snapshot

CLIENT = "127.0.0.2"

#: The functions a first-time query's time is split into (file name, function name).
PARTS = {
    "first look (split_query)": ("edns.py", "split_query"),
    "templates (negative.py)": ("negative.py", "reply"),
    "decode (decode_plain)": ("decode.py", "decode_plain"),
    "placement (Placer.place)": ("placement.py", "place"),
    "resolve": ("resolver.py", "resolve"),
    "encode (encode_forms)": ("encode.py", "encode_forms"),
    "cache insert (ReplyCache.store)": ("cache.py", "store"),
    "cached entry (Cached.__init__)": ("cache.py", "__init__"),
    "rendering (Responder.rendered)": ("responder.py", "rendered"),
}


def shape(name: str, existing: Collection[str]) -> str:
    """Which kind of generated name this is (bench/queries.py `distinct_queries`)."""
    if name in existing:
        return "existing name"
    labels = name.split(".")[: -len(ZONE.split("."))]
    if labels[-1:] == ["pod"]:
        return "pod name"
    if labels[-1:] != ["svc"]:
        return "search path"
    rest = labels[:-1]
    if len(rest) == 2:
        return "missing service"
    if len(rest) == 3 and rest[0].replace("-", "").isdigit():
        return "stray endpoint"
    return "search path"


def cpu_per_query(respond: Callable[[bytes], object], messages: list[bytes]) -> float:
    """CPU microseconds per query of one pass."""
    started = time.process_time()
    for message in messages:
        respond(message)
    return (time.process_time() - started) / len(messages) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--services", type=int, default=2000)
    ap.add_argument("--namespaces", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=30)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--queries", type=int, default=50_000, help="first-time queries per pass")
    ap.add_argument("--repeat", type=int, default=5, help="passes; the fastest counts")
    ap.add_argument("--profile", action="store_true", help="also split one pass with cProfile")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    cluster = generate_cluster(args.services, args.namespaces, args.nodes, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.json"
        path.write_text(json.dumps(snapshot_objects(cluster)))
        snapshot = load_snapshot(path, 1)
    config = ResolverConfig(pods="insecure")
    queries = distinct_queries(cluster, args.queries, 1, 0, args.seed).rounds[0]
    existing = {svc.fqdn.rstrip(".") for svc in cluster.services}
    existing |= {
        svc.endpoint_name(ep).rstrip(".") for svc in cluster.services for ep in svc.endpoints
    }
    messages = []
    shapes: dict[str, list[bytes]] = {}
    for number, (name, qtype) in enumerate(queries):
        query = dns.message.make_query(name, qtype, use_edns=False)
        query.id = number & 0xFFFF
        message = query.to_wire()
        messages.append(message)
        shapes.setdefault(f"{shape(name, existing)} {qtype}", []).append(message)
    gc.freeze()  # as the server does once its data is loaded

    def fresh(snapshot: Snapshot = snapshot) -> Callable[[bytes], object]:
        responder = Responder(config, snapshot)
        return lambda message: responder.respond(message, UDP4, CLIENT)

    rcodes = Counter(_rcode(reply) for reply in map(fresh(), messages) if isinstance(reply, bytes))
    results: dict[str, object] = {
        "queries": len(messages),
        "rcodes": dict(rcodes),
        "all": min(cpu_per_query(fresh(), messages) for _ in range(args.repeat)),
        "shapes": {
            key: {
                "share": len(group) / len(messages),
                "us": min(cpu_per_query(fresh(), group) for _ in range(args.repeat)),
            }
            for key, group in sorted(shapes.items())
        },
    }
    if args.profile:
        profile = cProfile.Profile()
        respond = fresh()
        profile.runcall(lambda: [respond(message) for message in messages])
        results["profile"] = split(pstats.Stats(profile))
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{len(messages):,} first-time queries, rcodes {dict(rcodes)}")
    print(f"all, in file order: {results['all']:.2f} CPU us per query")
    for key, row in results["shapes"].items():  # type: ignore[attr-defined]
        print(f"  {key:22s} {row['share']:6.1%} {row['us']:7.2f} us")
    if args.profile:
        print("cProfile, cumulative share of Responder.respond:")
        for part, share in results["profile"].items():  # type: ignore[attr-defined]
            print(f"  {part:34s} {share:6.1%}")


def split(stats: pstats.Stats) -> dict[str, float]:
    """Each part's cumulative time as a share of `Responder.respond`'s."""
    cumulative: dict[tuple[str, str], float] = {}
    for (file, _line, function), row in stats.stats.items():  # type: ignore[attr-defined]
        key = (Path(file).name, function)
        cumulative[key] = cumulative.get(key, 0.0) + row[3]
    total = cumulative[("responder.py", "respond")]
    return {part: cumulative.get(key, 0.0) / total for part, key in PARTS.items()}


def _rcode(reply: bytes) -> str:
    rcode = reply[3] & 0x0F
    if rcode:
        return {3: "NXDOMAIN", 2: "SERVFAIL"}.get(rcode, str(rcode))
    return "answer" if reply[7] else "NODATA"


if __name__ == "__main__":
    main()
