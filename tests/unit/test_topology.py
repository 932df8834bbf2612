"""The topology module: kube-proxy's FilterTopologyEndpoint, the API server's topologyKeys
validation, policy precedence, zone hints, answer-cache signatures and endpoint topology.

Expectations are upstream's (kube-proxy, the API server, the KEPs; see docs/topology.md), not the
module's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from tests.unit.test_kube_names import NAME_64, NAME_MSG, PREFIX_254, QUALIFIED_MSG, SUBDOMAIN_MSG
from toposdns.store.model import (
    HEADLESS,
    NODE_NAME,
    Endpoint,
    EndpointSlice,
    PodLocator,
    Service,
)
from toposdns.store.topology import (
    NO_POLICY,
    Policy,
    endpoint_labels,
    policy_for,
    rotation_schedule,
    select,
    validate_keys,
)

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
SPEC_FIELD = "spec.topologyKeys"
ANNOTATION_FIELD = "metadata.annotations[toposdns.io/topology-keys]"

Candidates = list[tuple[Endpoint, Mapping[str, str]]]


def chosen_ips(policy: Policy, client: Mapping[str, str], candidates: Candidates) -> list[str]:
    """The addresses select() picks, in the order it returns them."""
    return [candidates[i][0].addresses[0] for i in select(policy, client, candidates).chosen]


def keys_policy(*keys: str) -> Policy:
    return Policy("topologyKeys", tuple(keys))


def svc(**fields: Any) -> Service:
    return Service("shop", "web", HEADLESS, (), (), **fields)


def eps(*endpoints: Endpoint, name: str = "web-abc") -> EndpointSlice:
    return EndpointSlice("shop", name, "web", (), tuple(endpoints))


# --------------------------------------------------------------------------------------------
# 1. kube-proxy TestFilterTopologyEndpoint (pkg/proxy/topology_test.go, v1.17-v1.20), as data.
# Each endpoint's topology is the labels of the node it runs on; the client is the current node.
# --------------------------------------------------------------------------------------------


def node(hostname: str, zone: str) -> dict[str, str]:
    return {HOSTNAME: hostname, ZONE: zone, REGION: "cd"}


def two_per_node(*nodes: int) -> list[tuple[str, str]]:
    """Endpoints 1.1.N.1 and 1.1.N.2 on testNodeN, for each N (upstream's layout)."""
    return [(f"1.1.{n}.{i}", f"testNode{n}") for n in nodes for i in (1, 2)]


NODES_SAME_ZONE_2 = {
    "testNode1": node("testNode1", "90001"),
    "testNode2": node("testNode2", "90001"),
}
NODES_SAME_ZONE_3 = {**NODES_SAME_ZONE_2, "testNode3": node("testNode3", "90001")}
NODES_TWO_ZONES_4 = {
    **NODES_SAME_ZONE_2,
    "testNode3": node("testNode3", "90002"),
    "testNode4": node("testNode4", "90002"),
}

# (name, node labels by node, endpoints (ip, node), current node, topology keys, expected ips)
KUBE_PROXY_CASES = [
    (
        "no topology key and endpoints",
        {"testNode1": node("10.0.0.1", "90001")},
        [],
        "testNode1",
        None,
        [],
    ),
    (
        "no topology key but have endpoints",
        NODES_SAME_ZONE_2,
        two_per_node(1, 2),
        "testNode1",
        None,
        ["1.1.1.1", "1.1.1.2", "1.1.2.1", "1.1.2.2"],
    ),
    (
        "one topology key with one node matched",
        NODES_SAME_ZONE_2,
        two_per_node(1, 2),
        "testNode1",
        [HOSTNAME],
        ["1.1.1.1", "1.1.1.2"],
    ),
    (
        "one topology key without node matched",
        NODES_SAME_ZONE_3,
        two_per_node(1, 2),
        "testNode3",
        [HOSTNAME],
        [],
    ),
    (
        "one topology key with multiple nodes matched",
        NODES_TWO_ZONES_4,
        two_per_node(1, 2, 3, 4),
        "testNode2",
        [ZONE],
        ["1.1.1.1", "1.1.1.2", "1.1.2.1", "1.1.2.2"],
    ),
    (
        # Upstream's comment says (hostname, zone) but its table has only hostname.
        "early match in multiple topology keys",
        NODES_TWO_ZONES_4,
        two_per_node(1, 2, 3, 4),
        "testNode2",
        [HOSTNAME],
        ["1.1.2.1", "1.1.2.2"],
    ),
    (
        "later match in multiple topology keys",
        {**NODES_TWO_ZONES_4, "testNode5": node("testNode5", "90002")},
        two_per_node(1, 2, 3, 4),
        "testNode5",
        [HOSTNAME, ZONE],
        ["1.1.3.1", "1.1.3.2", "1.1.4.1", "1.1.4.2"],
    ),
    (
        "multiple topology keys without node matched",
        {**NODES_TWO_ZONES_4, "testNode5": node("testNode5", "90003")},
        two_per_node(1, 2, 3, 4),
        "testNode5",
        [HOSTNAME, ZONE],
        [],
    ),
    (
        "multiple topology keys matched node when 'Any' key ignored",
        NODES_SAME_ZONE_2,
        two_per_node(1, 2),
        "testNode1",
        [HOSTNAME, "*"],
        ["1.1.1.1", "1.1.1.2"],
    ),
    (
        "two topology keys matched node with 'Any' key",
        NODES_SAME_ZONE_3,
        two_per_node(1, 2),
        "testNode3",
        [HOSTNAME, "*"],
        ["1.1.1.1", "1.1.1.2", "1.1.2.1", "1.1.2.2"],
    ),
    (
        "multiple topology keys matched node with 'Any' key",
        {**NODES_TWO_ZONES_4, "testNode5": node("testNode5", "90003")},
        two_per_node(1, 2, 3, 4),
        "testNode5",
        [HOSTNAME, ZONE, "*"],
        [f"1.1.{n}.{i}" for n in (1, 2, 3, 4) for i in (1, 2)],
    ),
]


@pytest.mark.parametrize(
    "nodes, endpoints, current, keys, expected",
    [case[1:] for case in KUBE_PROXY_CASES],
    ids=[case[0] for case in KUBE_PROXY_CASES],
)
def test_filter_topology_endpoint(
    nodes: dict[str, dict[str, str]],
    endpoints: list[tuple[str, str]],
    current: str,
    keys: list[str] | None,
    expected: list[str],
) -> None:
    candidates: Candidates = [(Endpoint(addresses=(ip,)), nodes[n]) for ip, n in endpoints]
    got = chosen_ips(keys_policy(*(keys or ())), nodes[current], candidates)
    assert set(got) == set(expected)
    assert got == [ip for ip, _ in endpoints if ip in got]  # a subset, in input order


# --------------------------------------------------------------------------------------------
# 2. Properties of selection by keys (docs/topology.md, "Choosing endpoints by tiers").
# --------------------------------------------------------------------------------------------

# Five endpoints: two on n1 (zone a), one on n2 (zone a), one on n3 (zone b), one with no zone.
PROPERTY_CANDIDATES: Candidates = [
    (Endpoint(addresses=("10.0.0.5",)), {HOSTNAME: "n3", ZONE: "b"}),
    (Endpoint(addresses=("10.0.0.1",)), {HOSTNAME: "n1", ZONE: "a"}),
    (Endpoint(addresses=("10.0.0.3",)), {HOSTNAME: "n2", ZONE: "a"}),
    (Endpoint(addresses=("10.0.0.9",)), {HOSTNAME: "n4"}),
    (Endpoint(addresses=("10.0.0.2",)), {HOSTNAME: "n1", ZONE: "a"}),
]
ALL = ["10.0.0.5", "10.0.0.1", "10.0.0.3", "10.0.0.9", "10.0.0.2"]
N1 = {HOSTNAME: "n1", ZONE: "a", REGION: "r"}

PROPERTY_CASES = [
    # (id, keys, client labels, expected ips in input order)
    ("same node wins whole", [HOSTNAME, ZONE], N1, ["10.0.0.1", "10.0.0.2"]),
    (
        "same zone when node has none, never the union",
        [HOSTNAME, ZONE],
        {HOSTNAME: "n9", ZONE: "a"},
        ["10.0.0.1", "10.0.0.3", "10.0.0.2"],
    ),
    ("zone tier alone", [ZONE], N1, ["10.0.0.1", "10.0.0.3", "10.0.0.2"]),
    ("star alone is everything", ["*"], N1, ALL),
    ("star alone is everything for an empty client", ["*"], {}, ALL),
    ("empty client, last key star: all", [HOSTNAME, ZONE, "*"], {}, ALL),
    ("empty client, no star: none", [HOSTNAME, ZONE], {}, []),
    (
        "client lacking hostname skips to zone",
        [HOSTNAME, ZONE],
        {ZONE: "b"},
        ["10.0.0.5"],
    ),
    ("non-empty client lacking every key, star: all", [HOSTNAME, ZONE, "*"], {"x": "y"}, ALL),
    ("non-empty client lacking every key, no star: none", [HOSTNAME, ZONE], {"x": "y"}, []),
    # Only len(labels) == 0 takes the edge case, which looks at the last key; a non-empty client
    # walks the keys and reaches "*" (unvalidated key list, to tell the two paths apart).
    ("non-empty client walks to a leading star", ["*", HOSTNAME], {"x": "y"}, ALL),
    ("empty client checks only the last key", ["*", HOSTNAME], {}, []),
    (
        "endpoint lacking the key never matches",
        [ZONE],
        {HOSTNAME: "n4", ZONE: ""},
        [],
    ),
    ("no tier matched: empty", [HOSTNAME, ZONE], {HOSTNAME: "n9", ZONE: "z"}, []),
    ("no tier matched then star: all", [HOSTNAME, ZONE, "*"], {HOSTNAME: "n9", ZONE: "z"}, ALL),
    ("values compare case-sensitively", [ZONE], {ZONE: "A"}, []),
    ("key not written by the controller matches nothing", [REGION], N1, []),
    ("no keys: everything", [], N1, ALL),
]


@pytest.mark.parametrize(
    "keys, client, expected",
    [case[1:] for case in PROPERTY_CASES],
    ids=[case[0] for case in PROPERTY_CASES],
)
def test_select_properties(keys: list[str], client: dict[str, str], expected: list[str]) -> None:
    got = chosen_ips(keys_policy(*keys), client, PROPERTY_CANDIDATES)
    assert got == expected


TIER_CLIENTS = [
    N1,
    {HOSTNAME: "n2", ZONE: "a"},
    {HOSTNAME: "n3", ZONE: "b"},
    {HOSTNAME: "n9", ZONE: "a"},
    {HOSTNAME: "n9", ZONE: "b"},
    {HOSTNAME: "n4"},
    {ZONE: "a"},
    {},
    {"x": "y"},
]


@pytest.mark.parametrize("client", TIER_CLIENTS, ids=[str(c) for c in TIER_CLIENTS])
@pytest.mark.parametrize("star", [False, True], ids=["no-star", "star"])
def test_result_is_one_whole_tier_in_input_order(client: dict[str, str], star: bool) -> None:
    keys = [HOSTNAME, ZONE] + (["*"] if star else [])
    got = chosen_ips(keys_policy(*keys), client, PROPERTY_CANDIDATES)
    assert got == [ip for ip in ALL if ip in got]
    same_node = [ep.addresses[0] for ep, lb in PROPERTY_CANDIDATES if _same(lb, client, HOSTNAME)]
    same_zone = [ep.addresses[0] for ep, lb in PROPERTY_CANDIDATES if _same(lb, client, ZONE)]
    tiers = [[], same_node, same_zone] + ([ALL] if star else [])
    assert got in tiers


def _same(labels: Mapping[str, str], client: Mapping[str, str], key: str) -> bool:
    return key in client and key in labels and labels[key] == client[key]


# --------------------------------------------------------------------------------------------
# 3. Zone hints and the policy a service asks for (docs/topology.md, "Where a policy comes from").
# --------------------------------------------------------------------------------------------

HINTED: Candidates = [
    (Endpoint(addresses=("10.1.0.1",), zone="a", hint_zones=("a",)), {ZONE: "a"}),
    (Endpoint(addresses=("10.1.0.2",), zone="b", hint_zones=("b",)), {ZONE: "b"}),
    # Hints may send an endpoint to another zone than its own, and name several zones.
    (Endpoint(addresses=("10.1.0.3",), zone="b", hint_zones=("a", "c")), {ZONE: "b"}),
]
HINTED_ALL = ["10.1.0.1", "10.1.0.2", "10.1.0.3"]

HINT_CASES = [
    ("hinted for the zone", {ZONE: "a", HOSTNAME: "n1"}, ["10.1.0.1", "10.1.0.3"]),
    ("hinted for the zone (other endpoint's zone)", {ZONE: "c"}, ["10.1.0.3"]),
    ("none hinted for the zone: all", {ZONE: "z"}, HINTED_ALL),
    ("client without a zone: all", {HOSTNAME: "n1"}, HINTED_ALL),
    ("client with an empty zone: all", {ZONE: ""}, HINTED_ALL),
    ("client labels unknown: all", {}, HINTED_ALL),
]


@pytest.mark.parametrize(
    "client, expected", [c[1:] for c in HINT_CASES], ids=[c[0] for c in HINT_CASES]
)
def test_select_hints(client: dict[str, str], expected: list[str]) -> None:
    assert chosen_ips(Policy("hints", hints=True), client, HINTED) == expected


# Node hints (hints.forNodes, written for PreferSameNode) come before zone hints; kube-proxy
# compares them with its node's name (pkg/proxy/topology.go, topologyModeFromHints).
NODE_HINTED: Candidates = [
    (Endpoint(("10.1.0.1",), zone="a", hint_zones=("a",), hint_nodes=("n1",)), {ZONE: "a"}),
    (Endpoint(("10.1.0.2",), zone="a", hint_zones=("a",), hint_nodes=("n2",)), {ZONE: "a"}),
    (Endpoint(("10.1.0.3",), zone="b", hint_zones=("b",), hint_nodes=("n3",)), {ZONE: "b"}),
]
NODE_HINT_CASES = [
    ("hinted for the node", {NODE_NAME: "n2", ZONE: "a"}, True, ["10.1.0.2"]),
    (
        "by name, not hostname label",
        {NODE_NAME: "n9", HOSTNAME: "n2", ZONE: "b"},
        True,
        ["10.1.0.3"],
    ),
    ("none for the node: zone hints", {NODE_NAME: "n9", ZONE: "a"}, True, ["10.1.0.1", "10.1.0.2"]),
    ("none for node or zone: all", {NODE_NAME: "n9", ZONE: "z"}, True, HINTED_ALL),
    ("node hints only, none for the node: all", {NODE_NAME: "n9", ZONE: "a"}, False, HINTED_ALL),
    ("node hints only", {NODE_NAME: "n3"}, False, ["10.1.0.3"]),
    ("client unknown: all", {}, True, HINTED_ALL),
]


@pytest.mark.parametrize(
    "client, zones, expected",
    [c[1:] for c in NODE_HINT_CASES],
    ids=[c[0] for c in NODE_HINT_CASES],
)
def test_select_node_hints(client: dict[str, str], zones: bool, expected: list[str]) -> None:
    policy = Policy("hints", hints=zones, node_hints=True)
    assert chosen_ips(policy, client, NODE_HINTED) == expected


def test_policy_for_node_hints() -> None:
    both = [eps(*(ep for ep, _ in NODE_HINTED))]
    policy = policy_for(svc(), both)
    assert (policy.hints, policy.node_hints, policy.active) == (True, True, True)
    assert policy.describe() == "EndpointSlice hints.forNodes, then hints.forZones"
    one_without = [eps(NODE_HINTED[0][0], Endpoint(("10.1.0.9",), hint_zones=("a",)))]
    assert (policy_for(svc(), one_without).node_hints, policy_for(svc(), one_without).hints) == (
        False,
        True,
    )
    # The signature tells apart clients of one zone on different nodes.
    assert policy.signature({ZONE: "a", NODE_NAME: "n1"}) != policy.signature(
        {ZONE: "a", NODE_NAME: "n2"}
    )


SAME_NODE: Candidates = [
    (Endpoint(("10.3.0.1",)), {HOSTNAME: "host-a", NODE_NAME: "node-a", ZONE: "z1"}),
    (Endpoint(("10.3.0.2",)), {HOSTNAME: "node-a", NODE_NAME: "node-b", ZONE: "z1"}),
]


def test_same_node_is_the_node_name_for_traffic_distribution_only() -> None:
    # On some clouds the hostname label is not the node's name: node-b's label reads "node-a".
    client = {HOSTNAME: "node-a", NODE_NAME: "node-a", ZONE: "z1"}
    same_node = policy_for(svc(traffic_distribution="PreferSameNode"), [])
    assert chosen_ips(same_node, client, SAME_NODE) == ["10.3.0.1"]
    # topologyKeys name a label, and compare the label, as kube-proxy did.
    hostname = policy_for(svc(topology_keys=(HOSTNAME,)), [])
    assert chosen_ips(hostname, client, SAME_NODE) == ["10.3.0.2"]


def hinted(ip: str, *zones: str) -> Endpoint:
    return Endpoint(addresses=(ip,), zone=zones[0] if zones else "", hint_zones=zones or None)


HINTS_POLICY_CASES = [
    ("every endpoint hinted", [eps(hinted("10.0.0.1", "a"), hinted("10.0.0.2", "b"))], True),
    (
        "every endpoint of every slice hinted",
        [eps(hinted("10.0.0.1", "a")), eps(hinted("10.0.0.2", "b"), name="web-def")],
        True,
    ),
    ("one endpoint unhinted", [eps(hinted("10.0.0.1", "a"), hinted("10.0.0.2"))], False),
    (
        "one slice's endpoint unhinted",
        [eps(hinted("10.0.0.1", "a")), eps(hinted("10.0.0.2"), name="web-def")],
        False,
    ),
    (
        "empty hint list counts as no hint",
        [eps(hinted("10.0.0.1", "a"), Endpoint(addresses=("10.0.0.2",), hint_zones=()))],
        False,
    ),
    ("no endpoints", [eps()], False),
    ("no slices", [], False),
]


@pytest.mark.parametrize(
    "slices, is_hints",
    [c[1:] for c in HINTS_POLICY_CASES],
    ids=[c[0] for c in HINTS_POLICY_CASES],
)
def test_policy_for_hints(slices: list[EndpointSlice], is_hints: bool) -> None:
    policy = policy_for(svc(), slices)
    if is_hints:
        assert policy.hints and policy.active and not policy.errors and policy.keys == ()
    else:
        assert policy == NO_POLICY
        assert not policy.active


TRAFFIC_DISTRIBUTION_CASES = [
    ("PreferSameNode", (NODE_NAME, ZONE, "*")),
    ("PreferSameZone", (ZONE, "*")),
    ("PreferClose", (ZONE, "*")),
]


@pytest.mark.parametrize("value, keys", TRAFFIC_DISTRIBUTION_CASES)
def test_policy_for_traffic_distribution(value: str, keys: tuple[str, ...]) -> None:
    policy = policy_for(svc(traffic_distribution=value), [])
    assert policy.keys == keys
    assert not policy.hints and not policy.errors and policy.active


@pytest.mark.parametrize("value", ["PreferNowhere", "prefersamezone", "Local"])
def test_policy_for_unknown_traffic_distribution_has_errors(value: str) -> None:
    policy = policy_for(svc(traffic_distribution=value), [eps(hinted("10.0.0.1", "a"))])
    assert policy.errors
    assert all("spec.trafficDistribution" in e and value in e for e in policy.errors)
    assert not policy.active
    candidates: Candidates = [
        (Endpoint(addresses=("10.0.0.1",)), {ZONE: "a"}),
        (Endpoint(addresses=("10.0.0.2",)), {ZONE: "b"}),
    ]
    assert chosen_ips(policy, {ZONE: "a"}, candidates) == ["10.0.0.1", "10.0.0.2"]


ALL_HINTED = [eps(hinted("10.0.0.1", "a"), hinted("10.0.0.2", "b"))]
PRECEDENCE_CASES = [
    # (id, service fields, expected (source, keys, hints))
    (
        "topologyKeys over everything",
        {
            "topology_keys": (HOSTNAME,),
            "topology_annotation": (ZONE,),
            "traffic_distribution": "PreferSameNode",
        },
        ("topologyKeys", (HOSTNAME,), False),
    ),
    (
        "annotation over trafficDistribution and hints",
        {"topology_annotation": (ZONE, "*"), "traffic_distribution": "PreferSameNode"},
        ("annotation", (ZONE, "*"), False),
    ),
    (
        "empty topologyKeys falls through to the annotation",
        {"topology_keys": (), "topology_annotation": (REGION,)},
        ("annotation", (REGION,), False),
    ),
    (
        "trafficDistribution over hints",
        {"traffic_distribution": "PreferSameZone"},
        ("trafficDistribution PreferSameZone", (ZONE, "*"), False),
    ),
    ("hints over nothing", {}, ("hints", (), True)),
]


@pytest.mark.parametrize(
    "fields, expected",
    [c[1:] for c in PRECEDENCE_CASES],
    ids=[c[0] for c in PRECEDENCE_CASES],
)
def test_policy_precedence(fields: dict[str, object], expected: tuple[object, ...]) -> None:
    policy = policy_for(svc(**fields), ALL_HINTED)
    assert (policy.source, policy.keys, policy.hints) == expected
    assert not policy.errors


def test_no_policy_without_any_source() -> None:
    assert policy_for(svc(), [eps(hinted("10.0.0.1"))]) == NO_POLICY
    candidates: Candidates = [(Endpoint(addresses=("10.0.0.1",)), {ZONE: "a"})]
    assert chosen_ips(NO_POLICY, {ZONE: "b"}, candidates) == ["10.0.0.1"]


# --------------------------------------------------------------------------------------------
# 4. Validation (docs/topology.md): the API server's ValidateService topologyKeys block, with
# apimachinery's IsQualifiedName and field.Error rendering. Errors accumulate.
# --------------------------------------------------------------------------------------------


def go_strings(keys: Sequence[str]) -> str:
    """How field.Error renders a []string bad value: Go's %#v, e.g. []string{"a", "b"}."""
    return "[]string{" + ", ".join(json.dumps(k) for k in keys) + "}"


def invalid_key(field: str, i: int, keys: Sequence[str], message: str) -> str:
    # The API server reports the whole list as the bad value, not the key.
    return f"{field}[{i}]: Invalid value: {go_strings(keys)}: {message}"


SEVENTEEN = [f"example.com/k{i}" for i in range(17)]
STAR_DUP_17 = ["*"] + [f"example.com/k{i}" for i in range(15)] + ["example.com/k0"]
MIXED = ["*", "a", "a", "b/c/d"]
FORBIDDEN = "Forbidden: may not be specified when `externalTrafficPolicy=Local`"


def validation_cases(field: str) -> list[tuple[str, list[str], str, list[str]]]:
    """(id, keys, externalTrafficPolicy, expected messages) for one field path."""
    return [
        ("valid well-known keys", [HOSTNAME, ZONE, REGION, "*"], "", []),
        ("valid mixed-case name part", ["example.com/My_Name.1"], "Cluster", []),
        ("sixteen keys allowed", SEVENTEEN[:16], "", []),
        ("externalTrafficPolicy Local", [HOSTNAME], "Local", [f"{field}: {FORBIDDEN}"]),
        (
            "seventeen keys",
            SEVENTEEN,
            "",
            [f"{field}: Too many: 17: must have at most 16 items"],
        ),
        (
            "duplicate",
            [HOSTNAME, ZONE, HOSTNAME],
            "",
            [f'{field}[2]: Duplicate value: "{HOSTNAME}"'],
        ),
        (
            "star not last",
            ["*", HOSTNAME],
            "",
            [f'{field}[0]: Invalid value: "*": "*" must be the last value specified'],
        ),
        (
            "star twice",
            ["*", "*"],
            "",
            [
                f'{field}[0]: Invalid value: "*": "*" must be the last value specified',
                f'{field}[1]: Duplicate value: "*"',
            ],
        ),
        (
            "several rules at once",
            STAR_DUP_17,
            "Local",
            [
                f"{field}: {FORBIDDEN}",
                f"{field}: Too many: 17: must have at most 16 items",
                f'{field}[0]: Invalid value: "*": "*" must be the last value specified',
                f'{field}[16]: Duplicate value: "example.com/k0"',
            ],
        ),
        ("invalid: a/b/c", ["a/b/c"], "", [invalid_key(field, 0, ["a/b/c"], QUALIFIED_MSG)]),
        (
            "invalid: -bad after a valid key",
            [HOSTNAME, "-bad"],
            "",
            [invalid_key(field, 1, [HOSTNAME, "-bad"], f"name part {NAME_MSG}")],
        ),
        (
            "invalid: uppercase prefix",
            ["Example.com/x"],
            "",
            [invalid_key(field, 0, ["Example.com/x"], f"prefix part {SUBDOMAIN_MSG}")],
        ),
        (
            "invalid: name part over 63",
            [NAME_64],
            "",
            [invalid_key(field, 0, [NAME_64], "name part must be no more than 63 characters")],
        ),
        (
            "invalid: prefix over 253",
            [PREFIX_254 + "/x"],
            "",
            [
                invalid_key(
                    field,
                    0,
                    [PREFIX_254 + "/x"],
                    "prefix part must be no more than 253 characters",
                )
            ],
        ),
        (
            "several invalid keys and rules accumulate",
            MIXED,
            "Local",
            [
                f"{field}: {FORBIDDEN}",
                f'{field}[0]: Invalid value: "*": "*" must be the last value specified',
                f'{field}[2]: Duplicate value: "a"',
                invalid_key(field, 3, MIXED, QUALIFIED_MSG),
            ],
        ),
    ]


SPEC_CASES = validation_cases(SPEC_FIELD) + [
    (
        "invalid: empty key",
        ["", "*"],
        "",
        [
            invalid_key(SPEC_FIELD, 0, ["", "*"], "name part must be non-empty"),
            invalid_key(SPEC_FIELD, 0, ["", "*"], f"name part {NAME_MSG}"),
        ],
    ),
]


@pytest.mark.parametrize(
    "keys, etp, expected", [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES]
)
def test_validate_keys(keys: list[str], etp: str, expected: list[str]) -> None:
    service = svc(topology_keys=tuple(keys), external_traffic_policy=etp)
    assert validate_keys(keys, SPEC_FIELD, service) == expected


def through_policy_for(cases: list[tuple[str, list[str], str, list[str]]]) -> list[Any]:
    """The cases for policy_for: every rule, and only one invalid-key case, since the rendering
    of invalid keys is the same code whatever the source."""
    keep = [c for c in cases if not c[0].startswith(("invalid:", "several invalid"))]
    keep += [c for c in cases if c[0] == "invalid: a/b/c"]
    return [pytest.param(*c[1:], id=c[0]) for c in keep]


@pytest.mark.parametrize("keys, etp, expected", through_policy_for(SPEC_CASES))
def test_policy_for_spec_topology_keys_validates(
    keys: list[str], etp: str, expected: list[str]
) -> None:
    policy = policy_for(svc(topology_keys=tuple(keys), external_traffic_policy=etp), [])
    assert policy.source == "topologyKeys"
    assert list(policy.errors) == expected
    assert policy.active is (not expected)


ANNOTATION_CASES = validation_cases(ANNOTATION_FIELD)


@pytest.mark.parametrize("keys, etp, expected", through_policy_for(ANNOTATION_CASES))
def test_policy_for_annotation_validates(keys: list[str], etp: str, expected: list[str]) -> None:
    policy = policy_for(svc(topology_annotation=tuple(keys), external_traffic_policy=etp), [])
    assert policy.source == "annotation"
    assert list(policy.errors) == expected
    assert policy.active is (not expected)


INVALID_POLICIES = [
    ("forbidden with Local", {"topology_keys": (HOSTNAME,), "external_traffic_policy": "Local"}),
    ("star not last", {"topology_keys": ("*", HOSTNAME)}),
    ("invalid key", {"topology_keys": ("a/b/c",)}),
    ("annotation duplicate", {"topology_annotation": (HOSTNAME, HOSTNAME)}),
    ("annotation too many", {"topology_annotation": tuple(SEVENTEEN)}),
]


@pytest.mark.parametrize(
    "fields", [c[1] for c in INVALID_POLICIES], ids=[c[0] for c in INVALID_POLICIES]
)
@pytest.mark.parametrize("client", [{HOSTNAME: "n1", ZONE: "a"}, {}, {"x": "y"}])
def test_invalid_policy_is_ignored(fields: dict[str, object], client: dict[str, str]) -> None:
    policy = policy_for(svc(**fields), ALL_HINTED)
    assert policy.errors and not policy.active
    assert chosen_ips(policy, client, PROPERTY_CANDIDATES) == ALL


# --------------------------------------------------------------------------------------------
# 5. Policy.signature: equal signatures mean equal answers; clients that select differently
# have different signatures.
# --------------------------------------------------------------------------------------------

SIGNATURE_CASES = [
    # (id, keys, client a, client b, same signature)
    (
        "same values for the keys",
        [HOSTNAME, ZONE],
        {HOSTNAME: "n1", ZONE: "a"},
        {ZONE: "a", HOSTNAME: "n1"},
        True,
    ),
    (
        "differ only in an unused label",
        [HOSTNAME, ZONE, "*"],
        {HOSTNAME: "n1", ZONE: "a", "rack": "1"},
        {HOSTNAME: "n1", ZONE: "a", "rack": "2"},
        True,
    ),
    ("unused label present or not", [ZONE], {ZONE: "a"}, {ZONE: "a", "rack": "2"}, True),
    (
        "differ in a used label",
        [HOSTNAME, ZONE],
        {HOSTNAME: "n1", ZONE: "a"},
        {HOSTNAME: "n1", ZONE: "b"},
        False,
    ),
    ("empty vs lacking the keys", [HOSTNAME, ZONE], {}, {"rack": "1"}, False),
    ("empty vs lacking the keys, star last", [HOSTNAME, "*"], {}, {"rack": "1"}, False),
    ("missing key vs empty value", [ZONE], {HOSTNAME: "n1"}, {HOSTNAME: "n1", ZONE: ""}, False),
]


@pytest.mark.parametrize(
    "keys, a, b, same", [c[1:] for c in SIGNATURE_CASES], ids=[c[0] for c in SIGNATURE_CASES]
)
def test_signature(keys: list[str], a: dict[str, str], b: dict[str, str], same: bool) -> None:
    policy = keys_policy(*keys)
    assert (policy.signature(a) == policy.signature(b)) is same


def test_empty_and_keyless_clients_select_differently() -> None:
    # Why their signatures must differ: with ["*", hostname] (unvalidated) one gets all, the
    # other none.
    policy = keys_policy("*", HOSTNAME)
    assert chosen_ips(policy, {}, PROPERTY_CANDIDATES) == []
    assert chosen_ips(policy, {"rack": "1"}, PROPERTY_CANDIDATES) == ALL
    assert policy.signature({}) != policy.signature({"rack": "1"})


SIGNATURE_CLIENTS = TIER_CLIENTS + [
    {HOSTNAME: "n1", ZONE: "a", "rack": "7"},
    {HOSTNAME: "n9", ZONE: "a", REGION: "other"},
    {"rack": "7"},
    {ZONE: ""},
]
SIGNATURE_POLICIES = [
    keys_policy(HOSTNAME, ZONE),
    keys_policy(HOSTNAME, ZONE, "*"),
    keys_policy(ZONE, "*"),
    keys_policy("*"),
    keys_policy("*", HOSTNAME),
    Policy("hints", hints=True),
]


@pytest.mark.parametrize(
    "policy", SIGNATURE_POLICIES, ids=[p.describe() for p in SIGNATURE_POLICIES]
)
def test_equal_signatures_give_equal_answers(policy: Policy) -> None:
    candidates = HINTED if policy.hints else PROPERTY_CANDIDATES
    answers: dict[tuple[object, ...], tuple[int, ...]] = {}
    for client in SIGNATURE_CLIENTS:
        chosen = select(policy, client, candidates).chosen
        assert answers.setdefault(policy.signature(client), chosen) == chosen, client


# --------------------------------------------------------------------------------------------
# 6. endpoint_labels: pod locator by address, else node locator of nodeName, else the slice.
# --------------------------------------------------------------------------------------------

POD_LABELS = {HOSTNAME: "pod-node", ZONE: "pz", "rack": "r1"}
NODE_LABELS = {HOSTNAME: "node-a-host", ZONE: "nz", REGION: "nr"}
POD = PodLocator("shop", "web-0", ("10.0.0.1", "fd00::5"), "node-a", POD_LABELS)
NODE = PodLocator("toposdns", "node-a", ("192.168.0.1",), "node-a", NODE_LABELS, is_node=True)
LOCATORS = {"10.0.0.1": POD, "fd00::5": POD, "192.168.0.1": NODE}
NODE_LOCATORS = {"node-a": NODE}

ENDPOINT_LABEL_CASES = [
    (
        "pod locator wins over node locator",
        Endpoint(addresses=("10.0.0.1",), node_name="node-a", zone="sz"),
        {**POD_LABELS, NODE_NAME: "node-a"},
    ),
    (
        "pod locator by a later address",
        Endpoint(addresses=("10.9.9.9", "10.0.0.1"), node_name="node-a"),
        {**POD_LABELS, NODE_NAME: "node-a"},
    ),
    (
        "pod locator by non-canonical IPv6: its node, not the slice's",
        Endpoint(addresses=("fd00:0:0::5",), node_name="node-b", zone="sz"),
        {**POD_LABELS, NODE_NAME: "node-a"},
    ),
    (
        "no pod locator: node locator of nodeName",
        Endpoint(addresses=("10.0.0.2",), node_name="node-a", zone="sz"),
        {**NODE_LABELS, NODE_NAME: "node-a"},
    ),
    (
        "address of a node locator is not a pod: node locator of nodeName",
        Endpoint(addresses=("192.168.0.1",), node_name="node-a"),
        {**NODE_LABELS, NODE_NAME: "node-a"},
    ),
    (
        "no locator: the slice's nodeName and zone",
        Endpoint(addresses=("10.0.0.2",), node_name="node-b", zone="sz"),
        {HOSTNAME: "node-b", NODE_NAME: "node-b", ZONE: "sz"},
    ),
    (
        "no locator, no zone",
        Endpoint(addresses=("10.0.0.2",), node_name="node-b"),
        {HOSTNAME: "node-b", NODE_NAME: "node-b"},
    ),
    ("no locator, no node", Endpoint(addresses=("10.0.0.2",), zone="sz"), {ZONE: "sz"}),
    ("nothing known", Endpoint(addresses=("10.0.0.2",)), {}),
]


@pytest.mark.parametrize(
    "endpoint, expected",
    [c[1:] for c in ENDPOINT_LABEL_CASES],
    ids=[c[0] for c in ENDPOINT_LABEL_CASES],
)
def test_endpoint_labels(endpoint: Endpoint, expected: dict[str, str]) -> None:
    assert dict(endpoint_labels(endpoint, LOCATORS, NODE_LOCATORS)) == expected


# --------------------------------------------------------------------------------------------
# 7. Selection.tier, the `tier` of toposdns_topology_answers_total: the key that matched, "*"
# when every endpoint is chosen, "none" when no tier matched (the answer is NODATA).
# --------------------------------------------------------------------------------------------

RACKS: Candidates = [
    (Endpoint(addresses=("10.2.0.1",)), {HOSTNAME: "n1", "example.com/rack": "r1"}),
    (Endpoint(addresses=("10.2.0.2",)), {HOSTNAME: "n2", "example.com/rack": "r2"}),
]
ZONE_STAR = keys_policy(HOSTNAME, ZONE, "*")
HINTS = Policy("hints", hints=True)
INVALID = Policy("annotation", (HOSTNAME, HOSTNAME), errors=("duplicate",))

TIER_CASES = [
    # (id, policy, client labels, candidates, expected ips, expected tier)
    ("same node", ZONE_STAR, N1, PROPERTY_CANDIDATES, ["10.0.0.1", "10.0.0.2"], HOSTNAME),
    (
        "none on the node: same zone",
        ZONE_STAR,
        {HOSTNAME: "n9", ZONE: "a"},
        PROPERTY_CANDIDATES,
        ["10.0.0.1", "10.0.0.3", "10.0.0.2"],
        ZONE,
    ),
    ("none in the zone: the catch-all", ZONE_STAR, {ZONE: "z"}, PROPERTY_CANDIDATES, ALL, "*"),
    ("* alone", keys_policy("*"), N1, PROPERTY_CANDIDATES, ALL, "*"),
    ("none in the zone, no *", keys_policy(ZONE), {ZONE: "z"}, PROPERTY_CANDIDATES, [], "none"),
    ("client unknown, last key *", ZONE_STAR, {}, PROPERTY_CANDIDATES, ALL, "*"),
    ("client unknown, no *", keys_policy(ZONE), {}, PROPERTY_CANDIDATES, [], "none"),
    (
        "client lacks every key, no *",
        keys_policy(ZONE),
        {"x": "y"},
        PROPERTY_CANDIDATES,
        [],
        "none",
    ),
    (
        "any other label key",
        keys_policy("example.com/rack", "*"),
        {HOSTNAME: "n3", "example.com/rack": "r2"},
        RACKS,
        ["10.2.0.2"],
        "example.com/rack",
    ),
    ("hinted for the client's zone", HINTS, {ZONE: "a"}, HINTED, ["10.1.0.1", "10.1.0.3"], ZONE),
    ("no endpoint hinted for the zone", HINTS, {ZONE: "z"}, HINTED, HINTED_ALL, "*"),
    ("hints, client unknown", HINTS, {}, HINTED, HINTED_ALL, "*"),
    ("invalid policy: every endpoint", INVALID, N1, PROPERTY_CANDIDATES, ALL, "*"),
    ("no policy: every endpoint", NO_POLICY, N1, PROPERTY_CANDIDATES, ALL, "*"),
]


@pytest.mark.parametrize(
    "policy, client, candidates, expected, tier",
    [c[1:] for c in TIER_CASES],
    ids=[c[0] for c in TIER_CASES],
)
def test_selection_tier(
    policy: Policy,
    client: dict[str, str],
    candidates: Candidates,
    expected: list[str],
    tier: str,
) -> None:
    selection = select(policy, client, candidates)
    assert [candidates[i][0].addresses[0] for i in selection.chosen] == expected
    assert selection.tier == tier


@pytest.mark.parametrize("client", TIER_CLIENTS, ids=[str(c) for c in TIER_CLIENTS])
@pytest.mark.parametrize("star", [False, True], ids=["no-star", "star"])
def test_tier_names_what_was_chosen(client: dict[str, str], star: bool) -> None:
    """A key tier holds exactly the endpoints sharing the client's value; "*" holds all; "none"
    holds nothing."""
    selection = select(
        keys_policy(HOSTNAME, ZONE, *(["*"] if star else [])), client, PROPERTY_CANDIDATES
    )
    chosen = [PROPERTY_CANDIDATES[i] for i in selection.chosen]
    if selection.tier == "none":
        assert not chosen
    elif selection.tier == "*":
        assert star and len(chosen) == len(PROPERTY_CANDIDATES)
    else:
        key = selection.tier
        assert chosen == [c for c in PROPERTY_CANDIDATES if _same(c[1], client, key)] != []


# --------------------------------------------------------------------------------------------
# 7. Soft topology (docs/topology.md, "Soft topology"): spill-over, SRV priorities by tier and
# weights between tiers, for each policy source; invalid annotations fall back to the hard policy.
# --------------------------------------------------------------------------------------------

MIN_ANNOTATION = "metadata.annotations[toposdns.io/topology-min-endpoints]"
SRV_FIELD = "metadata.annotations[toposdns.io/topology-srv]"
WEIGHTS_FIELD = "metadata.annotations[toposdns.io/topology-weights]"

# node-a z1: .1; node-b z1: .2, .3; node-c z2: .4, .5, .6
SOFT_NODES = {"a": node("node-a", "z1"), "b": node("node-b", "z1"), "c": node("node-c", "z2")}
SOFT_CANDIDATES: Candidates = [
    (
        Endpoint(
            addresses=(f"10.0.0.{i}",),
            node_name=f"node-{n}",
            zone=SOFT_NODES[n][ZONE],
            hint_zones=(SOFT_NODES[n][ZONE],),
        ),
        {**SOFT_NODES[n], NODE_NAME: f"node-{n}"},
    )
    for i, n in enumerate("abbccc", start=1)
]
CLIENT_A = {**SOFT_NODES["a"], NODE_NAME: "node-a"}
CLIENT_Z3 = {HOSTNAME: "node-z", ZONE: "z3", NODE_NAME: "node-z"}

# The policy sources, with their tiers: each soft case runs on each of them.
SOFT_SOURCES: dict[str, dict[str, Any]] = {
    "topologyKeys": {"topology_keys": (HOSTNAME, ZONE, "*")},
    "annotation": {"topology_annotation": (HOSTNAME, ZONE, "*")},
    "trafficDistribution": {"traffic_distribution": "PreferSameNode"},
}


def soft(source: str, **annotations: str) -> Policy:
    fields = {f"topology_{k}": v for k, v in annotations.items()}
    return policy_for(
        svc(**SOFT_SOURCES[source], **fields), [eps(*(c[0] for c in SOFT_CANDIDATES))]
    )


def last_octets(indexes: Sequence[int]) -> list[int]:
    return [int(SOFT_CANDIDATES[i][0].addresses[0].rsplit(".", 1)[1]) for i in indexes]


# (min-endpoints, client, the tiers taken, the endpoints chosen (last octets), spilled)
SPILL_CASES = [
    ("1", CLIENT_A, ["first"], [1], False),  # the node's one replica is enough
    ("2", CLIENT_A, ["first", "zone"], [1, 2, 3], True),  # the zone, added whole
    ("3", CLIENT_A, ["first", "zone"], [1, 2, 3], True),
    ("4", CLIENT_A, ["first", "zone", "*"], [1, 2, 3, 4, 5, 6], True),
    ("50%", CLIENT_A, ["first", "zone"], [1, 2, 3], True),  # ceil(6 * 50%) = 3
    ("51%", CLIENT_A, ["first", "zone", "*"], [1, 2, 3, 4, 5, 6], True),  # ceil(3.06) = 4
    ("10000", CLIENT_A, ["first", "zone", "*"], [1, 2, 3, 4, 5, 6], True),  # all there is
    ("2", CLIENT_Z3, ["*"], [1, 2, 3, 4, 5, 6], False),  # no node, no zone: "*" only
    ("2", {}, ["*"], [1, 2, 3, 4, 5, 6], False),  # unknown client, last key "*"
]


@pytest.mark.parametrize("source", list(SOFT_SOURCES))
@pytest.mark.parametrize(("minimum", "client", "taken", "want", "spilled"), SPILL_CASES)
def test_spill_over(
    source: str,
    minimum: str,
    client: dict[str, str],
    taken: list[str],
    want: list[int],
    spilled: bool,
) -> None:
    policy = soft(source, min_endpoints=minimum)
    assert not policy.soft_errors and policy.min_endpoints
    first = policy.keys[0]
    selection = select(policy, client, SOFT_CANDIDATES)
    assert list(selection.taken) == [
        first if t == "first" else ZONE if t == "zone" else t for t in taken
    ]
    assert last_octets(selection.chosen) == want
    assert selection.spilled is spilled
    assert selection.tier == selection.taken[-1]


def test_spill_over_stops_at_the_last_key() -> None:
    # A hard policy without "*" never goes past its last key.
    policy = policy_for(
        svc(topology_keys=(HOSTNAME, ZONE), topology_min_endpoints="5"),
        [eps(*(c[0] for c in SOFT_CANDIDATES))],
    )
    selection = select(policy, CLIENT_A, SOFT_CANDIDATES)
    assert last_octets(selection.chosen) == [1, 2, 3]
    assert selection.taken == (HOSTNAME, ZONE)
    assert select(policy, CLIENT_Z3, SOFT_CANDIDATES).chosen == ()  # NODATA, as hard
    assert select(policy, {}, SOFT_CANDIDATES).chosen == ()


def test_spill_over_with_hints() -> None:
    hinted_eps = [c[0] for c in SOFT_CANDIDATES]
    policy = policy_for(svc(topology_min_endpoints="4"), [eps(*hinted_eps)])
    assert policy.source == "hints" and policy.tiers == (ZONE, "*")
    selection = select(policy, CLIENT_A, SOFT_CANDIDATES)
    assert (selection.taken, last_octets(selection.chosen)) == ((ZONE, "*"), [1, 2, 3, 4, 5, 6])
    policy = policy_for(svc(topology_min_endpoints="3"), [eps(*hinted_eps)])
    assert last_octets(select(policy, CLIENT_A, SOFT_CANDIDATES).chosen) == [1, 2, 3]


# SRV priorities: (min-endpoints or None, client, A's endpoints, (last octet, priority, group
# size) for SRV)
PRIORITY_CASES = [
    (None, CLIENT_A, [1], [(1, 0), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2)]),
    ("2", CLIENT_A, [1, 2, 3], [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1)]),
    (None, CLIENT_Z3, [1, 2, 3, 4, 5, 6], [(i, 0) for i in range(1, 7)]),
]


@pytest.mark.parametrize("source", list(SOFT_SOURCES))
@pytest.mark.parametrize(("minimum", "client", "want", "srv"), PRIORITY_CASES)
def test_srv_priority(
    source: str,
    minimum: str | None,
    client: dict[str, str],
    want: list[int],
    srv: list[tuple[int, int]],
) -> None:
    extra = {} if minimum is None else {"min_endpoints": minimum}
    policy = soft(source, srv="priority", **extra)
    assert policy.srv_priority and not policy.soft_errors
    selection = select(policy, client, SOFT_CANDIDATES)
    assert last_octets(selection.chosen) == want
    got = [(last_octets([i])[0], priority) for i, priority, _, _ in selection.srv]
    assert got == srv
    assert all(share == 100 for *_, share in selection.srv)


def test_srv_priority_with_hints() -> None:
    policy = policy_for(svc(topology_srv="priority"), [eps(*(c[0] for c in SOFT_CANDIDATES))])
    selection = select(policy, CLIENT_A, SOFT_CANDIDATES)
    got = [(last_octets([i])[0], priority) for i, priority, _, _ in selection.srv]
    assert got == [(1, 0), (2, 0), (3, 0), (4, 1), (5, 1), (6, 1)]


# Weights: (weights, client, SRV (last octet, group share), rotation (share, last octets)):
# SRV counts each endpoint in the nearest tier that holds it; A and AAAA answer each tier's
# turns with every endpoint the tier holds (all of them for "*").
WEIGHT_CASES = [
    (
        "60,30,10",
        CLIENT_A,
        [(1, 60), (2, 30), (3, 30), (4, 10), (5, 10), (6, 10)],
        [(60, [1]), (30, [1, 2, 3]), (10, [1, 2, 3, 4, 5, 6])],
    ),
    # No node, no zone for this client: their shares go to the next tier, "*".
    ("60,30,10", CLIENT_Z3, [(i, 100) for i in range(1, 7)], [(100, [1, 2, 3, 4, 5, 6])]),
    # A tier without share keeps its endpoints in SRV with weight 0.
    ("80,0,20", CLIENT_A, [(1, 80), (2, 0), (3, 0), (4, 20), (5, 20), (6, 20)], None),
]


@pytest.mark.parametrize("source", list(SOFT_SOURCES))
@pytest.mark.parametrize(("weights", "client", "srv", "rotation"), WEIGHT_CASES)
def test_weights(
    source: str,
    weights: str,
    client: dict[str, str],
    srv: list[tuple[int, int]],
    rotation: list[tuple[int, list[int]]] | None,
) -> None:
    policy = soft(source, weights=weights)
    assert policy.weights == tuple(map(int, weights.split(","))) and not policy.soft_errors
    selection = select(policy, client, SOFT_CANDIDATES)
    assert [(last_octets([i])[0], share) for i, priority, _, share in selection.srv] == srv
    assert all(priority == 0 for _, priority, _, _ in selection.srv)
    if rotation is not None:
        assert [(share, last_octets(held)) for share, held in selection.rotation] == rotation
    # A and AAAA without rotation: the nearest tier, as the hard policy.
    hard = select(replace(policy, weights=()), client, SOFT_CANDIDATES)
    assert selection.chosen == hard.chosen


def test_weights_with_hints() -> None:
    policy = policy_for(svc(topology_weights="70,30"), [eps(*(c[0] for c in SOFT_CANDIDATES))])
    assert policy.weights == (70, 30) and policy.tiers == (ZONE, "*")
    selection = select(policy, CLIENT_A, SOFT_CANDIDATES)
    assert [(share, last_octets(held)) for share, held in selection.rotation] == [
        (70, [1, 2, 3]),
        (30, [1, 2, 3, 4, 5, 6]),
    ]


@pytest.mark.parametrize(
    ("shares", "counts"),
    [
        ((80, 20), [80, 20]),
        ((60, 30, 10), [60, 30, 10]),
        ((100,), [100]),
        ((1, 99), [1, 99]),
        ((33, 33, 34), [33, 33, 34]),
    ],
)
def test_rotation_schedule_shares_over_100_replies(
    shares: tuple[int, ...], counts: list[int]
) -> None:
    schedule = rotation_schedule(shares)
    assert len(schedule) == 100
    assert [schedule.count(i) for i in range(len(shares))] == counts
    assert rotation_schedule(shares) == schedule  # deterministic
    # Spread out: in any 10 replies in a row, each tier answers within one of its share.
    for start in range(0, 91):
        window = schedule[start : start + 10]
        for i, share in enumerate(shares):
            assert abs(window.count(i) - share / 10) < 1 + 1e-9


SOFT_INVALID = [
    ({"min_endpoints": "0"}, MIN_ANNOTATION, 'Invalid value: "0"'),
    ({"min_endpoints": "x"}, MIN_ANNOTATION, 'Invalid value: "x"'),
    ({"min_endpoints": "101%"}, MIN_ANNOTATION, 'Invalid value: "101%"'),
    ({"min_endpoints": "10001"}, MIN_ANNOTATION, 'Invalid value: "10001"'),
    ({"srv": "weighted"}, SRV_FIELD, 'Unsupported value: "weighted": supported values: "priority"'),
    (
        {"weights": "80,20"},
        WEIGHTS_FIELD,
        "must have one weight per tier, 3 for "
        "[kubernetes.io/hostname, topology.kubernetes.io/zone, *]",
    ),
    ({"weights": "80,20,x"}, WEIGHTS_FIELD + "[2]", 'Invalid value: "x"'),
    ({"weights": "80,20,10"}, WEIGHTS_FIELD, "must add up to 100, not 110"),
    ({"weights": "80,20,0", "srv": "priority"}, SRV_FIELD, "may not be specified with"),
    ({"weights": "80,20,0", "min_endpoints": "2"}, MIN_ANNOTATION, "may not be specified with"),
]


@pytest.mark.parametrize(("annotations", "field", "message"), SOFT_INVALID)
def test_invalid_soft_annotation_falls_back_to_the_hard_policy(
    annotations: dict[str, str], field: str, message: str
) -> None:
    policy = soft("topologyKeys", **annotations)
    assert policy.active and not policy.errors
    assert any(e.startswith(field + ":") and message in e for e in policy.soft_errors), (
        policy.soft_errors
    )
    hard = policy_for(svc(**SOFT_SOURCES["topologyKeys"]), [])
    assert (
        select(policy, CLIENT_A, SOFT_CANDIDATES).chosen
        == select(hard, CLIENT_A, SOFT_CANDIDATES).chosen
    )
    # The valid one of a pair still applies.
    if "weights" in annotations and "may not" in message:
        assert policy.weights


def test_soft_annotation_without_a_policy_is_reported() -> None:
    policy = policy_for(svc(topology_weights="100"), [])
    assert not policy.active and policy.weights == ()
    assert policy.soft_errors == (
        f"{WEIGHTS_FIELD}: Forbidden: needs a valid topology policy (topologyKeys, the "
        "toposdns.io/topology-keys annotation, trafficDistribution or hints)",
    )
    # An invalid policy is ignored whole: its own errors say so.
    bad = policy_for(svc(topology_keys=("*", HOSTNAME), topology_weights="100"), [])
    assert bad.errors and not bad.soft_errors


def test_mode_is_described() -> None:
    assert soft("topologyKeys").mode == "hard"
    assert soft("topologyKeys", min_endpoints="3").mode == "spill-over to 3 endpoints"
    assert soft("topologyKeys", min_endpoints="50%", srv="priority").mode == (
        "spill-over to 50% endpoints, SRV priorities by tier"
    )
    assert soft("topologyKeys", weights="80,20,0").mode == "weights 80,20,0"
