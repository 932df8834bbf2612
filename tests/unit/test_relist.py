"""A full list applied page by page (`StoreBuilder.relist`), and the reflector handing a list over
so: changed objects go in as their page arrives, unchanged ones keep the stored record, what
the list lacks goes only when it is complete, a list that breaks off deletes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toposdns.source.watch import Reflector, Resource, WatchSettings
from toposdns.store.builder import StoreBuilder
from toposdns.store.journal import JournaledBuilder, Put, Remove
from toposdns.store.model import Namespace, PodLocator, Port, Record, Service

HTTP = (Port("http", "TCP", 80),)


def svc(name: str, ip: str, namespace: str = "shop") -> Service:
    # The strings are built anew each time, as a decoded list page's are.
    return Service("".join(namespace), "".join(name), "ClusterIP", ("".join(ip),), HTTP)


def loc(name: str, ip: str) -> PodLocator:
    return PodLocator("toposdns", "".join(name), (ip,), "n1", {"zone": "z1"})


def names(builder: StoreBuilder, kind: type) -> set[tuple[str, str]]:
    return builder.keys(kind)


def stored_ips(builder: StoreBuilder) -> dict[str, tuple[str, ...]]:
    return {name: s.cluster_ips for (_, name), s in builder.snapshot(0).services.items()}


BEFORE = [svc("same", "10.96.0.1"), svc("moved", "10.96.0.2"), svc("gone", "10.96.0.3")]

# (what: pages of the relist, whether each page changes the store, whether finish does, the
# services after each page, and after finish)
CASES: list[
    tuple[str, list[list[Service]], list[bool], bool, list[dict[str, str]], dict[str, str]]
] = [
    (
        "nothing changed",
        [[svc("same", "10.96.0.1"), svc("moved", "10.96.0.2")], [svc("gone", "10.96.0.3")]],
        [False, False],
        False,
        [{"same": "10.96.0.1", "moved": "10.96.0.2", "gone": "10.96.0.3"}] * 2,
        {"same": "10.96.0.1", "moved": "10.96.0.2", "gone": "10.96.0.3"},
    ),
    (
        "changed, added and deleted across pages",
        [[svc("same", "10.96.0.1"), svc("moved", "10.96.9.9")], [svc("new", "10.96.0.4")]],
        [True, True],
        True,
        [
            # Page 1's change is in at once; `gone` stays until the list is complete.
            {"same": "10.96.0.1", "moved": "10.96.9.9", "gone": "10.96.0.3"},
            {"same": "10.96.0.1", "moved": "10.96.9.9", "gone": "10.96.0.3", "new": "10.96.0.4"},
        ],
        {"same": "10.96.0.1", "moved": "10.96.9.9", "new": "10.96.0.4"},
    ),
    (
        "an empty list deletes everything, at the end",
        [[]],
        [False],
        True,
        [{"same": "10.96.0.1", "moved": "10.96.0.2", "gone": "10.96.0.3"}],
        {},
    ),
]


@pytest.mark.parametrize(
    "pages, page_changes, finish_changes, after_pages, after_finish",
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_relist_page_by_page(
    pages: list[list[Service]],
    page_changes: list[bool],
    finish_changes: bool,
    after_pages: list[dict[str, str]],
    after_finish: dict[str, str],
) -> None:
    builder = StoreBuilder()
    for record in BEFORE:
        builder.put(record)
    relist = builder.relist(Service)
    for page, changes, after in zip(pages, page_changes, after_pages, strict=True):
        assert relist.page(list(page)) is changes
        assert stored_ips(builder) == {name: (ip,) for name, ip in after.items()}
    assert relist.finish() is finish_changes
    assert stored_ips(builder) == {name: (ip,) for name, ip in after_finish.items()}
    assert relist.count == sum(len(page) for page in pages)


def test_an_unchanged_object_keeps_the_stored_record_and_its_strings() -> None:
    builder = StoreBuilder()
    old = svc("same", "10.96.0.1")
    builder.put(old)
    relist = builder.relist(Service)
    new = svc("same", "10.96.0.1")
    assert new == old and new.name is not old.name
    relist.page([new])
    assert builder.service("shop", "same") is old
    # What the list named is held as the stored strings: the page's copies die with it.
    assert relist.seen is not None
    [(namespace, held)] = relist.seen.items()
    assert namespace is old.namespace and next(iter(held)) is old.name


def test_a_relist_that_breaks_off_deletes_nothing_and_the_next_one_completes() -> None:
    builder = StoreBuilder()
    for record in BEFORE:
        builder.put(record)
    broken = builder.relist(Service)
    broken.page([svc("moved", "10.96.9.9")])  # then the API went away: no finish
    assert stored_ips(builder)["gone"] == ("10.96.0.3",)
    assert stored_ips(builder)["moved"] == ("10.96.9.9",)
    again = builder.relist(Service)
    again.page([svc("same", "10.96.0.1")])
    again.page([svc("moved", "10.96.9.9")])
    assert again.finish()
    assert stored_ips(builder) == {"same": ("10.96.0.1",), "moved": ("10.96.9.9",)}


def test_kept_objects_stay_and_other_kinds_are_untouched() -> None:
    builder = StoreBuilder()
    for record in [*BEFORE, Namespace("shop"), loc("a", "10.1.0.1"), loc("b", "10.1.0.2")]:
        builder.put(record)
    relist = builder.relist(PodLocator)
    relist.page([loc("a", "10.1.0.1")], keep=[("toposdns", "b")])  # b malformed in the list
    assert not relist.finish()
    assert names(builder, PodLocator) == {("toposdns", "a"), ("toposdns", "b")}
    assert len(names(builder, Service)) == 3 and names(builder, Namespace) == {("", "shop")}
    relist = builder.relist(PodLocator)
    relist.page([loc("b", "10.1.0.2")])
    assert relist.finish()
    assert names(builder, PodLocator) == {("toposdns", "b")}
    assert builder.snapshot(1).locators.get("10.1.0.1") is None


def test_a_journaled_relist_notes_only_the_changes() -> None:
    builder = JournaledBuilder()
    for record in BEFORE:
        builder.put(record)
    builder.start_journal()
    relist = builder.relist(Service)
    relist.page([svc("same", "10.96.0.1"), svc("moved", "10.96.9.9")])
    relist.finish()
    assert builder.take_journal() == (
        Put(svc("moved", "10.96.9.9")),
        Remove(Service, "shop", "gone"),
    )


class Recorder:
    """A sink that takes lists page by page and records what it was handed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def relist(self, resource: Resource) -> Recorder:
        self.calls.append(("relist", resource.name))
        return self

    def page(self, items: list[Any]) -> None:
        self.calls.append(("page", [item["metadata"]["name"] for item in items]))

    def finish(self) -> None:
        self.calls.append(("finish", None))

    def replace(self, resource: Resource, items: list[Record]) -> None:
        self.calls.append(("replace", len(items)))

    def upsert(self, resource: Resource, obj: Any) -> None:
        raise AssertionError("no watch here")

    def delete(self, resource: Resource, obj: Any) -> None:
        raise AssertionError("no watch here")


class Pages:
    """A stand-in for the API: `pages` list pages, one per request, with continue tokens."""

    def __init__(self, pages: list[list[str]]) -> None:
        self.pages = pages

    def answer(self, token: str | None) -> dict[str, Any]:
        index = int(token or 0)
        last = index + 1 == len(self.pages)
        items = [{"metadata": {"name": name}} for name in self.pages[index]]
        meta = {"resourceVersion": "7", "continue": "" if last else str(index + 1)}
        return {"metadata": meta, "items": items}


def test_the_reflector_hands_a_list_over_page_by_page() -> None:
    pages = Pages([["a", "b"], ["c"], ["d"]])
    sink = Recorder()
    reflector = Reflector.__new__(Reflector)  # no API client: `request` is the stand-in
    reflector.resource = Resource("things", "Thing", "v1")
    reflector.sink = sink
    reflector.settings = WatchSettings(page_size=2)
    reflector.on_page = None
    reflector.prepare = lambda _resource, obj: obj
    reflector.relist = sink.relist

    async def request(**params: Any) -> dict[str, Any]:
        return pages.answer(params.get("_continue"))

    reflector.request = request  # type: ignore[method-assign]
    assert asyncio.run(reflector.list()) == "7"
    assert sink.calls == [
        ("relist", "things"),
        ("page", ["a", "b"]),
        ("page", ["c"]),
        ("page", ["d"]),
        ("finish", None),
    ]
