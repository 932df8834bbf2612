"""The controller assembled: reflectors -> caches -> work queue -> writer, under a leader lease.

Every replica watches Pods, Nodes and PodLocators (so its caches are warm and a failover is
quick); only the leader writes. Writing starts once the first lists of all three have arrived
and this replica leads: then every key is reconciled once (which also deletes the strays left
while no controller ran), and after that each key whose pod, node or locator changes. With
`--node-cidrs spec` the node locators depend on Nodes alone, and they are what places most
pods: the leader writes them as soon as Nodes and PodLocators are listed, while the list of
every Pod (the longest by far) is still arriving.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable

from toposdns import __version__
from toposdns.controller.config import ControllerConfig
from toposdns.controller.elector import LeaseElector
from toposdns.controller.queue import TokenBucket, WorkQueue
from toposdns.controller.state import WATCHED, ClusterState, Key
from toposdns.controller.writer import LocatorWriter, NotLeader, Retry
from toposdns.kube.client import Apis, apis_of, connect
from toposdns.lifecycle import Lifecycle
from toposdns.metrics import CONTROLLER_QUEUE_DEPTH
from toposdns.serve.http import HttpServer
from toposdns.source.watch import Reflector, WatchSettings

log = logging.getLogger("toposdns")

#: How often at most a failed-write summary is logged.
RETRY_LOG_INTERVAL = 10.0


def default_identity() -> str:
    """$POD_NAME if set, else the hostname and a random suffix (as client-go examples do)."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Controller:
    """One controller replica: watches always, writes while leading."""

    def __init__(
        self,
        apis: Apis,
        config: ControllerConfig,
        settings: WatchSettings | None = None,
        on_page: Callable[[], None] | None = None,
    ) -> None:
        self.apis = apis
        self.config = config
        self.settings = settings or WatchSettings()
        #: Called after each list page (Reflector's `on_page`).
        self.on_page = on_page
        self.identity = config.identity or default_identity()
        self.state = ClusterState(config, self._changed, self._update)
        self.queue: WorkQueue[Key] = WorkQueue(
            config.backoff_initial, config.backoff_max, depth=CONTROLLER_QUEUE_DEPTH.set
        )
        self.bucket = TokenBucket(config.writes_per_second)
        self.elector = LeaseElector(
            apis,
            config.namespace,
            config.lease,
            self.identity,
            lambda leading: self._update(),
            config.request_timeout,
        )
        self.writer = LocatorWriter(apis, self.state, config, self.bucket, self.elector.may_write)
        self.active = False
        #: Writing node locators only, before the pods are listed.
        self.early = False
        self.stopping = False
        self._workers: list[asyncio.Task[None]] = []
        self._resync_started: float | None = None
        self._failed = 0
        self._last_retry_log = 0.0

    def not_ready(self) -> str | None:
        """None once the first lists have arrived (leader or not), else why not ready."""
        if self.stopping:
            return "Shutting down"
        if not self.state.synced:
            missing = [r.name for r in WATCHED if r.name not in self.state.listed]
            return "not listed yet: " + ", ".join(missing)
        return None

    async def run(self) -> None:
        """Watch and compete for the lease until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                for resource in WATCHED:
                    reflector = Reflector(
                        self.apis, resource, self.state, self.settings, self.on_page
                    )
                    group.create_task(reflector.run(), name=f"watch {resource.name}")
                group.create_task(self.elector.run(), name="leader election")
        finally:
            self._deactivate()

    async def stop(self, task: asyncio.Task[None] | None = None) -> None:
        """Stop writing, stop `task` (the one running `run()`), then release the lease."""
        self.stopping = True
        workers = self._deactivate()
        await asyncio.gather(*workers, return_exceptions=True)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.elector.release()

    # ----- activation: leading and synced -----

    def _update(self) -> None:
        """Start or stop the writers as leadership and sync come and go."""
        leading = self.elector.leading and not self.stopping
        should = leading and self.state.synced
        if should and not self.active:
            self.active = True
            keys = self.state.keys()
            log.info("reconciling every locator (%d keys) as leader", len(keys))
            self._resync_started = time.monotonic()
            self._start(keys)
        elif leading and not self.active and not self.early and self._nodes_first():
            self.early = True
            keys = {(self.config.namespace, name) for name in self.state.nodes}
            log.info("writing node locators (%d) while pods are being listed", len(keys))
            self._start(keys)
        elif not leading and (self.active or self.early):
            self._deactivate()

    def _nodes_first(self) -> bool:
        """True when node locators can be written before the pods are listed."""
        listed = self.state.listed
        return self.config.node_cidrs == "spec" and {"nodes", "podlocators"} <= listed

    def _start(self, keys: Iterable[Key]) -> None:
        """Queue the keys, and start the writers unless they run already."""
        if not self._workers:
            self.writer.counts = dict.fromkeys(self.writer.counts, 0)
            self._workers = [
                asyncio.create_task(self._work(), name=f"locator writer {i}")
                for i in range(max(1, self.config.workers))
            ]
        for key in keys:
            self.queue.add(key, self.config.coalesce)

    def _deactivate(self) -> list[asyncio.Task[None]]:
        """Stop the writers and forget the queue; returns the cancelled tasks."""
        workers, self._workers = self._workers, []
        for task in workers:
            task.cancel()
        if self.active or self.early:
            self.active = self.early = False
            self.queue.clear()
        return workers

    def _changed(self, keys: Iterable[Key]) -> None:
        if self.active:
            for key in keys:
                self.queue.add(key, self.config.coalesce)
        elif self.early:
            # Only node locators: a pod's is not known before the pods are listed.
            namespace, nodes = self.config.namespace, self.state.nodes
            for key in keys:
                if key[0] == namespace and key[1] in nodes:
                    self.queue.add(key, self.config.coalesce)

    async def _work(self) -> None:
        while True:
            # Most keys need no write (pods their node's locator places), and a sync that
            # writes nothing never waits: without this, a pass over every pod would keep the
            # Lease renewals and the watches from running.
            await asyncio.sleep(0)
            key = await self.queue.get()
            try:
                await self.writer.sync(key)
            except Retry as exc:
                self._retrying(key, exc)
            except NotLeader:
                pass  # the writers are being stopped
            except Exception:
                log.exception("reconciling PodLocator %s/%s failed; retrying", *key)
                self.queue.retry(key)
            else:
                self.queue.forget(key)
            finally:
                self.queue.done(key)
            if self._resync_started is not None and self.queue.idle:
                counts = self.writer.counts
                log.info(
                    "every locator reconciled in %.1fs: %d created, %d updated, %d deleted",
                    time.monotonic() - self._resync_started,
                    counts["create"],
                    counts["update"],
                    counts["delete"],
                )
                self._resync_started = None

    def _retrying(self, key: Key, exc: Retry) -> None:
        self.queue.retry(key, exc.after)
        self._failed += 1
        now = time.monotonic()
        if now - self._last_retry_log >= RETRY_LOG_INTERVAL:
            log.warning("%d locator writes to retry, e.g. %s", self._failed, exc)
            self._last_retry_log, self._failed = now, 0


async def run_controller(config: ControllerConfig) -> None:
    """Run the controller until SIGTERM or SIGINT, then release the lease.

    Raises ConnectError when the cluster cannot be reached at all, OSError when the HTTP
    address cannot be bound."""
    api_client = await connect(config.kubeconfig)
    async with Lifecycle() as life:
        life.stack.push_async_callback(api_client.close)
        # Listed pods, nodes and locators live as long as the caches: freeze what survives
        # each page, so the cyclic collector does not scan it again and again in a big sync.
        controller = Controller(apis_of(api_client), config, on_page=gc.freeze)
        api_client.user_agent = f"toposdns/{__version__} controller ({controller.identity})"
        if config.http is not None:
            http = HttpServer(controller.not_ready)
            life.stack.push_async_callback(http.stop)
            port = await http.listen(*config.http, ("/health", "/ready", "/metrics"))
            log.info("serving /health, /ready and /metrics on %s:%d", config.http[0], port)
        log.info(
            "controller %s: node locators (pod ranges: --node-cidrs %s) and Lease %s in "
            "namespace %s; pod locators: --pod-locators %s",
            controller.identity,
            config.node_cidrs,
            config.lease.name,
            config.namespace,
            config.pod_locators,
        )
        life.catch_signals()
        task = life.start(controller.run(), "controller")
        try:
            await life.main_loop()
        finally:
            log.info("shutting down")
            await controller.stop(task)
        log.info("stopped")
