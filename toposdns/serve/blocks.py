"""The server blocks of one port, and the chains of the blocks beside the kubernetes one.

A Corefile may hold several server blocks on a port, each for its zones (its keys:
`consul.local:53 { forward . 10.0.0.10 }` is a stub domain), and blocks on other ports. As
CoreDNS's dnsserver, each port (with its address) is a server of its own, which gives a query
to the block whose zone is the longest suffix of its name (`.` last), and REFUSED when no
block's zone holds it; a DS question goes to the parent's block when its name is a block's
zone itself, as the delegation's parent answers DS (RFC 4035 section 3.1.4.1).

The kubernetes server block is the responder's (serve/responder.py): its caches and fast paths
in front, then its own chain (kubernetes, forward and the plugins around them); `Blocks.find`
tells it which queries are that block's (None) and hands the others to their block's chain
(serve/chain.py), built here from the block's options in CoreDNS's plugin order.
On a port without the kubernetes block, the `Blocks` have no zones of the responder's own:
every query goes down a block's chain, or is REFUSED.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from toposdns.options import Network
from toposdns.serve.chain import ORDER, Handler, Next, Reply, chain
from toposdns.serve.forward import Forwarder, Forwarding, ForwardOptions, forwarder_for
from toposdns.serve.forward_cache import CacheSettings, cache_off, capping
from toposdns.serve.hosts import HostsOptions, make_hosts
from toposdns.serve.query_metrics import DROPPED
from toposdns.serve.rewrite import RewriteOptions, make_rewrite
from toposdns.serve.template import TemplateOptions, make_template
from toposdns.serve.transport import Transport
from toposdns.wire.codes import DS, Name
from toposdns.wire.records import name_text

log = logging.getLogger("toposdns")


@dataclass(frozen=True, slots=True)
class BlockConfig:
    """A server block without the kubernetes plugin: its zones and its plugins' options."""

    #: The block's keys' zones, lower case.
    zones: tuple[Name, ...]
    #: Where its keys are written (`file:line`), for messages.
    place: str = ""
    forward: ForwardOptions = field(default_factory=lambda: ForwardOptions(upstreams=()))
    #: CoreDNS's `cache` as the block sets it (off when it has none).
    cache: CacheSettings = field(default_factory=cache_off)
    hosts: HostsOptions = field(default_factory=HostsOptions)
    template: TemplateOptions = field(default_factory=TemplateOptions)
    rewrite: RewriteOptions = field(default_factory=RewriteOptions)
    #: The port of its keys; None: the kubernetes block's (a stub domain beside it).
    port: int | None = None
    #: Its own `bind` address; None: the kubernetes block's.
    bind: str | None = None
    #: Its plugins that CoreDNS's chain holds (`bind` is not one), in CoreDNS's order: what
    #: `coredns_plugin_enabled` reports, and on a port of its own whether that port's queries
    #: are counted (`prometheus`) and logged (`log`).
    plugins: tuple[str, ...] = ()


class Blocks:
    """The server blocks of one port, by zone: the kubernetes block's zones lead to None (the
    responder answers), every other block's to its chain."""

    def __init__(self, main: Sequence[Name], others: Sequence[tuple[BlockConfig, Next]]) -> None:
        #: The kubernetes block's zones (none on a port without it).
        self.main = tuple(main)
        self.by_zone: dict[Name, Next | None] = {zone: None for zone in main}
        for config, link in others:
            for zone in config.zones:
                self.by_zone[zone] = link
        #: Each zone as the metrics' `zone` label writes it.
        self.texts = {zone: name_text(zone) for zone in self.by_zone}
        #: The zones of the blocks without `prometheus`, whose queries CoreDNS does not count.
        self.uncounted = frozenset(
            self.texts[zone]
            for config, _ in others
            if "prometheus" not in config.plugins
            for zone in config.zones
        )

    def find(self, name: Name, qtype: int) -> tuple[Name, Next | None] | None:
        """The zone of the block that answers `name`, and its chain (None: the kubernetes
        block's); None when no block holds the name (REFUSED)."""
        lowered = tuple(label.lower() for label in name)
        found: tuple[Name, Next | None] | None = None
        for start in range(len(lowered) + 1):
            zone = lowered[start:]
            if zone in self.by_zone:
                if found is None:
                    found = (zone, self.by_zone[zone])
                    if not (qtype == DS and start == 0 and zone):
                        return found
                else:  # a DS question for a block's own zone: its parent's block answers
                    return (zone, self.by_zone[zone])
        return found

    def zone_label(self, name: Name, qtype: int) -> str:
        """The `zone` label of a query for `name`: the zone of the block it goes to, as
        CoreDNS's `metrics` in that block matches it; `dropped` when no block holds it (the
        server refuses it before any block, and CoreDNS counts it so)."""
        found = self.find(name, qtype)
        return DROPPED if found is None else self.texts[found[0]]

    def mine(self, name: Name, qtype: int) -> bool:
        """True if the kubernetes block answers `name`."""
        found = self.find(name, qtype)
        return found is not None and found[1] is None

    def holds_whole(self, zones: Sequence[Name]) -> bool:
        """True if the kubernetes block answers every name of these zones: each is its, and
        no other block's zone lies inside one (the responder's templates may then answer
        for the zones without asking which block a name is)."""
        if not self.main:  # a port without the kubernetes block: every name is a chain's
            return False
        others = [zone for zone, link in self.by_zone.items() if link is not None]
        return all(self.mine(zone, 0) for zone in zones) and not any(
            other[len(other) - len(zone) :] == zone for zone in zones for other in others
        )


def block_forwarder(
    config: BlockConfig, cache_max_bytes: int, allow: tuple[Network, ...] = ()
) -> Forwarder | None:
    """The block's forwarder, with its cache bounded to `cache_max_bytes` and the sources it
    forwards for (`--forward-allow`, the server's); None without one."""
    settings = replace(config.cache, max_bytes=cache_max_bytes)
    return forwarder_for(replace(config.forward, allow=allow), settings)


def block_chain(
    config: BlockConfig,
    forwarder: Forwarder | None,
    server: Callable[[], str] = lambda: "dns://:53",
    lookup: Callable[[bytes, Transport, str], Reply] | None = None,
) -> tuple[Next, list[Handler]]:
    """The block's plugins linked in CoreDNS's order (`chain.ORDER`), and their handlers (the
    server runs the `watch` of those that have one). `server` is the metrics' server label,
    `lookup` how a plugin asks the whole server a query."""
    handlers: list[Handler] = []
    rewrite = make_rewrite(config.rewrite, config.zones)
    if rewrite is not None:
        handlers.append(rewrite)
    template = make_template(config.template, config.zones, server, lookup)
    if template is not None:
        handlers.append(template)
    hosts = make_hosts(config.hosts, config.zones)
    if hosts is not None:
        handlers.append(hosts)
    if handlers and (cache := capping(config.cache)) is not None:
        handlers.append(cache)
    if forwarder is not None:
        handlers.append(Forwarding(forwarder))
    handlers.sort(key=lambda handler: ORDER.index(handler.name))
    return chain(handlers), handlers
