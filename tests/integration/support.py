"""Helpers for the integration tests: run the real server process, ask it with dig or dnspython.

Everything here is bounded: process start, log waits, dig runs and socket reads all have a
timeout, so a hung server fails a test instead of hanging the suite.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dns.message
import dns.query
import dns.rdatatype
from prometheus_client.parser import text_string_to_metric_families

from tests.server_process import REPO as REPO
from tests.server_process import STOP_TIMEOUT as STOP_TIMEOUT
from tests.server_process import ServerProcess, toposdns_command

HERE = Path(__file__).parent
FIXTURE_SNAPSHOT = HERE / "snapshot.yaml"

START_TIMEOUT = 10.0
READY_LINE = re.compile(r"serving DNS on (\S+):(\d+) \(udp, tcp\)")


class ServerFailed(RuntimeError):
    """The server did not come up."""


class Server(ServerProcess):
    """One `toposdns serve` process on loopback, with its stderr collected by a thread."""

    def __init__(
        self,
        snapshot: Path | None,
        args: tuple[str, ...] = (),
        wrapper: tuple[str, ...] = (),
        tree: Path = REPO,
    ) -> None:
        """Serve `snapshot`; None serves from the cluster (pass --kubeconfig in `args`).
        `wrapper` is a command that runs the server, such as `prlimit --nofile=N:N --`; `tree`
        the source tree whose `toposdns` runs (a plain-Python copy, say)."""
        self.snapshot = snapshot
        self.args = args
        self.host = ""
        self.port = 0
        source = ["--snapshot", str(snapshot)] if snapshot is not None else []
        # One process unless a test asks for workers (the default follows the machine's CPUs).
        workers = [] if any(arg.startswith("--workers") for arg in args) else ["--workers", "1"]
        super().__init__(
            [
                *wrapper,
                *toposdns_command(
                    "serve", *source, "--listen", "127.0.0.1:0", "--lameduck", "0", *workers, *args
                ),
            ],
            cwd=tree,
        )

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        try:
            found = self.wait_for_log(READY_LINE, timeout)
        except AssertionError as exc:
            self.stop(1.0)
            raise ServerFailed(str(exc)) from None
        self.host, self.port = found.group(1), int(found.group(2))

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


class CorefileServer(Server):
    """`python -m toposdns -conf FILE`, as kubeadm's Deployment runs it; `wrapper` is a command
    that runs it, as for Server."""

    def __init__(self, corefile: Path, *flags: str, wrapper: tuple[str, ...] = ()) -> None:
        self.snapshot, self.args, self.host, self.port = None, flags, "", 0
        command = toposdns_command("-conf", str(corefile), *flags)
        ServerProcess.__init__(self, [*wrapper, *command])


def free_ports(*names: str) -> dict[str, int]:
    sockets = []
    for _ in names:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = {name: sock.getsockname()[1] for name, sock in zip(names, sockets, strict=True)}
    for sock in sockets:
        sock.close()
    return ports


def serve_corefile(tmp_path: Path, text: str) -> CorefileServer:
    """`toposdns -conf` on a Corefile of `text` written in `tmp_path`, once it serves."""
    corefile = tmp_path / "Corefile"
    corefile.write_text(text)
    server = CorefileServer(corefile)
    server.wait_ready(30)
    return server


def ask_port(
    port: int, name: str, rtype: str = "A", tcp: bool = False, timeout: float = 3.0
) -> dns.message.Message:
    """A query for `name` to 127.0.0.1:`port` over UDP (or TCP), and its reply."""
    query = dns.message.make_query(name, rtype)
    send = dns.query.tcp if tcp else dns.query.udp
    return send(query, "127.0.0.1", port=port, timeout=timeout)


#: The `start_server` fixture: start_server(*args, snapshot=None) -> a running Server.
StartServer = Callable[..., Server]


def copy_snapshot(directory: Path, source: Path = FIXTURE_SNAPSHOT) -> Path:
    """A private copy of a snapshot file, so tests can rewrite it."""
    target = directory / "snapshot.yaml"
    shutil.copyfile(source, target)
    return target


def replace_file(path: Path, text: str) -> None:
    """Replace a file in one step (as a ConfigMap update does), so no half file is ever read."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def wait_until(check: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll `check` until it is true or `timeout` passes; the last result."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# dig


@dataclass
class Dig:
    """dig's output, parsed."""

    text: str
    status: str = ""
    id: int = -1
    flags: set[str] = field(default_factory=set)
    counts: dict[str, int] = field(default_factory=dict)
    question: list[list[str]] = field(default_factory=list)
    answer: list[list[str]] = field(default_factory=list)
    authority: list[list[str]] = field(default_factory=list)
    additional: list[list[str]] = field(default_factory=list)
    edns: str = ""
    cookie: str = ""
    server: str = ""

    def rdata(self, rtype: str, section: str = "answer") -> list[str]:
        """The rdata of every record of one type in a section, as dig prints it."""
        return [" ".join(rr[4:]) for rr in getattr(self, section) if rr[3] == rtype]


SECTIONS = {
    "QUESTION": "question",
    "ANSWER": "answer",
    "AUTHORITY": "authority",
    "ADDITIONAL": "additional",
}


def parse_dig(text: str) -> Dig:
    out = Dig(text)
    section = ""
    for line in text.splitlines():
        header = re.match(r";; ->>HEADER<<- opcode: (\w+), status: (\w+), id: (\d+)", line)
        if header:
            out.status, out.id = header.group(2), int(header.group(3))
            continue
        flags = re.match(r";; flags:([^;]*);(.*)", line)
        if flags:
            out.flags = set(flags.group(1).split())
            out.counts = {k: int(v) for k, v in re.findall(r"(\w+): (\d+)", flags.group(2))}
            continue
        if line.startswith("; EDNS:"):
            out.edns = line
            continue
        if line.startswith("; COOKIE:"):
            out.cookie = line
            continue
        if line.startswith(";; SERVER:"):
            out.server = line
            continue
        start = re.match(r";; (\w+) SECTION:", line)
        if start:
            section = SECTIONS.get(start.group(1), "")
            continue
        if not line.strip():
            section = ""
            continue
        if section == "question":
            out.question.append(line.lstrip(";").split())
        elif section and not line.startswith(";"):
            getattr(out, section).append(line.split())
    return out


def dig(server: Server, *args: str, check: bool = True) -> Dig:
    """Run dig against the server, one try, 2 s per try."""
    assert shutil.which("dig"), "dig (bind9-dnsutils) is not installed"
    done = subprocess.run(
        ["dig", f"@{server.host}", "-p", str(server.port), "+tries=1", "+time=2", *args],
        capture_output=True,
        text=True,
        timeout=15,
    )
    if check:
        assert done.returncode == 0, f"dig {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return parse_dig(done.stdout)


# dnspython


def udp(server: Server, query: dns.message.Message, timeout: float = 2.0) -> dns.message.Message:
    return dns.query.udp(query, server.host, port=server.port, timeout=timeout)


def tcp(server: Server, query: dns.message.Message, timeout: float = 2.0) -> dns.message.Message:
    return dns.query.tcp(query, server.host, port=server.port, timeout=timeout)


def rrset_texts(section: list[dns.rrset.RRset]) -> set[str]:
    """A section as `name TTL IN TYPE rdata` lines."""
    return {line for rrset in section for line in rrset.to_text().splitlines()}


def addresses(reply: dns.message.Message, rtype: str = "A") -> set[str]:
    wanted = dns.rdatatype.from_text(rtype)
    return {rd.to_text() for rrset in reply.answer if rrset.rdtype == wanted for rd in rrset}


def raw_udp(
    server: Server, data: bytes, timeout: float = 0.5, source: str = "127.0.0.1"
) -> bytes | None:
    """Send one datagram; the reply, or None if none came within `timeout`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((source, 0))
        sock.settimeout(timeout)
        sock.sendto(data, server.address)
        try:
            reply, _ = sock.recvfrom(65535)
        except TimeoutError:
            return None
        return reply


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes from a stream socket (its timeout bounds each read)."""
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return bytes(data)


def recv_framed(sock: socket.socket) -> dns.message.Message:
    """One length-prefixed DNS message from a TCP socket."""
    length = int.from_bytes(recv_exact(sock, 2), "big")
    return dns.message.from_wire(recv_exact(sock, length))


def framed(query: dns.message.Message) -> bytes:
    wire = query.to_wire()
    return len(wire).to_bytes(2, "big") + wire


def http_get(port: int, path: str) -> tuple[int, str]:
    """GET http://127.0.0.1:PORT/PATH: (status, body), error statuses included; (0, "") when
    nothing answers (not listening yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


def metric_total(port: int, name: str) -> float:
    """The sum of every sample of one metric on http://127.0.0.1:PORT/metrics."""
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    )
