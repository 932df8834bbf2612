"""A worker of `toposdns serve --workers N`: forked by the supervisor, it answers DNS on the
port the workers share and applies the changes the supervisor sends.

A worker starts with the supervisor's data as it was at the fork (copy-on-write memory, never
sent), binds the DNS port (and each other port of server blocks) with SO_REUSEPORT, and says
`Serving`. After that it reads the
supervisor's messages in order: changes to replay on its copy of the store builder (so its
caches drop only what a change touched, as in one process), whole snapshots, metric scrapes,
and `Stop`. It takes no signals: SIGTERM and SIGINT go to the supervisor, which tells the
workers; when the supervisor's end of the socket closes (it is gone), the worker exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from toposdns.config import ServeConfig
from toposdns.lifecycle import Lifecycle
from toposdns.metrics import ANSWERING
from toposdns.resolve.resolver import ResolverConfig
from toposdns.serve.listen import ListenOptions
from toposdns.serve.upstream import Upstream
from toposdns.server import DnsServer, run
from toposdns.store.builder import StoreBuilder
from toposdns.store.journal import JournaledBuilder, replay
from toposdns.store.snapshot import Snapshot
from toposdns.workers.messages import (
    Applied,
    Changes,
    Families,
    Looped,
    Message,
    Reconfigure,
    Replace,
    Scrape,
    Serving,
    Stop,
    frame,
    receive,
)

log = logging.getLogger("toposdns")

#: Signals the supervisor takes (and tells its workers about).
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


@dataclass(frozen=True)
class Start:
    """What a worker starts from: inherited at the fork, never sent."""

    slot: int
    config: ServeConfig
    resolver: ResolverConfig
    port: int
    #: The ports of the other addresses of server blocks, by address (the supervisor's
    #: reservations, which every worker binds).
    ports: dict[ListenOptions, int]
    snapshot: Snapshot
    #: The cluster's store builder (its copy of the supervisor's); None for a snapshot file.
    builder: StoreBuilder | None
    #: Forwarding loop probes the supervisor sends, to know them when they come back here.
    probes: dict[bytes, Upstream]


def fork_worker(start: Start, channel: socket.socket) -> int:
    """Fork a worker that serves from `start` and talks on `channel`; returns its pid."""
    # The objects the worker inherits stay where they are: the cyclic collector, which would
    # write to each of them (and so copy every page), leaves frozen objects alone.
    gc.freeze()
    # Until the worker has set up its own signal handling, a signal must wait.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            _become_worker(start, channel)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return pid


def _become_worker(start: Start, channel: socket.socket) -> NoReturn:
    """The forked child: leave the supervisor's event loop and sockets behind, serve, exit."""
    code = 1
    try:
        # The supervisor's loop wakes up on this file when a signal comes: not ours to write.
        signal.set_wakeup_fd(-1)
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        # Python 3.11 still sees the supervisor's loop as running in this thread after a fork
        # (3.12 resets it itself): without this, a new loop refuses to run.
        asyncio.events._set_running_loop(None)
        _release_inherited_sockets(keep=channel.fileno())
        _label_log_lines(f"worker {start.slot}: ")
        run(work(start, channel))
        code = 0
    except OSError as exc:
        log.error("cannot serve DNS: %s", exc)
    except BaseException:
        log.exception("failed")
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        # Never the supervisor's cleanup (atexit, its `finally` blocks): only its process may.
        os._exit(code)


def _release_inherited_sockets(keep: int) -> None:
    """Point every socket inherited from the supervisor at /dev/null: its listeners, its
    connections to the API server, the other workers' channels, the DNS port it reserved.

    So that each really closes when the supervisor closes it (the API server sees a
    connection end, a worker whose supervisor is gone sees its channel end, the reserved port
    stops taking queries), and that nothing here can use them. Their numbers stay taken, so an
    object of the supervisor's that closes one some day closes /dev/null. Only sockets: the
    event loop library keeps pipes of its own, which it re-creates after a fork.
    """
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd <= 2 or fd in (keep, null):
                continue
            with contextlib.suppress(OSError):  # the listing's own descriptor is gone
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


def _label_log_lines(prefix: str) -> None:
    """Begin this process's log lines with `prefix`, so that each says which worker wrote it."""

    def label(record: logging.LogRecord) -> bool:
        record.msg = prefix + str(record.msg)
        return True

    log.addFilter(label)


async def work(start: Start, channel: socket.socket) -> None:
    """Answer DNS on the shared port and follow the supervisor, until told to stop."""
    config = start.config
    dns = DnsServer(config, start.resolver, start.snapshot)
    reader, writer = await asyncio.open_unix_connection(sock=channel)

    def send(message: Message) -> None:
        writer.write(frame(message))

    if isinstance(start.builder, JournaledBuilder):
        start.builder.journal = None  # it replays the supervisor's journal, and notes nothing
    async with Lifecycle() as life:
        life.stack.callback(writer.close)
        dns.loops.probes.update(start.probes)
        dns.loops.on_probe = lambda question: send(Looped(question))
        dns.register(life.stack)
        await dns.start(life.stack, start.port, reuse_port=True, ports=start.ports)
        send(Serving())
        follow = _follow(reader, send, dns, start.builder, life)
        following = life.start(follow, "supervisor")
        await life.main_loop()
        if following.done():
            log.warning("the supervisor is gone; stopping")
        else:
            await life.lameduck(config.health.lameduck)


async def _follow(
    reader: asyncio.StreamReader,
    send: Callable[[Message], None],
    dns: DnsServer,
    builder: StoreBuilder | None,
    life: Lifecycle,
) -> None:
    """Do what the supervisor says, in order, until it closes its end."""
    while (message := await receive(reader)) is not None:
        if isinstance(message, Changes):
            assert builder is not None, "changes come only from the cluster's source"
            replay(builder, message.operations)
            dns.responder.update(builder.snapshot(message.serial, message.synced))
            send(Applied(message.batch))
        elif isinstance(message, Replace):
            dns.responder.update(message.snapshot)
            send(Applied(message.batch))
        elif isinstance(message, Reconfigure):
            dns.reconfigure(message.config)
        elif isinstance(message, Scrape):
            send(Families(message.request, list(ANSWERING.collect())))
        elif isinstance(message, Stop):
            life.stop(now=message.now)
