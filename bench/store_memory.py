"""Where the store's memory goes: the cluster of `bench/workers.py` decoded, converted and
indexed in this process as the live source does it, traced by tracemalloc.

The objects are encoded as list pages of 500, decoded page by page to the fields DNS reads
(`source/watch.py` `page_decoder`), converted (`convert_object`) and handed to the builder per
resource (`StoreBuilder.replace_all`), then one snapshot is published. What the snapshot keeps
is then reported: the bytes tracemalloc still sees allocated, by source line, and by what the
objects are (records, the strings and tuples they hold, the indexes' trie nodes).

Run from the repository root:  python -m bench.store_memory  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson

from bench.live_cluster import Sizes, generate
from toposdns.source.kube import ENDPOINT_SLICES, NAMESPACES, POD_LOCATORS, RESOURCES, SERVICES
from toposdns.source.watch import Resource, page_decoder
from toposdns.store.builder import StoreBuilder
from toposdns.store.convert import convert_object
from toposdns.store.snapshot import Snapshot

PAGE = 500


def pages(items: list[dict[str, Any]], resource: Resource) -> Iterator[bytes]:
    """The items as the API server's list pages (typed lists leave out kind and apiVersion)."""
    for start in range(0, len(items), PAGE):
        page = [
            {k: v for k, v in item.items() if k not in ("kind", "apiVersion")}
            for item in items[start : start + PAGE]
        ]
        yield orjson.dumps({"metadata": {"resourceVersion": "1"}, "items": page})


def sync(
    encoded: dict[Resource, list[bytes]], pod_names: bool = False
) -> tuple[StoreBuilder, Snapshot]:
    """Decode, convert and index every page, as `Reflector.list` and `KubeSource` do (keeping
    pod names only with `pod_names`, as the server under `--endpoint-pod-names`)."""
    builder = StoreBuilder()
    for resource, data in encoded.items():
        assert resource.fields is not None
        decoder = page_decoder(resource.fields)
        records = []
        for page in data:
            for obj in decoder.decode(page)["items"]:
                obj.setdefault("kind", resource.kind)
                obj.setdefault("apiVersion", resource.api_version)
                records.append(convert_object(obj, pod_names))
        builder.replace_all(RESOURCES[resource], records)
    return builder, builder.snapshot(1)


def walk(root: object) -> Counter[str]:
    """Bytes (sys.getsizeof) of every object reachable from `root` that the store made, by
    type, each counted once; modules, classes and functions are not followed."""
    seen: set[int] = set()
    sizes: Counter[str] = Counter()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type) or callable(obj):
            continue
        seen.add(id(obj))
        name = type(obj).__name__
        sizes[name] += sys.getsizeof(obj)
        sizes[name + " (count)"] += 1
        stack.extend(gc.get_referents(obj))
    return sizes


def per_slice(p: argparse.ArgumentParser, text: str) -> tuple[int, int]:
    """`MIN,MAX` endpoints of a slice."""
    try:
        low, high = (int(n) for n in text.split(","))
    except ValueError:
        p.error(f"--per-slice {text!r}: expected MIN,MAX, e.g. 3,10")
    if not 1 <= low <= high:
        p.error(f"--per-slice {text!r}: expected 1 <= MIN <= MAX")
    return low, high


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--placement", choices=("cidrs", "pods"), default="cidrs")
    p.add_argument("--nodes", type=int, default=5_000)
    p.add_argument("--locators", type=int, default=150_000, help="pods")
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--slices", type=int, default=10_000)
    p.add_argument("--namespaces", type=int, default=50)
    p.add_argument(
        "--per-slice", default="3,10", help="fewest,most ready endpoints of a slice (%(default)s)"
    )
    p.add_argument("--pod-names", action="store_true", help="keep pod names (--endpoint-pod-names)")
    p.add_argument("--lines", type=int, default=15, help="source lines to list")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    sizes = Sizes(
        args.services,
        args.slices,
        args.nodes,
        args.namespaces,
        args.locators,
        node_ranges=True,
        cidr_locators=args.placement == "cidrs",
        per_slice=per_slice(p, args.per_slice),
    )
    cluster = generate(sizes, args.seed)
    by_resource = {
        NAMESPACES: cluster.namespaces,
        SERVICES: cluster.services,
        ENDPOINT_SLICES: cluster.slices,
        POD_LOCATORS: cluster.locators,
    }
    encoded = {resource: list(pages(items, resource)) for resource, items in by_resource.items()}
    counts = {resource.name: len(items) for resource, items in by_resource.items()}
    del cluster, by_resource
    gc.collect()
    tracemalloc.start(1)
    builder, snapshot = sync(encoded, args.pod_names)
    del builder  # the server keeps it too, but it shares every record and map with the snapshot
    gc.collect()
    traced = tracemalloc.take_snapshot()
    tracemalloc.stop()
    total = sum(stat.size for stat in traced.statistics("filename"))
    endpoints = sum(len(eps.endpoints) for slices in snapshot.slices.values() for eps in slices)
    print(f"objects: {counts}, {endpoints:,} ready endpoints")
    print(f"traced after the sync: {total / 1e6:.1f} MB")
    print("\nby source line:")
    for stat in traced.statistics("lineno")[: args.lines]:
        frame = stat.traceback[0]
        where = f"{frame.filename.split('/site-packages/')[-1]}"
        print(f"  {stat.size / 1e6:7.2f} MB {stat.count:9,} blocks  {where}:{frame.lineno}")
    print("\nreachable from the snapshot, by type (sys.getsizeof):")
    sizes_by_type = walk(snapshot)
    types = [name for name in sizes_by_type if not name.endswith(" (count)")]
    for name in sorted(types, key=lambda n: -sizes_by_type[n])[: args.lines]:
        print(
            f"  {sizes_by_type[name] / 1e6:7.2f} MB {sizes_by_type[name + ' (count)']:9,}  {name}"
        )
    print(f"  {sum(sizes_by_type[n] for n in types) / 1e6:7.2f} MB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
