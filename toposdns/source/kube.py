"""The live DNS source: watch what DNS answers from, and keep the store in step with it.

Reflectors (source/watch.py) list and watch Namespaces, Services, EndpointSlices and
PodLocators; this module turns their objects into store records. A malformed object is skipped
with a log line and a counter while the rest is served (its last good version, if any, stays).
Changes are published as a new snapshot after a short coalescing delay, so a burst of events
costs one snapshot; the snapshot says `synced` once every resource has been listed once.

Each EndpointSlice that arrives with the endpoint controllers' last-change-trigger-time
annotation is timed, as CoreDNS times it: Kubernetes' DNS programming latency SLI.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from toposdns.kube.client import Apis
from toposdns.kube.resources import POD_LOCATOR
from toposdns.metrics import DNS_PROGRAMMING_DURATION, MALFORMED_OBJECTS
from toposdns.options import Plugin, Setting, file, seconds, sets
from toposdns.source.watch import (
    Object,
    Reflector,
    Resource,
    WatchSettings,
    custom_resource,
    object_key,
)
from toposdns.store import raw as fields
from toposdns.store.builder import StoreBuilder
from toposdns.store.convert import SERVICE_NAME_LABEL, ObjectError, convert_object
from toposdns.store.model import HEADLESS, EndpointSlice, Namespace, PodLocator, Record, Service
from toposdns.store.snapshot import Snapshot

log = logging.getLogger("toposdns")


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """How to reach the cluster (CoreDNS `kubernetes { kubeconfig, startup_timeout }`)."""

    #: None: in-cluster, else ~/.kube/config.
    kubeconfig: Path | None = None
    #: How long to wait for the first sync before answering anyway.
    startup_timeout: float = 5.0


CLUSTER: Plugin[ClusterOptions] = Plugin(
    "cluster",
    ClusterOptions,
    (
        Setting(
            "kubeconfig",
            sets("kubeconfig", file("/etc/kubernetes/kubeconfig (no context)")),
            "--kubeconfig",
            "FILE",
            "without --snapshot: this kubeconfig (default: in-cluster, else ~/.kube/config)",
        ),
        Setting(
            "startup_timeout",
            sets("startup_timeout", seconds(0.0)),
            "--startup-timeout",
            "DURATION",
            "wait this long for the first sync with the cluster (default {default}s)",
            shows="startup_timeout",
        ),
    ),
    directive="kubernetes",
)

NAMESPACES = Resource("namespaces", "Namespace", "v1", fields.Namespace)
SERVICES = Resource("services", "Service", "v1", fields.Service)
ENDPOINT_SLICES = Resource(
    "endpointslices", "EndpointSlice", "discovery.k8s.io/v1", fields.EndpointSlice
)
POD_LOCATORS = custom_resource(POD_LOCATOR, fields.PodLocator)
#: When the change an EndpointSlice reflects happened (RFC 3339), set by the endpoint controllers.
TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
#: What DNS watches, and the store record each becomes.
RESOURCES: dict[Resource, type] = {
    NAMESPACES: Namespace,
    SERVICES: Service,
    ENDPOINT_SLICES: EndpointSlice,
    POD_LOCATORS: PodLocator,
}  # fmt: skip


class SourceListing:
    """A full list of one resource, applied to the store page by page as it arrives
    (`StoreBuilder.relist`): on a relist, a page's changes are published as a watch event's
    are, the deletions once the list is complete. A malformed object keeps its last good version."""

    def __init__(self, source: KubeSource, resource: Resource) -> None:
        self.source = source
        self.resource = resource
        self.relist = source.builder.relist(RESOURCES[resource])

    def page(self, items: list[Record | tuple[str, str]]) -> None:
        """Apply one page of records (and keys of malformed objects)."""
        records = [item for item in items if not isinstance(item, tuple)]
        kept = [item for item in items if isinstance(item, tuple)]
        # A first list is published when complete (and its resource synced) rather than once
        # per page: a snapshot per page would cost the startup time for answers that SERVFAIL
        # where they would not exist anyway.
        if self.relist.page(records, kept) and self.resource.name in self.source.synced:
            self.source.changed()

    def finish(self) -> None:
        """The list is complete: delete what it did not hold; the resource is synced."""
        changed = self.relist.finish()
        self.source.listed(self.resource, self.relist.count, changed)


class KubeSource:
    """Reflectors for every DNS resource over one store; publishes snapshots on change."""

    def __init__(
        self,
        apis: Apis,
        publish: Callable[[Snapshot], None],
        settings: WatchSettings | None = None,
        clock: Callable[[], float] = time.time,
        on_page: Callable[[], None] | None = None,
        builder: StoreBuilder | None = None,
        endpoints: bool = True,
        pod_names: bool = True,
    ) -> None:
        self.apis = apis
        #: The resources watched: all but EndpointSlices with `endpoints` False (`noendpoints`).
        self.resources = [r for r in RESOURCES if endpoints or r is not ENDPOINT_SLICES]
        #: Whether endpoints keep their pod's name (`endpoint_pod_names` reads it).
        self.pod_names = pod_names
        self.publish = publish
        self.settings = settings or WatchSettings()
        self.clock = clock
        #: Called after each list page (Reflector's `on_page`).
        self.on_page = on_page
        self.builder = builder or StoreBuilder()
        self.synced: set[str] = set()
        self.serial = 0
        self._pending: asyncio.TimerHandle | None = None
        self._published_synced = False
        #: An unreadable trigger time was logged (once: the endpoint controllers write them).
        self._bad_trigger_time = False

    @property
    def is_synced(self) -> bool:
        """True once every resource has been listed at least once."""
        return len(self.synced) == len(self.resources)

    async def run(self) -> None:
        """Run every reflector until cancelled."""
        async with asyncio.TaskGroup() as group:
            for resource in self.resources:
                reflector = Reflector(self.apis, resource, self, self.settings, self.on_page)
                group.create_task(reflector.run(), name=f"watch {resource.name}")

    # The reflectors' sink.

    def prepare(self, resource: Resource, obj: Object) -> Record | tuple[str, str]:
        """The record; for a malformed object its key, so its last good version is kept."""
        if resource is ENDPOINT_SLICES:
            self.time_programming(obj)
        record = self.convert(obj)
        return object_key(obj) if record is None else record

    def replace(self, resource: Resource, items: list[Record | tuple[str, str]]) -> None:
        listing = self.relist(resource)
        listing.page(items)
        listing.finish()

    def relist(self, resource: Resource) -> SourceListing:
        """A full list of `resource`, applied to the store page by page."""
        return SourceListing(self, resource)

    def listed(self, resource: Resource, count: int, changed: bool) -> None:
        """A full list of `resource` (`count` objects) is in the store."""
        if resource.name not in self.synced:
            self.synced.add(resource.name)
            log.info("%s: listed %d objects", resource.name, count)
            changed = True
        if changed:
            self.changed()

    def upsert(self, resource: Resource, obj: Object) -> None:
        if resource is ENDPOINT_SLICES:
            self.time_programming(obj)
        record = self.convert(obj)
        if record is not None and self.builder.put(record):
            self.changed()

    def delete(self, resource: Resource, obj: Object) -> None:
        if resource is ENDPOINT_SLICES:
            self.time_programming(obj)
        namespace, name = object_key(obj)
        if self.builder.remove(RESOURCES[resource], namespace, name):
            self.changed()

    def time_programming(self, raw: Object) -> None:
        """Observe how long ago the change an EndpointSlice carries was triggered, as CoreDNS's
        EndpointLatencyRecorder does: only for a slice with the annotation whose Service is
        known, labelled `headless_with_selector` or `cluster_ip` by that Service's kind. Every
        arrival counts, listed or watched, as every informer delta does in CoreDNS."""
        metadata = raw.get("metadata")
        if not isinstance(metadata, dict):
            return
        annotations = metadata.get("annotations")
        text = annotations.get(TRIGGER_TIME) if isinstance(annotations, dict) else None
        labels = metadata.get("labels")
        service = labels.get(SERVICE_NAME_LABEL) if isinstance(labels, dict) else None
        if not isinstance(text, str) or not isinstance(service, str):
            return
        svc = self.builder.service(str(metadata.get("namespace", "")), service)
        if svc is None:
            return
        try:
            triggered = datetime.fromisoformat(text).timestamp()
        except ValueError:
            if not self._bad_trigger_time:
                self._bad_trigger_time = True
                namespace, name = object_key(raw)
                log.warning(
                    "EndpointSlice %s/%s: annotation %s is %r, not an RFC 3339 time; DNS "
                    "programming latency is not measured for such slices",
                    namespace,
                    name,
                    TRIGGER_TIME,
                    text[:64],
                )
            return
        kind = "headless_with_selector" if svc.kind == HEADLESS else "cluster_ip"
        DNS_PROGRAMMING_DURATION.labels(kind).observe(self.clock() - triggered)

    def convert(self, raw: Object) -> Record | None:
        """A record, or None (logged and counted) for a malformed object."""
        try:
            return convert_object(raw, self.pod_names)
        except ObjectError as exc:
            MALFORMED_OBJECTS.labels(str(raw.get("kind"))).inc()
            log.warning("skipping malformed object %s; fix it in the cluster", exc)
            return None

    # Publishing.

    def changed(self) -> None:
        """Schedule a snapshot soon; further changes until then join it."""
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = loop.call_later(self.settings.coalesce, self.flush)

    def flush(self) -> None:
        """Publish a snapshot now if anything changed."""
        if self._pending is not None:
            self._pending.cancel()  # when called before its time
        self._pending = None
        synced = self.is_synced
        if not self.builder.dirty and synced == self._published_synced:
            return
        self.serial = max(int(self.clock()), self.serial + 1)
        self.publish(self.builder.snapshot(self.serial, synced))
        self._published_synced = synced
