"""Load Kubernetes objects from a YAML or JSON file, and reload it when it changes.

The file is what `kubectl get -o yaml` prints (a `kind: List`, or a typed list such as
`ServiceList`) or a stream of YAML documents. A file with any bad object is refused whole, with
the file, the object and the reason, so that a reload never serves half an edit.

The file is bounded before it is trusted. Only a regular file is opened (never a device or a
FIFO, even through a symlink), of at most `max_bytes`. Only a whole file is served: it must
parse completely and hold at least one object, and YAML must end with a line break (a write cut
short ends mid-line; JSON cut short does not parse). Nesting is bounded, and so is what YAML
aliases stand for, as Kubernetes' own YAML reader bounds it (PyYAML's `yaml.dump` writes an
alias wherever two objects share a dict; a "billion laughs" file is refused).

Both formats are read one object at a time: each item of a List (and each YAML document or
element of a JSON array) is converted to its slim record as soon as it is parsed, and its parse
tree dropped, so loading takes little more memory than the records it keeps. A reload reads
and parses in a thread, so DNS keeps answering however large the file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import ijson
import yaml
from yaml.composer import Composer, ComposerError
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    MappingEndEvent,
    MappingStartEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
)
from yaml.nodes import Node
from yaml.resolver import Resolver

from toposdns.options import Plugin, Setting, file, sets, size
from toposdns.store.builder import build_snapshot
from toposdns.store.convert import ObjectError, convert_object, describe
from toposdns.store.model import Record
from toposdns.store.placement import EVERYWHERE
from toposdns.store.snapshot import Snapshot

log = logging.getLogger("toposdns")

#: The default of `--snapshot-max-bytes`; 10,000 services with their endpoints take ~20 MiB.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: Far deeper than any Kubernetes object nests.
MAX_DEPTH = 100
#: go-yaml's bound on aliases (used by Kubernetes' YAML reader): past `ALIASED_MIN` nodes that
#: aliases stand for and `DECODED_MIN` nodes in all, at most this share of an object may come
#: from aliases: 99% up to ALIAS_RATIO_LOW nodes, falling to 10% at ALIAS_RATIO_HIGH.
ALIASED_MIN, DECODED_MIN = 100, 1000
ALIAS_RATIO_LOW, ALIAS_RATIO_HIGH = 400_000, 4_000_000

T = TypeVar("T")

try:  # libyaml's parser is many times faster; PyYAML may be built without it.
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    class _Parser(Reader, Scanner, Parser):  # type: ignore[no-redef]
        def __init__(self, stream: str) -> None:
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class _Loader(Composer, SafeConstructor, Resolver, _Parser):
    """libyaml's parser under PyYAML's own composer, which can bound the depth (libyaml's
    composer recurses in C: 100,000 `[` crash the process) and what aliases stand for (each
    stands for a whole subtree, so a small file could stand for an unbounded one).

    `decoded` counts the nodes of the object being read, each alias counted as the nodes it
    stands for, `aliased` those that aliases stand for: the objects built share what an alias
    names, so memory does not grow with them, but the work of reading them would."""

    def __init__(self, stream: bytes) -> None:
        _Parser.__init__(self, stream)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self.depth = 0
        self.decoded = 0
        self.aliased = 0
        #: Nodes each anchor of the document stands for.
        self.sizes: dict[str, int] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        mark: Any = getattr(event, "start_mark", None)  # libyaml's own Mark type
        if isinstance(event, AliasEvent):
            node = super().compose_node(parent, index)
            size = self.sizes.get(event.anchor or "", 1)
            self.decoded += size
            self.aliased += size
            if _excessive_aliasing(self.decoded, self.aliased):
                raise ComposerError(
                    None,
                    None,
                    f"excessive aliasing: {self.aliased} of {self.decoded} nodes come from "
                    "aliases (*name), more than Kubernetes reads",
                    mark,
                )
            return node
        if self.depth >= MAX_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
        self.depth += 1
        start = self.decoded
        self.decoded += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.sizes[anchor] = self.decoded - start
        return node

    def read(self) -> Any:
        """The next value: composed, constructed, its parse tree dropped."""
        self.decoded = self.aliased = 0
        return self.construct_document(self.compose_node(None, None))

    def objects(self) -> Iterator[Any]:
        """The objects of the stream, one at a time: the items of a document that is a list,
        or of a List, and other documents whole."""
        self.get_event()  # stream start
        while not self.check_event(StreamEndEvent):
            self.get_event()  # document start
            if self.check_event(SequenceStartEvent):
                self.get_event()
                while not self.check_event(SequenceEndEvent):
                    yield from _objects([[self.read()]])
                self.get_event()
            elif self.check_event(MappingStartEvent):
                yield from self._mapping_objects()
            else:
                yield from _objects([self.read()])
            self.get_event()  # document end
            self.anchors = {}
            self.sizes = {}

    def _mapping_objects(self) -> Iterator[Any]:
        """A document that is a mapping: a List's items one at a time, else the object."""
        self.get_event()
        top: dict[Any, Any] = {}
        waiting: list[Any] = []  # items without a kind, until the List's kind is known
        streamed = False
        while not self.check_event(MappingEndEvent):
            key = self.read()
            if key == "items" and self.check_event(SequenceStartEvent):
                streamed = True
                self.get_event()
                while not self.check_event(SequenceEndEvent):
                    item = self.read()
                    kind = top.get("kind")
                    if isinstance(item, dict) and "kind" not in item and kind is None:
                        waiting.append(item)
                    else:
                        yield from _list_items({**top, "items": [item]}, _list_kind(kind))
                self.get_event()
            else:
                top[key] = self.read()
        self.get_event()
        kind = top.get("kind")
        if not streamed:
            yield from _objects([top])
        elif waiting:
            yield from _list_items({**top, "items": waiting}, _list_kind(kind))


def _list_kind(kind: Any) -> str:
    """The kind of a List's items read off the List's kind, if it names one."""
    return kind if isinstance(kind, str) and kind.endswith("List") else "List"


def _excessive_aliasing(decoded: int, aliased: int) -> bool:
    """go-yaml's test (`allowedAliasRatio`), which Kubernetes' YAML reader applies."""
    if aliased <= ALIASED_MIN or decoded <= DECODED_MIN:
        return False
    if decoded <= ALIAS_RATIO_LOW:
        allowed = 0.99
    elif decoded >= ALIAS_RATIO_HIGH:
        allowed = 0.10
    else:
        share = (decoded - ALIAS_RATIO_LOW) / (ALIAS_RATIO_HIGH - ALIAS_RATIO_LOW)
        allowed = 0.99 - 0.89 * share
    return aliased / decoded > allowed


@dataclass(frozen=True, slots=True)
class SnapshotOptions:
    """`--snapshot FILE`: serve a file's objects instead of watching a cluster."""

    path: Path | None = None
    #: Larger files are refused before they are read.
    max_bytes: int = DEFAULT_MAX_BYTES


SNAPSHOT: Plugin[SnapshotOptions] = Plugin(
    "snapshot",
    SnapshotOptions,
    (
        Setting(
            "snapshot",
            sets("path", file("cluster.yaml")),
            "--snapshot",
            "FILE",
            "serve the objects in this YAML/JSON file, reloaded when it changes "
            "(default: watch the cluster)",
        ),
        Setting(
            "snapshot_max_bytes",
            sets("max_bytes", size),
            "--snapshot-max-bytes",
            "SIZE",
            "refuse a larger --snapshot file, e.g. 512Ki, 64Mi, 1Gi (default {default} bytes)",
            shows="max_bytes",
        ),
    ),
    directive="toposdns",
)


class SnapshotError(Exception):
    """A snapshot file that cannot be served."""


def read_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; SnapshotError if it is not one."""
    try:
        # Checked before opening: opening a FIFO blocks, and opening a device may act on it.
        _check_file(path, os.stat(path), max_bytes)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        with open(fd, "rb") as file:
            before = os.fstat(fd)
            _check_file(path, before, max_bytes)  # the path may have been swapped meanwhile
            data = file.read(max_bytes + 1)
            after = os.fstat(fd)
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise _too_large(path, max_bytes)
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        raise SnapshotError(
            f"{path}: changed while being read; it is read again once it stops changing "
            "(write it to a temporary file, then rename that into place)"
        )
    return data


def _check_file(path: Path, st: os.stat_result, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise SnapshotError(
            f"{path}: not a regular file but {_file_kind(st.st_mode)}; "
            "--snapshot takes a YAML or JSON file"
        )
    if st.st_size > max_bytes:
        raise _too_large(path, max_bytes, st.st_size)


def _too_large(path: Path, max_bytes: int, size: int | None = None) -> SnapshotError:
    known = f"{size} bytes, " if size is not None else ""  # /proc files say 0 and are not
    return SnapshotError(
        f"{path}: {known}over the limit of {max_bytes} bytes; "
        "raise --snapshot-max-bytes if it is meant to be this big"
    )


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), f"of mode {mode:o}")


def parse_records(path: Path, data: bytes) -> list[Record]:
    """Parse and convert the bytes of a file (`path` names it in errors); SnapshotError if
    they are not a whole snapshot."""
    try:
        data.decode("utf-8")  # checked, not kept: the parsers read the bytes
    except UnicodeDecodeError as exc:
        raise SnapshotError(f"{path}: not UTF-8 text: {exc}") from None
    if not data.strip():
        raise SnapshotError(f"{path}: empty; a snapshot holds at least one object")
    is_json = data.lstrip().startswith((b"{", b"["))
    cut = not is_json and not data.endswith((b"\n", b"\r"))
    try:
        objects = _json_objects(data) if is_json else _Loader(data).objects()
        records = _convert(path, objects)
    except SnapshotError:
        if cut:  # the last object is likely cut short: say why
            raise _cut_short(path) from None
        raise
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{path}: not valid YAML or JSON: {_yaml_problem(exc)}") from None
    except ijson.JSONError as exc:
        raise SnapshotError(f"{path}: not valid YAML or JSON: {_json_problem(exc)}") from None
    except RecursionError:
        raise SnapshotError(f"{path}: not valid YAML or JSON: nested too deeply") from None
    except ValueError as exc:  # bad JSON, or a YAML value its tag cannot hold (2024-13-45)
        raise SnapshotError(f"{path}: not valid YAML or JSON: {exc}") from None
    if cut:
        raise _cut_short(path)
    if not records:
        raise SnapshotError(f"{path}: holds no objects; a snapshot holds at least one")
    return records


def _cut_short(path: Path) -> SnapshotError:
    return SnapshotError(
        f"{path}: ends mid-line, as a file still being written does; write the file to a "
        "temporary name, then rename it into place (if it is whole, end it with a newline)"
    )


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: where, what, and while doing what."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f" ({exc.context})" if exc.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}{context}"
    return " ".join(str(exc).split())


def _convert(path: Path, objects: Iterable[Any]) -> list[Record]:
    """Each object converted as it comes (and then dropped); SnapshotError for a bad one, once
    the rest of the file has parsed (a syntax error further on is the one to report)."""
    records: list[Record] = []
    seen: set[tuple[str, str, str]] = set()
    remaining = iter(objects)
    problem = ""
    try:
        for raw in remaining:
            record = convert_object(raw)
            key = (type(record).__name__, getattr(record, "namespace", ""), record.name)
            if key in seen:
                problem = f"{describe(raw)}: appears twice; keep one"
                break
            seen.add(key)
            records.append(record)
    except ObjectError as exc:
        problem = f"{exc}; fix or remove that object"
    if problem:
        with contextlib.suppress(ObjectError):
            for _ in remaining:
                pass
        raise SnapshotError(f"{path}: {problem}")
    return records


def load_records(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Record]:
    """Read and convert every object in the file; raise SnapshotError naming what is wrong."""
    return parse_records(path, read_file(path, max_bytes))


def load_snapshot(
    path: Path,
    serial: int | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    locator_namespaces: frozenset[str] = EVERYWHERE,
) -> Snapshot:
    """Load a file into a Snapshot whose SOA serial is `serial` (default: now), believing the
    PodLocators of `locator_namespaces`."""
    records = load_records(path, max_bytes)
    serial = int(time.time()) if serial is None else serial
    return build_snapshot(records, serial, locator_namespaces=locator_namespaces)


def _json_objects(data: bytes) -> Iterator[Any]:
    """The objects of a JSON file, each parsed when it is reached (ijson's C parser): the
    items of a List one at a time, as the YAML loader reads them, never the whole tree."""
    if _json_depth(data) > MAX_DEPTH:
        raise RecursionError()  # ijson's cost grows with the square of the depth
    if data.lstrip().startswith(b"["):  # an array of objects: one element at a time
        yield from _objects(ijson.items(io.BytesIO(data), "item", use_float=True))
        return
    # One object. kubectl writes a List's "kind" after its "items", so look it up first: a
    # pass over the bytes in C that builds nothing.
    kind = next(ijson.items(io.BytesIO(data), "kind"), None)
    if (
        not isinstance(kind, str) or not kind.endswith("List") or _items_type(data) != "start_array"
    ):  # not a List, or not one of items: the object, whole
        yield from _objects(list(ijson.items(io.BytesIO(data), "", use_float=True)))
        return
    api_version = next(ijson.items(io.BytesIO(data), "apiVersion"), None)
    list_kind = {"kind": kind, "apiVersion": api_version}
    for item in ijson.items(io.BytesIO(data), "items.item", use_float=True):
        yield from _list_items({**list_kind, "items": [item]}, kind)


_QUOTED = re.compile(rb'"[^"]*"')
_INNERMOST = re.compile(rb"\[\]|\{\}")
_NOT_STRUCTURE = bytes(set(range(256)) - set(b'[]{}"'))
#: Bytes examined at a time by `_json_depth` (its memory is about twice this).
_DEPTH_CHUNK = 1 << 22


def _json_depth(data: bytes) -> int:
    """How deep JSON nests, up to MAX_DEPTH + 1, at C speed and in bounded memory.

    Chunk by chunk: escaped backslashes and quotes out, then all but brackets and quotes, then
    what is between quotes (a string open at a chunk's end stays open into the next). Of the
    brackets left, innermost pairs go once per level; unbalanced ones are the parser's to
    report."""
    brackets = bytearray()
    in_string = False
    start = 0
    while start < len(data):
        end = start + _DEPTH_CHUNK
        while end < len(data) and data[end - 1] == 0x5C:  # never cut after a backslash
            end += 1
        chunk = data[start:end].replace(b"\\\\", b"").replace(b'\\"', b"")
        kept = (b'"' if in_string else b"") + chunk.translate(None, _NOT_STRUCTURE)
        in_string = kept.count(b'"') % 2 == 1
        brackets += _QUOTED.sub(b"", kept + b'"' if in_string else kept)
        start = end
    depth, left = 0, bytes(brackets)
    while left and depth <= MAX_DEPTH:
        inner = _INNERMOST.sub(b"", left)
        if len(inner) == len(left):
            break
        left, depth = inner, depth + 1
    return depth


def _items_type(data: bytes) -> str | None:
    """The parse event that starts the top-level `items` ("start_array" for a list), None
    when there is none. Reads events only until it: the keys before it are small."""
    for prefix, event, _value in ijson.parse(io.BytesIO(data)):
        if prefix == "items" and event != "map_key":
            return str(event)
        if prefix == "" and event == "end_map":
            break
    return None


def _json_problem(exc: ijson.JSONError) -> str:
    """ijson's message on one line (it draws the place on the lines after)."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _objects(documents: Iterable[Any]) -> Iterator[Any]:
    for doc in documents:
        if doc is None:
            continue
        # A JSON array, or a YAML document that is a list, holds objects (not more lists).
        for item in doc if isinstance(doc, list) else (doc,):
            kind = item.get("kind", "") if isinstance(item, dict) else ""
            if isinstance(kind, str) and kind.endswith("List") and "items" in item:
                yield from _list_items(item, kind)
            else:
                yield item


def _list_items(doc: dict[str, Any], kind: str) -> Iterator[Any]:
    items = doc.get("items") or []
    if not isinstance(items, list):
        raise ObjectError(doc, "items", f"must be a list, got {type(items).__name__}")
    # Typed lists (ServiceList, ...) from the raw API leave kind out of their items.
    item_kind = kind[: -len("List")]
    for item in items:
        if isinstance(item, dict) and item_kind and "kind" not in item:
            item = {"kind": item_kind, "apiVersion": doc.get("apiVersion"), **item}
        yield item


class SnapshotFileSource:
    """Polls a snapshot file and publishes a new Snapshot whenever its content changes.

    Polling the file's identity (inode, size, mtime) once a second keeps working when the file
    is a ConfigMap mount, where an update swaps a symlink rather than writing the file. A
    changed file is loaded once it has stayed the same for one more poll, so that a file being
    written in place is not read half-way.
    """

    def __init__(
        self,
        path: Path,
        publish: Callable[[Snapshot], None],
        interval: float = 1.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        locator_namespaces: frozenset[str] = EVERYWHERE,
    ) -> None:
        self.path = path
        self.publish = publish
        self.interval = interval
        self.max_bytes = max_bytes
        #: The namespaces whose PodLocators are believed.
        self.locator_namespaces = locator_namespaces
        self.serial = 0
        self.objects = 0  # in the last file loaded
        self._signature: tuple[int, int, int] | None = None

    def load(self) -> Snapshot:
        """Load the file now; raises SnapshotError. Serials only ever grow."""
        self._signature = self._stat()
        records = load_records(self.path, self.max_bytes)
        self.objects = len(records)
        self.serial = max(int(time.time()), self.serial + 1)
        return build_snapshot(records, self.serial, locator_namespaces=self.locator_namespaces)

    async def watch(self) -> None:
        """Reload on change forever; a failed reload is logged and the last good data stays."""
        settling = None
        while True:
            await asyncio.sleep(self.interval)
            signature = self._stat()
            if signature is None or signature == self._signature:
                settling = None
                continue
            if signature != settling:
                settling = signature  # changed since the last poll: it may still be written
                continue
            settling = None
            started = time.monotonic()
            try:
                snapshot = await _in_thread(self.load)
            except SnapshotError as exc:
                log.error("reload refused, still serving the previous data: %s", exc)
                continue
            took = time.monotonic() - started
            log.info("reloaded %s: %d objects in %.2fs", self.path, self.objects, took)
            self.publish(snapshot)

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)


async def _in_thread(work: Callable[[], T]) -> T:
    """Run `work` in a daemon thread: the loop goes on meanwhile, and shutting down does not
    wait for a long parse to end (asyncio.to_thread's executor is joined at exit)."""
    done: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(work())
            except BaseException as exc:  # handed to the awaiting task
                done.set_exception(exc)

    threading.Thread(target=run, name="snapshot-load", daemon=True).start()
    return await asyncio.wrap_future(done)
