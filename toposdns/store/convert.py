"""Turn raw Kubernetes objects (decoded JSON/YAML dicts) into the store's slim records.

Every check here names the object and the field it refused, because the same messages reach an
operator from a snapshot file and from the live API.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Mapping
from itertools import chain
from socket import AF_INET, inet_pton
from typing import Any

from toposdns.kube.resources import NODE_LOCATOR_LABEL, POD_LOCATOR, POD_NAMESPACE_LABEL
from toposdns.store.model import (
    CLUSTER_IP,
    EXTERNAL_NAME,
    HEADLESS,
    NO_PORT,
    Endpoint,
    EndpointSlice,
    Namespace,
    PodLocator,
    Port,
    Record,
    Service,
    canonical_ip,
)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
TOPOLOGY_KEYS_ANNOTATION = "toposdns.io/topology-keys"
#: Soft topology (docs/topology.md, "Soft topology"): spill-over, SRV priorities, weights.
MIN_ENDPOINTS_ANNOTATION = "toposdns.io/topology-min-endpoints"
SRV_ANNOTATION = "toposdns.io/topology-srv"
WEIGHTS_ANNOTATION = "toposdns.io/topology-weights"

_POD_LOCATOR_VERSION = POD_LOCATOR.api_version
_SLICE_VERSION = "discovery.k8s.io/v1"

#: (apiVersion, kind) pairs a snapshot or the live source may hold.
KINDS = {
    ("v1", "Service"),
    ("v1", "Namespace"),
    (_SLICE_VERSION, "EndpointSlice"),
    (POD_LOCATOR.api_version, POD_LOCATOR.kind),
}


class ObjectError(ValueError):
    """A Kubernetes object that cannot be served, with where and why."""

    def __init__(self, obj: Any, field: str, reason: str) -> None:
        # `obj` is the raw object, named only now: naming every good object costs a sync dearly.
        obj = obj if isinstance(obj, str) else describe(obj)
        super().__init__(f"{obj}: {field}: {reason}" if field else f"{obj}: {reason}")
        self.obj = obj
        self.field = field
        self.reason = reason


def describe(raw: Any) -> str:
    """Name an object the way kubectl does: `Kind namespace/name`."""
    if not isinstance(raw, Mapping):
        return f"<{type(raw).__name__}>"
    meta = raw.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    name = meta.get("name", "?")
    ns = meta.get("namespace")
    return f"{raw.get('kind', '?')} {ns}/{name}" if ns else f"{raw.get('kind', '?')} {name}"


def convert_object(raw: Any, pod_names: bool = True) -> Record:
    """Convert one raw object; raise ObjectError if it is malformed or of an unknown kind.

    The shapes nearly every PodLocator and EndpointSlice has are taken by a fast path; all
    others, and every malformed one, by `convert_checked`, which gives the same records.
    Without `pod_names`, endpoints keep no pod name (`targetRef.name`): only
    `endpoint_pod_names` reads it, and at 150,000 endpoints the names are 11 MB."""
    if type(raw) is dict:
        kind = raw.get("kind")
        record: Record | None = None
        if kind == "PodLocator":
            record = _common_pod_locator(raw)
        elif kind == "EndpointSlice":
            record = _common_endpoint_slice(raw, pod_names)
        if record is not None:
            return record
    return convert_checked(raw, pod_names)


def convert_checked(raw: Any, pod_names: bool = True) -> Record:
    """`convert_object` field by field: what it refuses, it names by object and field path."""
    obj = raw
    if not isinstance(raw, Mapping):
        raise ObjectError(describe(raw), "", "not a mapping")  # a str `obj` is taken as a name
    key = (raw.get("apiVersion"), raw.get("kind"))
    if not all(isinstance(part, str) for part in key) or key not in KINDS:
        known = ", ".join(sorted(f"{k} ({v})" for v, k in KINDS))
        raise ObjectError(
            obj, "apiVersion/kind", f"unsupported {key[0]}/{key[1]}; expected {known}"
        )
    meta = _mapping(raw.get("metadata"), obj, "metadata")
    name = _str(meta.get("name"), obj, "metadata.name", required=True)
    if key[1] == "Namespace":
        return Namespace(name)
    namespace = sys.intern(_str(meta.get("namespace"), obj, "metadata.namespace", required=True))
    if key[1] == "Service":
        return _service(raw, obj, namespace, name, meta)
    if key[1] == "EndpointSlice":
        return _endpoint_slice(raw, obj, namespace, name, meta, pod_names)
    return _pod_locator(raw, obj, namespace, name, meta)


def _service(
    raw: Mapping[str, Any], obj: Any, namespace: str, name: str, meta: Mapping[str, Any]
) -> Service:
    spec = _mapping(raw.get("spec"), obj, "spec")
    svc_type = _str(spec.get("type"), obj, "spec.type") or "ClusterIP"
    ips: tuple[str, ...] = ()
    external = ""
    if svc_type == "ExternalName":
        kind = EXTERNAL_NAME
        external = _str(spec.get("externalName"), obj, "spec.externalName", required=True)
    elif svc_type in ("ClusterIP", "NodePort", "LoadBalancer"):
        cluster_ip = _str(spec.get("clusterIP"), obj, "spec.clusterIP")
        listed = _list(spec.get("clusterIPs"), obj, "spec.clusterIPs")
        named = [(f"spec.clusterIPs[{i}]", ip) for i, ip in enumerate(listed)]
        if not named and cluster_ip:
            named = [("spec.clusterIP", cluster_ip)]  # objects from before dual-stack
        raw_ips = [_str(ip, obj, field, required=True) for field, ip in named]
        if raw_ips == ["None"] or cluster_ip == "None":
            kind = HEADLESS
        else:
            kind = CLUSTER_IP
            ips = tuple(_ip(ip, obj, field) for field, ip in named)
            if not ips:
                raise ObjectError(obj, "spec.clusterIP", "a ClusterIP service needs an address")
    else:
        raise ObjectError(obj, "spec.type", f"unknown service type {svc_type!r}")
    ports = tuple(
        _port(p, obj, f"spec.ports[{i}]")
        for i, p in enumerate(_list(spec.get("ports"), obj, "spec.ports"))
    )
    annotations = _mapping(meta.get("annotations"), obj, "metadata.annotations")
    annotation = annotations.get(TOPOLOGY_KEYS_ANNOTATION)
    annotation_field = f"metadata.annotations[{TOPOLOGY_KEYS_ANNOTATION}]"
    keys = spec.get("topologyKeys")
    return Service(
        namespace=namespace,
        name=name,
        kind=kind,
        cluster_ips=ips,
        ports=ports or (NO_PORT,),
        external_name=external,
        topology_keys=None
        if keys is None
        else tuple(
            _str(k, obj, f"spec.topologyKeys[{i}]")
            for i, k in enumerate(_list(keys, obj, "spec.topologyKeys"))
        ),
        topology_annotation=None
        if annotation is None
        else tuple(k.strip() for k in _str(annotation, obj, annotation_field).split(",")),
        traffic_distribution=_str(spec.get("trafficDistribution"), obj, "spec.trafficDistribution"),
        external_traffic_policy=_str(
            spec.get("externalTrafficPolicy"), obj, "spec.externalTrafficPolicy"
        ),
        topology_min_endpoints=_annotation(annotations, MIN_ENDPOINTS_ANNOTATION, obj),
        topology_srv=_annotation(annotations, SRV_ANNOTATION, obj),
        topology_weights=_annotation(annotations, WEIGHTS_ANNOTATION, obj),
    )


def _annotation(annotations: Mapping[str, Any], name: str, obj: Any) -> str | None:
    """An annotation's text, None when absent; its meaning is checked with the policy."""
    value = annotations.get(name)
    return None if value is None else _str(value, obj, f"metadata.annotations[{name}]")


def _endpoint_slice(
    raw: Mapping[str, Any],
    obj: Any,
    namespace: str,
    name: str,
    meta: Mapping[str, Any],
    pod_names: bool,
) -> EndpointSlice:
    labels = _mapping(meta.get("labels"), obj, "metadata.labels")
    service = _str(labels.get(SERVICE_NAME_LABEL), obj, f"metadata.labels[{SERVICE_NAME_LABEL}]")
    address_type = _str(raw.get("addressType"), obj, "addressType", required=True)
    if address_type not in ("IPv4", "IPv6", "FQDN"):
        raise ObjectError(obj, "addressType", f"unknown addressType {address_type!r}")
    endpoints = []
    for i, ep in enumerate(_list(raw.get("endpoints"), obj, "endpoints")):
        where = f"endpoints[{i}]"
        ep = _mapping(ep, obj, where)
        conditions = _mapping(ep.get("conditions"), obj, f"{where}.conditions")
        # Only `ready` counts, and a missing value means ready (CoreDNS object/endpoint.go).
        if conditions.get("ready") is False:
            continue
        addresses = _list(ep.get("addresses"), obj, f"{where}.addresses")
        if address_type == "FQDN":
            continue  # FQDN slices are deprecated and never served by CoreDNS.
        addrs = _ips(addresses, obj, f"{where}.addresses")
        target = _mapping(ep.get("targetRef"), obj, f"{where}.targetRef")
        pod_name = _str(target.get("name"), obj, f"{where}.targetRef.name")
        hints = ep.get("hints")
        hint_zones = hint_nodes = None
        if hints is not None:
            hints = _mapping(hints, obj, f"{where}.hints")
            hint_zones = _hint_names(hints, "forZones", obj, f"{where}.hints")
            hint_nodes = _hint_names(hints, "forNodes", obj, f"{where}.hints")
        endpoints.append(
            Endpoint(
                addresses=addrs,
                hostname=_str(ep.get("hostname"), obj, f"{where}.hostname"),
                # Longer pod names are not valid DNS labels; CoreDNS drops them at conversion.
                pod_name=pod_name if pod_names and len(pod_name) < 64 else "",
                node_name=sys.intern(_str(ep.get("nodeName"), obj, f"{where}.nodeName")),
                zone=sys.intern(_str(ep.get("zone"), obj, f"{where}.zone")),
                hint_zones=hint_zones,
                hint_nodes=hint_nodes,
            )
        )
    ports = tuple(
        _port(p, obj, f"ports[{i}]") for i, p in enumerate(_list(raw.get("ports"), obj, "ports"))
    )
    return EndpointSlice(namespace, name, service, ports or (NO_PORT,), tuple(endpoints))


def _hint_names(
    hints: Mapping[str, Any], kind: str, obj: Any, where: str
) -> tuple[str, ...] | None:
    """The names of `hints.forZones` or `hints.forNodes`; None when there are none."""
    field = f"{where}.{kind}"
    names = _list(hints.get(kind), obj, field)
    return (
        tuple(
            sys.intern(
                _str(_mapping(n, obj, f"{field}[{j}]").get("name"), obj, f"{field}[{j}].name")
            )
            for j, n in enumerate(names)
        )
        or None
    )


def _pod_locator(
    raw: Mapping[str, Any], obj: Any, namespace: str, name: str, meta: Mapping[str, Any]
) -> PodLocator:
    addresses = _ips(_list(raw.get("addresses"), obj, "addresses"), obj, "addresses", True)
    cidrs = tuple(
        _cidr(c, obj, f"cidrs[{i}]") for i, c in enumerate(_list(raw.get("cidrs"), obj, "cidrs"))
    )
    labels = _mapping(raw.get("nodeLabels"), obj, "nodeLabels")
    if not all(type(k) is str and type(v) is str for k, v in labels.items()):
        for k, v in labels.items():  # find the first that is not, and say so
            _str(v, obj, f"nodeLabels[{_str(k, obj, 'nodeLabels')}]")
    node_labels = _intern_labels(labels)
    meta_labels = _mapping(meta.get("labels"), obj, "metadata.labels")
    pod_namespace = _str(
        meta_labels.get(POD_NAMESPACE_LABEL), obj, f"metadata.labels[{POD_NAMESPACE_LABEL}]"
    )
    return PodLocator(
        namespace=namespace,
        name=name,
        addresses=addresses,
        node_name=sys.intern(_str(raw.get("nodeName"), obj, "nodeName")),
        node_labels=node_labels,
        is_node=meta_labels.get(NODE_LOCATOR_LABEL) == "node",
        cidrs=cidrs,
        pod_namespace=sys.intern(pod_namespace),
    )


def _common_pod_locator(raw: dict[str, Any]) -> PodLocator | None:
    """The PodLocator of the shape nearly all have (one per pod: IPv4 addresses in canonical
    form, no cidrs, its pod's namespace in a label or none), checked in as few operations as a
    sync of 150,000 can afford; None for any other shape, which `_pod_locator` then checks
    field by field and names what is wrong. Both give equal records for what this accepts."""
    meta = raw.get("metadata")
    addresses = raw.get("addresses")
    labels = raw.get("nodeLabels")
    node_name = raw.get("nodeName")
    cidrs = raw.get("cidrs")
    if (
        raw.get("apiVersion") != _POD_LOCATOR_VERSION
        or type(meta) is not dict
        or type(addresses) is not list
        or type(labels) is not dict
        or not (node_name is None or type(node_name) is str)
        or not (cidrs is None or cidrs == [])
    ):
        return None
    name = meta.get("name")
    namespace = meta.get("namespace")
    meta_labels = meta.get("labels")
    if (
        type(name) is not str
        or not name
        or type(namespace) is not str
        or not namespace
        or not (meta_labels is None or type(meta_labels) is dict)
    ):
        return None
    if not _canonical_ipv4(addresses):
        return None  # left to `_pod_locator`, which writes them in canonical form or refuses
    pod_namespace = "" if meta_labels is None else meta_labels.get(POD_NAMESPACE_LABEL, "")
    if type(pod_namespace) is not str:
        return None  # refused by `_pod_locator`, naming the label
    node_name = node_name or ""
    node_labels = _NODE_LABELS.get(node_name)
    if node_labels is None or node_labels != labels:  # equal to checked strings: strings too
        for key, value in labels.items():
            if type(key) is not str or type(value) is not str:
                return None
        node_labels = _intern_labels(labels)
        if len(_NODE_LABELS) >= 100_000:
            _NODE_LABELS.clear()  # bounded, as _LABEL_SETS
        _NODE_LABELS[sys.intern(node_name)] = node_labels
    return PodLocator(  # positional: a fifth less time than by keyword, 150,000 times
        sys.intern(namespace),
        name,
        tuple(addresses),
        sys.intern(node_name),
        node_labels,
        meta_labels is not None and meta_labels.get(NODE_LOCATOR_LABEL) == "node",
        (),
        sys.intern(pod_namespace),
    )


def _common_endpoint_slice(raw: dict[str, Any], pod_names: bool) -> EndpointSlice | None:
    """The EndpointSlice of the shape nearly all have (IPv4 addresses in canonical form, string
    fields, ports with a number), checked in as few operations as a sync can afford; None for
    any other shape, which `_endpoint_slice` then checks field by field and names what is
    wrong. Both give equal records for what this accepts."""
    meta = raw.get("metadata")
    raw_endpoints = raw.get("endpoints")
    raw_ports = raw.get("ports")
    if (
        raw.get("apiVersion") != _SLICE_VERSION
        or raw.get("addressType") != "IPv4"
        or type(meta) is not dict
        or type(raw_endpoints) is not list
        or not (raw_ports is None or type(raw_ports) is list)
    ):
        return None
    name = meta.get("name")
    namespace = meta.get("namespace")
    labels = meta.get("labels")
    service = labels.get(SERVICE_NAME_LABEL) if type(labels) is dict else None
    if (
        type(name) is not str
        or not name
        or type(namespace) is not str
        or not namespace
        or type(service) is not str
    ):
        return None
    endpoints = []
    for ep in raw_endpoints:
        if type(ep) is not dict:
            return None
        conditions = ep.get("conditions")
        if conditions is not None:
            if type(conditions) is not dict:
                return None
            if conditions.get("ready") is False:
                continue  # as `_endpoint_slice`: nothing else of it is read
        endpoint = _common_endpoint(ep, pod_names)
        if endpoint is None:
            return None
        endpoints.append(endpoint)
    ports = _common_ports(raw_ports) if raw_ports else (NO_PORT,)
    if ports is None:
        return None
    return EndpointSlice(sys.intern(namespace), name, service, ports, tuple(endpoints))


def _common_endpoint(ep: dict[str, Any], pod_names: bool) -> Endpoint | None:
    """One ready endpoint of `_common_endpoint_slice`, or None if it is of another shape."""
    addresses = ep.get("addresses")
    target = ep.get("targetRef")
    pod_name = target.get("name") if type(target) is dict else None
    hostname = ep.get("hostname")
    node_name = ep.get("nodeName")
    zone = ep.get("zone")
    hints = ep.get("hints")
    if (
        type(addresses) is not list
        or not (target is None or type(target) is dict)
        or not (pod_name is None or type(pod_name) is str)
        or not (hostname is None or type(hostname) is str)
        or not (node_name is None or type(node_name) is str)
        or not (zone is None or type(zone) is str)
        or hints is not None
    ):
        return None  # hints (rare) are left to the checks, with their two nested lists
    if not _canonical_ipv4(addresses):
        return None  # left to `_endpoint_slice`, which checks them with ipaddress
    return Endpoint(
        tuple(addresses),
        hostname or "",
        pod_name if pod_names and pod_name is not None and len(pod_name) < 64 else "",
        sys.intern(node_name or ""),
        sys.intern(zone or ""),
    )


def _canonical_ipv4(addresses: list[Any]) -> bool:
    """True if every item is an IPv4 address in canonical form: `is_canonical_ipv4` inline, one
    C call each, with the loop's exceptions caught once."""
    try:
        for address in addresses:
            inet_pton(AF_INET, address)
    except (OSError, TypeError, ValueError):  # not an IPv4 address in canonical form, or not a str
        return False
    return True


def _common_ports(raw_ports: list[Any]) -> tuple[Port, ...] | None:
    """The ports of a common EndpointSlice, or None if one is of another shape."""
    ports = []
    for raw in raw_ports:
        if type(raw) is not dict:
            return None
        number = raw.get("port")
        name = raw.get("name")
        protocol = raw.get("protocol")
        if (
            type(number) is not int
            or not 0 <= number <= 65535
            or not (name is None or type(name) is str)
            or not (protocol is None or type(protocol) is str)
        ):
            return None
        ports.append(_shared_port(name or "", protocol or "TCP", number))
    return tuple(ports)


_PORTS: dict[tuple[str, str, int], Port] = {}


def _shared_port(name: str, protocol: str, number: int) -> Port:
    """One Port per distinct port: thousands of slices and services declare `http/80/TCP`."""
    key = (name, protocol, number)
    port = _PORTS.get(key)
    if port is None:
        if len(_PORTS) >= 100_000:
            _PORTS.clear()  # bounded; records keep the ports they hold
        port = _PORTS[key] = Port(sys.intern(name), sys.intern(protocol), number)
    return port


#: A label set's keys and values, sorted and flat (a quarter of a frozenset of its items, which
#: 5,000 nodes' label sets, all distinct, would keep) -> the shared dict.
_LABEL_SETS: dict[tuple[str, ...], dict[str, str]] = {}
#: Node name -> the shared labels its last common locator carried: a node's pods carry the
#: same labels, found equal here at less cost than by `_intern_labels`.
_NODE_LABELS: dict[str, dict[str, str]] = {}


def _intern_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """One shared dict (a copy) per distinct label set: every pod on a node carries the same
    labels, so 100,000 locators hold a few thousand dicts, and the hot path can key on identity."""
    key = tuple(chain.from_iterable(sorted(labels.items())))
    shared = _LABEL_SETS.get(key)
    if shared is None:
        if len(_LABEL_SETS) >= 100_000:
            _LABEL_SETS.clear()  # bounded; old sets stay shared by the objects holding them
        shared = _LABEL_SETS[key] = dict(labels)
    return shared


def _port(raw: Any, obj: Any, where: str) -> Port:
    raw = _mapping(raw, obj, where)
    number = raw.get("port")
    if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= 65535:
        # An EndpointSlice port may omit its number ("all ports"); CoreDNS then serves port 0.
        if number is not None:
            raise ObjectError(obj, f"{where}.port", f"not a port number: {number!r}")
        number = 0
    protocol = _str(raw.get("protocol"), obj, f"{where}.protocol") or "TCP"
    return _shared_port(_str(raw.get("name"), obj, f"{where}.name"), protocol, number)


def _ip(value: Any, obj: Any, field: str, canonical: bool = False) -> str:
    """The address as written (endpoint names are made from it), or in canonical form."""
    text = _str(value, obj, field, required=True)
    try:
        ip = canonical_ip(text)
    except ValueError:
        raise ObjectError(obj, field, f"not an IP address: {text!r}") from None
    return ip if canonical else text


def _ips(values: list[Any], obj: Any, field: str, canonical: bool = False) -> tuple[str, ...]:
    """`_ip` of every item of a list; each item's field is named only if one is refused (a
    sync checks some 300,000 addresses)."""
    try:
        if all(type(value) is str for value in values):
            ips = tuple(canonical_ip(value) for value in values)
            return ips if canonical else tuple(values)
    except ValueError:
        pass
    return tuple(_ip(value, obj, f"{field}[{i}]", canonical) for i, value in enumerate(values))


#: The shortest prefix a locator may claim, per family: a node's pod range is far longer, and a
#: shorter one would swallow whole address classes.
SHORTEST_PREFIX = {4: 8, 6: 32}
_PREFIX_LENGTH = re.compile(r"0|[1-9][0-9]{0,2}")
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def _cidr(value: Any, obj: Any, field: str) -> str:
    """A prefix a locator places, in canonical network form.

    Refused, as the CRD refuses them: what is not `address/length`, host bits set, a prefix
    shorter than SHORTEST_PREFIX, and multicast, unspecified or link-local ranges. Loopback
    stays allowed here, as for `addresses`, so a snapshot file can place clients on 127.0.0.0/8.
    """
    text = _str(value, obj, field, required=True)
    address, slash, length = text.partition("/")
    try:
        if not slash or not _PREFIX_LENGTH.fullmatch(length) or "%" in address:
            raise ValueError(text)
        network = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ObjectError(
            obj,
            field,
            f"not a CIDR: {text!r}; write a network and its prefix length, such as "
            "10.244.3.0/24 or fd00:10:244:3::/64",
        ) from None
    shortest = SHORTEST_PREFIX[network.version]
    if network.prefixlen < shortest:
        raise ObjectError(
            obj, field, f"{text!r} is shorter than /{shortest}: give the node's own pod range"
        )
    if network.network_address != ipaddress.ip_address(address):
        raise ObjectError(obj, field, f"{text!r} has host bits set; the network is {network}")
    first = network.network_address
    if first.is_multicast:
        forbidden = "multicast"
    elif first.is_unspecified:
        forbidden = "unspecified"
    elif any(network.overlaps(range_) for range_ in _LINK_LOCAL):
        forbidden = "link-local (169.254.0.0/16, fe80::/10)"
    elif isinstance(first, ipaddress.IPv6Address) and first.ipv4_mapped is not None:
        forbidden = "IPv4-mapped: write the IPv4 prefix"
    else:
        return str(network)
    raise ObjectError(obj, field, f"{text!r} is not a unicast range: it is {forbidden}")


def _str(value: Any, obj: Any, field: str, required: bool = False) -> str:
    if value is None:
        if required:
            raise ObjectError(obj, field, "is required")
        return ""
    if not isinstance(value, str):
        raise ObjectError(obj, field, f"must be a string, got {type(value).__name__}")
    if required and not value:
        raise ObjectError(obj, field, "must not be empty")
    return value


def _mapping(value: Any, obj: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(obj, field, f"must be a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, obj: Any, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(obj, field, f"must be a list, got {type(value).__name__}")
    return value
