"""CoreDNS's `reload`: the Corefile is read again every interval, and a changed one applied.

The check compares the file's bytes (a ConfigMap update swaps the whole file, through a
symlink), as CoreDNS compares its Corefile's hash. A changed Corefile is applied only once it
has stayed the same for `SETTLE` seconds, as the snapshot file waits a poll
(source/snapshot_file.py): a file written in place, in steps, would otherwise be applied half
written (an `acl` block not yet there lets everyone in until the next check). CoreDNS applies
what it reads. A settled Corefile is read in full first; if it is broken, one line names its
file and line, `coredns_reload_failed_total` counts it, and the running configuration keeps
serving. Otherwise the server applies it without closing its DNS sockets (server.py
`DnsServer.reconfigure`), so no query is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from toposdns.metrics import RELOAD_FAILED, RELOAD_VERSION
from toposdns.options import ConfigError, Origin, Plugin, Setting, duration_value

log = logging.getLogger("toposdns")

#: CoreDNS's bounds: the interval at least 2 s, the jitter 0 or at least 1 s.
MIN_INTERVAL = 2.0
MIN_JITTER = 1.0
#: A changed Corefile is applied once it reads the same this many seconds later: longer than a
#: pause between the steps of a file written in place, short beside the 30 s interval.
SETTLE = 5.0


@dataclass(frozen=True, slots=True)
class ReloadOptions:
    """`reload [INTERVAL [JITTER]]`: check the Corefile every INTERVAL, give or take half of
    JITTER (at most half the interval)."""

    enabled: bool = False
    interval: float = 30.0
    jitter: float = 15.0


def _reload(options: ReloadOptions, words: Sequence[str], origin: Origin) -> ReloadOptions:
    if len(words) > 2:
        raise origin.error("expected at most INTERVAL and JITTER, e.g. reload 30s 15s")
    interval = duration_value(words[0], origin) if words else options.interval
    if interval < MIN_INTERVAL:
        raise origin.error(f"the interval must be at least {MIN_INTERVAL:g}s")
    jitter = duration_value(words[1], origin) if len(words) > 1 else options.jitter
    if 0 < jitter < MIN_JITTER:
        raise origin.error(f"the jitter must be 0 or at least {MIN_JITTER:g}s")
    return replace(options, enabled=True, interval=interval, jitter=min(jitter, interval / 2))


RELOAD: Plugin[ReloadOptions] = Plugin("reload", ReloadOptions, (Setting("", _reload),))


def fingerprint(data: bytes) -> str:
    """The Corefile's hash, as `coredns_reload_version_info` shows it."""
    return hashlib.sha512(data).hexdigest()


async def watch_corefile(
    path: Path,
    last: bytes | None,
    options: Callable[[], ReloadOptions],
    read: Callable[[], Any],
    apply: Callable[[Any], None],
) -> None:
    """Every interval (as the running configuration has it), read the Corefile; when its bytes
    differ from `last` (those of the running configuration) and read the same again `SETTLE`
    seconds later, `read()` it in full and `apply` what it gives, or log and count why not."""
    RELOAD_VERSION.labels("sha512", fingerprint(last or b"")).set(1)
    settling: bytes | None = None  # a change seen, to be read again after SETTLE
    while True:
        if settling is None:
            current = options()
            spread = (
                random.uniform(-current.jitter / 2, current.jitter / 2) if current.jitter else 0
            )
            await asyncio.sleep(current.interval + spread)
        else:
            await asyncio.sleep(SETTLE)
        data = corefile_bytes(path)
        if data is None or data == last:
            settling = None
            continue
        if data != settling:
            settling = data  # changed since the last read: it may still be being written
            continue
        settling = None
        try:
            config = read()
        except ConfigError as exc:
            config = exc
        if corefile_bytes(path) != data:
            continue  # written again while it was read: what was read may be half of it
        last = data
        if isinstance(config, ConfigError):
            RELOAD_FAILED.inc()
            log.error("reload: the Corefile is not applied, the running one goes on: %s", config)
            continue  # said once: the next change is tried again
        RELOAD_VERSION.clear()
        RELOAD_VERSION.labels("sha512", fingerprint(data)).set(1)
        apply(config)
        log.info("reload: applied the changed Corefile %s", path)


def corefile_bytes(path: Path) -> bytes | None:
    """The file's bytes now, or None if it cannot be read (a swap under way): not a change."""
    try:
        return path.read_bytes()
    except OSError:
        return None
