"""What the locators should be: pure functions of Pods and Nodes (raw API objects), no I/O.

A pod may have a locator when it has an IP and a node, and has not finished (whether it needs
one is the state's question: `--pod-locators`); a node gets one when it has an InternalIP or pod
ranges (`cidrs`). Only the node labels the configuration selects are copied, so that a node's
other labels (and its status, which changes every few seconds) never cause a write.

Every locator lives in the controller's namespace, the only one whose locators the DNS server
believes by default: whoever may write a PodLocator places the clients it claims, and nobody but
the controller writes there. A pod's locator is named after the pod (`NAMESPACE.NAME`) and says
the pod's namespace in a label, which --autopath and `--pods verified` read.
"""

from __future__ import annotations

import hashlib
import ipaddress
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from toposdns.controller.cidrs import MAX_CIDRS, usable_cidr
from toposdns.controller.config import ControllerConfig, LabelFilter
from toposdns.kube.resources import NODE_LOCATOR_LABEL, POD_LOCATOR, POD_NAMESPACE_LABEL

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "toposdns"
#: Labels the controller sets; any other label on a locator is someone else's and is kept.
OWN_LABELS = (MANAGED_BY_LABEL, NODE_LOCATOR_LABEL, POD_NAMESPACE_LABEL)
#: The longest object name (a DNS subdomain).
MAX_NAME = 253
#: The CRD's bound on `addresses`.
MAX_ADDRESSES = 8
FINISHED_PHASES = ("Succeeded", "Failed")

Object = dict[str, Any]
#: What is compared to decide whether a locator needs a write: addresses, cidrs, nodeName,
#: nodeLabels, the controller's own labels and the owner references.
Content = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What of a Pod matters to its locator."""

    uid: str
    node_name: str
    addresses: tuple[str, ...]
    finished: bool
    #: Its addresses are its node's (`spec.hostNetwork`).
    host_network: bool = False


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What of a Node matters to locators: its selected labels, InternalIPs and pod ranges."""

    name: str
    uid: str
    labels: tuple[tuple[str, str], ...]
    addresses: tuple[str, ...]
    #: `spec.podCIDRs` (or the older `spec.podCIDR`), canonical, the usable ones.
    cidrs: tuple[str, ...] = ()


def usable_address(text: Any) -> str | None:
    """The address in canonical form if a locator may hold it (the CRD's isGlobalUnicast:
    not loopback, link-local, multicast, unspecified or broadcast), else None."""
    if not isinstance(text, str):
        return None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified:
        return None
    if ip.version == 4 and int(ip) == 0xFFFFFFFF:
        return None
    return str(ip)


def _addresses(texts: Iterable[Any]) -> tuple[str, ...]:
    found: list[str] = []
    for text in texts:
        address = usable_address(text)
        if address is not None and address not in found:
            found.append(address)
    return tuple(found[:MAX_ADDRESSES])


#: One copy of each distinct label set (every locator of a node carries the same one).
_SHARED: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_SHARED_MAX = 65536


def _shared(value: tuple[Any, ...]) -> tuple[Any, ...]:
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()  # label sets changed a lot: start again rather than grow
    return _SHARED.setdefault(value, value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return sys.intern(value) if isinstance(value, str) else ""


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    """The facts of a raw Pod; absent or malformed fields count as absent."""
    meta, spec, status = (_mapping(pod.get(f)) for f in ("metadata", "spec", "status"))
    listed = status.get("podIPs")
    listed = listed if isinstance(listed, list) else []
    ips = [e.get("ip") for e in listed if isinstance(e, Mapping)]
    # A hostNetwork pod's IPs are its node's: the node locator places them. With
    # `--pod-locators all` it keeps a locator all the same; both name the same node and labels.
    return PodFacts(
        uid=_text(meta.get("uid")),
        node_name=_text(spec.get("nodeName")),
        addresses=_addresses(ips or [status.get("podIP")]),
        finished=status.get("phase") in FINISHED_PHASES,
        host_network=spec.get("hostNetwork") is True,
    )


def _cidrs(spec: Mapping[str, Any]) -> tuple[str, ...]:
    listed = spec.get("podCIDRs")
    texts = listed if isinstance(listed, list) and listed else [spec.get("podCIDR")]
    found: list[str] = []
    for text in texts:
        cidr = usable_cidr(text)
        if cidr is not None and cidr not in found:
            found.append(sys.intern(cidr))
    return tuple(found[:MAX_CIDRS])


def node_facts(node: Mapping[str, Any], labels: LabelFilter) -> NodeFacts:
    """The facts of a raw Node: the selected labels, the usable InternalIPs and pod ranges."""
    meta, spec, status = (_mapping(node.get(f)) for f in ("metadata", "spec", "status"))
    listed = status.get("addresses")
    internal = [
        a.get("address")
        for a in (listed if isinstance(listed, list) else [])
        if isinstance(a, Mapping) and a.get("type") == "InternalIP"
    ]
    selected = labels.select(_mapping(meta.get("labels")))
    return NodeFacts(
        name=_text(meta.get("name")),
        uid=_text(meta.get("uid")),
        labels=tuple((sys.intern(k), sys.intern(v)) for k, v in selected.items()),
        addresses=_addresses(internal),
        cidrs=_cidrs(spec),
    )


def _owner(kind: str, name: str, uid: str) -> Object:
    # No blockOwnerDeletion: setting it true needs the `update` right on the owner's
    # finalizers, and nothing needs a pod's deletion to wait for its locator's.
    return {
        "apiVersion": "v1",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": False,
    }


def pod_locator_name(namespace: str, name: str) -> str:
    """The name of the locator of the pod `namespace/name` in the controller's namespace:
    `NAMESPACE.NAME`, which no two pods share (a namespace name has no dot). Where that is too
    long for an object name, the pod's name is replaced by a digest of it."""
    whole = f"{namespace}.{name}"
    if len(whole) <= MAX_NAME:
        return whole
    return f"{namespace}.{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def pod_locator_of(
    namespace: str, pod_key: tuple[str, str], pod: PodFacts, node: NodeFacts | None
) -> Object | None:
    """The locator, in the controller's `namespace`, that the pod `pod_key` (its namespace and
    name) needs given its facts and its node's (None: it needs none).

    Its owner is the pod's Node (an owner in another namespace would not hold: the garbage
    collector would delete the locator at once), so that deleting the node deletes it; the
    controller deletes it with the pod."""
    if pod.finished or not pod.addresses or not pod.uid or not pod.node_name:
        return None
    if node is None or node.name != pod.node_name:
        return None  # its node is gone, or not seen yet: nothing to place the pod by
    metadata: Object = {
        "name": pod_locator_name(*pod_key),
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, POD_NAMESPACE_LABEL: pod_key[0]},
    }
    if node.uid:
        metadata["ownerReferences"] = [_owner("Node", node.name, node.uid)]
    return {
        "apiVersion": POD_LOCATOR.api_version,
        "kind": POD_LOCATOR.kind,
        "metadata": metadata,
        "addresses": list(pod.addresses),
        "nodeName": pod.node_name,
        "nodeLabels": dict(node.labels),
    }


def node_locator_of(
    namespace: str, node: NodeFacts, cidrs: tuple[str, ...] | None = None
) -> Object | None:
    """The locator of a node, in the controller's namespace: its InternalIPs, and its pod
    ranges (`cidrs`, by default the node's own `spec.podCIDRs`); None with neither.

    Its owner is the Node, so that deleting the node deletes it too (a namespaced object may
    have a cluster-scoped owner)."""
    cidrs = node.cidrs if cidrs is None else cidrs
    if not (node.addresses or cidrs) or not node.name:
        return None
    metadata: Object = {
        "name": node.name,
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, NODE_LOCATOR_LABEL: "node"},
    }
    if node.uid:
        metadata["ownerReferences"] = [_owner("Node", node.name, node.uid)]
    locator: Object = {
        "apiVersion": POD_LOCATOR.api_version,
        "kind": POD_LOCATOR.kind,
        "metadata": metadata,
    }
    if node.addresses:  # the CRD wants at least one when the field is there
        locator["addresses"] = list(node.addresses)
    if cidrs:
        locator["cidrs"] = list(cidrs)
    locator["nodeName"] = node.name
    locator["nodeLabels"] = dict(node.labels)
    return locator


def desired(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None, config: ControllerConfig
) -> Object | None:
    """The PodLocator a raw Pod has when it has one of its own (always with `--pod-locators
    all`), in the controller's namespace, given the raw Node it runs on (None if unknown);
    None when the pod can have none (no IP, no node, finished, or its node unknown)."""
    meta = _mapping(pod.get("metadata"))
    facts = pod_facts(pod)
    node_info = node_facts(node, config.labels) if node is not None else None
    key = (_text(meta.get("namespace")), _text(meta.get("name")))
    return pod_locator_of(config.namespace, key, facts, node_info)


def node_locator(node: Mapping[str, Any], config: ControllerConfig) -> Object | None:
    """The PodLocator a raw Node should have in the controller's namespace (None: none), with
    its `spec.podCIDRs` unless `--node-cidrs learned` (learnt ranges are the state's)."""
    facts = node_facts(node, config.labels)
    return node_locator_of(config.namespace, facts, () if config.node_cidrs == "learned" else None)


def content_of(locator: Mapping[str, Any]) -> Content:
    """The part of a locator that the controller decides, comparable across objects (a
    malformed locator gives a content that differs from every desired one)."""
    meta = _mapping(locator.get("metadata"))
    labels = _mapping(meta.get("labels"))
    addresses = locator.get("addresses")
    cidrs = locator.get("cidrs")
    node_labels = _mapping(locator.get("nodeLabels"))
    owners = meta.get("ownerReferences")
    return (
        tuple(_text(a) for a in addresses) if isinstance(addresses, list) else None,
        tuple(_text(c) for c in cidrs) if isinstance(cidrs, list) else None,
        _text(locator.get("nodeName")),
        _shared(tuple(sorted((_text(k), _text(v)) for k, v in node_labels.items()))),
        _shared(tuple(labels.get(k) for k in OWN_LABELS)),
        tuple(
            tuple(o.get(f) for f in ("apiVersion", "kind", "name", "uid", "controller"))
            + (bool(o.get("blockOwnerDeletion")),)
            for o in owners
            if isinstance(o, Mapping)
        )
        if isinstance(owners, list)
        else (),
    )


def is_managed(locator: Mapping[str, Any]) -> bool:
    """True for locators this controller made (and so may change or delete)."""
    labels = _mapping(_mapping(locator.get("metadata")).get("labels"))
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY
