"""Decide the one write that makes a locator what it should be: a pure function, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toposdns.controller.desired import Object, content_of
from toposdns.controller.state import LocatorState


@dataclass(frozen=True, slots=True)
class Create:
    """POST this locator."""

    body: Object


@dataclass(frozen=True, slots=True)
class Update:
    """PUT this locator (it carries the resourceVersion it replaces)."""

    body: Object


@dataclass(frozen=True, slots=True)
class Delete:
    """DELETE the locator, on condition that it is still this uid and resourceVersion."""

    uid: str
    version: str


@dataclass(frozen=True, slots=True)
class Foreign:
    """A locator is wanted where one not managed by toposdns stands: leave it alone."""


Action = Create | Update | Delete | Foreign


def plan(want: Object | None, have: LocatorState | None) -> Action | None:
    """The write from `have` (the locator there now, if any) to `want` (None: no locator);
    None when nothing is to be done. Locators not labelled as managed by toposdns are never
    changed or deleted."""
    if have is not None and not have.managed:
        return Foreign() if want is not None else None
    if want is None:
        return Delete(have.uid, have.version) if have is not None else None
    if have is None:
        return Create(want)
    if content_of(want) == have.content:
        return None
    return Update(update_body(want, have))


def update_body(want: Object, have: LocatorState) -> Object:
    """`want` as a replacement of `have`: its resourceVersion (optimistic concurrency), and the
    labels, annotations and finalizers others have set, kept."""
    metadata: dict[str, Any] = dict(want["metadata"], resourceVersion=have.version)
    extra = have.extra or {}
    if "labels" in extra:
        metadata["labels"] = {**extra["labels"], **metadata["labels"]}
    for name in ("annotations", "finalizers"):
        if name in extra:
            metadata[name] = extra[name]
    return dict(want, metadata=metadata)
