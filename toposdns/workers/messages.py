"""What the supervisor and its workers say to each other over their socket pair.

One frozen dataclass per kind of message, pickled, after its length (4 bytes, big-endian).
Both ends are the same program, forked from one process, so pickle is safe here; nothing from
outside is ever unpickled. Messages on one socket arrive in the order they were sent, which is
what keeps a worker's data in the supervisor's order.
"""

from __future__ import annotations

import asyncio
import copyreg
import pickle
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from prometheus_client import Metric

from toposdns.config import ServeConfig
from toposdns.store.journal import Operation
from toposdns.store.snapshot import Snapshot

# Supervisor -> worker


@dataclass(frozen=True, slots=True)
class Changes:
    """Replay these changes of the supervisor's builder, then publish a snapshot (the cluster's
    source). `batch` numbers the data messages, for `Applied`."""

    batch: int
    serial: int
    synced: bool
    operations: tuple[Operation, ...]


@dataclass(frozen=True, slots=True)
class Replace:
    """Serve this snapshot instead (a snapshot file reloaded)."""

    batch: int
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class Scrape:
    """Send your metric families (`Families`)."""

    request: int


@dataclass(frozen=True, slots=True)
class Stop:
    """Shut down: keep answering for --lameduck seconds, or not at all if `now`."""

    now: bool


# Worker -> supervisor


@dataclass(frozen=True, slots=True)
class Serving:
    """The worker answers on the DNS port."""


@dataclass(frozen=True, slots=True)
class Applied:
    """The worker serves the data of this batch."""

    batch: int


@dataclass(frozen=True, slots=True)
class Families:
    """The worker's metric families, answering `Scrape(request)`."""

    request: int
    families: list[Metric]


@dataclass(frozen=True, slots=True)
class Looped:
    """A forwarding loop probe (its question) came back to the worker."""

    question: bytes


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Answer by this configuration from now on (a reloaded Corefile)."""

    config: ServeConfig


Message = Changes | Replace | Scrape | Stop | Reconfigure | Serving | Applied | Families | Looped


def rebuilt(value: Any) -> tuple[type, tuple[Any, ...]]:
    """How pickle makes a frozen dataclass again: by its constructor, from its fields."""
    return type(value), tuple(getattr(value, field.name) for field in fields(value))


# The options a Reconfigure carries that are defined in modules compiled with mypyc (the
# resolver's, the cache's, bufsize, any): their instances have no __dict__ for pickle to fill
# and a frozen __setattr__, so pickle's default fails on them. Rebuilding by the constructor
# works for both builds; every option with only init fields goes that way.
for _options in (getattr(ServeConfig(), field.name) for field in fields(ServeConfig)):
    if is_dataclass(_options) and all(field.init for field in fields(_options)):
        copyreg.pickle(type(_options), rebuilt)


def frame(message: Message) -> bytes:
    """The bytes that carry a message."""
    data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(4, "big") + data


async def receive(reader: asyncio.StreamReader) -> Message | None:
    """The next message; None when the other end has closed (its process has ended)."""
    try:
        size = int.from_bytes(await reader.readexactly(4), "big")
        message: Message = pickle.loads(await reader.readexactly(size))
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return message
