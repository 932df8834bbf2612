"""The official client: how it is built, and the one way its raw API calls are made.

Every call leaves the body unread by the client (`_preload_content=False`: lists and watches
through `list_all`, the controller's other calls through the `*_without_preload_content`
methods), so that bodies stay raw JSON (dicts): no OpenAPI model is built per object, and every
status is the caller's to handle.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import aiohttp
import orjson

log = logging.getLogger("toposdns")

#: What a request that got no answer raises: the API server is down, unreachable or too slow.
NETWORK_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)


class ConnectError(Exception):
    """No way to reach the cluster: neither in-cluster credentials nor a usable kubeconfig."""


class Reachability:
    """Whether the API server answers, for every caller of one process together: one line when
    requests stop getting answers, one when one is answered again, however many callers retry
    in between (each of them logs its own failures at debug level only)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.clock = clock
        self.wall = wall
        #: When the first unanswered request of this outage failed (clock); None while answered.
        self.down_since: float | None = None

    def failed(self, error: BaseException) -> None:
        """A request got no answer (one of NETWORK_ERRORS)."""
        if self.down_since is None:
            self.down_since = self.clock()
            log.warning(
                "API unreachable since %s: %s; keeping the last data and retrying",
                self.wall().strftime("%H:%M:%S"),
                str(error) or type(error).__name__,
            )

    def answered(self) -> None:
        """A request got an answer, whatever its status."""
        if self.down_since is not None:
            log.info("API back after %.1fs", self.clock() - self.down_since)
            self.down_since = None


@functools.cache
def aio_client() -> tuple[ModuleType, ModuleType]:
    """`kubernetes.aio.client` and `kubernetes.aio.config`, without the packages around them.

    Importing them the usual way first runs `kubernetes/__init__.py` and
    `kubernetes/aio/__init__.py`, which import the whole synchronous client, the dynamic
    client, `requests`, OAuth and schema validators: 0.5 s of CPU and 16 MB, none of them used
    here. So, when neither package is loaded yet, both stand in empty (found, not run) for as
    long as these two import, and are dropped after: a later `import kubernetes` runs them in
    full, and finds these modules already loaded."""
    hollow = []
    try:
        if "kubernetes.aio" not in sys.modules and "kubernetes" not in sys.modules:
            parent: ModuleType | None = None
            for name in ("kubernetes", "kubernetes.aio"):
                path = None if parent is None else parent.__path__
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None:
                    break  # not installed as files: import it whole below
                module = importlib.util.module_from_spec(spec)
                sys.modules[name] = module
                hollow.append(name)
                if parent is not None:
                    setattr(parent, name.rpartition(".")[2], module)  # as an import would
                parent = module
        return (
            importlib.import_module("kubernetes.aio.client"),
            importlib.import_module("kubernetes.aio.config"),
        )
    finally:
        for name in hollow:
            del sys.modules[name]


@dataclass(frozen=True, slots=True)
class Apis:
    """The ApiClient, and the typed API groups of the official client over it that the
    controller calls (each imported on first use: the DNS source needs none of them)."""

    client: Any
    #: Shared by every caller of these APIs: one log line per outage, not one per retry.
    reachability: Reachability = field(default_factory=Reachability)

    @property
    def custom(self) -> Any:
        """CustomObjectsApi."""
        return aio_client()[0].CustomObjectsApi(self.client)

    @property
    def coordination(self) -> Any:
        """CoordinationV1Api."""
        return aio_client()[0].CoordinationV1Api(self.client)


async def connect(kubeconfig: Path | None) -> Any:
    """An ApiClient: in-cluster service account, else the kubeconfig (default ~/.kube/config)."""
    client, config = aio_client()

    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            # Re-reads the projected token as it rotates.
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            pass
    # The files the client would read: --kubeconfig, else $KUBECONFIG (a list), else the default.
    where = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG") or "~/.kube/config"
    if not [path for path in where.split(os.pathsep) if path and Path(path).expanduser().exists()]:
        # Checked here: the client would log a line of its own, then fail on an empty config.
        raise ConnectError(
            f"not in a cluster, and the kubeconfig {where} does not exist; pass --kubeconfig FILE"
        )
    try:
        await config.load_kube_config(config_file=where, client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise ConnectError(
            f"not in a cluster, and cannot use the kubeconfig {where}: {exc}; "
            "pass --kubeconfig FILE"
        ) from None
    return client.ApiClient(configuration)


def apis_of(api_client: Any) -> Apis:
    """The API groups over one ApiClient."""
    return Apis(api_client)


#: The list and watch parameters reflectors pass, and their names in the query string.
_QUERY = {
    "limit": "limit",
    "_continue": "continue",
    "watch": "watch",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
}


def list_all(
    apis: Apis, api_version: str, plural: str
) -> Callable[..., Awaitable[aiohttp.ClientResponse]]:
    """The cluster-wide list (or watch) of a resource, `/api/v1/{plural}` for the core group,
    else `/apis/{api_version}/{plural}`, as the generated client's
    `list_*_without_preload_content` methods make it.

    Made through the ApiClient itself: the generated CoreV1Api class alone costs 1.4 s of CPU
    to import (a thousand validated methods), more than a sync's decoding of 150,000 objects."""
    api_client = apis.client
    path = f"/api/v1/{plural}" if api_version == "v1" else f"/apis/{api_version}/{plural}"

    async def call(_request_timeout: float | None = None, **params: Any) -> aiohttp.ClientResponse:
        unknown = set(params) - set(_QUERY)
        if unknown:
            raise TypeError(f"list_all: unexpected parameters {sorted(unknown)}")
        query = [(_QUERY[name], value) for name, value in params.items() if value is not None]
        serialized = await api_client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query,
            header_params={"Accept": "application/json"},  # what the generated client sends
            auth_settings=["BearerToken"],
        )
        response = await api_client.call_api(
            *serialized, _preload_content=False, _request_timeout=_request_timeout
        )
        return response.response  # type: ignore[no-any-return]

    return call


class Reply(NamedTuple):
    """What the API server answered."""

    status: int
    #: The decoded JSON; None for an empty body; the start of the text for one not JSON.
    body: Any
    #: The Retry-After header in seconds (429 and 503 answers), None if absent.
    retry_after: float | None

    @property
    def message(self) -> str:
        """The message of a Status body, or the start of whatever came instead."""
        return message_of(self.body)


class RawReply(NamedTuple):
    """What the API server answered, its body as it came."""

    status: int
    data: bytes
    #: The Retry-After header in seconds (429 and 503 answers), None if absent.
    retry_after: float | None


async def fetch(
    method: Callable[..., Awaitable[aiohttp.ClientResponse]],
    *args: Any,
    timeout: float,
    **kwargs: Any,
) -> RawReply:
    """Call one `*_without_preload_content` method of the client (or `list_all`), bounded by
    `timeout`, and read its body.

    Any status is returned; raises one of NETWORK_ERRORS when no answer came in time."""
    async with asyncio.timeout(timeout):
        response = await method(*args, _request_timeout=timeout, **kwargs)
        try:
            data = await response.read()
            status = int(response.status)
            after = _seconds(response.headers.get("Retry-After"))
        finally:
            response.release()
    return RawReply(status, data, after)


async def request(
    method: Callable[..., Awaitable[aiohttp.ClientResponse]],
    *args: Any,
    timeout: float,
    **kwargs: Any,
) -> Reply:
    """`fetch`, its body decoded."""
    status, data, after = await fetch(method, *args, timeout=timeout, **kwargs)
    return Reply(status, decode(data), after)


def decode(data: bytes) -> Any:
    """A body decoded: its JSON, None if empty, else the start of its text (for messages).

    orjson rather than the standard library: a list page of 500 objects decodes in a third of
    the time, and its object keys ("metadata", "name", ...) are shared strings."""
    if not data:
        return None
    try:
        return orjson.loads(data)
    except ValueError:  # orjson.JSONDecodeError is one
        return data[:200].decode("utf-8", "replace")


def message_of(body: Any) -> str:
    """The message of a decoded Status (or watch ERROR) object, or the start of what came."""
    if isinstance(body, dict):
        return str(body.get("message") or body.get("reason") or body)[:300]
    return "" if body is None else str(body)[:200]


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
