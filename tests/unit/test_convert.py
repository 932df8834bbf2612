"""Raw objects to records: what is kept, what is dropped, and how errors name their cause."""

from __future__ import annotations

from typing import Any

import pytest

from toposdns.store.convert import ObjectError, convert_object
from toposdns.store.model import CLUSTER_IP, EXTERNAL_NAME, HEADLESS, NO_PORT, PodLocator


def service(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop", **meta},
        "spec": spec,
    }


def slice_(endpoints: list[Any], address_type: str = "IPv4", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "web-abc",
            "namespace": "shop",
            "labels": {"kubernetes.io/service-name": "web"},
        },
        "addressType": address_type,
        "endpoints": endpoints,
        **extra,
    }


def test_service_kinds() -> None:
    assert convert_object(service({"clusterIP": "None"})).kind == HEADLESS
    dual = convert_object(
        service(
            {"clusterIP": "10.0.0.1", "clusterIPs": ["10.0.0.1", "fd00::1"], "type": "LoadBalancer"}
        )
    )
    assert dual.kind == CLUSTER_IP and dual.cluster_ips == ("10.0.0.1", "fd00::1")
    assert dual.ports == (NO_PORT,)
    ext = convert_object(service({"type": "ExternalName", "externalName": "example.org"}))
    assert ext.kind == EXTERNAL_NAME and ext.external_name == "example.org"


def test_topology_fields() -> None:
    svc = convert_object(
        service(
            {
                "clusterIP": "None",
                "topologyKeys": ["kubernetes.io/hostname", "*"],
                "trafficDistribution": "PreferClose",
            },
            annotations={"toposdns.io/topology-keys": "topology.kubernetes.io/zone, *"},
        )
    )
    assert svc.topology_keys == ("kubernetes.io/hostname", "*")
    assert svc.topology_annotation == ("topology.kubernetes.io/zone", "*")
    assert svc.traffic_distribution == "PreferClose"


def test_endpoint_slice_keeps_only_ready_endpoints() -> None:
    eps = convert_object(
        slice_(
            [
                {
                    "addresses": ["10.1.0.1"],
                    "hostname": "web-0",
                    "nodeName": "n1",
                    "zone": "z1",
                    "targetRef": {"kind": "Pod", "name": "web-0"},
                    "hints": {"forZones": [{"name": "z1"}]},
                },
                {"addresses": ["10.1.0.2"], "conditions": {"ready": False}},
                {"addresses": ["10.1.0.3"], "conditions": {"ready": None}},
            ],
            ports=[{"name": "http", "port": 80}],
        )
    )
    assert [ep.addresses for ep in eps.endpoints] == [("10.1.0.1",), ("10.1.0.3",)]
    first = eps.endpoints[0]
    assert (first.hostname, first.pod_name, first.node_name, first.zone, first.hint_zones) == (
        "web-0",
        "web-0",
        "n1",
        "z1",
        ("z1",),
    )
    assert eps.ports[0].protocol == "TCP"


def test_pod_locator() -> None:
    locator = convert_object(
        {
            "apiVersion": "toposdns.io/v1alpha1",
            "kind": "PodLocator",
            "metadata": {
                "name": "node-a",
                "namespace": "toposdns",
                "labels": {"toposdns.io/locator": "node"},
            },
            "addresses": ["192.168.0.10"],
            "nodeName": "node-a",
            "nodeLabels": {"topology.kubernetes.io/zone": "z1"},
        }
    )
    assert isinstance(locator, PodLocator) and locator.is_node
    assert locator.node_labels == {"topology.kubernetes.io/zone": "z1"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            slice_([{"addresses": ["not-an-ip"]}]),
            "EndpointSlice shop/web-abc: endpoints[0].addresses[0]: not an IP address: 'not-an-ip'",
        ),
        (
            slice_([{"addresses": ["10.1.0.1"]}, {"addresses": ["10.1.0.2", "10.1.0.300"]}]),
            "EndpointSlice shop/web-abc: endpoints[1].addresses[1]: not an IP address",
        ),
        (
            slice_(
                [{"addresses": ["10.1.0.1"]}] * 2
                + [{"addresses": ["10.1.0.3"], "hints": {"forZones": [{"name": 7}]}}]
            ),
            "EndpointSlice shop/web-abc: endpoints[2].hints.forZones[0].name: must be a string, "
            "got int",
        ),
        (
            slice_([{"addresses": ["10.1.0.1"], "hints": {"forZones": [{"name": "a"}, "b"]}}]),
            "EndpointSlice shop/web-abc: endpoints[0].hints.forZones[1]: must be a mapping",
        ),
        (
            slice_([{"addresses": ["10.1.0.1"], "hints": {"forZones": {"name": "a"}}}]),
            "EndpointSlice shop/web-abc: endpoints[0].hints.forZones: must be a list, got dict",
        ),
        (
            service({"clusterIPs": ["10.0.0.1", "fd00::1:x"]}),
            "Service shop/web: spec.clusterIPs[1]: not an IP address: 'fd00::1:x'",
        ),
        (
            service({"clusterIP": "None", "topologyKeys": ["kubernetes.io/hostname", 5]}),
            "Service shop/web: spec.topologyKeys[1]: must be a string, got int",
        ),
        (
            service({"clusterIP": "None"}, annotations={"toposdns.io/topology-keys": ["a"]}),
            "Service shop/web: metadata.annotations[toposdns.io/topology-keys]: must be a string",
        ),
        (
            {
                "apiVersion": "toposdns.io/v1alpha1",
                "kind": "PodLocator",
                "metadata": {"name": "web-0", "namespace": "shop"},
                "addresses": ["10.1.0.1", "10.1.0.256"],
            },
            "PodLocator shop/web-0: addresses[1]: not an IP address: '10.1.0.256'",
        ),
        (
            slice_([], address_type="IPv5"),
            "EndpointSlice shop/web-abc: addressType: unknown addressType 'IPv5'",
        ),
        (
            service({"clusterIP": "10.0.0.300"}),
            "Service shop/web: spec.clusterIP: not an IP address: '10.0.0.300'",
        ),
        (service({"type": "Bogus"}), "Service shop/web: spec.type: unknown service type 'Bogus'"),
        (service({"type": "ExternalName"}), "Service shop/web: spec.externalName: is required"),
        (
            service({"clusterIP": "10.0.0.1", "ports": [{"port": "80"}]}),
            "Service shop/web: spec.ports[0].port: not a port number: '80'",
        ),
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
            "Pod p: apiVersion/kind: unsupported v1/Pod",
        ),
        (
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": {}},
            "Service web: metadata.namespace: is required",
        ),
    ],
)
def test_errors_name_object_and_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError) as info:
        convert_object(raw)
    assert str(info.value).startswith(message)
