"""The live source against the stand-in API server, through the real `kubernetes` client:
initial sync in pages, events of each kind, 410 and relist, restarts, stalls, bad objects."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.helpers import config_of
from tests.kubeapi import FakeApiServer
from tests.objects import endpoint, endpoint_slice, namespace, pod_locator, service
from toposdns.kube.client import apis_of, connect
from toposdns.metrics import MALFORMED_OBJECTS, WATCH_RESTARTS
from toposdns.resolve.resolver import resolve
from toposdns.source.kube import ENDPOINT_SLICES, KubeSource
from toposdns.source.watch import WatchSettings
from toposdns.store.convert import convert_object
from toposdns.store.snapshot import Snapshot
from toposdns.wire.codes import A

FAST = WatchSettings(
    inactivity=1.0, watch_seconds=30, backoff_initial=0.05, backoff_max=0.2, page_size=2
)
CONFIG = config_of()
ZONE = "topology.kubernetes.io/zone"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.add(namespace("shop"))
    for i in range(5):
        server.add(service(f"svc{i}", cluster_ip=f"10.96.0.{i + 1}"))
    server.add(service("db", cluster_ip="None"))
    server.add(
        endpoint_slice("db", endpoints=[endpoint("10.1.0.1"), endpoint("10.1.0.2")], name="db-1")
    )
    server.add(
        pod_locator("client", addresses=["10.1.9.9"], node_name="n1", node_labels={ZONE: "z1"})
    )
    server.start()
    yield server
    server.stop()


class Run:
    """A KubeSource running in this event loop, and what it published."""

    def __init__(self, source: KubeSource) -> None:
        self.source = source
        self.published: list[Snapshot] = []

    @property
    def snapshot(self) -> Snapshot:
        return self.published[-1]

    def answer(self, name: str) -> list[str]:
        found = resolve(tuple(name.split(".")), A, self.snapshot, CONFIG)
        return sorted(str(rr.rdata) for rr in found.answer if rr.rtype == A)

    async def until(self, check: Callable[[], bool], timeout: float = 5.0) -> float:
        """Wait (bounded) until check() holds; returns how long it took."""
        start = time.monotonic()
        while not (self.published and check()):
            if time.monotonic() - start > timeout:
                raise AssertionError(f"condition not met within {timeout} s")
            await asyncio.sleep(0.005)
        return time.monotonic() - start


@asynccontextmanager
async def running(
    kubeconfig: Path,
    settings: WatchSettings = FAST,
    on_page: Callable[[], None] | None = None,
    endpoints: bool = True,
) -> AsyncIterator[Run]:
    client = await connect(kubeconfig)
    source = KubeSource(
        apis_of(client),
        lambda s: run.published.append(s),
        settings,
        on_page=on_page,
        endpoints=endpoints,
    )
    run = Run(source)
    task = asyncio.create_task(run.source.run())
    try:
        yield run
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()


def test_initial_sync_lists_in_pages_with_the_token(api: FakeApiServer, tmp_path: Path) -> None:
    pages: list[int] = []

    async def scenario() -> None:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        async with running(kubeconfig, on_page=lambda: pages.append(1)) as run:
            await run.until(lambda: run.snapshot.synced)
            assert run.answer("svc3.shop.svc.cluster.local") == ["10.96.0.4"]
            assert run.answer("db.shop.svc.cluster.local") == ["10.1.0.1", "10.1.0.2"]
            assert run.snapshot.locators["10.1.9.9"].node_labels == {
                "topology.kubernetes.io/zone": "z1"
            }
            # The last list to end may still be starting its watch.
            await run.until(lambda: sum(r.is_watch for r in api.requests) == 4)

    asyncio.run(scenario())
    lists = [r for r in api.requests if r.resource == "services" and not r.is_watch]
    assert len(lists) == 3 and all(r.query.get("limit") == "2" for r in lists)
    assert [bool(r.query.get("continue")) for r in lists] == [False, True, True]
    # The owner's hook ran once per list page, of every resource.
    assert len(pages) == len([r for r in api.requests if not r.is_watch]) == 6
    watches = [r for r in api.requests if r.is_watch]
    assert {r.resource for r in watches} == {
        "services",
        "endpointslices",
        "namespaces",
        "podlocators",
    }
    assert all(r.query.get("allowWatchBookmarks") == "true" for r in watches)
    assert all(r.headers["authorization"] == "Bearer test-token" for r in api.requests)


def test_noendpoints_watches_no_endpointslices(api: FakeApiServer, tmp_path: Path) -> None:
    # CoreDNS's `noendpoints` starts no EndpointSlice informer; sync needs the other three.
    async def scenario() -> None:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        async with running(kubeconfig, endpoints=False) as run:
            await run.until(lambda: run.snapshot.synced)
            assert not run.snapshot.slices
            assert run.answer("svc3.shop.svc.cluster.local") == ["10.96.0.4"]

    asyncio.run(scenario())
    assert "endpointslices" not in {r.resource for r in api.requests}


def test_events_of_each_kind_change_answers_within_a_second(
    api: FakeApiServer, tmp_path: Path
) -> None:
    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: run.snapshot.synced)
            await asyncio.to_thread(api.wait_for_watches, 4)  # not blocking the reflectors
            api.modify(service("svc0", cluster_ip="10.96.1.1"))
            assert (
                await run.until(lambda: run.answer("svc0.shop.svc.cluster.local") == ["10.96.1.1"])
                < 1
            )
            api.add(endpoint_slice("db", endpoints=[endpoint("10.1.0.3")], name="db-2"))
            await run.until(lambda: len(run.answer("db.shop.svc.cluster.local")) == 3, 1)
            api.delete("EndpointSlice", "shop", "db-1")
            await run.until(lambda: run.answer("db.shop.svc.cluster.local") == ["10.1.0.3"], 1)
            api.modify(
                pod_locator(
                    "client", addresses=["10.1.9.9"], node_name="n1", node_labels={ZONE: "z2"}
                )
            )
            await run.until(
                lambda: (
                    run.snapshot.locators["10.1.9.9"].node_labels["topology.kubernetes.io/zone"]
                    == "z2"
                ),
                1,
            )
            api.delete("PodLocator", "shop", "client")
            await run.until(lambda: "10.1.9.9" not in run.snapshot.locators, 1)
            api.add(namespace("web"))
            api.add(service("front", "web", cluster_ip="10.96.2.2"))
            await run.until(lambda: run.answer("front.web.svc.cluster.local") == ["10.96.2.2"], 1)
            api.delete("Namespace", None, "web")
            await run.until(lambda: "web" not in run.snapshot.namespaces, 1)
            api.delete("Service", "shop", "svc1")
            await run.until(lambda: run.answer("svc1.shop.svc.cluster.local") == [], 1)

    asyncio.run(scenario())


def test_410_relists_without_dropping_what_is_served(api: FakeApiServer, tmp_path: Path) -> None:
    before = WATCH_RESTARTS.labels("services", "gone")._value.get()

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: run.snapshot.synced)
            await asyncio.to_thread(api.wait_for_watches, 4)  # not blocking the reflectors
            synced_at = len(run.published)
            api.compact()  # open watches get ERROR 410; their versions are now too old
            api.modify(service("svc2", cluster_ip="10.96.3.3"))
            await run.until(lambda: run.answer("svc2.shop.svc.cluster.local") == ["10.96.3.3"])
            # Every snapshot since the sync kept the other services: the relist swapped in place.
            for snap in run.published[synced_at:]:
                assert ("shop", "svc4") in snap.services and snap.synced

    asyncio.run(scenario())
    assert WATCH_RESTARTS.labels("services", "gone")._value.get() > before
    relists = [r for r in api.requests if r.resource == "services" and not r.is_watch]
    assert len(relists) >= 6  # two full paged lists


def test_api_server_restart_keeps_data_and_catches_up(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: run.snapshot.synced)
            await asyncio.to_thread(api.wait_for_watches, 4)  # not blocking the reflectors
            await asyncio.to_thread(api.stop)
            await asyncio.sleep(0.3)  # reflectors fail and back off meanwhile
            assert run.answer("svc0.shop.svc.cluster.local") == ["10.96.0.1"]
            api.add(service("late", cluster_ip="10.96.9.9"))
            await asyncio.to_thread(api.restart)
            await run.until(lambda: run.answer("late.shop.svc.cluster.local") == ["10.96.9.9"])
            assert run.answer("svc0.shop.svc.cluster.local") == ["10.96.0.1"]

    caplog.set_level(logging.INFO, logger="toposdns")
    asyncio.run(scenario())
    # One line when the API went away and one when it came back, whatever the four watches and
    # their retries did in between.
    problems = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(problems) == 1 and problems[0].startswith("API unreachable since "), problems
    back = [r.getMessage() for r in caplog.records if r.getMessage().startswith("API back")]
    assert len(back) == 1 and re.fullmatch(r"API back after \d+\.\ds", back[0]), back


def test_a_dropped_watch_resumes_from_the_last_event(api: FakeApiServer, tmp_path: Path) -> None:
    """A watch that breaks off resumes after the last event it delivered: starting again from
    an older version would replay changes already served, and answers would go back in time."""

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: run.snapshot.synced)
            await asyncio.to_thread(api.wait_for_watches, 4, None, 15.0)
            for i in range(1, 6):
                last = api.modify(service("svc0", cluster_ip=f"10.96.5.{i}"))
                await run.until(lambda: run.answer(svc0) == [f"10.96.5.{i}"])  # noqa: B023
            seen = len(run.published)
            api.requests.clear()
            await asyncio.to_thread(api.restart)  # every watch dropped mid-stream
            await asyncio.to_thread(api.wait_for_watches, 4, None, 15.0)
            await asyncio.sleep(0.3)  # what a replay would publish, published by now
            watch = [r for r in api.requests if r.resource == "services" and r.is_watch]
            assert watch and watch[0].query["resourceVersion"] == last
            answers = {
                str(rr.rdata)
                for snapshot in run.published[seen:]
                for rr in resolve(tuple(svc0.split(".")), A, snapshot, CONFIG).answer
            }
            assert answers <= {"10.96.5.5"}, "an older state was published again"

    svc0 = "svc0.shop.svc.cluster.local"
    asyncio.run(scenario())


def test_each_dropped_watch_is_resumed_without_a_growing_backoff(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """Watches the API server accepted and then dropped (it restarts again and again) are
    started again after the first backoff step each time, not after one that doubled with
    every drop."""
    settings = WatchSettings(inactivity=5.0, watch_seconds=30, backoff_initial=0.2,
                             backoff_max=30.0, page_size=50)  # fmt: skip

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig"), settings) as run:
            await run.until(lambda: run.snapshot.synced)
            for i in range(1, 7):  # doubling from 0.2 s, the sixth would wait 6.4-9.6 s
                await asyncio.to_thread(api.wait_for_watches, 4, None, 15.0)
                await asyncio.to_thread(api.restart)
                api.modify(service("svc0", cluster_ip=f"10.96.6.{i}"))
                await run.until(lambda: run.answer(svc0) == [f"10.96.6.{i}"], 5.0)  # noqa: B023

    svc0 = "svc0.shop.svc.cluster.local"
    asyncio.run(scenario())


def test_a_stalled_watch_is_noticed(api: FakeApiServer, tmp_path: Path) -> None:
    settings = WatchSettings(
        inactivity=0.3, watch_seconds=30, backoff_initial=0.05, backoff_max=0.1, page_size=50
    )
    before = WATCH_RESTARTS.labels("services", "timeout")._value.get()

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig"), settings) as run:
            # With no bookmarks from this server, idle watches restart every 0.3 s anyway.
            await run.until(lambda: run.snapshot.synced)
            api.stall(1.0)
            api.modify(service("svc0", cluster_ip="10.96.5.5"))
            await asyncio.sleep(0.6)
            assert WATCH_RESTARTS.labels("services", "timeout")._value.get() > before
            await run.until(lambda: run.answer("svc0.shop.svc.cluster.local") == ["10.96.5.5"])

    asyncio.run(scenario())


def test_malformed_objects_are_skipped_and_the_rest_served(
    api: FakeApiServer, tmp_path: Path
) -> None:
    bad = endpoint_slice("db", endpoints=[endpoint("not-an-ip")], name="bad")
    api.add_raw("endpointslices", bad)
    # Misshapen: its page is decoded whole rather than to the fields DNS reads.
    odd = {**endpoint_slice("db", name="odd"), "endpoints": {"addresses": ["10.1.0.9"]}}
    api.add_raw("endpointslices", odd)
    before = MALFORMED_OBJECTS.labels("EndpointSlice")._value.get()

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: run.snapshot.synced)
            assert run.answer("db.shop.svc.cluster.local") == ["10.1.0.1", "10.1.0.2"]
            await asyncio.to_thread(api.wait_for_watches, 4)  # not blocking the reflectors
            api.modify(
                endpoint_slice("db", endpoints=[endpoint("10.1.0.7")], name="bad")
            )  # fixed: now served
            await run.until(lambda: "10.1.0.7" in run.answer("db.shop.svc.cluster.local"), 1)
            broken = service("svc3", cluster_ip="10.96.0.4")
            broken["spec"]["clusterIPs"] = ["10.96.0.999"]
            api.add_raw("services", {**broken, "metadata": {"name": "svc9", "namespace": "shop"}})
            api.modify(service("svc4", cluster_ip="10.96.4.4"))
            await run.until(lambda: run.answer("svc4.shop.svc.cluster.local") == ["10.96.4.4"])
            assert run.answer("svc9.shop.svc.cluster.local") == []

    asyncio.run(scenario())
    assert MALFORMED_OBJECTS.labels("EndpointSlice")._value.get() == before + 2
    assert MALFORMED_OBJECTS.labels("Service")._value.get() >= 1


def test_server_errors_are_retried_until_synced(api: FakeApiServer, tmp_path: Path) -> None:
    api.fail_next("services", 500, count=3)

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: bool(run.published))
            await run.until(lambda: run.snapshot.synced)
            assert run.answer("svc0.shop.svc.cluster.local") == ["10.96.0.1"]

    asyncio.run(scenario())


def test_a_wrong_token_never_syncs(api: FakeApiServer, tmp_path: Path) -> None:
    api_wrong = FakeApiServer(token="other")
    api_wrong.start()
    try:
        kubeconfig = api_wrong.write_kubeconfig(tmp_path / "kubeconfig")
        api_wrong.stop()
        text = kubeconfig.read_text().replace(api_wrong.url, api.url)
        kubeconfig.write_text(text)

        async def scenario() -> None:
            async with running(kubeconfig) as run:
                await asyncio.sleep(0.5)
                assert not run.source.is_synced
                assert all(not snap.synced for snap in run.published)

        asyncio.run(scenario())
    finally:
        api_wrong.stop()
    refused = [r for r in api.requests if r.headers.get("authorization") == "Bearer other"]
    assert len(refused) > 4  # every resource asked, and asked again after backing off


TRIGGERED = "2024-05-01T10:00:00.250000000Z"  # RFC 3339 with nanoseconds, as client-go writes


@pytest.mark.parametrize(
    ("slice_service", "annotation", "kind"),
    [
        ("svc0", TRIGGERED, "cluster_ip"),
        ("db", TRIGGERED, "headless_with_selector"),
        ("ghost", TRIGGERED, None),  # the Service is not known (yet): not measured
        ("db", None, None),  # no annotation: not made by the endpoint controllers
        ("db", "yesterday", None),  # unreadable: logged once, not measured
    ],
)
def test_dns_programming_latency_as_coredns_measures_it(
    slice_service: str, annotation: str | None, kind: str | None
) -> None:
    # CoreDNS's EndpointLatencyRecorder: now minus the slice's last-change-trigger-time, for a
    # slice whose one Service is known, by that Service's kind.
    triggered = datetime.fromisoformat(TRIGGERED).timestamp()
    source = KubeSource(None, lambda _: None, clock=lambda: triggered + 1.5)  # type: ignore[arg-type]
    source.builder.put(convert_object(service("svc0", cluster_ip="10.96.0.1")))
    source.builder.put(convert_object(service("db", cluster_ip="None")))
    obj = endpoint_slice(
        slice_service,
        endpoints=[endpoint("10.1.0.1")],
        name="db-1",
        annotations=None
        if annotation is None
        else {"endpoints.kubernetes.io/last-change-trigger-time": annotation},
    )
    name = "coredns_kubernetes_dns_programming_duration_seconds"

    def observed() -> dict[str, tuple[float, float]]:
        return {
            k: (
                REGISTRY.get_sample_value(f"{name}_count", {"service_kind": k}) or 0.0,
                REGISTRY.get_sample_value(f"{name}_sum", {"service_kind": k}) or 0.0,
            )
            for k in ("cluster_ip", "headless_with_selector")
        }

    before = observed()
    source.prepare(ENDPOINT_SLICES, obj)  # listed
    after = observed()
    for k in before:
        count, total = (a - b for a, b in zip(after[k], before[k], strict=True))
        assert (count, round(total, 6)) == ((1.0, 1.5) if k == kind else (0.0, 0.0))


def test_a_malformed_cidr_keeps_the_locator_it_replaces(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = pod_locator(
        "node-a",
        "toposdns",
        addresses=["192.168.0.1"],
        node_name="n1",
        node_labels={ZONE: "z1"},
        cidrs=["10.244.3.0/24"],
    )
    api.add(namespace("toposdns"))
    api.add(good)
    before = MALFORMED_OBJECTS.labels("PodLocator")._value.get()

    def zone_of(snapshot: Snapshot, address: str) -> str | None:
        placed = snapshot.place(address).locator
        return None if placed is None else placed.node_labels["topology.kubernetes.io/zone"]

    async def scenario() -> None:
        async with running(api.write_kubeconfig(tmp_path / "kubeconfig")) as run:
            await run.until(lambda: run.snapshot.synced)
            await asyncio.to_thread(api.wait_for_watches, 4)  # not blocking the reflectors
            assert zone_of(run.snapshot, "10.244.3.7") == "z1"
            api.modify({**good, "cidrs": ["10.244.3.0/24", "10.244.4.7/24"]})  # host bits set
            api.modify(
                pod_locator(
                    "client", addresses=["10.1.9.9"], node_name="n1", node_labels={ZONE: "z2"}
                )
            )  # the rest goes on
            await run.until(lambda: zone_of(run.snapshot, "10.1.9.9") == "z2", 1)
            assert zone_of(run.snapshot, "10.244.3.7") == "z1"  # the last good version
            assert zone_of(run.snapshot, "10.244.4.7") is None

    with caplog.at_level(logging.WARNING, logger="toposdns"):
        asyncio.run(scenario())
    assert MALFORMED_OBJECTS.labels("PodLocator")._value.get() == before + 1
    messages = [record.getMessage() for record in caplog.records]
    bad = "PodLocator toposdns/node-a: cidrs[1]: '10.244.4.7/24' has host bits set"
    assert any(bad in message for message in messages), messages


def test_the_dns_source_does_without_the_generated_apis_and_the_sync_client() -> None:
    """Its list and watch calls go through the ApiClient, and the client is imported without
    the `kubernetes` package around it: the generated API classes, the synchronous client and
    its dependencies would cost more CPU at startup than decoding a large cluster's lists."""
    script = (
        "import sys\n"
        "from toposdns.kube.client import aio_client, apis_of, list_all\n"
        "from toposdns.source.kube import RESOURCES\n"
        "client, config = aio_client()\n"
        "apis = apis_of(client.ApiClient())\n"
        "calls = [list_all(apis, r.api_version, r.name) for r in RESOURCES]\n"
        "print(sorted(m for m in sys.modules if m.startswith(('kubernetes.client', "
        "'kubernetes.aio.client.api.', 'requests'))))\n"
        "import kubernetes, kubernetes.aio\n"  # in full, when someone else wants them
        "print(kubernetes.client.CoreV1Api.__name__, kubernetes.aio.client is client)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == ["[]", "CoreV1Api True"]


@pytest.mark.parametrize(("pod_names", "kept"), [(True, "db-0"), (False, "")])
def test_the_source_keeps_pod_names_only_when_asked(pod_names: bool, kept: str) -> None:
    source = KubeSource(None, lambda _: None, pod_names=pod_names)  # type: ignore[arg-type]
    target = {"kind": "Pod", "name": "db-0"}
    record = source.prepare(
        ENDPOINT_SLICES, endpoint_slice("db", endpoints=[endpoint("10.1.0.1", targetRef=target)])
    )
    assert not isinstance(record, tuple)
    assert [ep.pod_name for ep in record.endpoints] == [kept]  # type: ignore[union-attr]
