"""Make one locator what the caches say it should be, through the API, with retries.

`LocatorWriter.sync(key)` plans the write (reconcile.plan) and makes it:

- update answered 404 (deleted meanwhile) -> create;
- create answered 409 (it exists after all) -> get, then update;
- update or delete answered 409 (someone changed it) -> re-read it, and retry with backoff;
- 429, 5xx, timeouts, network errors -> re-read, and retry with backoff (the write may or may
  not have happened); other errors are logged with what to do, and retried with backoff.

Every request first takes a token from the bucket (`--writes-per-second`) and checks that this
replica still leads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from toposdns.controller.config import ControllerConfig
from toposdns.controller.desired import Object
from toposdns.controller.queue import TokenBucket
from toposdns.controller.reconcile import Create, Delete, Foreign, Update, plan
from toposdns.controller.state import ClusterState, Key
from toposdns.kube.client import NETWORK_ERRORS, Apis, Reply, message_of, request
from toposdns.kube.resources import POD_LOCATOR
from toposdns.metrics import CONTROLLER_WRITES

log = logging.getLogger("toposdns")

FIELD_MANAGER = "toposdns-controller"
#: Plan-and-write rounds within one sync (create -> 409 -> get -> update is two).
MAX_ROUNDS = 3


class Retry(Exception):
    """The key could not be brought up to date now; try again after a backoff."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.after = after


class NotLeader(Exception):
    """This replica no longer leads: it must not write."""


def result_of(status: int) -> str:
    """The `result` label of a request's outcome."""
    if 200 <= status < 300:
        return "ok"
    return {404: "not_found", 409: "conflict", 429: "throttled"}.get(
        status, "server_error" if status >= 500 else "error"
    )


class LocatorWriter:
    """Writes locators for the leader."""

    def __init__(
        self,
        apis: Apis,
        state: ClusterState,
        config: ControllerConfig,
        bucket: TokenBucket,
        may_write: Callable[[], bool],
    ) -> None:
        self.custom = apis.custom
        self.state = state
        self.config = config
        self.bucket = bucket
        self.may_write = may_write
        #: Keys whose cached locator is not to be trusted (after a conflict or a failed write).
        self.reread: set[Key] = set()
        self.counts = {"create": 0, "update": 0, "delete": 0}
        self._warned_foreign: set[Key] = set()
        self._last_warning: dict[tuple[str, int], float] = {}

    async def sync(self, key: Key) -> None:
        """Bring the locator at `key` up to date. Raises Retry or NotLeader."""
        if key in self.reread:
            self.state.observe(key, await self._get(key))
            self.reread.discard(key)
        for _ in range(MAX_ROUNDS):
            action = plan(self.state.want(key), self.state.locators.get(key))
            if action is None:
                return
            if isinstance(action, Foreign):
                if key not in self._warned_foreign:
                    self._warned_foreign.add(key)
                    log.warning(
                        "PodLocator %s/%s exists without the label "
                        "app.kubernetes.io/managed-by=toposdns: leaving it alone; delete it "
                        "to let the controller manage it",
                        *key,
                    )
                return
            if await self._write(key, action):
                return
        self.reread.add(key)
        raise Retry(f"{key[0]}/{key[1]} kept changing while being written")

    async def _write(self, key: Key, action: Create | Update | Delete) -> bool:
        """Make one write; True when done, False to plan again from what was learnt."""
        namespace, name = key
        if isinstance(action, Create):
            status, body, after = await self._request(
                "create",
                key,
                self.custom.create_namespaced_custom_object_without_preload_content,
                POD_LOCATOR.group,
                POD_LOCATOR.version,
                namespace,
                POD_LOCATOR.plural,
                action.body,
                field_manager=FIELD_MANAGER,
            )
            if status in (200, 201):
                self.state.observe(key, body)
                self.counts["create"] += 1
                return True
            if status == 409:  # AlreadyExists: its watch event has not arrived yet
                self.state.observe(key, await self._get(key))
                return False
        elif isinstance(action, Update):
            status, body, after = await self._request(
                "update",
                key,
                self.custom.replace_namespaced_custom_object_without_preload_content,
                POD_LOCATOR.group,
                POD_LOCATOR.version,
                namespace,
                POD_LOCATOR.plural,
                name,
                action.body,
                field_manager=FIELD_MANAGER,
            )
            if status == 200:
                self.state.observe(key, body)
                self.counts["update"] += 1
                return True
            if status == 404:  # deleted meanwhile: create it
                self.state.observe(key, None)
                return False
        else:
            status, body, after = await self._request(
                "delete",
                key,
                self.custom.delete_namespaced_custom_object_without_preload_content,
                POD_LOCATOR.group,
                POD_LOCATOR.version,
                namespace,
                POD_LOCATOR.plural,
                name,
                body={"preconditions": {"uid": action.uid, "resourceVersion": action.version}},
            )
            if status in (200, 202, 404):
                self.state.observe(key, None)
                self.counts["delete"] += status != 404
                return True
        self.reread.add(key)
        verb = type(action).__name__.lower()
        if status == 409:
            raise Retry(f"{verb} {namespace}/{name}: changed meanwhile (409), re-reading")
        if status == 429 or status >= 500:
            raise Retry(f"{verb} {namespace}/{name}: HTTP {status}", after)
        self._warn_failure(verb, key, status, body)
        raise Retry(f"{verb} {namespace}/{name}: HTTP {status}", after)

    async def _get(self, key: Key) -> Object | None:
        """The locator at `key` as stored now, or None."""
        status, body, after = await self._request(
            "get",
            key,
            self.custom.get_namespaced_custom_object_without_preload_content,
            POD_LOCATOR.group,
            POD_LOCATOR.version,
            key[0],
            POD_LOCATOR.plural,
            key[1],
        )
        if status == 200 and isinstance(body, dict):
            return body
        if status == 404:
            return None
        if status != 429 and status < 500:
            self._warn_failure("get", key, status, body)
        raise Retry(f"get {key[0]}/{key[1]}: HTTP {status}", after)

    async def _request(self, verb: str, key: Key, call: Any, *args: Any, **kwargs: Any) -> Reply:
        """One API request under the rate limit, counted by verb and result."""
        if not self.may_write():
            raise NotLeader()
        await self.bucket.take()
        if not self.may_write():
            raise NotLeader()
        try:
            reply = await request(call, *args, timeout=self.config.request_timeout, **kwargs)
        except NETWORK_ERRORS as exc:
            CONTROLLER_WRITES.labels(verb, "network").inc()
            self.reread.add(key)
            raise Retry(f"{verb} {key[0]}/{key[1]}: {exc or type(exc).__name__}") from None
        CONTROLLER_WRITES.labels(verb, result_of(reply.status)).inc()
        return reply

    def _warn_failure(self, verb: str, key: Key, status: int, body: Any) -> None:
        """Log a failure that retrying alone will not fix, at most every 30 s per kind."""
        now = time.monotonic()
        if now - self._last_warning.get((verb, status), -60.0) < 30.0:
            return
        self._last_warning[(verb, status)] = now
        message = message_of(body)
        hint = {
            401: "the controller's credentials were refused",
            403: "grant the rights in manifests/controller/rbac.yaml",
            404: "install the PodLocator CRD (kubectl apply -k manifests/crd) and check that "
            "the namespace exists",
            422: "the CRD refused the locator; compare manifests/crd/podlocators.yaml with the "
            "CRD installed",
        }.get(status, "retrying with backoff")
        log.error(
            "cannot %s PodLocator %s/%s: HTTP %d: %s; %s (retrying with backoff)",
            verb,
            key[0],
            key[1],
            status,
            message,
            hint,
        )
