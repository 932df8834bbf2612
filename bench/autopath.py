"""Count the DNS queries a pod sends per lookup, with and without `--autopath`.

The pod is glibc's resolver (`getent ahosts NAME`) with the resolv.conf the kubelet writes for a
pod of namespace `shop` (`search shop.svc.cluster.local svc.cluster.local cluster.local` plus
the node's search domains, `options ndots:5`), bind-mounted over /etc/resolv.conf in a private
mount namespace. toposdns serves examples/topology.yaml plus a PodLocator that places
127.0.0.1 (where the queries come from) in `shop`, on a loopback address of its own, port 53;
names outside the cluster go to a stub upstream (tests/upstream.py). The count is the change
of `coredns_dns_requests_total` over one lookup. Needs root (unshare, port 53).

Run from the repository root:  python -m bench.autopath [--node-search corp.example] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

# glibc as the client, the stub upstream and the metrics reader are the test suite's own, as
# the stand-in API server is for the other benchmarks.
from bench.harness import (
    REPO,
    ServerProcess,
    free_port,
    glibc,
    metric_total,
    stub_upstream,
    toposdns_command,
)
from bench.live_server import wait_ready

TOPOLOGY = REPO / "examples" / "topology.yaml"
UPSTREAM = {
    ("api.example.com", "A"): ["api.example.com. 60 IN A 192.0.2.80"],
    ("api.example.com", "AAAA"): [],
}
#: (what the pod looks up, what kind of name it is)
LOOKUPS = [
    ("api.example.com", "outside the cluster"),
    ("web.shop", "a service, namespace-qualified"),
    ("web", "a service of the pod's own namespace"),
]


def measure(directory: Path, node_search: list[str], autopath: bool) -> list[int]:
    """Queries that reach the server for each of LOOKUPS."""
    snapshot = directory / "snapshot.yaml"
    snapshot.write_text(TOPOLOGY.read_text() + glibc.pod_locator("shop"))
    node_conf = directory / "node-resolv.conf"
    node_conf.write_text(f"search {' '.join(node_search)}\n" if node_search else "")
    address = glibc.free_loopback_53()
    http = free_port()
    counts = []
    with stub_upstream(UPSTREAM) as upstream:
        args = [
            "serve",
            "--snapshot", str(snapshot),
            "--listen", f"{address}:53",
            "--http", f"127.0.0.1:{http}",
            "--upstream", f"127.0.0.1:{upstream.port}",
        ]  # fmt: skip
        if autopath:
            args += ["--autopath", "--autopath-resolv-conf", str(node_conf)]
        server = ServerProcess(toposdns_command(*args))
        try:
            wait_ready(server, http, timeout=20)
            search = ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local", *node_search]
            conf = glibc.resolv_conf(directory, address, search)
            for name, _ in LOOKUPS:
                before = metric_total(http, "coredns_dns_requests_total")
                done = glibc.getent_ahosts(conf, name)
                if done.returncode != 0:
                    raise RuntimeError(f"getent ahosts {name} failed: {done.stderr}")
                counts.append(int(metric_total(http, "coredns_dns_requests_total") - before))
        finally:
            server.stop()
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--node-search",
        default="corp.example",
        help="the node's search domains, comma-separated ('' for none; default %(default)s)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    reason = glibc.unavailable()
    if reason is not None:
        print(f"bench.autopath: glibc as the client {reason}", file=sys.stderr)
        return 2
    node_search = [d for d in args.node_search.split(",") if d]
    directory = Path(tempfile.mkdtemp(prefix="toposdns-autopath-"))
    try:
        plain = measure(directory, node_search, autopath=False)
        completed = measure(directory, node_search, autopath=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    rows = [
        {"name": name, "kind": kind, "plain": a, "autopath": b}
        for (name, kind), a, b in zip(LOOKUPS, plain, completed, strict=True)
    ]
    if args.json:
        print(json.dumps({"node_search": node_search, "lookups": rows}, indent=2))
        return 0
    print(f"queries per `getent ahosts NAME` (glibc, ndots:5, node search: {node_search or '-'})")
    print(f"{'name':18} {'kind':38} {'plain':>5} {'--autopath':>10}")
    for row in rows:
        print(f"{row['name']:18} {row['kind']:38} {row['plain']:>5} {row['autopath']:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
