"""`toposdns serve` assembled: load the data, bind UDP and TCP, serve, reload, stop on a signal.

The pieces (`start_source`, `serve_dns`, ...) are shared with the supervisor and the workers of
`--workers N` (toposdns/workers/); the lifecycle they all live is toposdns/lifecycle.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import resource
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.registry import Collector

from toposdns.config import ServeConfig
from toposdns.kube.client import apis_of, connect
from toposdns.lifecycle import Lifecycle
from toposdns.metrics import INVALID_POLICIES
from toposdns.resolve.answer import name_text
from toposdns.serve.forward import Forwarder
from toposdns.serve.http import PATHS, HttpServer
from toposdns.serve.query_metrics import QueryMetrics
from toposdns.serve.responder import TCP4, TCP6, UDP4, UDP6, Responder
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.udp import UdpProtocol
from toposdns.source.kube import KubeSource
from toposdns.source.snapshot_file import SnapshotFileSource
from toposdns.store.builder import StoreBuilder
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
    """Serve until SIGTERM or SIGINT, then keep answering for the lameduck period. With
    `config.workers` above 1, as a supervisor of that many worker processes.

    Raises SnapshotError or ConnectError when the data cannot be had at all.
    """
    if config.workers > 1:
        from toposdns.workers.supervisor import supervise

        await supervise(config)
        return
    resolver_config = replace(config.resolver, ns_addresses=own_addresses(config.listen_host))
    forwarder = make_forwarder(config)
    raise_open_files_limit(config)
    async with Lifecycle() as life:
        metrics = query_metrics(config, life.stack)
        responder = Responder(
            resolver_config,
            Snapshot(synced=config.snapshot is not None),
            config.ecs_trust,
            forwarder,
            metrics,
            config.loadbalance,
        )
        if metrics is not None:
            register(life.stack, responder.topology_counts)
        if forwarder is not None:
            life.stack.push_async_callback(forwarder.close)
            log.info("forwarding other names to %s", ", ".join(map(str, config.upstreams)))

        def publish(snapshot: Snapshot) -> None:
            report_invalid_policies(responder.snapshot, snapshot)
            responder.update(snapshot)

        def not_ready() -> str | None:
            if life.stopping:
                return "Shutting down"
            return None if responder.snapshot.synced else "kubernetes"

        await start_source(config, life, publish, lambda: responder.snapshot.synced)
        http = HttpServer(not_ready, lambda: (responder.snapshot, responder.config))
        await start_http(config, http, life.stack)
        # Signals are ours before the port is announced, so that a signal sent right after
        # the "serving" line is never Python's default KeyboardInterrupt.
        life.catch_signals()
        family = socket.AF_INET6 if ":" in config.listen_host else socket.AF_INET
        udp_sock, tcp_sock = bind_pair(family, config.listen_host, config.listen_port)
        port = await serve_dns(config, responder, udp_sock, tcp_sock, life.stack)
        log.info("serving DNS on %s:%d (udp, tcp) for %s", config.listen_host, port, zones(config))
        server = f"dns://:{port}"  # the label CoreDNS gives its server block
        if metrics is not None:
            metrics.server = server
        if forwarder is not None:
            forwarder.set_server(server)
            # CoreDNS's `loop`: a probe through each upstream must not come back here.
            check = forwarder.loops.check(config.upstreams, f"{config.listen_host}:{port}")
            life.start(check, "loop check", ending=False)
        await life.main_loop()
        # Lameduck, as CoreDNS's health plugin: /ready fails so that endpoints drop this pod,
        # while queries already on their way are still answered.
        log.info("shutting down: answering for %gs more (lameduck)", config.lameduck)
        await life.lameduck(config.lameduck)
        log.info("stopped")


def make_forwarder(config: ServeConfig) -> Forwarder | None:
    """The forwarder to the upstreams, if there are any."""
    if not config.upstreams:
        return None
    return Forwarder(
        list(config.upstreams), max_concurrent=config.max_concurrent, cache=config.cache
    )


def query_metrics(config: ServeConfig, stack: contextlib.AsyncExitStack) -> QueryMetrics | None:
    """The per-query metrics, registered for /metrics; None when no address serves it."""
    if not config.serves_metrics:
        return None
    metrics = QueryMetrics(f"dns://:{config.listen_port}")
    register(stack, metrics)
    return metrics


def register(stack: contextlib.AsyncExitStack, collector: Collector) -> None:
    """Serve a collector on /metrics until the stack closes."""
    REGISTRY.register(collector)
    stack.callback(REGISTRY.unregister, collector)


async def start_source(
    config: ServeConfig,
    life: Lifecycle,
    publish: Callable[[Snapshot], None],
    synced: Callable[[], bool],
    builder: StoreBuilder | None = None,
) -> KubeSource | None:
    """Load the snapshot file and watch it for changes; or connect to the cluster, watch it
    (into `builder`, if given) and wait up to --startup-timeout until `synced()`. Returns the
    cluster's source, None for a file."""
    if config.snapshot is not None:
        files = SnapshotFileSource(config.snapshot, publish, max_bytes=config.snapshot_max_bytes)
        publish(files.load())
        gc.freeze()  # the data lives long: the cyclic collector need not walk it again and again
        life.start(files.watch(), "source")
        return None
    api_client = await connect(config.kubeconfig)
    life.stack.push_async_callback(api_client.close)
    # Listed objects live as long as the data: freeze what survives each page, so the
    # cyclic collector does not scan it again and again in a big sync.
    source = KubeSource(apis_of(api_client), publish, on_page=gc.freeze, builder=builder)
    task = life.start(source.run(), "source")
    await _wait_for_sync(synced, task, config.startup_timeout)
    return source


async def start_http(
    config: ServeConfig, http: HttpServer, stack: contextlib.AsyncExitStack
) -> None:
    """Serve the HTTP endpoints on the addresses the configuration gives, until the stack
    closes. An address that cannot be bound raises OSError with it as `filename`."""
    stack.push_async_callback(http.stop)
    for (host, port), paths in config.http_listeners():
        served = [path for path in PATHS if path in paths]
        try:
            bound = await http.listen(host, port, served)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, f"{host}:{port} ({', '.join(served)})") from None
        names = ", ".join(served[:-1]) + " and " + served[-1] if len(served) > 1 else served[0]
        log.info("serving %s on %s:%d", names, host, bound)


def zones(config: ServeConfig) -> str:
    """The zones served, as the "serving DNS" line lists them."""
    return ", ".join(name_text(zone) for zone in config.resolver.zones)


def raise_open_files_limit(config: ServeConfig) -> None:
    """Raise the soft limit on open files to the hard one, as Go programs (CoreDNS) do at start;
    warn when even that leaves too few for the forwarded queries and TCP connections allowed
    (the limit is per process: each worker of `--workers N` may use that many)."""
    needed = config.tcp_max_connections + (config.max_concurrent if config.upstreams else 0)
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


async def _wait_for_sync(
    synced: Callable[[], bool], task: asyncio.Task[None], timeout: float
) -> None:
    """Like CoreDNS, wait up to `timeout` for the first full sync, then serve anyway."""
    deadline = time.monotonic() + timeout
    while not synced() and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.05)
    if not synced():
        log.warning("starting with unsynced Kubernetes data: names not found get SERVFAIL")


async def serve_dns(
    config: ServeConfig,
    responder: Responder,
    udp_sock: socket.socket,
    tcp_sock: socket.socket,
    stack: contextlib.AsyncExitStack,
) -> int:
    """Answer on a bound UDP socket and a listening TCP socket until the stack closes; returns
    their port."""
    loop = asyncio.get_running_loop()
    kind, stream = (UDP6, TCP6) if udp_sock.family == socket.AF_INET6 else (UDP4, TCP4)
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
    return int(udp_sock.getsockname()[1])


def bind_pair(
    family: int, host: str, port: int, reuse_port: bool = False, listen: bool = True
) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket bound to one port (with `reuse_port`, a port other such sockets
    share: the kernel spreads queries among them). For port 0 the kernel picks the UDP port,
    which TCP may already use: then try another, a bounded number of times."""
    for attempt in range(1 if port else 20):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER_BYTES)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UDP_BUFFER_BYTES)
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for sock in (udp, tcp) if reuse_port else ():
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            udp.bind((host, port))
            tcp.bind((host, udp.getsockname()[1]))
            if listen:
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
