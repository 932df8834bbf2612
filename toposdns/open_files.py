"""Open files: the descriptors a `serve` process may hold, shared out so that a flood of one
kind of work cannot take those another needs.

The limit is per process (each worker of `--workers N` has its own); the soft limit is first
raised to the hard one, as Go programs such as CoreDNS do at start. `RESERVE` descriptors are
kept for what a process holds besides: listeners, the HTTP server and its clients, the API
connection, health probes, logs; and the idle TCP and TLS connections every forwarder may keep
to its upstreams (serve/connections.py `MAX_IDLE` each, unless `expire 0`). The rest is for
forwarded queries (one socket each at a time, at most `max_concurrent` per forwarder: the
kubernetes block's and every other server block's) and TCP clients (one each); when those
bounds allow more than that, they are all lowered in proportion. A forwarding flood then meets
REFUSED at its bound, never "Too many open files" on the DNS listeners. One line at start
says what each got.
"""

from __future__ import annotations

import contextlib
import logging
import resource
from dataclasses import dataclass, replace

from toposdns.config import ServeConfig
from toposdns.serve.connections import MAX_IDLE
from toposdns.serve.forward import ForwardOptions

log = logging.getLogger("toposdns")

RESERVE = 64


@dataclass(frozen=True, slots=True)
class Fitted:
    """What `fit` made of a configuration under a limit."""

    config: ServeConfig
    #: Forwarded queries at once, over every forwarder, and TCP connections.
    forwarding: int
    tcp: int
    #: Idle upstream connections the forwarders may keep.
    idle: int
    #: Whether the configuration asked for more than fits.
    lowered: bool


def fit_open_files(config: ServeConfig) -> ServeConfig:
    """Raise the soft limit on open files to the hard one; the configuration with forwarded
    queries and TCP connections bounded to fit under it (logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        log.info("open files: no limit")
        return config
    fitted = fit(config, soft)
    asked = sum(options.max_concurrent for options in forwards(config))
    what = f"at most {fitted.forwarding} forwarded queries and " if asked else "at most "
    line = (
        f"open files: limit {soft}; {what}{fitted.tcp} TCP connections at once, "
        f"{RESERVE + fitted.idle} kept for listeners, HTTP, the API"
        f"{' and idle upstream connections' if fitted.idle else ''}"
    )
    if not fitted.lowered:
        log.info("%s", line)
        return fitted.config
    blocks = len(forwards(config))
    given = "--max-concurrent" if blocks == 1 else f"max_concurrent of {blocks} forwarders"
    log.warning(
        "%s (lowered from %s--tcp-max-connections %d: raise the limit, ulimit -n, for more)",
        line,
        f"{given} {asked} and " if asked else "",
        config.tcp.max_connections,
    )
    return fitted.config


def forwards(config: ServeConfig) -> list[ForwardOptions]:
    """The options of every forwarder a process runs: the kubernetes block's, and each other
    server block's that forwards."""
    found = [config.forward] if config.upstreams else []
    return found + [block.forward for block in config.blocks if block.forward.upstreams]


def idle_connections(options: ForwardOptions) -> int:
    """The idle connections a forwarder may keep: `MAX_IDLE` per upstream, none with
    `expire 0`."""
    return MAX_IDLE * len(options.upstreams or ()) if options.expire > 0 else 0


def fit(config: ServeConfig, limit: int) -> Fitted:
    """The configuration with every forwarder's `max_concurrent` and the TCP connections
    lowered in proportion, at least one each, so that they fit in `limit` descriptors with the
    reserve and the forwarders' idle connections; as it is when they fit."""
    options = forwards(config)
    forwarding = sum(forward.max_concurrent for forward in options)
    tcp = config.tcp.max_connections
    idle = sum(idle_connections(forward) for forward in options)
    fitted_forwarding, fitted_tcp = share(limit - RESERVE - idle, forwarding, tcp)
    if (fitted_forwarding, fitted_tcp) == (forwarding, tcp):
        return Fitted(config, forwarding, tcp, idle, False)

    def bounded(forward: ForwardOptions) -> ForwardOptions:
        if not forward.upstreams:
            return forward
        concurrent = max(1, forward.max_concurrent * fitted_forwarding // forwarding)
        return replace(forward, max_concurrent=concurrent)

    blocks = tuple(replace(block, forward=bounded(block.forward)) for block in config.blocks)
    fitted = replace(
        config,
        forward=bounded(config.forward),
        tcp=replace(config.tcp, max_connections=fitted_tcp),
        blocks=blocks,
    )
    given = sum(forward.max_concurrent for forward in forwards(fitted))
    return Fitted(fitted, given, fitted_tcp, idle, True)


def share(available: int, forwarding: int, tcp: int) -> tuple[int, int]:
    """(forwarded queries, TCP connections) that fit in `available` descriptors: as asked if
    they fit, else lowered in proportion to what was asked, at least one each."""
    if forwarding + tcp <= available:
        return forwarding, tcp
    available = max(available, 0)
    fitted_tcp = max(1, available * tcp // (forwarding + tcp))
    fitted_forwarding = max(1, available - fitted_tcp) if forwarding else 0
    return fitted_forwarding, fitted_tcp
