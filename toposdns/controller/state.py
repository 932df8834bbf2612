"""The controller's view of the cluster: slim caches of Pods, Nodes and PodLocators.

`ClusterState` is the reflectors' sink (source/watch.py). It keeps only what decides a locator
(`PodFacts`, `NodeFacts`, `LocatorState`), indexes pods by node, and reports the locator keys
whose desired or actual state changed, so that a pod's status churn or a node's heartbeat
(which change nothing kept here) cost no reconcile at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from toposdns.controller.config import ControllerConfig
from toposdns.controller.desired import (
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
    pod_locator_of,
)
from toposdns.kube.resources import NODE_LOCATOR_LABEL, POD_LOCATOR
from toposdns.metrics import CONTROLLER_LOCATORS
from toposdns.source.watch import Resource, custom_resource, object_key

log = logging.getLogger("toposdns")

#: (namespace, name) of a locator; a pod's locator has its pod's key.
Key = tuple[str, str]

PODS = Resource(
    "pods", "Pod", "v1", lambda a: a.core.list_pod_for_all_namespaces_without_preload_content
)
NODES = Resource("nodes", "Node", "v1", lambda a: a.core.list_node_without_preload_content)
LOCATORS = custom_resource(POD_LOCATOR)
WATCHED = (PODS, NODES, LOCATORS)
#: A listed object as `ClusterState.prepare` keeps it: its key, and its facts.
Prepared = tuple[Key, Any]


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
        synced: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.changed = changed
        self.on_synced = synced
        self.pods: dict[Key, PodFacts] = {}
        self.nodes: dict[str, NodeFacts] = {}
        self.locators: dict[Key, LocatorState] = {}
        self.pods_on: dict[str, set[Key]] = {}  # node name -> keys of the pods on it
        self.listed: set[str] = set()
        self._counts = {"pod": 0, "node": 0}

    @property
    def synced(self) -> bool:
        """True once pods, nodes and locators have each been listed."""
        return len(self.listed) == len(WATCHED)

    # ----- what should be -----

    def want(self, key: Key) -> Object | None:
        """The locator that should exist at `key`, or None.

        A node locator wins over a pod of the same name in the controller's own namespace (the
        controller's namespace holds its own pods, which are not named like nodes)."""
        namespace, name = key
        if namespace == self.config.namespace:
            node = self.nodes.get(name)
            if node is not None:
                return node_locator_of(namespace, node)
        pod = self.pods.get(key)
        if pod is None:
            return None
        return pod_locator_of(namespace, name, pod, self.nodes.get(pod.node_name))

    def keys(self) -> set[Key]:
        """Every key that may need a locator written or deleted."""
        keys = set(self.pods) | set(self.locators)
        keys.update((self.config.namespace, name) for name in self.nodes)
        return keys

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
            changed = {k for k in self.pods.keys() | pods.keys() if self.pods.get(k) != pods.get(k)}
            for key in changed:
                self._set_pod(key, pods.get(key))
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
            for key in changed:
                self._set_locator(key, states.get(key))
        first = resource.name not in self.listed
        self.listed.add(resource.name)
        if first:
            log.info("%s: listed %d", resource.name, len(items))
        if changed:
            self.changed(changed)
        if first and self.synced:
            self.on_synced()

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
                self.changed((key,))
        else:
            state = locator_state(obj)
            cached = self.locators.get(key)
            if cached != state and not (cached and _older(state.version, cached.version)):
                self._set_locator(key, state)
                self.changed((key,))

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
                self.changed((key,))
        else:
            cached = self.locators.get(key)
            meta = obj.get("metadata")
            version = str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""
            if cached is not None and not _older(version, cached.version):
                self._set_locator(key, None)
                self.changed((key,))

    # ----- what the writer learnt -----

    def observe(self, key: Key, obj: Mapping[str, Any] | None) -> None:
        """The locator at `key` as the API server just returned it (None: there is none).

        Newer than the watch has delivered; a later watch event for an older version is
        skipped (see `_older`)."""
        self._set_locator(key, locator_state(obj) if obj is not None else None)

    # ----- internals -----

    def _set_pod(self, key: Key, pod: PodFacts | None) -> None:
        old = self.pods.pop(key, None)
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

    def _set_node(self, name: str, node: NodeFacts | None) -> set[Key]:
        """Store a node; returns the keys of the locators that depend on it."""
        if node is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = node
        return {(self.config.namespace, name)} | self.pods_on.get(name, set())

    def _set_locator(self, key: Key, state: LocatorState | None) -> None:
        old = self.locators.pop(key, None)
        if old is not None and old.managed:
            self._counts["node" if old.is_node else "pod"] -= 1
        if state is not None:
            self.locators[key] = state
            if state.managed:
                self._counts["node" if state.is_node else "pod"] += 1
        for kind, count in self._counts.items():
            CONTROLLER_LOCATORS.labels(kind).set(count)
