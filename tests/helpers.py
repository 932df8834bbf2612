"""Shared test helpers: snapshots from raw objects, configs, and comparing records as text."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dnslib

from toposdns.config import answer_options
from toposdns.resolve.resolver import ResolverConfig
from toposdns.store.builder import build_snapshot
from toposdns.store.convert import convert_object
from toposdns.store.snapshot import Snapshot

#: Namespace shop and its ClusterIP Service web (10.96.0.5): the smallest cluster with a name.
SHOP_WEB: list[dict[str, Any]] = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}},
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.5", "ports": [{"name": "http", "port": 80}]},
    },
]


def headless(
    name: str,
    namespace: str,
    endpoints: list[dict[str, Any]],
    family: str = "IPv4",
    **spec: Any,
) -> list[dict[str, Any]]:
    """A headless Service with one port, `http` 80, and one EndpointSlice of `endpoints`."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80}], **spec},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-1",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": family,
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
            "endpoints": endpoints,
        },
    ]


def snapshot_of(objects: Iterable[dict[str, Any]], synced: bool = True) -> Snapshot:
    """A snapshot built from raw Kubernetes objects, as a snapshot file would give."""
    return build_snapshot([convert_object(o) for o in objects], serial=1700000000, synced=synced)


def config_of(
    zones: list[str] | None = None,
    ttl: int = 5,
    pods: str = "disabled",
    endpoint_pod_names: bool = False,
    namespaces: Iterable[str] = (),
    ns_addresses: Iterable[str] = (),
    zonal: bool = False,
    ignore_empty_service: bool = False,
    noendpoints: bool = False,
) -> ResolverConfig:
    """A resolver config from CLI-style values."""
    parsed = kubernetes({"--zone": zones or ["cluster.local"]})
    return ResolverConfig(
        zones=parsed.zones,
        ttl=ttl,
        pods=pods,
        endpoint_pod_names=endpoint_pod_names,
        namespaces=frozenset(namespaces),
        ns_addresses=tuple(ns_addresses),
        primary_zone=parsed.primary_zone,
        zonal=zonal,
        ignore_empty_service=ignore_empty_service,
        noendpoints=noendpoints,
    )


def kubernetes(flags: dict[str, Any]) -> ResolverConfig:
    """The answer options as the server reads them from its flags, by flag:
    `{"--zone": ["cluster.local"], "--ttl": "30", "--fallthrough": [""]}`."""
    return answer_options(flags)[0]


def normal(rr: dnslib.RR) -> str:
    """A record as comparable text; SOA serials are zeroed since they follow the clock."""
    if rr.rtype == dnslib.QTYPE.SOA:
        rr = dnslib.RR(
            rr.rname,
            rr.rtype,
            rr.rclass,
            rr.ttl,
            dnslib.SOA(rr.rdata.mname, rr.rdata.rname, (0,) + tuple(rr.rdata.times[1:])),
        )
    return str(rr)


def normal_text(zone_lines: Iterable[str]) -> list[str]:
    """Zone-file lines as comparable text, sorted (CoreDNS's order is not defined)."""
    return sorted(normal(rr) for line in zone_lines for rr in dnslib.RR.fromZone(line))


def normal_rrs(rrs: Iterable[dnslib.RR]) -> list[str]:
    """Parsed records as comparable text, sorted."""
    return sorted(normal(rr) for rr in rrs)


def forwarder_service(*ready: str, not_ready: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Service kube-system/coredns (the forwarders `--ecs-trust-service` may trust) and its
    EndpointSlice, with these endpoint addresses."""
    endpoints = [{"addresses": [address]} for address in ready] + [
        {"addresses": [address], "conditions": {"ready": False}} for address in not_ready
    ]
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "coredns", "namespace": "kube-system"},
            "spec": {"clusterIP": "10.96.0.20", "ports": [{"name": "dns", "port": 53}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": "coredns-1",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/service-name": "coredns"},
            },
            "addressType": "IPv4",
            "ports": [{"name": "dns", "port": 53}],
            "endpoints": endpoints,
        },
    ]
