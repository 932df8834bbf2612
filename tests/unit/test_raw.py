"""List pages decoded to the fields DNS reads (store/raw.py) give what whole objects give.

Every object of the converters' tables, valid and malformed, goes into a list page the way the
API server sends it, with the fields DNS never reads around it. Decoded to its resource's
fields, it must convert to the same record or the same message as the whole object, and keep
its key and its trigger time. Only a malformed object may make its page fail to decode so (the
reflector then decodes that page whole): a valid one never does.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
import pytest

from tests.objects import endpoint, endpoint_slice, namespace, pod_locator, service
from tests.unit.test_convert import (
    ERRORS,
    LOCATOR_ERRORS,
    LOCATOR_SHAPES,
    SLICE_SHAPES,
    common,
    common_slice,
    converted,
)
from toposdns.kube.client import Apis
from toposdns.source.kube import RESOURCES, TRIGGER_TIME, KubeSource
from toposdns.source.watch import Reflector, Resource, WatchSettings, object_key, page_decoder
from toposdns.store.convert import convert_object

KINDS = {resource.kind: resource for resource in RESOURCES}
TRIGGERED = {TRIGGER_TIME: "2026-11-27T04:55:00Z"}

#: What the API server adds to every object, none of which DNS reads.
SERVER_METADATA = {
    "uid": "3f0b6a7e-3a1c-4c8e-9a8e-0f7c3b2a1d9e",
    "resourceVersion": "10234",
    "generation": 3,
    "creationTimestamp": "2026-11-27T04:55:00Z",
    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "u"}],
    "managedFields": [{"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {}}}],
}
LAST_APPLIED = {"kubectl.kubernetes.io/last-applied-configuration": '{"kind": "Service"}' * 50}


def served(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` as the API server would send it: with the metadata it adds, a status, and the
    labels and annotations of other tools."""
    meta = raw.get("metadata")
    if not isinstance(meta, dict):
        return raw | {"status": {"phase": "Active"}}
    labels = meta.get("labels")
    annotations = meta.get("annotations")
    meta = meta | SERVER_METADATA
    if isinstance(labels, dict):
        meta["labels"] = labels | {"app.kubernetes.io/part-of": "shop"}
    if isinstance(annotations, dict):
        meta["annotations"] = annotations | LAST_APPLIED
    return raw | {"metadata": meta, "status": {"conditions": [{"type": "Ready"}]}}


#: Objects beyond the converters' tables: as served, with what the API server writes as null.
EXTRA = {
    "namespace": namespace("shop"),
    "service with last-applied": service(cluster_ip="10.0.0.1", annotations=LAST_APPLIED),
    "service annotated": service(
        cluster_ip="None", annotations={"toposdns.io/topology-keys": "kubernetes.io/hostname"}
    ),
    "service, null ports": service(cluster_ip="None", ports=())
    | {"spec": {"clusterIP": "None", "ports": None}},
    "external name": service(cluster_ip=None, ports=(), type="ExternalName", externalName="a.b"),
    "slice, null endpoints": endpoint_slice(endpoints=[]) | {"endpoints": None},
    "slice, null ports": endpoint_slice(endpoints=[endpoint("10.1.0.1")]) | {"ports": None},
    "slice triggered": endpoint_slice(endpoints=[endpoint("10.1.0.1")], annotations=TRIGGERED),
    "slice with hints": common_slice(
        {"addresses": ["10.1.0.2"], "hints": {"forZones": [{"name": "z1"}]}}
    ),
    "slice, null targetRef": common_slice({"addresses": ["10.1.0.2"], "targetRef": None}),
    "locator, null labels": common(metadata={"name": "a", "namespace": "b", "labels": None}),
    "node locator with cidrs": pod_locator(
        "node-a", "toposdns", addresses=None, cidrs=["10.244.1.0/24"], role="node"
    ),
}

#: Objects malformed in their structure, which the fields refuse.
MISSHAPEN = {
    "metadata a string": common(metadata="web-0"),
    "labels a list": common(metadata={"name": "web-0", "namespace": "shop", "labels": []}),
    "endpoint a string": common_slice(endpoints=[{"addresses": ["10.1.0.2"]}, "10.1.0.1"]),
    "endpoints a mapping": common_slice(endpoints={}),
    "port a number": common_slice(ports=[80]),
    "ports a mapping": common_slice(ports={"port": 80}),
    "targetRef a string": common_slice({"addresses": ["10.1.0.2"], "targetRef": "web-0"}),
    "service spec a list": service(cluster_ip="None") | {"spec": []},
    "annotations a string": service(cluster_ip="None", annotations={}) | {"metadata": "x"},
}

CASES: dict[str, dict[str, Any]] = {
    **{f"locator: {name}": raw for name, (raw, _) in LOCATOR_SHAPES.items()},
    **{f"locator error: {name}": raw for name, (raw, _) in LOCATOR_ERRORS.items()},
    **{f"slice: {name}": raw for name, (raw, _) in SLICE_SHAPES.items()},
    **{f"error: {message}": raw for raw, message in ERRORS},
    **EXTRA,
    **MISSHAPEN,
}


def resource_of(raw: dict[str, Any]) -> Resource:
    resource = KINDS.get(raw.get("kind"))  # type: ignore[arg-type]
    return resource if resource is not None else KINDS["PodLocator"]


def page(raw: dict[str, Any]) -> bytes:
    """A list page holding `raw` as served, with a typed list's metadata."""
    return orjson.dumps(
        {
            "kind": f"{raw.get('kind')}List",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "10240", "continue": "token", "remainingItemCount": 3},
            "items": [served(raw)],
        }
    )


@pytest.mark.parametrize("name", CASES, ids=CASES)
def test_an_object_decoded_to_its_fields_converts_as_the_whole_one(name: str) -> None:
    raw = CASES[name]
    resource = resource_of(raw)
    assert resource.fields is not None
    data = page(raw)
    whole = orjson.loads(data)
    try:
        decoded = page_decoder(resource.fields).decode(data)
    except msgspec.ValidationError:
        message = converted(convert_object, whole["items"][0])
        assert isinstance(message, str), "a valid object was refused: its page is decoded twice"
        return
    assert decoded["metadata"] == {"resourceVersion": "10240", "continue": "token"}
    (slim,) = decoded["items"]
    (full,) = whole["items"]
    assert converted(convert_object, slim) == converted(convert_object, full)
    assert object_key(slim) == object_key(full)
    if resource.kind == "EndpointSlice" and isinstance(full.get("metadata"), dict):
        annotations = full["metadata"].get("annotations") or {}
        slim_annotations = slim["metadata"].get("annotations") or {}
        assert slim_annotations.get(TRIGGER_TIME) == annotations.get(TRIGGER_TIME)
    assert len(orjson.dumps(slim)) < len(orjson.dumps(full)), "nothing was skipped"


def test_every_watched_resource_names_its_fields() -> None:
    assert all(resource.fields is not None for resource in RESOURCES)


@pytest.mark.parametrize(
    "data",
    [
        b'{"items": [{"metadata": {"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}]}",
        b'{"items": [{"metadata": {"name": "a"}}]',
        b'{"items": [{"metadata": {"name": 1e400}}]}',
        b"[]",
        b'{"items": {}}',
    ],
    ids=["deeply nested", "truncated", "number out of range", "not an object", "items an object"],
)
def test_hostile_pages_fail_as_decode_errors(data: bytes) -> None:
    """What the reflector catches to decode a page whole: never anything else."""
    with pytest.raises((msgspec.DecodeError, RecursionError)):
        page_decoder(KINDS["PodLocator"].fields or dict).decode(data)


@pytest.mark.parametrize("name", MISSHAPEN, ids=MISSHAPEN)
def test_a_page_with_a_misshapen_object_is_decoded_whole(name: str) -> None:
    raw = MISSHAPEN[name]
    resource = resource_of(raw)
    sink = KubeSource(Apis(None), lambda _snapshot: None)
    reflector = Reflector(Apis(None), resource, sink, WatchSettings())
    data = page(raw)
    assert reflector.decode_page(data) == orjson.loads(data)
