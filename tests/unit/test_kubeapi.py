"""The fake API server (tests/kubeapi.py) driven by the real `kubernetes` client, sync and aio.

These pin the stand-in to the API conventions the product relies on, as the real client sees
them: typed and custom lists, consistent pagination, watch replay/live/bookmark/410/timeout,
auth, injected failures, stalls and restarts.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, config, watch
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

from tests import objects
from tests.kubeapi import FakeApiServer
from tests.objects import namespace

pytestmark = pytest.mark.timeout(10)

Event = dict[str, Any]
GROUP, VERSION, PLURAL = "toposdns.io", "v1alpha1", "podlocators"


# ----- objects -----


#: The port of the DNS Services and EndpointSlices these tests store.
DNS = [{"name": "dns", "port": 53, "protocol": "UDP"}]


def service(name: str, namespace: str = "default", ip: str = "10.96.0.10") -> dict[str, Any]:
    return objects.service(name, namespace, cluster_ip=ip, ports=DNS)


def endpoint_slice(name: str, svc: str, addresses: list[str]) -> dict[str, Any]:
    endpoint = {"addresses": addresses, "conditions": {"ready": True}}
    return objects.endpoint_slice(svc, "default", [endpoint], name=name, ports=DNS)


def locator(name: str) -> dict[str, Any]:
    return objects.pod_locator(name, "default", node_name="node-a")


# ----- fixtures and helpers -----


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    srv = FakeApiServer()
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def kubeconfig(server: FakeApiServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api(kubeconfig: Path) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api_client:
        yield api_client


def take(stream: Generator[Event, None, None], count: int) -> list[Event]:
    """The first `count` events of a watch stream, then close it."""
    events: list[Event] = []
    try:
        for event in stream:
            events.append(event)
            if len(events) == count:
                break
    finally:
        stream.close()
    return events


def once_watching(server: FakeApiServer, action: Callable[[], object], count: int = 1) -> None:
    """Run `action` in the background as soon as `count` watches are open on the server."""

    def run() -> None:
        server.wait_for_watches(count, timeout=5)
        action()

    threading.Thread(target=run, daemon=True).start()


def status_of(exc: client.ApiException) -> dict[str, Any]:
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["apiVersion"] == "v1"
    assert body["status"] == "Failure" and body["code"] == exc.status
    return body  # type: ignore[no-any-return]


# ----- lists -----


def test_typed_and_custom_lists(server: FakeApiServer, api: client.ApiClient) -> None:
    server.add(namespace("default"))
    server.add(service("web", "prod", "10.96.0.20"))
    rv_dns = server.add(service("dns", "default"))
    dns_slice = endpoint_slice("dns-abc", "dns", ["10.244.1.5"])
    server.add(dns_slice)
    server.add(locator("pod-a"))
    server.add(objects.node("n1"))
    server.add(objects.pod("p", "x", node_name="n1", ips=["10.244.1.9"]))
    core = client.CoreV1Api(api)

    services = core.list_service_for_all_namespaces()
    assert services.metadata.resource_version == server.resource_version
    assert services.metadata._continue is None
    # Ordered by storage key (namespace/name), each with the RV of its last write.
    assert [(s.metadata.namespace, s.metadata.name) for s in services.items] == [
        ("default", "dns"),
        ("prod", "web"),
    ]
    assert services.items[0].metadata.resource_version == rv_dns
    assert services.items[0].metadata.uid and services.items[0].metadata.creation_timestamp
    assert services.items[1].spec.cluster_ip == "10.96.0.20"
    prod = core.list_namespaced_service("prod")
    assert [s.metadata.name for s in prod.items] == ["web"]

    slices = client.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces()
    assert slices.items[0].endpoints[0].addresses == ["10.244.1.5"]
    assert slices.items[0].metadata.labels == dns_slice["metadata"]["labels"]
    assert [n.metadata.name for n in core.list_namespace().items] == ["default"]
    assert [n.metadata.name for n in core.list_node().items] == ["n1"]
    assert [p.metadata.name for p in core.list_pod_for_all_namespaces().items] == ["p"]

    locators = client.CustomObjectsApi(api).list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert locators["kind"] == "PodLocatorList" and locators["apiVersion"] == f"{GROUP}/{VERSION}"
    # Custom resources are unstructured on the server: their items keep apiVersion and kind.
    assert locators["items"][0]["apiVersion"] == f"{GROUP}/{VERSION}"
    assert locators["items"][0]["kind"] == "PodLocator"
    assert locators["items"][0]["metadata"]["generation"] == 1

    paths = [r.path for r in server.requests]
    assert "/api/v1/services" in paths and "/apis/discovery.k8s.io/v1/endpointslices" in paths
    assert "/apis/toposdns.io/v1alpha1/podlocators" in paths
    assert all(r.headers["authorization"] == "Bearer test-token" for r in server.requests)


def test_raw_list_is_the_api_servers_json(server: FakeApiServer, api: client.ApiClient) -> None:
    server.add(service("dns"))
    resp = client.CoreV1Api(api).list_service_for_all_namespaces(_preload_content=False)
    assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
    body = json.loads(resp.data)
    assert body["kind"] == "ServiceList" and body["apiVersion"] == "v1"
    assert body["metadata"] == {"resourceVersion": server.resource_version}
    (item,) = body["items"]
    # Typed lists leave kind/apiVersion off their items, as the real server does.
    assert "kind" not in item and "apiVersion" not in item
    assert item["metadata"]["name"] == "dns" and item["spec"]["clusterIP"] == "10.96.0.10"

    single = client.CoreV1Api(api).read_namespaced_service("dns", "default", _preload_content=False)
    assert json.loads(single.data)["kind"] == "Service"  # a single GET does carry them


def test_items_encoded_ahead_are_served_as_they_would_be(
    server: FakeApiServer, api: client.ApiClient
) -> None:
    def listed() -> bytes:
        return bytes(
            client.CustomObjectsApi(api)
            .list_cluster_custom_object(
                "toposdns.io", "v1alpha1", "podlocators", _preload_content=False
            )
            .data
        )

    server.add(locator("web-0"))
    plain = listed()
    server.add(locator("web-1"))
    server.encode_items()
    ahead = json.loads(listed())
    assert [item["metadata"]["name"] for item in ahead["items"]] == ["web-0", "web-1"]
    assert ahead["items"][0] == json.loads(plain)["items"][0]
    changed = {**locator("web-1"), "nodeName": "node-b"}
    server.modify(changed)
    server.encode_items()
    assert json.loads(listed())["items"][1]["nodeName"] == "node-b"  # a new version, encoded anew


def test_pagination_is_a_consistent_snapshot(server: FakeApiServer, api: client.ApiClient) -> None:
    for i in range(5):
        server.add(service(f"s{i}", ip=f"10.96.0.{i + 1}"))
    core = client.CoreV1Api(api)

    first = core.list_service_for_all_namespaces(limit=2)
    snapshot_rv = first.metadata.resource_version
    assert [s.metadata.name for s in first.items] == ["s0", "s1"]
    assert first.metadata.remaining_item_count == 3 and first.metadata._continue

    # Change the world between pages: none of it may show up in the continued list.
    server.modify(service("s2", ip="10.96.9.9"))
    server.delete("Service", "default", "s3")
    server.add(service("s9"))

    names, ips, token = [], [], first.metadata._continue
    while token:
        page = core.list_service_for_all_namespaces(limit=2, _continue=token)
        assert page.metadata.resource_version == snapshot_rv
        names += [s.metadata.name for s in page.items]
        ips += [s.spec.cluster_ip for s in page.items]
        token = page.metadata._continue
    assert names == ["s2", "s3", "s4"]
    assert ips == ["10.96.0.3", "10.96.0.4", "10.96.0.5"]

    fresh = core.list_service_for_all_namespaces()
    assert [s.metadata.name for s in fresh.items] == ["s0", "s1", "s2", "s4", "s9"]
    assert int(fresh.metadata.resource_version) > int(snapshot_rv)
    continued = [r for r in server.requests if "continue" in r.query]
    assert len(continued) == 2 and all(r.query["limit"] == "2" for r in continued)


def test_page_size_caps_the_limit(server: FakeApiServer, api: client.ApiClient) -> None:
    for name in ("a", "b", "c"):
        server.add(namespace(name))
    server.page_size = 1
    core = client.CoreV1Api(api)
    page = core.list_namespace(limit=100)
    assert [n.metadata.name for n in page.items] == ["a"]
    assert page.metadata.remaining_item_count == 2
    assert [n.metadata.name for n in core.list_namespace().items] == ["a", "b", "c"]


def test_expired_continue_token_is_410(server: FakeApiServer, api: client.ApiClient) -> None:
    for i in range(3):
        server.add(service(f"s{i}"))
    core = client.CoreV1Api(api)
    first = core.list_service_for_all_namespaces(limit=1)
    server.compact()
    server.add(service("s5"))

    with pytest.raises(client.ApiException) as info:
        core.list_service_for_all_namespaces(limit=1, _continue=first.metadata._continue)
    status = status_of(info.value)
    assert info.value.status == 410 and status["reason"] == "Expired"
    assert "continue parameter is too old" in status["message"]
    # The Status offers an "inconsistent" token that continues from the latest state.
    rest = core.list_service_for_all_namespaces(_continue=status["metadata"]["continue"])
    assert [s.metadata.name for s in rest.items] == ["s1", "s2", "s5"]
    assert rest.metadata.resource_version == server.resource_version

    with pytest.raises(client.ApiException) as info:  # a malformed token
        core.list_service_for_all_namespaces(limit=1, _continue="bm90LWEtdG9rZW4")
    assert info.value.status == 400 and status_of(info.value)["reason"] == "BadRequest"


def test_list_resource_version_semantics(server: FakeApiServer, api: client.ApiClient) -> None:
    old_rv = server.add(service("a"))
    server.modify(service("a", ip="10.96.1.1"))
    core = client.CoreV1Api(api)
    # limit + resourceVersion means "Exact": the state as of that RV.
    exact = core.list_service_for_all_namespaces(resource_version=old_rv, limit=10)
    assert exact.metadata.resource_version == old_rv
    assert exact.items[0].spec.cluster_ip == "10.96.0.10"
    # Without limit it means "Not older than": the server answers with the latest.
    latest = core.list_service_for_all_namespaces(resource_version=old_rv)
    assert latest.items[0].spec.cluster_ip == "10.96.1.1"

    future = str(int(server.resource_version) + 10)
    with pytest.raises(client.ApiException) as info:
        core.list_service_for_all_namespaces(resource_version=future)
    assert info.value.status == 504 and "Too large resource version" in info.value.body

    server.compact()
    with pytest.raises(client.ApiException) as info:
        core.list_service_for_all_namespaces(resource_version=old_rv, limit=10)
    assert info.value.status == 410 and status_of(info.value)["reason"] == "Expired"


# ----- watches -----


def test_watch_replays_then_streams_in_order(server: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version
    added = server.add(service("dns"))  # before the watch: replayed from history
    server.add(namespace("other"))  # another kind: not on this stream, but it takes an RV

    w = watch.Watch()
    stream = w.stream(
        core.list_service_for_all_namespaces,
        resource_version=rv,
        timeout_seconds=5,
        _request_timeout=5,
    )
    events: list[Event] = []
    expected_rvs = [added]
    for event in stream:
        events.append(event)
        if len(events) == 1:  # live from here on
            expected_rvs.append(server.modify(service("dns", ip="10.96.0.53")))
            expected_rvs.append(server.delete("Service", "default", "dns"))
        if len(events) == 3:
            break
    stream.close()

    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert [e["object"].metadata.resource_version for e in events] == expected_rvs
    assert [int(r) for r in expected_rvs] == sorted({int(r) for r in expected_rvs})
    assert events[1]["object"].spec.cluster_ip == "10.96.0.53"
    assert events[2]["object"].spec.cluster_ip == "10.96.0.53"  # the last state, new RV
    assert events[0]["raw_object"]["kind"] == "Service"  # watch objects carry kind/apiVersion
    assert w.resource_version == expected_rvs[-1]

    (req,) = [r for r in server.requests if r.is_watch]
    assert req.query["resourceVersion"] == rv and req.query["timeoutSeconds"] == "5"


def test_watch_without_rv_starts_with_current_state_and_times_out_cleanly(
    server: FakeApiServer, api: client.ApiClient
) -> None:
    server.add(service("b"))
    server.add(service("a", "kube-system"))
    start = time.monotonic()
    events = list(
        watch.Watch().stream(
            client.CoreV1Api(api).list_service_for_all_namespaces,
            timeout_seconds=1,
            _request_timeout=5,
        )
    )
    elapsed = time.monotonic() - start
    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("ADDED", "b"),
        ("ADDED", "a"),
    ]
    assert 0.9 <= elapsed < 3  # timeoutSeconds ends the stream, cleanly

    # A namespaced streaming list (sendInitialEvents) ends its initial state with a bookmark.
    resp = client.CoreV1Api(api).list_namespaced_service(
        "default",
        watch=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=1,
        _preload_content=False,
        _request_timeout=5,
    )
    added, bookmark = (json.loads(line) for line in resp.data.splitlines())
    resp.release_conn()
    assert added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "b"
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["object"]["metadata"] == {
        "resourceVersion": server.resource_version,
        "annotations": {"k8s.io/initial-events-end": "true"},
    }


def test_bookmarks_only_for_watches_that_ask(server: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version
    marks: list[str] = []

    def bookmark_then_add() -> None:
        server.add(namespace("elsewhere"))  # moves the RV on without a service event
        marks.append(server.resource_version)
        server.bookmark()
        server.add(service("dns"))

    once_watching(server, bookmark_then_add, count=2)
    plain = watch.Watch().stream(
        core.list_service_for_all_namespaces,
        resource_version=rv,
        timeout_seconds=5,
        _request_timeout=5,
    )
    w = watch.Watch()
    with_marks = w.stream(
        core.list_service_for_all_namespaces,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=5,
        _request_timeout=5,
    )
    # Both requests must be open before the bookmark: start the plain one in a thread.
    plain_events: list[Event] = []
    reader = threading.Thread(target=lambda: plain_events.extend(take(plain, 1)), daemon=True)
    reader.start()
    bookmark, added = take(with_marks, 2)
    reader.join(timeout=5)

    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["raw_object"] == {
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": marks[0]},
    }
    assert added["type"] == "ADDED" and added["object"].metadata.name == "dns"
    assert w.resource_version == added["object"].metadata.resource_version
    assert [e["type"] for e in plain_events] == ["ADDED"]


def test_compaction_sends_error_410_and_then_refuses_old_rvs(
    server: FakeApiServer, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version
    server.add(service("dns"))

    # With timeoutSeconds the client does not retry: the ERROR event becomes an ApiException.
    once_watching(server, server.compact)
    w = watch.Watch()
    stream = w.stream(
        core.list_service_for_all_namespaces,
        resource_version=rv,
        timeout_seconds=5,
        _request_timeout=5,
    )
    with pytest.raises(client.ApiException) as info:
        for _event in stream:
            pass
    assert info.value.status == 410
    assert info.value.reason.startswith("Expired: too old resource version: ")

    # A new watch from an RV before the compaction: HTTP 200, one ERROR event, end of stream.
    resp = core.list_service_for_all_namespaces(
        watch=True, resource_version=rv, _preload_content=False, _request_timeout=5
    )
    assert resp.status == 200
    lines = [json.loads(line) for line in resp.data.splitlines()]
    resp.release_conn()
    assert lines == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: {rv} ({server.resource_version})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]

    # Without timeoutSeconds the client retries once from its last RV, then gives up.
    before = len(server.requests)
    with pytest.raises(client.ApiException) as info:
        stream = watch.Watch().stream(
            core.list_service_for_all_namespaces, resource_version=rv, _request_timeout=5
        )
        take(stream, 1)
    assert info.value.status == 410
    retried = [r.query["resourceVersion"] for r in server.requests[before:] if r.is_watch]
    assert retried == [rv, rv]

    # Relist and watch from the new RV: works again.
    relisted = core.list_service_for_all_namespaces()
    assert [s.metadata.name for s in relisted.items] == ["dns"]
    once_watching(server, lambda: server.add(service("new")))
    (event,) = take(
        watch.Watch().stream(
            core.list_service_for_all_namespaces,
            resource_version=relisted.metadata.resource_version,
            timeout_seconds=5,
            _request_timeout=5,
        ),
        1,
    )
    assert event["object"].metadata.name == "new"


def test_watch_from_a_future_rv_is_504(server: FakeApiServer, api: client.ApiClient) -> None:
    future = str(int(server.resource_version) + 5)
    with pytest.raises(client.ApiException) as info:
        take(
            watch.Watch().stream(
                client.CoreV1Api(api).list_service_for_all_namespaces,
                resource_version=future,
                timeout_seconds=1,
                _request_timeout=5,
            ),
            1,
        )
    assert info.value.status == 504


# ----- auth and failures -----


def test_requests_without_the_token_get_401(server: FakeApiServer) -> None:
    for token in (None, "wrong"):
        cfg = client.Configuration(host=server.url)
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        with client.ApiClient(cfg) as anonymous:
            core = client.CoreV1Api(anonymous)
            with pytest.raises(client.ApiException) as info:
                core.list_service_for_all_namespaces()
            assert info.value.status == 401
            assert status_of(info.value) == {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Unauthorized",
                "reason": "Unauthorized",
                "code": 401,
            }
            with pytest.raises(client.ApiException) as info:
                take(watch.Watch().stream(core.list_namespace, _request_timeout=5), 1)
            assert info.value.status == 401
    assert "authorization" not in server.requests[0].headers


def test_fail_next(server: FakeApiServer, api: client.ApiClient) -> None:
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    server.fail_next("services", 500)
    with pytest.raises(client.ApiException) as info:
        core.list_service_for_all_namespaces()
    assert info.value.status == 500 and status_of(info.value)["reason"] == "InternalError"
    assert core.list_service_for_all_namespaces().items == []  # only the next one failed

    server.fail_next("services", 403)
    with pytest.raises(client.ApiException) as info:
        stream = watch.Watch().stream(
            core.list_service_for_all_namespaces, timeout_seconds=1, _request_timeout=5
        )
        take(stream, 1)
    assert info.value.status == 403
    assert 'cannot watch resource "services" in API group ""' in status_of(info.value)["message"]

    # urllib3 retries a 429 that carries Retry-After, sleeping as told: the caller never sees it.
    server.fail_next("endpointslices", 429)
    before = len(server.requests)
    assert discovery.list_endpoint_slice_for_all_namespaces().items == []
    assert len(server.requests) - before == 2
    # ... up to 3 times; the 4th 429 reaches the caller.
    server.fail_next("endpointslices", 429, count=4, retry_after=0)
    with pytest.raises(client.ApiException) as info:
        discovery.list_endpoint_slice_for_all_namespaces()
    assert info.value.status == 429 and info.value.headers["Retry-After"] == "0"
    assert status_of(info.value)["reason"] == "TooManyRequests"


def test_stall_starves_open_and_new_watches(server: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version

    def stall_then_add() -> None:
        server.stall(1.5)
        server.add(service("late"))

    once_watching(server, stall_then_add)
    start = time.monotonic()
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):  # open watch: read timeout
        take(
            watch.Watch().stream(
                core.list_service_for_all_namespaces,
                resource_version=rv,
                timeout_seconds=5,
                _request_timeout=(2, 0.5),
            ),
            1,
        )
    assert time.monotonic() - start < 1.4

    # A new watch gets its headers but no body either, until the stall ends.
    resp = core.list_service_for_all_namespaces(
        watch=True, resource_version=rv, _preload_content=False, _request_timeout=(2, 0.3)
    )
    assert resp.status == 200
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        resp.read(1)
    resp.release_conn()

    (event,) = take(
        watch.Watch().stream(
            core.list_service_for_all_namespaces,
            resource_version=rv,
            timeout_seconds=5,
            _request_timeout=(2, 3),
        ),
        1,
    )
    assert event["object"].metadata.name == "late"
    assert time.monotonic() - start >= 1.4


def test_restart_cuts_streams_and_keeps_data(server: FakeApiServer, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_service_for_all_namespaces().metadata.resource_version
    port = server.port
    server.add(service("a"))
    w = watch.Watch()
    stream = w.stream(
        core.list_service_for_all_namespaces,
        resource_version=rv,
        timeout_seconds=10,
        _request_timeout=5,
    )
    seen = []
    with pytest.raises(urllib3.exceptions.ProtocolError):  # the stream ends abruptly
        for event in stream:
            seen.append(event["object"].metadata.name)
            server.restart()
    assert seen == ["a"] and server.port == port

    server.add(service("b"))
    listed = core.list_service_for_all_namespaces()
    assert [s.metadata.name for s in listed.items] == ["a", "b"]
    assert listed.metadata.resource_version == server.resource_version
    # A new watch from the last RV seen resumes: "b" only, not "a" again.
    (event,) = take(
        watch.Watch().stream(
            core.list_service_for_all_namespaces,
            resource_version=w.resource_version,
            timeout_seconds=5,
            _request_timeout=5,
        ),
        1,
    )
    assert event["type"] == "ADDED" and event["object"].metadata.name == "b"


def test_malformed_objects_are_served_as_stored(
    server: FakeApiServer, api: client.ApiClient
) -> None:
    rv = server.add_raw(
        "endpointslices",
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "bad", "namespace": "default"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.999"]}],
        },
    )
    resp = client.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces(_preload_content=False)
    (item,) = json.loads(resp.data)["items"]
    assert item["endpoints"][0]["addresses"] == ["10.0.0.999"]
    assert item["metadata"] == {"name": "bad", "namespace": "default", "resourceVersion": rv}


# ----- writes, discovery -----


def test_podlocator_writes(server: FakeApiServer, api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    rv = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["metadata"]["resourceVersion"]

    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", PLURAL, locator("p")
    )
    meta = created["metadata"]
    assert meta["resourceVersion"] == server.resource_version and meta["uid"]
    assert meta["generation"] == 1 and meta["namespace"] == "default"
    with pytest.raises(client.ApiException) as info:
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, locator("p"))
    assert info.value.status == 409 and status_of(info.value)["reason"] == "AlreadyExists"

    stale = dict(created, nodeName="node-b")
    updated = custom.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "p", stale)
    assert updated["metadata"]["generation"] == 2 and updated["metadata"]["uid"] == meta["uid"]
    with pytest.raises(client.ApiException) as info:  # created's RV is stale now
        custom.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "p", stale)
    assert info.value.status == 409 and status_of(info.value)["reason"] == "Conflict"
    assert "the object has been modified" in status_of(info.value)["message"]

    deleted = custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "p")
    assert deleted["nodeName"] == "node-b"
    for call in (custom.get_namespaced_custom_object, custom.delete_namespaced_custom_object):
        with pytest.raises(client.ApiException) as info:
            call(GROUP, VERSION, "default", PLURAL, "p")
        assert info.value.status == 404
        assert status_of(info.value)["message"] == 'podlocators.toposdns.io "p" not found'

    events = list(
        watch.Watch().stream(
            custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
            resource_version=rv,
            timeout_seconds=1,
            _request_timeout=5,
        )
    )
    assert [(e["type"], e["object"]["nodeName"]) for e in events] == [
        ("ADDED", "node-a"),
        ("MODIFIED", "node-b"),
        ("DELETED", "node-b"),
    ]
    assert events[-1]["object"]["metadata"]["resourceVersion"] == server.resource_version


def test_version_and_discovery(server: FakeApiServer, api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().major == "1"
    assert client.CoreApi(api).get_api_versions().versions == ["v1"]
    groups = client.ApisApi(api).get_api_versions().groups
    assert {g.name for g in groups} == {"discovery.k8s.io", "toposdns.io"}
    resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION).resources
    assert [(r.name, r.kind, r.namespaced) for r in resources] == [
        ("podlocators", "PodLocator", True)
    ]
    with pytest.raises(client.ApiException) as info:
        client.CoreV1Api(api).read_namespaced_service("nope", "default")
    assert status_of(info.value)["message"] == 'services "nope" not found'


# ----- kubernetes.aio -----


def test_aio_client_lists_and_watches(server: FakeApiServer, kubeconfig: Path) -> None:
    server.add(service("dns"))

    async def main() -> tuple[str, list[Event], dict[str, str]]:
        cfg = aio_client.Configuration()
        await aio_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        async with aio_client.ApiClient(cfg) as api:
            core = aio_client.CoreV1Api(api)
            listed = await core.list_service_for_all_namespaces()
            rv = listed.metadata.resource_version
            raw = await core.list_namespace_without_preload_content()
            assert json.loads(await raw.read())["kind"] == "NamespaceList"
            raw.release()

            resp = await core.list_service_for_all_namespaces_without_preload_content(
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=5,
                _request_timeout=5,
            )
            headers = {k: resp.headers[k] for k in ("Content-Type", "Transfer-Encoding")}
            server.modify(service("dns", ip="10.96.0.11"))
            server.delete("Service", "default", "dns")
            server.bookmark()
            events = []
            for _ in range(3):
                line = await asyncio.wait_for(resp.content.readline(), timeout=5)
                events.append(json.loads(line))
            resp.release()
            return rv, events, headers

    rv, events, headers = asyncio.run(main())
    assert headers == {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED", "BOOKMARK"]
    assert events[0]["object"]["spec"]["clusterIP"] == "10.96.0.11"
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > int(rv)
    assert events[2]["object"]["metadata"] == {"resourceVersion": server.resource_version}
