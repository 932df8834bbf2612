"""Loading snapshot files: formats, list kinds, and refusals that say what to fix."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.objects import namespace, pod_locator, service
from toposdns.source.snapshot_file import (
    SnapshotError,
    SnapshotFileSource,
    load_records,
    load_snapshot,
    parse_records,
    read_file,
)
from toposdns.store.snapshot import Snapshot

NS = namespace("shop")
SVC = service(cluster_ip="10.0.0.1")


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


SHAPES = [
    # (what, file): each holds the Namespace shop and the Service web.
    (
        "kind after items, as kubectl prints it",
        "apiVersion: v1\nitems:\n- {NS}\n- {SVC}\nkind: List\n",
    ),
    (
        "a typed List, kind first",
        "kind: ServiceList\napiVersion: v1\nitems:\n- {SVCBARE}\n---\n{NS}\n",
    ),
    (
        "a typed List, kind last",
        "apiVersion: v1\nitems:\n- {SVCBARE}\nkind: ServiceList\n---\n{NS}\n",
    ),
    ("a document that is a list", "- {NS}\n- {SVC}\n"),
    ("a List inside a list", "- {NS}\n- {apiVersion: v1, kind: List, items: [{SVC}]}\n"),
]


@pytest.mark.parametrize("content", [c[1] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_list_shapes(content: str) -> None:
    text = (
        content.replace("{NS}", json.dumps(NS))
        .replace("{SVCBARE}", json.dumps({k: v for k, v in SVC.items() if k != "kind"}))
        .replace("{SVC}", json.dumps(SVC))
    )
    records = parse_records(Path("s.yaml"), text.encode())
    assert sorted(type(record).__name__ for record in records) == ["Namespace", "Service"]


def test_aliases_from_pyyaml_dump_are_read(tmp_path: Path) -> None:
    """`yaml.dump` writes an anchor and aliases wherever objects share a dict."""
    labels = {"app": "web"}
    items = [
        {**NS, "metadata": {"name": "shop", "labels": labels}},
        {**SVC, "metadata": {"name": "web", "namespace": "shop", "labels": labels}},
        {**SVC, "metadata": {"name": "api", "namespace": "shop", "labels": labels}},
    ]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.dump({"apiVersion": "v1", "kind": "List", "items": items}))
    assert "&id001" in path.read_text() and "*id001" in path.read_text()
    assert len(load_records(path)) == 3


NODE_LOCATOR = pod_locator("node-a", "toposdns", addresses=None)


def test_json(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [NS, SVC]}))
    assert len(load_records(path)) == 2


@pytest.mark.parametrize(
    "document",
    [
        # kubectl's order: the List's kind after its items, which are read one at a time.
        {"apiVersion": "v1", "items": [NS, SVC], "kind": "List", "metadata": {}},
        # The raw API's typed list: items without a kind of their own, kind first or last.
        {"kind": "ServiceList", "apiVersion": "v1", "items": [{**SVC, "kind": None}]},
        {"items": [{**SVC, "kind": None}], "apiVersion": "v1", "kind": "ServiceList"},
        # An array of objects and Lists.
        [NS, {"apiVersion": "v1", "kind": "List", "items": [SVC]}],
    ],
)
def test_json_lists_in_any_key_order(document: Any) -> None:
    text = json.dumps(document).replace('"kind": null, ', "")
    records = parse_records(Path("s.json"), text.encode())
    assert {type(r).__name__ for r in records} >= {"Service"}
    assert [r.name for r in records if type(r).__name__ == "Service"] == ["web"]


def test_a_bad_json_item_is_named_with_its_field(tmp_path: Path) -> None:
    items = [NS, *({**SVC, "metadata": {"name": f"s{i}", "namespace": "shop"}} for i in range(50))]
    items[30] = {**items[30], "spec": {"clusterIP": "10.0.0.300"}}
    data = json.dumps({"apiVersion": "v1", "items": items, "kind": "List"}).encode()
    with pytest.raises(SnapshotError) as info:
        parse_records(Path("s.json"), data)
    assert str(info.value) == (
        "s.json: Service shop/s29: spec.clusterIP: not an IP address: '10.0.0.300'; "
        "fix or remove that object"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "items: [",
            "not valid YAML or JSON: line 2, column 1: did not find expected node content "
            "(while parsing a flow node)",
        ),
        (
            json.dumps([NS, {**SVC, "spec": {"clusterIP": "x"}}]),
            "Service shop/web: spec.clusterIP: not an IP address: 'x'; fix or remove that object",
        ),
        (json.dumps([NS, SVC, SVC]), "Service shop/web: appears twice"),
        (
            json.dumps([NS, {**NODE_LOCATOR, "cidrs": ["10.244.3.0/24", "10.244.4.7/24"]}]),
            "PodLocator toposdns/node-a: cidrs[1]: '10.244.4.7/24' has host bits set; the network "
            "is 10.244.4.0/24; fix or remove that object",
        ),
        (
            json.dumps([NS, {**NODE_LOCATOR, "cidrs": ["224.0.0.0/24"]}]),
            "PodLocator toposdns/node-a: cidrs[0]: '224.0.0.0/24' is not a unicast range: it is "
            "multicast",
        ),
        (
            json.dumps([NS, {**NODE_LOCATOR, "cidrs": ["10.244.3.0/33"]}]),
            "PodLocator toposdns/node-a: cidrs[0]: not a CIDR: '10.244.3.0/33'",
        ),
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


NS_YAML = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n"

# What cannot be the file its writer meant: refused whole, saying what is wrong.
INCOMPLETE = [
    ("", "empty; a snapshot holds at least one object"),
    (" \n\t\n", "empty"),
    ("# just a comment\n---\n", "holds no objects; a snapshot holds at least one"),
    ("apiVersion: v1\nkind: List\nitems: []\n", "holds no objects"),
    ("[]", "holds no objects"),
    # A write cut short: YAML that parses but ends mid-line; JSON that does not parse.
    (NS_YAML[:-1], "ends mid-line, as a file still being written does"),
    (NS_YAML + "---\napiVersion: v1\nkind: Namesp", "ends mid-line"),
    (json.dumps([NS, SVC])[:-3], "not valid YAML or JSON: parse error: premature EOF"),
    (
        "kind: List\nitems:\n- {kind: Service, metadata: {name: w",
        "line 4, column 1: did not find expected ',' or '}' (while parsing a flow mapping)",
    ),
    # Unbounded work from a small file: aliases standing for 10**9 nodes ("billion laughs"),
    # nesting past libyaml's C stack.
    (
        "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        + "".join(
            f"{name}: &{name} [{', '.join([f'*{previous}'] * 10)}]\n"
            for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
        ),
        "line 3, column 44: excessive aliasing: 1110 of 1111 nodes come from aliases (*name), "
        "more than Kubernetes reads",
    ),
    ("- " * 200_000 + "x\n", "nested deeper than 100 levels"),
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    # Values no YAML type can hold, and bytes that are not text.
    ("created: 2024-13-45\n", "not valid YAML or JSON: month must be in 1..12"),
    ('{"kind": "List", "items": 5}', "List ?: items: must be a list, got int"),
]


@pytest.mark.parametrize(("content", "message"), INCOMPLETE)
def test_incomplete_or_unbounded_files_are_refused(content: str, message: str) -> None:
    path = Path("/srv/snapshot.yaml")
    with pytest.raises(SnapshotError) as info:
        parse_records(path, content.encode())
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    assert "\n" not in str(info.value)  # one log line


def test_not_utf8() -> None:
    with pytest.raises(SnapshotError, match="not UTF-8 text"):
        parse_records(Path("s.yaml"), b"\xff\xfe" + NS_YAML.encode())


def test_json_needs_no_final_newline() -> None:
    assert len(parse_records(Path("s.json"), json.dumps([NS, SVC]).encode())) == 2


def test_only_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")
    for path, kind in ((fifo, "a FIFO"), (zero, "a character device"), (tmp_path, "a directory")):
        with pytest.raises(SnapshotError) as info:
            read_file(path)  # returns at once: a FIFO is never opened, /dev/zero never read
        assert str(info.value) == (
            f"{path}: not a regular file but {kind}; --snapshot takes a YAML or JSON file"
        )


def test_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(NS_YAML)
    assert read_file(path, max_bytes=len(NS_YAML)) == NS_YAML.encode()
    with pytest.raises(SnapshotError) as info:
        load_records(path, max_bytes=len(NS_YAML) - 1)
    assert str(info.value) == (
        f"{path}: {len(NS_YAML)} bytes, over the limit of {len(NS_YAML) - 1} bytes; "
        "raise --snapshot-max-bytes if it is meant to be this big"
    )
    # A file whose size says nothing (as in /proc) is read up to the limit, and no further.
    with pytest.raises(SnapshotError, match="over the limit of 10 bytes"):
        read_file(Path("/proc/self/status"), max_bytes=10)


def test_watch_waits_for_a_file_written_in_place_to_settle(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(NS_YAML)
    published: list[Snapshot] = []
    source = SnapshotFileSource(path, published.append, interval=0.03)
    source.load()
    services = [
        f"---\napiVersion: v1\nkind: Service\nmetadata: {{name: s{i}, namespace: shop}}\n"
        "spec: {clusterIP: None}\n"
        for i in range(10)
    ]

    async def scenario() -> None:
        task = asyncio.create_task(source.watch())
        # Every prefix is a whole, valid file; written faster than the polls, none is loaded.
        with path.open("a") as file:
            for service in services:
                file.write(service)
                file.flush()
                await asyncio.sleep(0.01)
        for _ in range(300):
            if published:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        task.cancel()

    asyncio.run(scenario())
    assert len(published) == 1
    assert len(published[0].services) == 10
