"""Shared test helpers: snapshots from raw objects (tests/objects.py builds them), configs, and
comparing records as text."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import dnslib

from toposdns.config import answer_options
from toposdns.resolve.resolver import ResolverConfig
from toposdns.store.builder import build_snapshot
from toposdns.store.convert import convert_object
from toposdns.store.snapshot import Snapshot


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
