"""The server's lifecycle: load the data, bind UDP and TCP, serve, reload, stop on a signal."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from toposdns.config import ServeConfig
from toposdns.metrics import INVALID_POLICIES
from toposdns.resolve.answer import name_text
from toposdns.serve.responder import UDP4, UDP6, Responder
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.udp import UdpProtocol
from toposdns.source.snapshot_file import SnapshotFileSource
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import invalid_changes

log = logging.getLogger("toposdns")

# Large socket buffers absorb bursts instead of dropping queries while the loop is busy.
UDP_BUFFER_BYTES = 4 * 1024 * 1024


def own_addresses(host: str) -> tuple[str, ...]:
    """This server's non-loopback addresses, for apex NS answers (CoreDNS local.go)."""
    ip = ipaddress.ip_address(host)
    if not ip.is_unspecified:
        return () if ip.is_loopback else (str(ip),)
    found: list[str] = []
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, proto=socket.IPPROTO_UDP):
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            if not address.is_loopback and str(address) not in found:
                found.append(str(address))
    return tuple(found)


def report_invalid_policies(old: Snapshot, new: Snapshot) -> None:
    """Log and count each invalid topology policy once, when it appears or changes."""
    for (namespace, name), policy in invalid_changes(old.policies, new.policies):
        INVALID_POLICIES.inc()
        log.warning(
            "Service %s/%s: %s policy ignored, answering with every ready endpoint: %s",
            namespace,
            name,
            policy.source,
            "; ".join(policy.errors),
        )


async def serve(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT. Raises SnapshotError if the first load fails."""
    assert config.snapshot is not None
    resolver_config = replace(config.resolver, ns_addresses=own_addresses(config.listen_host))
    responder = Responder(resolver_config, Snapshot(), config.ecs_trust)

    def publish(snapshot: Snapshot) -> None:
        report_invalid_policies(responder.snapshot, snapshot)
        responder.update(snapshot)

    source = SnapshotFileSource(config.snapshot, publish)
    publish(source.load())

    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET
    udp_sock = socket.socket(family, socket.SOCK_DGRAM)
    udp_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER_BYTES)
    udp_sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UDP_BUFFER_BYTES)
    udp_sock.bind((config.listen_host, config.listen_port))
    port = udp_sock.getsockname()[1]
    kind = UDP6 if family == socket.AF_INET6 else UDP4
    udp, _ = await loop.create_datagram_endpoint(
        lambda: UdpProtocol(responder, kind), sock=udp_sock
    )
    limits = TcpLimits(config.tcp_max_connections, config.tcp_idle_timeout)
    tcp = await loop.create_server(
        lambda: TcpProtocol(responder, limits),
        config.listen_host,
        port,
        reuse_address=True,
        backlog=1024,
    )
    zones = ", ".join(name_text(zone) for zone in resolver_config.zones)
    log.info("serving DNS on %s:%d (udp, tcp) for %s", config.listen_host, port, zones)

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watcher = asyncio.create_task(source.watch())
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        watcher.cancel()
        udp.close()
        tcp.close()
        await tcp.wait_closed()


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)
