"""The server's lifecycle: load the data, bind UDP and TCP, serve, reload, stop on a signal."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import resource
import signal
import socket
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from prometheus_client import REGISTRY

from toposdns.config import ServeConfig
from toposdns.kube.client import apis_of, connect
from toposdns.metrics import INVALID_POLICIES
from toposdns.resolve.answer import name_text
from toposdns.resolve.resolver import ResolverConfig
from toposdns.serve.forward import Forwarder
from toposdns.serve.http import HttpServer
from toposdns.serve.query_metrics import QueryMetrics
from toposdns.serve.responder import TCP4, TCP6, UDP4, UDP6, Responder
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.udp import UdpProtocol
from toposdns.source.kube import KubeSource
from toposdns.source.snapshot_file import SnapshotFileSource
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import invalid_changes

log = logging.getLogger("toposdns")

# Large socket buffers absorb bursts instead of dropping queries while the loop is busy.
UDP_BUFFER_BYTES = 4 * 1024 * 1024
# Open files besides forwarded queries and TCP clients: listeners, HTTP, the API, logs.
FILES_RESERVE = 64


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
    # A snapshot that follows the last one can only differ in the services it changed.
    changed = [(w[1], w[2]) for w in new.changes if w[0] == "svc"] if new.follows(old) else None
    for (namespace, name), policy in invalid_changes(old.policies, new.policies, changed):
        INVALID_POLICIES.inc()
        log.warning(
            "Service %s/%s: %s policy ignored, answering with every ready endpoint: %s",
            namespace,
            name,
            policy.source,
            "; ".join(policy.errors),
        )


async def serve(config: ServeConfig) -> None:
    """Serve until SIGTERM or SIGINT, then keep answering for the lameduck period.

    Raises SnapshotError or ConnectError when the data cannot be had at all.
    """
    resolver_config = replace(config.resolver, ns_addresses=own_addresses(config.listen_host))
    live = config.snapshot is None
    metrics = None
    if config.http is not None:
        metrics = QueryMetrics(f"dns://:{config.listen_port}")
        REGISTRY.register(metrics)
    forwarder = None
    if config.upstreams:
        forwarder = Forwarder(
            list(config.upstreams), max_concurrent=config.max_concurrent, cache=config.cache
        )
    raise_open_files_limit(config.tcp_max_connections + (config.max_concurrent if forwarder else 0))
    responder = Responder(
        resolver_config,
        Snapshot(synced=not live),
        config.ecs_trust,
        forwarder,
        metrics,
        config.loadbalance,
    )
    stopping = False

    def publish(snapshot: Snapshot) -> None:
        report_invalid_policies(responder.snapshot, snapshot)
        responder.update(snapshot)

    def not_ready() -> str | None:
        if stopping:
            return "Shutting down"
        return None if responder.snapshot.synced else "kubernetes"

    async with contextlib.AsyncExitStack() as stack:
        if metrics is not None:
            stack.callback(REGISTRY.unregister, metrics)
            REGISTRY.register(responder.topology_counts)
            stack.callback(REGISTRY.unregister, responder.topology_counts)
        if forwarder is not None:
            stack.push_async_callback(forwarder.close)
            log.info("forwarding other names to %s", ", ".join(map(str, config.upstreams)))
        if config.snapshot is not None:
            files = SnapshotFileSource(
                config.snapshot, publish, max_bytes=config.snapshot_max_bytes
            )
            publish(files.load())
            background = files.watch()
        else:
            api_client = await connect(config.kubeconfig)
            stack.push_async_callback(api_client.close)
            # Listed objects live as long as the data: freeze what survives each page, so the
            # cyclic collector does not scan it again and again in a big sync.
            background = KubeSource(apis_of(api_client), publish, on_page=gc.freeze).run()
        task = asyncio.create_task(background, name="source")
        stack.callback(task.cancel)
        if live:
            await _wait_for_sync(responder, task, config.startup_timeout)

        if config.http is not None:
            http = HttpServer(not_ready, lambda: (responder.snapshot, responder.config))
            port = await http.start(*config.http)
            stack.push_async_callback(http.stop)
            log.info(
                "serving /health, /ready, /explain and /metrics on %s:%d", config.http[0], port
            )
        # Signals are ours before the port is announced, so that a signal sent right after
        # the "serving" line is never Python's default KeyboardInterrupt.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        port = await _serve_dns(config, resolver_config, responder, stack)
        server = f"dns://:{port}"  # the label CoreDNS gives its server block
        if metrics is not None:
            metrics.server = server
        checks: set[asyncio.Task[None]] = set()
        if forwarder is not None:
            forwarder.set_server(server)
            # CoreDNS's `loop`: a probe through each upstream must not come back here.
            check = forwarder.loops.check(config.upstreams, f"{config.listen_host}:{port}")
            checking = asyncio.create_task(check)
            stack.callback(checking.cancel)
            checks.add(checking)
        await _until_stopped({task, asyncio.create_task(stop.wait())}, checks)
        # Lameduck, as CoreDNS's health plugin: /ready fails so that endpoints drop this pod,
        # while queries already on their way are still answered.
        stopping = True
        again = asyncio.Event()  # a second signal (Ctrl-C twice) ends the wait at once
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, again.set)
        log.info("shutting down: answering for %gs more (lameduck)", config.lameduck)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(again.wait(), config.lameduck)
        log.info("stopped")


async def _until_stopped(ending: set[asyncio.Task[Any]], checks: set[asyncio.Task[None]]) -> None:
    """Wait until one of the `ending` tasks (a signal, the source) ends; raise what any task
    raised, a failed check included. A check that passes just ends."""
    watched = ending | checks
    while True:
        done, watched = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            if not finished.cancelled() and finished.exception() is not None:
                raise finished.exception()  # type: ignore[misc]
        if done & ending:
            return


def raise_open_files_limit(needed: int) -> None:
    """Raise the soft limit on open files to the hard one, as Go programs (CoreDNS) do at start;
    warn when even that leaves too few for the forwarded queries and TCP connections allowed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft != resource.RLIM_INFINITY and soft < needed + FILES_RESERVE:
        log.warning(
            "the open files limit (%d) is below what --max-concurrent and --tcp-max-connections "
            "allow (%d + %d): raise it (ulimit -n) or lower those; past the limit forwarded "
            "queries get SERVFAIL",
            soft,
            needed,
            FILES_RESERVE,
        )


async def _wait_for_sync(responder: Responder, task: asyncio.Task[None], timeout: float) -> None:
    """Like CoreDNS, wait up to `timeout` for the first full sync, then serve anyway."""
    deadline = time.monotonic() + timeout
    while not responder.snapshot.synced and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.05)
    if not responder.snapshot.synced:
        log.warning("starting with unsynced Kubernetes data: names not found get SERVFAIL")


async def _serve_dns(
    config: ServeConfig,
    resolver_config: ResolverConfig,
    responder: Responder,
    stack: contextlib.AsyncExitStack,
) -> int:
    """Bind UDP and TCP on the same port; returns the port."""
    loop = asyncio.get_running_loop()
    family = socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET
    udp_sock, tcp_sock = _bind_pair(family, config.listen_host, config.listen_port)
    port = int(udp_sock.getsockname()[1])
    kind, stream = (UDP6, TCP6) if family == socket.AF_INET6 else (UDP4, TCP4)
    udp, _ = await loop.create_datagram_endpoint(
        lambda: UdpProtocol(responder, kind), sock=udp_sock
    )
    stack.callback(udp.close)
    limits = TcpLimits(config.tcp_max_connections, config.tcp_idle_timeout, config.tcp_read_timeout)
    tcp = await loop.create_server(
        lambda: TcpProtocol(responder, limits, stream), sock=tcp_sock, backlog=1024
    )
    stack.push_async_callback(tcp.wait_closed)
    stack.callback(tcp.close)
    zones = ", ".join(name_text(zone) for zone in resolver_config.zones)
    log.info("serving DNS on %s:%d (udp, tcp) for %s", config.listen_host, port, zones)
    return port


def _bind_pair(family: int, host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket bound to one port. For port 0 the kernel picks the UDP port,
    which TCP may already use: then try another, a bounded number of times."""
    for attempt in range(1 if port else 20):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER_BYTES)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UDP_BUFFER_BYTES)
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            udp.bind((host, port))
            tcp.bind((host, udp.getsockname()[1]))
            tcp.listen(1024)
        except OSError:
            udp.close()
            tcp.close()
            if port or attempt == 19:
                raise
            continue
        return udp, tcp
    raise AssertionError("unreachable")


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)
