"""Loading snapshot files: formats, list kinds, and refusals that say what to fix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from toposdns.source.snapshot_file import (
    SnapshotError,
    SnapshotFileSource,
    load_records,
    load_snapshot,
)
from toposdns.store.snapshot import Snapshot

NS = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}
SVC = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {"clusterIP": "10.0.0.1"},
}


def test_kind_list_yaml(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: v1, kind: Namespace, metadata: {name: shop}}\n"
        "- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: shop},"
        " spec: {clusterIP: 10.0.0.1}}\n"
    )
    snap = load_snapshot(path, serial=5)
    assert (
        set(snap.namespaces) == {"shop"} and ("shop", "web") in snap.services and snap.serial == 5
    )


def test_document_stream_and_typed_lists(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\n"
        "apiVersion: v1\nkind: ServiceList\nitems:\n"
        "- {metadata: {name: web, namespace: shop}, spec: {clusterIP: 10.0.0.1}}\n---\n"
    )
    assert len(load_records(path)) == 2


def test_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [NS, SVC]}))
    assert len(load_records(path)) == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("items: [", "not valid YAML or JSON"),
        (
            json.dumps([NS, {**SVC, "spec": {"clusterIP": "x"}}]),
            "Service shop/web: spec.clusterIP: not an IP address: 'x'; fix or remove that object",
        ),
        (json.dumps([NS, SVC, SVC]), "Service shop/web: appears twice"),
    ],
)
def test_refusals_name_file_and_object(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(SnapshotError) as info:
        load_records(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="cannot read"):
        load_records(tmp_path / "absent.yaml")


def test_watch_publishes_changes_and_keeps_data_on_bad_reload(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([NS]))
    published: list[Snapshot] = []
    source = SnapshotFileSource(path, published.append, interval=0.01)
    first = source.load()

    async def scenario() -> None:
        task = asyncio.create_task(source.watch())
        path.write_text(json.dumps([NS, SVC]))
        for _ in range(200):
            if published:
                break
            await asyncio.sleep(0.01)
        path.write_text("{broken")
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(scenario())
    assert len(published) == 1 and ("shop", "web") in published[0].services
    assert published[0].serial > first.serial
