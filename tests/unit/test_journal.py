"""A journaled builder's changes, pickled and replayed on a copy, give the copy the same
snapshots: the same indexes in the same order, and the same `changes` for its caches."""

from __future__ import annotations

import pickle
import random

from tests.unit.test_builder import comparable, random_record
from toposdns.store.builder import StoreBuilder, record_key
from toposdns.store.journal import JournaledBuilder, Put, Remove, replay
from toposdns.store.model import Namespace, PodLocator, Record


def test_replayed_changes_give_the_same_snapshots() -> None:
    rng = random.Random(11)
    source, copy = JournaledBuilder(), StoreBuilder()
    first = [random_record(rng) for _ in range(40)]
    for builder in (source, copy):  # as the first sync, before the copy was forked
        for record in first:
            builder.put(record)
    assert source.journal is None and source.take_journal() == ()  # nothing noted until asked
    source_last = source.snapshot(1)
    copy.snapshot(1)
    source.start_journal()
    current = {record_key(record): record for record in first}
    for step in range(2, 400):
        if current and rng.random() < 0.3:
            key = rng.choice(sorted(current, key=str))
            del current[key]
            source.remove(*key)
        elif rng.random() < 0.05:
            namespaces: list[Record] = [Namespace(rng.choice("abc")) for _ in range(2)]
            source.replace_all(Namespace, namespaces)
        else:
            record = random_record(rng)
            current[record_key(record)] = record
            source.put(record)
        if step % 7:
            continue
        sent = pickle.loads(pickle.dumps(source.take_journal()))
        snapshot = source.snapshot(step)
        replay(copy, sent)
        replayed = copy.snapshot(step)
        assert comparable(replayed) == comparable(snapshot), step
        assert dict(replayed.slices) == dict(snapshot.slices)  # tuple order too
        assert dict(replayed.service_ips) == dict(snapshot.service_ips)
        assert replayed.changes == snapshot.changes
        assert snapshot.follows(source_last)
        source_last = snapshot


def test_only_changes_are_noted() -> None:
    builder = JournaledBuilder()
    builder.start_journal()
    locator = PodLocator("a", "p", ("10.0.0.1",), "n1", {"k": "v"})
    assert builder.put(locator)
    assert not builder.put(PodLocator("a", "p", ("10.0.0.1",), "n1", {"k": "v"}))
    assert not builder.remove(PodLocator, "a", "missing")
    assert builder.remove(PodLocator, "a", "p")
    assert builder.take_journal() == (Put(locator), Remove(PodLocator, "a", "p"))
    assert builder.take_journal() == ()


def test_a_change_invisible_to_the_indexes_is_still_published() -> None:
    builder = JournaledBuilder()
    builder.start_journal()
    builder.snapshot(1)
    assert builder.put(PodLocator("a", "nowhere", (), "", {}))  # no address, not a node
    assert builder.dirty


def test_a_relist_of_locators_is_noted_for_the_copies() -> None:
    # After the copies were forked, a relist (410 Gone) replaces the locators in one call.
    source, copy = JournaledBuilder(), StoreBuilder()
    old = PodLocator("a", "p", ("10.0.0.1",), "n1", {"k": "v"})
    for builder in (source, copy):
        builder.put(old)
    source.start_journal()
    moved = PodLocator("a", "p", ("10.0.0.2",), "n1", {"k": "v"})
    new = PodLocator("a", "q", ("10.0.0.3",), "n2", {"k": "w"})
    assert source.replace_all(PodLocator, [moved, new])
    replay(copy, source.take_journal())
    assert comparable(copy.snapshot(1)) == comparable(source.snapshot(1))
    assert copy.snapshot(2).place("10.0.0.3").locator == new
