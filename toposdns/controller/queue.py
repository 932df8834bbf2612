"""A work queue of keys with client-go's workqueue semantics, and a token bucket.

The queue holds each key at most once: adding a key that is already waiting does nothing, and
adding one that is being processed makes it come back once that is done (never two workers on
one key). Keys become ready after a delay, which gathers a burst of changes into one reconcile,
and failed keys come back after an exponential backoff.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """De-duplicating, delaying queue; `get` hands out ready keys, oldest first."""

    def __init__(
        self,
        backoff_initial: float = 0.05,
        backoff_max: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        depth: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.clock = clock
        self.report_depth = depth
        self._due: dict[K, float] = {}  # waiting key -> when it becomes ready
        self._heap: list[tuple[float, int, K]] = []  # entries not matching _due are stale
        self._seq = 0
        self._processing: set[K] = set()
        self._again: dict[K, float] = {}  # key being processed -> delay to re-add it with
        self._failures: dict[K, int] = {}
        self._wakeup = asyncio.Event()

    def __len__(self) -> int:
        """Keys waiting (ready or not), not counting those being processed."""
        return len(self._due)

    @property
    def idle(self) -> bool:
        """Nothing waiting and nothing being processed."""
        return not self._due and not self._processing and not self._again

    def add(self, key: K, delay: float = 0.0) -> None:
        """Queue `key` to be ready after `delay` (sooner if it is already waiting for longer)."""
        if key in self._processing:
            self._again[key] = min(delay, self._again.get(key, delay))
            return
        due = self.clock() + delay
        current = self._due.get(key)
        if current is not None and current <= due:
            return
        self._due[key] = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, key))
        if current is None:
            self.report_depth(len(self._due))
        self._wakeup.set()

    def retry(self, key: K, after: float | None = None) -> None:
        """Queue a key whose processing failed, after its backoff (or `after`, if longer)."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        backoff = min(self.backoff_initial * 2**failures, self.backoff_max)
        self.add(key, max(backoff, after or 0.0))

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts from the initial backoff again."""
        self._failures.pop(key, None)

    def done(self, key: K) -> None:
        """Processing of `key` has ended; re-add it if it was added meanwhile."""
        self._processing.discard(key)
        again = self._again.pop(key, None)
        if again is not None:
            self.add(key, again)

    def clear(self) -> None:
        """Drop every waiting key and backoff (keys being processed finish normally)."""
        self._due.clear()
        self._heap.clear()
        self._again.clear()
        self._failures.clear()
        self.report_depth(0)

    async def get(self) -> K:
        """The next ready key, which is then being processed until `done(key)`."""
        while True:
            now = self.clock()
            while self._heap:
                due, _, key = self._heap[0]
                if self._due.get(key) != due:
                    heapq.heappop(self._heap)  # superseded by an earlier entry
                    continue
                if due > now:
                    break
                heapq.heappop(self._heap)
                del self._due[key]
                self._processing.add(key)
                self.report_depth(len(self._due))
                return key
            timeout = self._heap[0][0] - now if self._heap else None
            self._wakeup.clear()
            try:
                async with asyncio.timeout(timeout):
                    await self._wakeup.wait()
            except TimeoutError:
                pass


class TokenBucket:
    """Allow `rate` operations per second on average, bursts of up to `burst` (rate <= 0: no
    limit). Waiters reserve their token first, so concurrent callers are served in turn."""

    def __init__(
        self, rate: float, burst: int | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = float(burst if burst is not None else max(1, int(rate)))
        self.clock = clock
        self._tokens = self.burst
        self._stamp = clock()

    async def take(self) -> None:
        """Wait until one operation is allowed."""
        if self.rate <= 0:
            return
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= 1
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)
