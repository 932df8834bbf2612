"""The PodLocator controller against the stand-in API server, through the real client.

Each scenario runs one or two `Controller`s in this process's event loop, changes pods and nodes
in the stand-in, and waits (bounded) for the locators to follow; the stand-in's request log
shows which writes were made, and by which replica (its user agent names it).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests import objects
from tests.kubeapi import FakeApiServer, RequestRecord
from tests.objects import READY, pod_cidrs
from toposdns.controller.app import Controller
from toposdns.controller.config import ControllerConfig, LeaseSettings
from toposdns.kube.client import apis_of, connect
from toposdns.source.watch import WatchSettings

NS = "toposdns"
ZONE = "topology.kubernetes.io/zone"
WATCH = WatchSettings(inactivity=5.0, watch_seconds=60, backoff_initial=0.05, backoff_max=0.2)
LEASE = LeaseSettings(duration=1.0, renew_deadline=0.6, retry_period=0.1)
WRITES = ("POST", "PUT", "DELETE")
MANAGED = {"app.kubernetes.io/managed-by": "toposdns"}


#: Each node's pod range, as the node IPAM controller assigns them (pods of nK are 10.K.0.x).
POD_CIDRS = {f"n{k}": [f"10.{k}.0.0/24"] for k in range(1, 10)}


def node(
    name: str, zone: str, ip: str, cidrs: list[str] | None = None, **status: Any
) -> dict[str, Any]:
    """Node `name` in `zone` at `ip`, with its pod range from POD_CIDRS unless `cidrs` are given,
    and a heartbeat in its Ready condition (the kubelet's routine write)."""
    return objects.node(
        name,
        labels={"kubernetes.io/hostname": name, ZONE: zone, "beta.kubernetes.io/os": "l"},
        addresses=[("InternalIP", ip), ("Hostname", name)],
        spec=pod_cidrs(*(POD_CIDRS.get(name, []) if cidrs is None else cidrs)),
        conditions=[{**READY, "lastHeartbeatTime": "t0"}],
        **status,
    )


def pod(
    name: str, node_name: str, ip: str | None, ns: str = "shop", **status: Any
) -> dict[str, Any]:
    return objects.pod(name, ns, node_name=node_name, ips=[ip] if ip else None, **status)


def locator(name: str, ns: str, **fields: Any) -> dict[str, Any]:
    """A PodLocator as the controller writes them, at 10.9.9.9 on n1."""
    return objects.pod_locator(
        name,
        ns,
        addresses=["10.9.9.9"],
        node_name="n1",
        node_labels={ZONE: "z1"},
        labels=MANAGED,
        **fields,
    )


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(leases=True)
    server.add(node("n1", "z1", "10.0.0.1"))
    server.add(node("n2", "z2", "10.0.0.2"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api: FakeApiServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


def config(identity: str, **overrides: Any) -> ControllerConfig:
    # Most scenarios are about writing locators (per pod, the most writes); those about which
    # pods need one run `auto` explicitly.
    settings: dict[str, Any] = dict(
        pod_locators="all",
        namespace=NS,
        lease=LEASE,
        identity=identity,
        writes_per_second=0,
        coalesce=0.01,
        backoff_initial=0.02,
        backoff_max=0.2,
        request_timeout=5.0,
    )
    settings.update(overrides)
    return ControllerConfig(**settings)


@asynccontextmanager
async def running(
    kubeconfig: Path, identity: str = "c1", **overrides: Any
) -> AsyncIterator[Controller]:
    """A controller replica; stopped (lease released) on exit."""
    client = await connect(kubeconfig)
    client.user_agent = f"test ({identity})"
    controller = Controller(apis_of(client), config(identity, **overrides), WATCH)
    task = asyncio.create_task(controller.run())
    try:
        yield controller
    finally:
        await controller.stop(task)
        await client.close()


async def until(check: Callable[[], Any], timeout: float = 5.0, what: str = "") -> float:
    """Wait, bounded, until check() is true; returns how long it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what or check}")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def writes(api: FakeApiServer, since: int = 0) -> list[RequestRecord]:
    return [r for r in api.requests[since:] if r.resource == "podlocators" and r.method in WRITES]


def summary(records: list[RequestRecord]) -> list[tuple[str, str]]:
    return sorted((r.method, r.path.rsplit("/namespaces/", 1)[-1]) for r in records)


def get(api: FakeApiServer, ns: str, name: str) -> dict[str, Any] | None:
    return api.get("podlocators", ns, name)


def zone_of(api: FakeApiServer, ns: str, name: str) -> str | None:
    found = get(api, ns, name)
    return found["nodeLabels"].get(ZONE) if found else None


def owner_uid(api: FakeApiServer, ns: str, name: str) -> str | None:
    found = get(api, ns, name)
    return found["metadata"]["ownerReferences"][0]["uid"] if found else None


def uid_of(api: FakeApiServer, resource: str, ns: str | None, name: str) -> str:
    found = api.get(resource, ns, name)
    assert found is not None
    return str(found["metadata"]["uid"])


def test_a_pod_appears_moves_finishes_and_disappears(api: FakeApiServer, kubeconfig: Path) -> None:
    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            await until(lambda: get(api, NS, "n1") and get(api, NS, "n2"), what="node locators")
            n1 = get(api, NS, "n1")
            assert n1 is not None
            assert n1["addresses"] == ["10.0.0.1"] and n1["nodeName"] == "n1"
            assert n1["cidrs"] == ["10.1.0.0/24"]
            assert n1["metadata"]["labels"] == {**MANAGED, "toposdns.io/locator": "node"}
            assert n1["nodeLabels"] == {"kubernetes.io/hostname": "n1", ZONE: "z1"}

            api.add(pod("web-0", "n1", None))  # scheduled, no IP yet: no locator
            api.add(pod("web-1", "n1", "10.1.0.9"))
            await until(lambda: get(api, NS, "shop.web-1"))
            assert get(api, NS, "shop.web-0") is None

            api.modify(pod("web-0", "n1", "10.1.0.7"))
            await until(lambda: get(api, NS, "shop.web-0"))
            created = get(api, NS, "shop.web-0")
            assert created is not None
            assert created["addresses"] == ["10.1.0.7"] and created["nodeName"] == "n1"
            assert created["nodeLabels"] == {"kubernetes.io/hostname": "n1", ZONE: "z1"}
            # In the controller's namespace, the only one DNS believes, saying the pod's.
            assert created["metadata"]["namespace"] == NS
            assert created["metadata"]["labels"] == {
                **MANAGED,
                "toposdns.io/pod-namespace": "shop",
            }
            # Owned by the node: an owner in the pod's namespace would not hold.
            assert created["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": "n1",
                    "uid": uid_of(api, "nodes", None, "n1"),
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ]
            assert get(api, "shop", "web-0") is None

            # Moves: deleted, recreated with the same name on another node.
            api.delete("pods", "shop", "web-0")
            api.add(pod("web-0", "n2", "10.2.0.3"))
            n2_uid = uid_of(api, "nodes", None, "n2")
            await until(lambda: owner_uid(api, NS, "shop.web-0") == n2_uid, what="moved")
            moved = get(api, NS, "shop.web-0")
            assert moved is not None
            assert (moved["addresses"], moved["nodeName"]) == (["10.2.0.3"], "n2")
            assert moved["nodeLabels"][ZONE] == "z2"

            api.delete("pods", "shop", "web-0")
            await until(lambda: get(api, NS, "shop.web-0") is None, what="deleted")

            api.modify(pod("web-1", "n1", "10.1.0.9", phase="Succeeded"))
            await until(lambda: get(api, NS, "shop.web-1") is None, what="finished")
            assert get(api, NS, "n1") is not None

    asyncio.run(scenario())


def test_a_zone_change_rewrites_every_locator_on_the_node(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    for i in range(3):
        api.add(pod(f"a{i}", "n1", f"10.1.0.{i + 1}"))
    api.add(pod("b0", "n2", "10.2.0.1", ns="other"))

    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 6, what="all locators")
            mark = len(api.requests)
            api.modify(node("n1", "z9", "10.0.0.1"))
            on_n1 = [(NS, "shop.a0"), (NS, "shop.a1"), (NS, "shop.a2"), (NS, "n1")]
            took = await until(lambda: all(zone_of(api, *k) == "z9" for k in on_n1))
            assert took < 2.0
            await asyncio.sleep(0.2)  # nothing else follows
            assert summary(writes(api, mark)) == sorted(
                ("PUT", f"{ns}/podlocators/{name}") for ns, name in on_n1
            )
            assert zone_of(api, NS, "other.b0") == "z2" and zone_of(api, NS, "n2") == "z2"

    asyncio.run(scenario())


def test_node_status_churn_writes_nothing(api: FakeApiServer, kubeconfig: Path) -> None:
    api.add(pod("a0", "n1", "10.1.0.1"))
    api.add(pod("b0", "n2", "10.2.0.1"))

    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 4)
            mark = len(api.requests)
            for beat in range(5):  # heartbeats, conditions, images, an unselected label
                churned = node("n1", "z1", "10.0.0.1", images=[{"names": [f"img{beat}"]}])
                churned["status"]["conditions"][0]["lastHeartbeatTime"] = f"t{beat + 1}"
                churned["metadata"]["labels"]["beta.kubernetes.io/os"] = f"l{beat}"
                api.modify(churned)
            # A change that does write, after the churn on the same watch: once it is
            # written, the churn has been seen.
            api.modify(node("n2", "z7", "10.0.0.2"))
            await until(
                lambda: zone_of(api, NS, "n2") == "z7" and zone_of(api, NS, "shop.b0") == "z7"
            )
            await asyncio.sleep(0.1)
            assert summary(writes(api, mark)) == [
                ("PUT", f"{NS}/podlocators/n2"),
                ("PUT", f"{NS}/podlocators/shop.b0"),
            ]

    asyncio.run(scenario())


def test_a_burst_of_changes_costs_one_write_per_key(api: FakeApiServer, kubeconfig: Path) -> None:
    async def scenario() -> None:
        async with running(kubeconfig, coalesce=0.2) as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 2)
            mark = len(api.requests)
            api.add(pod("p", "n1", "10.1.0.1"))
            for i in range(2, 6):
                api.modify(pod("p", "n1", f"10.1.0.{i}"))
            await until(lambda: get(api, NS, "shop.p"))
            await asyncio.sleep(0.3)
            found = get(api, NS, "shop.p")
            assert found is not None and found["addresses"] == ["10.1.0.5"]
            assert summary(writes(api, mark)) == [("POST", f"{NS}/podlocators")]

    asyncio.run(scenario())


def test_a_restart_collects_the_strays(api: FakeApiServer, kubeconfig: Path) -> None:
    api.add(node("n3", "z3", "10.0.0.3"))
    api.add(pod("kept", "n1", "10.1.0.1"))
    api.add(pod("gone", "n1", "10.1.0.2"))
    api.add(pod("on-n3", "n3", "10.3.0.1"))
    api.add(pod("theirs", "n1", "10.1.0.4"))
    api.add(pod("older", "n1", "10.1.0.5"))

    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 8)
        # While no controller runs: a pod and a node go (no garbage collector here), a pod
        # is recreated at another address, locators are left behind by hand, and an older
        # controller's is still in its pod's namespace.
        api.delete("pods", "shop", "gone")
        api.delete("pods", "shop", "on-n3")
        api.delete("nodes", None, "n3")
        api.delete("pods", "shop", "kept")
        api.add(pod("kept", "n1", "10.1.0.9"))
        api.add(locator("shop.stray", NS))  # never had a pod
        api.add(locator("older", "shop"))  # where an older controller wrote pod locators
        api.add(
            locator(
                "n9",
                NS,
                metadata={
                    "name": "n9",
                    "namespace": NS,
                    "labels": {**MANAGED, "toposdns.io/locator": "node"},
                },
            )
        )
        foreign = locator("shop.theirs", NS, metadata={"name": "shop.theirs", "namespace": NS})
        api.delete("podlocators", NS, "shop.theirs")
        api.add(foreign)  # not managed by toposdns: left alone although its pod exists
        api.add(locator("unowned", "shop", metadata={"name": "unowned", "namespace": "shop"}))
        mark = len(api.requests)

        async with running(kubeconfig, identity="c2") as controller:
            await until(lambda: controller.active)
            await until(lambda: get(api, NS, "shop.stray") is None and get(api, NS, "n9") is None)
            await until(lambda: (get(api, NS, "shop.kept") or {}).get("addresses") == ["10.1.0.9"])
            await until(lambda: get(api, NS, "n3") is None and get(api, NS, "shop.gone") is None)
            await until(lambda: get(api, "shop", "older") is None)
            await asyncio.sleep(0.1)
        assert summary(writes(api, mark)) == sorted(
            [
                ("DELETE", f"{NS}/podlocators/n3"),
                ("DELETE", f"{NS}/podlocators/n9"),
                ("DELETE", f"{NS}/podlocators/shop.gone"),
                ("DELETE", f"{NS}/podlocators/shop.on-n3"),
                ("DELETE", f"{NS}/podlocators/shop.stray"),
                ("DELETE", "shop/podlocators/older"),
                ("PUT", f"{NS}/podlocators/shop.kept"),
            ]
        )
        assert get(api, NS, "shop.older") is not None
        theirs = get(api, NS, "shop.theirs")
        assert theirs is not None and theirs["addresses"] == ["10.9.9.9"]
        assert get(api, "shop", "unowned") is not None

    asyncio.run(scenario())


def user_agents(api: FakeApiServer, since: int = 0) -> set[str]:
    return {r.headers.get("User-Agent", "") for r in writes(api, since)}


def test_two_controllers_one_leader_and_a_quick_takeover(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    api.add(pod("a0", "n1", "10.1.0.1"))

    async def scenario() -> None:
        first = running(kubeconfig, "c1")
        c1 = await first.__aenter__()
        stopped = False
        try:
            await until(lambda: c1.active)
            async with running(kubeconfig, "c2") as c2:
                await until(lambda: c2.state.synced)
                await asyncio.sleep(3 * LEASE.retry_period)
                assert c1.elector.leading and not c2.elector.leading and not c2.active
                for i in range(1, 4):
                    api.add(pod(f"a{i}", "n1", f"10.1.0.{i + 1}"))
                await until(lambda: api.count("podlocators") == 6)
                assert user_agents(api) == {"test (c1)"}
                lease = api.get("leases", NS, "toposdns-controller")
                assert lease is not None and lease["spec"]["holderIdentity"] == "c1"

                # The leader stops: it releases the lease, and the other takes over at once.
                stopped = True
                await first.__aexit__(None, None, None)
                released = time.monotonic()
                lease = api.get("leases", NS, "toposdns-controller")
                assert lease is not None
                assert lease["spec"]["holderIdentity"] in ("", "c2")
                took = await until(lambda: c2.active, timeout=3.0)
                assert took < 1.0, "the follower waited for expiry instead of the release"
                mark = len(api.requests)
                api.add(pod("b0", "n2", "10.2.0.1"))
                await until(lambda: get(api, NS, "shop.b0"))
                assert user_agents(api, mark) == {"test (c2)"}
                lease = api.get("leases", NS, "toposdns-controller")
                assert lease is not None and lease["spec"]["holderIdentity"] == "c2"
                assert lease["spec"]["leaseTransitions"] == 1
                assert time.monotonic() - released < 5.0
        finally:
            if not stopped:
                await first.__aexit__(None, None, None)

    asyncio.run(scenario())


def test_a_crashed_leader_is_replaced_after_the_lease_expires(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    async def scenario() -> None:
        async with running(kubeconfig, "c2") as c2:
            await until(lambda: c2.active)
            # Another replica that died holding the lease, without releasing it.
            holder = api.get("leases", NS, "toposdns-controller")
            assert holder is not None
        lease = api.get("leases", NS, "toposdns-controller")
        assert lease is not None and lease["spec"]["holderIdentity"] == ""
        now = "2026-01-01T00:00:00.000001Z"
        lease["spec"].update(holderIdentity="dead", leaseDurationSeconds=1, renewTime=now)
        api.modify(lease)
        async with running(kubeconfig, "c3") as c3:
            start = time.monotonic()
            await until(lambda: c3.state.synced)
            await asyncio.sleep(0.5)
            assert not c3.elector.leading, "took a lease that had not expired on its clock"
            await until(lambda: c3.active, timeout=3.0)
            assert 1.0 <= time.monotonic() - start < 2.5

    asyncio.run(scenario())


def test_a_leader_that_cannot_renew_stops_writing(api: FakeApiServer, kubeconfig: Path) -> None:
    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            assert REGISTRY.get_sample_value("toposdns_controller_leader") == 1
            api.fail_next("leases", 503, count=10_000)
            took = await until(lambda: not controller.elector.leading, timeout=3.0)
            assert took <= LEASE.renew_deadline + 1.0
            assert (
                not controller.active
                and REGISTRY.get_sample_value("toposdns_controller_leader") == 0
            )
            mark = len(api.requests)
            api.add(pod("a0", "n1", "10.1.0.1"))
            await asyncio.sleep(0.3)
            assert writes(api, mark) == []
            api.clear_failures()
            await until(lambda: controller.active, timeout=3.0)
            await until(lambda: get(api, NS, "shop.a0"))

    asyncio.run(scenario())


def test_conflicts_and_errors_are_retried_until_correct(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    api.add(pod("a0", "n1", "10.1.0.1"))

    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 3)

            # An update that meets a 409 re-reads the locator and tries again.
            mark = len(api.requests)
            api.fail_next("podlocators", 409)
            api.modify(node("n1", "z5", "10.0.0.1"))
            await until(
                lambda: zone_of(api, NS, "shop.a0") == "z5" and zone_of(api, NS, "n1") == "z5"
            )
            methods = [
                r.method
                for r in api.requests[mark:]
                if r.resource == "podlocators" and not r.is_watch
            ]
            assert methods.count("GET") == 1 and methods.count("PUT") == 3

            # Someone else changes a locator: it is put back.
            changed = get(api, NS, "shop.a0")
            assert changed is not None
            changed["nodeLabels"][ZONE] = "elsewhere"
            api.modify(changed)
            await until(lambda: zone_of(api, NS, "shop.a0") == "z5")
            # Or deletes it: it is created again.
            api.delete("podlocators", NS, "shop.a0")
            await until(lambda: get(api, NS, "shop.a0") is not None)

            # An update answered 404 becomes a create; that create's 409 a get and an update.
            mark = len(api.requests)
            api.fail_next("podlocators", 404)
            api.modify(node("n1", "z6", "10.0.0.1"))
            await until(
                lambda: zone_of(api, NS, "shop.a0") == "z6" and zone_of(api, NS, "n1") == "z6"
            )
            methods = [
                r.method
                for r in api.requests[mark:]
                if r.resource == "podlocators" and not r.is_watch
            ]
            assert sorted(methods) == ["GET", "POST", "PUT", "PUT", "PUT"]

            # Throttling and server errors are retried.
            api.fail_next("podlocators", 429, retry_after=0)
            api.fail_next("podlocators", 500, count=2)
            api.fail_next("podlocators", 503, retry_after=0)
            api.add(pod("a1", "n2", "10.2.0.1"))
            await until(lambda: get(api, NS, "shop.a1"))
            api.delete("pods", "shop", "a1")
            await until(lambda: get(api, NS, "shop.a1") is None)

    asyncio.run(scenario())


def test_writes_are_rate_limited(api: FakeApiServer, kubeconfig: Path) -> None:
    for i in range(18):
        api.add(pod(f"p{i}", "n1", f"10.1.0.{i + 1}"))

    async def scenario() -> float:
        async with running(kubeconfig, writes_per_second=10) as controller:
            await until(lambda: controller.active)
            return await until(lambda: api.count("podlocators") == 20)

    took = asyncio.run(scenario())
    assert 0.8 <= took < 3.0  # a burst of 10, then 10 more at 10/s


def test_a_leader_that_sees_another_holder_stops_at_once(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            first = api.get("leases", NS, "toposdns-controller")
            assert first is not None
            await asyncio.sleep(3 * LEASE.retry_period)
            renewed = api.get("leases", NS, "toposdns-controller")
            assert renewed is not None
            spec, before = renewed["spec"], first["spec"]
            assert spec["acquireTime"] == before["acquireTime"]
            assert spec["renewTime"] > before["renewTime"]
            assert spec["leaseTransitions"] == 0 and spec["leaseDurationSeconds"] == 1

            # Someone else writes the lease (a replica that saw it expire, say).
            spec.update(holderIdentity="intruder", renewTime=spec["renewTime"])
            api.modify(renewed)
            took = await until(lambda: not controller.elector.leading, timeout=2.0)
            assert took < LEASE.renew_deadline, "kept writing until the renew deadline"
            assert not controller.active

    asyncio.run(scenario())


def test_an_unreachable_api_is_one_line_down_and_one_back(
    api: FakeApiServer, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with running(kubeconfig) as controller:
            await until(lambda: controller.active)
            await asyncio.to_thread(api.stop)
            # Three watches and the Lease retry meanwhile, each several times.
            await until(lambda: not controller.elector.leading, timeout=10.0)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(api.restart)
            await until(lambda: controller.active, timeout=10.0)

    caplog.set_level(logging.INFO, logger="toposdns")
    asyncio.run(scenario())
    messages = [r.getMessage() for r in caplog.records]
    down = [m for m in messages if m.startswith("API unreachable since ")]
    assert len(down) == 1, messages
    assert len([m for m in messages if re.fullmatch(r"API back after \d+\.\ds", m)]) == 1
    # Nothing else about the outage above info, but the end of leadership (a change of state)
    # and the writes left to retry (a summary, at most every few seconds).
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    others = [m for m in warnings if m not in down and not m.startswith("stopped leading")]
    assert [m for m in others if not re.match(r"\d+ locator writes? to retry", m)] == []


# ----- which pods need a locator of their own (--pod-locators auto, --node-cidrs) -----


def reasons() -> dict[str, float]:
    found = {
        r: REGISTRY.get_sample_value("toposdns_controller_pod_locators", {"reason": r})
        for r in ("no-node-cidrs", "outside-node-cidrs", "borrowed", "node-locator-pending")
    }
    return {r: n for r, n in found.items() if n}


def pod_locators(api: FakeApiServer) -> set[str]:
    """Where the pod locators are, as NAMESPACE/NAME."""
    return {
        f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        for obj in api.objects("podlocators")
        if "toposdns.io/locator" not in obj["metadata"]["labels"]
    }


def test_auto_writes_node_ranges_and_a_locator_only_where_they_do_not_place(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    api.modify(node("n2", "z2", "10.0.0.2", cidrs=["10.2.0.0/24", "fd00:2::/64"]))
    api.add(pod("inside", "n1", "10.1.0.5"))
    api.add(pod("dual", "n2", "10.2.0.5", podIPs=[{"ip": "10.2.0.5"}, {"ip": "fd00:2::5"}]))
    api.add(pod("borrowed", "n1", "10.2.0.9"))  # inside n2's range
    api.add(pod("outside", "n1", "10.9.0.1"))
    host = pod("host", "n1", "10.0.0.1")  # hostNetwork: the node locator's own address
    host["spec"]["hostNetwork"] = True
    api.add(host)

    async def scenario() -> None:
        async with running(kubeconfig, pod_locators="auto") as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 4, what="2 node + 2 pod locators")
            await asyncio.sleep(0.1)
            assert pod_locators(api) == {f"{NS}/shop.borrowed", f"{NS}/shop.outside"}
            n2 = get(api, NS, "n2")
            assert n2 is not None and n2["cidrs"] == ["10.2.0.0/24", "fd00:2::/64"]
            assert reasons() == {"borrowed": 1, "outside-node-cidrs": 1}

            # A node registers before the IPAM controller gives it a range: its pods need
            # their own locators until then, and not after.
            api.add(node("n3", "z3", "10.0.0.3", cidrs=[]))
            api.add(pod("early", "n3", "10.3.0.7"))
            await until(lambda: get(api, NS, "shop.early"), what="a locator without a range")
            assert reasons()["no-node-cidrs"] == 1
            api.modify(node("n3", "z3", "10.0.0.3"))
            await until(lambda: get(api, NS, "shop.early") is None, what="placed by the range")
            n3 = get(api, NS, "n3")
            assert n3 is not None and n3["cidrs"] == ["10.3.0.0/24"]

            # A node recreated with another range (podCIDRs are set once): the exceptions
            # follow, both ways.
            api.delete("nodes", None, "n1")
            api.add(node("n1", "z1", "10.0.0.1", cidrs=["10.9.0.0/24"]))
            await until(
                lambda: pod_locators(api) == {f"{NS}/shop.borrowed", f"{NS}/shop.inside"},
                what="follow",
            )
            assert reasons() == {"borrowed": 1, "outside-node-cidrs": 1}

    asyncio.run(scenario())


def test_a_pod_locator_goes_only_once_its_node_locator_places_the_pod(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    pods = [pod(f"p{i}", f"n{1 + i % 2}", f"10.{1 + i % 2}.0.{i + 1}") for i in range(20)]
    for p in pods:
        api.add(p)

    async def scenario() -> None:
        # As an earlier version left them: a locator per pod, node locators without ranges.
        async with running(kubeconfig, pod_locators="all") as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 22)
        for name in ("n1", "n2"):
            old = get(api, NS, name)
            assert old is not None
            del old["cidrs"]
            api.modify(old)
        mark = len(api.requests)
        async with running(kubeconfig, pod_locators="auto", workers=4) as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 2, what="pod locators deleted")
        done = [r for r in writes(api, mark)]
        assert sorted(r.method for r in done) == ["DELETE"] * 20 + ["PUT"] * 2
        for r in done:
            if r.method == "DELETE":
                name = r.path.rsplit("/", 1)[1].removeprefix("shop.")
                node_put = next(
                    i for i, w in enumerate(done) if w.path.endswith(f"/n{1 + int(name[1:]) % 2}")
                )
                assert node_put < done.index(r), f"{name} deleted before its node's range"

    asyncio.run(scenario())


def test_none_writes_node_locators_only(api: FakeApiServer, kubeconfig: Path) -> None:
    api.add(pod("outside", "n1", "10.9.0.1"))
    api.add(locator("outside", "shop"))

    async def scenario() -> None:
        async with running(kubeconfig, pod_locators="none") as controller:
            await until(lambda: controller.active)
            await until(lambda: get(api, NS, "shop.outside") is None)
            await until(lambda: api.count("podlocators") == 2)
            assert reasons() == {}

    asyncio.run(scenario())


def calico_pod(name: str, node_name: str, ip: str) -> dict[str, Any]:
    return pod(name, node_name, ip, ns="calico")


def test_learned_ranges_follow_ipam_blocks_and_a_borrowed_address(
    api: FakeApiServer, kubeconfig: Path
) -> None:
    # Calico IPAM: each node has /26 blocks of 10.5.1.0/24 and leaves spec.podCIDRs empty; n2
    # has borrowed an address of n1's block.
    api.modify(node("n1", "z1", "10.0.0.1", cidrs=[]))
    api.modify(node("n2", "z2", "10.0.0.2", cidrs=[]))
    for i in range(4):
        api.add(calico_pod(f"a{i}", "n1", f"10.5.1.{i + 1}"))
        api.add(calico_pod(f"b{i}", "n2", f"10.5.1.{65 + i}"))
    api.add(calico_pod("lent", "n2", "10.5.1.9"))

    async def scenario() -> None:
        async with running(kubeconfig, pod_locators="auto", node_cidrs="learned") as controller:
            await until(lambda: controller.active)
            await until(lambda: api.count("podlocators") == 3)
            await asyncio.sleep(0.1)
            assert pod_locators(api) == {f"{NS}/calico.lent"}
            n1, n2 = get(api, NS, "n1"), get(api, NS, "n2")
            assert n1 is not None and n1["cidrs"] == ["10.5.1.0/26"]
            assert n2 is not None and n2["cidrs"] == ["10.5.1.64/26"]
            assert reasons() == {"borrowed": 1}

            # A rollout: every pod of n1 replaced by one at another address of its block.
            mark = len(api.requests)
            for i in range(4):
                api.delete("pods", "calico", f"a{i}")
            for i in range(4):
                api.add(calico_pod(f"a{i}-new", "n1", f"10.5.1.{i + 20}"))
            await asyncio.sleep(0.3)
            assert writes(api, mark) == []

            # A third node's block appears in the same /24: it gets the shortest prefix that
            # holds its pods only, until a fourth node's pods share it.
            api.add(node("n3", "z3", "10.0.0.3", cidrs=[]))
            api.add(calico_pod("c0", "n3", "10.5.1.130"))
            await until(lambda: (get(api, NS, "n3") or {}).get("cidrs") == ["10.5.1.128/25"])
            api.add(node("n4", "z1", "10.0.0.4", cidrs=[]))
            api.add(calico_pod("d0", "n4", "10.5.1.200"))
            await until(lambda: (get(api, NS, "n4") or {}).get("cidrs") == ["10.5.1.192/26"])
            await until(lambda: (get(api, NS, "n3") or {}).get("cidrs") == ["10.5.1.128/26"])
            assert pod_locators(api) == {f"{NS}/calico.lent"}

        # A restart learns what the node locators say and writes nothing.
        mark = len(api.requests)
        async with running(kubeconfig, pod_locators="auto", node_cidrs="learned") as controller:
            await until(lambda: controller.active)
            await asyncio.sleep(0.3)
        assert writes(api, mark) == []

    asyncio.run(scenario())


@pytest.mark.parametrize("node_cidrs", ["spec", "learned"])
def test_node_locators_are_written_while_the_pods_are_being_listed(
    api: FakeApiServer, kubeconfig: Path, node_cidrs: str
) -> None:
    api.add(pod("outside", "n1", "10.9.0.1"))
    api.fail_next("pods", 500, count=10_000)  # the list of every pod, still arriving

    async def scenario() -> None:
        async with running(kubeconfig, pod_locators="auto", node_cidrs=node_cidrs) as controller:
            await until(lambda: {"nodes", "podlocators"} <= controller.state.listed)
            if node_cidrs == "spec":  # node locators depend on nodes alone
                await until(lambda: get(api, NS, "n1") and get(api, NS, "n2"), what="early")
            else:  # learnt ranges need the pods
                await asyncio.sleep(0.3)
                assert api.count("podlocators") == 0
            assert not controller.state.synced and get(api, NS, "shop.outside") is None
            api.clear_failures()
            if node_cidrs == "spec":
                await until(lambda: get(api, NS, "shop.outside"), what="the pod's, once listed")
            else:  # the pod's address is all n1 has: its range
                await until(lambda: (get(api, NS, "n1") or {}).get("cidrs") == ["10.9.0.0/24"])

    asyncio.run(scenario())
