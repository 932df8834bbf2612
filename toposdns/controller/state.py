"""The controller's view of the cluster: slim caches of Pods, Nodes and PodLocators.

`ClusterState` is the reflectors' sink (source/watch.py). It keeps only what decides a locator
(`PodFacts`, `NodeFacts`, `LocatorState`), indexes pods by node and by address range, and reports
the locator keys whose desired or actual state changed, so that a pod's status churn or a node's
heartbeat (which change nothing kept here) cost no reconcile at all.

Its keys are the locators' (namespace, name): a node's locator and a pod's live in the
controller's namespace, the pod's named `NAMESPACE.NAME` (`pod_locator_name`); a locator
anywhere else is one an older controller wrote in its pod's namespace, wanted no more.

It also decides which pods need a locator of their own (`--pod-locators auto`): those whose
addresses the node locators do not place on their node, asked of the node locators as wanted
and, before a pod locator is deleted, as written, so that a pod is never left unplaced while
its node's new ranges wait in the queue. With `--node-cidrs learned` or `auto` it learns ranges
from the pods (cidrs.learn), one address group at a time, when a locator is next wanted, so a
burst of pod events costs one learning per group.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from toposdns.controller.cidrs import (
    LEARN_LENGTHS,
    MAX_CIDRS,
    Assignment,
    Prefix,
    PrefixIndex,
    group_of,
    groups_within,
    learn,
    point_of,
    prefix_of,
    text_of,
    usable_cidr,
)
from toposdns.controller.config import ControllerConfig
from toposdns.controller.desired import (
    MAX_NAME,
    OWN_LABELS,
    Content,
    NodeFacts,
    Object,
    PodFacts,
    content_of,
    is_managed,
    node_facts,
    node_locator_of,
    pod_facts,
    pod_locator_name,
    pod_locator_of,
)
from toposdns.kube.resources import NODE_LOCATOR_LABEL, POD_LOCATOR
from toposdns.metrics import CONTROLLER_LOCATORS, CONTROLLER_POD_LOCATORS
from toposdns.source.watch import Resource, custom_resource, object_key

log = logging.getLogger("toposdns")

#: (namespace, name) of a locator, or of a pod.
Key = tuple[str, str]

PODS = Resource("pods", "Pod", "v1")
NODES = Resource("nodes", "Node", "v1")
LOCATORS = custom_resource(POD_LOCATOR)
WATCHED = (PODS, NODES, LOCATORS)
#: A listed object as `ClusterState.prepare` keeps it: its key, and its facts.
Prepared = tuple[Key, Any]

#: Why a pod has a locator of its own (the `reason` label of toposdns_controller_pod_locators).
ALL_MODE = "all-mode"  # --pod-locators all
NO_NODE_CIDRS = "no-node-cidrs"  # its node locator has no ranges
OUTSIDE = "outside-node-cidrs"  # an address in none of its node's ranges, nor another's
BORROWED = "borrowed"  # an address inside another node's range (Calico lends addresses)
PENDING = "node-locator-pending"  # placed by its node's wanted ranges, not yet written ones
REASONS = (ALL_MODE, NO_NODE_CIDRS, OUTSIDE, BORROWED, PENDING)


@dataclass(frozen=True, slots=True)
class LocatorState:
    """What of an existing PodLocator the controller needs to compare, update or delete it."""

    uid: str
    version: str
    managed: bool
    is_node: bool
    content: Content
    #: Metadata set by others (labels, annotations, finalizers), kept on update; None if none.
    extra: Mapping[str, Any] | None


def locator_state(obj: Mapping[str, Any]) -> LocatorState:
    """The slim state of a raw PodLocator."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    labels = meta.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    extra: dict[str, Any] = {}
    foreign = {k: v for k, v in labels.items() if k not in OWN_LABELS}
    if foreign:
        extra["labels"] = foreign
    for name in ("annotations", "finalizers"):
        if meta.get(name):
            extra[name] = meta[name]
    return LocatorState(
        uid=str(meta.get("uid") or ""),
        version=str(meta.get("resourceVersion") or ""),
        managed=is_managed(obj),
        is_node=labels.get(NODE_LOCATOR_LABEL) == "node",
        content=content_of(obj),
        extra=extra or None,
    )


def _older(incoming: str, cached: str) -> bool:
    """True if `incoming` is certainly older than `cached`.

    resourceVersions are opaque by contract; every API server in practice hands out etcd
    revisions, so numeric ones are compared, and only to skip a watch event older than what a
    write of ours already returned. Non-numeric versions are never older: the event is taken,
    and at worst the next write gets a 409 and re-reads."""
    return incoming.isdigit() and cached.isdigit() and int(incoming) < int(cached)


class ClusterState:
    """Caches of pods, nodes and locators, fed by reflectors; reports changed locator keys."""

    def __init__(
        self,
        config: ControllerConfig,
        changed: Callable[[Iterable[Key]], None] = lambda keys: None,
        listed: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.changed = changed
        #: Called when a resource has been listed for the first time.
        self.on_listed = listed
        self.pods: dict[Key, PodFacts] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.locators: dict[Key, LocatorState] = {}
        self.pods_on: dict[str, set[Key]] = {}  # node name -> keys of the pods on it
        #: The pods whose locator's name is a digest (`pod_locator_name`), by that name.
        self.digested: dict[str, Key] = {}
        self.listed: set[str] = set()
        self._counts = {"pod": 0, "node": 0}
        #: The ranges each node locator should carry, and those in an index.
        self.cidrs: dict[str, tuple[str, ...]] = {}
        self.wanted = PrefixIndex()
        #: The addresses and ranges of the node locators as written, and those in an index.
        self.written: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}
        self.written_index = PrefixIndex()
        #: Keys of the pods with an address in each learning group.
        self.groups: dict[Prefix, set[Key]] = {}
        self.learning = config.node_cidrs != "spec"
        self.learned: dict[Prefix, Assignment] = {}
        self.learned_of: dict[str, set[Prefix]] = {}
        self._dirty: set[Prefix] = set()
        self._seeded = False
        #: Why each pod that needs a locator of its own needs it, by its locator's key.
        self.reasons: dict[Key, str] = {}
        self._reason_counts: Counter[str] = Counter(dict.fromkeys(REASONS, 0))
        for reason in REASONS:
            CONTROLLER_POD_LOCATORS.labels(reason).set(0)

    @property
    def synced(self) -> bool:
        """True once pods, nodes and locators have each been listed."""
        return len(self.listed) == len(WATCHED)

    # ----- what should be -----

    def want(self, key: Key) -> Object | None:
        """The locator that should exist at `key`, or None.

        Only the controller's namespace holds locators: one elsewhere (an older controller's,
        in its pod's namespace) is wanted no more. A node locator wins over a pod's named like
        the node (`NAMESPACE.NAME`: a node named so is unheard of)."""
        namespace, name = key
        if namespace != self.config.namespace:
            return None
        node = self.nodes.get(name)
        if node is not None:
            # Its learnt ranges lie where its pods are, or where its ranges were.
            groups = {group_of((p[0], p[2])) for p in self.learned_of.get(name, ())}
            for on in self.pods_on.get(name, ()):
                groups |= self._groups_of(self.pods[on])
            self.relearn(groups)
            return node_locator_of(namespace, node, self.cidrs.get(name, ()))
        pod_key = self.pod_of(name)
        pod = None if pod_key is None else self.pods.get(pod_key)
        locator = None
        if pod is not None and pod_key is not None:
            self.relearn(self._groups_of(pod))  # the ranges that may place it
            locator = pod_locator_of(namespace, pod_key, pod, self.nodes.get(pod.node_name))
        reason = self._reason(key, pod) if locator is not None and pod is not None else None
        self._set_reason(key, reason)
        return locator if reason is not None else None

    def pod_of(self, name: str) -> Key | None:
        """The key of the pod whose locator has this name in the controller's namespace, if
        such a pod may exist."""
        digested = self.digested.get(name)
        if digested is not None:
            return digested
        namespace, dot, pod = name.partition(".")
        return (namespace, pod) if dot and pod else None

    def locator_key(self, pod: Key) -> Key:
        """The key of a pod's locator."""
        return self.config.namespace, pod_locator_name(*pod)

    def locator_keys(self, pods: Iterable[Key]) -> set[Key]:
        """The keys of these pods' locators."""
        namespace = self.config.namespace
        return {(namespace, pod_locator_name(*pod)) for pod in pods}

    def keys(self) -> set[Key]:
        """Every key that may need a locator written or deleted."""
        keys = self.locator_keys(self.pods) | set(self.locators)
        keys.update((self.config.namespace, name) for name in self.nodes)
        return keys

    def _reason(self, key: Key, pod: PodFacts) -> str | None:
        """Why the pod needs a locator of its own (None: its node's places it)."""
        mode = self.config.pod_locators
        if mode != "auto":
            return ALL_MODE if mode == "all" else None
        node = pod.node_name
        reason = self._unplaced(pod, self.wanted, self.nodes[node].addresses, self.cidrs.get(node))
        if reason is not None:
            return reason
        have = self.locators.get(key)
        if have is None or not have.managed or have.is_node:
            return None  # nothing to delete: the node locator will place it when written
        # Delete the pod's locator only once the node's locator that replaces it is written.
        addresses, cidrs = self.written.get(node, (frozenset(), ()))
        return PENDING if self._unplaced(pod, self.written_index, addresses, cidrs) else None

    @staticmethod
    def _unplaced(
        pod: PodFacts, index: PrefixIndex, exact: Iterable[str], cidrs: tuple[str, ...] | None
    ) -> str | None:
        """Why node locators with these ranges (and the pod's node's `exact` addresses) do not
        place every address of the pod on its node, as the DNS server places: an exact
        address first, else the longest prefix, claimed by one node only."""
        for address in pod.addresses:
            if address in exact:
                continue
            owners = index.owners(point_of(address))
            if owners == {pod.node_name}:
                continue
            if owners:
                return BORROWED
            return OUTSIDE if cidrs else NO_NODE_CIDRS
        return None

    def _set_reason(self, key: Key, reason: str | None) -> None:
        old = self.reasons.pop(key, None) if reason is None else self.reasons.get(key)
        if old == reason:
            return
        if reason is not None:
            self.reasons[key] = reason
            self._reason_counts[reason] += 1
            CONTROLLER_POD_LOCATORS.labels(reason).set(self._reason_counts[reason])
        if old is not None:
            self._reason_counts[old] -= 1
            CONTROLLER_POD_LOCATORS.labels(old).set(self._reason_counts[old])

    # ----- node ranges -----

    def _node_cidrs(self, name: str) -> tuple[str, ...]:
        """The ranges the node's locator should carry."""
        node = self.nodes.get(name)
        if node is None:
            return ()
        if not self._learns(node):
            return node.cidrs
        learned = sorted(self.learned_of.get(name, ()), key=lambda p: (p[0], p[2], p[1]))
        return tuple(sys.intern(text_of(p)) for p in learned[:MAX_CIDRS])

    def _learns(self, node: NodeFacts) -> bool:
        """True if the node's ranges are learnt (`--node-cidrs learned`, or `auto` and no
        spec.podCIDRs)."""
        return self.learning and not (self.config.node_cidrs == "auto" and node.cidrs)

    def _update_cidrs(self, name: str) -> set[Key]:
        """Bring the node's wanted ranges up to date; the keys whose locator that may move."""
        old, new = self.cidrs.get(name, ()), self._node_cidrs(name)
        if old == new:
            return set()
        if new:
            self.cidrs[name] = new
        else:
            self.cidrs.pop(name, None)
        moved = set(old) ^ set(new)
        for text in old:
            self.wanted.remove(prefix_of(text), name)
        for text in new:
            self.wanted.add(prefix_of(text), name)
        return {(self.config.namespace, name)} | self._pods_within(moved)

    def _pods_within(self, cidrs: Iterable[str]) -> set[Key]:
        """The locator keys of the pods with an address in the learning groups that these
        ranges overlap."""
        keys: set[Key] = set()
        for text in cidrs:
            for group in groups_within(prefix_of(text), self.groups):
                keys |= self.groups.get(group, set())
        return self.locator_keys(keys)

    def _update_written(self, key: Key, state: LocatorState | None) -> set[Key]:
        """Note a node locator as written; the keys of the pods whose placement that moves."""
        if key[0] != self.config.namespace:
            return set()
        node = key[1]
        addresses, cidrs = (
            (
                frozenset(state.content[0] or ()),
                # What an API server without the CRD's checks may hold: only what places.
                tuple(c for c in state.content[1] or () if usable_cidr(c) == c),
            )
            if state is not None and state.managed and state.is_node
            else (frozenset(), ())
        )
        old = self.written.pop(node, (frozenset(), ()))
        if addresses or cidrs:
            self.written[node] = (addresses, cidrs)
        if old == (addresses, cidrs):
            return set()
        for text in old[1]:
            self.written_index.remove(prefix_of(text), node)
        for text in cidrs:
            self.written_index.add(prefix_of(text), node)
        moved = self.locator_keys(self.pods_on.get(node, ()))
        return moved | self._pods_within(set(old[1]) ^ set(cidrs))

    # ----- learning -----

    def relearn(self, groups: Iterable[Prefix] | None = None) -> None:
        """Learn the ranges again in the address groups whose pods or nodes changed (of
        `groups` only, if given), and report the locators that moves.

        `want` learns only the groups the key depends on: a pass over every key then spreads
        the learning of a whole cluster over the keys, between which the event loop runs."""
        if not self._dirty or not self.synced:
            return
        touched = self._seed() if not self._seeded else set()
        todo = list(self._dirty if groups is None else self._dirty.intersection(groups))
        for group in todo:
            self._dirty.discard(group)
            before = self.learned.get(group, {})
            after = learn(group, self._points(group), self._eligible, before)
            if after == before:
                continue
            for prefix, node in before.items():
                self.learned_of[node].discard(prefix)
                touched.add(node)
            for prefix, node in after.items():
                self.learned_of.setdefault(node, set()).add(prefix)
                touched.add(node)
            if after:
                self.learned[group] = after
            else:
                self.learned.pop(group, None)
        keys: set[Key] = set()
        for node in touched:
            if not self.learned_of.get(node):
                self.learned_of.pop(node, None)
            keys |= self._update_cidrs(node)
        if keys:
            self.changed(keys)

    def _seed(self) -> set[str]:
        """Start from the learnt ranges the node locators carry (written by an earlier
        controller), so that a restart learns the same and writes nothing; returns the nodes
        seeded."""
        self._seeded = True
        seeded: set[str] = set()
        for node, (_, cidrs) in self.written.items():
            facts = self.nodes.get(node)
            if facts is None or not self._learns(facts):
                continue
            for text in cidrs:
                prefix = prefix_of(text)
                version, length, value = prefix
                shortest, longest = LEARN_LENGTHS[version]
                if shortest <= length <= longest:
                    group = group_of((version, value))
                    self.learned.setdefault(group, {})[prefix] = node
                    self.learned_of.setdefault(node, set()).add(prefix)
                    self._dirty.add(group)
                    seeded.add(node)
        return seeded

    def _eligible(self, name: str) -> bool:
        node = self.nodes.get(name)
        return node is not None and self._learns(node)

    def _points(self, group: Prefix) -> list[tuple[int, str]]:
        """(address, node) of every pod address in the group that a range may place: not of
        a hostNetwork pod (those are the node's own addresses), sorted."""
        points = []
        for key in self.groups.get(group, ()):
            pod = self.pods[key]
            if pod.host_network or pod.finished or not pod.node_name:
                continue
            for address in pod.addresses:
                point = point_of(address)
                if group_of(point) == group:
                    points.append((point[1], pod.node_name))
        points.sort()
        return points

    @staticmethod
    def _groups_of(pod: PodFacts) -> set[Prefix]:
        return {group_of(point_of(address)) for address in pod.addresses}

    def _regroup(self, key: Key, pod: PodFacts | None, add: bool) -> None:
        """Index (or unindex) the pod's addresses by learning group."""
        if pod is None:
            return
        for group in self._groups_of(pod):
            if add:
                self.groups.setdefault(group, set()).add(key)
            else:
                members = self.groups.get(group)
                if members is not None:
                    members.discard(key)
                    if not members:
                        del self.groups[group]
            if self.learning:
                self._dirty.add(group)

    # ----- the reflectors' sink -----

    def prepare(self, resource: Resource, obj: Object) -> Prepared:
        """What is kept of a listed object: the reflector calls this as each page arrives, so
        a list of every pod of a large cluster is held as facts, not JSON, until `replace`."""
        if resource.name == "pods":
            return object_key(obj), pod_facts(obj)
        if resource.name == "nodes":
            facts = node_facts(obj, self.config.labels)
            return ("", facts.name), facts
        return object_key(obj), locator_state(obj)

    def replace(self, resource: Resource, items: list[Any]) -> None:
        """A complete list of one resource (`prepare`d items, or raw objects)."""
        prepared: dict[Key, Any] = {}
        for item in items:
            key, facts = item if isinstance(item, tuple) else self.prepare(resource, item)
            if key[1] and (key[0] or resource.name == "nodes"):  # skip the nameless
                prepared[key] = facts
        if resource.name == "pods":
            pods: dict[Key, PodFacts] = prepared
            moved = {k for k in self.pods.keys() | pods.keys() if self.pods.get(k) != pods.get(k)}
            for key in moved:
                self._set_pod(key, pods.get(key))
            changed = self.locator_keys(moved)
        elif resource.name == "nodes":
            nodes: dict[str, NodeFacts] = {name: f for (_, name), f in prepared.items()}
            changed = set()
            for name in self.nodes.keys() | nodes.keys():
                if self.nodes.get(name) != nodes.get(name):
                    changed |= self._set_node(name, nodes.get(name))
        else:
            states: dict[Key, LocatorState] = prepared
            changed = {
                k
                for k in self.locators.keys() | states.keys()
                if self.locators.get(k) != states.get(k)
            }
            for key in list(changed):
                changed |= self._set_locator(key, states.get(key))
        first = resource.name not in self.listed
        self.listed.add(resource.name)
        if first:
            log.info("%s: listed %d", resource.name, len(items))
        if changed:
            self.changed(changed)
        if first:
            self.on_listed()

    def upsert(self, resource: Resource, obj: Object) -> None:
        """An object was added or modified."""
        if resource.name == "nodes":
            facts = node_facts(obj, self.config.labels)
            if facts.name and self.nodes.get(facts.name) != facts:
                self.changed(self._set_node(facts.name, facts))
            return
        key = object_key(obj)
        if not all(key):
            return
        if resource.name == "pods":
            pod = pod_facts(obj)
            if self.pods.get(key) != pod:
                self._set_pod(key, pod)
                self.changed((self.locator_key(key),))
        else:
            state = locator_state(obj)
            cached = self.locators.get(key)
            if cached != state and not (cached and _older(state.version, cached.version)):
                self.changed({key} | self._set_locator(key, state))

    def delete(self, resource: Resource, obj: Object) -> None:
        """An object was deleted (`obj` is its last state)."""
        if resource.name == "nodes":
            name = object_key(obj)[1]
            if name in self.nodes:
                self.changed(self._set_node(name, None))
            return
        key = object_key(obj)
        if resource.name == "pods":
            if key in self.pods:
                self._set_pod(key, None)
                self.changed((self.locator_key(key),))
        else:
            cached = self.locators.get(key)
            meta = obj.get("metadata")
            version = str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""
            if cached is not None and not _older(version, cached.version):
                self.changed({key} | self._set_locator(key, None))

    # ----- what the writer learnt -----

    def observe(self, key: Key, obj: Mapping[str, Any] | None) -> None:
        """The locator at `key` as the API server just returned it (None: there is none).

        Newer than the watch has delivered; a later watch event for an older version is
        skipped (see `_older`)."""
        moved = self._set_locator(key, locator_state(obj) if obj is not None else None)
        if moved:
            self.changed(moved)

    # ----- internals -----

    def _set_pod(self, key: Key, pod: PodFacts | None) -> None:
        old = self.pods.pop(key, None)
        self._regroup(key, old, add=False)
        self._regroup(key, pod, add=True)
        if old is not None and old.node_name:
            on = self.pods_on.get(old.node_name)
            if on is not None:
                on.discard(key)
                if not on:
                    del self.pods_on[old.node_name]
        if pod is not None:
            self.pods[key] = pod
            if pod.node_name:
                self.pods_on.setdefault(pod.node_name, set()).add(key)
        if len(key[0]) + 1 + len(key[1]) > MAX_NAME:  # named by a digest: `pod_of` needs it
            if pod is None:
                self.digested.pop(pod_locator_name(*key), None)
            else:
                self.digested[pod_locator_name(*key)] = key

    def _set_node(self, name: str, node: NodeFacts | None) -> set[Key]:
        """Store a node; returns the keys of the locators that depend on it."""
        old = self.nodes.pop(name, None)
        if node is not None:
            self.nodes[name] = node
        if self.learning and (old is None or node is None or old.cidrs != node.cidrs):
            # Whether its ranges are learnt, and from which pods, may have changed.
            for key in self.pods_on.get(name, ()):
                self._dirty.update(self._groups_of(self.pods[key]))
            self._dirty.update(group_of((p[0], p[2])) for p in self.learned_of.get(name, ()))
        keys = {(self.config.namespace, name)} | self.locator_keys(self.pods_on.get(name, ()))
        return keys | self._update_cidrs(name)

    def _set_locator(self, key: Key, state: LocatorState | None) -> set[Key]:
        """Store a locator; returns the keys of the pods whose placement it moves."""
        old = self.locators.pop(key, None)
        if old is not None and old.managed:
            self._counts["node" if old.is_node else "pod"] -= 1
        if state is not None:
            self.locators[key] = state
            if state.managed:
                self._counts["node" if state.is_node else "pod"] += 1
        for kind, count in self._counts.items():
            CONTROLLER_LOCATORS.labels(kind).set(count)
        return self._update_written(key, state)
