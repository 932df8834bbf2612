"""The live source: list and watch the cluster, and keep the store in step with it.

Each resource (Namespaces, Services, EndpointSlices, PodLocators) has a reflector that follows
the API conventions client-go's reflector follows:

1. LIST in pages (`limit`/`continue`), then replace the stored objects of that kind in one step,
   so a relist never empties what is being served;
2. WATCH from the list's resourceVersion with bookmarks, applying each event as it comes;
3. on `410 Gone` (history compacted, in an HTTP status or an ERROR event) go back to 1;
   on any other failure wait with jittered exponential backoff and watch again from the last
   resourceVersion seen; a stream silent for longer than the inactivity timeout counts as failed.

Objects are decoded from raw JSON straight into the store's records (no per-object OpenAPI model),
and a malformed object is skipped with a log line and a counter while the rest is served. Changes
are published as a new snapshot after a short coalescing delay, so a burst of events costs one
snapshot.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from toposdns.metrics import API_ERRORS, MALFORMED_OBJECTS, WATCH_RESTARTS
from toposdns.store.builder import StoreBuilder
from toposdns.store.convert import ObjectError, convert_object
from toposdns.store.model import EndpointSlice, Namespace, PodLocator, Record, Service
from toposdns.store.snapshot import Snapshot

log = logging.getLogger("toposdns")

PAGE_SIZE = 500


class Gone(Exception):
    """The resourceVersion asked for is no longer in the API server's history."""


class ConnectError(Exception):
    """No way to reach the cluster: neither in-cluster credentials nor a usable kubeconfig."""


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, resource: str, status: int, message: str) -> None:
        super().__init__(f"{resource}: HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Apis:
    """The typed API groups of the official client that the reflectors call."""

    core: Any
    discovery: Any
    custom: Any


Call = Callable[..., Awaitable[aiohttp.ClientResponse]]


@dataclass(frozen=True, slots=True)
class Resource:
    """One kind DNS watches, and the client call that lists or watches all of it."""

    name: str
    record: type
    kind: str
    api_version: str
    call: Callable[[Apis], Call]


RESOURCES = (
    Resource("namespaces", Namespace, "Namespace", "v1",
             lambda a: a.core.list_namespace_without_preload_content),
    Resource("services", Service, "Service", "v1",
             lambda a: a.core.list_service_for_all_namespaces_without_preload_content),
    Resource("endpointslices", EndpointSlice, "EndpointSlice", "discovery.k8s.io/v1",
             lambda a: a.discovery.list_endpoint_slice_for_all_namespaces_without_preload_content),
    Resource("podlocators", PodLocator, "PodLocator", "toposdns.io/v1alpha1",
             lambda a: _custom(a, "toposdns.io", "v1alpha1", "podlocators")),
)  # fmt: skip


def _custom(apis: Apis, group: str, version: str, plural: str) -> Call:
    def call(**kwargs: Any) -> Awaitable[aiohttp.ClientResponse]:
        method = apis.custom.list_cluster_custom_object_without_preload_content
        return method(group, version, plural, **kwargs)  # type: ignore[no-any-return]

    return call


async def connect(kubeconfig: Path | None) -> Any:
    """An ApiClient: in-cluster service account, else the kubeconfig (default ~/.kube/config)."""
    from kubernetes.aio import client, config

    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            # Re-reads the projected token as it rotates.
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass
    try:
        await config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None, client_configuration=configuration
        )
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "~/.kube/config"
        raise ConnectError(
            f"not in a cluster, and cannot use the kubeconfig {where}: {exc}; "
            "pass --kubeconfig FILE, or --snapshot FILE to serve from a file"
        ) from None
    return client.ApiClient(configuration)


def apis_of(api_client: Any) -> Apis:
    """The API groups over one ApiClient."""
    from kubernetes.aio import client

    return Apis(
        client.CoreV1Api(api_client),
        client.DiscoveryV1Api(api_client),
        client.CustomObjectsApi(api_client),
    )


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """Timings of the list/watch loops."""

    #: How long a watch may stay silent (no event, no bookmark) before it is restarted.
    inactivity: float = 70.0
    #: Server-side watch duration, randomized upwards by up to 2x like client-go's.
    watch_seconds: int = 300
    backoff_initial: float = 0.2
    backoff_max: float = 30.0
    #: How long to gather a burst of changes into one snapshot.
    coalesce: float = 0.005
    page_size: int = PAGE_SIZE


class KubeSource:
    """Reflectors for every resource over one store; publishes snapshots as things change."""

    def __init__(
        self,
        apis: Apis,
        publish: Callable[[Snapshot], None],
        settings: WatchSettings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.apis = apis
        self.publish = publish
        self.settings = settings or WatchSettings()
        self.clock = clock
        self.builder = StoreBuilder()
        self.synced: set[str] = set()
        self.serial = 0
        self._pending: asyncio.TimerHandle | None = None
        self._published_synced = False
        self.ready = asyncio.Event()

    @property
    def is_synced(self) -> bool:
        """True once every resource has been listed at least once."""
        return len(self.synced) == len(RESOURCES)

    async def run(self) -> None:
        """Run every reflector until cancelled."""
        async with asyncio.TaskGroup() as group:
            for resource in RESOURCES:
                group.create_task(Reflector(self, resource).run(), name=f"watch {resource.name}")

    def changed(self) -> None:
        """Schedule a snapshot soon; further changes until then join it."""
        if self._pending is None:
            loop = asyncio.get_running_loop()
            self._pending = loop.call_later(self.settings.coalesce, self.flush)

    def flush(self) -> None:
        """Publish a snapshot now if anything changed."""
        self._pending = None
        synced = self.is_synced
        if not self.builder.dirty and synced == self._published_synced:
            return
        self.serial = max(int(self.clock()), self.serial + 1)
        self.publish(self.builder.snapshot(self.serial, synced))
        self._published_synced = synced
        if synced:
            self.ready.set()


class Reflector:
    """List, then watch, one resource; relist when the watch's history is gone."""

    def __init__(self, source: KubeSource, resource: Resource) -> None:
        self.source = source
        self.resource = resource
        self.call = resource.call(source.apis)
        self.settings = source.settings
        self.builder = source.builder

    async def run(self) -> None:
        """Forever: list when needed, watch, back off on failures."""
        version: str | None = None
        delay = self.settings.backoff_initial
        while True:
            try:
                if version is None:
                    version = await self.list()
                version = await self.watch(version)
                delay = self.settings.backoff_initial
                WATCH_RESTARTS.labels(self.resource.name, "expired").inc()
            except Gone:
                log.info("%s: resourceVersion %s is too old, listing again",
                         self.resource.name, version)  # fmt: skip
                WATCH_RESTARTS.labels(self.resource.name, "gone").inc()
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server is down, slow, or talking nonsense
                reason = "timeout" if isinstance(exc, TimeoutError) else "error"
                WATCH_RESTARTS.labels(self.resource.name, reason).inc()
                API_ERRORS.labels(self.resource.name).inc()
                pause = delay * random.uniform(1.0, 1.5)
                log.warning("%s: %s; still serving the last data, retrying in %.1fs",
                            self.resource.name, _describe_error(exc), pause)  # fmt: skip
                await asyncio.sleep(pause)
                delay = min(delay * 2, self.settings.backoff_max)

    async def list(self) -> str:
        """List every object in pages; replace the stored ones; return the list's version."""
        records: list[Record] = []
        kept: set[tuple[str, str]] = set()
        token: str | None = None
        while True:
            body = await self.request(limit=self.settings.page_size, _continue=token)
            metadata = body.get("metadata") or {}
            for item in body.get("items") or []:
                if isinstance(item, dict):
                    item.setdefault("kind", self.resource.kind)
                    item.setdefault("apiVersion", self.resource.api_version)
                record = self.convert(item)
                if record is None:
                    kept.add(_key_of(item))
                else:
                    records.append(record)
            token = metadata.get("continue") or None
            if token is None:
                version = str(metadata.get("resourceVersion", ""))
                break
        changed = self.builder.replace_all(self.resource.record, records, keep=kept)
        first = self.resource.name not in self.source.synced
        self.source.synced.add(self.resource.name)
        if first:
            log.info("%s: listed %d objects", self.resource.name, len(records))
        if changed or first:
            self.source.changed()
        return version

    async def request(self, **params: Any) -> dict[str, Any]:
        """One LIST page, decoded."""
        response = await self.call(**params, _request_timeout=60)
        try:
            data = await response.read()
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                raise ApiError(self.resource.name, response.status, _status_message(data))
            body = json.loads(data)
        finally:
            response.release()
        if not isinstance(body, dict):
            raise ApiError(self.resource.name, 200, "the list is not a JSON object")
        return body

    async def watch(self, version: str) -> str:
        """Watch from `version`, applying events; return the last version when the server
        ends the watch. Raises Gone, ApiError, TimeoutError (inactivity) or a network error."""
        seconds = int(self.settings.watch_seconds * random.uniform(1.0, 2.0))
        response = await self.call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _request_timeout=seconds + self.settings.inactivity,
        )
        try:
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                data = await response.read()
                raise ApiError(self.resource.name, response.status, _status_message(data))
            pending = b""
            while True:
                async with asyncio.timeout(self.settings.inactivity):
                    chunk = await response.content.readany()
                if not chunk:
                    return version
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        version = self.apply(json.loads(line), version)
        finally:
            response.release()

    def apply(self, event: Any, version: str) -> str:
        """Apply one watch event; return the resourceVersion to resume from."""
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ApiError(self.resource.name, 200, f"malformed watch event: {event!r:.200}")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiError(self.resource.name, int(obj.get("code") or 500), _message(obj))
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        if kind == "DELETED":
            namespace, name = _key_of(obj)
            if self.builder.remove(self.resource.record, namespace, name):
                self.source.changed()
        elif kind in ("ADDED", "MODIFIED"):
            record = self.convert(obj)
            if record is not None and self.builder.put(record):
                self.source.changed()
        else:
            log.warning("%s: ignoring watch event of unknown type %r", self.resource.name, kind)
        return version

    def convert(self, raw: Any) -> Record | None:
        """A record, or None (logged and counted) for a malformed object; the last good
        version of that object, if any, stays served."""
        try:
            return convert_object(raw)
        except ObjectError as exc:
            MALFORMED_OBJECTS.labels(self.resource.kind).inc()
            log.warning("skipping malformed object %s; fix it in the cluster", exc)
            return None


def _key_of(raw: Any) -> tuple[str, str]:
    meta = raw.get("metadata") if isinstance(raw, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _status_message(data: bytes) -> str:
    try:
        status = json.loads(data)
    except ValueError:
        return data[:200].decode("utf-8", "replace")
    return _message(status) if isinstance(status, dict) else str(status)[:200]


def _message(status: dict[str, Any]) -> str:
    return str(status.get("message") or status.get("reason") or status)[:300]


def _describe_error(exc: Exception) -> str:
    if isinstance(exc, TimeoutError):
        return "no event or bookmark within the inactivity timeout"
    return str(exc) or type(exc).__name__
