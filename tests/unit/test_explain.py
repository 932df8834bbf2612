"""`toposdns explain`, in text for people and JSON for tools."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests import objects
from toposdns.cli import main
from toposdns.explain import parse_name

TOPOLOGY = str(Path(__file__).parents[2] / "examples" / "topology.yaml")
CIDRS = str(Path(__file__).parents[2] / "examples" / "topology-cidrs.yaml")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["explain", "--snapshot", TOPOLOGY, *args])
    return code, capsys.readouterr().out


def test_text_names_locator_policy_tier_candidates_and_records(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "--client", "127.0.0.3", "web.shop.svc.cluster.local")
    assert code == 0
    assert "client 127.0.0.3: PodLocator toposdns/shop.client-b on node node-b" in out
    assert "  believed: namespace toposdns is in --locator-namespaces=toposdns" in out
    assert "policy topologyKeys [kubernetes.io/hostname, topology.kubernetes.io/zone, *]" in out
    assert "rule: topology.kubernetes.io/zone=z1" in out
    assert "chosen 10.244.1.10" in out and "-      10.244.3.10" in out
    assert "answer: NOERROR" in out and "IN\tA\t10.244.1.10" in out


def test_json_for_tools(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--json", "--client", "127.0.0.5", "ledger.shop.svc.cluster.local")
    data = json.loads(out)
    assert code == 0
    assert data["client"]["locator"] == {
        "namespace": "toposdns",
        "name": "node-d",
        "pod_namespace": None,
        "node": "node-d",
        "kind": "node",
        "via": "address",
        "matched": "127.0.0.5",
    }
    assert data["client"]["conflict"] == [] and data["client"]["ignored"] == []
    assert data["client"]["locator_namespaces"] == ["toposdns"]
    (decision,) = data["topology"]
    assert decision["policy"]["source"] == "annotation" and decision["policy"]["valid"]
    assert decision["rule"] == "no tier matched: no endpoint"
    assert not any(c["chosen"] for c in decision["candidates"])
    assert data["rcode"] == "NOERROR" and data["answer"] == [] and len(data["authority"]) == 1


@pytest.mark.parametrize(
    ("client", "placed"),
    [
        ("127.0.0.2", "node locator toposdns/node-a on node node-a, through its CIDR 127.0.0.2/31"),
        ("127.0.0.3", "node locator toposdns/node-b on node node-b, through its CIDR 127.0.0.3/32"),
        ("127.0.0.5", "node locator toposdns/node-d on node node-d, through its address 127.0.0.5"),
        ("10.244.3.0/24", "toposdns/node-c on node node-c, through its CIDR 10.244.3.0/24"),
        ("10.244.3.77/25", "toposdns/node-c on node node-c, through its CIDR 10.244.3.0/24"),
        (
            "fd00:10:244:4::/64",
            "toposdns/node-d on node node-d, through its CIDR fd00:10:244:4::/64",
        ),
        ("10.244.0.0/16", "no PodLocator CIDR holds all of this prefix: the client has no labels"),
    ],
)
def test_placement_through_cidrs(
    capsys: pytest.CaptureFixture[str], client: str, placed: str
) -> None:
    code = main(["explain", "--snapshot", CIDRS, "--client", client, "web.shop.svc.cluster.local"])
    first = capsys.readouterr().out.splitlines()[0]
    assert code == 0 and first.endswith(placed), first
    assert first.startswith(f"client {client.replace('.77/25', '.0/25')}: ")


def test_json_says_through_what(capsys: pytest.CaptureFixture[str]) -> None:
    main(["explain", "--snapshot", CIDRS, "--json", "--client", "127.0.0.4", "cache.shop.svc"])
    locator = json.loads(capsys.readouterr().out)["client"]["locator"]
    assert (locator["name"], locator["via"], locator["matched"]) == (
        "node-c",
        "cidr",
        "127.0.0.4/31",
    )


def test_unknown_client_and_srv(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--client", "10.0.0.1", "_http._tcp.web.shop.svc.cluster.local", "SRV")
    assert code == 0 and "no PodLocator holds this address" in out
    assert 'client labels unknown, last key is "*": every endpoint' in out
    assert out.count("answer     ") == 3


def test_invalid_policy_is_shown(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    snapshot = tmp_path / "bad.yaml"
    snapshot.write_text(
        "- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}\n"
        "- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: shop},\n"
        "   spec: {clusterIP: None, externalTrafficPolicy: Local,\n"
        "          topologyKeys: [kubernetes.io/hostname]}}\n"
        "- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, addressType: IPv4,\n"
        "   metadata: {name: web-1, namespace: shop,\n"
        "              labels: {kubernetes.io/service-name: web}},\n"
        "   endpoints: [{addresses: [10.0.0.1]}, {addresses: [10.0.0.2]}]}\n"
    )
    code = main(
        [
            "explain",
            "--snapshot",
            str(snapshot),
            "--client",
            "10.0.0.9",
            "web.shop.svc.cluster.local",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "ignored: spec.topologyKeys: Forbidden: may not be specified when "
        "`externalTrafficPolicy=Local`"
    ) in out
    assert "policy ignored (invalid): every endpoint" in out


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--client", "not-an-ip", "web.shop.svc.cluster.local"], 2, "does not appear to be"),
        (["--client", "10.0.0.1", "web.shop.svc.cluster.local", "BOGUS"], 2, "unknown record"),
        (["--fallthrough=example.org", "--client", "10.0.0.1", "x"], 2, "holds no name of"),
        (["--autopath-resolv-conf=/etc/hosts", "--client", "10.0.0.1", "x"], 2, "add --autopath"),
        (
            ["--autopath", "--autopath-resolv-conf=/no/such/file", "--client", "10.0.0.1", "x"],
            2,
            "--autopath-resolv-conf /no/such/file: cannot read it",
        ),
        (["--client", "10.0.0.1", "web..shop.svc.cluster.local"], 2, "has an empty label"),
    ],
)
def test_bad_arguments(
    capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    assert main(["explain", "--snapshot", TOPOLOGY, *args]) == code
    assert message in capsys.readouterr().err


def test_autopath_shows_the_names_tried(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 10.0.0.2\nsearch corp.example\n")
    options = ["--autopath", "--autopath-resolv-conf", str(resolv), "--client"]
    code, out = run(capsys, *options, "127.0.0.2", "web.shop.shop.svc.cluster.local")
    assert code == 0
    assert "autopath: the client's pod is in namespace shop" in out
    assert "tried    web.shop.shop.svc.cluster.local.  NXDOMAIN" in out
    assert "found    web.shop.svc.cluster.local.  NOERROR" in out
    assert "CNAME\tweb.shop.svc.cluster.local." in out and "IN\tA\t10.244.1.10" in out

    code, out = run(
        capsys, "--json", *options, "127.0.0.2", "api.example.com.shop.svc.cluster.local"
    )
    data = json.loads(out)
    assert [step["name"] for step in data["autopath"]] == [
        "api.example.com.shop.svc.cluster.local.",
        "api.example.com.svc.cluster.local.",
        "api.example.com.cluster.local.",
        "api.example.com.corp.example.",
    ]
    assert [step["upstream"] for step in data["autopath"]] == [False, False, False, True]
    assert data["rcode"] == "NXDOMAIN"  # the reply to the first name, if no name exists

    # Node locators and unknown clients get the plain answer, without a walk.
    for client in ("127.0.0.5", "10.9.9.9"):
        code, out = run(capsys, *options, client, "web.shop.shop.svc.cluster.local")
        assert "autopath" not in out and "answer: NXDOMAIN" in out


def test_fallthrough_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--fallthrough=in-addr.arpa,ip6.arpa", "--client", "127.0.0.2"]
    code, out = run(capsys, *args, "4.4.8.8.in-addr.arpa", "PTR")
    assert code == 0 and "answer: not in the cluster; the upstreams answer (--fallthrough)" in out
    code, out = run(capsys, "--json", *args, "nothere.shop.svc.cluster.local")
    assert json.loads(out)["fallthrough"] is False and json.loads(out)["rcode"] == "NXDOMAIN"


NAME_CASES = [
    # (id, as typed, labels or the error it gets)
    ("plain", "web.shop.svc.cluster.local", ("web", "shop", "svc", "cluster", "local")),
    ("final dot", "web.cluster.local.", ("web", "cluster", "local")),
    ("case kept", "Web.Cluster.Local", ("Web", "Cluster", "Local")),
    ("service labels", "_http._tcp.web.local", ("_http", "_tcp", "web", "local")),
    ("root", ".", ()),
    ("63-octet label", "a" * 63 + ".local", ("a" * 63, "local")),
    (
        "255 octets on the wire",
        ".".join(["a" * 63] * 3 + ["a" * 61]),
        tuple(["a" * 63] * 3 + ["a" * 61]),
    ),
    ("empty", "", "the name is empty"),
    ("empty label", "web..local", "has an empty label"),
    ("leading dot", ".web.local", "has an empty label"),
    ("two final dots", "web.local..", "has an empty label"),
    ("64-octet label", "a" * 64 + ".local", "is not 1 to 63 printable ASCII characters"),
    ("256 octets on the wire", ".".join(["a" * 63] * 3 + ["a" * 62]), "longer than 255 octets"),
    ("space", "a b.local", "is not 1 to 63 printable ASCII characters"),
    ("backslash escape", "a\\.b.local", "is not 1 to 63 printable ASCII characters"),
    ("not ASCII", "caf\u00e9.local", "is not 1 to 63 printable ASCII characters"),
    ("control character", "a\x00.local", "is not 1 to 63 printable ASCII characters"),
]


@pytest.mark.parametrize(
    "text, expected", [c[1:] for c in NAME_CASES], ids=[c[0] for c in NAME_CASES]
)
def test_parse_name(text: str, expected: tuple[str, ...] | str) -> None:
    if isinstance(expected, tuple):
        assert parse_name(text) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_name(text)


def test_a_long_bad_name_is_cut_short_in_the_message() -> None:
    with pytest.raises(ValueError) as error:
        parse_name("a" * 5000)
    assert len(str(error.value)) < 300


def with_tenant(tmp_path: Path) -> str:
    """examples/topology.yaml and a tenant's PodLocators: one claims client-b's address,
    another a range that holds client-a's."""
    data = yaml.safe_load(Path(TOPOLOGY).read_text())
    z2 = {"kubernetes.io/hostname": "node-c", "topology.kubernetes.io/zone": "z2"}
    data["items"] += [
        objects.pod_locator("grab", "tenant", addresses=["127.0.0.3"], node_labels=z2),
        objects.pod_locator("wide", "tenant", addresses=None, cidrs=["127.0.0.2/31"]),
    ]
    path = tmp_path / "tenant.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_explain_names_the_rule_that_placed_the_client_and_what_it_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snapshot = with_tenant(tmp_path)
    web = "web.shop.svc.cluster.local"
    assert main(["explain", "--snapshot", snapshot, "--client", "127.0.0.3", web]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "client 127.0.0.3: PodLocator toposdns/shop.client-b on node node-b, through its "
        "address 127.0.0.3",
        "  believed: namespace toposdns is in --locator-namespaces=toposdns",
        "  ignored: PodLocator tenant/grab claims 127.0.0.3, but only the PodLocators of "
        "--locator-namespaces=toposdns are believed",
    ]
    assert "  answer     web.shop.svc.cluster.local.\t5\tIN\tA\t10.244.1.10" in lines
    assert main(["explain", "--snapshot", snapshot, "--json", "--client", "127.0.0.2", web]) == 0
    client = json.loads(capsys.readouterr().out)["client"]
    assert client["locator"]["name"] == "shop.client-a"
    assert client["locator"]["pod_namespace"] == "shop"
    assert client["ignored"] == [{"locator": "tenant/wide", "matched": "127.0.0.2/31"}]
    # Believed from every namespace, the tenant's locator places the client.
    args = ["--locator-namespaces=*", "--client", "127.0.0.3", web]
    assert main(["explain", "--snapshot", snapshot, *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        "client 127.0.0.3: PodLocator tenant/grab on node node-a, through its address 127.0.0.3",
        "  believed: --locator-namespaces=* believes the PodLocators of every namespace",
    ]
    assert "  answer     web.shop.svc.cluster.local.\t5\tIN\tA\t10.244.3.10" in lines


SOFT_SNAPSHOT = (
    "- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}\n"
    "- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: shop,\n"
    "   annotations: {%s}},\n"
    "   spec: {clusterIP: None, ports: [{name: http, port: 80, protocol: TCP}],\n"
    "          topologyKeys: [topology.kubernetes.io/zone, '*']}}\n"
    "- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, addressType: IPv4,\n"
    "   metadata: {name: web-1, namespace: shop,\n"
    "              labels: {kubernetes.io/service-name: web}},\n"
    "   ports: [{name: http, port: 80, protocol: TCP}],\n"
    "   endpoints: [{addresses: [10.0.0.1], zone: z1}, {addresses: [10.0.0.2], zone: z2},\n"
    "               {addresses: [10.0.0.3], zone: z2}]}\n"
    "- {apiVersion: toposdns.io/v1alpha1, kind: PodLocator,\n"
    "   metadata: {name: client, namespace: toposdns}, addresses: [10.0.0.9], nodeName: n1,\n"
    "   nodeLabels: {topology.kubernetes.io/zone: z1}}\n"
)


@pytest.mark.parametrize(
    ("annotations", "qtype", "expected"),
    [
        (
            "toposdns.io/topology-min-endpoints: '2'",
            "A",
            [
                "  mode: spill-over to 2 endpoints",
                "  rule: spill-over to 2 endpoints: topology.kubernetes.io/zone + * hold 3",
                "  tiers taken: topology.kubernetes.io/zone, *",
            ],
        ),
        (
            "toposdns.io/topology-srv: priority",
            "SRV",
            [
                "  mode: SRV priorities by tier",
                "    10.0.0.1           priority 0, group 0 shares 100",
                "    10.0.0.2           priority 1, group 1 shares 100",
                "web.shop.svc.cluster.local.\t5\tIN\tSRV\t1 50 80 ",
            ],
        ),
        (
            "toposdns.io/topology-weights: '80,20'",
            "SRV",
            [
                "  mode: weights 80,20",
                "  rule: weighted: topology.kubernetes.io/zone 80, * 20",
                "    10.0.0.3           priority 0, group 1 shares 20",
                "  weights for A/AAAA: 80/100, 20/100 of the replies, in turn (the answer "
                "below: the first turn's)",
            ],
        ),
        (
            "toposdns.io/topology-weights: '80'",
            "A",
            [
                "  ignored: metadata.annotations[toposdns.io/topology-weights]: Invalid value: "
                '"80": must have one weight per tier, 2 for [topology.kubernetes.io/zone, *]',
                "  mode: hard",
                "  rule: topology.kubernetes.io/zone=z1",
            ],
        ),
    ],
)
def test_soft_topology_is_shown(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    annotations: str,
    qtype: str,
    expected: list[str],
) -> None:
    snapshot = tmp_path / "soft.yaml"
    snapshot.write_text(SOFT_SNAPSHOT % annotations)
    args = ["explain", "--snapshot", str(snapshot), "--client", "10.0.0.9"]
    code = main([*args, "web.shop.svc.cluster.local", qtype])
    out = capsys.readouterr().out
    assert code == 0
    for line in expected:
        assert line in out, out
