"""The supervisor of `toposdns serve --workers N`: one source, N workers, one --http port.

- **startup**: the source starts (the snapshot file loaded, or the cluster listed, waiting up
  to --startup-timeout as one process does); --http is served; the DNS port is reserved, and
  the port of every other address server blocks are on (bound with SO_REUSEPORT and not
  listening, so that port 0 becomes a port every worker binds, and a port that cannot be bound
  stops startup before any worker is forked); then
  the workers are forked, after the data is loaded, so that they start with it in copy-on-write
  memory. Once each says it serves, the reservation is closed and the port announced.
- **a first sync later than --startup-timeout**: the workers were forked before it, and each
  received the rest of the data as changes (a copy each, in place of shared pages). They
  answer from the synced data as soon as they have applied it, and /ready waits for that. Then
  each is replaced, one at a time, by a worker forked from the synced data (which shares it
  copy-on-write): the successor serves first, and only then does the old one leave through its
  lameduck, still applying every change; so /ready stays 200 and no answer comes from older
  data than the supervisor's.
- **main loop**: each change the source publishes goes to every worker, in order: the store
  builder's journal of changes for the cluster, the whole snapshot for a reloaded file. A worker
  that ends is logged and forked again from the data as it is then; one that keeps ending soon
  after its start is forked again after a delay that doubles each time (1 s up to
  `MAX_BACKOFF`), one line per restart, and /ready names it meanwhile. /ready is OK once the data
  has synced and every worker serves the latest change; /metrics sums the workers' metrics and
  the supervisor's own; /explain answers from the supervisor's data, the same as the workers'.
- **shutdown**: /ready fails at once; the workers are told to stop and go on answering for
  --lameduck seconds; the supervisor exits when all have. A second signal stops them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from prometheus_client import REGISTRY, Metric, generate_latest

from toposdns.config import ServeConfig
from toposdns.lifecycle import Lifecycle
from toposdns.metrics import WORKER_RESTARTS
from toposdns.serve import http, udp_batch
from toposdns.serve.listen import ListenOptions, bind_pair
from toposdns.serve.loop import LoopGuard, loop_error
from toposdns.serve.upstream import Upstream
from toposdns.server import (
    Corefile,
    answering,
    bind_address,
    family_of,
    loop_probes,
    restart_only,
    run_server,
)
from toposdns.source.kube import KubeSource
from toposdns.store.journal import JournaledBuilder
from toposdns.store.snapshot import Snapshot
from toposdns.workers.exposition import Sum, sample_total
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
from toposdns.workers.worker import Start, fork_worker

log = logging.getLogger("toposdns")

#: How long the workers may take to bind the port at startup.
START_TIMEOUT = 10.0
#: A worker that ends sooner than `STABLE` after its start is forked again only after a delay:
#: this long the first time, doubled each time it ends that soon again, up to MAX_BACKOFF.
RESTART_DELAY = 1.0
MAX_BACKOFF = 32.0
STABLE = 30.0
#: How long a /metrics scrape waits for the workers; a late one counts with its last figures.
SCRAPE_TIMEOUT = 2.0
#: How long a worker may take past the lameduck to exit before it is killed.
EXIT_GRACE = 5.0
#: A worker that lets this many bytes of changes queue up unread is stuck: it is killed (and
#: forked again from the current data).
MAX_UNREAD = 256 * 1024 * 1024


class WorkerError(Exception):
    """The workers could not be started."""


@dataclass(eq=False)
class Worker:
    """The supervisor's side of one worker process."""

    slot: int
    pid: int
    writer: asyncio.StreamWriter
    started: float
    #: The last batch of changes it serves.
    applied: int
    serving: bool = False
    killed: bool = False
    #: Being replaced by a worker forked from the first synced data (`Supervisor.renew`): it
    #: answers until its successor serves, then leaves through its lameduck.
    renewing: bool = False
    #: Told to stop (it answers through its lameduck, and is not forked again).
    stopped: bool = False
    #: Its metric families as of the last scrape it answered.
    families: list[Metric] = field(default_factory=list)
    scrapes: dict[int, asyncio.Future[list[Metric]]] = field(default_factory=dict)

    def send(self, data: bytes) -> None:
        """Queue a framed message; kill the worker if it has stopped reading."""
        self.writer.write(data)
        if self.writer.transport.get_write_buffer_size() > MAX_UNREAD and not self.killed:
            log.error("worker %d (pid %d) reads no more changes; killing it", self.slot, self.pid)
            self.kill()

    def kill(self) -> None:
        """SIGKILL: its channel closes, and it is reaped (and forked again) as any that died."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


async def supervise(config: ServeConfig, corefile: Corefile | None = None) -> None:
    """Run the source once and `config.workers` worker processes, until SIGTERM or SIGINT;
    with `corefile` and `reload` on, apply the Corefile to them all when it changes: the
    server's one assembly (`run_server`), its DNS answered by the workers."""
    await run_server(config, corefile, lambda life: Supervisor(config, life))


class Supervisor:
    """The workers, fed by the source and summed on /metrics."""

    def __init__(self, config: ServeConfig, life: Lifecycle) -> None:
        self.config = config
        self.resolver = answering(config)
        self.life = life
        #: What every worker serves, or will once it has applied the last batch.
        self.current_snapshot = Snapshot(synced=config.snapshot.path is not None)
        self.builder = (
            JournaledBuilder(config.toposdns.locator_namespaces)
            if config.snapshot.path is None
            else None
        )
        self.exposition: Callable[[], Awaitable[bytes]] | None = self.summed
        self.source: KubeSource | None = None
        self.batch = 0
        self.port = config.bind.port
        #: The ports reserved for the other addresses of server blocks, by address.
        self.other_ports: dict[ListenOptions, int] = {}
        self.workers: dict[int, Worker] = {}
        #: Workers being replaced by the one of their slot in `workers` (`renew`).
        self.renewed: set[Worker] = set()
        #: Slots waiting to be forked again after a crash: (delay, monotonic time of the fork).
        self.backoff: dict[int, tuple[float, float]] = {}
        self.started = False
        self.failure: str | None = None
        #: Set when a worker starts serving or ends.
        self.changed = asyncio.Event()
        #: What workers that ended had counted, so that sums never go backwards.
        self.retired = Sum()
        self.requests = itertools.count(1)
        self.loops = LoopGuard()
        self.probes: dict[bytes, Upstream] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def current(self) -> Snapshot:
        return self.current_snapshot

    def serving(self) -> http.Serving:
        """/explain answers from the supervisor's data, the same as the workers'."""
        return self.current_snapshot, self.resolver, self.config.autopath

    def described(self) -> str:
        return f" ({self.config.workers} workers)"

    async def start(self, source: KubeSource | None) -> int:
        """Fork the workers on ports reserved for them all (the DNS port, and each other
        address's), once each serves; the DNS port."""
        config = self.config
        self.source = source
        reserved: list[socket.socket] = []
        try:
            host = config.bind.host
            reserved += bind_pair(family_of(host), host, config.bind.port, True, listen=False)
            self.port = int(reserved[0].getsockname()[1])
            for address, blocks in config.servers().items():
                pair = bind_address(address, None, blocks[0].place, True, listen=False)
                reserved += pair
                self.other_ports[address] = int(pair[0].getsockname()[1])
            udp_batch.wanted(config.toposdns.udp_batch)  # warns here once, not in each worker
            self.life.stack.push_async_callback(self.end_workers)
            self.probes = {
                self.loops.probe(upstream, zone): upstream for zone, upstream in loop_probes(config)
            }
            for slot in range(1, config.workers + 1):
                await self.spawn(slot)
            await self.until_serving()
        finally:
            for sock in reserved:
                sock.close()
        self.started = True
        return self.port

    def ports(self) -> dict[ListenOptions, int]:
        return dict(self.other_ports)

    def check_loops(self, server: str) -> None:
        if self.probes:
            # CoreDNS's `loop`: the probes go out from here; the worker one comes back to says
            # so (a `Looped` message).
            check = self.loops.send_probes(self.probes, server)
            self.life.start(check, "loop check", ending=False)

    async def stop(self) -> None:
        await self.stop_workers()

    # ----- the data

    def publish(self, snapshot: Snapshot) -> None:
        """The source's new snapshot: served by the supervisor, and sent to every worker."""
        previous, self.current_snapshot = self.current_snapshot, snapshot
        self.batch += 1
        message: Message
        if self.builder is not None and snapshot.follows(previous):
            operations = self.builder.take_journal()
            message = Changes(self.batch, snapshot.serial, snapshot.synced, operations)
        else:
            message = Replace(self.batch, snapshot)
        if self.workers:
            self.broadcast(message)
            if snapshot.synced and not previous.synced:
                # Forked before the first sync, the workers were sent the rest of the data:
                # a copy each. Forked again from it, they share it (copy-on-write).
                self.life.start(self.renew(), "renewal", ending=False)

    def reconfigure(self, config: ServeConfig) -> list[str]:
        """A reloaded Corefile: every worker answers by it from now on, and every worker
        forked later starts with it (what says where to serve waits for a restart)."""
        self.config, waiting = restart_only(config, self.config)
        self.resolver = replace(config.kubernetes, ns_addresses=self.resolver.ns_addresses)
        self.broadcast(Reconfigure(self.config))
        return waiting

    def broadcast(self, message: Message) -> None:
        data = frame(message)
        for worker in self.live():
            worker.send(data)

    def live(self) -> list[Worker]:
        """Every worker process, those being replaced (which still answer) included."""
        return [*self.workers.values(), *self.renewed]

    # ----- the workers

    async def spawn(self, slot: int) -> None:
        """Fork a worker from the data as it is now, and follow it."""
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        # From here to the fork nothing else runs: the worker starts from `self.current_snapshot`
        # exactly, and each later change reaches it as a message.
        if self.source is not None and self.builder is not None:
            self.source.flush()  # what the builder has, `self.current_snapshot` has
            self.builder.start_journal()
        config, resolver, probes = self.config, self.resolver, self.probes
        start = Start(
            slot,
            config,
            resolver,
            self.port,
            self.other_ports,
            self.current_snapshot,
            self.builder,
            probes,
        )
        try:
            pid = fork_worker(start, theirs)
        finally:
            theirs.close()
        worker = Worker(slot, pid, writer, time.monotonic(), self.batch)
        self.workers[slot] = worker
        task = asyncio.create_task(self.follow(worker, reader), name=f"worker {slot}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def follow(self, worker: Worker, reader: asyncio.StreamReader) -> None:
        """Take a worker's messages until it ends; then reap it, and fork it again."""
        try:
            while (message := await receive(reader)) is not None:
                self.handle(worker, message)
        except Exception:
            log.exception(
                "worker %d (pid %d): a message that cannot be handled", worker.slot, worker.pid
            )
            worker.kill()
        if self.workers.get(worker.slot) is worker:
            del self.workers[worker.slot]
        self.renewed.discard(worker)
        worker.writer.close()
        self.retired.add(worker.families, growing_only=True)
        for scrape in worker.scrapes.values():
            if not scrape.done():
                scrape.set_result([])  # no need to wait for it
        self.changed.set()
        status = await _reap(worker.pid)
        how = _how_it_ended(status)
        if self.life.stopping:
            if status != 0:
                log.warning("worker %d (pid %d) %s", worker.slot, worker.pid, how)
        elif not self.started:
            self.failure = f"worker {worker.slot} (pid {worker.pid}) {how} before serving"
            self.changed.set()
        elif worker.renewing:  # it has a successor already
            if status != 0:
                log.warning("worker %d (pid %d), replaced, %s", worker.slot, worker.pid, how)
        else:
            WORKER_RESTARTS.inc()
            delay = self.restart_delay(worker)
            when = f" in {delay:g}s, as it ended soon after its start" if delay else ""
            log.warning(
                "worker %d (pid %d) %s; starting it again%s", worker.slot, worker.pid, how, when
            )
            self.backoff[worker.slot] = (delay, time.monotonic() + delay)
            await asyncio.sleep(delay)
            await self.restart(worker.slot)

    def restart_delay(self, worker: Worker) -> float:
        """How long to wait before forking a worker that ended again: none if it had run for
        STABLE seconds, else double the last delay (RESTART_DELAY at first, MAX_BACKOFF at most)."""
        now = time.monotonic()
        if now - worker.started >= STABLE:
            return 0.0
        previous = self.backoff.get(worker.slot, (0.0, 0.0))[0]
        return min(MAX_BACKOFF, max(RESTART_DELAY, previous * 2))

    async def renew(self) -> None:
        """Replace every worker by one forked from the data as it is now, one after another:
        each successor serves before the old one is told to stop, and the old one answers
        through its lameduck, applying every change until it exits."""
        await self.until_serving()
        log.info("first sync done: replacing the workers by ones forked from it, one at a time")
        for slot in sorted(self.workers):
            old = self.workers.get(slot)
            if old is None or self.life.stopping:
                continue
            old.renewing = True
            del self.workers[slot]
            self.renewed.add(old)
            await self.restart(slot)
            while not self.life.stopping:
                new = self.workers.get(slot)
                if new is not None and new.serving:
                    break
                self.changed.clear()
                await self.changed.wait()
            old.stopped = True
            old.send(frame(Stop(now=False)))

    async def restart(self, slot: int) -> None:
        """Fork a worker again, and keep trying (once a second) while the system refuses."""
        failed = False
        while not self.life.stopping:
            try:
                await self.spawn(slot)
                return
            except OSError as exc:
                if not failed:
                    log.error("worker %d: cannot start it again, retrying: %s", slot, exc)
                failed = True
                await asyncio.sleep(RESTART_DELAY)

    def handle(self, worker: Worker, message: Message) -> None:
        if isinstance(message, Applied):
            worker.applied = message.batch
        elif isinstance(message, Families):
            scrape = worker.scrapes.pop(message.request, None)
            if scrape is not None and not scrape.done():
                scrape.set_result(message.families)
        elif isinstance(message, Serving):
            worker.serving = True
            log.info("worker %d (pid %d) serving", worker.slot, worker.pid)
            self.changed.set()
        elif isinstance(message, Looped):
            upstream = self.probes.get(message.question)
            if upstream is not None:
                server = f"{self.config.bind.host}:{self.port}"
                self.life.fail(loop_error(upstream, message.question, server))

    async def until_serving(self) -> None:
        """Wait until every worker serves; WorkerError if one ends first, or too late."""
        deadline = time.monotonic() + START_TIMEOUT
        while (
            not all(worker.serving for worker in self.workers.values())
            or len(self.workers) < self.config.workers
        ):
            if self.failure is not None:
                raise WorkerError(f"{self.failure}; its error is in the lines above")
            self.changed.clear()
            remaining = deadline - time.monotonic()
            try:
                await asyncio.wait_for(self.changed.wait(), max(remaining, 0))
            except TimeoutError:
                raise WorkerError(
                    f"the workers did not all serve within {START_TIMEOUT:g}s"
                ) from None

    async def stop_workers(self) -> None:
        """Tell the workers to stop after the lameduck (at once on a second signal), and wait
        until they have."""
        self.broadcast(Stop(now=False))
        gone = asyncio.create_task(self._all_gone())
        again = asyncio.create_task(self.life.again.wait())
        await asyncio.wait(
            {gone, again},
            timeout=self.config.health.lameduck + EXIT_GRACE,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if again.done() and not gone.done():
            self.broadcast(Stop(now=True))
            await asyncio.wait({gone}, timeout=EXIT_GRACE)
        again.cancel()
        gone.cancel()

    async def end_workers(self) -> None:
        """At the very end (a failure included): stop every worker at once, kill the slow."""
        self.life.stopping = True
        self.broadcast(Stop(now=True))
        try:
            await asyncio.wait_for(self._all_gone(), EXIT_GRACE)
        except TimeoutError:
            for worker in self.live():
                worker.kill()
            if self.tasks:
                await asyncio.wait(self.tasks, timeout=EXIT_GRACE)

    async def _all_gone(self) -> None:
        while self.workers or self.renewed:
            self.changed.clear()
            await self.changed.wait()

    # ----- HTTP

    def not_ready(self) -> str | None:
        """/ready: None when the data has synced and every worker serves the latest."""
        if self.life.stopping:
            return "Shutting down"
        if not self.current_snapshot.synced:
            return "kubernetes"
        up_to_date = {
            worker.slot
            for worker in self.live()
            if worker.serving and not worker.stopped and worker.applied >= self.batch
        }
        behind = [
            self.describe(slot)
            for slot in range(1, self.config.workers + 1)
            if slot not in up_to_date
        ]
        return f"workers not serving the latest data: {', '.join(behind)}" if behind else None

    def describe(self, slot: int) -> str:
        """A worker's slot, and when it is forked again if it is waiting after crashes."""
        delay, due = self.backoff.get(slot, (0.0, 0.0))
        left = due - time.monotonic()
        if slot in self.workers or left <= 0:
            return str(slot)
        return f"{slot} (ended soon after its start; starting again in {left:.0f}s of {delay:g}s)"

    async def summed(self) -> bytes:
        """/metrics: the supervisor's metrics and every worker's, summed, and each worker's
        request count apart (`toposdns_worker_requests_total{worker}`)."""
        loop = asyncio.get_running_loop()
        scrapes: dict[Worker, tuple[int, asyncio.Future[list[Metric]]]] = {}
        for worker in self.live():
            request = next(self.requests)
            scrapes[worker] = request, loop.create_future()
            worker.scrapes[request] = scrapes[worker][1]
            worker.send(frame(Scrape(request)))
        if scrapes:
            await asyncio.wait([future for _, future in scrapes.values()], timeout=SCRAPE_TIMEOUT)
        summed = Sum()
        summed.add(REGISTRY.collect())
        summed.add(self.retired.collect())
        per_worker = Metric(
            "toposdns_worker_requests",
            "DNS requests each worker process answered since it started.",
            "counter",
        )
        for worker, (request, scrape) in scrapes.items():
            worker.scrapes.pop(request, None)
            if worker not in self.live():
                continue  # it has ended: what it counted is in `retired`
            if scrape.done():
                worker.families = scrape.result()
            summed.add(worker.families)
            if worker.renewing:
                continue  # its slot's count is its successor's
            total = sample_total(worker.families, "coredns_dns_requests_total")
            per_worker.add_sample(
                "toposdns_worker_requests_total", {"worker": str(worker.slot)}, total
            )
        summed.add([per_worker])
        return generate_latest(summed)


async def _reap(pid: int) -> int:
    """Wait for a worker whose channel has closed to end (killing it if it does not end
    soon); its wait status."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EXIT_GRACE
    while loop.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        await asyncio.sleep(0.01)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _how_it_ended(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"was killed by signal {signal.Signals(-code).name}"
    return f"exited with status {code}"
