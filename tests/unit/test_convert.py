"""Raw objects to records: what is kept, what is dropped, and how errors name their cause."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.objects import endpoint, endpoint_slice, pod_locator, service
from toposdns.store.convert import (
    ObjectError,
    _canonical_ipv4,
    _common_endpoint_slice,
    _common_pod_locator,
    convert_checked,
    convert_object,
)
from toposdns.store.model import (
    CLUSTER_IP,
    EXTERNAL_NAME,
    HEADLESS,
    NO_PORT,
    Endpoint,
    EndpointSlice,
    PodLocator,
    Port,
    canonical_ip,
    is_canonical_ipv4,
)

ZONE = {"topology.kubernetes.io/zone": "z1"}


def test_service_kinds() -> None:
    assert convert_object(service(cluster_ip="None")).kind == HEADLESS
    dual = convert_object(
        service(
            cluster_ip="10.0.0.1",
            ports=(),
            clusterIPs=["10.0.0.1", "fd00::1"],
            type="LoadBalancer",
        )
    )
    assert dual.kind == CLUSTER_IP and dual.cluster_ips == ("10.0.0.1", "fd00::1")
    assert dual.ports == (NO_PORT,)
    ext = convert_object(
        service(cluster_ip=None, ports=(), type="ExternalName", externalName="example.org")
    )
    assert ext.kind == EXTERNAL_NAME and ext.external_name == "example.org"


def test_topology_fields() -> None:
    svc = convert_object(
        service(
            cluster_ip="None",
            annotations={"toposdns.io/topology-keys": "topology.kubernetes.io/zone, *"},
            topologyKeys=["kubernetes.io/hostname", "*"],
            trafficDistribution="PreferClose",
        )
    )
    assert svc.topology_keys == ("kubernetes.io/hostname", "*")
    assert svc.topology_annotation == ("topology.kubernetes.io/zone", "*")
    assert svc.traffic_distribution == "PreferClose"


def test_endpoint_slice_keeps_only_ready_endpoints() -> None:
    eps = convert_object(
        {
            **endpoint_slice(
                endpoints=[
                    {
                        "addresses": ["10.1.0.1"],
                        "hostname": "web-0",
                        "nodeName": "n1",
                        "zone": "z1",
                        "targetRef": {"kind": "Pod", "name": "web-0"},
                        "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "n1"}]},
                    },
                    {"addresses": ["10.1.0.2"], "conditions": {"ready": False}},
                    {"addresses": ["10.1.0.3"], "conditions": {"ready": None}},
                ]
            ),
            "ports": [{"name": "http", "port": 80}],  # no protocol: TCP, as the API defaults it
        }
    )
    assert [ep.addresses for ep in eps.endpoints] == [("10.1.0.1",), ("10.1.0.3",)]
    first = eps.endpoints[0]
    assert (first.hostname, first.pod_name, first.node_name, first.zone, first.hint_zones) == (
        "web-0",
        "web-0",
        "n1",
        "z1",
        ("z1",),
    )
    assert first.hint_nodes == ("n1",) and eps.endpoints[1].hint_nodes is None
    assert eps.ports[0].protocol == "TCP"


def test_pod_locator() -> None:
    locator = convert_object(
        pod_locator("node-a", "toposdns", addresses=["192.168.0.10"], node_labels=ZONE, role="node")
    )
    assert isinstance(locator, PodLocator) and locator.is_node
    assert locator.node_labels == {"topology.kubernetes.io/zone": "z1"}


def node_locator(cidrs: Any) -> dict[str, Any]:
    return pod_locator("node-a", "toposdns", addresses=None, cidrs=cidrs)


def test_locator_cidrs_in_canonical_form() -> None:
    locator = convert_object(node_locator(["10.244.3.0/24", "FD00:10:244:3:0::/64", "10.0.0.0/8"]))
    assert isinstance(locator, PodLocator) and locator.addresses == ()
    assert locator.cidrs == ("10.244.3.0/24", "fd00:10:244:3::/64", "10.0.0.0/8")
    # Loopback is allowed outside the CRD, as for addresses: one machine plays the clients.
    assert convert_object(node_locator(["127.3.0.0/24"])).cidrs == ("127.3.0.0/24",)


CIDR_ERRORS = {
    "host bits": (
        "10.244.3.7/24",
        "'10.244.3.7/24' has host bits set; the network is 10.244.3.0/24",
    ),
    "IPv6 host bits": (
        "fd00:10:244:3::1/64",
        "'fd00:10:244:3::1/64' has host bits set; the network is fd00:10:244:3::/64",
    ),
    "no length": ("10.244.3.0", "not a CIDR: '10.244.3.0'; write a network and its prefix length"),
    "bad length": ("10.244.3.0/33", "not a CIDR: '10.244.3.0/33'"),
    "leading zero": ("10.244.3.0/024", "not a CIDR: '10.244.3.0/024'"),
    "zone": ("fd00::%eth0/64", "not a CIDR: 'fd00::%eth0/64'"),
    "not an address": ("node-a/24", "not a CIDR: 'node-a/24'"),
    "too short": ("8.0.0.0/7", "'8.0.0.0/7' is shorter than /8: give the node's own pod range"),
    "IPv6 too short": ("fd00::/16", "'fd00::/16' is shorter than /32"),
    "multicast": ("224.0.0.0/24", "'224.0.0.0/24' is not a unicast range: it is multicast"),
    "IPv6 multicast": ("ff02::/64", "'ff02::/64' is not a unicast range: it is multicast"),
    "unspecified": ("0.0.0.0/8", "'0.0.0.0/8' is not a unicast range: it is unspecified"),
    "IPv6 unspecified": ("::/32", "'::/32' is not a unicast range: it is unspecified"),
    "link-local": ("169.254.0.0/16", "'169.254.0.0/16' is not a unicast range: it is link-local"),
    "holding link-local": ("169.0.0.0/8", "'169.0.0.0/8' is not a unicast range: it is link-local"),
    "IPv6 link-local": ("fe80::/64", "'fe80::/64' is not a unicast range: it is link-local"),
    "IPv4-mapped": (
        "::ffff:10.0.0.0/104",
        "'::ffff:10.0.0.0/104' is not a unicast range: it is IPv4-mapped",
    ),
    "not a string": (167772160, "must be a string, got int"),
}


@pytest.mark.parametrize(("cidr", "message"), CIDR_ERRORS.values(), ids=CIDR_ERRORS.keys())
def test_locator_cidr_errors(cidr: Any, message: str) -> None:
    with pytest.raises(ObjectError) as info:
        convert_object(node_locator(["10.244.1.0/24", cidr]))
    assert str(info.value).startswith(f"PodLocator toposdns/node-a: cidrs[1]: {message}")


#: Malformed objects, and the start of the message that names each one's object and field.
ERRORS: list[tuple[dict[str, Any], str]] = [
    (
        node_locator("10.244.3.0/24"),
        "PodLocator toposdns/node-a: cidrs: must be a list, got str",
    ),
    (
        endpoint_slice(endpoints=[{"addresses": ["not-an-ip"]}]),
        "EndpointSlice shop/web-1: endpoints[0].addresses[0]: not an IP address: 'not-an-ip'",
    ),
    (
        endpoint_slice(
            endpoints=[{"addresses": ["10.1.0.1"]}, {"addresses": ["10.1.0.2", "10.1.0.300"]}]
        ),
        "EndpointSlice shop/web-1: endpoints[1].addresses[1]: not an IP address",
    ),
    (
        endpoint_slice(
            endpoints=[{"addresses": ["10.1.0.1"]}] * 2
            + [{"addresses": ["10.1.0.3"], "hints": {"forZones": [{"name": 7}]}}]
        ),
        "EndpointSlice shop/web-1: endpoints[2].hints.forZones[0].name: must be a string, got int",
    ),
    (
        endpoint_slice(
            endpoints=[{"addresses": ["10.1.0.1"], "hints": {"forZones": [{"name": "a"}, "b"]}}]
        ),
        "EndpointSlice shop/web-1: endpoints[0].hints.forZones[1]: must be a mapping",
    ),
    (
        endpoint_slice(
            endpoints=[{"addresses": ["10.1.0.1"], "hints": {"forNodes": [{"name": 1}]}}]
        ),
        "EndpointSlice shop/web-1: endpoints[0].hints.forNodes[0].name: must be a string",
    ),
    (
        endpoint_slice(
            endpoints=[{"addresses": ["10.1.0.1"], "hints": {"forZones": {"name": "a"}}}]
        ),
        "EndpointSlice shop/web-1: endpoints[0].hints.forZones: must be a list, got dict",
    ),
    (
        service(cluster_ip="10.0.0.1", clusterIPs=["10.0.0.1", "fd00::1:x"]),
        "Service shop/web: spec.clusterIPs[1]: not an IP address: 'fd00::1:x'",
    ),
    (
        service(cluster_ip="None", topologyKeys=["kubernetes.io/hostname", 5]),
        "Service shop/web: spec.topologyKeys[1]: must be a string, got int",
    ),
    (
        service(cluster_ip="None", annotations={"toposdns.io/topology-keys": ["a"]}),
        "Service shop/web: metadata.annotations[toposdns.io/topology-keys]: must be a string",
    ),
    (
        pod_locator(addresses=["10.1.0.1", "10.1.0.256"], node_name=None),
        "PodLocator shop/web-0: addresses[1]: not an IP address: '10.1.0.256'",
    ),
    (
        endpoint_slice(address_type="IPv5"),
        "EndpointSlice shop/web-1: addressType: unknown addressType 'IPv5'",
    ),
    (
        service(cluster_ip=None, clusterIP="10.0.0.300"),  # from before dual-stack
        "Service shop/web: spec.clusterIP: not an IP address: '10.0.0.300'",
    ),
    (
        service(cluster_ip=None, type="Bogus"),
        "Service shop/web: spec.type: unknown service type 'Bogus'",
    ),
    (
        service(cluster_ip=None, ports=(), type="ExternalName"),
        "Service shop/web: spec.externalName: is required",
    ),
    (
        service(cluster_ip="10.0.0.1", ports=[{"port": "80"}]),
        "Service shop/web: spec.ports[0].port: not a port number: '80'",
    ),
    (
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}},
        "Pod p: apiVersion/kind: unsupported v1/Pod",
    ),
    (
        {**service(cluster_ip="10.0.0.1"), "metadata": {"name": "web"}},
        "Service web: metadata.namespace: is required",
    ),
]


@pytest.mark.parametrize(("raw", "message"), ERRORS)
def test_errors_name_object_and_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError) as info:
        convert_object(raw)
    assert str(info.value).startswith(message)


def common(**fields: Any) -> dict[str, Any]:
    """A per-pod PodLocator of the common shape, with `fields` given to the builder."""
    return pod_locator(**{"role": "pod", "node_labels": ZONE, **fields})


#: What the common shape converts to.
COMMON = PodLocator("shop", "web-0", ("10.1.0.1",), "node-a", ZONE)

#: The common shape and its near relatives, some of which only the field-by-field checks take:
#: both paths give the same record.
LOCATOR_SHAPES = {
    "common": (common(), COMMON),
    "no labels": (common(role=None), COMMON),
    "node": (
        common(name="n", namespace="t", role="node"),
        COMMON.replace(namespace="t", name="n", is_node=True),
    ),
    "no node name": (common(node_name=None), COMMON.replace(node_name="")),
    "no addresses": (common(addresses=[]), COMMON.replace(addresses=())),
    "empty cidrs": (common(cidrs=[]), COMMON),
    "IPv6 made canonical": (
        common(addresses=["10.1.0.1", "fd00:0::1"]),
        COMMON.replace(addresses=("10.1.0.1", "fd00::1")),
    ),
    "cidrs": (common(cidrs=["10.244.3.0/24"]), COMMON.replace(cidrs=("10.244.3.0/24",))),
    "no node labels": (common(node_labels=None), COMMON.replace(node_labels={})),
    # As the controller writes pod locators: in its namespace, saying the pod's.
    "its pod's namespace": (
        common(namespace="toposdns", labels={"toposdns.io/pod-namespace": "shop"}),
        COMMON.replace(namespace="toposdns", pod_namespace="shop"),
    ),
    "its pod's namespace, with cidrs": (
        common(labels={"toposdns.io/pod-namespace": "other"}, cidrs=["10.244.3.0/24"]),
        COMMON.replace(pod_namespace="other", cidrs=("10.244.3.0/24",)),
    ),
    "its pod's namespace empty": (
        common(labels={"toposdns.io/pod-namespace": ""}),
        COMMON,
    ),
}


@pytest.mark.parametrize(("raw", "want"), LOCATOR_SHAPES.values(), ids=LOCATOR_SHAPES.keys())
def test_pod_locator_shapes(raw: dict[str, Any], want: PodLocator) -> None:
    got = convert_object(raw)
    assert isinstance(got, PodLocator)
    assert got == want and got.labels == want.labels
    assert got.namespace_of_pod == (want.pod_namespace or want.namespace)


def test_locators_of_a_node_share_its_labels_whichever_path_converts_them() -> None:
    plain = convert_object(common(node_labels={"zone": "shared"}))
    checked = convert_object(common(node_labels={"zone": "shared"}, addresses=["fd00::1"]))
    assert isinstance(plain, PodLocator) and isinstance(checked, PodLocator)
    assert plain.node_labels is checked.node_labels and plain.labels is checked.labels


def test_a_node_whose_labels_change_gives_its_next_locators_the_new_labels() -> None:
    before = convert_object(common(node_name="node-l", node_labels={"zone": "z1"}))
    after = convert_object(common(node_name="node-l", node_labels={"zone": "z2"}))
    assert isinstance(before, PodLocator) and isinstance(after, PodLocator)
    assert before.node_labels == {"zone": "z1"} and after.node_labels == {"zone": "z2"}
    assert after.labels == {"zone": "z2", "(nodeName)": "node-l"}


#: Shapes the common path must hand on to the field-by-field checks, for their message.
LOCATOR_ERRORS = {
    "address not a string": (common(addresses=[7]), "addresses[0]: must be a string, got int"),
    "address with NUL": (common(addresses=["10.1.0.1\0"]), "addresses[0]: not an IP address"),
    "addresses not a list": (
        common(addresses="10.1.0.1"),
        "addresses: must be a list, got str",
    ),
    "node name not a string": (common(nodeName=3), "nodeName: must be a string, got int"),
    "label value": (
        common(node_labels={"zone": 1}),
        "nodeLabels[zone]: must be a string, got int",
    ),
    "cidrs not a list": (common(cidrs=""), "cidrs: must be a list, got str"),
    "pod namespace not a string": (
        common(labels={"toposdns.io/pod-namespace": 7}),
        "metadata.labels[toposdns.io/pod-namespace]: must be a string, got int",
    ),
    "metadata labels": (
        common(metadata={"name": "web-0", "namespace": "shop", "labels": []}),
        "metadata.labels: must be a mapping, got list",
    ),
    "empty name": (
        common(name=""),
        "metadata.name: must not be empty",
    ),
    "wrong version": (
        common(apiVersion="toposdns.io/v1"),
        "apiVersion/kind: unsupported toposdns.io/v1/PodLocator",
    ),
}


@pytest.mark.parametrize(("raw", "message"), LOCATOR_ERRORS.values(), ids=LOCATOR_ERRORS.keys())
def test_unusual_pod_locators_are_checked_field_by_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ObjectError, match=re.escape(message)):
        convert_object(raw)


def converted(convert: Any, raw: dict[str, Any]) -> Any:
    """What `convert` gives for `raw`: its record, or its error message."""
    try:
        return convert(raw)
    except ObjectError as exc:
        return str(exc)


#: Which PodLocator shapes of the tables above the fast path takes.
LOCATOR_FAST = {
    "common",
    "no labels",
    "node",
    "no node name",
    "no addresses",
    "empty cidrs",
    "its pod's namespace",  # every pod locator the controller writes
    "its pod's namespace empty",
}


@pytest.mark.parametrize(
    "name", [*LOCATOR_SHAPES, *LOCATOR_ERRORS], ids=[*LOCATOR_SHAPES, *LOCATOR_ERRORS]
)
def test_pod_locator_fast_path_gives_what_the_checks_give(name: str) -> None:
    raw = LOCATOR_SHAPES[name][0] if name in LOCATOR_SHAPES else LOCATOR_ERRORS[name][0]
    assert (_common_pod_locator(raw) is not None) is (name in LOCATOR_FAST)
    assert converted(convert_object, raw) == converted(convert_checked, raw)


POD = {"kind": "Pod", "namespace": "shop", "name": "web-0", "uid": "u"}


def common_slice(*endpoints: Any, **fields: Any) -> dict[str, Any]:
    """An EndpointSlice of the common shape: one ready endpoint on node-a unless `endpoints`
    are given; top-level `fields` replaced as given (None: removed)."""
    default = endpoint("10.1.0.1", nodeName="node-a", zone="z1", targetRef=POD)
    raw = endpoint_slice(endpoints=list(endpoints) or [default]) | fields
    return {key: value for key, value in raw.items() if value is not None}


READY = {"addresses": ["10.1.0.2"]}

#: EndpointSlices the fast path takes (True) or hands on to the field-by-field checks (False),
#: valid and malformed: `convert_object` must give what `convert_checked` gives, record or error.
SLICE_SHAPES: dict[str, tuple[dict[str, Any], bool]] = {
    "common": (common_slice(), True),
    "no ports": (common_slice(ports=None), True),
    "empty ports": (common_slice(ports=[]), True),
    "port of every field": (
        common_slice(ports=[{"name": "dns", "protocol": "UDP", "port": 53}]),
        True,
    ),
    "port without protocol": (common_slice(ports=[{"name": "http", "port": 80}]), True),
    "port without number": (common_slice(ports=[{"name": "all"}]), False),
    "no endpoints": (common_slice(endpoints=[]), True),
    "bare endpoint": (common_slice(READY), True),
    "endpoint without addresses": (common_slice({}), False),
    "not ready, else malformed": (
        common_slice(READY, {"addresses": 7, "conditions": {"ready": False}}),
        True,
    ),
    "ready unknown": (common_slice({**READY, "conditions": {"ready": None}}), True),
    "hostname": (common_slice({**READY, "hostname": "web-0"}), True),
    "long pod name": (common_slice({**READY, "targetRef": {"name": "p" * 64}}), True),
    "hints": (common_slice({**READY, "hints": {"forZones": [{"name": "z1"}]}}), False),
    "IPv6": (common_slice({"addresses": ["fd00:0::1"]}, addressType="IPv6"), False),
    "FQDN": (common_slice({"addresses": ["a.example"]}, addressType="FQDN"), False),
    "address not canonical": (common_slice({"addresses": ["10.1.0.01"]}), False),
    "no service label": (common_slice(metadata={"name": "w", "namespace": "shop"}), False),
    # Malformed: the checks refuse them and say where.
    "address not a string": (common_slice({"addresses": [7]}), False),
    "address not an address": (common_slice({"addresses": ["10.1.0.1\0"]}), False),
    "addresses not a list": (common_slice({"addresses": "10.1.0.1"}), False),
    "endpoint not a mapping": (common_slice(endpoints=[READY, "10.1.0.1"]), False),
    "endpoints not a list": (common_slice(endpoints={}), False),
    "conditions not a mapping": (common_slice({**READY, "conditions": []}), False),
    "node name not a string": (common_slice({**READY, "nodeName": 1}), False),
    "zone not a string": (common_slice({**READY, "zone": ["z1"]}), False),
    "hostname not a string": (common_slice({**READY, "hostname": 1}), False),
    "targetRef not a mapping": (common_slice({**READY, "targetRef": "web-0"}), False),
    "pod name not a string": (common_slice({**READY, "targetRef": {"name": 1}}), False),
    "port a bool": (common_slice(ports=[{"port": True}]), False),
    "port too large": (common_slice(ports=[{"port": 65536}]), False),
    "port not a mapping": (common_slice(ports=[80]), False),
    "ports not a list": (common_slice(ports={"port": 80}), False),
    "port name not a string": (common_slice(ports=[{"name": 1, "port": 80}]), False),
    "protocol not a string": (common_slice(ports=[{"protocol": 6, "port": 80}]), False),
    "service label not a string": (
        common_slice(
            metadata={"name": "w", "namespace": "s", "labels": {"kubernetes.io/service-name": 1}}
        ),
        False,
    ),
    "empty name": (common_slice(metadata={"name": "", "namespace": "shop"}), False),
    "no namespace": (common_slice(metadata={"name": "w"}), False),
    "unknown address type": (common_slice(addressType="IPv5"), False),
    "wrong version": (common_slice(apiVersion="discovery.k8s.io/v1beta1"), False),
}


@pytest.mark.parametrize("pod_names", [True, False])
@pytest.mark.parametrize(("raw", "fast"), SLICE_SHAPES.values(), ids=SLICE_SHAPES.keys())
def test_endpoint_slice_fast_path_gives_what_the_checks_give(
    raw: dict[str, Any], fast: bool, pod_names: bool
) -> None:
    assert (_common_endpoint_slice(raw, pod_names) is not None) is fast
    assert converted(lambda r: convert_object(r, pod_names), raw) == converted(
        lambda r: convert_checked(r, pod_names), raw
    )


@pytest.mark.parametrize("raw", [s for s, _ in SLICE_SHAPES.values()], ids=SLICE_SHAPES.keys())
def test_endpoints_keep_their_pod_name_only_when_asked(raw: dict[str, Any]) -> None:
    """Without `pod_names` every endpoint is the same but for its pod name, and a malformed
    targetRef is refused all the same."""
    kept, dropped = (
        converted(convert_object, raw),
        converted(lambda r: convert_object(r, False), raw),
    )
    if isinstance(kept, str):
        assert dropped == kept
        return
    assert [ep.pod_name for ep in dropped.endpoints] == [""] * len(kept.endpoints)
    assert dropped.endpoints == tuple(
        Endpoint(
            ep.addresses,
            ep.hostname,
            "",
            ep.node_name,
            ep.zone,
            ep.hint_zones,
            ep.hint_nodes,
        )
        for ep in kept.endpoints
    )
    assert (dropped.namespace, dropped.name, dropped.ports) == (
        kept.namespace,
        kept.name,
        kept.ports,
    )


def test_endpoint_slice_fast_path_record() -> None:
    assert convert_object(common_slice()) == EndpointSlice(
        "shop",
        "web-1",
        "web",
        (Port("http", "TCP", 80),),
        (Endpoint(("10.1.0.1",), pod_name="web-0", node_name="node-a", zone="z1"),),
    )


def ipaddress_canonical(text: str) -> str | None:
    """What `ipaddress` makes of `text`: its canonical form, or None if not an address."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


#: IPv4 addresses written every way but the canonical one, near misses, and canonical ones.
IPV4_FORMS = [
    "10.1.0.01", "010.1.0.1", "10.01.0.1", "00.1.2.3", "1.2.3.00", "10.1.0.1.", ".10.1.0.1",
    "10.1..1", "10.1.0", "10.1.0.1.2", "10.1.0.256", "0x0a.1.0.1", "1e1.1.0.1", "4294967295",
    "10.1.0.1 ", " 10.1.0.1", "10.1.0.1\0", "10.1.0.+1", "10.1.0.-1", "١٠.1.0.1",
    "::ffff:10.1.0.1", "0.0.0.0", "255.255.255.255", "10.1.0.1", "1.2.3.4",
]  # fmt: skip
OCTETS = st.one_of(st.integers(0, 300).map(str), st.from_regex(r"0[0-9]{1,2}", fullmatch=True))


def check_canonical_ipv4(text: str) -> None:
    """The C library's verdict on `text` (and the fast paths' inline copy of it) is that of
    `ipaddress`, and `canonical_ip` gives what `ipaddress` gives."""
    canonical = ipaddress_canonical(text)
    assert is_canonical_ipv4(text) is (canonical == text and "." in text)
    assert _canonical_ipv4([text]) is is_canonical_ipv4(text)
    if canonical is None:
        with pytest.raises(ValueError):
            canonical_ip(text)
    else:
        assert canonical_ip(text) == canonical


@pytest.mark.parametrize("text", IPV4_FORMS)
def test_the_c_library_takes_only_canonical_ipv4(text: str) -> None:
    check_canonical_ipv4(text)


@given(
    st.lists(OCTETS, min_size=3, max_size=5).map(".".join) | st.text("0123456789.x ", max_size=16)
)
def test_canonical_ipv4_agrees_with_ipaddress(text: str) -> None:
    check_canonical_ipv4(text)
