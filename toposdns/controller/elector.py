"""Leader election with a coordination.k8s.io/v1 Lease, as client-go's leaderelection package.

- A candidate reads the Lease every retry period (jittered by up to 1.2x). It takes the Lease
  when it does not exist, when it has no holder (released), or when its record has not changed
  for leaseDurationSeconds as measured on the candidate's own clock since it last saw the record
  change (so clock skew between replicas does not matter). Taking it from another holder
  increments leaseTransitions.
- The leader renews every retry period. If it has not renewed for the renew deadline, it steps
  down and stops writing, then competes again as a candidate; since the deadline is shorter
  than the lease duration, it has stopped before anyone else can take over.
- Every write carries the resourceVersion read, so two candidates never both win (409).
- `release()` (on SIGTERM) empties holderIdentity and sets leaseDurationSeconds to 1, like
  client-go's ReleaseOnCancel, so that another replica takes over at its next retry.

Why not `kubernetes.aio.leaderelection`: it has no release on shutdown, keeps no
leaseTransitions, writes times through `str(datetime)` (naive local time, microseconds dropped
when they are zero, which the API server's MicroTime refuses), logs every lost race with a
traceback, and returns for good after losing the lease instead of competing again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from toposdns.controller.config import JITTER_FACTOR, LeaseSettings
from toposdns.kube.client import NETWORK_ERRORS, Apis, request
from toposdns.metrics import CONTROLLER_LEADER, CONTROLLER_LEADER_TRANSITIONS

log = logging.getLogger("toposdns")

Object = dict[str, Any]
#: How long a release may take at shutdown.
RELEASE_TIMEOUT = 2.0


def micro_time(now: datetime) -> str:
    """A MicroTime for the Lease.

    The generated client turns the value into a datetime and back with isoformat(), which
    leaves the fraction out when it is zero; the API server's MicroTime needs exactly six
    fraction digits. So the fraction is never zero (one microsecond off at most)."""
    if now.microsecond == 0:
        now = now.replace(microsecond=1)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(spec: Any) -> tuple[Any, ...]:
    spec = spec if isinstance(spec, dict) else {}
    return tuple(
        spec.get(k) for k in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime")
    ) + (spec.get("leaseTransitions") or 0,)


class LeaseElector:
    """Compete for one Lease; `on_change(leading)` is called as leadership comes and goes."""

    def __init__(
        self,
        apis: Apis,
        namespace: str,
        settings: LeaseSettings,
        identity: str,
        on_change: Callable[[bool], None] = lambda leading: None,
        request_timeout: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = apis.coordination
        self.reachability = apis.reachability
        self.namespace = namespace
        self.settings = settings
        self.identity = identity
        self.on_change = on_change
        self.request_timeout = request_timeout
        self.clock = clock
        self.wall = wall
        self.leading = False
        self._lease: Object | None = None  # the Lease as last read or written
        self._observed: tuple[Any, ...] | None = None  # its record, and when it last changed
        self._observed_at = 0.0
        self._renewed_at = -math.inf  # when this replica last acquired or renewed

    @property
    def where(self) -> str:
        """The Lease, as `namespace/name` for messages."""
        return f"{self.namespace}/{self.settings.name}"

    def may_write(self) -> bool:
        """True while leading and within the renew deadline of the last renewal."""
        return self.leading and self.clock() < self._renewed_at + self.settings.renew_deadline

    async def run(self) -> None:
        """Compete and renew until cancelled (leadership then stays until `release()`)."""
        while True:
            try:
                acquired = await self.try_acquire_or_renew()
            except Exception:  # a Lease the client cannot handle: keep competing, but say so
                log.exception("Lease %s: acquiring or renewing failed", self.where)
                acquired = False
            if acquired and not self.leading:
                log.info("leading: holding Lease %s as %s", self.where, self.identity)
                self._set_leading(True)
            elif not acquired and self.leading and not self.may_write():
                log.warning(
                    "stopped leading: could not renew Lease %s within %gs; no more writes "
                    "until it is acquired again",
                    self.where,
                    self.settings.renew_deadline,
                )
                self._set_leading(False)
            period = self.settings.retry_period
            if not self.leading:
                period *= random.uniform(1, JITTER_FACTOR)
            await asyncio.sleep(period)

    async def try_acquire_or_renew(self) -> bool:
        """One round of client-go's tryAcquireOrRenew; True if this replica holds the Lease."""
        # The leader renews from the Lease it wrote last, without reading it first.
        if self.leading and self._lease is not None and self.may_write():
            if await self._update(self._lease, self._record_for(self._lease)):
                return True
        status, lease = await self._call(
            self.api.read_namespaced_lease_without_preload_content,
            self.settings.name,
            self.namespace,
        )
        if status == 404:
            return await self._create()
        if status != 200 or not isinstance(lease, dict):
            return False
        found = lease.get("spec")
        spec: Object = found if isinstance(found, dict) else {}
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        holder = spec.get("holderIdentity") or ""
        duration = spec.get("leaseDurationSeconds")
        duration = duration if isinstance(duration, int) else 0
        if holder and holder != self.identity and self._observed_at + duration > self.clock():
            self._lease = None
            if self.leading:  # another replica took it: stop writing now, not at the deadline
                self._renewed_at = -math.inf
            return False  # another replica holds it and it has not expired
        return await self._update(lease, self._record_for(lease))

    async def release(self) -> None:
        """Give the Lease up if held (holder emptied, duration 1 s, as client-go's
        ReleaseOnCancel), so that another replica takes over at its next retry; then stop
        leading. The writers must have stopped already."""
        lease, self._lease = self._lease, None
        was_leading = self.leading
        self._set_leading(False)
        if not was_leading:
            return
        for _ in range(2):
            if lease is None:  # the cached Lease was stale: read it, and release if still ours
                status, lease = await self._call(
                    self.api.read_namespaced_lease_without_preload_content,
                    self.settings.name,
                    self.namespace,
                    timeout=RELEASE_TIMEOUT,
                )
                spec = lease.get("spec") if isinstance(lease, dict) else None
                if status != 200 or not isinstance(spec, dict):
                    return
                if spec.get("holderIdentity") != self.identity:
                    return
            assert lease is not None
            now = micro_time(self.wall())
            spec = dict(lease.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1, acquireTime=now, renewTime=now)
            status, _ = await self._call(
                self.api.replace_namespaced_lease_without_preload_content,
                self.settings.name,
                self.namespace,
                _body(lease, spec),
                timeout=RELEASE_TIMEOUT,
            )
            if status == 200:
                log.info("released Lease %s", self.where)
                return
            if status != 409:
                break
            lease = None
        log.warning(
            "could not release Lease %s; another replica takes over once it expires", self.where
        )

    # ----- internals -----

    def _record_for(self, lease: Object) -> Object:
        """The spec that makes this replica the holder of `lease`, renewed now."""
        spec = dict(lease.get("spec") or {})
        now = micro_time(self.wall())
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) else 0
        if spec.get("holderIdentity") != self.identity:  # taken over (or a released one)
            spec["acquireTime"] = now
            transitions += 1
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, math.ceil(self.settings.duration)),
            renewTime=now,
            leaseTransitions=transitions,
        )
        return spec

    async def _create(self) -> bool:
        now = micro_time(self.wall())
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.settings.duration)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        }
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.settings.name, "namespace": self.namespace},
            "spec": spec,
        }
        status, lease = await self._call(
            self.api.create_namespaced_lease_without_preload_content, self.namespace, body
        )
        return self._won(status, lease)

    async def _update(self, lease: Object, spec: Object) -> bool:
        status, written = await self._call(
            self.api.replace_namespaced_lease_without_preload_content,
            self.settings.name,
            self.namespace,
            _body(lease, spec),
        )
        if status == 409:
            self._lease = None  # someone else wrote it: read it again next time
        return self._won(status, written)

    def _won(self, status: int, lease: Any) -> bool:
        if status not in (200, 201) or not isinstance(lease, dict):
            return False
        self._lease = lease
        self._observed, self._observed_at = _record(lease.get("spec")), self.clock()
        self._renewed_at = self.clock()
        return True

    async def _call(self, call: Any, *args: Any, timeout: float | None = None) -> tuple[int, Any]:
        """One request: (status, decoded body); status 0 for a network error or timeout.

        The leader's requests end by its renew deadline, so a hung request cannot keep it
        writing past the point where another replica may take over."""
        limit = timeout or self.request_timeout
        if self.leading:
            limit = min(limit, self._renewed_at + self.settings.renew_deadline - self.clock())
        if limit <= 0:
            return 0, None
        try:
            reply = await request(call, *args, timeout=limit)
        except NETWORK_ERRORS as exc:
            # Logged once for the whole outage, with the watches (kube/client.py Reachability).
            self.reachability.failed(exc)
            log.debug("Lease %s: %s", self.where, str(exc) or type(exc).__name__)
            return 0, None
        self.reachability.answered()
        status = reply.status
        if status >= 400 and status not in (404, 409):
            hint = "; grant the Role in manifests/controller/rbac.yaml" if status == 403 else ""
            log.warning("Lease %s: HTTP %d: %s%s", self.where, status, reply.message, hint)
        return status, reply.body

    def _set_leading(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        CONTROLLER_LEADER.set(1 if leading else 0)
        CONTROLLER_LEADER_TRANSITIONS.labels("acquired" if leading else "lost").inc()
        self.on_change(leading)


def _body(lease: Object, spec: Object) -> Object:
    """`lease` with `spec`, as an update body (managedFields left out: the server keeps them)."""
    metadata = {k: v for k, v in (lease.get("metadata") or {}).items() if k != "managedFields"}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
            "spec": spec}  # fmt: skip
