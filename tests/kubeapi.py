"""A stand-in Kubernetes API server for tests, faithful to the list/watch conventions.

It serves the resources toposdns reads (Services, EndpointSlices, Namespaces, PodLocators, plus
Pods and Nodes) over plain HTTP on 127.0.0.1, from an aiohttp server running its own event loop in
a background thread, so sync tests can drive it with the real `kubernetes` client.

What it mirrors from kube-apiserver (see "Efficient detection of changes", "Resource versions" and
"Retrieving large results sets in chunks" in the API concepts):

- one resourceVersion counter across all kinds, like etcd's revision;
- lists carry the list's resourceVersion; items of built-in (typed) lists carry no kind/apiVersion,
  items of custom resource lists do; `limit`/`continue` pages are a consistent snapshot at the
  first page's resourceVersion, with etcd-style continue tokens that expire on compaction
  (410 Expired, with an "inconsistent" continue token in the Status);
- watches stream one JSON event per line over chunked HTTP; they replay the history after the
  requested resourceVersion, start with synthetic ADDED events when it is unset or "0", send
  BOOKMARKs only to watches that asked for them, answer a compacted resourceVersion with HTTP 200
  and a single ERROR event (Status 410 Expired, "too old resource version: X (Y)"), and end
  cleanly when `timeoutSeconds` runs out;
- bearer-token auth, and errors as `Status` objects with the API's codes, reasons and messages;
- with `leases=True`, the coordination.k8s.io/v1 group: Leases with get, list, watch, create and
  update (409 on a stale resourceVersion), whose MicroTime fields must have exactly six fraction
  digits as the API server's decoder demands (for leader election).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import bisect
import contextlib
import copy
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from aiohttp import web
from multidict import CIMultiDict

__all__ = ["LEASES", "RESOURCES", "FakeApiServer", "RequestRecord", "ResourceType"]

JSON = dict[str, Any]

_CONTINUE_VERSION = "meta.k8s.io/v1"
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


@dataclass(frozen=True)
class ResourceType:
    """One API resource the fake serves."""

    resource: str  # plural, as in the URL
    kind: str
    group: str  # "" for the core group
    version: str
    namespaced: bool
    singular: str
    short_names: tuple[str, ...] = ()
    custom: bool = False  # a CustomResourceDefinition's resource (unstructured on the server)
    writable: bool = False  # a typed resource that also takes create and update

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    @property
    def group_resource(self) -> str:
        """`services` or `podlocators.toposdns.io`, as the API server names it in messages."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def verbs(self) -> list[str]:
        if self.custom:
            return ["create", "delete", "get", "list", "update", "watch"]
        if self.writable:
            return ["create", "get", "list", "update", "watch"]
        return ["get", "list", "watch"]


RESOURCES: dict[str, ResourceType] = {
    rt.resource: rt
    for rt in (
        ResourceType("services", "Service", "", "v1", True, "service", ("svc",)),
        ResourceType("namespaces", "Namespace", "", "v1", False, "namespace", ("ns",)),
        ResourceType("pods", "Pod", "", "v1", True, "pod", ("po",)),
        ResourceType("nodes", "Node", "", "v1", False, "node", ("no",)),
        ResourceType(
            "endpointslices", "EndpointSlice", "discovery.k8s.io", "v1", True, "endpointslice"
        ),
        ResourceType(
            "podlocators", "PodLocator", "toposdns.io", "v1alpha1", True, "podlocator", custom=True
        ),
    )
}
#: Served only by `FakeApiServer(leases=True)`, so that discovery otherwise stays as it was.
LEASES = ResourceType("leases", "Lease", "coordination.k8s.io", "v1", True, "lease", writable=True)
#: metav1.MicroTime's layout, "2006-01-02T15:04:05.000000Z07:00": exactly six fraction digits.
_MICRO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)")

_REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_MESSAGES: dict[int, str] = {
    401: "Unauthorized",
    404: "the server could not find the requested resource",
    405: "the server does not allow this method on the requested resource",
    409: "the server reported a conflict",
    410: "The resourceVersion for the provided list is too old.",
    429: "Too many requests, please try again later.",
    500: "Internal error occurred: injected failure",
    503: "the server is currently unable to handle the request",
    504: "Timeout: request did not complete within the allotted timeout",
}


@dataclass(frozen=True)
class RequestRecord:
    """One request as the server received it (recorded before auth and injected failures)."""

    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]  # case-insensitive
    resource: str | None = None  # the plural of the resource addressed, if any
    body: Any = None  # the parsed JSON body of a write, if any

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "") in _TRUE


def _dumps(obj: Any) -> bytes:
    """Compact JSON plus a newline, as the API server's encoder writes it."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(
    code: int,
    message: str,
    reason: str | None = None,
    details: JSON | None = None,
    list_meta: JSON | None = None,
) -> JSON:
    body: JSON = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": list_meta or {},
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "") if reason is None else reason,
    }
    if details:
        body["details"] = details
    body["code"] = code
    return body


class _ApiError(Exception):
    """An error answered as a Status object."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: JSON | None = None,
        list_meta: JSON | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.body = _status(code, message, reason, details, list_meta)
        self.headers = headers or {}


def _not_found(rt: ResourceType, name: str) -> _ApiError:
    details: JSON = {"name": name, "group": rt.group, "kind": rt.resource}
    if not rt.group:
        del details["group"]
    return _ApiError(404, f'{rt.group_resource} "{name}" not found', details=details)


def _conflict(rt: ResourceType, name: str, why: str) -> _ApiError:
    details: JSON = {"name": name, "group": rt.group, "kind": rt.resource}
    if not rt.group:
        del details["group"]
    return _ApiError(
        409,
        f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}',
        details=details,
    )


def _invalid(rt: ResourceType, name: str, field_path: str, detail: str) -> _ApiError:
    kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    return _ApiError(
        422,
        f'{kind} "{name}" is invalid: {field_path}: {detail}',
        details={"name": name, "group": rt.group, "kind": rt.kind},
    )


def _too_large(requested: int, current: int) -> _ApiError:
    # The watch cache waits up to 3 s for a future resourceVersion, then gives up like this.
    return _ApiError(
        504,
        f"Too large resource version: {requested}, current: {current}",
        details={
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
        headers={"Retry-After": "1"},
    )


def _encode_continue(rv: int, last_key: str) -> str:
    raw = _dumps({"v": _CONTINUE_VERSION, "rv": rv, "start": last_key + "\x00"})[:-1]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("v") != _CONTINUE_VERSION:
            raise ValueError(
                f"incorrect encoded start resourceVersion (version {_CONTINUE_VERSION})"
            )
        rv, start = data.get("rv"), data.get("start")
        if not isinstance(rv, int) or not isinstance(start, str) or rv == 0 or rv < -1:
            raise ValueError("incorrect encoded start resourceVersion or key")
    except (binascii.Error, ValueError) as exc:
        raise _ApiError(400, f"invalid continue token: continue key is not valid: {exc}") from exc
    return rv, start


def _prefix_end(prefix: str) -> str:
    """The least string above every string that starts with `prefix` (non-empty)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _check_micro_times(lease: JSON) -> None:
    """Refuse a Lease whose MicroTime fields the API server could not decode (HTTP 400)."""
    spec = lease.get("spec")
    for name in ("acquireTime", "renewTime"):
        value = spec.get(name) if isinstance(spec, dict) else None
        if value is not None and not (isinstance(value, str) and _MICRO_TIME.fullmatch(value)):
            raise _ApiError(
                400,
                f'Lease in version "v1" cannot be handled as a Lease: parsing time {value!r} as'
                f' "2006-01-02T15:04:05.000000Z07:00": cannot parse spec.{name} as ".000000"',
            )


def _parse_rv(value: str) -> int:
    try:
        rv = int(value)
    except ValueError:
        rv = -1
    if rv < 0:
        raise _ApiError(
            400, f'invalid resource version: strconv.ParseUint: parsing "{value}": invalid syntax'
        )
    return rv


def _parse_bool(query: Mapping[str, str], name: str) -> bool | None:
    value = query.get(name)
    if value is None or value == "":
        return None
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise _ApiError(400, f'invalid value for {name}: strconv.ParseBool: parsing "{value}"')


@dataclass(frozen=True)
class _Event:
    rv: int
    resource: str
    type: str
    key: str
    obj: JSON
    line: bytes


@dataclass(frozen=True)
class _Item:
    """Something queued for one watch stream, delivered in order."""

    kind: Literal["data", "expire", "close"]
    data: bytes = b""
    rv: int = 0


@dataclass(eq=False)
class _Watcher:
    rt: ResourceType
    namespace: str | None
    bookmarks: bool
    loop: asyncio.AbstractEventLoop
    last_rv: int
    queue: asyncio.Queue[_Item] = field(default_factory=asyncio.Queue)

    def wants(self, key: str) -> bool:
        return self.namespace is None or key.startswith(self.namespace + "/")

    def push(self, item: _Item) -> None:
        # Always through the loop (even from its own thread), so items keep the order in which
        # they were pushed under the server's lock.
        with contextlib.suppress(RuntimeError):  # the loop has been closed by stop()
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


@dataclass(frozen=True)
class _Route:
    kind: Literal["version", "api", "apis", "group", "resources", "collection", "object"]
    rt: ResourceType | None = None
    namespace: str | None = None
    name: str | None = None
    group: str = ""
    version: str = ""


class FakeApiServer:
    """A stand-in Kubernetes API server on 127.0.0.1 (aiohttp in a background thread).

    Objects are plain dicts. `add`, `modify`, `delete` and `add_raw` may be called from any thread,
    before `start()` or while serving; each takes the next resourceVersion and emits its event.
    """

    def __init__(self, token: str = "test-token", leases: bool = False) -> None:
        self.token = token
        #: The resource types served: RESOURCES, plus LEASES if asked for.
        self.types: dict[str, ResourceType] = dict(RESOURCES)
        if leases:
            self.types[LEASES.resource] = LEASES
        self.requests: list[RequestRecord] = []
        self.page_size: int | None = None  # server-side cap on ?limit (None: honour ?limit)
        self.url = ""
        self.port = 0
        self._lock = threading.RLock()
        self._rv = 1
        self._compacted_rv = 1  # watches and exact lists need resourceVersion >= this
        self._objects: dict[str, dict[str, JSON]] = {r: {} for r in self.types}
        self._base: dict[str, dict[str, JSON]] = {r: {} for r in self.types}  # at _compacted_rv
        self._history: list[_Event] = []  # events after _compacted_rv, oldest first
        self._watchers: set[_Watcher] = set()
        # resource -> (rv, state at rv, its sorted keys): the last list's, for its next pages
        self._list_cache: dict[str, tuple[int, dict[str, JSON], list[str]]] = {}
        # resource -> key -> (stored object, its JSON as a list item)
        self._item_cache: dict[str, dict[str, tuple[JSON, bytes]]] = {r: {} for r in self.types}
        self._failures: dict[str, list[tuple[int, int]]] = {}
        self._stalled_until = 0.0
        #: resource -> seconds the next list of it waits before answering
        self._held_lists: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

    # ----- lifecycle -----

    def start(self) -> None:
        """Bind a free port (or the previous one after `stop`) and serve in a background thread."""
        self._start(self.port)

    def stop(self) -> None:
        """Close everything: open streams end abruptly (connections aborted, no last chunk)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._thread = None
        with self._lock:
            self._watchers.clear()

    def restart(self) -> None:
        """Stop, then listen again on the same port with the same data and resourceVersions."""
        self.stop()
        self._start(self.port)

    def __enter__(self) -> FakeApiServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig with server=url and this bearer token; returns the path."""
        if not self.url:
            raise RuntimeError("start the server before writing a kubeconfig")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # ----- data -----

    @property
    def resource_version(self) -> str:
        """The current (latest) resourceVersion."""
        with self._lock:
            return str(self._rv)

    def get(self, resource: str, namespace: str | None, name: str) -> JSON | None:
        """A copy of the stored object, or None."""
        rt = self._type_named(resource)
        with self._lock:
            obj = self._objects[rt.resource].get(self._key(rt, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def add(self, obj: dict[str, Any]) -> str:
        """Create an object (ADDED); sets resourceVersion, and uid/creationTimestamp if missing."""
        rt = self._type_of(obj)
        obj = copy.deepcopy(obj)
        key = self._check_identity(rt, obj)
        meta = obj["metadata"]
        with self._lock:
            if key in self._objects[rt.resource]:
                raise ValueError(f"{rt.group_resource} {key!r} already exists")
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            if rt.custom:
                meta.setdefault("generation", 1)
            return str(self._commit(rt, "ADDED", key, obj))

    def modify(self, obj: dict[str, Any]) -> str:
        """Replace an existing object (MODIFIED), whatever resourceVersion it carries."""
        rt = self._type_of(obj)
        obj = copy.deepcopy(obj)
        key = self._check_identity(rt, obj)
        with self._lock:
            old = self._objects[rt.resource].get(key)
            if old is None:
                raise KeyError(f"{rt.group_resource} {key!r} not found")
            self._carry_server_fields(rt, old, obj)
            return str(self._commit(rt, "MODIFIED", key, obj))

    def delete(self, kind: str, namespace: str | None, name: str) -> str:
        """Delete an object (DELETED; the event carries its last state with a new RV)."""
        rt = self._type_named(kind)
        if rt.namespaced and not namespace:
            raise ValueError(f"{rt.kind} is namespaced: give its namespace")
        key = self._key(rt, namespace, name)
        with self._lock:
            old = self._objects[rt.resource].get(key)
            if old is None:
                raise KeyError(f"{rt.group_resource} {key!r} not found")
            return str(self._commit(rt, "DELETED", key, copy.deepcopy(old)))

    def add_raw(self, resource: str, obj: dict[str, Any]) -> str:
        """Store an object as-is, even malformed, as ADDED (only its resourceVersion is set)."""
        rt = self._type_named(resource)
        obj = copy.deepcopy(obj)
        meta = obj.get("metadata")
        with self._lock:
            if isinstance(meta, dict) and isinstance(meta.get("name"), str):
                ns = meta.get("namespace")
                key = self._key(rt, ns if isinstance(ns, str) else "", meta["name"])
            else:
                key = f"~raw/{self._rv + 1}"
            return str(self._commit(rt, "ADDED", key, obj))

    # ----- faults -----

    def bookmark(self) -> None:
        """Send a BOOKMARK (current resourceVersion) on every open watch that allows bookmarks."""
        with self._lock:
            for w in self._watchers:
                if w.bookmarks:
                    w.push(_Item("data", self._bookmark_line(w.rt, self._rv), self._rv))

    def encode_items(self) -> None:
        """Encode every stored object as a list item now, as the first list would (each is
        encoded once per version): the first list is then served as fast as the ones after it,
        and a benchmark of a client that lists measures the client rather than this stand-in's
        first encoding on the machine's other core."""
        with self._lock:
            lists = [(rt, *self._sorted_state_at(rt, self._rv)) for rt in self.types.values()]
        for rt, state, ordered in lists:
            for key in ordered:
                self._item_bytes(rt, key, state[key])

    def compact(self) -> None:
        """Forget all history, like an etcd compaction at a revision newer than anything seen.

        The resourceVersion advances by one (in a real cluster other writes always move it on),
        so every resourceVersion handed out so far becomes too old: watches from it get an
        ERROR 410 event, exact lists and continue tokens from it get HTTP 410, and open watches
        receive what they had queued, then an ERROR 410 event, then the end of the stream.
        """
        with self._lock:
            self._rv += 1
            self._compacted_rv = self._rv
            self._base = {r: dict(objs) for r, objs in self._objects.items()}
            self._history.clear()
            for w in self._watchers:
                w.push(_Item("expire", rv=self._compacted_rv))
            self._watchers.clear()

    def stall(self, seconds: float) -> None:
        """Open and new watch streams send nothing (connection kept open) for this long.

        New watches still get their response headers at once, as the API server flushes them
        when a watch starts; events queued meanwhile are delivered when the stall ends.
        """
        with self._lock:
            self._stalled_until = max(self._stalled_until, time.monotonic() + seconds)

    def hold_list(self, resource: str, seconds: float) -> None:
        """The next list of `resource` answers only after `seconds`, with the objects as they
        are then (an API server slow to list at startup); watches are not held."""
        rt = self._type_named(resource)
        with self._lock:
            self._held_lists[rt.resource] = seconds

    def fail_next(self, resource: str, status: int, count: int = 1, retry_after: int = 1) -> None:
        """The next `count` requests for `resource` get `status` with a Status body.

        429 (and 503) carry `Retry-After: retry_after`; note that the sync client's urllib3
        retries such answers to GETs by itself, up to 3 times, sleeping Retry-After seconds.
        """
        rt = self._type_named(resource)
        with self._lock:
            self._failures.setdefault(rt.resource, []).extend([(status, retry_after)] * count)

    def clear_failures(self) -> None:
        """Forget the failures `fail_next` queued that have not happened yet."""
        with self._lock:
            self._failures.clear()

    def objects(self, resource: str) -> list[JSON]:
        """Copies of every stored object of `resource`."""
        rt = self._type_named(resource)
        with self._lock:
            return copy.deepcopy(list(self._objects[rt.resource].values()))

    def count(self, resource: str) -> int:
        """How many objects of `resource` are stored now."""
        rt = self._type_named(resource)
        with self._lock:
            return len(self._objects[rt.resource])

    @property
    def open_watches(self) -> int:
        with self._lock:
            return len(self._watchers)

    def wait_for_watches(
        self, count: int = 1, resource: str | None = None, timeout: float = 5.0
    ) -> None:
        """Block until at least `count` watches (of `resource`, if given) are open."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                n = sum(1 for w in self._watchers if resource in (None, w.rt.resource))
            if n >= count:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} of {count} watches open after {timeout} s")
            time.sleep(0.01)

    # ----- storage internals (callers hold the lock where noted) -----

    def _type_of(self, obj: Mapping[str, Any]) -> ResourceType:
        for rt in self.types.values():
            if rt.api_version == obj.get("apiVersion") and rt.kind == obj.get("kind"):
                return rt
        raise ValueError(f"unknown apiVersion/kind: {obj.get('apiVersion')}/{obj.get('kind')}")

    def _type_named(self, name: str) -> ResourceType:
        for rt in self.types.values():
            if name in (rt.resource, rt.singular, rt.kind) or name.lower() == rt.kind.lower():
                return rt
        raise ValueError(f"unknown resource or kind: {name}")

    @staticmethod
    def _key(rt: ResourceType, namespace: str | None, name: str) -> str:
        return f"{namespace}/{name}" if rt.namespaced else name

    def _check_identity(self, rt: ResourceType, obj: JSON) -> str:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        if rt.namespaced and not meta.get("namespace"):
            raise ValueError(f"{rt.kind} is namespaced: metadata.namespace is required")
        if not rt.namespaced:
            meta.pop("namespace", None)  # as the API server clears it for cluster-scoped kinds
        return self._key(rt, meta.get("namespace"), meta["name"])

    @staticmethod
    def _carry_server_fields(rt: ResourceType, old: JSON, new: JSON) -> None:
        """Keep what the server owns across an update (uid, creationTimestamp, generation)."""
        old_meta, meta = old.get("metadata", {}), new["metadata"]
        for name in ("uid", "creationTimestamp"):
            if name in old_meta:
                meta[name] = old_meta[name]
        if rt.custom:
            generation = old_meta.get("generation", 1)
            spec_changed = any(
                old.get(k) != new.get(k)
                for k in set(old) | set(new)
                if k not in ("metadata", "status")
            )
            meta["generation"] = generation + 1 if spec_changed else generation

    def _commit(self, rt: ResourceType, type_: str, key: str, obj: JSON) -> int:
        """Record a change at the next resourceVersion and tell the watches. Holds the lock."""
        self._rv += 1
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            meta["resourceVersion"] = str(self._rv)
        objects = self._objects[rt.resource]
        if type_ == "DELETED":
            objects.pop(key, None)
            self._item_cache[rt.resource].pop(key, None)
        else:
            objects[key] = obj
        event = _Event(
            self._rv, rt.resource, type_, key, obj, _dumps({"type": type_, "object": obj})
        )
        self._history.append(event)
        for w in self._watchers:
            if w.rt is rt and w.wants(key):
                w.push(_Item("data", event.line, event.rv))
        return self._rv

    def _state_at(self, rt: ResourceType, rv: int) -> dict[str, JSON]:
        """The objects of a resource as of resourceVersion rv (>= _compacted_rv). Holds the lock."""
        if rv >= self._rv:
            return dict(self._objects[rt.resource])
        state = dict(self._base[rt.resource])
        for event in self._history:
            if event.rv > rv:
                break
            if event.resource == rt.resource:
                if event.type == "DELETED":
                    state.pop(event.key, None)
                else:
                    state[event.key] = event.obj
        return state

    def _sorted_state_at(self, rt: ResourceType, rv: int) -> tuple[dict[str, JSON], list[str]]:
        """`_state_at` and its sorted keys, kept for the last rv listed per resource, so the
        pages of one list cost a bisection each instead of a copy and sort. Holds the lock.

        The state at a resourceVersion never changes (history only grows; compaction only
        makes old versions unavailable, which `_list` checks first), so this never goes stale.
        """
        cached = self._list_cache.get(rt.resource)
        if cached is not None and cached[0] == rv:
            return cached[1], cached[2]
        state = self._state_at(rt, rv)
        ordered = sorted(state)
        self._list_cache[rt.resource] = (rv, state, ordered)
        return state, ordered

    @staticmethod
    def _bookmark_line(rt: ResourceType, rv: int, initial_events_end: bool = False) -> bytes:
        meta: JSON = {"resourceVersion": str(rv)}
        if initial_events_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}
        return _dumps({"type": "BOOKMARK", "object": obj})

    async def _unstalled(self) -> None:
        while (remaining := self._stalled_until - time.monotonic()) > 0:
            await asyncio.sleep(remaining)

    # ----- HTTP plumbing -----

    def _start(self, port: int) -> None:
        if self._loop is not None:
            raise RuntimeError("already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        errors: list[BaseException] = []
        thread = threading.Thread(
            target=self._serve, args=(loop, sock, ready, errors), name="fake-kube-apiserver"
        )
        thread.daemon = True
        thread.start()
        if not ready.wait(timeout=10) or errors:
            thread.join(timeout=5)
            raise RuntimeError(f"fake API server did not start: {errors}")
        self._loop, self._thread = loop, thread

    def _serve(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        ready: threading.Event,
        errors: list[BaseException],
    ) -> None:
        asyncio.set_event_loop(loop)
        try:
            try:
                loop.run_until_complete(self._startup(sock))
            except BaseException as exc:  # reported to start()
                sock.close()
                errors.append(exc)
                return
            finally:
                ready.set()
            loop.run_forever()
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _startup(self, sock: socket.socket) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5
        )
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner

    async def _shutdown(self) -> None:
        runner, self._runner = self._runner, None
        if runner is None:
            return
        server = runner.server
        if server is not None:
            for handler in list(server.connections):
                if handler.transport is not None:
                    handler.transport.abort()
        await runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw
        query = dict(request.query)
        route: _Route | None = None
        error: _ApiError | None = None
        try:
            route = self._route(request.path)
        except _ApiError as exc:
            error = exc
        self.requests.append(
            RequestRecord(
                method=request.method,
                path=request.path,
                query=query,
                headers=CIMultiDict(request.headers),
                resource=route.rt.resource if route and route.rt else None,
                body=body,
            )
        )
        try:
            self._authenticate(request)
            if error is not None:
                raise error
            assert route is not None
            if route.rt is not None:
                self._injected_failure(route, request.method, query)
            return await self._dispatch(request, route, query, body)
        except _ApiError as exc:
            return self._respond(exc.body, exc.code, exc.headers)

    @staticmethod
    def _respond(
        body: Any, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        """A JSON answer; `body` is encoded here unless it is bytes (already encoded)."""
        data = body if isinstance(body, bytes) else _dumps(body)
        response = web.Response(
            body=data, status=status, content_type="application/json", headers=headers
        )
        response.headers["Cache-Control"] = "no-cache, private"
        response.headers["Audit-Id"] = str(uuid.uuid4())
        return response

    def _authenticate(self, request: web.Request) -> None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or token.strip() != self.token:
            raise _ApiError(401, "Unauthorized")

    def _injected_failure(self, route: _Route, method: str, query: Mapping[str, str]) -> None:
        rt = route.rt
        assert rt is not None
        with self._lock:
            queue = self._failures.get(rt.resource)
            if not queue:
                return
            code, retry_after = queue.pop(0)
        message = _MESSAGES.get(code, f"injected HTTP {code}")
        details: JSON | None = None
        headers: dict[str, str] = {}
        if code == 403:
            verb = {"POST": "create", "PUT": "update", "DELETE": "delete"}.get(method, "list")
            if method == "GET" and route.kind == "object":
                verb = "get"
            elif method == "GET" and query.get("watch", "") in _TRUE:
                verb = "watch"
            scope = (
                f'in the namespace "{route.namespace}"'
                if route.namespace
                else "at the cluster scope"
            )
            user = "system:serviceaccount:kube-system:toposdns"
            message = (
                f'{rt.group_resource} is forbidden: User "{user}" cannot {verb} resource'
                f' "{rt.resource}" in API group "{rt.group}" {scope}'
            )
            details = {"kind": rt.resource}
        elif code in (429, 503):
            details = {"retryAfterSeconds": retry_after}
            headers = {"Retry-After": str(retry_after)}
        elif code == 500:
            details = {"causes": [{"message": "injected failure"}]}
        raise _ApiError(code, message, details=details, headers=headers)

    def _route(self, path: str) -> _Route:
        if path.rstrip("/") == "/version":  # the client asks for /version/
            return _Route("version")
        segs = [s for s in path.split("/") if s]
        if segs == ["api"]:
            return _Route("api")
        if segs == ["apis"]:
            return _Route("apis")
        if len(segs) >= 2 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) == 2 and segs[0] == "apis":
            if any(rt.group == segs[1] for rt in self.types.values()):
                return _Route("group", group=segs[1])
            raise _ApiError(404, _MESSAGES[404])
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise _ApiError(404, _MESSAGES[404])
        types = {
            rt.resource: rt
            for rt in self.types.values()
            if rt.group == group and rt.version == version
        }
        if not types:
            raise _ApiError(404, _MESSAGES[404])
        if not rest:
            return _Route("resources", group=group, version=version)
        if len(rest) == 1 and rest[0] in types:
            return _Route("collection", types[rest[0]])
        if len(rest) == 2 and rest[0] in types and not types[rest[0]].namespaced:
            return _Route("object", types[rest[0]], name=rest[1])
        if len(rest) in (3, 4) and rest[0] == "namespaces":
            rt = types.get(rest[2])
            if rt is not None and rt.namespaced:
                name = rest[3] if len(rest) == 4 else None
                return _Route("object" if name else "collection", rt, rest[1], name)
        raise _ApiError(404, _MESSAGES[404])

    async def _dispatch(
        self, request: web.Request, route: _Route, query: dict[str, str], body: Any
    ) -> web.StreamResponse:
        method = request.method
        if route.rt is None:
            if method != "GET":
                raise _ApiError(405, _MESSAGES[405])
            return self._respond(self._discovery(route))
        rt = route.rt
        if route.kind == "collection":
            if method == "GET":
                if _parse_bool(query, "watch"):
                    return await self._watch(request, rt, route.namespace, query)
                with self._lock:
                    held = self._held_lists.pop(rt.resource, 0.0)
                await asyncio.sleep(held)
                return self._respond(self._list(rt, route.namespace, query))
            if method == "POST" and (rt.custom or rt.writable) and route.namespace is not None:
                return self._respond(self._create(rt, route.namespace, body), 201)
        else:
            assert route.name is not None
            if method == "GET":
                return self._respond(self._get(rt, route.namespace, route.name))
            if method == "PUT" and (rt.custom or rt.writable):
                return self._respond(self._replace(rt, route.namespace, route.name, body))
            if method == "DELETE" and rt.custom:
                return self._respond(self._delete(rt, route.namespace, route.name, body))
        raise _ApiError(405, _MESSAGES[405])

    def _discovery(self, route: _Route) -> JSON:
        if route.kind == "version":
            return {
                "major": "1",
                "minor": "37",
                "gitVersion": "v1.37.0",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25.0",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if route.kind == "api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                ],
            }
        groups: dict[str, JSON] = {}
        for rt in self.types.values():
            if rt.group:
                entry = {"groupVersion": rt.api_version, "version": rt.version}
                groups[rt.group] = {
                    "name": rt.group,
                    "versions": [entry],
                    "preferredVersion": entry,
                }
        if route.kind == "apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(groups.values())}
        if route.kind == "group":
            return {"kind": "APIGroup", "apiVersion": "v1", **groups[route.group]}
        gv = f"{route.group}/{route.version}" if route.group else route.version
        resources = [
            {
                "name": rt.resource,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": rt.verbs,
                **({"shortNames": list(rt.short_names)} if rt.short_names else {}),
            }
            for rt in self.types.values()
            if rt.api_version == gv
        ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }

    # ----- list and get -----

    @staticmethod
    def _reject_selectors(query: Mapping[str, str]) -> None:
        for name in ("labelSelector", "fieldSelector"):
            if query.get(name):
                raise _ApiError(400, f"the fake API server does not implement {name}")

    def _list(self, rt: ResourceType, namespace: str | None, query: Mapping[str, str]) -> bytes:
        """A list page, encoded (as `_dumps` would encode it, items encoded once each)."""
        self._reject_selectors(query)
        rv_param = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        token = query.get("continue", "")
        try:
            limit = int(query.get("limit", "0") or "0")
        except ValueError as exc:
            raise _ApiError(400, f"invalid limit: {query.get('limit')}") from exc
        if limit > 0 and self.page_size:
            limit = min(limit, self.page_size)
        start = ""
        with self._lock:
            if token:
                if rv_param not in ("", "0"):
                    raise _ApiError(
                        400, "specifying resource version is not allowed when using continue"
                    )
                list_rv, start = _decode_continue(token)
                if list_rv == -1:  # the "inconsistent" token handed out with a 410
                    list_rv = self._rv
                elif list_rv < self._compacted_rv:
                    raise _ApiError(
                        410,
                        "The provided continue parameter is too old to display a consistent list"
                        " result. You can start a new list without the continue parameter, or use"
                        " the continue token in this response to retrieve the remainder of the"
                        " results. Continuing with the provided token results in an inconsistent"
                        " list - objects that were created, modified, or deleted between the time"
                        " the first chunk was returned and now may show up in the list.",
                        list_meta={"continue": _encode_continue(-1, start[:-1])},
                    )
            elif rv_param in ("", "0"):
                list_rv = self._rv
            else:
                requested = _parse_rv(rv_param)
                if requested > self._rv:
                    raise _too_large(requested, self._rv)
                exact = match == "Exact" or (not match and limit > 0)
                if exact and requested < self._compacted_rv:
                    raise _ApiError(410, "The resourceVersion for the provided list is too old.")
                list_rv = requested if exact else self._rv
            state, ordered = self._sorted_state_at(rt, list_rv)
        # The keys under the prefix are one run of the sorted keys; take the page by bisection.
        prefix = f"{namespace}/" if namespace is not None else ""
        first = bisect.bisect_left(ordered, max(prefix, start))
        end = bisect.bisect_left(ordered, _prefix_end(prefix)) if prefix else len(ordered)
        stop = min(first + limit, end) if limit > 0 else end
        page = ordered[first:stop]
        meta: JSON = {"resourceVersion": str(list_rv)}
        if stop < end:
            meta["continue"] = _encode_continue(list_rv, page[-1])
            meta["remainingItemCount"] = end - stop
        items = b",".join([self._item_bytes(rt, k, state[k]) for k in page])
        head = _dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta})
        return head[:-2] + b',"items":[' + items + b"]}\n"  # head ends with b"}\n"

    def _item_bytes(self, rt: ResourceType, key: str, obj: JSON) -> bytes:
        """One list item's JSON, encoded once per stored version of the object."""
        cache = self._item_cache[rt.resource]
        hit = cache.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        item = obj
        if not rt.custom:  # typed lists: the server leaves kind/apiVersion off the items
            item = {f: v for f, v in obj.items() if f not in ("kind", "apiVersion")}
        data = _dumps(item)[:-1]
        cache[key] = (obj, data)  # the stored dict itself: a new version is a new dict
        return data

    def _get(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        with self._lock:
            obj = self._objects[rt.resource].get(self._key(rt, namespace, name))
        if obj is None:
            raise _not_found(rt, name)
        return obj

    # ----- writes (custom resources, and typed ones marked writable) -----

    @staticmethod
    def _check_body(rt: ResourceType, namespace: str | None, body: Any) -> JSON:
        if not isinstance(body, dict):
            raise _ApiError(400, "the body of the request was in an unknown format")
        if not rt.custom:
            # A typed object's decoder takes a missing apiVersion/kind from the URL.
            body = {"apiVersion": rt.api_version, "kind": rt.kind} | {
                k: v for k, v in body.items() if k not in ("apiVersion", "kind") or v
            }
        if body.get("apiVersion") != rt.api_version or body.get("kind") != rt.kind:
            raise _ApiError(
                400,
                f"the API version in the data ({body.get('apiVersion')}) does not match the"
                f" expected API version ({rt.api_version})"
                if body.get("apiVersion") != rt.api_version
                else f"the kind in the data ({body.get('kind')}) does not match {rt.kind}",
            )
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _ApiError(400, "metadata must be an object")
        if namespace is not None:
            if meta.get("namespace") not in (None, "", namespace):
                raise _ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on"
                    " the request",
                )
            meta["namespace"] = namespace
        if rt is LEASES:
            _check_micro_times(obj)
        return obj

    def _create(self, rt: ResourceType, namespace: str, body: Any) -> JSON:
        obj = self._check_body(rt, namespace, body)
        meta = obj["metadata"]
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise _invalid(
                rt, "", "metadata.name", "Required value: name or generateName is required"
            )
        if meta.get("resourceVersion"):
            raise _ApiError(
                500,
                "Internal error occurred: resourceVersion should not be set on objects to be"
                " created",
            )
        key = self._key(rt, namespace, meta["name"])
        with self._lock:
            if key in self._objects[rt.resource]:
                details: JSON = {"name": meta["name"], "group": rt.group, "kind": rt.resource}
                raise _ApiError(
                    409,
                    f'{rt.group_resource} "{meta["name"]}" already exists',
                    reason="AlreadyExists",
                    details=details,
                )
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if rt.custom:
                meta["generation"] = 1
            self._commit(rt, "ADDED", key, obj)
        return obj

    def _replace(self, rt: ResourceType, namespace: str | None, name: str, body: Any) -> JSON:
        obj = self._check_body(rt, namespace, body)
        meta = obj["metadata"]
        if meta.get("name") != name:
            raise _ApiError(
                400,
                f"the name of the object ({meta.get('name')}) does not match the name on the URL"
                f" ({name})",
            )
        key = self._key(rt, namespace, name)
        with self._lock:
            old = self._objects[rt.resource].get(key)
            if old is None:
                raise _not_found(rt, name)
            given = meta.get("resourceVersion")
            if not given:
                raise _invalid(
                    rt,
                    name,
                    "metadata.resourceVersion",
                    "Invalid value: 0x0: must be specified for an update",
                )
            if given != old["metadata"]["resourceVersion"]:
                raise _conflict(
                    rt,
                    name,
                    "the object has been modified; please apply your changes to the latest"
                    " version and try again",
                )
            self._carry_server_fields(rt, old, obj)
            meta["resourceVersion"] = old["metadata"]["resourceVersion"]
            if obj == old:  # a no-op update: no new resourceVersion, no event
                return old
            self._commit(rt, "MODIFIED", key, obj)
        return obj

    def _delete(self, rt: ResourceType, namespace: str | None, name: str, body: Any) -> JSON:
        key = self._key(rt, namespace, name)
        with self._lock:
            old = self._objects[rt.resource].get(key)
            if old is None:
                raise _not_found(rt, name)
            pre = body.get("preconditions") if isinstance(body, dict) else None
            if isinstance(pre, dict):
                old_meta = old["metadata"]
                for field_name, label in (("resourceVersion", "ResourceVersion"), ("uid", "UID")):
                    want = pre.get(field_name)
                    if want and want != old_meta.get(field_name):
                        raise _conflict(
                            rt,
                            name,
                            f"Precondition failed: {label} in precondition: {want}, {label} in"
                            f" object meta: {old_meta.get(field_name)}",
                        )
            self._commit(rt, "DELETED", key, copy.deepcopy(old))
        return old  # custom resources return the deleted object, at its last resourceVersion

    # ----- watch -----

    async def _watch(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        query: Mapping[str, str],
    ) -> web.StreamResponse:
        self._reject_selectors(query)
        rv_param = query.get("resourceVersion", "")
        bookmarks = bool(_parse_bool(query, "allowWatchBookmarks"))
        send_initial = _parse_bool(query, "sendInitialEvents")
        try:
            timeout = int(query.get("timeoutSeconds", "0") or "0")
        except ValueError as exc:
            raise _ApiError(400, f"invalid timeoutSeconds: {query.get('timeoutSeconds')}") from exc
        loop = asyncio.get_running_loop()
        with self._lock:
            current = self._rv
            start = current if rv_param in ("", "0") else _parse_rv(rv_param)
            if start > current:
                raise _too_large(start, current)
            watcher = _Watcher(rt, namespace, bookmarks, loop, start)
            if start < self._compacted_rv:
                watcher.push(_Item("expire", rv=self._compacted_rv))
            else:
                initial = send_initial if send_initial is not None else rv_param in ("", "0")
                if initial:  # "Get State and Start at Most Recent": synthetic ADDED events
                    state = self._objects[rt.resource]
                    for key in sorted(state):
                        if watcher.wants(key):
                            line = _dumps({"type": "ADDED", "object": state[key]})
                            watcher.push(_Item("data", line, current))
                    if send_initial and bookmarks:
                        watcher.push(_Item("data", self._bookmark_line(rt, current, True), current))
                else:  # "Start at Exact": every change after the given resourceVersion
                    for event in self._history:
                        if event.rv > start and event.resource == rt.resource:
                            if watcher.wants(event.key):
                                watcher.push(_Item("data", event.line, event.rv))
                self._watchers.add(watcher)
        response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "application/json",
                "Cache-Control": "no-cache, private",
                "Audit-Id": str(uuid.uuid4()),
            },
        )
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            deadline = loop.time() + timeout if timeout > 0 else None
            while True:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    break
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), left)
                except TimeoutError:
                    break
                await self._unstalled()
                if item.kind == "close":
                    break
                if item.kind == "expire":
                    status = _status(
                        410, f"too old resource version: {watcher.last_rv} ({item.rv})"
                    )
                    await response.write(_dumps({"type": "ERROR", "object": status}))
                    break
                await response.write(item.data)
                watcher.last_rv = item.rv
            await self._unstalled()
            await response.write_eof()
            return response
        except ConnectionError:  # the client went away mid-stream
            return response
        finally:
            with self._lock:
                self._watchers.discard(watcher)
