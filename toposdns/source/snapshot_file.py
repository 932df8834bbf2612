"""Load Kubernetes objects from a YAML or JSON file, and reload it when it changes.

The file is what `kubectl get -o yaml` prints (a `kind: List`, or a typed list such as
`ServiceList`) or a stream of YAML documents. A file with any bad object is refused whole, with
the file, the object and the reason, so that a reload never serves half an edit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from toposdns.store.builder import build_snapshot
from toposdns.store.convert import ObjectError, convert_object, describe
from toposdns.store.model import Record
from toposdns.store.snapshot import Snapshot

log = logging.getLogger("toposdns")

# libyaml's loader is many times faster on large files; PyYAML may be built without it.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SnapshotError(Exception):
    """A snapshot file that cannot be served."""


def load_records(path: Path) -> list[Record]:
    """Read and convert every object in the file; raise SnapshotError naming what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{path}: cannot read: {exc}") from None
    try:
        if text.lstrip().startswith(("{", "[")):
            documents: list[Any] = [json.loads(text)]
        else:
            documents = list(yaml.load_all(text, Loader=_Loader))
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SnapshotError(f"{path}: not valid YAML or JSON: {exc}") from None

    records: list[Record] = []
    seen: set[tuple[str, str, str]] = set()
    for raw in _objects(documents):
        try:
            record = convert_object(raw)
        except ObjectError as exc:
            raise SnapshotError(f"{path}: {exc}; fix or remove that object") from None
        key = (type(record).__name__, getattr(record, "namespace", ""), record.name)
        if key in seen:
            raise SnapshotError(f"{path}: {describe(raw)}: appears twice; keep one")
        seen.add(key)
        records.append(record)
    return records


def load_snapshot(path: Path, serial: int | None = None) -> Snapshot:
    """Load a file into a Snapshot whose SOA serial is `serial` (default: now)."""
    return build_snapshot(load_records(path), int(time.time()) if serial is None else serial)


def _objects(documents: list[Any]) -> Iterator[Any]:
    for doc in documents:
        if doc is None:
            continue
        if isinstance(doc, list):
            yield from _objects(doc)
            continue
        kind = doc.get("kind", "") if isinstance(doc, dict) else ""
        if isinstance(kind, str) and kind.endswith("List") and "items" in doc:
            items = doc.get("items") or []
            # Typed lists (ServiceList, ...) from the raw API leave kind out of their items.
            item_kind = kind[: -len("List")]
            for item in items:
                if isinstance(item, dict) and item_kind and "kind" not in item:
                    item = {"kind": item_kind, "apiVersion": doc.get("apiVersion"), **item}
                yield item
            continue
        yield doc


class SnapshotFileSource:
    """Polls a snapshot file and publishes a new Snapshot whenever its content changes.

    Polling the file's identity (inode, size, mtime) once a second keeps working when the file
    is a ConfigMap mount, where an update swaps a symlink rather than writing the file.
    """

    def __init__(
        self, path: Path, publish: Callable[[Snapshot], None], interval: float = 1.0
    ) -> None:
        self.path = path
        self.publish = publish
        self.interval = interval
        self.serial = 0
        self._signature: tuple[int, int, int] | None = None

    def load(self) -> Snapshot:
        """Load the file now; raises SnapshotError. Serials only ever grow."""
        self._signature = self._stat()
        self.serial = max(int(time.time()), self.serial + 1)
        return load_snapshot(self.path, self.serial)

    async def watch(self) -> None:
        """Reload on change forever; a failed reload is logged and the last good data stays."""
        while True:
            await asyncio.sleep(self.interval)
            signature = self._stat()
            if signature is None or signature == self._signature:
                continue
            try:
                snapshot = self.load()
            except SnapshotError as exc:
                log.error("reload refused, still serving the previous data: %s", exc)
                continue
            log.info("reloaded %s", self.path)
            self.publish(snapshot)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)
