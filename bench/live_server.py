"""toposdns serving the stand-in API server, for `bench/live.py` and `bench/churn.py`: started,
waited for (/ready), and asked for A records from one UDP socket until an answer shows a change.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dns.exception
import dns.message
import dns.rdatatype

from bench.harness import (
    HOST,
    FakeApiServer,
    ServerProcess,
    free_port,
    log,
    percentile,
    toposdns_command,
)

READY_POLL = 0.05
CHANGE_TIMEOUT = 2.0  # seconds a change may take to show before it counts as missed
POLL = 0.001  # seconds between two queries for a changed name


def free_ports() -> tuple[int, int]:
    """A port free for both UDP and TCP, and another for HTTP."""
    for _ in range(50):
        port = free_port(socket.SOCK_DGRAM)
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind((HOST, port))
            http = free_port()
            if http != port:
                return port, http
    raise RuntimeError("no free ports on loopback")


@dataclass
class Live:
    """The stand-in API server, and the toposdns process serving from it once started."""

    server: FakeApiServer
    workdir: Path
    proc: ServerProcess | None = None
    dns_port: int = 0
    http_port: int = 0

    def start(self, extra: Sequence[str]) -> ServerProcess:
        """`toposdns serve` against the (started) stand-in, on free ports, in one process
        unless `extra` flags (which come last) say `--workers=N`."""
        kubeconfig = self.server.write_kubeconfig(self.workdir / "kubeconfig")
        self.dns_port, self.http_port = free_ports()
        log("starting toposdns")
        self.proc = ServerProcess(
            toposdns_command("serve", "--kubeconfig", str(kubeconfig),
                             "--listen", f"{HOST}:{self.dns_port}",
                             "--http", f"{HOST}:{self.http_port}", "--workers=1", *extra)
        )  # fmt: skip
        return self.proc


@contextlib.contextmanager
def live(show_log: bool = False) -> Iterator[Live]:
    """A stand-in API server (not started yet) and a work directory; on exit the toposdns
    process, if any, is stopped (its log shown with `show_log`), then the stand-in."""
    setup = Live(FakeApiServer(), Path(tempfile.mkdtemp(prefix="toposdns-live-")))
    try:
        yield setup
    finally:
        if setup.proc is not None:
            setup.proc.stop()
            if show_log:
                log("toposdns log:\n" + setup.proc.tail(40))
        setup.server.stop()
        shutil.rmtree(setup.workdir, ignore_errors=True)


def ready(http_port: int) -> bool:
    """True if /ready answers 200 now."""
    try:
        url = f"http://{HOST}:{http_port}/ready"
        with urllib.request.urlopen(url, timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(proc: ServerProcess, http_port: int, timeout: float) -> float:
    """Seconds from the process start to the first /ready 200, polling every 50 ms."""
    return proc.wait_until(lambda: ready(http_port), timeout, READY_POLL)


class Asker:
    """One UDP socket asking toposdns for A records."""

    def __init__(self, port: int, source: str | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        if source is not None:  # a client the server places by this address
            self.sock.bind((source, 0))
        self.sock.connect((HOST, port))

    def close(self) -> None:
        self.sock.close()

    def ask(self, name: str, timeout: float = 0.2) -> set[str] | None:
        """The A addresses of `name`, or None if no reply came within `timeout`."""
        query = dns.message.make_query(name, "A", id=random.randrange(1 << 16))
        self.sock.setblocking(False)
        with contextlib.suppress(BlockingIOError, InterruptedError):
            for _ in range(1000):  # drop late replies to earlier queries
                self.sock.recv(4096)
        self.sock.send(query.to_wire())
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                reply = dns.message.from_wire(self.sock.recv(4096))
            except TimeoutError:
                return None
            except dns.exception.DNSException:
                continue
            if reply.id == query.id:
                return {
                    rd.to_text()
                    for rrset in reply.answer
                    if rrset.rdtype == dns.rdatatype.A
                    for rd in rrset
                }
        return None

    def wait_for(
        self, name: str, want: Callable[[set[str]], bool], timeout: float = CHANGE_TIMEOUT
    ) -> float | None:
        """Ask every POLL seconds until `want(answer)`; seconds it took, or None."""
        start = time.perf_counter()
        deadline = start + timeout
        while (now := time.perf_counter()) < deadline:
            found = self.ask(name, min(0.2, deadline - now))
            if found is not None and want(found):
                return time.perf_counter() - start
            pause = POLL - (time.perf_counter() - now)
            if pause > 0:
                time.sleep(pause)
        return None


class EveryWorker(Asker):
    """Several UDP sockets asking at once, each from its own source port, so that with
    `--workers` each worker is asked (the kernel hands each port to one); the answer is the
    addresses every one of them got, so a change counts once all have it."""

    def __init__(self, port: int, sockets: int) -> None:
        self.askers = [Asker(port) for _ in range(sockets)]

    def close(self) -> None:
        for asker in self.askers:
            asker.close()

    def ask(self, name: str, timeout: float = 0.2) -> set[str] | None:
        answers = [asker.ask(name, timeout) for asker in self.askers]
        if any(answer is None for answer in answers):
            return None
        return set.intersection(*answers)  # type: ignore[arg-type]


def equals(want: set[str]) -> Callable[[set[str]], bool]:
    return lambda got: got == want


def holds(address: str) -> Callable[[set[str]], bool]:
    return lambda got: address in got


@dataclass
class Delays:
    """How long changes took to show in answers; `missed` never showed within the timeout."""

    kind: str
    samples_ms: list[float] = field(default_factory=list)
    missed: int = 0

    def summary(self) -> dict[str, object]:
        s = sorted(self.samples_ms)
        return {
            "kind": self.kind,
            "events": len(s) + self.missed,
            "missed": self.missed,
            "p50_ms": percentile(s, 50),
            "p99_ms": percentile(s, 99),
            "max_ms": s[-1] if s else math.nan,
        }
