"""A StoreBuilder that notes the changes it makes, so another copy of it can make them too.

With `--workers N`, the supervisor's builder is the one the source changes; each worker holds a
copy (inherited when it was forked) and replays the supervisor's changes on it, so both copies
stay equal and each worker's snapshots carry the same `changes` (its caches drop only what a
change touched). Only changes are noted: an update equal to what is stored is none.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from toposdns.store.builder import StoreBuilder
from toposdns.store.model import PodLocator, Record
from toposdns.store.placement import EVERYWHERE


class Put(NamedTuple):
    """`StoreBuilder.put(record)`."""

    record: Record


class Remove(NamedTuple):
    """`StoreBuilder.remove(kind, namespace, name)`."""

    kind: type
    namespace: str
    name: str


Operation = Put | Remove


class JournaledBuilder(StoreBuilder):
    """A StoreBuilder that, while `journal` is a list, appends each change it makes to it."""

    def __init__(self, locator_namespaces: frozenset[str] = EVERYWHERE) -> None:
        super().__init__(locator_namespaces)
        #: The changes since the last `take_journal()`; None: not noting (until
        #: `start_journal()`, and in a copy that replays).
        self.journal: list[Operation] | None = None

    @property
    def dirty(self) -> bool:
        # A change can leave the indexes as they were (a PodLocator without addresses); it
        # still has to reach the copies.
        return super().dirty or bool(self.journal)

    def put(self, record: Record) -> bool:
        changed = super().put(record)
        if changed and self.journal is not None:
            self.journal.append(Put(record))
        return changed

    def _put_locators(self, locators: Iterable[PodLocator]) -> bool:
        # A full list's shortcut bypasses `put`: once copies replay the journal (a relist
        # after the workers were forked), each locator takes `put`, to be noted.
        if self.journal is None:
            return super()._put_locators(locators)
        changed = False
        for locator in locators:
            changed |= self.put(locator)
        return changed

    def remove(self, kind: type, namespace: str, name: str) -> bool:
        changed = super().remove(kind, namespace, name)
        if changed and self.journal is not None:
            self.journal.append(Remove(kind, namespace, name))
        return changed

    def start_journal(self) -> None:
        """Note changes from now on (when the first copy is made)."""
        if self.journal is None:
            self.journal = []

    def take_journal(self) -> tuple[Operation, ...]:
        """The changes noted since the last call."""
        if not self.journal:
            return ()
        taken = tuple(self.journal)
        self.journal.clear()
        return taken


def replay(builder: StoreBuilder, operations: Iterable[Operation]) -> None:
    """Make the changes of another builder's journal on this one, in order."""
    for operation in operations:
        if isinstance(operation, Put):
            builder.put(operation.record)
        else:
            builder.remove(operation.kind, operation.namespace, operation.name)
