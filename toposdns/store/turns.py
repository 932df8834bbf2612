"""Where each weighted rotation of A and AAAA replies stands (docs/topology.md, "Soft
topology"): a counter per rotation, shared by the reply cache's entries and the resolver, so
that a reply from the cache and one built anew take the same next turn. Compiled: a cache hit
takes its turn here."""

from __future__ import annotations


class TurnCounts:
    """Where each weighted rotation of A and AAAA replies stands: per (namespace, service,
    question type, client signature), the turn the next reply takes (0 to store/topology.py
    `ROTATION` - 1), in a
    one-item list that the reply cache's entries share (serve/cache.py `Turns`), so that a
    reply from the cache and one built anew take the same next turn. One per server process;
    bounded (`KEPT`): past it every rotation starts again at its first turn."""

    __slots__ = ("counters",)

    #: Rotations remembered: weighted services times their clients' signatures.
    KEPT = 65536

    def __init__(self) -> None:
        self.counters: dict[tuple[object, ...], list[int]] = {}

    def counter(self, key: tuple[object, ...]) -> list[int]:
        """The counter of one rotation, made at turn 0 when new."""
        found = self.counters.get(key)
        if found is None:
            if len(self.counters) >= self.KEPT:
                self.counters.clear()
            found = self.counters[key] = [0]
        return found


def take_turn(counter: list[int], length: int) -> int:
    """The turn a reply takes (then the counter moves on, wrapping at `length`)."""
    turn = counter[0]
    if turn >= length:  # the schedule got shorter
        turn = 0
    counter[0] = turn + 1 if turn + 1 < length else 0
    return turn
