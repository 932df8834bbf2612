"""Open files: the descriptors a `serve` process may hold, shared out so that a flood of one
kind of work cannot take those another needs.

The limit is per process (each worker of `--workers N` has its own); the soft limit is first
raised to the hard one, as Go programs such as CoreDNS do at start. `RESERVE` descriptors are
kept for what a process holds besides: listeners, the HTTP server and its clients, the API
connection, health probes, logs. The rest is for forwarded queries (one socket each at a time)
and TCP clients (one each); when `--max-concurrent` and `--tcp-max-connections` allow more than
that, both are lowered in proportion. A forwarding flood then meets REFUSED at its bound, never
"Too many open files" on the DNS listeners. One line at start says what each got.
"""

from __future__ import annotations

import contextlib
import logging
import resource
from dataclasses import replace

from toposdns.config import ServeConfig

log = logging.getLogger("toposdns")

RESERVE = 64


def fit_open_files(config: ServeConfig) -> ServeConfig:
    """Raise the soft limit on open files to the hard one; the configuration with forwarded
    queries and TCP connections bounded to fit under it (logged)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    forwarding = config.forward.max_concurrent if config.upstreams else 0
    tcp = config.tcp.max_connections
    if soft == resource.RLIM_INFINITY:
        log.info("open files: no limit")
        return config
    fitted_forwarding, fitted_tcp = share(soft - RESERVE, forwarding, tcp)
    what = f"at most {fitted_forwarding} forwarded queries and " if forwarding else "at most "
    line = (
        f"open files: limit {soft}; {what}{fitted_tcp} TCP connections at once, "
        f"{RESERVE} kept for listeners, HTTP and the API"
    )
    if (fitted_forwarding, fitted_tcp) == (forwarding, tcp):
        log.info("%s", line)
        return config
    asked = f"--max-concurrent {forwarding} and " if forwarding else ""
    log.warning(
        "%s (lowered from %s--tcp-max-connections %d: raise the limit, ulimit -n, for more)",
        line,
        asked,
        tcp,
    )
    return replace(
        config,
        forward=replace(config.forward, max_concurrent=fitted_forwarding or forwarding or 1),
        tcp=replace(config.tcp, max_connections=fitted_tcp),
    )


def share(available: int, forwarding: int, tcp: int) -> tuple[int, int]:
    """(forwarded queries, TCP connections) that fit in `available` descriptors: as asked if
    they fit, else lowered in proportion to what was asked, at least one each."""
    if forwarding + tcp <= available:
        return forwarding, tcp
    fitted_tcp = max(1, available * tcp // (forwarding + tcp))
    fitted_forwarding = max(1, available - fitted_tcp) if forwarding else 0
    return fitted_forwarding, fitted_tcp
