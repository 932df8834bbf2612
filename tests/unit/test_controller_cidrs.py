"""Node pod ranges in the controller: prefixes, placement, learning, and which pods need a locator.

The pure parts as tables: which ranges a locator may carry, longest-prefix placement as the DNS
server does it, the ranges learnt from pod addresses (and their stability under a rollout and a
restart), and `ClusterState`'s decision, per `--pod-locators` and `--node-cidrs`, of which pods
get a locator of their own and why.
"""

from __future__ import annotations

import ipaddress
import random
from typing import Any

import pytest

from tests import objects
from tests.objects import pod_cidrs
from toposdns.controller.cidrs import (
    Prefix,
    PrefixIndex,
    learn,
    point_of,
    prefix_of,
    text_of,
    usable_cidr,
)
from toposdns.controller.config import ControllerConfig
from toposdns.controller.desired import desired, node_locator, pod_locator_name
from toposdns.controller.state import LOCATORS, NODES, PODS, ClusterState

NS = "toposdns"


@pytest.mark.parametrize(
    ("text", "usable"),
    [
        ("10.244.3.0/24", "10.244.3.0/24"),
        ("10.244.3.7/24", "10.244.3.0/24"),  # host bits, as Kubernetes reads a podCIDR
        ("fd00:10:244:3::/64", "fd00:10:244:3::/64"),
        ("FD00:10:244:3:0::/64", "fd00:10:244:3::/64"),
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("10.0.0.0/7", None),  # shorter than the CRD takes
        ("fd00::/31", None),
        ("127.0.0.0/8", None),
        ("169.254.0.0/16", None),
        ("168.0.0.0/7", None),
        ("169.0.0.0/8", None),  # holds link-local
        ("fe80::/64", None),
        ("224.0.0.0/24", None),
        ("ff00::/32", None),
        ("0.0.0.0/8", None),
        ("255.255.255.255/32", None),
        ("10.244.3.0", None),  # an address, not a prefix
        ("10.244.3.0/33", None),
        ("", None),
        (None, None),
        (24, None),
    ],
)
def test_usable_cidr(text: Any, usable: str | None) -> None:
    assert usable_cidr(text) == usable


def raw_node(name: str, spec: dict[str, Any], ip: str | None = "10.0.0.1") -> dict[str, Any]:
    addresses = [("InternalIP", ip)] if ip else []
    return objects.node(name, uid=f"uid-{name}", spec=spec, addresses=addresses)


@pytest.mark.parametrize(
    ("spec", "ip", "cidrs", "addresses"),
    [
        ({"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24"]}, "10.0.0.1", ["10.1.0.0/24"], 1),
        (
            {"podCIDR": "10.1.0.0/24", "podCIDRs": ["10.1.0.0/24", "fd00:1::/64"]},
            "10.0.0.1",
            ["10.1.0.0/24", "fd00:1::/64"],
            1,
        ),
        ({"podCIDR": "10.1.0.0/24"}, "10.0.0.1", ["10.1.0.0/24"], 1),  # before dual-stack
        ({"podCIDRs": ["10.1.0.9/24", "bad", "127.0.0.0/8"]}, "10.0.0.1", ["10.1.0.0/24"], 1),
        ({}, "10.0.0.1", None, 1),
        ({"podCIDRs": ["10.1.0.0/24"]}, None, ["10.1.0.0/24"], None),  # ranges, no InternalIP
    ],
)
def test_node_locator_ranges(
    spec: dict[str, Any], ip: str | None, cidrs: list[str] | None, addresses: int | None
) -> None:
    locator = node_locator(raw_node("n1", spec, ip), ControllerConfig(namespace=NS))
    assert locator is not None
    assert locator.get("cidrs") == cidrs
    assert (len(locator["addresses"]) if "addresses" in locator else None) == addresses


def test_a_node_with_neither_addresses_nor_ranges_gets_no_locator() -> None:
    assert node_locator(raw_node("n1", {}, None), ControllerConfig(namespace=NS)) is None


def test_learned_mode_leaves_the_spec_ranges_out() -> None:
    config = ControllerConfig(namespace=NS, node_cidrs="learned")
    locator = node_locator(raw_node("n1", {"podCIDRs": ["10.1.0.0/24"]}), config)
    assert locator is not None and "cidrs" not in locator


# ----- placement: longest prefix, claimed once -----

HELD = [
    ("10.0.0.0/8", "big"),
    ("10.1.0.0/16", "mid"),
    ("10.1.2.0/24", "a"),
    ("10.1.3.0/24", "b"),
    ("10.1.3.0/24", "c"),  # the same prefix twice: places nobody
    ("fd00:1::/64", "a"),
]


@pytest.mark.parametrize(
    ("address", "owners"),
    [
        ("10.1.2.7", {"a"}),
        ("10.1.9.9", {"mid"}),
        ("10.7.0.1", {"big"}),
        ("10.1.3.1", {"b", "c"}),
        ("11.0.0.1", set()),
        ("fd00:1::7", {"a"}),
        ("fd00:2::7", set()),
    ],
)
def test_longest_prefix_placement(address: str, owners: set[str]) -> None:
    index = PrefixIndex()
    for text, owner in HELD:
        index.add(prefix_of(text), owner)
    assert index.owners(point_of(address)) == owners


def test_a_removed_prefix_places_by_the_next_longest() -> None:
    index = PrefixIndex()
    for text, owner in HELD:
        index.add(prefix_of(text), owner)
    index.remove(prefix_of("10.1.2.0/24"), "a")
    index.remove(prefix_of("10.1.0.0/16"), "nobody")  # not held: nothing happens
    assert index.owners(point_of("10.1.2.7")) == {"mid"}


# ----- learning -----


def learnt(
    group: str,
    pods: list[tuple[str, str]],
    previous: dict[str, str] | None = None,
    eligible: set[str] | None = None,
) -> dict[str, str]:
    points = sorted((int(ipaddress.ip_address(a)), n) for a, n in pods)
    before = {prefix_of(p): n for p, n in (previous or {}).items()}
    result = learn(prefix_of(group), points, lambda n: eligible is None or n in eligible, before)
    return {text_of(p): n for p, n in sorted(result.items())}


def block(first: str, count: int, node: str, step: int = 1) -> list[tuple[str, str]]:
    start = ipaddress.ip_address(first)
    return [(str(start + i * step), node) for i in range(count)]


@pytest.mark.parametrize(
    ("name", "pods", "previous", "expected"),
    [
        ("one node: the whole /24", block("10.5.1.1", 5, "a"), None, {"10.5.1.0/24": "a"}),
        (
            "two nodes in one /25: a /26 each",
            [("10.5.1.5", "a"), ("10.5.1.70", "b")],
            None,
            {"10.5.1.0/26": "a", "10.5.1.64/26": "b"},
        ),
        (
            "one in each /25",
            [("10.5.1.5", "a"), ("10.5.1.200", "b")],
            None,
            {"10.5.1.0/25": "a", "10.5.1.128/25": "b"},
        ),
        (
            "a borrowed address stays inside its block's prefix",
            block("10.5.1.1", 5, "a") + [("10.5.1.9", "b")] + block("10.5.1.65", 3, "b"),
            None,
            {"10.5.1.0/26": "a", "10.5.1.64/26": "b"},
        ),
        (
            "no longer than /26: a mixed block goes to the node with most pods",
            block("10.5.1.1", 3, "a") + block("10.5.1.4", 2, "b"),
            None,
            {"10.5.1.0/24": "a"},
        ),
        (
            "a tie goes to the name that sorts first",
            [("10.5.1.1", "b"), ("10.5.1.2", "a")],
            None,
            {"10.5.1.0/24": "a"},
        ),
        (
            "a tie keeps the previous owner",
            [("10.5.1.1", "b"), ("10.5.1.2", "a")],
            {"10.5.1.0/24": "b"},
            {"10.5.1.0/24": "b"},
        ),
        (
            "an emptied block keeps its node",
            block("10.5.1.65", 3, "b"),
            {"10.5.1.0/26": "a", "10.5.1.64/26": "b"},
            {"10.5.1.0/26": "a", "10.5.1.64/26": "b"},
        ),
        (
            "another node's pods in a kept block take it",
            block("10.5.1.65", 3, "b") + block("10.5.1.1", 2, "c"),
            {"10.5.1.0/26": "a", "10.5.1.64/26": "b"},
            {"10.5.1.0/26": "c", "10.5.1.64/26": "b"},
        ),
        (
            "IPv6: the shortest prefix holding one node's pods",
            [("fd00:10:244:3::5", "a"), ("fd00:10:244:3::1:7", "b")],
            None,
            {"fd00:10:244:3::/112": "a", "fd00:10:244:3::1:0/112": "b"},
        ),
        (
            "IPv6: no longer than /120",
            [("fd00::1", "a"), ("fd00::2", "a"), ("fd00::3", "b")],
            None,
            {"fd00::/64": "a"},
        ),
        (
            "AWS VPC CNI: a /80 per node",
            block("fd00::1:0:0:1", 3, "a") + block("fd00::2:0:0:1", 3, "b"),
            None,
            {"fd00::/79": "a", "fd00::2:0:0:0/79": "b"},
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_learn(
    name: str,
    pods: list[tuple[str, str]],
    previous: dict[str, str] | None,
    expected: dict[str, str],
) -> None:
    group = "fd00::/64" if ":" in pods[0][0] else "10.5.1.0/24"
    assert learnt(group, pods, previous) == expected


def test_learn_gives_nothing_to_a_node_whose_ranges_are_not_learnt() -> None:
    pods = block("10.5.1.1", 3, "spec-node") + block("10.5.1.70", 2, "calico")
    assert learnt("10.5.1.0/24", pods, eligible={"calico"}) == {"10.5.1.64/26": "calico"}


def calico_layout(
    rng: random.Random, nodes: int
) -> tuple[dict[Prefix, str], list[tuple[int, str]]]:
    """Two /26 blocks per node, shuffled over a /16, a dozen pods per block, 5% borrowed."""
    blocks = rng.sample(range(1024), 2 * nodes)
    owner = {(4, 26, int(ipaddress.ip_address("10.64.0.0")) + b * 64): f"n{i // 2}" for i, b in
             enumerate(blocks)}  # fmt: skip
    points: dict[int, str] = {}
    for (_, _, net), node in owner.items():
        for offset in rng.sample(range(64), 12):
            lender = rng.random() < 0.05
            points[net + offset] = f"n{rng.randrange(nodes)}" if lender else node
    return owner, sorted(points.items())


def learn_all(points: list[tuple[int, str]], previous: dict[Prefix, str]) -> dict[Prefix, str]:
    groups: dict[int, list[tuple[int, str]]] = {}
    for value, node in points:
        groups.setdefault(value >> 8 << 8, []).append((value, node))
    result: dict[Prefix, str] = {}
    for net in sorted(groups | {p[2] >> 8 << 8: [] for p in previous}):
        result |= learn((4, 24, net), groups.get(net, []), lambda n: True, previous)
    return result


def test_learning_is_stable_under_a_rollout_and_a_restart() -> None:
    rng = random.Random(7)
    blocks, points = calico_layout(rng, 60)
    first = learn_all(points, {})
    # Every block's node holds it (ranges shorter than a block where its neighbours are free).
    for (_, _, net), node in blocks.items():
        holders = [
            n for (v, length, p), n in first.items() if p >> (32 - length) == net >> (32 - length)
        ]
        assert holders == [node]
    assert learn_all(points, first) == first  # a restart, seeded with what was written
    # A rollout: a tenth of the pods replaced by pods at free addresses of their own blocks.
    rollout = dict(points)
    for value, node in rng.sample(points, len(points) // 10):
        del rollout[value]
        net = value >> 6 << 6  # same block, same node (a borrowed address stays borrowed)
        free = [net + o for o in range(64) if net + o not in rollout]
        rollout[rng.choice(free)] = node
    assert learn_all(sorted(rollout.items()), first) == first


# ----- which pods need a locator of their own, and why -----


def spec_node(name: str, *cidrs: str, ip: str = "") -> dict[str, Any]:
    return raw_node(name, pod_cidrs(*cidrs), ip or f"192.168.0.{name[1:]}")


def raw_pod(name: str, node: str, *ips: str, host: bool = False) -> dict[str, Any]:
    return objects.pod(name, node_name=node, ips=ips, host_network=host, uid=f"uid-{name}")


SPEC_NODES = [spec_node("n1", "10.1.0.0/24", "fd00:1::/64"), spec_node("n2", "10.2.0.0/24")]
SPEC_PODS = [
    raw_pod("inside", "n1", "10.1.0.5"),
    raw_pod("dual", "n1", "10.1.0.6", "fd00:1::6"),
    raw_pod("half-outside", "n1", "10.1.0.7", "fd00:9::7"),
    raw_pod("borrowed", "n1", "10.2.0.9"),
    raw_pod("outside", "n2", "10.9.0.1"),
    raw_pod("host", "n1", "192.168.0.1", host=True),
]
CALICO_NODES = [spec_node("n1"), spec_node("n2"), spec_node("n3", "10.3.0.0/24")]
CALICO_PODS = [
    raw_pod("a0", "n1", "10.5.1.1"),
    raw_pod("a1", "n1", "10.5.1.2"),
    raw_pod("lent", "n2", "10.5.1.3"),
    raw_pod("b0", "n2", "10.5.1.65"),
    raw_pod("c0", "n3", "10.3.0.9"),
    raw_pod("c1", "n3", "10.5.1.200"),  # a spec node's pod outside its range
]


@pytest.mark.parametrize(
    ("name", "nodes", "pods", "settings", "reasons", "cidrs"),
    [
        (
            "spec ranges: only the pods they do not place",
            SPEC_NODES,
            SPEC_PODS,
            {},
            {
                "half-outside": "outside-node-cidrs",
                "borrowed": "borrowed",
                "outside": "outside-node-cidrs",
            },
            {"n1": ["10.1.0.0/24", "fd00:1::/64"], "n2": ["10.2.0.0/24"]},
        ),
        (
            "all: every pod, the hostNetwork one too",
            SPEC_NODES,
            SPEC_PODS,
            {"pod_locators": "all"},
            dict.fromkeys(
                ("inside", "dual", "half-outside", "borrowed", "outside", "host"), "all-mode"
            ),
            {"n1": ["10.1.0.0/24", "fd00:1::/64"], "n2": ["10.2.0.0/24"]},
        ),
        (
            "none",
            SPEC_NODES,
            SPEC_PODS,
            {"pod_locators": "none"},
            {},
            {"n1": ["10.1.0.0/24", "fd00:1::/64"], "n2": ["10.2.0.0/24"]},
        ),
        (
            "a node without podCIDRs",
            [spec_node("n1")],
            [raw_pod("p", "n1", "10.1.0.5")],
            {},
            {"p": "no-node-cidrs"},
            {},
        ),
        (
            "the same range on two nodes places nobody in it",
            [spec_node("n1", "10.1.0.0/24"), spec_node("n2", "10.1.0.0/24")],
            [raw_pod("p", "n1", "10.1.0.5")],
            {},
            {"p": "borrowed"},
            {"n1": ["10.1.0.0/24"], "n2": ["10.1.0.0/24"]},
        ),
        (
            "learned: IPAM blocks, and a borrowed address",
            CALICO_NODES,
            CALICO_PODS,
            {"node_cidrs": "learned"},
            {"lent": "borrowed"},
            {"n1": ["10.5.1.0/26"], "n2": ["10.5.1.64/26"], "n3": ["10.3.0.0/24", "10.5.1.128/25"]},
        ),
        (
            "auto: spec where set, learned where not",
            CALICO_NODES,
            CALICO_PODS,
            {"node_cidrs": "auto"},
            {"lent": "borrowed", "c1": "outside-node-cidrs"},
            {"n1": ["10.5.1.0/26"], "n2": ["10.5.1.64/26"], "n3": ["10.3.0.0/24"]},
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_which_pods_need_a_locator(
    name: str,
    nodes: list[dict[str, Any]],
    pods: list[dict[str, Any]],
    settings: dict[str, Any],
    reasons: dict[str, str],
    cidrs: dict[str, list[str]],
) -> None:
    state = ClusterState(ControllerConfig(namespace=NS, **settings))
    for resource, items in ((NODES, nodes), (PODS, pods), (LOCATORS, [])):
        state.replace(resource, items)
    wanted = {
        p["metadata"]["name"]: state.want((NS, f"shop.{p['metadata']['name']}")) for p in pods
    }
    assert {n: state.reasons[(NS, f"shop.{n}")] for n, w in wanted.items() if w} == reasons
    assert {n: state.reasons.get((NS, f"shop.{n}")) for n in wanted} == {
        n: reasons.get(n) for n in wanted
    }
    node_cidrs = {}
    for n in nodes:
        locator = state.want((NS, n["metadata"]["name"]))
        if locator and "cidrs" in locator:
            node_cidrs[n["metadata"]["name"]] = locator["cidrs"]
    assert node_cidrs == cidrs


def written(locator: dict[str, Any], version: str = "1") -> dict[str, Any]:
    return {**locator, "metadata": {**locator["metadata"], "resourceVersion": version}}


#: The key of pod shop/p's locator.
KEY = (NS, "shop.p")


def test_a_pod_keeps_its_locator_until_the_node_locator_that_places_it_is_written() -> None:
    config = ControllerConfig(namespace=NS)
    moved: list[set[Any]] = []
    state = ClusterState(config, changed=lambda keys: moved.append(set(keys)))
    node = spec_node("n1", "10.1.0.0/24")
    pod = raw_pod("p", "n1", "10.1.0.5")
    state.replace(NODES, [node])
    state.replace(PODS, [pod])
    # What an earlier version wrote: a pod locator, and a node locator without ranges.
    old_node_locator = node_locator(node, config)
    assert old_node_locator is not None
    del old_node_locator["cidrs"]
    pod_locator = desired(pod, node, config)
    assert pod_locator is not None
    state.replace(LOCATORS, [written(old_node_locator), written(pod_locator)])
    state_locator = state.want(KEY)
    assert state_locator is not None and state.reasons[KEY] == "node-locator-pending"
    moved.clear()
    new_node_locator = state.want((NS, "n1"))
    assert new_node_locator is not None
    state.observe((NS, "n1"), written(new_node_locator, "2"))
    assert KEY in set().union(*moved)  # the pod is looked at again
    assert state.want(KEY) is None and KEY not in state.reasons


def test_every_locator_is_keyed_in_the_controllers_namespace() -> None:
    moved: list[set[Any]] = []
    state = ClusterState(
        ControllerConfig(namespace=NS, pod_locators="all"),
        changed=lambda keys: moved.append(set(keys)),
    )
    long_name = "p" * 240  # too long after its namespace for an object name: a digest
    digest = pod_locator_name("shop", long_name)
    node = spec_node("n1", "10.1.0.0/24")
    state.replace(NODES, [node])
    state.replace(PODS, [raw_pod("web.0", "n1", "10.1.0.5"), raw_pod(long_name, "n1", "10.1.0.6")])
    # Where an older controller wrote them: no more.
    older = desired(raw_pod("web.0", "n1", "10.1.0.5"), node, state.config)
    assert older is not None
    older["metadata"].update(namespace="shop", name="web.0")
    state.replace(LOCATORS, [written(older)])
    assert (NS, "shop.web.0") in state.keys() and (NS, digest) in state.keys()
    assert ("shop", "web.0") in state.keys() and state.want(("shop", "web.0")) is None
    for key, name in (((NS, "shop.web.0"), "web.0"), ((NS, digest), long_name)):
        locator = state.want(key)
        assert locator is not None and locator["metadata"]["name"] == key[1]
        assert locator["metadata"]["labels"]["toposdns.io/pod-namespace"] == "shop"
        assert state.reasons[key] == "all-mode"
        moved.clear()
        state.delete(PODS, raw_pod(name, "n1"))
        assert moved == [{key}] and state.want(key) is None and key not in state.reasons
    assert not state.digested
