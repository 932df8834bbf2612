"""Keep the snapshot's indexes up to date one change at a time, and publish copies of them.

A large cluster has ~100,000 PodLocators; rebuilding every index on each watch event would cost
far more than the event. The builder instead applies each change to mutable indexes whose values
are immutable tuples, and `snapshot()` copies only the indexes that changed since the last one
(a shallow dict copy), sharing the rest with the previous snapshot. An update equal to what is
stored (a resourceVersion bump, a status-only change) changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TypeVar

from toposdns.store.model import (
    HEADLESS,
    Endpoint,
    EndpointSlice,
    PodLocator,
    Record,
    Service,
    canonical_ip,
)
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import Policy, policy_for

Key = tuple[str, str]
SliceRef = tuple[EndpointSlice, Endpoint, str]
K = TypeVar("K")
V = TypeVar("V")


def record_key(record: Record) -> tuple[type, str, str]:
    """(kind, namespace, name): what identifies an object."""
    return type(record), getattr(record, "namespace", ""), record.name


class StoreBuilder:
    """The current objects, indexed for DNS, changed in place and published as snapshots."""

    def __init__(self) -> None:
        self._services: dict[Key, Service] = {}
        self._slices: dict[Key, EndpointSlice] = {}
        self._namespaces: set[str] = set()
        self._locators: dict[Key, PodLocator] = {}
        # Indexes, as the snapshot exposes them.
        self._by_service: dict[Key, tuple[EndpointSlice, ...]] = {}
        self._service_ips: dict[str, tuple[Service, ...]] = {}
        self._endpoint_ips: dict[str, tuple[SliceRef, ...]] = {}
        #: The locator placing each address; `_shared` has every claimant of the few
        #: addresses several locators claim (kept apart: one tuple per address costs memory).
        self._combined: dict[str, PodLocator] = {}
        self._shared: dict[str, tuple[PodLocator, ...]] = {}
        self._node_holders: dict[str, dict[Key, PodLocator]] = {}
        self._node_locators: dict[str, PodLocator] = {}
        self._policies: dict[Key, Policy] = {}
        self._dirty: set[str] = set()
        self._last = Snapshot()

    @property
    def dirty(self) -> bool:
        """True if something changed since the last snapshot."""
        return bool(self._dirty)

    def keys(self, kind: type) -> set[tuple[str, str]]:
        """(namespace, name) of every stored object of a kind."""
        if kind is Service:
            return set(self._services)
        if kind is EndpointSlice:
            return set(self._slices)
        if kind is PodLocator:
            return set(self._locators)
        return {("", name) for name in self._namespaces}

    def put(self, record: Record) -> bool:
        """Add or replace an object; False if it equals what is stored."""
        if isinstance(record, Service):
            return self._put_service(record)
        if isinstance(record, EndpointSlice):
            return self._put_slice(record)
        if isinstance(record, PodLocator):
            return self._put_locator(record)
        if record.name in self._namespaces:
            return False
        self._namespaces.add(record.name)
        self._dirty.add("namespaces")
        return True

    def remove(self, kind: type, namespace: str, name: str) -> bool:
        """Delete an object; False if there was none."""
        key = (namespace, name)
        if kind is Service:
            old = self._services.pop(key, None)
            if old is not None:
                self._unindex_service(old)
                self._update_policy((old.namespace, old.name))
            return old is not None
        if kind is EndpointSlice:
            old_slice = self._slices.pop(key, None)
            if old_slice is not None:
                self._unindex_slice(old_slice)
                self._update_policy((old_slice.namespace, old_slice.service))
            return old_slice is not None
        if kind is PodLocator:
            old_locator = self._locators.pop(key, None)
            if old_locator is not None:
                self._unindex_locator(old_locator)
            return old_locator is not None
        if name not in self._namespaces:
            return False
        self._namespaces.discard(name)
        self._dirty.add("namespaces")
        return True

    def replace_all(
        self, kind: type, records: Iterable[Record], keep: Iterable[tuple[str, str]] = ()
    ) -> bool:
        """Make the stored objects of a kind exactly `records` (after a full list), except
        that the objects named in `keep` (namespace, name) stay as they are."""
        changed = False
        seen = set(keep)
        for record in records:
            seen.add((getattr(record, "namespace", ""), record.name))
            changed |= self.put(record)
        for namespace, name in self.keys(kind) - seen:
            changed |= self.remove(kind, namespace, name)
        return changed

    def snapshot(self, serial: int, synced: bool = True) -> Snapshot:
        """A snapshot of the current state; indexes that did not change are shared."""
        dirty = self._dirty
        fields: dict[str, object] = {"serial": serial, "synced": synced}
        if "services" in dirty:
            fields["services"] = dict(self._services)
            fields["service_ips"] = dict(self._service_ips)
        if "slices" in dirty:
            fields["slices"] = dict(self._by_service)
            fields["endpoint_ips"] = dict(self._endpoint_ips)
        if "namespaces" in dirty:
            fields["namespaces"] = frozenset(self._namespaces)
        if "locators" in dirty:
            fields["locators"] = dict(self._combined)
            fields["shared_ips"] = dict(self._shared)
            fields["node_locators"] = dict(self._node_locators)
        if "policies" in dirty:
            fields["policies"] = dict(self._policies)
        self._last = replace(self._last, **fields)  # type: ignore[arg-type]
        self._dirty = set()
        return self._last

    # Services

    def _put_service(self, svc: Service) -> bool:
        key = (svc.namespace, svc.name)
        old = self._services.get(key)
        if old == svc:
            return False
        if old is not None:
            self._unindex_service(old)
        self._services[key] = svc
        for ip in dict.fromkeys(canonical_ip(ip) for ip in svc.cluster_ips):
            self._service_ips[ip] = self._service_ips.get(ip, ()) + (svc,)
        self._dirty.add("services")
        self._update_policy(key)
        return True

    def _unindex_service(self, svc: Service) -> None:
        for ip in dict.fromkeys(canonical_ip(ip) for ip in svc.cluster_ips):
            rest = tuple(s for s in self._service_ips.get(ip, ()) if s is not svc)
            _set_or_drop(self._service_ips, ip, rest)
        self._dirty.add("services")

    # EndpointSlices

    def _put_slice(self, eps: EndpointSlice) -> bool:
        key = (eps.namespace, eps.name)
        old = self._slices.get(key)
        if old == eps:
            return False
        if old is not None:
            self._unindex_slice(old)
        self._slices[key] = eps
        service = (eps.namespace, eps.service)
        self._by_service[service] = self._by_service.get(service, ()) + (eps,)
        for ep in eps.endpoints:
            for address in ep.addresses:
                ip = canonical_ip(address)
                self._endpoint_ips[ip] = self._endpoint_ips.get(ip, ()) + ((eps, ep, address),)
        self._dirty.add("slices")
        self._update_policy(service)
        return True

    def _unindex_slice(self, eps: EndpointSlice) -> None:
        service = (eps.namespace, eps.service)
        _set_or_drop(
            self._by_service,
            service,
            tuple(s for s in self._by_service.get(service, ()) if s is not eps),
        )
        for ep in eps.endpoints:
            for address in ep.addresses:
                ip = canonical_ip(address)
                rest = tuple(ref for ref in self._endpoint_ips.get(ip, ()) if ref[0] is not eps)
                _set_or_drop(self._endpoint_ips, ip, rest)
        self._dirty.add("slices")

    def _update_policy(self, key: Key) -> None:
        svc = self._services.get(key)
        policy = None
        if svc is not None and svc.kind == HEADLESS:
            found = policy_for(svc, self._by_service.get(key, ()))
            policy = found if found.source != "none" else None
        if self._policies.get(key) != policy:
            if policy is None:
                del self._policies[key]
            else:
                self._policies[key] = policy
            self._dirty.add("policies")

    # PodLocators

    def _put_locator(self, locator: PodLocator) -> bool:
        key = (locator.namespace, locator.name)
        old = self._locators.get(key)
        if old == locator:
            return False
        if old is not None:
            self._unindex_locator(old)
        self._locators[key] = locator
        if locator.is_node:
            node = locator.node_name or locator.name
            self._node_holders.setdefault(node, {})[key] = locator
            self._node_locators[node] = _first(self._node_holders[node])
        for ip in dict.fromkeys(locator.addresses):  # canonical already
            current = self._combined.get(ip)
            if current is None:
                self._combined[ip] = locator  # the usual case: one locator per address
                continue
            holders = self._shared.get(ip, (current,)) + (locator,)
            self._shared[ip] = holders
            self._combined[ip] = _choose(holders)
        self._dirty.add("locators")
        return True

    def _unindex_locator(self, locator: PodLocator) -> None:
        key = (locator.namespace, locator.name)
        if locator.is_node:
            node = locator.node_name or locator.name
            holders = self._node_holders.get(node, {})
            holders.pop(key, None)
            if holders:
                self._node_locators[node] = _first(holders)
            else:
                self._node_holders.pop(node, None)
                self._node_locators.pop(node, None)
        for ip in dict.fromkeys(locator.addresses):  # canonical already
            shared = self._shared.get(ip)
            if shared is None:
                if self._combined.get(ip) is locator:
                    del self._combined[ip]
                continue
            rest = tuple(held for held in shared if held is not locator)
            if len(rest) > 1:
                self._shared[ip] = rest
            else:
                del self._shared[ip]
            self._combined[ip] = _choose(rest)
        self._dirty.add("locators")


def _choose(holders: tuple[PodLocator, ...]) -> PodLocator:
    """Which of several locators claiming an address places it: a pod's over a node's.

    Two objects claiming one address is a transient state (a pod replaced, its IP reused);
    the lowest namespace/name wins, so the choice does not depend on event order.
    """
    pods = [held for held in holders if not held.is_node] or list(holders)
    return min(pods, key=lambda held: (held.namespace, held.name))


def _first(holders: dict[Key, PodLocator]) -> PodLocator:
    return holders[min(holders)]


def _set_or_drop(index: dict[K, V], key: K, value: V) -> None:
    if value:
        index[key] = value
    else:
        index.pop(key, None)


def build_snapshot(records: Iterable[Record], serial: int, synced: bool = True) -> Snapshot:
    """Index records into a Snapshot. Input order decides ties (e.g. two services on one IP)."""
    builder = StoreBuilder()
    for record in records:
        builder.put(record)
    return builder.snapshot(serial, synced)
