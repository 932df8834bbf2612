"""Keep the snapshot's indexes up to date one change at a time, and publish them.

A large cluster has ~100,000 PodLocators; rebuilding or copying an index on each watch event
would cost time that grows with the cluster. The indexes are persistent maps
(`immutables.Map`): a change replaces the few trie nodes on its path, and `snapshot()` hands out
the current maps as they are, sharing everything else with the previous snapshot. An update equal
to what is stored (a resourceVersion bump, a status-only change) changes nothing.

Each change also notes what it touched (`Dependency` words: the service, the addresses, the
node); a snapshot carries those notes, so caches drop only the replies that read them.

PodLocators outside the believed namespaces (`placement.believed`) are held, for `explain` and
to be reported once, but never indexed: no answer reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from immutables import Map

from toposdns.store.model import (
    HEADLESS,
    EndpointSlice,
    PodLocator,
    Record,
    Service,
    canonical_ip,
)
from toposdns.store.placement import (
    EVERYWHERE,
    NO_PREFIXES,
    add_prefix,
    believed,
    remove_prefix,
)
from toposdns.store.snapshot import EVERYTHING, Dependency, Snapshot, new_lineage
from toposdns.store.topology import Policy, policy_for

Key = tuple[str, str]
K = TypeVar("K")
V = TypeVar("V")


#: A full list notes a change per object: past this many, a snapshot says that everything
#: changed (its readers start over, as they would anyway), rather than carry a set of 300,000
#: words (25 MB at 150,000 PodLocators) for as long as it is the latest.
MAX_NOTED_CHANGES = 10_000


def record_key(record: Record) -> tuple[type, str, str]:
    """(kind, namespace, name): what identifies an object."""
    return type(record), getattr(record, "namespace", ""), record.name


class StoreBuilder:
    """The current objects, indexed for DNS, changed in place and published as snapshots."""

    def __init__(self, locator_namespaces: frozenset[str] = EVERYWHERE) -> None:
        #: The namespaces whose PodLocators are believed (`--locator-namespaces`).
        self.locator_namespaces = frozenset(locator_namespaces)
        self._slices: dict[Key, EndpointSlice] = {}
        #: namespace -> name -> locator: nested rather than keyed by (namespace, name), which
        #: would cost a tuple per locator (8 MB at 150,000).
        self._locators: dict[str, dict[str, PodLocator]] = {}
        self._node_holders: dict[str, dict[Key, PodLocator]] = {}
        # Indexes, as the snapshot exposes them.
        self._services: Map[Key, Service] = Map()
        self._namespaces: Map[str, bool] = Map()
        self._by_service: Map[Key, tuple[EndpointSlice, ...]] = Map()
        self._service_ips: Map[str, tuple[Service, ...]] = Map()
        self._endpoint_ips: Map[str, EndpointSlice | tuple[EndpointSlice, ...]] = Map()
        #: The locator placing each address; `_shared` has every claimant of the few
        #: addresses several locators claim (kept apart: one tuple per address costs memory).
        self._combined: Map[str, PodLocator] = Map()
        self._shared: Map[str, tuple[PodLocator, ...]] = Map()
        self._node_locators: Map[str, PodLocator] = Map()
        self._prefixes = NO_PREFIXES
        #: The locators held but not believed, by (namespace, name).
        self._ignored: Map[Key, PodLocator] = Map()
        self._policies: Map[Key, Policy] = Map()
        #: What changed since the last snapshot.
        #: None: more than MAX_NOTED_CHANGES, so everything counts as changed.
        self._changes: set[Dependency] | None = set()
        self._last = Snapshot(lineage=new_lineage())

    @property
    def dirty(self) -> bool:
        """True if something changed since the last snapshot."""
        return self._changes is None or bool(self._changes)

    def keys(self, kind: type) -> set[tuple[str, str]]:
        """(namespace, name) of every stored object of a kind."""
        if kind is Service:
            return set(self._services)
        if kind is EndpointSlice:
            return set(self._slices)
        if kind is PodLocator:
            return {(ns, name) for ns, names in self._locators.items() for name in names}
        return {("", name) for name in self._namespaces}

    def service(self, namespace: str, name: str) -> Service | None:
        """The Service of that name, if the builder holds it."""
        return self._services.get((namespace, name))

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
        self._namespaces = self._namespaces.set(record.name, True)
        self._note(("ns", record.name))
        return True

    def remove(self, kind: type, namespace: str, name: str) -> bool:
        """Delete an object; False if there was none."""
        key = (namespace, name)
        if kind is Service:
            old = self._services.get(key)
            if old is not None:
                self._services = self._services.delete(key)
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
            names = self._locators.get(namespace, {})
            old_locator = names.pop(name, None)
            if old_locator is not None:
                if not names:
                    del self._locators[namespace]
                if key in self._ignored:
                    self._ignored = self._ignored.delete(key)
                    self._note(("ignored", namespace, name))
                else:
                    self._unindex_locator(old_locator)
            return old_locator is not None
        if name not in self._namespaces:
            return False
        self._namespaces = self._namespaces.delete(name)
        self._note(("ns", name))
        return True

    def replace_all(
        self, kind: type, records: Iterable[Record], keep: Iterable[tuple[str, str]] = ()
    ) -> bool:
        """Make the stored objects of a kind exactly `records` (after a full list), except
        that the objects named in `keep` (namespace, name) stay as they are."""
        relist = self.relist(kind)
        changed = relist.page(list(records), keep)
        return relist.finish() or changed

    def relist(self, kind: type) -> Relist:
        """A full list of a kind, to be given page by page (`Relist`)."""
        return Relist(self, kind)

    def holds(self, kind: type) -> bool:
        """True if any object of the kind is stored."""
        if kind is Service:
            return bool(self._services)
        if kind is EndpointSlice:
            return bool(self._slices)
        if kind is PodLocator:
            return bool(self._locators)
        return bool(self._namespaces)

    def stored(self, kind: type, namespace: str, name: str) -> Record | None:
        """The stored object of that kind and name, if any (Namespaces: None)."""
        if kind is Service:
            return self._services.get((namespace, name))
        if kind is EndpointSlice:
            return self._slices.get((namespace, name))
        if kind is PodLocator:
            return self._locators.get(namespace, {}).get(name)
        return None

    def missing(self, kind: type, seen: dict[str, set[str]]) -> list[Key]:
        """(namespace, name) of the stored objects of a kind that `seen` does not name."""
        if kind is PodLocator:
            return [(ns, name) for ns, names in self._locators.items()
                    for name in names if name not in seen.get(ns, ())]  # fmt: skip
        stored: Iterable[Key]
        if kind is Service:
            stored = self._services.keys()
        elif kind is EndpointSlice:
            stored = self._slices.keys()
        else:
            stored = (("", name) for name in self._namespaces.keys())
        return [(ns, name) for ns, name in stored if name not in seen.get(ns, ())]

    def snapshot(self, serial: int, synced: bool = True) -> Snapshot:
        """A snapshot of the current state, saying what changed since the last one."""
        last = self._last
        self._last = Snapshot(
            services=self._services,
            slices=self._by_service,
            namespaces=self._namespaces,
            service_ips=self._service_ips,
            endpoint_ips=self._endpoint_ips,
            locators=self._combined,
            node_locators=self._node_locators,
            shared_ips=self._shared,
            prefixes=self._prefixes,
            ignored=self._ignored,
            locator_namespaces=self.locator_namespaces,
            policies=self._policies,
            serial=serial,
            synced=synced,
            lineage=last.lineage,
            generation=last.generation + 1,
            changes=EVERYTHING if self._changes is None else frozenset(self._changes),
        )
        self._changes = set()
        return self._last

    def _note(self, word: Dependency) -> None:
        """Note a change for the next snapshot, unless so many are noted that it is cheaper to
        say that everything changed."""
        changes = self._changes
        if changes is not None:
            changes.add(word)
            if len(changes) > MAX_NOTED_CHANGES:
                self._changes = None

    # Services

    def _put_service(self, svc: Service) -> bool:
        key = (svc.namespace, svc.name)
        old = self._services.get(key)
        if old == svc:
            return False
        if old is not None:
            self._unindex_service(old)
        self._services = self._services.set(key, svc)
        for ip in dict.fromkeys(canonical_ip(ip) for ip in svc.cluster_ips):
            self._service_ips = self._service_ips.set(ip, self._service_ips.get(ip, ()) + (svc,))
            self._note(("ip", ip))
        self._note(("svc", *key))
        self._update_policy(key)
        return True

    def _unindex_service(self, svc: Service) -> None:
        for ip in dict.fromkeys(canonical_ip(ip) for ip in svc.cluster_ips):
            rest = tuple(s for s in self._service_ips.get(ip, ()) if s is not svc)
            self._service_ips = _set_or_drop(self._service_ips, ip, rest)
            self._note(("ip", ip))
        self._note(("svc", svc.namespace, svc.name))

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
        self._by_service = self._by_service.set(service, self._by_service.get(service, ()) + (eps,))
        for ip in _addresses(eps):
            held = self._endpoint_ips.get(ip)
            if held is None:
                held = eps  # the usual case: one slice holds the address
            elif isinstance(held, EndpointSlice):
                held = (held, eps)
            else:
                held = (*held, eps)
            self._endpoint_ips = self._endpoint_ips.set(ip, held)
            self._note(("ip", ip))
        self._note(("svc", *service))
        self._update_policy(service)
        return True

    def _unindex_slice(self, eps: EndpointSlice) -> None:
        service = (eps.namespace, eps.service)
        rest = tuple(s for s in self._by_service.get(service, ()) if s is not eps)
        self._by_service = _set_or_drop(self._by_service, service, rest)
        for ip in _addresses(eps):
            held = self._endpoint_ips.get(ip)
            left: EndpointSlice | tuple[EndpointSlice, ...] = ()
            if isinstance(held, tuple):
                others = tuple(s for s in held if s is not eps)
                left = others[0] if len(others) == 1 else others
            elif held is not None and held is not eps:
                left = held
            self._endpoint_ips = _set_or_drop(self._endpoint_ips, ip, left)
            self._note(("ip", ip))
        self._note(("svc", *service))

    def _update_policy(self, key: Key) -> None:
        svc = self._services.get(key)
        policy = None
        if svc is not None and svc.kind == HEADLESS:
            found = policy_for(svc, self._by_service.get(key, ()))
            # Kept without a source only to report soft annotations that have nothing to soften.
            policy = found if found.source != "none" or found.soft_errors else None
        if self._policies.get(key) != policy:
            if policy is None:
                self._policies = self._policies.delete(key)
            else:
                self._policies = self._policies.set(key, policy)
            self._note(("svc", *key))

    # PodLocators

    def _put_locator(self, locator: PodLocator) -> bool:
        names = self._locators.setdefault(locator.namespace, {})
        old = names.get(locator.name)
        if old == locator:
            return False
        if not believed(self.locator_namespaces, locator):
            # Its namespace decides, so an earlier version was not believed either.
            names[locator.name] = locator
            key = (locator.namespace, locator.name)
            self._ignored = self._ignored.set(key, locator)
            self._note(("ignored", *key))
            return True
        if old is not None:
            self._unindex_locator(old)
        names[locator.name] = locator
        if locator.is_node:
            key = (locator.namespace, locator.name)
            node = locator.node_name or locator.name
            self._node_holders.setdefault(node, {})[key] = locator
            self._node_locators = self._node_locators.set(node, _first(self._node_holders[node]))
            self._note(("node", node))
        for ip in dict.fromkeys(locator.addresses):  # canonical already
            self._note(("loc", ip))
            current = self._combined.get(ip)
            if current is None:
                self._combined = self._combined.set(ip, locator)  # the usual case
                continue
            holders = self._shared.get(ip, (current,)) + (locator,)
            self._shared = self._shared.set(ip, holders)
            self._combined = self._combined.set(ip, _choose(holders))
        for cidr in dict.fromkeys(locator.cidrs):  # canonical already
            self._note(("cidr", cidr))
            self._prefixes = add_prefix(self._prefixes, cidr, locator)
        return True

    def _put_locators(self, locators: Iterable[PodLocator]) -> bool:
        """`put` of many locators; False if all equal what is stored.

        A full list of 150,000 pod locators is mostly new locators whose addresses no other
        locator claims: those go into one mutation of the address index, rather than a new
        persistent map per address. The rest take `_put_locator` afterwards, which ends in
        the same state: which locator places a shared address does not depend on order."""
        combined = self._combined.mutate()
        rest = []
        note = self._note
        changed = False
        namespaces = self.locator_namespaces
        for locator in locators:
            names = self._locators.setdefault(locator.namespace, {})
            if (
                locator.is_node
                or locator.cidrs
                or locator.name in names
                or not believed(namespaces, locator)
            ):
                rest.append(locator)
                continue
            for ip in locator.addresses:
                if ip in combined:
                    rest.append(locator)
                    break
            else:
                changed = True
                names[locator.name] = locator
                for ip in locator.addresses:
                    combined[ip] = locator
                    note(("loc", ip))
        self._combined = combined.finish()
        for locator in rest:
            changed |= self._put_locator(locator)
        return changed

    def _unindex_locator(self, locator: PodLocator) -> None:
        key = (locator.namespace, locator.name)
        if locator.is_node:
            node = locator.node_name or locator.name
            holders = self._node_holders.get(node, {})
            holders.pop(key, None)
            if holders:
                self._node_locators = self._node_locators.set(node, _first(holders))
            else:
                self._node_holders.pop(node, None)
                self._node_locators = _set_or_drop(self._node_locators, node, None)
            self._note(("node", node))
        for ip in dict.fromkeys(locator.addresses):  # canonical already
            self._note(("loc", ip))
            shared = self._shared.get(ip)
            if shared is None:
                if self._combined.get(ip) is locator:
                    self._combined = self._combined.delete(ip)
                continue
            rest = tuple(held for held in shared if held is not locator)
            self._shared = _set_or_drop(self._shared, ip, rest if len(rest) > 1 else None)
            self._combined = self._combined.set(ip, _choose(rest))
        for cidr in dict.fromkeys(locator.cidrs):
            self._note(("cidr", cidr))
            self._prefixes = remove_prefix(self._prefixes, cidr, locator)


class Relist:
    """A full list of one kind, applied page by page as it arrives (client-go's `Replace`,
    without holding the list): each page's objects go in as `put`s, so an object equal to what
    is stored changes nothing and the new copy is dropped with its page; `finish` then deletes
    what the list did not contain. Between pages every object is at its stored or its listed
    version, never missing, as while a watch catches up. A list that breaks off is simply
    dropped: the next one starts over, and nothing it skipped was deleted.

    What the list named is kept as the stored records' own strings (per namespace, a set of
    names), so nothing allocated for a page outlives it unless it changed the store: a relist
    strands no memory between the pages of survivors.
    """

    def __init__(self, builder: StoreBuilder, kind: type) -> None:
        self.builder = builder
        self.kind = kind
        #: namespace -> names the list held, as the stored strings; None when nothing of the
        #: kind was stored as the list began (a first list), so nothing can be missing.
        self.seen: dict[str, set[str]] | None = {} if builder.holds(kind) else None
        #: How many objects the pages held (kept ones included).
        self.count = 0

    def page(self, records: list[Record], keep: Iterable[Key] = ()) -> bool:
        """Apply one page: its `records`, and the objects named in `keep` (namespace, name)
        left as they are (malformed in the list); False if it changed nothing."""
        builder, kind = self.builder, self.kind
        if kind is PodLocator:
            changed = builder._put_locators(records)  # type: ignore[arg-type]
        else:
            changed = False
            for record in records:
                changed |= builder.put(record)
        self.count += len(records)
        if self.seen is None:  # nothing was stored: nothing can be missing
            self.count += sum(1 for _ in keep)
            return changed
        seen = self.seen
        for record in records:
            namespace = getattr(record, "namespace", "")
            stored = builder.stored(kind, namespace, record.name) or record
            namespace = getattr(stored, "namespace", "")
            names = seen.get(namespace)
            if names is None:
                names = seen[namespace] = set()
            names.add(stored.name)
        for namespace, name in keep:
            seen.setdefault(namespace, set()).add(name)
            self.count += 1
        return changed

    def finish(self) -> bool:
        """The list is complete: delete what it did not hold; False if nothing was."""
        changed = False
        if self.seen is not None:
            for namespace, name in self.builder.missing(self.kind, self.seen):
                changed |= self.builder.remove(self.kind, namespace, name)
        self.seen = None
        return changed


def _addresses(eps: EndpointSlice) -> Iterable[str]:
    """The canonical form of each address a slice holds, once each."""
    return dict.fromkeys(canonical_ip(a) for ep in eps.endpoints for a in ep.addresses)


def _choose(holders: tuple[PodLocator, ...]) -> PodLocator:
    """Which of several locators claiming an address places it: a pod's over a node's.

    Two objects claiming one address is a transient state (a pod replaced, its IP reused);
    the lowest namespace/name wins, so the choice does not depend on event order.
    """
    pods = [held for held in holders if not held.is_node] or list(holders)
    return min(pods, key=lambda held: (held.namespace, held.name))


def _first(holders: dict[Key, PodLocator]) -> PodLocator:
    return holders[min(holders)]


def _set_or_drop(index: Map[K, V], key: K, value: V | None) -> Map[K, V]:
    """The map with `key` set to `value`, or without `key` when the value is empty."""
    if value:
        return index.set(key, value)
    return index.delete(key) if key in index else index


def build_snapshot(
    records: Iterable[Record],
    serial: int,
    synced: bool = True,
    locator_namespaces: frozenset[str] = EVERYWHERE,
) -> Snapshot:
    """Index records into a Snapshot, believing the PodLocators of `locator_namespaces`. Input
    order decides ties (e.g. two services on one IP)."""
    builder = StoreBuilder(locator_namespaces)
    for record in records:
        builder.put(record)
    return builder.snapshot(serial, synced)
