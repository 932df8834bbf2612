"""The incremental builder: any sequence of changes gives the snapshot a full rebuild gives."""

from __future__ import annotations

import random
from typing import Any

from toposdns.store.builder import MAX_NOTED_CHANGES, StoreBuilder, build_snapshot, record_key
from toposdns.store.model import (
    Endpoint,
    EndpointSlice,
    Namespace,
    PodLocator,
    Port,
    Record,
    Service,
)
from toposdns.store.snapshot import EVERYTHING, Snapshot

HTTP = (Port("http", "TCP", 80),)


def random_record(rng: random.Random) -> Record:
    ns = rng.choice(["a", "b"])
    kind = rng.randrange(4)
    if kind == 0:
        return Namespace(ns)
    if kind == 1:
        headless = rng.random() < 0.5
        return Service(
            ns,
            f"svc{rng.randrange(4)}",
            "Headless" if headless else "ClusterIP",
            () if headless else (f"10.96.0.{rng.randrange(3)}",),
            HTTP,
            topology_keys=rng.choice([None, ("topology.kubernetes.io/zone", "*"), ("*", "x")]),
        )
    if kind == 2:
        endpoints = tuple(
            Endpoint(
                (f"10.1.0.{rng.randrange(6)}",),
                hostname=rng.choice(["", "h"]),
                node_name=f"n{rng.randrange(3)}",
                zone=rng.choice(["z1", "z2"]),
                hint_zones=rng.choice([None, ("z1",)]),
            )
            for _ in range(rng.randrange(3))
        )
        return EndpointSlice(
            ns, f"slice{rng.randrange(5)}", f"svc{rng.randrange(4)}", HTTP, endpoints
        )
    node = rng.random() < 0.3
    return PodLocator(
        ns,
        f"loc{rng.randrange(6)}",
        (f"10.1.0.{rng.randrange(6)}",),
        f"n{rng.randrange(3)}",
        {"topology.kubernetes.io/zone": rng.choice(["z1", "z2"])},
        is_node=node,
    )


def comparable(snap: Snapshot) -> dict[str, Any]:
    return {
        "services": dict(snap.services),
        "slices": {k: set(v) for k, v in snap.slices.items()},
        "namespaces": snap.namespaces,
        "service_ips": {k: set(v) for k, v in snap.service_ips.items()},
        "endpoint_ips": {
            k: {(s.name, e, a) for s, e, a in snap.endpoints_at(k)} for k in snap.endpoint_ips
        },
        "locators": {k: v.addresses for k, v in snap.locators.items()},
        "node_locators": dict(snap.node_locators),
        "shared_ips": {k: {(h.namespace, h.name) for h in v} for k, v in snap.shared_ips.items()},
        "policies": dict(snap.policies),
    }


def test_incremental_changes_match_a_full_rebuild() -> None:
    rng = random.Random(7)
    builder = StoreBuilder()
    current: dict[tuple[type, str, str], Record] = {}
    for step in range(3000):
        if current and rng.random() < 0.3:
            key = rng.choice(sorted(current, key=str))
            del current[key]
            assert builder.remove(*key)
        else:
            record = random_record(rng)
            current[record_key(record)] = record
            builder.put(record)
        if step % 50 == 0:
            snap = builder.snapshot(serial=step)
            assert comparable(snap) == comparable(build_snapshot(current.values(), step)), step


def test_unchanged_updates_are_no_ops_and_share_indexes() -> None:
    builder = StoreBuilder()
    locator = PodLocator("a", "p", ("10.0.0.1",), "n1", {"k": "v"})
    assert builder.put(locator)
    first = builder.snapshot(1)
    assert not builder.put(PodLocator("a", "p", ("10.0.0.1",), "n1", {"k": "v"}))
    assert not builder.dirty
    builder.put(Service("a", "s", "ClusterIP", ("10.96.0.1",), HTTP))
    second = builder.snapshot(2)
    assert second.locators is first.locators  # untouched indexes are shared, not copied
    assert second.services is not first.services


def test_replace_all_removes_what_the_list_no_longer_has() -> None:
    builder = StoreBuilder()
    builder.replace_all(Namespace, [Namespace("a"), Namespace("b")])
    assert builder.replace_all(Namespace, [Namespace("b")])
    assert set(builder.snapshot(1).namespaces) == {"b"}
    assert not builder.replace_all(Namespace, [Namespace("b")])


def test_pod_locators_win_over_node_locators() -> None:
    builder = StoreBuilder()
    node = PodLocator("sys", "n1", ("10.0.0.1",), "n1", {"z": "node"}, is_node=True)
    pod = PodLocator("a", "p", ("10.0.0.1",), "n1", {"z": "pod"})
    builder.put(node)
    builder.put(pod)
    assert builder.snapshot(1).locators["10.0.0.1"] is pod
    builder.remove(PodLocator, "a", "p")
    snap = builder.snapshot(2)
    assert snap.locators["10.0.0.1"] is node and not snap.holds_pod("a", "10.0.0.1")


def test_a_full_list_says_everything_changed_rather_than_what() -> None:
    builder = StoreBuilder()
    first = builder.snapshot(1)
    few = [PodLocator("a", f"p{i}", (f"10.0.0.{i}",), "n1", {}) for i in range(3)]
    builder.replace_all(PodLocator, few)
    second = builder.snapshot(2)
    assert second.changed_since(first) == {("loc", f"10.0.0.{i}") for i in range(3)}
    many = [
        PodLocator("a", f"p{i}", (f"10.1.{i >> 8}.{i & 255}",), "n1", {})
        for i in range(MAX_NOTED_CHANGES + 1)
    ]
    builder.replace_all(PodLocator, many)
    third = builder.snapshot(3)
    assert third.changes is EVERYTHING and third.changed_since(second) is None
    assert third.follows(second)  # still the same builder's next: workers replay it
    assert third.locators["10.1.0.5"].name == "p5" and "10.0.0.1" not in third.locators
    builder.put(PodLocator("a", "q", ("10.2.0.1",), "n1", {}))
    assert builder.snapshot(4).changed_since(third) == {("loc", "10.2.0.1")}


def test_a_full_list_of_locators_matches_one_put_at_a_time() -> None:
    """The bulk path of `replace_all` (new pod locators on unclaimed addresses) and the rest:
    updates, shared addresses, node locators and prefixes end as `put` would leave them."""
    rng = random.Random(11)
    for _ in range(30):
        before = [random_record(rng) for _ in range(20)]
        listed = [random_record(rng) for _ in range(40)]
        listed.append(PodLocator("a", "range", (), "n1", {}, is_node=True, cidrs=("10.9.0.0/24",)))
        bulk, one_by_one = StoreBuilder(), StoreBuilder()
        for builder in (bulk, one_by_one):
            builder.replace_all(PodLocator, [r for r in before if isinstance(r, PodLocator)])
        locators = {record_key(r): r for r in listed if isinstance(r, PodLocator)}
        assert bulk.replace_all(PodLocator, list(locators.values()))
        for key in one_by_one.keys(PodLocator) - {k[1:] for k in locators}:
            one_by_one.remove(PodLocator, *key)
        for record in locators.values():
            one_by_one.put(record)
        want, got = one_by_one.snapshot(1), bulk.snapshot(1)
        assert comparable(got) == comparable(want)
        assert got.place("10.9.0.7") == want.place("10.9.0.7")
        assert not bulk.replace_all(PodLocator, list(locators.values()))


def test_endpoint_index_holds_slices_and_finds_every_endpoint() -> None:
    """An address held by one slice maps to that slice itself (no entry per endpoint: memory
    at 150,000 endpoints), by several to the tuple of them in input order; `endpoints_at` gives
    every (slice, endpoint, address as written), canonical or not."""
    one = Endpoint(("10.1.0.1",))
    twice = Endpoint(("fd00:1:0::3", "10.1.0.2"))
    again = Endpoint(("fd00:1::3",))
    a = EndpointSlice("a", "s1", "svc", HTTP, (one, twice))
    b = EndpointSlice("a", "s2", "svc", HTTP, (again,))
    c = EndpointSlice("b", "s3", "svc", HTTP, (Endpoint(("10.1.0.2",)), one))
    builder = StoreBuilder()
    for eps in (a, b, c):
        builder.put(eps)
    snap = builder.snapshot(1)
    assert snap.endpoint_ips["10.1.0.1"] == (a, c)
    assert snap.endpoint_ips["fd00:1::3"] == (a, b)
    assert a.canonical is False and b.canonical is True and c.canonical is True
    cases = [
        ("10.1.0.1", [(a, one, "10.1.0.1"), (c, one, "10.1.0.1")]),
        ("10.1.0.2", [(a, twice, "10.1.0.2"), (c, c.endpoints[0], "10.1.0.2")]),
        ("fd00:1::3", [(a, twice, "fd00:1:0::3"), (b, again, "fd00:1::3")]),
        ("10.1.0.9", []),
    ]
    for ip, want in cases:
        assert snap.endpoints_at(ip) == want, ip
    builder.remove(EndpointSlice, "a", "s1")
    snap = builder.snapshot(2)
    assert snap.endpoint_ips["10.1.0.1"] is c
    assert snap.endpoint_ips["fd00:1::3"] is b
    assert snap.endpoints_at("fd00:1::3") == [(b, again, "fd00:1::3")]
    builder.remove(EndpointSlice, "a", "s2")
    assert "fd00:1::3" not in builder.snapshot(3).endpoint_ips
