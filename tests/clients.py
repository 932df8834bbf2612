"""Real DNS clients for the integration tests, built or started from Debian packages: musl's
resolver (`musl-tools`: a C program calling getaddrinfo, built with musl-gcc; the same program
built with gcc is glibc's), Go's own resolver
(`golang-go`: a program on the standard library only) and unbound as a forwarding resolver
(`unbound`). Each helper says why it cannot run here (`*_unavailable`), for a skip reason.

Like glibc (tests/glibc.py), musl reads /etc/resolv.conf and asks port 53 only: it runs in a
private mount namespace with a resolv.conf of the test's bind-mounted over the file.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dns.exception
import dns.message
import dns.query
import dns.rdataclass

from tests import glibc

PROGRAMS = Path(__file__).parent / "client_programs"
BUILD_TIMEOUT = 120.0
RUN_TIMEOUT = 15.0
#: What each of many lookups adds to a program's time limit.
PER_LOOKUP = 0.05


def musl_unavailable() -> str | None:
    """Why the musl client cannot run here, or None."""
    if shutil.which("musl-gcc") is None:
        return "musl-gcc is not installed (Debian: apt-get install musl-tools)"
    return glibc.unavailable()  # the same namespace and port 53 as for glibc


def musl_version() -> str:
    """The installed musl's version, e.g. `1.2.3` (its dynamic loader prints it)."""
    for loader in Path("/lib").glob("ld-musl-*.so.1"):
        done = subprocess.run([str(loader)], capture_output=True, text=True, timeout=10)
        found = re.search(r"Version (\S+)", done.stderr)
        if found:
            return found.group(1)
    return "unknown"


def build_getaddrinfo(directory: Path) -> Path:
    """getaddrinfo.c built with musl-gcc, statically: musl's resolver, whatever the host's."""
    program = directory / "getaddrinfo-musl"
    subprocess.run(
        ["musl-gcc", "-O2", "-static", "-o", str(program), str(PROGRAMS / "getaddrinfo.c")],
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT,
    )
    return program


def build_glibc_getaddrinfo(directory: Path) -> Path:
    """getaddrinfo.c built with gcc: glibc's resolver (tests/glibc.py says where it runs)."""
    program = directory / "getaddrinfo-glibc"
    subprocess.run(
        ["gcc", "-O2", "-o", str(program), str(PROGRAMS / "getaddrinfo.c")],
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT,
    )
    return program


def musl_getaddrinfo(
    program: Path, conf: Path, name: str, count: int = 0
) -> subprocess.CompletedProcess[str]:
    """`program NAME [COUNT]` with `conf` as /etc/resolv.conf; exit 0 with addresses, 2 with
    none. Runs glibc's build the same way."""
    script = 'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"'
    repeat = [str(count)] if count else []
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(conf), str(program), name, *repeat],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT + count * PER_LOOKUP,
    )


def go_unavailable() -> str | None:
    """Why the Go client cannot run here, or None."""
    if shutil.which("go") is None:
        return "go is not installed (Debian: apt-get install golang-go)"
    return None


def build_resolve(directory: Path) -> Path:
    """resolve.go built without cgo: Go's own resolver, as in a static Go binary."""
    program = directory / "resolve-go"
    env = {**os.environ, "CGO_ENABLED": "0"}
    if "HOME" not in os.environ and "GOCACHE" not in os.environ:
        env["GOCACHE"] = str(directory / "go-cache")
    subprocess.run(
        ["go", "build", "-o", str(program), str(PROGRAMS / "resolve.go")],
        check=True,
        capture_output=True,
        timeout=BUILD_TIMEOUT,
        env=env,
    )
    return program


def go_resolve(
    program: Path, server: tuple[str, int], kind: str, name: str, count: int = 0
) -> subprocess.CompletedProcess[str]:
    """`resolve HOST:PORT KIND NAME [COUNT]` with GODEBUG=netdns=go; stderr names each dial.
    With `count`, the first result of each of that many lookups, one a line."""
    repeat = [str(count)] if count else []
    return subprocess.run(
        [str(program), f"{server[0]}:{server[1]}", kind, name, *repeat],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT + count * PER_LOOKUP,
        env={**os.environ, "GODEBUG": "netdns=go"},
    )


def unbound_unavailable() -> str | None:
    """Why unbound cannot run here, or None."""
    if shutil.which("unbound") is None:
        return "unbound is not installed (Debian: apt-get install unbound)"
    return None


@contextmanager
def unbound(
    directory: Path,
    listen: tuple[str, int],
    outgoing: str,
    forward_to: tuple[str, int],
    zone: str,
    ipv6_bits: int = 56,
) -> Iterator[subprocess.Popen[str]]:
    """unbound on `listen`, forwarding `zone` to `forward_to` from the address `outgoing`, with
    EDNS Client Subnet: each client's whole address (/32) goes along, or the first `ipv6_bits`
    of an IPv6 one (unbound's default /56; docs/topology.md's guide sets 64), or of the Client
    Subnet the client sent; answers are cached per the scope the server gives them (the
    subnetcache module)."""
    conf = directory / "unbound.conf"
    conf.write_text(
        f"""server:
    interface: {listen[0]}
    port: {listen[1]}
    outgoing-interface: {outgoing}
    do-daemonize: no
    username: ""
    chroot: ""
    directory: "{directory}"
    pidfile: ""
    use-syslog: no
    logfile: ""
    verbosity: 1
    num-threads: 1
    access-control: 127.0.0.0/8 allow
    do-not-query-localhost: no
    do-ip6: no
    module-config: "subnetcache iterator"
    send-client-subnet: 127.0.0.0/8
    client-subnet-always-forward: yes
    max-client-subnet-ipv4: 32
    max-client-subnet-ipv6: {ipv6_bits}
    qname-minimisation: no
    domain-insecure: "{zone}"
forward-zone:
    name: "{zone}."
    forward-addr: {forward_to[0]}@{forward_to[1]}
"""
    )
    log = directory / "unbound.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            ["unbound", "-d", "-c", str(conf)], stdout=output, stderr=subprocess.STDOUT, text=True
        )
    try:
        _wait_for_answers(process, listen, log)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def pdns_recursor_unavailable() -> str | None:
    """Why PowerDNS Recursor cannot run here, or None."""
    if shutil.which("pdns_recursor") is None:
        return "pdns_recursor is not installed (Debian: apt-get install pdns-recursor)"
    return None


@contextmanager
def pdns_recursor(
    directory: Path, listen: tuple[str, int], outgoing: str, forward_to: tuple[str, int], zone: str
) -> Iterator[subprocess.Popen[str]]:
    """PowerDNS Recursor on `listen`, forwarding `zone` to `forward_to` from the address
    `outgoing`, with EDNS Client Subnet as docs/topology.md's forwarder guide sets it: the
    client's whole address (`ecs-ipv4-bits=32`), for loopback clients too (`ecs-add-for`:
    by default private and loopback ranges are left out), and TTLs as the server gives them
    (`minimum-ttl-override=0`: by default a TTL of 0 is raised to 1 s, which keeps a
    topology NODATA for every client for that second)."""
    conf = directory / "recursor.conf"
    conf.write_text(
        f"""local-address={listen[0]}
local-port={listen[1]}
query-local-address={outgoing}
daemon=no
socket-dir={directory}
allow-from=127.0.0.0/8
dont-query=
forward-zones={zone}={forward_to[0]}:{forward_to[1]}
edns-subnet-allow-list={zone}
ecs-add-for=127.0.0.0/8
ecs-ipv4-bits=32
threads=1
loglevel=4
quiet=yes
minimum-ttl-override=0
security-poll-suffix=
"""
    )
    log = directory / "recursor.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            ["pdns_recursor", f"--config-dir={directory}"],
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        _wait_for_answers(process, listen, log, "id.server.")
        yield process
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _wait_for_answers(
    process: subprocess.Popen[str],
    listen: tuple[str, int],
    log: Path,
    name: str = "version.server.",
) -> None:
    """Until the resolver answers `name CH TXT` (from itself), 10 s at most."""
    query = dns.message.make_query(name, "TXT", rdclass=dns.rdataclass.CH)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{process.args[0]} exited with status {process.returncode}: {log.read_text()}"
            )
        try:
            dns.query.udp(query, listen[0], port=listen[1], timeout=0.2)
            return
        except (OSError, dns.exception.Timeout):
            time.sleep(0.1)
    raise RuntimeError(f"{process.args[0]} did not answer within 10 s: {log.read_text()}")


def free_port(host: str) -> int:
    """A port free on `host` for both UDP and TCP now."""
    for _ in range(20):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind((host, 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind((host, port))
                except OSError:
                    continue
                return port
    raise RuntimeError(f"no port free on {host} for UDP and TCP")
