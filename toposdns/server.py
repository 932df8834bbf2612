"""`toposdns serve` assembled: load the data, bind UDP and TCP, serve, reload, stop on a signal.

`DnsServer` is one process's DNS server; `serve` runs it with the source in one process, and
each worker of `--workers N` runs one under the supervisor (toposdns/workers/), which shares
`start_source` and `start_http`. The lifecycle they all live is toposdns/lifecycle.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import platform
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from toposdns import __version__, build_revision
from toposdns.config import ServeConfig
from toposdns.kube.client import apis_of, connect
from toposdns.lifecycle import Lifecycle
from toposdns.metrics import (
    ANSWERING,
    BUILD_INFO,
    IGNORED_LOCATORS,
    INVALID_POLICIES,
    LOCATOR_CONFLICTS,
    PLUGIN_ENABLED,
    SOURCE_SYNCED,
)
from toposdns.reload import corefile_bytes, watch_corefile
from toposdns.resolve.resolver import ResolverConfig
from toposdns.serve import udp_batch
from toposdns.serve.acl import Acl, Screen
from toposdns.serve.blocks import BlockConfig, Blocks, block_chain, block_forwarder
from toposdns.serve.cache import (
    DEFAULT_MAX_BYTES,
    MEMORY_SHARE,
    container_memory_limit,
    default_max_bytes,
)
from toposdns.serve.chain import ORDER, Handler, Next, Reply
from toposdns.serve.forward import BUDGET as FORWARD_BUDGET
from toposdns.serve.forward import Forwarder, forwarder_for, loop_checked
from toposdns.serve.forward_cache import FORWARD_MAX_BYTES, FORWARD_SHARE, capping
from toposdns.serve.hosts import Hosts, make_hosts
from toposdns.serve.http import PATHS, HttpServer, Serving
from toposdns.serve.listen import ListenOptions, bind_pair, server_label
from toposdns.serve.loop import LoopGuard
from toposdns.serve.query_log import LoggedTcpProtocol, LoggedUdpProtocol, QueryLog
from toposdns.serve.query_metrics import AllServers, QueryMetrics
from toposdns.serve.responder import Responder
from toposdns.serve.rewrite import make_rewrite
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.template import make_template
from toposdns.serve.transport import TCP4, TCP6, UDP4, UDP6, Transport
from toposdns.serve.udp import UdpProtocol
from toposdns.serve.upstream import Upstream
from toposdns.source.kube import KubeSource
from toposdns.source.snapshot_file import SnapshotFileSource
from toposdns.store.builder import StoreBuilder
from toposdns.store.placement import prefix_conflicts
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import invalid_changes
from toposdns.wire.codes import Name
from toposdns.wire.records import name_text

log = logging.getLogger("toposdns")

#: A Corefile to reload: its path, and how to read it into a configuration.
Corefile = tuple[Path, Callable[[], ServeConfig]]


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


def plugins(config: ServeConfig) -> list[str]:
    """The CoreDNS plugins in the query path this configuration stands for (health, ready and
    reload are not in it, as CoreDNS's handler chain does not hold them)."""
    names = ["errors", "kubernetes"]
    if config.acl.policies:
        names.append("acl")
    if config.serves_metrics:
        names.append("prometheus")
    if config.upstreams:
        names += ["forward", "cache", "loop"]
    if config.loadbalance.round_robin:
        names.append("loadbalance")
    if config.autopath.enabled:
        names.append("autopath")
    if config.log.enabled:
        names.append("log")
    if config.hosts.enabled:
        names.append("hosts")
    if config.template.enabled:
        names.append("template")
    if config.rewrite.enabled:
        names.append("rewrite")
    return names


def report_server(config: ServeConfig, port: int, ports: dict[ListenOptions, int]) -> None:
    """coredns_build_info, and coredns_plugin_enabled for each server block that has
    `prometheus` (the kubernetes block on `port`, the others on their port: `port`, or what
    `ports` says their address is bound to), per zone, as CoreDNS's prometheus plugin sets
    them at startup."""
    BUILD_INFO.labels(__version__, build_revision(), f"python{platform.python_version()}").set(1)
    PLUGIN_ENABLED.clear()
    for zone in config.block_zones:
        for name in plugins(config):
            PLUGIN_ENABLED.labels(
                server_label(config.bind.host, port), name_text(zone), "", name
            ).set(1)
    for block in config.blocks:
        if "prometheus" not in block.plugins:
            continue
        address = config.block_address(block)
        bound = port if address == config.bind else ports.get(address, address.port)
        server = server_label(address.host, bound)
        for zone in block.zones:
            for name in block.plugins:
                PLUGIN_ENABLED.labels(server, name_text(zone), "", name).set(1)


def report_invalid_policies(old: Snapshot, new: Snapshot) -> None:
    """Log and count each invalid topology policy once, when it appears or changes."""
    # A snapshot that follows the last one can only differ in the services it changed.
    words = new.changed_since(old)
    changed = None if words is None else [(w[1], w[2]) for w in words if w[0] == "svc"]
    for (namespace, name), policy in invalid_changes(old.policies, new.policies, changed):
        INVALID_POLICIES.inc()
        if policy.errors:
            log.warning(
                "Service %s/%s: %s policy ignored, answering with every ready endpoint: %s",
                namespace,
                name,
                policy.source,
                "; ".join(policy.errors),
            )
        else:
            log.warning(
                "Service %s/%s: soft-topology annotation ignored, answering by the %s "
                "(mode: %s): %s",
                namespace,
                name,
                "hard policy" if policy.active else "service without a policy",
                policy.mode,
                "; ".join(policy.soft_errors),
            )


def report_conflicts(old: Snapshot, new: Snapshot) -> None:
    """Log and count each prefix that two or more PodLocators claim, once, when its claimants
    change."""
    words = new.changed_since(old)
    changed = None if words is None else [w[1] for w in words if w[0] == "cidr"]
    for cidr, holders in prefix_conflicts(old.prefixes, new.prefixes, changed):
        LOCATOR_CONFLICTS.inc()
        log.warning(
            "PodLocators %s all claim %s: no client inside it is placed by it; keep the prefix "
            "on one locator",
            " and ".join(f"{held.namespace}/{held.name}" for held in holders),
            cidr,
        )


#: Ignored PodLocators named one per line in one snapshot; the rest are counted in one more.
NAMED_IGNORED = 10


def report_ignored(old: Snapshot, new: Snapshot) -> None:
    """Log and count each PodLocator that is held but not believed, once, when it appears: a
    line for each of the first few in a snapshot, one for the rest (a relist after an upgrade
    may find thousands written by an older controller)."""
    words = new.changed_since(old)
    if words is None:
        keys: Iterable[tuple[str, str]] = new.ignored.keys()
    else:
        keys = [(word[1], word[2]) for word in words if word[0] == "ignored"]
    appeared = [key for key in keys if key in new.ignored and key not in old.ignored]
    if not appeared:
        return
    IGNORED_LOCATORS.inc(len(appeared))
    believed = ", ".join(sorted(new.locator_namespaces))
    for namespace, name in sorted(appeared)[:NAMED_IGNORED]:
        log.warning(
            "PodLocator %s/%s ignored: only PodLocators in %s place clients and endpoints "
            "(--locator-namespaces), where the controller writes them; one from an older "
            "controller goes when the new one runs, one written by hand belongs there",
            namespace,
            name,
            believed,
        )
    if len(appeared) > NAMED_IGNORED:
        log.warning(
            "%d more PodLocators outside %s ignored (toposdns_ignored_locators_total)",
            len(appeared) - NAMED_IGNORED,
            believed,
        )


class PortServer:
    """A server on an address without the kubernetes block (another port, or a `bind` of its
    own), as CoreDNS runs one per address: its server blocks by zone, each query down its
    block's chain, REFUSED where no block's zone holds the name. It answers through a
    responder whose `Blocks` hold no zones of its own, so that its caches and templates never
    answer (serve/blocks.py); its queries are counted with `prometheus` in one of its blocks
    and logged with `log`, as CoreDNS's."""

    def __init__(
        self, config: ServeConfig, address: ListenOptions, resolver: ResolverConfig
    ) -> None:
        self.address = address
        #: The port it is bound to, once it is (port 0 picks one).
        self.port = address.port
        self.resolver = resolver
        blocks = config.servers()[address]
        counted = config.serves_metrics and any("prometheus" in b.plugins for b in blocks)
        self.metrics = QueryMetrics(self.label()) if counted else None
        self.logged = config.log.enabled and any("log" in b.plugins for b in blocks)
        #: Where its first block is written, for messages.
        self.place = blocks[0].place
        self.forwarders, self.handlers, self.responder = self.build(config)
        self.screen: Screen | None = None  # `acl` is the kubernetes block's
        self.udp: list[UdpProtocol] = []

    def build(self, config: ServeConfig) -> tuple[list[Forwarder | None], list[Handler], Responder]:
        """Its blocks' forwarders, their plugins' handlers, and the responder that routes to
        their chains."""
        forwarders, blocks, handlers = make_blocks(config, self.label, self.lookup, self.address)
        count_forward_caches(forwarders, self.metrics)
        responder = Responder(
            self.resolver,
            Snapshot(),
            metrics=self.metrics,
            cache_max_bytes=0,  # nothing is cached: no answer is the responder's own
            max_udp_size=config.bufsize.size,
            blocks=blocks,
        )
        return forwarders, handlers, responder

    def label(self) -> str:
        """The `server` label of its metrics: its address, as CoreDNS's."""
        return server_label(self.address.host, self.port)

    def lookup(self, data: bytes, transport: Transport, source: str) -> Reply:
        """A query asked of this whole server, as CoreDNS's upstream.Lookup asks the server
        that received the query."""
        return self.responder.respond(data, transport, source)

    def reconfigure(self, config: ServeConfig) -> tuple[list[Forwarder | None], list[Handler]]:
        """Answer by the blocks `config` has for this address from the next query on; the
        forwarders and handlers it replaced."""
        replaced = self.forwarders, self.handlers
        self.forwarders, self.handlers, self.responder = self.build(config)
        for protocol in self.udp:
            protocol.use(self.responder)
        return replaced

    def started(self, port: int) -> None:
        """Bound to `port`: its metrics say so."""
        self.port = port
        if self.metrics is not None:
            self.metrics.server = self.label()


class DnsServer:
    """One process's DNS server, as the single process and each worker of `--workers N` run
    it: the responder over the data, the forwarder, the query metrics, UDP and TCP on the
    kubernetes block's port; and a `PortServer` for each other address server blocks are on."""

    def __init__(self, config: ServeConfig, resolver: ResolverConfig, snapshot: Snapshot) -> None:
        self.config = config
        #: The label of this server's metrics (listen.py `server_label`), once its port is
        #: bound.
        self.server = ""
        self.forwarder = make_forwarder(config)
        self.block_forwarders, self.blocks, self.block_handlers = make_blocks(
            config, self.label, self.lookup
        )
        #: The servers of the other addresses, in the configuration's order.
        self.others = [PortServer(config, address, resolver) for address in config.servers()]
        #: The kubernetes block's plugins that CoreDNS runs before `kubernetes`, and their chain.
        self.front_handlers = self.make_front(config)
        #: The tasks running the plugins' `watch` (a hosts file's reload), once serving.
        self.watching: list[asyncio.Task[None]] = []
        self.metrics = QueryMetrics(self.label()) if config.serves_metrics else None
        count_forward_caches([self.forwarder, *self.block_forwarders], self.metrics)
        self.responder = self.respond_by(config, resolver, snapshot)
        if self.metrics is not None:  # read off whichever responder serves when scraped
            self.metrics.cache_entries = lambda: self.responder.cache_entries()
        self.screen = screen_of(config)
        self.udp: list[UdpProtocol] = []
        #: The queries every forwarder of every block has on their way upstream, and the loop
        #: probes: one guard, as a query one block forwards may come back through another.
        self.loops = LoopGuard()
        self.guard_loops()
        #: Forwarders a reload replaced, until their queries are done.
        self.retiring: set[asyncio.Task[None]] = set()

    def respond_by(
        self, config: ServeConfig, resolver: ResolverConfig, snapshot: Snapshot
    ) -> Responder:
        """A responder by `config`, over this server's forwarder and metrics."""
        return Responder(
            resolver,
            snapshot,
            config.toposdns.ecs_trust + config.toposdns.ecs_trust_services,
            self.forwarder,
            self.metrics,
            config.loadbalance.round_robin,
            config.autopath,
            cache_bounds(config)[0],
            config.bufsize.size,
            not config.any.minimal,
            config.cache,
            self.blocks,
            self.front_handlers,
        )

    def forwarders(self) -> list[Forwarder]:
        """The forwarders of every server block, on every port."""
        others = [forwarder for other in self.others for forwarder in other.forwarders]
        found = [self.forwarder, *self.block_forwarders, *others]
        return [forwarder for forwarder in found if forwarder is not None]

    def guard_loops(self) -> None:
        """Give every forwarder this server's one `LoopGuard`."""
        for forwarder in self.forwarders():
            forwarder.loops = self.loops

    def label(self) -> str:
        """The `server` label of this server's metrics."""
        return self.server or server_label(self.config.bind.host, self.config.bind.port)

    def lookup(self, data: bytes, transport: Transport, source: str) -> Reply:
        """A query asked of this whole server, as CoreDNS's upstream.Lookup asks it: how a
        plugin follows a CNAME it answered with."""
        return self.responder.respond(data, transport, source)

    def make_front(self, config: ServeConfig) -> list[Handler]:
        """The handlers of the kubernetes block's plugins that the server makes (rewrite,
        template, hosts, and the `cache` that caps their replies); the responder links them
        with its own (any, loadbalance, autopath, kubernetes, forward) into the block's chain."""
        handlers: list[Handler] = []
        rewrite = make_rewrite(config.rewrite, config.block_zones)
        if rewrite is not None:
            handlers.append(rewrite)
        template = make_template(config.template, config.block_zones, self.label, self.lookup)
        if template is not None:
            handlers.append(template)
        hosts = make_hosts(config.hosts, config.block_zones)
        if hosts is not None:
            # What it answers comes before the cached replies of the kubernetes block's names.
            hosts.on_change = self.front_changed
            handlers.append(hosts)
        if handlers and (cache := capping(config.cache)) is not None:
            handlers.append(cache)  # the first replies of those plugins, as its cache caps them
        handlers.sort(key=lambda handler: ORDER.index(handler.name))
        return handlers

    def front_changed(self) -> None:
        """A plugin before `kubernetes` answers differently now: no cached reply holds."""
        self.responder.clear()

    def watch_plugins(self) -> None:
        """Run the `watch` of every plugin handler that has one (a hosts file's reload) from
        now until the server closes, those of handlers a reload replaced stopped."""
        for task in self.watching:
            task.cancel()
        self.watching = [
            asyncio.create_task(watched(handler), name=f"{handler.name} watch")
            for handler in self.handlers()
            if hasattr(handler, "watch")
        ]

    def handlers(self) -> list[Handler]:
        """The plugin handlers of every server block, on every port."""
        return [
            *self.front_handlers,
            *self.block_handlers,
            *(handler for other in self.others for handler in other.handlers),
        ]

    def reconfigure(self, config: ServeConfig) -> list[str]:
        """Answer by `config` from the next query on, with the same sockets (so that none is
        lost), data and metrics; the forwarder is new if its settings changed, the old one
        closed once its queries are done. Returns the plugins whose changes need a restart."""
        old = self.config
        config, restart = restart_only(config, old)
        replaced: list[Handler] = []
        if (old.forward, old.cache, old.blocks) != (config.forward, config.cache, config.blocks):
            retired = [self.forwarder, *self.block_forwarders]
            replaced += self.block_handlers
            self.forwarder = make_forwarder(config)
            self.block_forwarders, self.blocks, self.block_handlers = make_blocks(
                config, self.label, self.lookup
            )
            for other in self.others:  # the same addresses: a change of them waits
                forwarders, handlers = other.reconfigure(config)
                retired += forwarders
                replaced += handlers
            count_forward_caches([self.forwarder, *self.block_forwarders], self.metrics)
            self.guard_loops()
            for forwarder in retired:
                if forwarder is not None:  # closed once the queries it has are done
                    task = asyncio.create_task(self.retire(forwarder))
                    self.retiring.add(task)
                    task.add_done_callback(self.retiring.discard)
        # The front's plugins, and the cache that caps their replies' TTLs.
        front = (config.hosts, config.template, config.rewrite, config.cache, config.block_zones)
        if (old.hosts, old.template, old.rewrite, old.cache, old.block_zones) != front:
            replaced += self.front_handlers
            self.front_handlers = self.make_front(config)
        if replaced:
            self.replaced(replaced)
        previous = self.responder
        resolver = replace(config.kubernetes, ns_addresses=previous.config.ns_addresses)
        self.responder = self.respond_by(config, resolver, previous.snapshot)
        self.responder.topology_counts = previous.topology_counts  # counts go on
        self.screen = screen_of(config, self.server)
        for protocol in self.udp:
            protocol.use(self.responder)
            protocol.screen = self.screen
        self.config = config
        return restart

    def replaced(self, handlers: list[Handler]) -> None:
        """Handlers a reload replaced: their watches stopped, their series dropped (those of
        the new ones set again, in case they share them)."""
        for handler in handlers:
            if isinstance(handler, Hosts):
                handler.forget()
        for handler in self.handlers():
            if isinstance(handler, Hosts):
                handler.report()
        if self.server:  # serving: the new handlers' watches replace the old ones'
            self.watch_plugins()

    async def retire(self, forwarder: Forwarder) -> None:
        """Close a forwarder a reload replaced, once its queries are done."""
        try:
            await asyncio.sleep(FORWARD_BUDGET)
        finally:
            await forwarder.close()

    async def close(self) -> None:
        """Stop the plugins' watches; close the forwarders: the current one, and those a reload
        replaced."""
        for task in [*self.retiring, *self.watching]:
            task.cancel()
        await asyncio.gather(*self.retiring, *self.watching, return_exceptions=True)
        others = [forwarder for other in self.others for forwarder in other.forwarders]
        for forwarder in [self.forwarder, *self.block_forwarders, *others]:
            if forwarder is not None:
                await forwarder.close()

    def register(self, stack: contextlib.AsyncExitStack) -> None:
        """Count this server's queries in the answering metrics (metrics.py `ANSWERING`, which
        /metrics serves, or a worker sends whole), until the stack closes."""
        if self.metrics is None:
            return
        # One collector for every port's: a registry takes each metric name from one only.
        others = [other.metrics for other in self.others if other.metrics is not None]
        for collector in (AllServers([self.metrics, *others]), self.responder.topology_counts):
            ANSWERING.register(collector)
            stack.callback(ANSWERING.unregister, collector)

    def serving(self) -> Serving:
        """What answers come from right now (for /explain)."""
        return self.responder.snapshot, self.responder.config, self.config.autopath

    async def start(
        self,
        stack: contextlib.AsyncExitStack,
        port: int,
        reuse_port: bool = False,
        ports: dict[ListenOptions, int] | None = None,
    ) -> int:
        """Bind the DNS port, and each other address's (to the port `ports` gives it, else
        its own), with `reuse_port` shared with other workers, and answer on them until the
        stack closes; returns the DNS port. OSError names the other address that failed."""
        stack.push_async_callback(self.close)
        config = self.config
        tcp = config.tcp
        # One cap on TCP connections for every port, as open files are shared out for one.
        limits = TcpLimits(tcp.max_connections, tcp.idle_timeout, tcp.read_timeout)
        bound = [bind_pair(family_of(config.bind.host), config.bind.host, port, reuse_port)]
        try:
            for other in self.others:
                given = (ports or {}).get(other.address)
                bound.append(bind_address(other.address, given, other.place, reuse_port))
        except OSError:
            for pair in bound:
                for sock in pair:
                    sock.close()
            raise
        port = await serve_dns(self, limits, *bound[0], stack, config, config.log.enabled)
        for other, pair in zip(self.others, bound[1:], strict=True):
            other.started(await serve_dns(other, limits, *pair, stack, config, other.logged))
        # The label CoreDNS gives the server of the kubernetes block.
        server = self.server = server_label(config.bind.host, port)
        self.screen = screen_of(config, server)
        for protocol in self.udp:
            protocol.screen = self.screen
        if self.metrics is not None:
            self.metrics.server = server
        self.watch_plugins()
        return port

    def ports(self) -> dict[ListenOptions, int]:
        """The port each other address is bound to, by the address configured."""
        return {other.address: other.port for other in self.others}


class Answering(Protocol):
    """Who answers DNS while `run_server` runs the rest: this process (`InProcess`), or the
    workers of `--workers N` (workers/supervisor.py `Supervisor`)."""

    #: The configuration answers follow now (a reload changes it).
    config: ServeConfig

    @property
    def builder(self) -> StoreBuilder | None:
        """The store builder the cluster's source fills (None: the source's own)."""
        ...

    @property
    def exposition(self) -> Callable[[], Awaitable[bytes]] | None:
        """/metrics' text, when it is not the process's own registry."""
        ...

    def current(self) -> Snapshot:
        """The data answered from (or, once applied, to be)."""
        ...

    def publish(self, snapshot: Snapshot) -> None:
        """Answer from a new snapshot."""
        ...

    def not_ready(self) -> str | None:
        """/ready: None when ready, else what is not."""
        ...

    def serving(self) -> Serving:
        """What /explain answers from."""
        ...

    async def start(self, source: KubeSource | None) -> int:
        """Answer on the DNS port, and on every other address server blocks are on; the DNS
        port."""
        ...

    def ports(self) -> dict[ListenOptions, int]:
        """The port each other address of server blocks is bound to, by the address
        configured."""
        ...

    def check_loops(self, server: str) -> None:
        """Start CoreDNS's `loop` check through the upstreams, if there are any."""
        ...

    def reconfigure(self, config: ServeConfig) -> list[str]:
        """Answer by a reloaded configuration; the settings that wait for a restart."""
        ...

    async def stop(self) -> None:
        """Answer for the lameduck, then stop (at once on a second signal)."""
        ...

    def described(self) -> str:
        """How many answer, for the "serving DNS" line ("" for this process)."""
        ...


async def run_server(
    config: ServeConfig,
    corefile: Corefile | None,
    answerer: Callable[[Lifecycle], Answering],
) -> None:
    """Serve until SIGTERM or SIGINT, then answer for the lameduck period: the source, the HTTP
    endpoints, the reports on the data, `reload` (with `corefile`, its path and how to read it)
    and the lameduck here, the DNS port by the `Answering` that `answerer` makes. The one
    assembly of a DNS server, in one process or with workers.

    Raises SnapshotError or ConnectError when the data cannot be had at all.
    """
    read_bytes = None if corefile is None else corefile_bytes(corefile[0])
    async with Lifecycle() as life:
        dns = answerer(life)
        if config.upstreams:
            log.info("forwarding other names to %s", ", ".join(map(str, config.upstreams)))

        def publish(snapshot: Snapshot) -> None:
            report_invalid_policies(dns.current(), snapshot)
            SOURCE_SYNCED.set(snapshot.synced)
            report_conflicts(dns.current(), snapshot)
            report_ignored(dns.current(), snapshot)
            dns.publish(snapshot)

        def reconfigure(new: ServeConfig) -> None:
            report_restart(dns.reconfigure(new))
            report_server(dns.config, port, dns.ports())

        synced = lambda: dns.current().synced  # noqa: E731
        source = await start_source(config, life, publish, synced, dns.builder)
        await start_http(config, life.stack, dns.not_ready, dns.serving, dns.exposition)
        # Signals are ours before the port is announced, so that a signal sent right after
        # the "serving" line is never Python's default KeyboardInterrupt.
        life.catch_signals()
        log.info("%s", cache_budget(config))
        port = await dns.start(source)
        log.info(
            "serving DNS on %s:%d (udp, tcp) for %s%s",
            config.bind.host,
            port,
            zones(config),
            dns.described(),
        )
        # Then each other address, as CoreDNS starts a server per address.
        for address, bound in dns.ports().items():
            blocks = config.servers()[address]
            served = ", ".join(name_text(zone) for block in blocks for zone in block.zones)
            log.info(
                "serving DNS on %s:%d (udp, tcp) for %s%s",
                address.host,
                bound,
                served,
                dns.described(),
            )
        report_server(config, port, dns.ports())
        dns.check_loops(f"{config.bind.host}:{port}")
        if corefile is not None and config.reload.enabled:
            path, read = corefile
            watch = watch_corefile(path, read_bytes, lambda: dns.config.reload, read, reconfigure)
            life.start(watch, "reload", ending=False)
        await life.main_loop()
        # Lameduck, as CoreDNS's health plugin: /ready fails so that endpoints drop this pod,
        # while queries already on their way are still answered.
        log.info("shutting down: answering for %gs more (lameduck)", dns.config.health.lameduck)
        await dns.stop()
        log.info("stopped")


async def serve(config: ServeConfig, corefile: Corefile | None = None) -> None:
    """Serve in this process (the supervisor of `--workers N` runs a `DnsServer` in each
    worker instead): `run_server` with the answers `InProcess`."""
    await run_server(config, corefile, lambda life: InProcess(config, life))


class InProcess:
    """DNS answered in this process, by one `DnsServer`."""

    def __init__(self, config: ServeConfig, life: Lifecycle) -> None:
        self.config = config
        self.life = life
        self.builder: StoreBuilder | None = None
        self.exposition: Callable[[], Awaitable[bytes]] | None = None
        snapshot = Snapshot(synced=config.snapshot.path is not None)
        self.dns = DnsServer(config, answering(config), snapshot)
        self.dns.register(life.stack)

    def current(self) -> Snapshot:
        return self.dns.responder.snapshot

    def publish(self, snapshot: Snapshot) -> None:
        self.dns.responder.update(snapshot)

    def not_ready(self) -> str | None:
        if self.life.stopping:
            return "Shutting down"
        return None if self.current().synced else "kubernetes"

    def serving(self) -> Serving:
        return self.dns.serving()

    async def start(self, source: KubeSource | None) -> int:
        return await self.dns.start(self.life.stack, self.config.bind.port)

    def ports(self) -> dict[ListenOptions, int]:
        return self.dns.ports()

    def check_loops(self, server: str) -> None:
        probes = loop_probes(self.config)
        if probes:
            # CoreDNS's `loop`: a probe through each upstream must not come back here.
            check = self.dns.loops.check(probes, server)
            self.life.start(check, "loop check", ending=False)

    def reconfigure(self, config: ServeConfig) -> list[str]:
        waiting = self.dns.reconfigure(config)
        self.config = self.dns.config
        return waiting

    async def stop(self) -> None:
        await self.life.lameduck(self.config.health.lameduck)

    def described(self) -> str:
        return ""


#: The settings that say where and from what the server serves, by the name a reload's
#: warning gives them: (plugin, field; "" for all its options). A reload keeps them as they
#: are until a restart; the rest applies at once. The addresses server blocks listen on beside
#: the kubernetes block's (`BLOCK_ADDRESSES`, `ServeConfig.servers`) are one of them: when
#: they change, every block is kept as it runs, each a part of the server it is on.
RESTART_ONLY: dict[str, tuple[str, str]] = {
    "snapshot": ("snapshot", ""),
    "kubeconfig and startup_timeout": ("cluster", ""),
    "bind and port": ("bind", ""),
    "tcp": ("tcp", ""),
    "health address": ("health", "address"),
    "ready address": ("ready", "address"),
    "prometheus address": ("prometheus", "address"),
    "workers": ("toposdns", "workers"),
    "http": ("toposdns", "http"),
    "explain": ("toposdns", "explain"),
    "udp_batch": ("toposdns", "udp_batch"),
    "log": ("log", ""),  # the frontends are chosen at startup
    # The store believes the locators of these namespaces from the first it holds.
    "locator_namespaces": ("toposdns", "locator_namespaces"),
    # What a cluster's watch holds (WATCHED): EndpointSlices at all, the endpoints' pod names.
    "noendpoints": ("kubernetes", "noendpoints"),
    "endpoint_pod_names": ("kubernetes", "endpoint_pod_names"),
    # Last: the blocks' addresses follow the kubernetes block's, as kept above.
    "server block ports": ("blocks", "addresses"),
}
BLOCK_ADDRESSES = RESTART_ONLY["server block ports"]
#: Those that only wait when watching a cluster: a snapshot file's data holds everything.
WATCHED = ("noendpoints", "endpoint_pod_names")


def restart_only(config: ServeConfig, running: ServeConfig) -> tuple[ServeConfig, list[str]]:
    """`config` as a reload applies it over the `running` one: the settings of where it serves
    kept as they run, and the names of those that changed (they wait for a restart)."""
    waiting = []
    for name, (plugin, attribute) in RESTART_ONLY.items():
        if name in WATCHED and running.snapshot.path is not None:
            continue
        options, kept = getattr(config, plugin), getattr(running, plugin)
        if (plugin, attribute) == BLOCK_ADDRESSES:
            if config.servers().keys() == running.servers().keys():
                continue
        elif attribute:
            if getattr(options, attribute) == getattr(kept, attribute):
                continue
            kept = replace(options, **{attribute: getattr(kept, attribute)})
        elif options == kept:
            continue
        waiting.append(name)
        config = replace(config, **{plugin: kept})
    return config, waiting


def report_restart(plugins: list[str]) -> None:
    """Say once which reloaded settings wait for a restart (they say where to serve)."""
    if plugins:
        log.warning(
            "reload: %s changed; these apply when toposdns restarts, the rest applies now",
            ", ".join(plugins),
        )


def answering(config: ServeConfig) -> ResolverConfig:
    """The answer options, with this server's own addresses for apex NS answers."""
    return replace(config.kubernetes, ns_addresses=own_addresses(config.bind.host))


def screen_of(config: ServeConfig, server: str = "") -> Screen | None:
    """CoreDNS's `acl` for the frontends; None without one."""
    if not config.acl.policies:
        return None
    return Acl(config.acl, server or server_label(config.bind.host, config.bind.port)).screen


def loop_probes(config: ServeConfig) -> list[tuple[Name, Upstream]]:
    """Each upstream CoreDNS's `loop` would send its probe through, with the zone the probe is
    under: the kubernetes block's (the root's) and every other server block's on every port
    (the block's first zone), as CoreDNS runs `loop` in each block."""
    found: list[tuple[Name, Upstream]] = [((), up) for up in loop_checked(config.forward)]
    for block in config.blocks:
        zone = block.zones[0] if block.zones else ()
        found += [(zone, upstream) for upstream in loop_checked(block.forward, zone)]
    return found


def make_forwarder(config: ServeConfig) -> Forwarder | None:
    """The forwarder to the upstreams, if there are any."""
    if not config.upstreams:
        return None
    cache = replace(config.cache, max_bytes=cache_bounds(config)[1])
    return forwarder_for(config.forward, cache)


def count_forward_caches(
    forwarders: Sequence[Forwarder | None], metrics: QueryMetrics | None
) -> None:
    """Count what these forward caches do (prefetches, stale replies, evictions) in a server's
    metrics, which go on across reloads."""
    if metrics is None:
        return
    for forwarder in forwarders:
        if forwarder is not None:
            forwarder.cache.counts = metrics.forward_counts


def make_blocks(
    config: ServeConfig,
    server: Callable[[], str] = lambda: "dns://:53",
    lookup: Callable[[bytes, Transport, str], Reply] | None = None,
    address: ListenOptions | None = None,
) -> tuple[list[Forwarder | None], Blocks | None, list[Handler]]:
    """The forwarders of the server blocks beside the kubernetes one on its address (or on
    another `address`), the blocks of that address (None when the kubernetes block is its
    only one, for `.`), and their plugins' handlers (`server` and `lookup`: what they label
    their metrics with and ask the server by)."""
    if address is None:
        blocks, main = config.port_blocks, config.block_zones
        if not blocks and main == ((),):
            return [], None, []
    else:
        blocks, main = config.servers()[address], ()
    bound = cache_bounds(config)[1]
    allow = config.forward.allow
    forwarders = [block_forwarder(block, bound, allow) for block in blocks]
    links: list[tuple[BlockConfig, Next]] = []
    handlers: list[Handler] = []
    for block, forwarder in zip(blocks, forwarders, strict=True):
        link, chained = block_chain(block, forwarder, server, lookup)
        links.append((block, link))
        handlers += chained
    return forwarders, Blocks(main, links), handlers


async def watched(handler: Handler) -> None:
    """A plugin handler's `watch`, run until cancelled; a fault in it is logged once."""
    try:
        await handler.watch()  # type: ignore[attr-defined]
    except Exception:
        log.exception("%s: its watch failed and has stopped; the rest keeps serving", handler.name)


def cache_bounds(config: ServeConfig) -> tuple[int, int]:
    """The bytes each DNS process's reply cache and each forward cache may hold: as set, else
    their shares of the container's memory limit, split between the workers (serve/cache.py);
    the forward caches' share is split between the server blocks."""
    bounds = config.cache_bounds
    workers = config.workers
    forward = bounds.forward_max_bytes or default_max_bytes(
        FORWARD_SHARE, workers, FORWARD_MAX_BYTES
    )
    return (
        bounds.max_bytes or default_max_bytes(MEMORY_SHARE, workers, DEFAULT_MAX_BYTES),
        forward // (1 + len(config.blocks)),
    )


def cache_budget(config: ServeConfig) -> str:
    """What each DNS process's caches may hold, and where that comes from, in a line."""
    replies, forwarded = cache_bounds(config)
    bounds, limit = config.cache_bounds, container_memory_limit()
    if bounds.max_bytes and bounds.forward_max_bytes:
        source = "as set"
    else:
        if limit is None:
            source = "no container memory limit: the defaults"
        else:
            source = f"from the container's memory limit of {limit / 2**20:.0f} MiB"
        if bounds.max_bytes or bounds.forward_max_bytes:
            source += " where not set"
    return (
        f"caches: in-zone replies up to {replies / 2**20:.1f} MiB, each forward cache up to "
        f"{forwarded / 2**20:.1f} MiB, per DNS process ({source})"
    )


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
    if config.snapshot.path is not None:
        files = SnapshotFileSource(
            config.snapshot.path,
            publish,
            max_bytes=config.snapshot.max_bytes,
            locator_namespaces=config.toposdns.locator_namespaces,
        )
        publish(files.load())
        gc.freeze()  # the data lives long: the cyclic collector need not walk it again and again
        life.start(files.watch(), "source")
        return None
    api_client = await connect(config.cluster.kubeconfig)
    life.stack.push_async_callback(api_client.close)
    # Listed objects live as long as the data: freeze what survives each page, so the
    # cyclic collector does not scan it again and again in a big sync.
    source = KubeSource(
        apis_of(api_client),
        publish,
        on_page=gc.freeze,
        builder=StoreBuilder(config.toposdns.locator_namespaces) if builder is None else builder,
        endpoints=not config.kubernetes.noendpoints,
        pod_names=config.kubernetes.endpoint_pod_names,
    )
    task = life.start(source.run(), "source")
    # Nor collect at all until the first sync: the records are acyclic, and a sync of 175,000
    # objects spent an eighth of its time in collections that found nothing to free.
    gc.disable()
    try:
        await _wait_for_sync(synced, task, config.cluster.startup_timeout)
    finally:
        gc.enable()
    return source


async def start_http(
    config: ServeConfig,
    stack: contextlib.AsyncExitStack,
    not_ready: Callable[[], str | None],
    serving: Callable[[], Serving],
    exposition: Callable[[], Awaitable[bytes]] | None = None,
) -> None:
    """Serve the HTTP endpoints on the addresses the configuration gives, until the stack
    closes. An address that cannot be bound raises OSError with it as `filename`."""
    http = HttpServer(not_ready, serving, exposition)
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
    return ", ".join(name_text(zone) for zone in config.kubernetes.zones)


async def _wait_for_sync(
    synced: Callable[[], bool], task: asyncio.Task[None], timeout: float
) -> None:
    """Like CoreDNS, wait up to `timeout` for the first full sync, then serve anyway."""
    deadline = time.monotonic() + timeout
    while not synced() and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.05)
    if not synced():
        log.warning("starting with unsynced Kubernetes data: names not found get SERVFAIL")


def family_of(host: str) -> socket.AddressFamily:
    """The address family of a host to listen on."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_address(
    address: ListenOptions,
    port: int | None = None,
    place: str = "",
    reuse_port: bool = False,
    listen: bool = True,
) -> tuple[socket.socket, socket.socket]:
    """UDP and TCP bound to an address of server blocks beside the kubernetes block's (to
    `port`, else its own); OSError names the address, and `place`, where its blocks are."""
    host = address.host
    try:
        return bind_pair(
            family_of(host), host, address.port if port is None else port, reuse_port, listen
        )
    except OSError as exc:
        where = f"{address} (the server block at {place})" if place else str(address)
        raise OSError(exc.errno, exc.strerror, where) from None


async def serve_dns(
    dns: DnsServer | PortServer,
    limits: TcpLimits,
    udp_sock: socket.socket,
    tcp_sock: socket.socket,
    stack: contextlib.AsyncExitStack,
    config: ServeConfig,
    logged: bool,
) -> int:
    """Answer on a bound UDP socket and a listening TCP socket, with `dns`'s responder as it
    is at each datagram and connection, until the stack closes (`logged`: with `log`'s
    frontends); returns their port."""
    loop = asyncio.get_running_loop()
    kind, stream = (UDP6, TCP6) if udp_sock.family == socket.AF_INET6 else (UDP4, TCP4)
    connection: Callable[[], TcpProtocol]
    if logged:  # the logging frontends; without `log`, the plain ones
        query_log = QueryLog(config.log)
        protocol: UdpProtocol = LoggedUdpProtocol(dns.responder, kind, query_log)
        connection = lambda: LoggedTcpProtocol(  # noqa: E731
            dns.responder, limits, stream, query_log, dns.screen
        )
    else:
        protocol = UdpProtocol(dns.responder, kind)
        connection = lambda: TcpProtocol(dns.responder, limits, stream, dns.screen)  # noqa: E731
    protocol.screen = dns.screen
    if udp_batch.wanted(config.toposdns.udp_batch):
        batched = udp_batch.BatchedUdp(protocol, udp_sock)
        batched.start(loop)
        stack.callback(batched.close, loop)
    else:
        udp, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=udp_sock)
        stack.callback(udp.close)
    dns.udp.append(protocol)
    tcp = await loop.create_server(connection, sock=tcp_sock, backlog=1024)
    stack.push_async_callback(tcp.wait_closed)
    stack.callback(tcp.close)
    return int(udp_sock.getsockname()[1])


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)
