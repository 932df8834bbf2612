"""Kubernetes objects for tests and benchmarks: one builder per kind, in the shape the API server
returns (apiVersion, kind, metadata, and the defaults it fills in: a Service's type, clusterIPs
and port protocols, an EndpointSlice's owning labels, a Node's Ready condition, a Pod's
containers). Keyword parameters are what tests vary; the trailing keywords replace or add
top-level fields (of `spec`, `status`, or the object itself), for a deliberate odd shape.

The server-owned identity (uid, resourceVersion, creationTimestamp) is left out unless given:
the stand-in API server (tests/kubeapi.py) fills it in as a real one does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

JSON = dict[str, Any]

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
LOCATOR_VERSION = "toposdns.io/v1alpha1"

#: A Service port, and the EndpointSlice port that serves it: `http` 80.
HTTP: JSON = {"name": "http", "port": 80, "protocol": "TCP"}

#: The condition a healthy kubelet reports.
READY: JSON = {"type": "Ready", "status": "True"}


def _metadata(
    name: str,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
) -> JSON:
    """An object's metadata with only the fields given."""
    meta: JSON = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels is not None:
        meta["labels"] = dict(labels)
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if uid is not None:
        meta["uid"] = uid
    return meta


def namespace(name: str) -> JSON:
    """A Namespace, with the name label the API server adds to every one."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": _metadata(name, labels={"kubernetes.io/metadata.name": name}),
    }


def _ports(ports: Iterable[Mapping[str, Any]]) -> list[JSON]:
    """Ports with the protocol the API server defaults to, TCP, where none is given."""
    return [{"protocol": "TCP", **port} for port in ports]


def service(
    name: str = "web",
    namespace: str = "shop",
    *,
    cluster_ip: str | None,
    ports: Iterable[Mapping[str, Any]] = (HTTP,),
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    **spec: Any,
) -> JSON:
    """A Service of type ClusterIP at `cluster_ip` ("None": headless; None: no address, as for
    an ExternalName, or one given raw as `clusterIP=`/`clusterIPs=`); `spec` replaces or adds
    fields of its spec (`type="ExternalName", externalName=...`, `topologyKeys=[...]`)."""
    body: JSON = {"type": "ClusterIP"}
    if cluster_ip is not None:
        body |= {"clusterIP": cluster_ip, "clusterIPs": [cluster_ip]}
    listed = _ports(ports)
    if listed:
        body["ports"] = listed
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, namespace, labels, annotations),
        "spec": body | spec,
    }


def endpoint_slice(
    service: str = "web",
    namespace: str = "shop",
    endpoints: Iterable[Mapping[str, Any]] = (),
    *,
    name: str | None = None,
    address_type: str = "IPv4",
    ports: Iterable[Mapping[str, Any]] = (HTTP,),
    annotations: Mapping[str, str] | None = None,
    **fields: Any,
) -> JSON:
    """EndpointSlice `name` (default `<service>-1`) of `service`, labelled as the EndpointSlice
    controller labels it, holding `endpoints` as given; `fields` replace or add top-level
    fields."""
    labels = {
        SERVICE_NAME_LABEL: service,
        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
    }
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": _metadata(name or f"{service}-1", namespace, labels, annotations),
        "addressType": address_type,
        "ports": _ports(ports),
        "endpoints": [dict(endpoint) for endpoint in endpoints],
        **fields,
    }


def endpoint(address: str, *, ready: bool = True, **fields: Any) -> JSON:
    """An EndpointSlice endpoint at `address` with the conditions the controller writes (ready,
    serving, not terminating, unless `ready` is False); `fields` add nodeName, zone, hints..."""
    conditions = {"ready": ready, "serving": ready, "terminating": False}
    return {"addresses": [address], "conditions": conditions, **fields}


def headless(
    name: str,
    namespace: str,
    endpoints: Iterable[Mapping[str, Any]],
    family: str = "IPv4",
    annotations: Mapping[str, str] | None = None,
    **spec: Any,
) -> list[JSON]:
    """A headless Service with one port, `http` 80, and one EndpointSlice of `endpoints`."""
    return [
        service(name, namespace, cluster_ip="None", annotations=annotations, **spec),
        endpoint_slice(name, namespace, endpoints, address_type=family),
    ]


def node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    addresses: Sequence[tuple[str, str]] | None = None,
    spec: Mapping[str, Any] | None = None,
    conditions: Sequence[Mapping[str, Any]] = (READY,),
    uid: str | None = None,
    **status: Any,
) -> JSON:
    """Node `name`: labelled with its hostname unless `labels` are given, at `addresses`
    ((type, address) pairs; default InternalIP 10.0.0.1 and its Hostname), Ready unless
    `conditions` say otherwise; `status` replaces or adds status fields."""
    if addresses is None:
        addresses = [("InternalIP", "10.0.0.1"), ("Hostname", name)]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _metadata(
            name, labels={"kubernetes.io/hostname": name} if labels is None else labels, uid=uid
        ),
        "spec": dict(spec or {}),
        "status": {
            "addresses": [{"type": kind, "address": address} for kind, address in addresses],
            "conditions": [dict(condition) for condition in conditions],
            **status,
        },
    }


def pod_cidrs(*cidrs: str) -> JSON:
    """A Node spec with these pod ranges, as the node IPAM controller assigns them (none: {})."""
    return {"podCIDR": cidrs[0], "podCIDRs": list(cidrs)} if cidrs else {}


def pod(
    name: str = "web-0",
    namespace: str = "shop",
    *,
    node_name: str | None,
    ips: Sequence[str] | None,
    phase: str = "Running",
    host_network: bool = False,
    uid: str | None = None,
    **status: Any,
) -> JSON:
    """Pod `name` with one container, scheduled on `node_name` (None: not yet), in `phase`, with
    `ips` as podIPs and the first as podIP (None: no IP fields at all); `status` replaces or
    adds status fields (`podIP=` alone: a pod from before dual-stack)."""
    body: JSON = {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
    if node_name is not None:
        body["nodeName"] = node_name
    if host_network:
        body["hostNetwork"] = True
    state: JSON = {"phase": phase}
    if ips is not None:
        state["podIPs"] = [{"ip": ip} for ip in ips]
        if ips:
            state["podIP"] = ips[0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(name, namespace, uid=uid),
        "spec": body,
        "status": state | status,
    }


def pod_locator(
    name: str = "web-0",
    namespace: str = "shop",
    *,
    addresses: Sequence[Any] | None = ("10.1.0.1",),
    node_name: str | None = "node-a",
    node_labels: Mapping[str, Any] | None = None,
    role: str | None = None,
    labels: Mapping[str, str] | None = None,
    cidrs: Sequence[Any] | None = None,
    **fields: Any,
) -> JSON:
    """A PodLocator placing `addresses` (and `cidrs`) on `node_name` with its `node_labels`
    (None leaves a field out); `role` ("pod" or "node") is its toposdns.io/locator label, added
    to `labels`; `fields` replace or add top-level fields."""
    meta_labels = dict(labels or {})
    if role is not None:
        meta_labels["toposdns.io/locator"] = role
    raw: JSON = {
        "apiVersion": LOCATOR_VERSION,
        "kind": "PodLocator",
        "metadata": _metadata(name, namespace, meta_labels or None),
    }
    for field, value in (
        ("addresses", addresses),
        ("nodeName", node_name),
        ("nodeLabels", node_labels),
        ("cidrs", cidrs),
    ):
        if value is not None:
            raw[field] = list(value) if isinstance(value, tuple) else value
    return raw | fields


#: Namespace shop and its ClusterIP Service web (10.96.0.5): the smallest cluster with a name.
SHOP_WEB: list[JSON] = [namespace("shop"), service(cluster_ip="10.96.0.5")]


def forwarder_service(*ready: str, not_ready: Iterable[str] = ()) -> list[JSON]:
    """Service kube-system/coredns (the forwarders `--ecs-trust-service` may trust) and its
    EndpointSlice, with these endpoint addresses."""
    endpoints = [endpoint(address) for address in ready]
    endpoints += [endpoint(address, ready=False) for address in not_ready]
    dns = [{"name": "dns", "port": 53}]
    return [
        service("coredns", "kube-system", cluster_ip="10.96.0.20", ports=dns),
        endpoint_slice("coredns", "kube-system", endpoints, ports=dns),
    ]
