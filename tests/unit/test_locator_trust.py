"""Which PodLocators are believed: by default only those of the controller's namespace, so that
someone who may write PodLocators in their own namespace moves no client or endpoint of another;
`--locator-namespaces=*` believes every namespace, as before; a locator that is not believed is
held for `explain`, and logged and counted once when it appears."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.objects import pod_locator
from toposdns.metrics import IGNORED_LOCATORS
from toposdns.server import NAMED_IGNORED, report_ignored
from toposdns.store.builder import StoreBuilder, build_snapshot
from toposdns.store.convert import convert_object
from toposdns.store.journal import JournaledBuilder, replay
from toposdns.store.model import PodLocator
from toposdns.store.placement import EVERYWHERE
from toposdns.store.snapshot import Snapshot

CONTROLLER = "toposdns"
#: A tenant's namespace, sorted before the controller's: where two pod locators claim one
#: address, the lowest namespace/name wins.
TENANT = "a-tenant"
TRUSTED = frozenset({CONTROLLER})
Z1 = {"kubernetes.io/hostname": "node-a", "topology.kubernetes.io/zone": "z1"}
Z2 = {"kubernetes.io/hostname": "node-b", "topology.kubernetes.io/zone": "z2"}


def node_locator(name: str, address: str, cidr: str, labels: dict[str, str]) -> dict[str, Any]:
    return pod_locator(
        name,
        CONTROLLER,
        addresses=[address],
        cidrs=[cidr],
        node_name=name,
        node_labels=labels,
        role="node",
    )


#: The cluster as the controller writes it: two nodes with their addresses and pod ranges, and
#: a pod of shop at an address no range holds, with a locator of its own.
CLUSTER = [
    node_locator("node-a", "192.168.0.1", "10.244.1.0/24", Z1),
    node_locator("node-b", "192.168.0.2", "10.244.2.0/24", Z2),
    pod_locator(
        "shop.client",
        CONTROLLER,
        addresses=["10.9.0.5"],
        node_name="node-a",
        node_labels=Z1,
        labels={"toposdns.io/pod-namespace": "shop"},
    ),
]


def tenant(**fields: Any) -> dict[str, Any]:
    """A locator in the tenant's namespace that says its clients are on node-b, in z2."""
    return pod_locator("grab", TENANT, **{"node_name": "node-b", "node_labels": Z2, **fields})


#: (the tenant's locator, what is asked: an address, a prefix or "node:NAME" for a node's
#: locator, what answers without it, what answers when it is believed). An answer is the
#: name of the locator that places the address (or the node's locator) and through what.
CASES = {
    "an exact address beats a node's range": (
        tenant(addresses=["10.244.1.7"]),
        "10.244.1.7",
        "node-a via 10.244.1.0/24",
        "grab via 10.244.1.7",
    ),
    "an exact address of another namespace's pod": (
        tenant(addresses=["10.9.0.5"]),
        "10.9.0.5",
        "shop.client via 10.9.0.5",
        "grab via 10.9.0.5",
    ),
    "a node's own address (hostNetwork, NodeLocal DNSCache)": (
        tenant(addresses=["192.168.0.1"]),
        "192.168.0.1",
        "node-a via 192.168.0.1",
        "grab via 192.168.0.1",
    ),
    "a node's range claimed again unplaces its pods": (
        tenant(addresses=None, cidrs=["10.244.1.0/24"]),
        "10.244.1.7",
        "node-a via 10.244.1.0/24",
        "nobody via 10.244.1.0/24",
    ),
    "a longer prefix inside a node's range": (
        tenant(addresses=None, cidrs=["10.244.1.0/25"]),
        "10.244.1.7",
        "node-a via 10.244.1.0/24",
        "grab via 10.244.1.0/25",
    ),
    "a forwarder's Client Subnet": (
        tenant(addresses=None, cidrs=["10.244.2.0/24"]),
        "10.244.2.0/24",
        "node-b via 10.244.2.0/24",
        "nobody via 10.244.2.0/24",
    ),
    "the node label takes a node's place for its endpoints": (
        tenant(addresses=["10.77.0.1"], node_name="node-a", role="node"),
        "node:node-a",
        "node-a",
        "grab",
    ),
}


def answer(snapshot: Snapshot, asked: str) -> str:
    if asked.startswith("node:"):
        found = snapshot.node_locators.get(asked[5:])
        return found.name if found else "nobody"
    address, _, length = asked.partition("/")
    placement = snapshot.place(address, int(length) if length else None)
    return f"{placement.locator.name if placement.locator else 'nobody'} via {placement.via}"


def snapshot_of(objects: list[dict[str, Any]], believed: frozenset[str]) -> Snapshot:
    return build_snapshot([convert_object(o) for o in objects], 1, locator_namespaces=believed)


def moved(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}


@pytest.mark.parametrize(
    ("locator", "asked", "without", "believed"), CASES.values(), ids=CASES.keys()
)
def test_a_tenants_locator_moves_nobody(
    locator: dict[str, Any], asked: str, without: str, believed: str
) -> None:
    assert answer(snapshot_of(CLUSTER, TRUSTED), asked) == without
    # Ignored from the tenant's namespace, by default ...
    ignored = snapshot_of([*CLUSTER, locator], TRUSTED)
    assert answer(ignored, asked) == without
    assert list(ignored.ignored) == [(TENANT, "grab")]
    # ... honoured from the controller's ...
    trusted = snapshot_of([*CLUSTER, moved(locator, CONTROLLER)], TRUSTED)
    assert answer(trusted, asked) == believed and not trusted.ignored
    # ... and from anywhere with --locator-namespaces=*, or with the tenant's listed.
    for widened in (EVERYWHERE, frozenset({CONTROLLER, TENANT})):
        assert answer(snapshot_of([*CLUSTER, locator], widened), asked) == believed


def test_only_the_listed_namespaces_are_believed() -> None:
    # A list without the controller's namespace believes none of its locators.
    elsewhere = snapshot_of(CLUSTER, frozenset({"infra"}))
    assert answer(elsewhere, "10.244.1.7") == "nobody via "
    assert len(elsewhere.ignored) == 3 and elsewhere.locator_namespaces == {"infra"}


def test_the_pods_namespace_is_the_label_a_trusted_locator_carries() -> None:
    snapshot = snapshot_of(CLUSTER, TRUSTED)
    # --pods verified: the pod's namespace, not the locator's.
    assert snapshot.holds_pod("shop", "10.9.0.5")
    assert not snapshot.holds_pod(CONTROLLER, "10.9.0.5")
    locator = snapshot.place("10.9.0.5").locator
    assert locator is not None and locator.namespace_of_pod == "shop"
    # Without the label, the locator's own namespace, as before.
    widened = snapshot_of([tenant(addresses=["10.8.0.1"])], EVERYWHERE)
    assert widened.holds_pod(TENANT, "10.8.0.1")


def records(*objects: dict[str, Any]) -> list[PodLocator]:
    found = [convert_object(o) for o in objects]
    assert all(isinstance(r, PodLocator) for r in found)
    return found  # type: ignore[return-value]


def test_the_builder_holds_ignored_locators_apart_change_by_change() -> None:
    builder = StoreBuilder(TRUSTED)
    for record in records(*CLUSTER):
        builder.put(record)
    first = builder.snapshot(1)
    grab = records(tenant(addresses=["10.244.1.7"], cidrs=["10.244.1.0/24"]))[0]
    assert builder.put(grab)
    second = builder.snapshot(2)
    # Held, noted for the report, in no index: no answer changes.
    assert second.changes == {("ignored", TENANT, "grab")}
    assert dict(second.ignored) == {(TENANT, "grab"): grab}
    assert second.locators is first.locators and second.prefixes is first.prefixes
    assert (TENANT, "grab") in builder.keys(PodLocator)
    # An update of it is one more note; the same again is nothing.
    update = records(tenant(addresses=["10.244.1.8"]))[0]
    assert builder.put(update) and not builder.put(update)
    assert builder.snapshot(3).ignored[(TENANT, "grab")] == update
    assert builder.remove(PodLocator, TENANT, "grab")
    last = builder.snapshot(4)
    assert not last.ignored and last.changes == {("ignored", TENANT, "grab")}
    assert not builder.remove(PodLocator, TENANT, "grab")


def test_a_full_list_ignores_as_one_change_at_a_time_does() -> None:
    objects = [
        *CLUSTER,
        tenant(addresses=["10.244.1.7"]),
        moved(tenant(addresses=["10.9.0.5"]), "b-tenant"),
        moved(tenant(addresses=None, cidrs=["10.244.1.0/24"], role="node"), "c-tenant"),
    ]
    listed = JournaledBuilder(TRUSTED)
    listed.start_journal()
    listed.replace_all(PodLocator, records(*objects))
    one_by_one = build_snapshot(records(*objects), 1, locator_namespaces=TRUSTED)
    snapshot = listed.snapshot(1)
    for asked in ("10.244.1.7", "10.9.0.5", "10.244.1.9", "node:node-a"):
        assert answer(snapshot, asked) == answer(one_by_one, asked)
    assert dict(snapshot.ignored) == dict(one_by_one.ignored) and len(snapshot.ignored) == 3
    # A worker's copy replays the journal to the same state.
    copy = StoreBuilder(TRUSTED)
    replay(copy, listed.take_journal())
    assert dict(copy.snapshot(1).ignored) == dict(snapshot.ignored)
    # A relist without them removes them.
    listed.replace_all(PodLocator, records(*CLUSTER))
    assert not listed.snapshot(2).ignored


def test_each_ignored_locator_is_reported_once_when_it_appears(
    caplog: pytest.LogCaptureFixture,
) -> None:
    builder = StoreBuilder(TRUSTED)
    for record in records(*CLUSTER):
        builder.put(record)
    before = IGNORED_LOCATORS._value.get()
    snapshots = [builder.snapshot(1)]
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        builder.put(records(tenant(addresses=["10.244.1.7"]))[0])
        snapshots.append(builder.snapshot(2))
        builder.put(records(tenant(addresses=["10.244.1.8"]))[0])  # an update: no news
        snapshots.append(builder.snapshot(3))
        builder.remove(PodLocator, TENANT, "grab")
        snapshots.append(builder.snapshot(4))
        for old, new in zip(snapshots, snapshots[1:], strict=False):
            report_ignored(old, new)
            report_ignored(new, new)  # the same snapshot again (a reload of the same file)
    assert [r.getMessage() for r in caplog.records] == [
        f"PodLocator {TENANT}/grab ignored: only PodLocators in {CONTROLLER} place clients and "
        "endpoints (--locator-namespaces), where the controller writes them; one from an older "
        "controller goes when the new one runs, one written by hand belongs there"
    ]
    assert IGNORED_LOCATORS._value.get() - before == 1


def test_many_ignored_at_once_are_named_a_few_and_counted_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A relist after an upgrade: thousands of locators an older controller wrote by each pod.
    many = [pod_locator(f"web-{i}", "shop", addresses=[f"10.1.{i // 250}.{i % 250 + 1}"])
            for i in range(2000)]  # fmt: skip
    before = IGNORED_LOCATORS._value.get()
    with caplog.at_level(logging.WARNING, logger="toposdns"):
        report_ignored(Snapshot(), snapshot_of([*CLUSTER, *many], TRUSTED))
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == NAMED_IGNORED + 1
    assert messages[-1] == (
        f"{2000 - NAMED_IGNORED} more PodLocators outside {CONTROLLER} ignored "
        "(toposdns_ignored_locators_total)"
    )
    assert IGNORED_LOCATORS._value.get() - before == 2000
