"""The server's configuration: one frozen options object per plugin, read from flags or a
Corefile through the same settings.

Each plugin's options and `Plugin` table live next to its code (the kubernetes answers in
resolve/resolver.py, `forward` in serve/forward.py, ...); this module lists them, holds
toposdns's own settings, and builds the one `ServeConfig` the server runs from. `Reading` is
that build: it starts from every plugin's defaults, takes settings one at a time (from flags in
cli.py, or from a Corefile in corefile.py) and checks them together at the end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from toposdns.kube.names import is_dns_label
from toposdns.options import (
    ConfigError,
    Network,
    Origin,
    Plugin,
    Setting,
    address,
    choice,
    integer,
    networks,
    sets,
)
from toposdns.reload import RELOAD, ReloadOptions
from toposdns.resolve.autopath import AUTOPATH, AutopathOptions
from toposdns.resolve.client import TrustedService
from toposdns.resolve.resolver import KUBERNETES, ResolverConfig
from toposdns.serve.acl import ACL, AclOptions
from toposdns.serve.any import ANY_PLUGIN, AnyOptions
from toposdns.serve.blocks import BlockConfig
from toposdns.serve.cache import CACHE_BOUNDS, CacheBoundOptions
from toposdns.serve.forward import FORWARD, ForwardOptions, Upstream, resolv_conf_upstreams
from toposdns.serve.forward_cache import CACHE, CacheSettings
from toposdns.serve.hosts import HOSTS, HostsOptions
from toposdns.serve.http import (
    HEALTH,
    PROMETHEUS,
    READY,
    HealthOptions,
    PrometheusOptions,
    ReadyOptions,
)
from toposdns.serve.listen import BIND, ListenOptions
from toposdns.serve.loadbalance import LOADBALANCE, LoadbalanceOptions
from toposdns.serve.query_log import LOG, LogOptions
from toposdns.serve.rewrite import REWRITE, RewriteOptions
from toposdns.serve.tcp import TCP, TcpOptions
from toposdns.serve.template import TEMPLATE, TemplateOptions
from toposdns.source.kube import CLUSTER, ClusterOptions
from toposdns.source.snapshot_file import SNAPSHOT, SnapshotOptions
from toposdns.store.placement import EVERY_NAMESPACE
from toposdns.wire.codes import Name
from toposdns.wire.encode import BUFSIZE, BufsizeOptions
from toposdns.workers.cpus import usable_cpus

__all__ = ["ConfigError", "PLUGINS", "Reading", "ServeConfig", "ToposdnsOptions"]

#: The most worker processes `--workers` takes.
MAX_WORKERS = 1024
#: Where the manifests run the controller, which writes every PodLocator there.
CONTROLLER_NAMESPACE = "toposdns"


def services(words: Sequence[str], origin: Origin) -> tuple[TrustedService, ...]:
    """Services as NAMESPACE/NAME."""
    found = []
    for word in words:
        namespace, _, name = word.partition("/")
        if not (is_dns_label(namespace) and is_dns_label(name)):
            raise origin.error(f"{word!r} is not NAMESPACE/NAME, e.g. kube-system/coredns")
        found.append(TrustedService(namespace, name))
    return tuple(found)


def locator_namespaces(words: Sequence[str], origin: Origin) -> frozenset[str]:
    """Namespaces whose PodLocators are believed, or `*` for every one."""
    if not words:
        raise origin.error(f"expected a namespace, e.g. {CONTROLLER_NAMESPACE}")
    for word in words:
        if word != EVERY_NAMESPACE and not is_dns_label(word):
            raise origin.error(
                f"{word!r} is not a namespace name (or {EVERY_NAMESPACE}: every namespace), "
                f"e.g. {CONTROLLER_NAMESPACE}, the controller's"
            )
    return frozenset(words)


@dataclass(frozen=True, slots=True)
class ToposdnsOptions:
    """toposdns's own settings, the Corefile's `toposdns` block."""

    #: Forwarders whose EDNS Client Subnet is believed (none by default).
    ecs_trust: tuple[Network, ...] = ()
    #: Services whose ready endpoints are believed too, as they change.
    ecs_trust_services: tuple[TrustedService, ...] = ()
    #: The namespaces whose PodLocators place clients and endpoints: the controller's, where
    #: it writes them all and where nobody else may write; "*": every namespace.
    locator_namespaces: frozenset[str] = frozenset({CONTROLLER_NAMESPACE})
    #: Processes answering DNS; above 1, a supervisor runs the source and forks them.
    #: None: one per CPU this process may use.
    workers: int | None = None
    #: /health, /ready, /explain and /metrics on one address, for local use; None: off.
    http: tuple[str, int] | None = None
    #: /explain tells where every client is placed: only on an address given for it.
    explain: tuple[str, int] | None = None
    #: "on": UDP read and answered in batches (recvmmsg, sendmmsg) where the C extension is
    #: built; "off": the event loop's datagram transport, two system calls per query.
    udp_batch: str = "on"


TOPOSDNS: Plugin[ToposdnsOptions] = Plugin(
    "toposdns",
    ToposdnsOptions,
    (
        Setting(
            "ecs_trust",
            sets("ecs_trust", networks),
            "--ecs-trust",
            "CIDR[,CIDR]",
            "take the client address from EDNS Client Subnet when the query comes from these "
            "networks, e.g. the CoreDNS pods that forward to toposdns (default: none)",
        ),
        Setting(
            "ecs_trust_service",
            sets("ecs_trust_services", services),
            "--ecs-trust-service",
            "NS/NAME[,NS/NAME]",
            "also take it from the ready endpoints of these Services, as they change, e.g. "
            "kube-system/coredns: only those pods' addresses are trusted (default: none)",
        ),
        Setting(
            "locator_namespaces",
            sets("locator_namespaces", locator_namespaces),
            "--locator-namespaces",
            "NS[,NS]|*",
            "believe the PodLocators of these namespaces only, where the controller writes "
            "them (it writes all of them in its own), and ignore any other's; *: every "
            "namespace, for clusters where whoever may write one is trusted to place any "
            "client (default {default})",
            shows="locator_namespaces",
        ),
        Setting(
            "workers",
            sets("workers", integer(1, MAX_WORKERS, "2")),
            "--workers",
            "N",
            "answer DNS in N processes sharing the port, fed by one source (default: the CPUs "
            "this process may use: its CPU affinity and cgroup CPU limit; 1: a single process)",
        ),
        Setting(
            "http",
            sets("http", address(8080)),
            "--http",
            "HOST:PORT",
            "serve /health, /ready, /explain and /metrics here, for local use (default: off)",
        ),
        Setting(
            "explain",
            sets("explain", address(8080)),
            "--explain",
            "HOST:PORT",
            "serve /explain, where clients and endpoints are placed, here: keep it private "
            "(default: off)",
        ),
        Setting(
            "udp_batch",
            sets("udp_batch", choice("on", "off")),
            "--udp-batch",
            "on|off",
            "read UDP queries and send their replies in batches, a system call for up to 32 "
            "(recvmmsg, sendmmsg); off: one call per datagram each way (default: on)",
        ),
    ),
)

#: Every plugin's options, in the order their flags are listed and applied.
PLUGINS: tuple[Plugin[Any], ...] = (
    SNAPSHOT,
    CLUSTER,
    TOPOSDNS,
    BIND,
    KUBERNETES,
    AUTOPATH,
    FORWARD,
    CACHE,
    CACHE_BOUNDS,
    BUFSIZE,
    ANY_PLUGIN,
    LOADBALANCE,
    HEALTH,
    READY,
    PROMETHEUS,
    TCP,
    RELOAD,
    ACL,
    LOG,
    HOSTS,
    TEMPLATE,
    REWRITE,
)
#: The plugins a server block without kubernetes may hold (serve/blocks.py); `bind` only on a
#: port of its own.
BLOCK_PLUGINS: tuple[Plugin[Any], ...] = (FORWARD, CACHE, HOSTS, TEMPLATE, REWRITE, BIND)
#: The plugins `toposdns explain` takes: those that change answers (of toposdns's own
#: settings, which PodLocators are believed).
LOCATOR_TRUST: Plugin[ToposdnsOptions] = Plugin(
    TOPOSDNS.name,
    ToposdnsOptions,
    tuple(s for s in TOPOSDNS.settings if s.word == "locator_namespaces"),
)
ANSWER_PLUGINS: tuple[Plugin[Any], ...] = (KUBERNETES, AUTOPATH, LOCATOR_TRUST)


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `toposdns serve` runs from: a field per plugin, named as the plugin."""

    snapshot: SnapshotOptions = field(default_factory=SnapshotOptions)
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    toposdns: ToposdnsOptions = field(default_factory=ToposdnsOptions)
    bind: ListenOptions = field(default_factory=ListenOptions)
    kubernetes: ResolverConfig = field(default_factory=ResolverConfig)
    autopath: AutopathOptions = field(default_factory=AutopathOptions)
    forward: ForwardOptions = field(default_factory=ForwardOptions)
    cache: CacheSettings = field(default_factory=CacheSettings)
    cache_bounds: CacheBoundOptions = field(default_factory=CacheBoundOptions)
    bufsize: BufsizeOptions = field(default_factory=BufsizeOptions)
    any: AnyOptions = field(default_factory=AnyOptions)
    loadbalance: LoadbalanceOptions = field(default_factory=LoadbalanceOptions)
    health: HealthOptions = field(default_factory=HealthOptions)
    ready: ReadyOptions = field(default_factory=ReadyOptions)
    prometheus: PrometheusOptions = field(default_factory=PrometheusOptions)
    tcp: TcpOptions = field(default_factory=TcpOptions)
    reload: ReloadOptions = field(default_factory=ReloadOptions)
    acl: AclOptions = field(default_factory=AclOptions)
    log: LogOptions = field(default_factory=LogOptions)
    hosts: HostsOptions = field(default_factory=HostsOptions)
    template: TemplateOptions = field(default_factory=TemplateOptions)
    rewrite: RewriteOptions = field(default_factory=RewriteOptions)
    #: The kubernetes server block's zones, its keys (`.` unless a Corefile says otherwise).
    block_zones: tuple[Name, ...] = ((),)
    #: The other server blocks: beside it on its port (stub domains), or on ports of their own.
    blocks: tuple[BlockConfig, ...] = ()

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        """Where names outside the zones go (none: refused)."""
        return self.forward.upstreams or ()

    def block_address(self, block: BlockConfig) -> ListenOptions:
        """Where a server block beside the kubernetes one listens: its port and `bind`, or
        the kubernetes block's where it has none."""
        port = self.bind.port if block.port is None else block.port
        return ListenOptions(block.bind or self.bind.host, port)

    @property
    def port_blocks(self) -> tuple[BlockConfig, ...]:
        """The server blocks on the kubernetes block's address (stub domains), which its
        responder routes."""
        return tuple(block for block in self.blocks if self.block_address(block) == self.bind)

    def servers(self) -> dict[ListenOptions, tuple[BlockConfig, ...]]:
        """The servers beside the kubernetes block's, as CoreDNS's (one per address): each
        address server blocks listen on other than its, with those blocks, in the order the
        configuration first names them."""
        found: dict[ListenOptions, tuple[BlockConfig, ...]] = {}
        for block in self.blocks:
            address = self.block_address(block)
            if address != self.bind:
                found[address] = (*found.get(address, ()), block)
        return found

    @property
    def workers(self) -> int:
        """Processes answering DNS."""
        return self.toposdns.workers or 1

    def http_listeners(self) -> list[tuple[tuple[str, int], set[str]]]:
        """Each HTTP address to listen on, with the paths served there: the endpoints given
        one address share a listener (but port 0 picks a new port each time)."""
        given = (
            (self.toposdns.http, ("/health", "/ready", "/explain", "/metrics")),
            (self.health.address, ("/health",)),
            (self.ready.address, ("/ready",)),
            (self.toposdns.explain, ("/explain",)),
            (self.prometheus.address, ("/metrics",)),
        )
        listeners: list[tuple[tuple[str, int], set[str]]] = []
        for where, paths in given:
            if where is None:
                continue
            same = [have for at, have in listeners if at == where and where[1] != 0]
            if same:
                same[0].update(paths)
            else:
                listeners.append((where, set(paths)))
        return listeners

    @property
    def serves_metrics(self) -> bool:
        """Whether some address serves /metrics (queries are counted only then)."""
        return self.toposdns.http is not None or self.prometheus.address is not None


class Reading:
    """A configuration being read: every plugin's options, from their defaults, changed one
    setting at a time; `done()` checks them together and gives the `ServeConfig`."""

    def __init__(self, plugins: Sequence[Plugin[Any]] = PLUGINS) -> None:
        self.plugins = plugins
        self.options: dict[str, Any] = {plugin.name: plugin.default() for plugin in plugins}
        #: Where each plugin was last set, for the checks made at the end.
        self.origins: dict[str, Origin] = {}
        #: The kubernetes server block's zones, and the blocks beside it (a Corefile's).
        self.block_zones: tuple[Name, ...] = ((),)
        self.blocks: list[BlockConfig] = []

    def apply(
        self, plugin: Plugin[Any], setting: Setting[Any], words: Sequence[str], origin: Origin
    ) -> None:
        """One setting, as given at `origin`."""
        self.options[plugin.name] = setting.apply(self.options[plugin.name], words, origin)
        self.origins.setdefault(plugin.name, origin)

    def read_flags(self, given: Mapping[str, Any]) -> Reading:
        """The flags given, by flag (`--ttl`): a value, a list of them (a repeated flag), True
        (a switch) or None (not given). Each applies in the order of its plugin's settings."""
        for plugin in self.plugins:
            for setting in plugin.settings:
                value = given.get(setting.flag) if setting.flag else None
                if value is None or value is False:
                    continue
                values = value if isinstance(value, list) else [value]
                values = [None if item is True else item for item in values]
                if setting.repeat == "join":
                    words = [w for item in values for w in setting.words_of_flag(item)]
                    text = ",".join(item or "" for item in values)
                    self.apply(plugin, setting, words, Origin(setting.flag, text))
                    continue
                for item in values:
                    origin = Origin(setting.flag, "" if item is None else item)
                    self.apply(plugin, setting, setting.words_of_flag(item), origin)
        return self

    def finished(self) -> dict[str, Any]:
        """Each plugin's options after its checks between settings."""
        return {
            plugin.name: plugin.finish(
                self.options[plugin.name], self.origins.get(plugin.name, Origin(plugin.name))
            )
            for plugin in self.plugins
        }

    def done(self) -> ServeConfig:
        """The server's configuration, checked; defaults that depend on other plugins filled."""
        config = ServeConfig(
            **self.finished(), block_zones=self.block_zones, blocks=tuple(self.blocks)
        )
        if config.forward.upstreams is None:
            # A snapshot is a closed world: a demo or a test must not reach out.
            found = () if config.snapshot.path is not None else tuple(resolv_conf_upstreams())
            config = replace(config, forward=replace(config.forward, upstreams=found))
        if config.toposdns.workers is None:
            workers = min(usable_cpus(), MAX_WORKERS)
            config = replace(config, toposdns=replace(config.toposdns, workers=workers))
        return config


def answer_options(
    given: Mapping[str, Any],
) -> tuple[ResolverConfig, AutopathOptions, frozenset[str]]:
    """The answer options (`toposdns explain`'s), from flags as `Reading.read_flags` takes
    them: the resolver's, autopath's, and the namespaces whose PodLocators are believed."""
    options = Reading(ANSWER_PLUGINS).read_flags(given).finished()
    trust: ToposdnsOptions = options[LOCATOR_TRUST.name]
    return options[KUBERNETES.name], options[AUTOPATH.name], trust.locator_namespaces
