"""Static checks of `manifests/`: every file parses, every object validates against the Kubernetes
API schemas, the kustomizations hold together, the PodLocator schema accepts good locators and
rejects bad ones, and the workloads get exactly the rights, ports, probes and hardening they need.

Built-in kinds are checked with kubernetes-validate (the newest Kubernetes it bundles, strict: no
unknown fields). The CRD's own schema is applied to PodLocators here by a small validator for the
OpenAPI keywords it uses, and its CEL rules are evaluated with cel-python, with the Kubernetes IP
functions they call written after the Kubernetes CEL library's documented behaviour.
"""

from __future__ import annotations

import copy
import functools
import ipaddress
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes

from tests.coredns_forwarder import shown_corefile
from tests.objects import pod_locator
from toposdns.cli import build_parser, given_flags
from toposdns.config import PLUGINS, Reading
from toposdns.controller.config import LeaseSettings
from toposdns.corefile import expand, lex, read_corefile, server_blocks
from toposdns.kube.resources import POD_LOCATOR

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
FORWARD = MANIFESTS / "coredns-forward"
KUBEADM = MANIFESTS / "kubeadm"
K8S_VERSION = kubernetes_validate.latest_version()
IMAGE = "ghcr.io/toposdns/toposdns:0.1.0"

Doc = dict[str, Any]


# --- loading and a small Kustomize -------------------------------------------------------------


def load(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


YAML_FILES = sorted(MANIFESTS.rglob("*.yaml"))
KUSTOMIZATION_FILES = [path for path in YAML_FILES if path.name == "kustomization.yaml"]
#: The Prometheus Operator's kinds have no schema in kubernetes-validate;
#: tests/integration/test_alerts.py checks them (promtool, and the ServiceMonitor's selector).
MONITORING = MANIFESTS / "monitoring"
RESOURCE_FILES = [
    path for path in YAML_FILES if path.name != "kustomization.yaml" and path.parent != MONITORING
]


def rel(path: Path) -> str:
    return str(path.relative_to(MANIFESTS))


def object_id(doc: Doc) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


def render(directory: Path) -> list[Doc]:
    """What `kubectl kustomize DIRECTORY` outputs, for the features these kustomizations use."""
    kustomization = load(directory / "kustomization.yaml")[0]
    unsupported = set(kustomization) - {"apiVersion", "kind", "resources", "patches", "images"}
    assert not unsupported, f"{rel(directory)}: teach render() about {sorted(unsupported)}"
    docs: list[Doc] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        docs.extend(render(path) if path.is_dir() else load(path))
    for patch in kustomization.get("patches", []):
        docs = apply_patch(docs, patch)
    for image in kustomization.get("images", []):
        docs = [swap_image(doc, image) for doc in docs]
    ids = [object_id(doc) for doc in docs]
    assert len(ids) == len(set(ids)), f"{rel(directory)}: an object is defined twice"
    return docs


def swap_image(doc: Doc, image: Doc) -> Doc:
    """Kustomize's `images` entry: containers running `name` (any tag) run `newName:newTag`."""
    assert set(image) <= {"name", "newName", "newTag"}, f"unsupported image form: {image}"
    containers = doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", [])
    if not any(c["image"].rpartition(":")[0] == image["name"] for c in containers):
        return doc
    doc = copy.deepcopy(doc)
    for container in doc["spec"]["template"]["spec"]["containers"]:
        if container["image"].rpartition(":")[0] == image["name"]:
            container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return doc


def apply_patch(docs: list[Doc], patch: Doc) -> list[Doc]:
    assert set(patch) <= {"patch", "target"}, f"unsupported patch form: {sorted(patch)}"
    body = yaml.safe_load(patch["patch"])
    if isinstance(body, dict):  # a strategic-merge patch; only deletions are used here
        assert body.pop("$patch") == "delete", "only `$patch: delete` merge patches are supported"
        gone = object_id(body)
        assert gone in {object_id(doc) for doc in docs}, f"nothing to delete for {gone}"
        return [doc for doc in docs if object_id(doc) != gone]
    target = patch["target"]
    matched = [doc for doc in docs if matches_target(doc, target)]
    assert len(matched) == 1, f"patch target {target} matches {len(matched)} objects"
    out = []
    for doc in docs:
        if doc is matched[0]:
            doc = copy.deepcopy(doc)
            for operation in body:
                json_patch(doc, operation)
        out.append(doc)
    return out


def matches_target(doc: Doc, target: Doc) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    actual = {
        "group": group,
        "version": version,
        "kind": doc["kind"],
        "name": doc["metadata"]["name"],
        "namespace": doc["metadata"].get("namespace", ""),
    }
    return all(actual[key] == value for key, value in target.items())


def json_patch(doc: Doc, operation: Doc) -> None:
    """One RFC 6902 operation: add, remove or replace."""
    *parents, last = [
        token.replace("~1", "/").replace("~0", "~") for token in operation["path"].split("/")[1:]
    ]
    node: Any = doc
    for token in parents:
        node = node[int(token)] if isinstance(node, list) else node[token]
    op = operation["op"]
    if isinstance(node, list):
        if op == "add" and last == "-":
            node.append(operation["value"])
        elif op == "add":
            node.insert(int(last), operation["value"])
        elif op == "remove":
            del node[int(last)]
        else:
            assert op == "replace", op
            node[int(last)] = operation["value"]
    elif op == "remove":
        del node[last]
    else:
        assert op in ("add", "replace"), op
        assert op == "add" or last in node, f"replace of missing {operation['path']}"
        node[last] = operation["value"]


@functools.cache
def rendered(directory: Path) -> tuple[Doc, ...]:
    return tuple(render(directory))


KUSTOMIZE_DIRECTORIES = sorted(path.parent for path in KUSTOMIZATION_FILES)


@functools.cache
def kustomize(directory: Path) -> tuple[Doc, ...]:
    """What `kubectl kustomize DIRECTORY` prints (the real Kustomize, built into kubectl)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (it carries Kustomize)")
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl kustomize {rel(directory)}: {done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc is not None)


def find(docs: tuple[Doc, ...], kind: str, name: str) -> Doc:
    found = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def full() -> tuple[Doc, ...]:
    return rendered(MANIFESTS)


def dns_deployment(docs: tuple[Doc, ...] | None = None) -> Doc:
    return find(docs or full(), "Deployment", "toposdns")


def controller_deployment() -> Doc:
    return find(full(), "Deployment", "toposdns-controller")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


# --- every file parses and validates ------------------------------------------------------------


def test_manifest_files_exist() -> None:
    assert RESOURCE_FILES and KUSTOMIZATION_FILES
    assert not list(MANIFESTS.rglob("*.yml")), "use the .yaml extension"


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_yaml_parses(path: Path) -> None:
    docs = load(path)
    assert docs, f"{rel(path)} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)
        assert doc.get("apiVersion") and doc.get("kind")
        if path.name != "kustomization.yaml":
            assert doc["metadata"]["name"]


def check_schema(doc: Doc) -> None:
    # Raises (and so fails) on an invalid object and on a kind it has no schema for.
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{doc['kind']} {doc['metadata']['name']}: {error.message}")


@pytest.mark.parametrize("path", RESOURCE_FILES, ids=rel)
def test_validates_against_kubernetes_schema(path: Path) -> None:
    for doc in load(path):
        check_schema(doc)


OVERLAYS = [MANIFESTS, FORWARD, KUBEADM]
OVERLAY_IDS = ["root", "coredns-forward", "kubeadm"]


@pytest.mark.parametrize("directory", OVERLAYS, ids=OVERLAY_IDS)
def test_rendered_objects_validate(directory: Path) -> None:
    # The overlay's patches produce objects no file holds.
    for doc in rendered(directory):
        check_schema(doc)


@pytest.mark.parametrize("directory", KUSTOMIZE_DIRECTORIES, ids=lambda path: rel(path) or "root")
def test_kubectl_kustomize_renders(directory: Path) -> None:
    docs = kustomize(directory)
    assert docs
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pass  # a custom resource (the Prometheus operator's); its own test checks it
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{rel(directory)}: {doc['kind']} {doc['metadata']['name']}: {error}")
    # The small Kustomize above, which the other tests read, renders the same objects.
    features = set(load(directory / "kustomization.yaml")[0])
    if features <= {"apiVersion", "kind", "resources", "patches"}:
        assert sorted(docs, key=object_id) == sorted(render(directory), key=object_id)


def test_validation_is_strict() -> None:
    # The check above must catch what the API server's strict field validation rejects.
    service = copy.deepcopy(find(full(), "Service", "kube-dns"))
    service["spec"]["ports"][0]["protocl"] = "UDP"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, K8S_VERSION, strict=True)


# --- the kustomizations -----------------------------------------------------------------------


@pytest.mark.parametrize("path", KUSTOMIZATION_FILES, ids=rel)
def test_kustomization_resources_exist(path: Path) -> None:
    kustomization = load(path)[0]
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    for entry in kustomization["resources"]:
        target = path.parent / entry
        assert target.is_file() or (target / "kustomization.yaml").is_file(), f"{entry} missing"


def test_every_manifest_file_is_in_a_kustomization() -> None:
    referenced = {
        (path.parent / entry).resolve()
        for path in KUSTOMIZATION_FILES
        for entry in load(path)[0]["resources"]
    }
    missing = [rel(path) for path in RESOURCE_FILES if path.resolve() not in referenced]
    assert not missing, f"not referenced by any kustomization.yaml: {missing}"


def test_root_kustomization_installs_everything() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for doc in full()}
    assert kinds == {
        ("CustomResourceDefinition", "podlocators.toposdns.io"),
        ("ClusterRole", "toposdns-podlocators-view"),
        ("ServiceAccount", "toposdns"),
        ("ClusterRole", "toposdns"),
        ("ClusterRoleBinding", "toposdns"),
        ("Deployment", "toposdns"),
        ("PodDisruptionBudget", "toposdns"),
        ("Service", "kube-dns"),
        ("Namespace", "toposdns"),
        ("ServiceAccount", "toposdns-controller"),
        ("ClusterRole", "toposdns-controller"),
        ("ClusterRoleBinding", "toposdns-controller"),
        ("Role", "toposdns-controller-leader-election"),
        ("RoleBinding", "toposdns-controller-leader-election"),
        ("Deployment", "toposdns-controller"),
        ("PodDisruptionBudget", "toposdns-controller"),
    }


CLUSTER_SCOPED = {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Namespace"}


@pytest.mark.parametrize("directory", [MANIFESTS, FORWARD], ids=["root", "coredns-forward"])
def test_namespaces(directory: Path) -> None:
    docs = rendered(directory)
    created = {doc["metadata"]["name"] for doc in docs if doc["kind"] == "Namespace"}
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        if doc["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{doc['kind']} is cluster-scoped"
            continue
        # Set on every object: the kustomizations add no namespace transformer.
        assert namespace in {"kube-system"} | created, object_id(doc)
        component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
        if component == "controller":
            assert namespace == "toposdns"
        else:
            assert namespace == "kube-system"


def test_all_objects_carry_the_recommended_labels() -> None:
    for doc in full():
        labels = doc["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/name") == "toposdns", object_id(doc)
        assert labels.get("app.kubernetes.io/part-of") == "toposdns", object_id(doc)


# --- the PodLocator CRD ---------------------------------------------------------------------------


def crd() -> Doc:
    return find(full(), "CustomResourceDefinition", "podlocators.toposdns.io")


def crd_version() -> Doc:
    versions = crd()["spec"]["versions"]
    assert len(versions) == 1
    return versions[0]


def locator_schema() -> Doc:
    return crd_version()["schema"]["openAPIV3Schema"]


def test_crd_names() -> None:
    spec = crd()["spec"]
    assert spec["group"] == "toposdns.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "PodLocator"
    assert spec["names"]["plural"] == "podlocators"
    assert spec["names"]["singular"] == "podlocator"
    assert "pl" in spec["names"]["shortNames"]
    version = crd_version()
    assert version["name"] == "v1alpha1"
    assert version["served"] is True and version["storage"] is True


def test_the_code_names_the_crd_it_ships() -> None:
    spec = crd()["spec"]
    names = (spec["group"], crd_version()["name"], spec["names"]["kind"], spec["names"]["plural"])
    assert names == (POD_LOCATOR.group, POD_LOCATOR.version, POD_LOCATOR.kind, POD_LOCATOR.plural)


def test_crd_fields_are_top_level() -> None:
    properties = locator_schema()["properties"]
    assert set(properties) == {
        "apiVersion",
        "kind",
        "metadata",
        "addresses",
        "cidrs",
        "nodeName",
        "nodeLabels",
    }
    assert properties["addresses"]["type"] == "array"
    assert properties["addresses"]["items"]["type"] == "string"
    assert 2 <= properties["addresses"]["maxItems"] <= 16
    assert properties["cidrs"]["items"]["type"] == "string"
    assert properties["nodeName"]["type"] == "string"
    assert properties["nodeLabels"]["additionalProperties"]["type"] == "string"


def test_crd_rules_are_present() -> None:
    properties = locator_schema()["properties"]
    address_rules = [
        rule["rule"] for rule in properties["addresses"]["items"]["x-kubernetes-validations"]
    ]
    assert any("isIP(self)" in rule for rule in address_rules)
    assert any("isGlobalUnicast()" in rule for rule in address_rules)
    key_rules = [rule["rule"] for rule in properties["nodeLabels"]["x-kubernetes-validations"]]
    assert key_rules and all(rule.startswith("self.all(k, ") for rule in key_rules)
    for rules in (properties["addresses"]["items"], properties["nodeLabels"]):
        assert all(rule.get("message") for rule in rules["x-kubernetes-validations"])


def jsonpath_fields(expression: str) -> list[str]:
    """The field names of a simple Kubernetes JSONPath (client-go util/jsonpath's parsing).

    `.a.b` is two fields; a backslash makes the next character literal (`\\.` does not split);
    `['x']` is parsed again as `.x`, so dots inside brackets split too unless escaped.
    """
    fields: list[str] = []
    i = 0
    while i < len(expression):
        if expression[i] == "[":
            end = expression.index("]", i)
            key = re.fullmatch(r"'([^']*)'", expression[i + 1 : end])
            assert key, f"unsupported JSONPath element {expression[i : end + 1]!r}"
            fields.extend(jsonpath_fields("." + key.group(1)))
            i = end + 1
            continue
        assert expression[i] == ".", f"unsupported JSONPath {expression!r}"
        i += 1
        field = ""
        while i < len(expression) and expression[i] not in ".[":
            if expression[i] == "\\":
                i += 1
            field += expression[i]
            i += 1
        fields.append(field)
    return fields


def test_jsonpath_parsing_matches_kubernetes() -> None:
    assert jsonpath_fields(".a['b.c']") == ["a", "b", "c"]
    assert jsonpath_fields(".a['b\\.c']") == ["a", "b.c"]
    assert jsonpath_fields(".a.b\\.c/d") == ["a", "b.c/d"]


GOOD_LOCATOR: Doc = pod_locator(
    addresses=["10.244.1.7", "fd00:10:244:1::7"],
    node_labels={
        "kubernetes.io/hostname": "node-a",
        "topology.kubernetes.io/zone": "z1",
        "topology.kubernetes.io/region": "r1",
    },
)
GOOD_LOCATOR["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"  # as the API returns it


NODE_WITH_CIDRS: Doc = {**GOOD_LOCATOR, "cidrs": ["10.244.1.0/24", "fd00:10:244:1::/64"]}


def test_printer_columns() -> None:
    columns = {column["name"]: column for column in crd_version()["additionalPrinterColumns"]}
    assert set(columns) == {"Node", "Zone", "Addresses", "CIDRs", "Age"}
    assert columns["Age"] == {
        "name": "Age",
        "type": "date",
        "jsonPath": ".metadata.creationTimestamp",
    }
    shown = {}
    for name, column in columns.items():
        value: Any = NODE_WITH_CIDRS
        for field in jsonpath_fields(column["jsonPath"]):
            value = value[field]
        shown[name] = value
    assert shown["Node"] == "node-a"
    assert shown["Zone"] == "z1"
    assert shown["Addresses"] == NODE_WITH_CIDRS["addresses"]
    assert shown["CIDRs"] == NODE_WITH_CIDRS["cidrs"]


# The OpenAPI keywords validate() below implements; the schema must use no other.
SCHEMA_KEYWORDS = {
    "description",
    "type",
    "required",
    "properties",
    "additionalProperties",
    "maxProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "pattern",
    "x-kubernetes-list-type",
    "x-kubernetes-validations",
}
PYTHON_TYPES: dict[str, type] = {"object": dict, "array": list, "string": str}


def validate(schema: Doc, value: Any, path: str = "") -> list[str]:
    """The API server's checks of VALUE against a structural SCHEMA, for SCHEMA_KEYWORDS."""
    unknown = set(schema) - SCHEMA_KEYWORDS
    assert not unknown, f"{path or 'schema'}: validate() does not implement {sorted(unknown)}"
    kind = schema["type"]
    if not isinstance(value, PYTHON_TYPES[kind]):
        return [f"{path}: must be of type {kind}"]
    errors = []
    if kind == "object":
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}.{name}: required")
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                errors += validate(properties[key], item, f"{path}.{key}")
            elif extra is not None:
                errors += validate(extra, item, f"{path}[{key}]")
            elif properties:  # unknown field: pruned, or rejected under strict field validation
                errors.append(f"{path}.{key}: unknown field")
        if len(value) > schema.get("maxProperties", len(value)):
            errors.append(f"{path}: more than {schema['maxProperties']} properties")
    elif kind == "array":
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items")
        if schema.get("x-kubernetes-list-type") == "set" and len(set(value)) != len(value):
            errors.append(f"{path}: duplicate items")
        for index, item in enumerate(value):
            errors += validate(schema["items"], item, f"{path}[{index}]")
    else:
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)):
            errors.append(f"{path}: length {len(value)}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: does not match {schema['pattern']}")
    if not errors:
        for rule in schema.get("x-kubernetes-validations", []):
            if not evaluate_rule(rule["rule"], value):
                errors.append(f"{path}: {rule['message']}")
    return errors


class IP:
    """A value of the Kubernetes CEL type net.IP."""

    def __init__(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
        self.address = address


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    # Kubernetes' isIP()/ip() parse with Go's netip and refuse zones and IPv4-mapped IPv6;
    # Python's ipaddress refuses IPv4 with leading zeros, as netip does.
    if "%" in text:
        return None
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return None
    return address


class CIDR:
    """A value of the Kubernetes CEL type net.CIDR: the address as written (host bits kept,
    as Go's netip.Prefix keeps them) and its prefix."""

    def __init__(self, interface: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> None:
        self.address = interface.ip
        self.network = interface.network


def parse_cidr(text: str) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface | None:
    # Kubernetes' isCIDR()/cidr() parse with Go's netip.ParsePrefix: an address (as parse_ip
    # takes it), '/', and a length in decimal without leading zeros; host bits are kept.
    address, slash, length = text.partition("/")
    if not slash or parse_ip(address) is None or not re.fullmatch(r"0|[1-9][0-9]{0,2}", length):
        return None
    try:
        return ipaddress.ip_interface(text)
    except ValueError:
        return None


def cel_is_cidr(text: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(parse_cidr(str(text)) is not None)


def cel_cidr(text: celtypes.StringType) -> CIDR:
    interface = parse_cidr(str(text))
    if interface is None:
        raise ValueError(f"network address parse error during conversion from string: {text!r}")
    return CIDR(interface)


def cel_masked(cidr: CIDR) -> CIDR:
    return CIDR(ipaddress.ip_interface(cidr.network))


def cel_ip(value: Any) -> IP:
    # ip(string) parses; cidr.ip() (a member call, the same name to celpy) is its address.
    if isinstance(value, CIDR):
        return IP(value.address)
    address = parse_ip(str(value))
    if address is None:
        raise ValueError(f"IP Address {value!r} parse error")
    return IP(address)


def cel_prefix_length(cidr: CIDR) -> celtypes.IntType:
    return celtypes.IntType(cidr.network.prefixlen)


def cel_family(ip: IP) -> celtypes.IntType:
    return celtypes.IntType(ip.address.version)


def cel_contains_ip(cidr: CIDR, ip: Any) -> celtypes.BoolType:
    address = ip.address if isinstance(ip, IP) else cel_ip(ip).address
    return celtypes.BoolType(address in cidr.network)


def cel_string(value: Any) -> celtypes.StringType:
    # string() of a net.CIDR is Go's netip.Prefix.String(): the address as written, '/', length.
    if isinstance(value, CIDR):
        return celtypes.StringType(f"{value.address}/{value.network.prefixlen}")
    return celtypes.StringType(value)


def cel_is_ip(text: celtypes.StringType) -> celtypes.BoolType:
    return celtypes.BoolType(parse_ip(str(text)) is not None)


def cel_is_global_unicast(ip: IP) -> celtypes.BoolType:
    # Go's net.IP.IsGlobalUnicast: not unspecified, loopback, multicast, link-local unicast,
    # nor the IPv4 limited broadcast address; private ranges count as global unicast.
    address = ip.address
    return celtypes.BoolType(
        not (
            address.is_unspecified
            or address.is_loopback
            or address.is_multicast
            or address.is_link_local
            or address == ipaddress.IPv4Address("255.255.255.255")
        )
    )


CEL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "isIP": cel_is_ip,
    "ip": cel_ip,
    "isGlobalUnicast": cel_is_global_unicast,
    "isCIDR": cel_is_cidr,
    "cidr": cel_cidr,
    "masked": cel_masked,
    "prefixLength": cel_prefix_length,
    "family": cel_family,
    "containsIP": cel_contains_ip,
    "string": cel_string,
}


@functools.cache
def cel_program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule), functions=CEL_FUNCTIONS)


def evaluate_rule(rule: str, value: Any) -> bool:
    try:
        result = cel_program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError:
        return False  # an evaluation error fails the rule, as in the API server
    assert isinstance(result, celtypes.BoolType), f"{rule} gave {result!r}"
    return bool(result)


def test_cel_functions_follow_kubernetes() -> None:
    assert evaluate_rule("isIP(self)", "10.0.0.1")
    assert evaluate_rule("isIP(self)", "2001:db8::1")
    for bad in ("010.0.0.1", "10.0.0.1/8", "fe80::1%eth0", "::ffff:10.0.0.1", "", "node-a"):
        assert not evaluate_rule("isIP(self)", bad), bad
    assert not evaluate_rule("ip(self).isGlobalUnicast()", "nonsense")  # an error fails
    assert evaluate_rule("isCIDR(self)", "10.244.3.7/24")
    for bad in ("10.244.3.0", "10.244.3.0/024", "10.244.3.0/33", "fd00::%eth0/64", "x/8", ""):
        assert not evaluate_rule("isCIDR(self)", bad), bad
    assert evaluate_rule("string(cidr(self).masked()) == '10.244.3.0/24'", "10.244.3.7/24")
    assert evaluate_rule("string(cidr(self)) == self", "10.244.3.7/24")
    assert evaluate_rule("cidr(self).ip().family() == 6", "fd00::/64")
    assert evaluate_rule("cidr(self).containsIP('10.1.2.3')", "10.0.0.0/8")


def with_change(*changes: Callable[[Doc], None]) -> Doc:
    locator = copy.deepcopy(GOOD_LOCATOR)
    for change in changes:
        change(locator)
    return locator


def set_field(name: str, value: Any) -> Callable[[Doc], None]:
    def change(locator: Doc) -> None:
        locator[name] = value

    return change


def set_label(key: str, value: Any) -> Callable[[Doc], None]:
    def change(locator: Doc) -> None:
        locator["nodeLabels"][key] = value

    return change


def drop(name: str) -> Callable[[Doc], None]:
    def change(locator: Doc) -> None:
        del locator[name]

    return change


LONG_PREFIX = ".".join(["a" * 63] * 4)[:254].rstrip(".")  # 4 valid labels, 254 characters
assert len(LONG_PREFIX) == 254

GOOD_CASES = {
    "dual-stack pod": GOOD_LOCATOR,
    "node locator": with_change(set_field("addresses", ["192.168.10.4", "203.0.113.5"])),
    "one address": with_change(set_field("addresses", ["2001:db8::7"])),
    "embedded IPv4 tail": with_change(set_field("addresses", ["64:ff9b::192.0.2.1"])),
    "node name with dots": with_change(set_field("nodeName", "ip-10-0-1-2.ec2.internal")),
    "no labels": with_change(set_field("nodeLabels", {})),
    "no nodeLabels field": with_change(drop("nodeLabels")),
    "label with own prefix": with_change(set_label("example.com/rack", "r-1")),
    "label without prefix": with_change(set_label("rack", "R_1.a")),
    "empty label value": with_change(set_label("example.com/spot", "")),
    "63-character name": with_change(set_label("a" * 63, "x")),
    "253-character prefix": with_change(set_label(LONG_PREFIX[:253].rstrip(".") + "/x", "y")),
    "node with pod ranges": NODE_WITH_CIDRS,
    "cidrs only": with_change(drop("addresses"), set_field("cidrs", ["10.244.3.0/24"])),
    "nested prefixes": with_change(set_field("cidrs", ["10.0.0.0/8", "10.244.3.0/26"])),
    "IPv6 /32": with_change(set_field("cidrs", ["2001:db8::/32"])),
    "host route": with_change(set_field("cidrs", ["10.244.3.7/32", "fd00::7/128"])),
}

BAD_CASES = {
    "malformed IPv4": with_change(set_field("addresses", ["10.244.1.300"])),
    "not an address": with_change(set_field("addresses", ["node-a"])),
    "a CIDR": with_change(set_field("addresses", ["10.244.1.0/24"])),
    "leading zero": with_change(set_field("addresses", ["10.244.01.7"])),
    "IPv6 zone": with_change(set_field("addresses", ["fd00::7%eth0"])),
    "IPv4-mapped IPv6": with_change(set_field("addresses", ["::ffff:10.244.1.7"])),
    "loopback": with_change(set_field("addresses", ["127.0.0.2"])),
    "IPv6 loopback": with_change(set_field("addresses", ["::1"])),
    "link-local": with_change(set_field("addresses", ["169.254.169.254"])),
    "IPv6 link-local": with_change(set_field("addresses", ["fe80::1"])),
    "multicast": with_change(set_field("addresses", ["224.0.0.251"])),
    "IPv6 multicast": with_change(set_field("addresses", ["ff02::fb"])),
    "unspecified": with_change(set_field("addresses", ["0.0.0.0"])),
    "broadcast": with_change(set_field("addresses", ["255.255.255.255"])),
    "no addresses": with_change(set_field("addresses", [])),
    "too many addresses": with_change(
        set_field("addresses", [f"10.0.0.{i}" for i in range(1, 18)])
    ),
    "duplicate address": with_change(set_field("addresses", ["10.0.0.1", "10.0.0.1"])),
    "address not a string": with_change(set_field("addresses", [167772161])),
    "addresses not a list": with_change(set_field("addresses", "10.0.0.1")),
    "missing addresses": with_change(drop("addresses")),
    "missing nodeName": with_change(drop("nodeName")),
    "empty nodeName": with_change(set_field("nodeName", "")),
    "upper-case nodeName": with_change(set_field("nodeName", "Node-A")),
    "nodeName with underscore": with_change(set_field("nodeName", "node_a")),
    "label key with a space": with_change(set_label("bad key", "x")),
    "label key empty prefix": with_change(set_label("/zone", "x")),
    "label key two slashes": with_change(set_label("a/b/c", "x")),
    "label key upper-case prefix": with_change(set_label("Example.com/x", "x")),
    "label key name too long": with_change(set_label("a" * 64, "x")),
    "label key prefix too long": with_change(set_label(LONG_PREFIX + "/x", "x")),
    "label key ends in a dash": with_change(set_label("example.com/x-", "x")),
    "label value with a space": with_change(set_label("rack", "r 1")),
    "label value starts with a dash": with_change(set_label("rack", "-r1")),
    "label value too long": with_change(set_label("rack", "r" * 64)),
    "label value not a string": with_change(set_label("rack", 1)),
    "too many labels": with_change(
        set_field("nodeLabels", {f"example.com/k{i}": "v" for i in range(64)})
    ),
    "unknown field": with_change(set_field("spec", {"addresses": ["10.0.0.1"]})),
    "neither addresses nor cidrs": with_change(drop("addresses")),
    "empty cidrs": with_change(set_field("cidrs", [])),
    "CIDR host bits set": with_change(set_field("cidrs", ["10.244.3.7/24"])),
    "CIDR IPv6 host bits set": with_change(set_field("cidrs", ["fd00:10:244:3::1/64"])),
    "CIDR not canonical": with_change(set_field("cidrs", ["FD00:10:244:3:0::/64"])),
    "CIDR without length": with_change(set_field("cidrs", ["10.244.3.0"])),
    "CIDR length too long": with_change(set_field("cidrs", ["10.244.3.0/33"])),
    "CIDR length leading zero": with_change(set_field("cidrs", ["10.244.3.0/024"])),
    "CIDR not an address": with_change(set_field("cidrs", ["node-a/24"])),
    "CIDR shorter than /8": with_change(set_field("cidrs", ["8.0.0.0/7"])),
    "CIDR IPv6 shorter than /32": with_change(set_field("cidrs", ["fd00::/16"])),
    "CIDR loopback": with_change(set_field("cidrs", ["127.0.0.0/8"])),
    "CIDR link-local": with_change(set_field("cidrs", ["169.254.0.0/16"])),
    "CIDR holding link-local": with_change(set_field("cidrs", ["169.0.0.0/8"])),
    "CIDR IPv6 link-local": with_change(set_field("cidrs", ["fe80::/64"])),
    "CIDR multicast": with_change(set_field("cidrs", ["224.0.0.0/24"])),
    "CIDR IPv6 multicast": with_change(set_field("cidrs", ["ff02::/64"])),
    "CIDR unspecified": with_change(set_field("cidrs", ["0.0.0.0/8"])),
    "CIDR IPv6 unspecified": with_change(set_field("cidrs", ["::/32"])),
    "CIDR IPv4-mapped": with_change(set_field("cidrs", ["::ffff:10.0.0.0/104"])),
    "duplicate CIDR": with_change(set_field("cidrs", ["10.244.3.0/24", "10.244.3.0/24"])),
    "too many CIDRs": with_change(set_field("cidrs", [f"10.{i}.0.0/16" for i in range(65)])),
    "CIDRs not a list": with_change(set_field("cidrs", "10.244.3.0/24")),
}


@pytest.mark.parametrize("locator", GOOD_CASES.values(), ids=GOOD_CASES.keys())
def test_schema_accepts(locator: Doc) -> None:
    assert validate(locator_schema(), locator) == []


@pytest.mark.parametrize("locator", BAD_CASES.values(), ids=BAD_CASES.keys())
def test_schema_rejects(locator: Doc) -> None:
    assert validate(locator_schema(), locator) != []


# --- RBAC ---------------------------------------------------------------------------------------


def grants(role: Doc, named: str | None = None) -> set[tuple[str, str, str]]:
    """(group, resource, verb) the role grants: on every object, or with `named`, on that one."""
    result = set()
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, "no URLs"
        if named is None and "resourceNames" in rule:
            continue
        if named is not None and named not in rule.get("resourceNames", [named]):
            continue
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    result.add((group, resource, verb))
    return result


def every(groups_resources: list[tuple[str, str]], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for group, resource in groups_resources for verb in verbs}


def test_dns_server_lists_and_watches_only() -> None:
    assert grants(find(full(), "ClusterRole", "toposdns")) == every(
        [
            ("", "services"),
            ("", "namespaces"),
            ("discovery.k8s.io", "endpointslices"),
            ("toposdns.io", "podlocators"),
        ],
        ["list", "watch"],
    )


def test_controller_rights() -> None:
    assert grants(find(full(), "ClusterRole", "toposdns-controller")) == every(
        [("", "pods"), ("", "nodes")], ["list", "watch"]
    ) | every(
        # The calls the controller makes, no more (no patch: updates are whole PUTs).
        [("toposdns.io", "podlocators")],
        ["get", "list", "watch", "create", "update", "delete"],
    )
    role = find(full(), "Role", "toposdns-controller-leader-election")
    assert role["metadata"]["namespace"] == "toposdns"
    # Its own Lease only; `create` cannot be limited by name.
    leases = [("coordination.k8s.io", "leases")]
    assert grants(role) == every(leases, ["create"])
    args = build_parser().parse_args(container(controller_deployment())["args"])
    lease_name = args.lease_name
    assert lease_name == LeaseSettings().name, "the manifest runs the default --lease-name"
    assert grants(role, lease_name) == every(leases, ["get", "create", "update"])
    assert grants(role, "someone-elses-lease") == every(leases, ["create"])


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-"


@pytest.mark.parametrize("directory", KUSTOMIZE_DIRECTORIES, ids=lambda path: rel(path) or "root")
def test_only_the_controller_writes_podlocators(directory: Path) -> None:
    # Whoever writes a PodLocator places any client: no namespace admin or editor may.
    writers = []
    for doc in kustomize(directory):
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        labels = doc["metadata"].get("labels", {})
        aggregated = {key for key, value in labels.items() if key.startswith(AGGREGATE_TO)}
        writes = {
            verb
            for rule in doc.get("rules", [])
            if {"toposdns.io", "*"} & set(rule["apiGroups"])
            for verb in rule["verbs"]
        } & WRITE_VERBS
        if writes:
            writers.append(doc["metadata"]["name"])
            assert not aggregated, f"{doc['metadata']['name']} writes locators and aggregates"
        assert not {AGGREGATE_TO + "admin", AGGREGATE_TO + "edit"} & aggregated, doc["metadata"]
    assert set(writers) <= {"toposdns-controller"}


def test_podlocators_view_role_reads_only() -> None:
    role = find(full(), "ClusterRole", "toposdns-podlocators-view")
    assert grants(role) == every([("toposdns.io", "podlocators")], ["get", "list", "watch"])
    assert role["metadata"]["labels"][AGGREGATE_TO + "view"] == "true"


def test_no_wildcards_or_secrets() -> None:
    for doc in full():
        if doc["kind"] in ("ClusterRole", "Role"):
            for group, resource, verb in grants(doc):
                assert "*" not in (group, resource, verb), object_id(doc)
                assert resource not in ("secrets", "configmaps"), object_id(doc)


@pytest.mark.parametrize(
    ("binding_kind", "binding", "role_kind", "deployment"),
    [
        ("ClusterRoleBinding", "toposdns", "ClusterRole", "toposdns"),
        ("ClusterRoleBinding", "toposdns-controller", "ClusterRole", "toposdns-controller"),
        ("RoleBinding", "toposdns-controller-leader-election", "Role", "toposdns-controller"),
    ],
)
def test_bindings_reach_the_pods(
    binding_kind: str, binding: str, role_kind: str, deployment: str
) -> None:
    docs = full()
    bound = find(docs, binding_kind, binding)
    role = find(docs, bound["roleRef"]["kind"], bound["roleRef"]["name"])
    assert role["kind"] == role_kind
    assert bound["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
    workload = find(docs, "Deployment", deployment)
    namespace = workload["metadata"]["namespace"]
    account = workload["spec"]["template"]["spec"]["serviceAccountName"]
    find(docs, "ServiceAccount", account)
    assert bound["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    ]
    if role_kind == "Role":
        assert role["metadata"]["namespace"] == bound["metadata"]["namespace"] == namespace


# --- the workloads ------------------------------------------------------------------------------


def pod_spec(deployment: Doc) -> Doc:
    return deployment["spec"]["template"]["spec"]


def container(deployment: Doc) -> Doc:
    containers = pod_spec(deployment)["containers"]
    assert len(containers) == 1
    return containers[0]


#: Flags that take no value (the only ones written without `=value`).
SWITCHES = frozenset({"--loadbalance", "--autopath"})


def flags(args: list[str]) -> dict[str, str]:
    """`--name=value` arguments, every flag in that one-item form; a switch maps to ""."""
    result = {}
    for arg in args[1:]:
        name, sep, value = arg.partition("=")
        assert name.startswith("--") and (sep or name in SWITCHES), f"write {arg!r} as --name=value"
        assert name not in result, f"{name} given twice"
        result[name] = value
    return result


def port_number(spec: Doc, port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = [p["containerPort"] for p in container_of(spec)["ports"] if p.get("name") == port]
    assert len(named) == 1, port
    return int(named[0])


def container_of(spec: Doc) -> Doc:
    return spec["containers"][0]


def duration_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert match, f"not a duration: {text}"
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[match.group(2)]


WORKLOADS: dict[str, Callable[[], Doc]] = {
    "dns": dns_deployment,
    "controller": controller_deployment,
    "dns-forward": lambda: dns_deployment(rendered(FORWARD)),
}


@pytest.mark.parametrize("workload", WORKLOADS)
def test_workload_hardening(workload: str) -> None:
    deployment = WORKLOADS[workload]()
    spec = pod_spec(deployment)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }
    assert selects(deployment["spec"]["selector"]["matchLabels"], spec_labels(deployment))
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert isinstance(pod["runAsUser"], int) and pod["runAsUser"] > 0
    assert isinstance(pod["runAsGroup"], int) and pod["runAsGroup"] > 0
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(key)
    assert not [v for v in spec.get("volumes", []) if "hostPath" in v]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in spec["tolerations"]
    for item in spec["containers"] + spec.get("initContainers", []):
        context = item["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}, "drop ALL, add nothing"
        assert not context.get("privileged")
        assert "runAsUser" not in context or context["runAsUser"] > 0
        resources = item["resources"]
        assert set(resources["requests"]) == {"cpu", "memory"}
        assert set(resources["limits"]) == {"memory"}, "a memory limit and no CPU limit"


def spec_labels(deployment: Doc) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


@pytest.mark.parametrize("workload", WORKLOADS)
def test_spread_over_zones_and_hosts(workload: str) -> None:
    deployment = WORKLOADS[workload]()
    spec = pod_spec(deployment)
    own = spec_labels(deployment)
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["maxSkew"] == 1
    assert selects(spread["labelSelector"]["matchLabels"], own)
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["podAffinityTerm"]["labelSelector"]["matchLabels"], own)
    # Each selects its own pods only, not the other Deployment's.
    dns = own["app.kubernetes.io/component"] == "dns"
    other = controller_deployment() if dns else dns_deployment()
    assert not selects(spread["labelSelector"]["matchLabels"], spec_labels(other))


def test_dns_pod() -> None:
    deployment = dns_deployment()
    spec = pod_spec(deployment)
    assert spec_labels(deployment)["k8s-app"] == "kube-dns"
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["dnsPolicy"] == "Default"
    assert spec["serviceAccountName"] == "toposdns"
    assert {"name": "net.ipv4.ip_unprivileged_port_start", "value": "53"} in spec[
        "securityContext"
    ]["sysctls"]


def test_dns_container() -> None:
    deployment = dns_deployment()
    spec = pod_spec(deployment)
    item = container(deployment)
    # CoreDNS's ports and names (kubeadm's Deployment).
    assert {(p["name"], p["containerPort"], p["protocol"]) for p in item["ports"]} == {
        ("dns", 53, "UDP"),
        ("dns-tcp", 53, "TCP"),
        ("metrics", 9153, "TCP"),
        ("liveness-probe", 8080, "TCP"),
        ("readiness-probe", 8181, "TCP"),
    }
    # toposdns on the image's interpreter without file capabilities (tests/unit/test_dockerfile.py).
    assert item["command"] == ["/opt/venv/bin/python3", "-m", "toposdns"]
    assert item["args"][0] == "serve"
    options = flags(item["args"])
    assert options["--listen"].rpartition(":")[2] == "53"
    # Each endpoint on CoreDNS's port for it; /explain only inside the pod.
    assert "--http" not in options, "one port for all would expose /explain with /metrics"
    assert options["--health"] == "0.0.0.0:8080" and options["--ready"] == "0.0.0.0:8181"
    assert options["--metrics"] == "0.0.0.0:9153"
    assert ipaddress.ip_address(options["--explain"].rpartition(":")[0]).is_loopback
    assert options["--zone"].split(",") == ["cluster.local", "in-addr.arpa", "ip6.arpa"]
    assert options["--ttl"] == "30" and options["--pods"] == "insecure"
    # The rest of kubeadm's Corefile that has a counterpart (manifests/README.md's table).
    assert options["--fallthrough"].split(",") == ["in-addr.arpa", "ip6.arpa"]
    assert options["--cache-max-ttl"] == "30"
    assert options["--loadbalance"] == ""
    assert "--autopath" not in options, "opt-in: kubeadm's Corefile has no autopath"
    # Every argument is one the server takes, once the kubelet has expanded `$(VAR)` from the
    # container's environment (CPU_REQUEST is a whole number of CPUs).
    expanded = [re.sub(r"\$\(CPU_REQUEST\)", "2", arg) for arg in item["args"]]
    config = Reading().read_flags(given_flags(build_parser().parse_args(expanded), PLUGINS)).done()
    assert config.loadbalance.round_robin and config.cache.success.max_ttl == 30
    assert config.kubernetes.fallthrough == (("in-addr", "arpa"), ("ip6", "arpa"))
    assert "--snapshot" not in options, "in a cluster it watches the API"
    lameduck = duration_seconds(options["--lameduck"])
    assert lameduck == 5
    assert spec["terminationGracePeriodSeconds"] > lameduck
    live, ready = item["livenessProbe"], item["readinessProbe"]
    assert live["httpGet"]["path"] == "/health"
    assert port_number(spec, live["httpGet"]["port"]) == 8080
    assert ready["httpGet"]["path"] == "/ready"
    assert port_number(spec, ready["httpGet"]["port"]) == 8181
    assert (live["initialDelaySeconds"], live["timeoutSeconds"], live["failureThreshold"]) == (
        60,
        5,
        5,
    )
    assert item["resources"] == {
        "requests": {"cpu": "100m", "memory": "70Mi"},
        "limits": {"memory": "170Mi"},
    }
    # As many workers as CPUs requested, rounded up: the pod has no CPU limit, so the default
    # (every CPU of the node) would not fit what it asked for.
    workers = re.fullmatch(r"\$\((\w+)\)", options["--workers"])
    assert workers, "--workers follows the CPU request"
    (env,) = [var for var in item["env"] if var["name"] == workers.group(1)]
    assert env["valueFrom"] == {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}


def test_controller() -> None:
    deployment = controller_deployment()
    spec = pod_spec(deployment)
    item = container(deployment)
    assert "sysctls" not in spec["securityContext"], "it binds no low port"
    assert item["args"][0] == "controller"
    options = flags(item["args"])
    assert options["--namespace"] == "$(POD_NAMESPACE)"
    # DNS believes the PodLocators of the namespace the controller writes them in, only.
    dns = flags(container(dns_deployment())["args"])
    assert dns["--locator-namespaces"] == deployment["metadata"]["namespace"]
    env = {var["name"]: var for var in item["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    http_port = int(options["--http"].rpartition(":")[2])
    assert http_port == 8080
    assert [p["containerPort"] for p in item["ports"]] == [http_port]
    assert item["livenessProbe"]["httpGet"]["path"] == "/health"
    assert item["readinessProbe"]["httpGet"]["path"] == "/ready"
    for probe in (item["livenessProbe"], item["readinessProbe"]):
        assert port_number(spec, probe["httpGet"]["port"]) == http_port
    assert spec["terminationGracePeriodSeconds"] > 0
    # While no controller runs, new pods get no locator: keep one through drains and pressure.
    assert spec["priorityClassName"] == "system-cluster-critical"
    budget = find(full(), "PodDisruptionBudget", "toposdns-controller")
    assert budget["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert budget["spec"]["maxUnavailable"] == 1 < deployment["spec"]["replicas"]
    assert selects(budget["spec"]["selector"]["matchLabels"], spec_labels(deployment))
    assert not selects(budget["spec"]["selector"]["matchLabels"], spec_labels(dns_deployment()))


def images(docs: tuple[Doc, ...]) -> Iterator[tuple[str, Doc]]:
    for doc in docs:
        if doc["kind"] == "Deployment":
            spec = pod_spec(doc)
            for item in spec["containers"] + spec.get("initContainers", []):
                yield doc["metadata"]["name"], item


def test_images_are_pinned() -> None:
    found = list(images(full())) + list(images(rendered(FORWARD)))
    assert found
    for name, item in found:
        image = item["image"]
        match = re.fullmatch(
            r"(?P<repo>[^@]+?)(?::(?P<tag>[\w][\w.-]{0,127}))(@sha256:[0-9a-f]{64})?", image
        )
        assert match, f"{name}: {image} has no tag"
        assert match["tag"] != "latest", f"{name}: {image}"
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", match["tag"]), f"{name}: {image} is not a release"
        assert image == IMAGE
        assert item["imagePullPolicy"] == "IfNotPresent"


# --- Services and the disruption budget -----------------------------------------------------------


def service_ports(service: Doc) -> set[tuple[str, int, str, int]]:
    return {
        (p["name"], p["port"], p["protocol"], p["targetPort"]) for p in service["spec"]["ports"]
    }


DNS_PORTS = {("dns", 53, "UDP", 53), ("dns-tcp", 53, "TCP", 53), ("metrics", 9153, "TCP", 9153)}


def test_kube_dns_service() -> None:
    service = find(full(), "Service", "kube-dns")
    assert service["metadata"]["namespace"] == "kube-system"
    assert service["spec"]["selector"] == {"k8s-app": "kube-dns"}
    assert service_ports(service) == DNS_PORTS
    assert service["metadata"]["annotations"] == {
        "prometheus.io/port": "9153",
        "prometheus.io/scrape": "true",
    }
    assert service["metadata"]["labels"]["k8s-app"] == "kube-dns"
    assert ipaddress.ip_address(service["spec"]["clusterIP"]) == ipaddress.ip_address("10.96.0.10")
    assert selects(service["spec"]["selector"], spec_labels(dns_deployment()))
    assert not selects(service["spec"]["selector"], spec_labels(controller_deployment()))
    # DNS and /metrics, as CoreDNS's Service; not the probes, nor /explain, which the pods
    # serve only on their loopback address.
    container_ports = {
        (p["containerPort"], p["protocol"]) for p in container(dns_deployment())["ports"]
    }
    assert {(target, protocol) for _, _, protocol, target in DNS_PORTS} < container_ports
    explain = flags(container(dns_deployment())["args"])["--explain"]
    assert int(explain.rpartition(":")[2]) not in {port for _, port, _, _ in DNS_PORTS}


def test_disruption_budget_covers_the_dns_pods() -> None:
    budget = find(full(), "PodDisruptionBudget", "toposdns")
    assert budget["metadata"]["namespace"] == dns_deployment()["metadata"]["namespace"]
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selects(selector, spec_labels(dns_deployment()))
    assert selects(selector, spec_labels(dns_deployment(rendered(FORWARD))))
    assert not selects(selector, spec_labels(controller_deployment()))
    # Not by k8s-app alone, which CoreDNS's pods carry too while both run.
    assert "k8s-app" not in selector
    spec = budget["spec"]
    replicas = dns_deployment()["spec"]["replicas"]
    if "maxUnavailable" in spec:
        assert 1 <= spec["maxUnavailable"] < replicas
    else:
        assert 1 <= spec["minAvailable"] < replicas


# --- toposdns behind CoreDNS --------------------------------------------------------------------


def corefile_block(corefile: str, zone: str) -> list[str]:
    """The directives of one server block (`ZONE { ... }`), each with its arguments, read with
    the server's Corefile syntax."""
    for keys, directives in server_blocks(expand(lex(corefile, "Corefile"), ROOT, {}, 0)):
        if [key.text for key in keys] == [zone]:
            return [" ".join(token.text for token in line) for line, _ in directives]
    raise AssertionError(f"no {zone} block")


def test_forward_overlay_leaves_kube_dns_to_coredns() -> None:
    docs = rendered(FORWARD)
    assert not [
        doc for doc in docs if doc["kind"] == "Service" and doc["metadata"]["name"] == "kube-dns"
    ]
    deployment = dns_deployment(docs)
    assert "k8s-app" not in spec_labels(deployment)
    assert "k8s-app" not in deployment["metadata"]["labels"]
    service = find(docs, "Service", "toposdns")
    assert service_ports(service) == DNS_PORTS
    assert "k8s-app" not in service["spec"]["selector"]
    assert selects(service["spec"]["selector"], spec_labels(deployment))
    assert not selects(service["spec"]["selector"], spec_labels(controller_deployment()))
    # The rest is the default install.
    assert {object_id(doc) for doc in full()} - {object_id(doc) for doc in docs} == {
        object_id(find(full(), "Service", "kube-dns"))
    }


def test_forward_overlay_trusts_ecs_from_corednss_pods_only() -> None:
    docs = rendered(FORWARD)
    options = flags(container(dns_deployment(docs))["args"])
    # Not a pod CIDR, from which any pod could pick where it is placed.
    assert "--ecs-trust" not in options
    config = Reading().read_flags({"--ecs-trust-service": options["--ecs-trust-service"]}).done()
    (trusted,) = config.toposdns.ecs_trust_services
    # CoreDNS's Service, which the overlay leaves to CoreDNS and does not ship.
    assert trusted == ("kube-system", "kube-dns")
    assert not [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "kube-dns"]
    # The DNS pods read EndpointSlices anyway: the trusted set needs no new right.
    assert ("discovery.k8s.io", "endpointslices", "watch") in grants(
        find(docs, "ClusterRole", "toposdns")
    )
    for flag in ("--ecs-trust", "--ecs-trust-service"):
        assert flag not in flags(container(dns_deployment())["args"])


def test_corefile_block_forwards_the_cluster_zone_with_ecs() -> None:
    docs = rendered(FORWARD)
    config = find(docs, "ConfigMap", "coredns-custom")
    assert config["metadata"]["namespace"] == "kube-system"
    (key,) = config["data"]
    assert key.endswith(".server"), "CoreDNS imports custom/*.server as server blocks"
    directives = corefile_block(config["data"][key], "cluster.local:53")
    # `set`: the pod's own Client Subnet option is overwritten, never kept (`append`).
    assert "rewrite edns0 subnet set 32 128" in directives
    assert not [d for d in directives if d.split()[0] == "cache"], "no cache: it ignores ECS"
    (forward,) = [d.split() for d in directives if d.split()[0] == "forward"]
    assert forward[1] == "."
    assert forward[2:] == [find(docs, "Service", "toposdns")["spec"]["clusterIP"]]
    assert directives.index("rewrite edns0 subnet set 32 128") < directives.index(" ".join(forward))


#: Every file where a Corefile line for Client Subnets may be written for users to copy.
DOCUMENTED = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted(MANIFESTS.rglob("*.md")),
    *YAML_FILES,
    *sorted((ROOT / "toposdns").rglob("*.py")),
]


def test_every_documented_subnet_rewrite_sets_it() -> None:
    # `append` and `replace` keep (or only swap) a Client Subnet the pod wrote itself; where
    # toposdns trusts that hop, the pod picks its placement (docs/operations.md).
    written = []
    for path in DOCUMENTED:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for rule in re.findall(r"rewrite (?:\w+ )?edns0 subnet (\w+)(?: (\d+) (\d+))?", line):
                written.append((f"{path.relative_to(ROOT)}:{number}", rule))
    assert written, "no subnet rewrite found: the pattern is out of date"
    for where, (action, v4, v6) in written:
        assert action == "set", where
        assert (v4, v6) in (("", ""), ("32", "128")), f"{where}: full-length, as locators place"


def test_readme_block_is_the_overlays() -> None:
    # manifests/README.md shows the overlay's block: the same directives.
    block = shown_corefile((MANIFESTS / "README.md").read_text(), "Behind an existing CoreDNS")
    (config,) = load(FORWARD / "coredns-custom.yaml")
    (text,) = config["data"].values()
    assert corefile_block(block, "cluster.local:53") == corefile_block(text, "cluster.local:53")


def test_nodelocal_block_sets_the_subnet_before_it_forwards() -> None:
    block = shown_corefile((MANIFESTS / "README.md").read_text(), "Behind NodeLocal DNSCache")
    directives = corefile_block(block, "cluster.local:53")
    names = [d.split()[0] for d in directives]
    # NodeLocal DNSCache's own cluster-zone block, with the one line added.
    assert names == [
        "errors",
        "cache",
        "reload",
        "loop",
        "bind",
        "rewrite",
        "forward",
        "prometheus",
        "health",
    ]
    assert "rewrite edns0 subnet set 32 128" in directives


def test_corefile_block_parser() -> None:
    text = "a:53 {\n  errors\n  forward . 1.2.3.4 {\n    max_fails 2\n  }\n}\nb:53 {\n  cache\n}\n"
    assert corefile_block(text, "a:53") == ["errors", "forward . 1.2.3.4"]
    assert corefile_block(text, "b:53") == ["cache"]


# --- autoscaling ----------------------------------------------------------------------------------

AUTOSCALING = MANIFESTS / "autoscaling"
AUTOSCALING_HPA = MANIFESTS / "autoscaling-hpa"


def linear_ladder(params: Doc, cores: int, nodes: int) -> int:
    """The cluster-proportional-autoscaler's linear mode, as its README defines it."""
    replicas = max(-(-cores // params["coresPerReplica"]), -(-nodes // params["nodesPerReplica"]))
    if params.get("preventSinglePointFailure") and nodes > 1:
        replicas = max(replicas, 2)
    return int(max(replicas, params.get("min", 0)))


def test_autoscaler_targets_the_dns_deployment() -> None:
    # Applied next to the install: the autoscaler's own objects, none of the install's (the
    # DNS Deployment, its budget) changed.
    docs = kustomize(AUTOSCALING)
    assert not {object_id(doc) for doc in full()} & {object_id(doc) for doc in docs}
    scaler = find(docs, "Deployment", "toposdns-autoscaler")
    item = container(scaler)
    assert item["image"].startswith("registry.k8s.io/cpa/cluster-proportional-autoscaler:v")
    options = flags(item["command"])  # the first word is the binary
    dns = dns_deployment()
    namespace = dns["metadata"]["namespace"]
    assert options["--target"] == f"Deployment/{dns['metadata']['name']}"
    assert options["--namespace"] == namespace == scaler["metadata"]["namespace"]
    config = find(docs, "ConfigMap", options["--configmap"])
    assert config["metadata"]["namespace"] == namespace
    params = json.loads(config["data"]["linear"])
    # kube-dns-autoscaler's ladder, never below the Deployment's own two replicas.
    assert (params["coresPerReplica"], params["nodesPerReplica"]) == (256, 16)
    assert params["min"] == dns["spec"]["replicas"] == 2
    assert [
        linear_ladder(params, cores, nodes)
        for cores, nodes in [(4, 1), (64, 16), (400, 50), (4096, 100)]
    ] == [2, 2, 4, 16]
    # Least privilege: its own ladder, its one target's scale, and the nodes to count.
    role = find(docs, "Role", "toposdns-autoscaler")
    assert grants(role) == set()
    assert grants(role, "toposdns") == every([("apps", "deployments/scale")], ["get", "update"])
    assert grants(role, options["--configmap"]) == every([("", "configmaps")], ["get"])
    assert grants(find(docs, "ClusterRole", "toposdns-autoscaler")) == every(
        [("", "nodes")], ["list", "watch"]
    )
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        binding = find(docs, kind, "toposdns-autoscaler")
        assert binding["subjects"] == [
            {
                "kind": "ServiceAccount",
                "name": pod_spec(scaler)["serviceAccountName"],
                "namespace": namespace,
            }
        ]


def test_hpa_targets_the_dns_deployment() -> None:
    docs = kustomize(AUTOSCALING_HPA)
    assert not {object_id(doc) for doc in full()} & {object_id(doc) for doc in docs}
    hpa = find(docs, "HorizontalPodAutoscaler", "toposdns")
    dns = dns_deployment()
    assert hpa["metadata"]["namespace"] == dns["metadata"]["namespace"]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": dns["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] == dns["spec"]["replicas"] == 2
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    # Utilization is of the request, which the DNS container must have.
    assert "cpu" in container(dns)["resources"]["requests"]
    # Not both autoscalers at once.
    assert not [d for d in docs if d["metadata"]["name"] == "toposdns-autoscaler"]


# --- network policies -----------------------------------------------------------------------------

NETWORK_POLICY = MANIFESTS / "network-policy"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
API_SERVER = {("TCP", 443), ("TCP", 6443)}


def rule_ports(rule: Doc) -> set[tuple[str, int]]:
    return {(port["protocol"], port["port"]) for port in rule["ports"]}


def policy_for(deployment: Doc) -> Doc:
    (policy,) = [
        doc
        for doc in kustomize(NETWORK_POLICY)
        if doc["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        and selects(doc["spec"]["podSelector"]["matchLabels"], spec_labels(deployment))
    ]
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    return policy


def test_dns_network_policy() -> None:
    deployment = dns_deployment()
    policy = policy_for(deployment)
    assert not selects(
        policy["spec"]["podSelector"]["matchLabels"], spec_labels(controller_deployment())
    )
    options = flags(container(deployment)["args"])
    metrics_port = int(options["--metrics"].rpartition(":")[2])
    dns, metrics = policy["spec"]["ingress"]
    # DNS from anywhere: pods of every namespace, and nodes (NodeLocal DNSCache).
    assert "from" not in dns and rule_ports(dns) == {("UDP", 53), ("TCP", 53)}
    assert metrics["from"] == [MONITORING] and rule_ports(metrics) == {("TCP", metrics_port)}
    # /explain: on the pod's loopback only, and no rule admits its port from elsewhere.
    explain_host, _, explain_port = options["--explain"].rpartition(":")
    assert ipaddress.ip_address(explain_host).is_loopback
    admitted = {port for rule in policy["spec"]["ingress"] for _, port in rule_ports(rule)}
    assert int(explain_port) not in admitted
    # The probes' ports come from the node, which policies always admit; none is opened wider.
    assert admitted == {53, metrics_port}
    upstreams, api = policy["spec"]["egress"]
    assert "to" not in upstreams and rule_ports(upstreams) == {("UDP", 53), ("TCP", 53)}
    assert rule_ports(api) == API_SERVER


def test_controller_network_policy() -> None:
    deployment = controller_deployment()
    policy = policy_for(deployment)
    http_port = int(flags(container(deployment)["args"])["--http"].rpartition(":")[2])
    (metrics,) = policy["spec"]["ingress"]
    assert metrics["from"] == [MONITORING] and rule_ports(metrics) == {("TCP", http_port)}
    (api,) = policy["spec"]["egress"]
    assert rule_ports(api) == API_SERVER


# --- kubeadm's objects, with only the image swapped ---------------------------------------


def test_kubeadm_overlay_is_kubeadms_objects_with_the_image_swapped() -> None:
    docs = rendered(KUBEADM)
    assert {(doc["kind"], doc["metadata"]["name"]) for doc in docs} == {
        ("ConfigMap", "coredns"),
        ("Deployment", "coredns"),
        ("Service", "kube-dns"),
        ("ClusterRole", "toposdns:coredns-podlocators"),
        ("ClusterRoleBinding", "toposdns:coredns-podlocators"),
    }
    for doc in docs:
        assert doc["metadata"].get("namespace", "kube-system") == "kube-system"
    deployment = copy.deepcopy(find(docs, "Deployment", "coredns"))  # rendered() is cached
    original = load(KUBEADM / "deployment.yaml")[0]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == IMAGE
    container["image"] = original["spec"]["template"]["spec"]["containers"][0]["image"]
    assert deployment == original, "nothing but the image differs from kubeadm's"
    assert container["args"] == ["-conf", "/etc/coredns/Corefile"]
    assert container["resources"]["limits"] == {"memory": "170Mi"}


def test_kubeadm_corefile_is_read_by_the_server(tmp_path: Path) -> None:
    docs = rendered(KUBEADM)
    corefile = tmp_path / "Corefile"
    corefile.write_text(find(docs, "ConfigMap", "coredns")["data"]["Corefile"])
    config = read_corefile(corefile).done()
    (container,) = find(docs, "Deployment", "coredns")["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert config.bind.port == ports["dns"] == ports["dns-tcp"] == 53
    assert config.health.address is not None and config.ready.address is not None
    assert config.health.address[1] == ports["liveness-probe"]
    assert config.ready.address[1] == ports["readiness-probe"]
    assert config.prometheus.address is not None
    assert config.prometheus.address[1] == ports["metrics"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert config.toposdns.workers == 1, "one process in 170Mi, as CoreDNS"
    service = find(docs, "Service", "kube-dns")
    assert {port["targetPort"] for port in service["spec"]["ports"]} == {53, ports["metrics"]}


def test_kubeadm_overlay_lets_coredns_read_podlocators() -> None:
    docs = rendered(KUBEADM)
    role = find(docs, "ClusterRole", "toposdns:coredns-podlocators")
    assert role["rules"] == [
        {"apiGroups": ["toposdns.io"], "resources": ["podlocators"], "verbs": ["list", "watch"]}
    ]
    binding = find(docs, "ClusterRoleBinding", "toposdns:coredns-podlocators")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    serviceaccount = find(docs, "Deployment", "coredns")["spec"]["template"]["spec"][
        "serviceAccountName"
    ]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": serviceaccount, "namespace": "kube-system"}
    ]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_the_kubeadm_overlay() -> None:
    out = subprocess.run(
        ["kubectl", "kustomize", str(KUBEADM)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    by_id = {object_id(doc): doc for doc in yaml.safe_load_all(out)}
    assert by_id == {object_id(doc): doc for doc in rendered(KUBEADM)}
