"""Memory under query floods, and the size of UDP replies (amplification).

Starts `toposdns serve --workers 1` on loopback with the bench cluster (bench/cluster.py: 2,000
headless services) plus a headless service of 100 named endpoints, forwarding other names to a stub
upstream, with the cache bounds a pod with kubeadm's `limits.memory: 170Mi` derives by default
(an eighth and a sixteenth of it: `--cache-max-bytes 21Mi --forward-cache-max-bytes 10Mi`; the
container here has no limit). Then, one after the other, it floods it with:

- `srv-case`: SRV for the 100-endpoint service, each name in random letter case, EDNS buffer
  65535 (every variant used to be a cache entry of its own);
- `made-up`: names that do not exist, each asked once;
- `forward-59k`: 1,000 names outside the zones whose answers are 59 KB (over TCP);

and reports the server's RSS after each (`VmRSS`, and the peak, `VmHWM`). Then the
amplification table: request and reply sizes over UDP for SRV with its additional records at
EDNS 65535 and for a forwarded TXT, at `--max-udp-size` 65535 (as before the bound) and at its
default, 1232.

Run from the repository root:  python -m bench.flood  (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import dnslib

from bench.cluster import generate_cluster, snapshot_objects
from bench.harness import (
    HOST,
    ServerProcess,
    free_port,
    headless,
    log,
    machine,
    namespace,
    stub_upstream,
    toposdns_command,
)

BIG_ENDPOINTS = 100
SRV_NAME = "_http._tcp.big.flood.svc.cluster.local"
#: TXT strings of 255 bytes: 59 KB of answer per forwarded name.
TXT_STRINGS = 230
FORWARDED = 1000


def big_service() -> list[dict[str, object]]:
    """A namespace with a headless service of 100 named endpoints (SRV answers of ~8 KB)."""
    endpoints = [
        {"addresses": [f"10.200.0.{i + 1}"], "hostname": f"big-{i}"} for i in range(BIG_ENDPOINTS)
    ]
    return [namespace("flood"), *headless("big", "flood", endpoints)]


def query(name: str, qtype: str, size: int | None = None) -> bytes:
    message = dnslib.DNSRecord.question(name, qtype)
    message.header.id = random.getrandbits(16)
    if size is not None:
        message.add_ar(dnslib.EDNS0(udp_len=size))
    return bytes(message.pack())


def random_case(name: str, rng: random.Random) -> str:
    return "".join(rng.choice((c.lower(), c.upper())) for c in name)


class Client:
    """One UDP socket and one TCP connection to the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.settimeout(3)
        self.tcp: socket.socket | None = None
        self.lost = 0

    def over_udp(self, data: bytes) -> bytes:
        self.udp.sendto(data, (HOST, self.port))
        try:
            while True:
                reply = self.udp.recv(65535)
                if reply[:2] == data[:2]:
                    return reply
        except TimeoutError:
            self.lost += 1
            return b""

    def over_tcp(self, data: bytes) -> bytes:
        if self.tcp is None:
            self.tcp = socket.create_connection((HOST, self.port), timeout=5)
        self.tcp.sendall(struct.pack("!H", len(data)) + data)
        length = struct.unpack("!H", self.read(2))[0]
        return self.read(length)

    def read(self, count: int) -> bytes:
        assert self.tcp is not None
        out = b""
        while len(out) < count:
            chunk = self.tcp.recv(count - len(out))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            out += chunk
        return out


def flood(
    name: str, count: int, send: Callable[[int], bytes], server: ServerProcess
) -> dict[str, object]:
    started = time.monotonic()
    answered = 0
    for i in range(count):
        answered += bool(send(i))
    seconds = time.monotonic() - started
    peak, rss = server.memory()
    log(f"{name}: {count} queries in {seconds:.1f}s, {answered} answered, RSS {rss:.0f} MiB")
    return {"flood": name, "queries": count, "answered": answered, "rss_mib": round(rss, 1),
            "peak_mib": round(peak, 1), "seconds": round(seconds, 1)}  # fmt: skip


def serve(workdir: Path, upstream: int, extra: list[str]) -> tuple[ServerProcess, int]:
    port = free_port(socket.SOCK_DGRAM)
    command = toposdns_command(
        "serve", "--snapshot", str(workdir / "snapshot.json"), "--listen", f"{HOST}:{port}",
        "--upstream", f"{HOST}:{upstream}", "--lameduck", "0s", "--workers", "1", *extra,
    )  # fmt: skip
    server = ServerProcess(command)
    server.wait_for_log("serving DNS", timeout=120)
    return server, port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=20_000, help="queries per in-zone flood")
    ap.add_argument("--seed", type=int, default=1)
    bounds = "--cache-max-bytes 21Mi --forward-cache-max-bytes 10Mi"
    ap.add_argument("--cache-flags", default=bounds, help="the bounds a 170Mi pod derives")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    cluster = generate_cluster(2000, 20, 30, 42)
    doc = snapshot_objects(cluster)
    doc["items"] = [*doc["items"], *big_service()]  # type: ignore[list-item]
    texts = " ".join('"' + "x" * 255 + '"' for _ in range(TXT_STRINGS))
    records = {
        (f"blob{i}.example.com", "TXT"): [f"blob{i}.example.com. 300 IN TXT {texts}"]
        for i in range(FORWARDED)
    }
    records[("small.example.com", "TXT")] = [
        'small.example.com. 300 IN TXT "' + "y" * 200 + '" "' + "z" * 200 + '"'
    ] * 4
    results: dict[str, object] = {"machine": machine()}
    with tempfile.TemporaryDirectory() as tmp, stub_upstream(records) as stub:
        workdir = Path(tmp)
        (workdir / "snapshot.json").write_text(json.dumps(doc))
        server, port = serve(workdir, stub.port, args.cache_flags.split())
        try:
            client = Client(port)
            time.sleep(1)
            peak, rss = server.memory()
            log(f"loaded: RSS {rss:.0f} MiB")
            rows: list[dict[str, object]] = [{"flood": "loaded", "rss_mib": round(rss, 1)}]
            srv = [query(random_case(SRV_NAME, rng), "SRV", 65535) for _ in range(args.queries)]
            rows.append(flood("srv-case", args.queries, lambda i: client.over_udp(srv[i]), server))
            rows.append(
                flood(
                    "made-up",
                    args.queries,
                    lambda i: client.over_udp(
                        query(f"x{rng.getrandbits(48):x}.flood.svc.cluster.local", "A")
                    ),
                    server,
                )
            )
            rows.append(flood("forward-59k", FORWARDED, lambda i: client.over_tcp(
                query(f"blob{i}.example.com", "TXT", 65535)), server))  # fmt: skip
            results["floods"] = rows
        finally:
            server.stop()
        amplification = []
        for max_udp in (65535, 1232):
            server, port = serve(workdir, stub.port, ["--max-udp-size", str(max_udp)])
            try:
                client = Client(port)
                for what, data in (
                    ("SRV + additionals, EDNS 65535", query(SRV_NAME, "SRV", 65535)),
                    ("forwarded TXT, EDNS 65535", query("small.example.com", "TXT", 65535)),
                ):
                    reply = client.over_udp(data)
                    amplification.append({"max_udp_size": max_udp, "query": what,
                                          "request": len(data), "reply": len(reply)})  # fmt: skip
            finally:
                server.stop()
        results["amplification"] = amplification
    json.dump(results, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
