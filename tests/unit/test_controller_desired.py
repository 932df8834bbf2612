"""The controller's pure layers: desired locators, plans, settings, the queue and the bucket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests import objects
from tests.objects import JSON
from toposdns.cli import main
from toposdns.config import ConfigError
from toposdns.controller.config import (
    ControllerConfig,
    LabelFilter,
    LeaseSettings,
    check_lease,
    parse_label_keys,
    parse_label_prefixes,
)
from toposdns.controller.desired import (
    content_of,
    desired,
    node_locator,
    pod_locator_name,
    usable_address,
)
from toposdns.controller.queue import TokenBucket, WorkQueue
from toposdns.controller.reconcile import Create, Delete, Foreign, Update, plan
from toposdns.controller.state import locator_state

CONFIG = ControllerConfig(namespace="toposdns")
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
HOST = "kubernetes.io/hostname"


def node(name: str = "n1", **fields: Any) -> dict[str, Any]:
    """Node `name` in zone z1 of region r1, as these tests schedule pods on it."""
    labels = {HOST: name, ZONE: "z1", REGION: "r1", "node.kubernetes.io/instance-type": "m"}
    return objects.node(name, uid=f"uid-{name}", **{"labels": labels, **fields})


def pod(ips: list[str] | None = None, node_name: str | None = "n1", **fields: Any) -> JSON:
    """Pod shop/web-0 at `ips` on `node_name`."""
    return objects.pod(ips=ips, node_name=node_name, uid="pod-uid", **fields)


NODE_OWNER = {
    "apiVersion": "v1",
    "kind": "Node",
    "name": "n1",
    "uid": "uid-n1",
    "controller": True,
    "blockOwnerDeletion": False,
}


def test_a_running_pod_gets_a_locator_in_the_controllers_namespace() -> None:
    # There only, DNS believes it; its name and a label say whose it is; its node owns it (an
    # owner in another namespace would have it collected at once).
    assert desired(pod(["10.1.0.7"]), node(), CONFIG) == {
        "apiVersion": "toposdns.io/v1alpha1",
        "kind": "PodLocator",
        "metadata": {
            "name": "shop.web-0",
            "namespace": "toposdns",
            "labels": {
                "app.kubernetes.io/managed-by": "toposdns",
                "toposdns.io/pod-namespace": "shop",
            },
            "ownerReferences": [NODE_OWNER],
        },
        "addresses": ["10.1.0.7"],
        "nodeName": "n1",
        "nodeLabels": {HOST: "n1", REGION: "r1", ZONE: "z1"},
    }


@pytest.mark.parametrize(
    ("the_pod", "addresses"),
    [
        (pod(["10.1.0.7"]), ["10.1.0.7"]),
        (pod(["fd00:10:244:1::7"]), ["fd00:10:244:1::7"]),
        (pod(["10.1.0.7", "fd00:10:244:1::7"]), ["10.1.0.7", "fd00:10:244:1::7"]),
        (pod(["fd00:10:244:1::7", "10.1.0.7"]), ["fd00:10:244:1::7", "10.1.0.7"]),
        (pod(podIP="10.1.0.8"), ["10.1.0.8"]),  # from before dual-stack: podIP only
        (pod(["FD00:10:244:1:0:0:0:7"]), ["fd00:10:244:1::7"]),  # canonical form
        (pod(["10.1.0.7", "10.1.0.7"]), ["10.1.0.7"]),
        (pod(["127.0.0.1", "10.1.0.7"]), ["10.1.0.7"]),  # the CRD refuses loopback
        (pod(["169.254.0.5", "fe80::1", "10.1.0.7"]), ["10.1.0.7"]),  # and link-local
        (pod(["not-an-ip", "10.1.0.7"]), ["10.1.0.7"]),
        (pod(["10.0.0.1"], host_network=True), ["10.0.0.1"]),  # the node's IP: kept
    ],
)
def test_pod_addresses(the_pod: dict[str, Any], addresses: list[str]) -> None:
    locator = desired(the_pod, node(), CONFIG)
    assert locator is not None and locator["addresses"] == addresses


@pytest.mark.parametrize(
    ("the_pod", "the_node"),
    [
        (pod([]), node()),  # no IP yet
        (pod(None), node()),
        (pod(["127.0.0.1"]), node()),  # nothing the CRD would take
        (pod(["10.1.0.7"], node_name=None), node()),  # not scheduled
        (pod(["10.1.0.7"]), None),  # its node is not known (or gone)
        (pod(["10.1.0.7"], node_name="n2"), node("n1")),  # not that node
        (pod(["10.1.0.7"], phase="Succeeded"), node()),
        (pod(["10.1.0.7"], phase="Failed"), node()),
    ],
)
def test_pods_that_need_no_locator(
    the_pod: dict[str, Any], the_node: dict[str, Any] | None
) -> None:
    assert desired(the_pod, the_node, CONFIG) is None


@pytest.mark.parametrize(
    ("namespace", "name", "expected"),
    [
        ("shop", "web-0", "shop.web-0"),
        ("shop", "web.0", "shop.web.0"),  # a dot in the pod's name: the namespace has none
        ("a" * 63, "b" * 189, "a" * 63 + "." + "b" * 189),  # 253: the longest name
        # Longer: a digest of the pod's name, which the namespace still begins.
        ("a" * 63, "b" * 190, "a" * 63 + ".f028e549fe40e75689a7aa42970b8ee66e235ea9"),
    ],
)
def test_pod_locator_names(namespace: str, name: str, expected: str) -> None:
    assert pod_locator_name(namespace, name) == expected


def test_pending_pods_with_an_ip_get_one() -> None:
    assert desired(pod(["10.1.0.7"], phase="Pending"), node(), CONFIG) is not None


LABELS = {
    HOST: "n1",
    ZONE: "z1",
    REGION: "r1",
    "topology.kubernetes.io/rack": "r7",
    "topology.example.com/row": "3",
    "rack": "r7",
    "node.kubernetes.io/instance-type": "m5",
}


@pytest.mark.parametrize(
    ("keys", "prefixes", "expected"),
    [
        ([], [], {HOST, ZONE, REGION}),
        (["rack"], [], {HOST, ZONE, REGION, "rack"}),
        (
            ["rack,topology.example.com/row"],
            [],
            {HOST, ZONE, REGION, "rack", "topology.example.com/row"},
        ),
        ([], ["topology.kubernetes.io/"], {HOST, ZONE, REGION, "topology.kubernetes.io/rack"}),
        (
            [],
            ["topology."],
            {HOST, ZONE, REGION, "topology.kubernetes.io/rack", "topology.example.com/row"},
        ),
        (["absent.example.com/key"], [], {HOST, ZONE, REGION}),
    ],
)
def test_node_label_filter(keys: list[str], prefixes: list[str], expected: set[str]) -> None:
    config = ControllerConfig(
        namespace="toposdns",
        labels=LabelFilter(parse_label_keys(keys), parse_label_prefixes(prefixes)),
    )
    the_node = node(labels=LABELS)
    locator = desired(pod(["10.1.0.7"]), the_node, config)
    assert locator is not None
    assert locator["nodeLabels"] == {k: LABELS[k] for k in expected}
    assert list(locator["nodeLabels"]) == sorted(expected)
    found = node_locator(the_node, config)
    assert found is not None and found["nodeLabels"] == locator["nodeLabels"]


def test_a_node_missing_topology_labels_gives_fewer() -> None:
    locator = desired(pod(["10.1.0.7"]), node(labels={HOST: "n1"}), CONFIG)
    assert locator is not None and locator["nodeLabels"] == {HOST: "n1"}


def test_node_locator() -> None:
    addresses = [
        ("Hostname", "n1"),
        ("InternalIP", "10.0.0.1"),
        ("ExternalIP", "203.0.113.9"),
        ("InternalIP", "fd00::1"),
        ("InternalIP", "10.0.0.1"),
        ("InternalDNS", "n1.internal"),
    ]
    assert node_locator(node(addresses=addresses), CONFIG) == {
        "apiVersion": "toposdns.io/v1alpha1",
        "kind": "PodLocator",
        "metadata": {
            "name": "n1",
            "namespace": "toposdns",
            "labels": {"app.kubernetes.io/managed-by": "toposdns", "toposdns.io/locator": "node"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": "n1",
                    "uid": "uid-n1",
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "addresses": ["10.0.0.1", "fd00::1"],
        "nodeName": "n1",
        "nodeLabels": {HOST: "n1", REGION: "r1", ZONE: "z1"},
    }


@pytest.mark.parametrize(
    "addresses",
    [[], [("ExternalIP", "203.0.113.9")], [("InternalIP", "127.0.0.1")], [("Hostname", "n1")]],
)
def test_a_node_without_internal_ip_gets_no_locator(addresses: list[tuple[str, str]]) -> None:
    assert node_locator(node(addresses=addresses), CONFIG) is None


def test_node_status_churn_changes_nothing_compared() -> None:
    before = node()
    after = node()
    after["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    after["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "other"
    after["metadata"]["resourceVersion"] = "99"
    assert node_locator(before, CONFIG) == node_locator(after, CONFIG)
    assert desired(pod(["10.1.0.7"]), before, CONFIG) == desired(pod(["10.1.0.7"]), after, CONFIG)


@pytest.mark.parametrize(
    ("text", "usable"),
    [
        ("10.1.2.3", "10.1.2.3"),
        ("192.168.1.1", "192.168.1.1"),
        ("2001:db8::1", "2001:db8::1"),
        ("0.0.0.0", None),
        ("::", None),
        ("::1", None),
        ("127.0.0.2", None),
        ("224.0.0.1", None),
        ("ff02::1", None),
        ("255.255.255.255", None),
        ("10.1.2", None),
        (7, None),
    ],
)
def test_usable_address(text: Any, usable: str | None) -> None:
    assert usable_address(text) == usable


# ----- plans -----


def stored(locator: dict[str, Any], version: str = "5", **meta: Any) -> dict[str, Any]:
    obj = dict(
        locator, metadata={**locator["metadata"], "uid": "loc-uid", "resourceVersion": version}
    )
    obj["metadata"].update(meta)
    return obj


def test_plans() -> None:
    want = desired(pod(["10.1.0.7"]), node(), CONFIG)
    assert want is not None
    same = locator_state(stored(want, generation=3, creationTimestamp="2026-01-01T00:00:00Z"))
    assert plan(want, None) == Create(want)
    assert plan(want, same) is None
    assert plan(None, same) == Delete("loc-uid", "5")
    assert plan(None, None) is None

    moved = desired(pod(["10.1.0.9"], node_name="n2"), node("n2"), CONFIG)
    assert moved is not None
    action = plan(moved, same)
    assert isinstance(action, Update)
    assert action.body["metadata"]["resourceVersion"] == "5"
    assert action.body["addresses"] == ["10.1.0.9"] and action.body["nodeName"] == "n2"


def test_an_update_keeps_what_others_set() -> None:
    want = desired(pod(["10.1.0.7"]), node(), CONFIG)
    assert want is not None
    theirs = stored(
        dict(want, addresses=["10.9.9.9"]),
        annotations={"note": "x"},
        finalizers=["example.com/keep"],
    )
    theirs["metadata"]["labels"] = {"team": "a", "app.kubernetes.io/managed-by": "toposdns"}
    action = plan(want, locator_state(theirs))
    assert isinstance(action, Update)
    meta = action.body["metadata"]
    assert meta["labels"] == {
        "team": "a",
        "app.kubernetes.io/managed-by": "toposdns",
        "toposdns.io/pod-namespace": "shop",
    }
    assert meta["annotations"] == {"note": "x"} and meta["finalizers"] == ["example.com/keep"]
    # Others' labels alone do not make a difference worth a write.
    assert plan(want, locator_state(stored(want, labels={"team": "a", **meta["labels"]}))) is None


@pytest.mark.parametrize(
    "change",
    [
        lambda o: o.update(addresses=["10.1.0.7", "fd00::7"]),
        lambda o: o.update(nodeName="n2"),
        lambda o: o["nodeLabels"].update({ZONE: "z2"}),
        lambda o: o["nodeLabels"].pop(ZONE),
        lambda o: o["metadata"].update(ownerReferences=[dict(NODE_OWNER, uid="old")]),
        lambda o: o["metadata"].pop("ownerReferences"),
        lambda o: o["metadata"]["labels"].update({"toposdns.io/locator": "node"}),
        lambda o: o["metadata"]["labels"].update({"toposdns.io/pod-namespace": "other"}),
        lambda o: o.update(addresses="garbage"),
    ],
)
def test_any_difference_in_what_the_controller_decides_is_written(change: Any) -> None:
    want = desired(pod(["10.1.0.7"]), node(), CONFIG)
    assert want is not None
    have = stored(want)
    have["nodeLabels"] = dict(have["nodeLabels"])
    have["metadata"]["labels"] = dict(have["metadata"]["labels"])
    change(have)
    assert content_of(have) != content_of(want)
    assert isinstance(plan(want, locator_state(have)), Update)


def test_locators_not_managed_by_toposdns_are_left_alone() -> None:
    want = desired(pod(["10.1.0.7"]), node(), CONFIG)
    assert want is not None
    theirs = stored(dict(want, addresses=["10.9.9.9"]))
    theirs["metadata"]["labels"] = {}
    assert plan(want, locator_state(theirs)) == Foreign()
    assert plan(None, locator_state(theirs)) is None


# ----- settings -----


@pytest.mark.parametrize(
    "lease",
    [
        LeaseSettings(duration=10, renew_deadline=10, retry_period=2),
        LeaseSettings(duration=15, renew_deadline=2, retry_period=2),
        LeaseSettings(duration=15, renew_deadline=10, retry_period=0),
        LeaseSettings(name="Not_A_Name"),
    ],
)
def test_lease_timings_follow_client_go_rules(lease: LeaseSettings) -> None:
    with pytest.raises(ConfigError):
        check_lease(lease)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--namespace", "Bad_NS"], "--namespace 'Bad_NS'"),
        (["--node-label-keys", "bad key"], "--node-label-keys 'bad key'"),
        (["--node-label-keys", "a/b/c"], "not a label key"),
        (["--node-label-prefixes", "a b"], "--node-label-prefixes"),
        (["--lease-duration", "5s"], "--lease-duration 5s: must be longer than --renew-deadline"),
        (["--retry-period", "9s"], "--renew-deadline 10s: must be longer than 1.2 x"),
        (["--writes-per-second", "-1"], "--writes-per-second -1"),
        (["--http", "nowhere"], "--http nowhere: expected HOST:PORT"),
        (["--lease-duration", "soon"], "--lease-duration soon: expected a duration"),
        (["--pod-locators", "some"], "--pod-locators some: expected one of auto, all, none"),
        (["--node-cidrs", "guess"], "--node-cidrs guess: expected one of spec, learned, auto"),
    ],
)
def test_bad_flags_are_refused_with_the_flag_named(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = {"--namespace": "toposdns", "--http": "127.0.0.1:0"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    argv = ["controller"] + [part for item in base.items() for part in item]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("toposdns controller: ") and message in err


@pytest.mark.parametrize(
    "command",
    [
        ["controller", "--namespace=toposdns", "--http=127.0.0.1:0"],
        ["serve", "--listen=127.0.0.1:0", "--workers=1"],
    ],
    ids=["controller", "serve"],
)
def test_a_missing_kubeconfig_is_one_line(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One line naming the file, and nothing from the client before it ("Config not found").
    missing = tmp_path / "missing"
    assert main([*command, f"--kubeconfig={missing}", "--log-format=json"]) == 1
    # Every line is the server's own (the client's stray line was plain text), and one says it.
    entries = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    problems = [entry["msg"] for entry in entries if entry["level"] != "info"]
    suffix = "; or serve from a file with --snapshot FILE" if command[0] == "serve" else ""
    assert problems == [
        f"cannot start: not in a cluster, and the kubeconfig {missing} does not exist; "
        f"pass --kubeconfig FILE{suffix}"
    ]


# ----- queue and bucket -----


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_queue_deduplicates_delays_and_never_hands_out_a_key_twice() -> None:
    async def scenario() -> None:
        clock = Clock()
        queue: WorkQueue[str] = WorkQueue(backoff_initial=1.0, backoff_max=4.0, clock=clock)
        queue.add("a", 0.5)
        queue.add("a", 0.5)
        queue.add("b", 0.2)
        queue.add("a", 0.1)  # sooner wins
        assert len(queue) == 2
        clock.now += 0.15
        assert await queue.get() == "a"
        queue.add("a")  # being processed: comes back once done, not before
        clock.now += 0.1
        assert await queue.get() == "b"
        assert len(queue) == 0
        queue.done("a")
        assert len(queue) == 1 and await queue.get() == "a"
        queue.done("a")
        queue.done("b")
        assert queue.idle
        for backoff in (1.0, 2.0, 4.0, 4.0):
            queue.retry("c")
            clock.now += backoff - 0.01
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.01):
                    await queue.get()
            clock.now += 0.01
            assert await queue.get() == "c"
            queue.done("c")
        queue.forget("c")
        queue.retry("c", after=3.0)  # Retry-After, longer than the backoff
        clock.now += 2.9
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await queue.get()
        queue.clear()
        assert queue.idle

    asyncio.run(scenario())


def test_queue_wakes_a_waiting_worker() -> None:
    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue()
        waiter = asyncio.create_task(queue.get())
        await asyncio.sleep(0.01)
        queue.add("k", 0.02)
        async with asyncio.timeout(1):
            assert await waiter == "k"

    asyncio.run(scenario())


def test_token_bucket_limits_the_rate() -> None:
    async def scenario() -> float:
        bucket = TokenBucket(rate=200.0, burst=10)
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.gather(*(bucket.take() for _ in range(50)))
        return loop.time() - start

    elapsed = asyncio.run(scenario())
    assert 0.18 <= elapsed < 0.5  # 10 at once, then 40 at 200/s


def test_token_bucket_zero_is_unlimited() -> None:
    async def scenario() -> None:
        bucket = TokenBucket(rate=0)
        async with asyncio.timeout(0.5):
            for _ in range(10_000):
                await bucket.take()

    asyncio.run(scenario())
