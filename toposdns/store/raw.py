"""What DNS reads of each kind of raw object, as TypedDicts: the live source decodes list
pages to these fields alone, so that the owner references, uids, managed fields and
last-applied annotations of 150,000 objects are skipped by the decoder instead of built and
freed again.

Each TypedDict lists every field that `store/convert.py` and the live source read, and types
as `Any` each whose value the converters check themselves, so that an object decoded to these
converts exactly as the whole object would, record or error message (tests/unit/test_raw.py
holds the converters' tables to that). A nested field declared as a TypedDict (or a list of
them) may be null, as the API server writes an empty list, but nothing else: a page with an
object of another shape is decoded whole instead, and that object checked field by field.
"""

from __future__ import annotations

from typing import Any, TypedDict


class Named(TypedDict, total=False):
    """`metadata` of an object of which only its name and namespace are read."""

    name: Any
    namespace: Any


# Keys with dots and slashes: the functional form, with literals (kube/resources.py
# NODE_LOCATOR_LABEL and POD_NAMESPACE_LABEL, store/convert.py SERVICE_NAME_LABEL and
# TOPOLOGY_KEYS_ANNOTATION, and source/kube.py TRIGGER_TIME name the same keys).
LocatorLabels = TypedDict(
    "LocatorLabels", {"toposdns.io/locator": Any, "toposdns.io/pod-namespace": Any}, total=False
)
ServiceAnnotations = TypedDict(
    "ServiceAnnotations", {"toposdns.io/topology-keys": Any}, total=False
)
SliceLabels = TypedDict("SliceLabels", {"kubernetes.io/service-name": Any}, total=False)
SliceAnnotations = TypedDict(
    "SliceAnnotations", {"endpoints.kubernetes.io/last-change-trigger-time": Any}, total=False
)


class Port(TypedDict, total=False):
    """A port of a Service or an EndpointSlice."""

    name: Any
    protocol: Any
    port: Any


class Namespace(TypedDict, total=False):
    """A v1 Namespace: its name."""

    apiVersion: Any
    kind: Any
    metadata: Named | None


class ServiceMeta(Named, total=False):
    annotations: ServiceAnnotations | None


class ServiceSpec(TypedDict, total=False):
    type: Any
    externalName: Any
    clusterIP: Any
    clusterIPs: Any
    ports: list[Port] | None
    topologyKeys: Any
    trafficDistribution: Any
    externalTrafficPolicy: Any


class Service(TypedDict, total=False):
    """A v1 Service: its kind, addresses, ports and topology settings."""

    apiVersion: Any
    kind: Any
    metadata: ServiceMeta | None
    spec: ServiceSpec | None


class SliceMeta(Named, total=False):
    labels: SliceLabels | None
    annotations: SliceAnnotations | None


class TargetRef(TypedDict, total=False):
    name: Any


class Endpoint(TypedDict, total=False):
    addresses: Any
    conditions: Any
    targetRef: TargetRef | None
    hostname: Any
    nodeName: Any
    zone: Any
    hints: Any


class EndpointSlice(TypedDict, total=False):
    """A discovery.k8s.io/v1 EndpointSlice: its Service, endpoints and ports."""

    apiVersion: Any
    kind: Any
    metadata: SliceMeta | None
    addressType: Any
    endpoints: list[Endpoint] | None
    ports: list[Port] | None


class LocatorMeta(Named, total=False):
    labels: LocatorLabels | None


class PodLocator(TypedDict, total=False):
    """A toposdns.io PodLocator: everything but its metadata's other fields."""

    apiVersion: Any
    kind: Any
    metadata: LocatorMeta | None
    addresses: Any
    cidrs: Any
    nodeName: Any
    nodeLabels: Any
