"""List and watch Kubernetes resources with the official client, as client-go's reflector does.

For each resource a `Reflector`:

1. LISTs in pages (`limit`/`continue`) and hands the list to its sink: page by page to a sink
   that can take it so (`Sink.relist`: compared with what is stored as each page arrives, so a
   relist costs about a page, not a second copy of everything), else whole in one call; either
   way what is served is never emptied;
2. WATCHes from the list's resourceVersion with bookmarks, handing each event to the sink;
3. on `410 Gone` (history compacted, in an HTTP status or an ERROR event) goes back to 1;
   on any other failure waits with jittered exponential backoff and watches again from the last
   resourceVersion seen; a stream silent for longer than the inactivity timeout counts as failed.

Objects stay raw JSON (dicts): no OpenAPI model is built per object. What they become is the
sink's business: the DNS source turns them into store records, the controller into its own. A
resource may name the fields its sink reads (a TypedDict): its list pages are then decoded to
those alone, the rest skipped by the decoder.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypedDict, TypeVar, cast

import msgspec
import orjson

from toposdns.kube.client import NETWORK_ERRORS, Apis, decode, fetch, list_all, message_of
from toposdns.kube.resources import CustomResource
from toposdns.metrics import API_ERRORS, WATCH_RESTARTS

log = logging.getLogger("toposdns")

Object = dict[str, Any]
T = TypeVar("T")
#: How long one LIST page may take.
LIST_TIMEOUT = 60.0


class Gone(Exception):
    """The resourceVersion asked for is no longer in the API server's history."""


class Stalled(TimeoutError):
    """A watch got no event or bookmark within the inactivity timeout: answered, then silent."""


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, resource: str, status: int, message: str) -> None:
        super().__init__(f"{resource}: HTTP {status}: {message}")
        self.status = status


@dataclass(frozen=True, slots=True)
class Resource:
    """A kind to watch cluster-wide: its plural name and what its objects say they are."""

    name: str
    kind: str
    api_version: str
    #: The fields of each object that the sink reads, as a TypedDict (store/raw.py): list
    #: pages are decoded to these alone. None: whole objects.
    fields: type | None = None


ListMeta = TypedDict("ListMeta", {"resourceVersion": Any, "continue": Any}, total=False)


class ListPage(TypedDict, Generic[T], total=False):
    """A page of a list, its items decoded to the fields a sink reads."""

    metadata: ListMeta | None
    items: list[T] | None


def page_decoder(fields: type) -> msgspec.json.Decoder[Any]:
    """Decodes a list page to `fields` of each item (a TypedDict), the rest skipped unread;
    raises msgspec.ValidationError for an item of another shape."""
    return msgspec.json.Decoder(cast(Any, ListPage)[fields])


def custom_resource(resource: CustomResource, fields: type | None = None) -> Resource:
    """A custom resource, of whose objects the sink reads `fields` (None: all)."""
    return Resource(resource.plural, resource.kind, resource.api_version, fields)


@dataclass(frozen=True, slots=True)
class WatchSettings:
    """Timings of the list/watch loops."""

    #: How long a watch may stay silent (no event, no bookmark) before it is restarted.
    inactivity: float = 70.0
    #: Server-side watch duration, randomized upwards by up to 2x like client-go's.
    watch_seconds: int = 300
    backoff_initial: float = 0.2
    backoff_max: float = 30.0
    #: How long to gather a burst of changes before acting on them.
    coalesce: float = 0.005
    page_size: int = 500


class Listing(Protocol):
    """One full list, handed over page by page (what `Sink.relist` returns)."""

    def page(self, items: list[Any]) -> None:
        """The next page's objects (after `prepare`)."""

    def finish(self) -> None:
        """The list is complete: what it did not hold is gone."""


class Sink(Protocol):
    """Where a reflector delivers what it sees.

    A sink may also have `prepare(resource, obj)`: each listed object is then passed through it
    as its page arrives, and `replace` gets the results, so that a list of 100,000 objects never
    holds all their raw JSON at once. A sink may also have `relist(resource)`, returning a
    `Listing`: lists are then handed over page by page, and never held whole (`replace` is not
    called). A list that breaks off is dropped without `finish`; the next starts a new one.
    """

    def replace(self, resource: Resource, items: list[Any]) -> None:
        """A complete list: the stored objects become exactly these."""

    def upsert(self, resource: Resource, obj: Object) -> None:
        """An object was added or modified."""

    def delete(self, resource: Resource, obj: Object) -> None:
        """An object was deleted (`obj` is its last state)."""


class Reflector:
    """List, then watch, one resource; relist when the watch's history is gone.

    `on_page`, if given, is called after each list page has been passed through the sink's
    `prepare`: the process that owns the heap may freeze what survived it there (gc.freeze).
    """

    def __init__(
        self,
        apis: Apis,
        resource: Resource,
        sink: Sink,
        settings: WatchSettings,
        on_page: Callable[[], None] | None = None,
    ) -> None:
        self.resource = resource
        self.call = list_all(apis, resource.api_version, resource.name)
        self.reachability = apis.reachability
        self.sink = sink
        self.settings = settings
        self.on_page = on_page
        self.prepare: Callable[[Resource, Object], Any] = getattr(
            sink, "prepare", lambda _resource, obj: obj
        )
        self.relist: Callable[[Resource], Listing] | None = getattr(sink, "relist", None)
        self.pages = None if resource.fields is None else page_decoder(resource.fields)
        #: Where the next watch starts: the last event delivered, even when a watch broke off
        #: (resuming from an older one would replay changes already served, and answers would
        #: go back in time until the replay caught up). None: list first.
        self.version: str | None = None
        #: Whether the API server accepted the current watch: the backoff starts over when
        #: one that did breaks off (an API server restart), instead of growing with each.
        self.accepted = False

    async def run(self) -> None:
        """Forever: list when needed, watch, back off on failures."""
        name = self.resource.name
        delay = self.settings.backoff_initial
        while True:
            self.accepted = False
            try:
                if self.version is None:
                    self.version = await self.list()
                await self.watch(self.version)
                delay = self.settings.backoff_initial
                WATCH_RESTARTS.labels(name, "expired").inc()
            except Gone:
                log.info("%s: resourceVersion %s is too old, listing again", name, self.version)
                WATCH_RESTARTS.labels(name, "gone").inc()
                self.version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server is down, slow, or talking nonsense
                reason = "timeout" if isinstance(exc, TimeoutError) else "error"
                WATCH_RESTARTS.labels(name, reason).inc()
                API_ERRORS.labels(name).inc()
                if self.accepted:
                    # The API server was answering: a new failure, not more of the last one.
                    delay = self.settings.backoff_initial
                pause = delay * random.uniform(1.0, 1.5)
                # No answer at all: the outage is logged once, for every resource together.
                unanswered = isinstance(exc, NETWORK_ERRORS) and not isinstance(exc, Stalled)
                if unanswered:
                    self.reachability.failed(exc)
                log.log(logging.DEBUG if unanswered else logging.WARNING,
                        "%s: %s; still serving the last data, retrying in %.1fs",
                        name, _describe_error(exc), pause)  # fmt: skip
                await asyncio.sleep(pause)
                delay = min(delay * 2, self.settings.backoff_max)

    async def list(self) -> str:
        """List every object in pages, hand them over page by page (or at once to a sink
        without `relist`); return the list's version."""
        listing = None if self.relist is None else self.relist(self.resource)
        items: list[Any] = []
        token: str | None = None
        while True:
            body = await self.request(limit=self.settings.page_size, _continue=token)
            metadata = body.get("metadata") or {}
            for obj in body.get("items") or []:
                if isinstance(obj, dict):
                    # Typed lists leave kind and apiVersion out of their items.
                    obj.setdefault("kind", self.resource.kind)
                    obj.setdefault("apiVersion", self.resource.api_version)
                    items.append(self.prepare(self.resource, obj))
            del body  # the page's raw objects go before the next page is asked for
            if listing is not None:
                listing.page(items)
                items = []
            if self.on_page is not None:
                self.on_page()
            token = metadata.get("continue") or None
            if token is None:
                if listing is not None:
                    listing.finish()
                else:
                    self.sink.replace(self.resource, items)
                return str(metadata.get("resourceVersion", ""))

    async def request(self, **params: Any) -> Object:
        """One LIST page, decoded."""
        status, data, _ = await fetch(self.call, timeout=LIST_TIMEOUT, **params)
        self.reachability.answered()
        if status == 410:
            raise Gone()
        if status != 200:
            raise ApiError(self.resource.name, status, message_of(decode(data)))
        body = self.decode_page(data)
        if not isinstance(body, dict):
            raise ApiError(self.resource.name, 200, "the list is not a JSON object")
        return body

    def decode_page(self, data: bytes) -> Any:
        """A list page: to the resource's `fields` when every object has their shape, else
        whole (the sink then checks each object field by field, and names what is wrong)."""
        if self.pages is not None:
            try:
                return self.pages.decode(data)
            except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
                pass
        return decode(data)

    async def watch(self, version: str) -> str:
        """Watch from `version`, delivering events and keeping `self.version` at the last;
        return it when the server ends the watch. Raises Gone, ApiError, TimeoutError
        (inactivity) or a network error."""
        seconds = int(self.settings.watch_seconds * random.uniform(1.0, 2.0))
        response = await self.call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _request_timeout=seconds + self.settings.inactivity,
        )
        self.reachability.answered()
        try:
            if response.status == 410:
                raise Gone()
            if response.status != 200:
                data = await response.read()
                raise ApiError(self.resource.name, response.status, message_of(decode(data)))
            self.accepted = True
            pending = b""
            while True:
                try:
                    async with asyncio.timeout(self.settings.inactivity):
                        chunk = await response.content.readany()
                except TimeoutError:
                    raise Stalled() from None
                if not chunk:
                    return version
                # Lines can be longer than aiohttp's line limit (large EndpointSlices).
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        version = self.version = self.apply(orjson.loads(line), version)
        finally:
            response.release()

    def apply(self, event: Any, version: str) -> str:
        """Deliver one watch event; return the resourceVersion to resume from."""
        if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
            raise ApiError(self.resource.name, 200, f"malformed watch event: {event!r:.200}")
        kind, obj = event.get("type"), event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise ApiError(self.resource.name, int(obj.get("code") or 500), message_of(obj))
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind == "BOOKMARK":
            return version
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        if kind == "DELETED":
            self.sink.delete(self.resource, obj)
        elif kind in ("ADDED", "MODIFIED"):
            self.sink.upsert(self.resource, obj)
        else:
            log.warning("%s: ignoring watch event of unknown type %r", self.resource.name, kind)
        return version


def object_key(obj: Any) -> tuple[str, str]:
    """(namespace, name) of a raw object; "" where absent."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _describe_error(exc: Exception) -> str:
    if isinstance(exc, Stalled):
        return "no event or bookmark within the inactivity timeout"
    return str(exc) or type(exc).__name__
