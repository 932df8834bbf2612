"""Fuzz toposdns's DNS frontends with a million mutated and random packets over UDP and TCP.

Starts `python -m toposdns serve --snapshot examples/cluster.yaml` on loopback and sends it
packets made from real queries (plain, EDNS, client subnet, cookies; in-zone, reverse, SRV,
pod, out-of-zone names): bits flipped, bytes set, cut short, spliced with another query,
header counts and flags changed, EDNS options garbled, compression pointers aimed anywhere
(loops, forward, past the end), or plain random bytes. Over TCP the frames stay well formed
(their contents do not), arrive in pieces, pipelined, and some connections end mid-frame.

Every `--check-every` packets it checks that the server is alive, answers a valid query
correctly over UDP and TCP, and that its RSS stays under `--max-rss` MiB (the reply caches are
bounded, so memory must level off). Between checks, each batch of packets ends with a valid
query whose answer shows that the batch has been read. Any failure, a reply that is not a DNS
response, or an ERROR line or traceback in the server's log exits 1.

Run from the repository root:  python -m bench.fuzz  (see bench/README.md).
`campaign()` is what tests/integration/test_fuzz.py runs, with a smaller count.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dnslib

from bench.harness import HOST, REPO, ServerProcess, log, toposdns_command

SNAPSHOT = REPO / "examples" / "cluster.yaml"
#: A name of examples/cluster.yaml and its answer, asked at every check.
PROBE = ("web.shop.svc.cluster.local", {"10.96.12.34"})
SENTINEL = "fuzz-sentinel.shop.svc.cluster.local"
REPLY_TIMEOUT = 2.0
RCODES = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}

NAMES = [
    "web.shop.svc.cluster.local",
    "frontend.shop.svc.cluster.local",
    "db.data.svc.cluster.local",
    "db-0.db.data.svc.cluster.local",
    "_postgres._tcp.db.data.svc.cluster.local",
    "shop-web.default.svc.cluster.local",
    "nothing.shop.svc.cluster.local",
    "shop.svc.cluster.local",
    "cluster.local",
    "dns-version.cluster.local",
    "10-244-1-21.data.pod.cluster.local",
    "34.12.96.10.in-addr.arpa",
    "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.1.0.0.d.f.ip6.arpa",
    "example.com",
    "WeB.ShOp.SvC.CLUSTER.local",
    "a" * 63 + ".shop.svc.cluster.local",
]
QTYPES = [1, 28, 33, 12, 16, 6, 2, 5, 15, 255, 252, 251, 65, 65535, 0]
UDP_SIZES = [0, 512, 1232, 4096, 65535]


def question(name: str, qtype: int) -> bytes:
    labels = [label.encode() for label in name.split(".") if label]
    return b"".join(bytes([len(x)]) + x for x in labels) + b"\x00" + struct.pack("!HH", qtype, 1)


def option(code: int, data: bytes) -> bytes:
    return struct.pack("!HH", code, len(data)) + data


def opt_record(udp_size: int, flags: int, options: bytes) -> bytes:
    return b"\x00" + struct.pack("!HHIH", 41, udp_size, flags, len(options)) + options


def query(qid: int, name: str, qtype: int, opt: bytes = b"", flags: int = 0x0100) -> bytes:
    header = struct.pack("!6H", qid, flags, 1, 0, 0, 1 if opt else 0)
    return header + question(name, qtype) + opt


def ecs(family: int, prefix: int, address: bytes, scope: int = 0) -> bytes:
    return option(8, struct.pack("!HBB", family, prefix, scope) + address)


def corpus(rng: random.Random) -> list[bytes]:
    """Real queries, as resolvers send them."""
    options = [
        b"",
        ecs(1, 24, bytes([10, 244, 1])),
        ecs(1, 32, bytes([127, 0, 0, 2])),
        ecs(2, 56, bytes.fromhex("fd00102000000000")[:7]),
        option(10, rng.randbytes(8)),
        option(10, rng.randbytes(8)) + ecs(1, 16, bytes([10, 96])),
        option(12, bytes(20)),
        option(65001, b"x"),
    ]
    queries = []
    for name in NAMES:
        for qtype in QTYPES:
            queries.append(query(rng.randrange(1 << 16), name, qtype))
            size = rng.choice(UDP_SIZES)
            flags = rng.choice([0, 0x8000])  # DO bit
            opt = opt_record(size, flags, rng.choice(options))
            queries.append(query(rng.randrange(1 << 16), name, qtype, opt))
    return queries


class Mutator:
    """Makes fuzzed packets from the corpus, deterministically from a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.corpus = corpus(self.rng)
        self.mutations: list[Callable[[bytearray], bytearray]] = [
            self.rename,
            self.rename,
            self.rename,
            self.flip_bits,
            self.flip_bits,
            self.set_bytes,
            self.truncate,
            self.splice,
            self.insert,
            self.pointer,
            self.pointer,
            self.counts,
            self.flags,
            self.garble_edns,
            self.garble_edns,
        ]

    def packet(self) -> bytes:
        rng = self.rng
        if rng.random() < 0.05:  # plain noise, mostly short
            return rng.randbytes(rng.choice([rng.randrange(0, 13), rng.randrange(0, 600)]))
        data = bytearray(rng.choice(self.corpus))
        for _ in range(rng.choice((1, 1, 2, 3))):
            data = rng.choice(self.mutations)(data)
        return bytes(data)

    def rename(self, data: bytearray) -> bytearray:
        """A byte of the question made another name character: mostly still a valid query,
        for a name that exists or not, so that these reach the resolver."""
        if len(data) > 13:
            at = self.rng.randrange(13, len(data))
            data[at] = self.rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789-_*.")
        return data

    def flip_bits(self, data: bytearray) -> bytearray:
        for _ in range(self.rng.randrange(1, 9)):
            if data:
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        return data

    def set_bytes(self, data: bytearray) -> bytearray:
        for _ in range(self.rng.randrange(1, 5)):
            if data:
                value = self.rng.choice([0, 0xFF, 0xC0, 0x3F, 0x40, 0x80, self.rng.randrange(256)])
                data[self.rng.randrange(len(data))] = value
        return data

    def truncate(self, data: bytearray) -> bytearray:
        return data[: self.rng.randrange(len(data) + 1)]

    def splice(self, data: bytearray) -> bytearray:
        other = self.rng.choice(self.corpus)
        return data[: self.rng.randrange(len(data) + 1)] + other[self.rng.randrange(len(other)) :]

    def insert(self, data: bytearray) -> bytearray:
        at = self.rng.randrange(len(data) + 1)
        if self.rng.random() < 0.5:
            piece = self.rng.randbytes(self.rng.randrange(1, 16))
        else:  # a copy of part of the packet, e.g. a label or a record, again
            start = self.rng.randrange(len(data) + 1)
            piece = bytes(data[start : start + self.rng.randrange(1, 64)])
        return data[:at] + piece + data[at:]

    def pointer(self, data: bytearray) -> bytearray:
        """A compression pointer to anywhere: back, forward, to itself, past the end."""
        at = self.rng.randrange(12, max(13, len(data) + 1))
        target = self.rng.choice(
            [self.rng.randrange(0, len(data) + 16), at, 12, self.rng.randrange(0x4000)]
        )
        pointer = bytes([0xC0 | (target >> 8 & 0x3F), target & 0xFF])
        keep = self.rng.random() < 0.5  # overwrite the rest, or splice the pointer in
        return data[:at] + pointer + (data[at + 2 :] if keep else b"")

    def counts(self, data: bytearray) -> bytearray:
        if len(data) >= 12:
            index = self.rng.randrange(4)
            value = self.rng.choice([0, 1, 2, 3, 0xFFFF, self.rng.randrange(1 << 16)])
            data[4 + 2 * index : 6 + 2 * index] = value.to_bytes(2, "big")
        return data

    def flags(self, data: bytearray) -> bytearray:
        if len(data) >= 4:
            data[2] = self.rng.randrange(256)  # QR, opcode, AA, TC, RD
            data[3] = self.rng.choice([0, 0x10, 0x20, 0x40, self.rng.randrange(256)])
        return data

    def garble_edns(self, data: bytearray) -> bytearray:
        """An OPT record with odd options: bad lengths, ECS of any shape, a second OPT."""
        rng = self.rng
        options = b"".join(
            rng.choice(
                [
                    ecs(rng.randrange(4), rng.randrange(256), rng.randbytes(rng.randrange(18))),
                    ecs(1, rng.randrange(33), rng.randbytes(4), rng.randrange(3)),
                    option(10, rng.randbytes(rng.randrange(48))),
                    option(rng.randrange(1 << 16), rng.randbytes(rng.randrange(8))),
                    struct.pack("!HH", rng.randrange(16), rng.randrange(1 << 16)),  # runs past
                ]
            )
            for _ in range(rng.randrange(1, 4))
        )
        flags = rng.choice([0, 0x8000, 1 << 16, rng.randrange(1 << 32)])  # DO; version 1
        record = bytearray(opt_record(rng.choice(UDP_SIZES + [1]), flags, options))
        if rng.random() < 0.3:  # rdlength that lies
            record[9:11] = rng.randrange(1 << 16).to_bytes(2, "big")
        if len(data) >= 12:
            arcount = int.from_bytes(data[10:12], "big")
            data[10:12] = ((arcount + 1) & 0xFFFF).to_bytes(2, "big")
        return data + record


@dataclass
class Check:
    """One health check during the campaign."""

    packets: int
    seconds: float
    rss_mib: float
    udp_probe: str
    tcp_probe: str


@dataclass
class Report:
    """What a campaign sent and saw."""

    seed: int
    udp_packets: int = 0
    tcp_packets: int = 0
    tcp_connections: int = 0
    replies: int = 0
    bad_replies: int = 0
    #: Replies to the fuzzed packets by rcode: how far into the server they got.
    rcodes: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    checks: list[Check] = field(default_factory=list)

    @property
    def packets(self) -> int:
        return self.udp_packets + self.tcp_packets


class FuzzFailure(AssertionError):
    """The server died, answered wrongly, sent something that is not a DNS response, or grew."""


def addresses(reply: bytes) -> set[str]:
    """The A records of a reply (dnslib: an independent parser)."""
    record = dnslib.DNSRecord.parse(reply)
    return {str(rr.rdata) for rr in record.rr if rr.rtype == dnslib.QTYPE.A}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise FuzzFailure(f"process {pid} has no VmRSS")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


class Client:
    """Sends to one server over UDP and TCP, and waits for the answer that ends each batch."""

    def __init__(self, address: tuple[str, int], report: Report, rng: random.Random) -> None:
        self.address = address
        self.report = report
        self.rng = rng
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.udp.connect(address)

    def close(self) -> None:
        self.udp.close()

    def note(self, reply: bytes) -> None:
        self.report.replies += 1
        if len(reply) < 12 or not reply[2] & 0x80:
            self.report.bad_replies += 1
            return
        rcode = RCODES.get(reply[3] & 0xF, str(reply[3] & 0xF))
        self.report.rcodes[rcode] = self.report.rcodes.get(rcode, 0) + 1

    def udp_batch(self, packets: list[bytes], name: str = SENTINEL) -> bytes:
        """Send the packets, then a valid query for `name`; its reply, once it comes."""
        for packet in packets:
            try:
                self.udp.send(packet[:65507])
            except OSError:  # e.g. a refused ICMP from an earlier send; the check will tell
                pass
        self.report.udp_packets += len(packets)
        qid = self.rng.randrange(1 << 16)
        wanted = query(qid, name, 1)
        for _ in range(3):  # the last query may be dropped if the socket buffers overflow
            self.udp.send(wanted)
            deadline = time.monotonic() + REPLY_TIMEOUT
            while (remaining := deadline - time.monotonic()) > 0:
                self.udp.settimeout(remaining)
                try:
                    reply = self.udp.recv(65535)
                except (TimeoutError, ConnectionRefusedError):
                    break
                if reply[:2] == wanted[:2] and reply[12 : len(wanted)] == wanted[12:]:
                    return reply
                self.note(reply)
        raise FuzzFailure(f"no UDP answer to {name} within {3 * REPLY_TIMEOUT:g}s")

    def tcp_batch(
        self, packets: list[bytes], name: str = SENTINEL, may_cut: bool = True
    ) -> bytes | None:
        """Send the packets as frames in random pieces, then a valid query; its reply.
        Some connections are cut mid-frame instead (None), if `may_cut`."""
        rng = self.rng
        stream = b"".join(len(p[:65535]).to_bytes(2, "big") + p[:65535] for p in packets)
        abandon = may_cut and rng.random() < 0.05
        qid = rng.randrange(1 << 16)
        wanted = query(qid, name, 1)
        if abandon:
            stream += rng.randrange(13, 1 << 16).to_bytes(2, "big") + b"\x00" * 12
        else:
            stream += len(wanted).to_bytes(2, "big") + wanted
        self.report.tcp_packets += len(packets)
        self.report.tcp_connections += 1
        with socket.create_connection(self.address, timeout=REPLY_TIMEOUT) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            offset = 0
            while offset < len(stream):
                size = rng.choice([1, 2, 7, 64, 512, 4096, len(stream)])
                sock.sendall(stream[offset : offset + size])
                offset += size
            if abandon:
                return None
            while True:
                reply = read_frame(sock)
                if reply[:2] == wanted[:2] and reply[12 : len(wanted)] == wanted[12:]:
                    return reply
                self.note(reply)


def read_frame(sock: socket.socket) -> bytes:
    def exactly(size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise FuzzFailure(f"TCP connection closed after {len(data)} of {size} bytes")
            data += chunk
        return data

    return exactly(int.from_bytes(exactly(2), "big"))


def campaign(
    address: tuple[str, int],
    pid: int,
    count: int,
    seed: int = 42,
    check_every: int = 100_000,
    tcp_share: float = 0.2,
    duration: float | None = None,
    max_rss_mib: float = 512.0,
    probe: tuple[str, set[str]] = PROBE,
    batch: int = 100,
    progress: Callable[[Check], None] | None = None,
) -> Report:
    """Send `count` fuzzed packets (fewer if `duration` seconds pass first) to the server at
    `address` (process `pid`), checking it every `check_every`; FuzzFailure on any fault."""
    report = Report(seed)
    mutator = Mutator(seed)
    client = Client(address, report, random.Random(seed + 1))
    started = time.monotonic()

    def check() -> None:
        if not alive(pid):
            raise FuzzFailure(f"the server died after {report.packets} packets")
        name, expected = probe
        answers = [
            addresses(client.udp_batch([], name)),
            addresses(client.tcp_batch([], name, may_cut=False) or b""),
        ]
        rss = rss_mib(pid)
        seconds = round(time.monotonic() - started, 1)
        texts = [",".join(sorted(found)) for found in answers]
        done = Check(report.packets, seconds, round(rss, 1), *texts)
        report.checks.append(done)
        if progress is not None:
            progress(done)
        for transport, got in zip(("UDP", "TCP"), answers, strict=True):
            if got != expected:
                raise FuzzFailure(f"{name} over {transport}: {sorted(got)}, not {sorted(expected)}")
        if rss > max_rss_mib:
            raise FuzzFailure(
                f"RSS {rss:.0f} MiB after {report.packets} packets, over {max_rss_mib:g}"
            )

    try:
        check()
        next_check = check_every
        while report.packets < count:
            if duration is not None and time.monotonic() - started > duration:
                break
            size = min(batch, count - report.packets)
            packets = [mutator.packet() for _ in range(size)]
            if mutator.rng.random() < tcp_share:
                client.tcp_batch(packets)
            else:
                client.udp_batch(packets)
            if report.packets >= next_check:
                check()
                next_check += check_every
        if report.checks[-1].packets != report.packets:
            check()
    finally:
        client.close()
        report.seconds = round(time.monotonic() - started, 1)
    if report.bad_replies:
        raise FuzzFailure(f"{report.bad_replies} replies were not DNS responses")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--count", type=int, default=1_000_000, help="packets (default %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--duration", type=float, help="stop after this many seconds")
    parser.add_argument("--check-every", type=int, default=100_000)
    parser.add_argument("--tcp-share", type=float, default=0.2, help="of the batches")
    parser.add_argument("--max-rss", type=float, default=512.0, metavar="MIB")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    server = ServerProcess(
        toposdns_command(
            "serve",
            f"--snapshot={SNAPSHOT}",
            f"--listen={HOST}:0",  # the kernel picks a port free for both UDP and TCP
            f"--http={HOST}:0",  # so that every query is counted, too
            "--ecs-trust=127.0.0.0/8",
            "--pods=insecure",
            "--lameduck=0",
        )
    )
    try:
        dns_port = int(server.wait_for_log(r"serving DNS on \S+:(\d+)", timeout=30).group(1))

        def show(check: Check) -> None:
            log(
                f"{check.packets:>9,} packets {check.seconds:7.1f}s  RSS {check.rss_mib:6.1f} MiB"
                f"  {PROBE[0]}: {check.udp_probe} (udp) {check.tcp_probe} (tcp)"
            )

        try:
            report = campaign(
                (HOST, dns_port),
                server.pid,
                args.count,
                args.seed,
                args.check_every,
                args.tcp_share,
                args.duration,
                args.max_rss,
                progress=show,
            )
        except FuzzFailure as exc:
            log(f"FAILED: {exc}\n{server.tail(30)}")
            return 1
        if "Traceback" in server.log() or " ERROR " in server.log():
            log(f"FAILED: the server logged an error:\n{server.log()}")
            return 1
    finally:
        server.stop()
    if args.json:
        print(json.dumps({**asdict(report), "packets": report.packets}, indent=2))
    else:
        rate = report.packets / report.seconds if report.seconds else 0.0
        print(
            f"{report.packets:,} packets ({report.udp_packets:,} UDP, {report.tcp_packets:,} TCP "
            f"on {report.tcp_connections:,} connections) in {report.seconds:.1f} s "
            f"({rate:,.0f}/s), seed {report.seed}: {report.replies:,} replies, all DNS "
            f"responses ({', '.join(f'{k} {v:,}' for k, v in sorted(report.rcodes.items()))}); "
            f"{len(report.checks)} checks passed; RSS "
            f"{report.checks[0].rss_mib:.0f} -> {max(c.rss_mib for c in report.checks):.0f} "
            f"MiB (max)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
