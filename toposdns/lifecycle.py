"""A process's life in three acts, in the shape of uvicorn's `Server`: startup, main loop,
shutdown. `toposdns serve` (one process, or the supervisor and each worker of `--workers N`)
and `toposdns controller` all live it the same way:

- **before**: from the first line of `python -m toposdns` and of the `toposdns` console script
  (both run `toposdns/__main__.py`), `exit_on_signals` makes SIGTERM and SIGINT end the process
  at once (exit 0), until `catch_signals` takes them over. As PID 1 in a
  container, a process without a handler for a signal never gets it: a SIGTERM during a slow
  first sync would otherwise be lost, and the pod would wait out its grace period.
- **startup**: inside `async with Lifecycle() as life:`, the owner opens what it needs and says
  on `life.stack` how to close each; long-running tasks start with `life.start()`.
- **main loop**: `await life.main_loop()` returns on SIGTERM or SIGINT (once `catch_signals()`
  was called), on `stop()`, or when a task started as `ending` ends, and raises what any started
  task raised, or what `fail()` was given.
- **shutdown**: `stopping` is true from then on (so /ready fails); `lameduck(seconds)` keeps the
  process serving a while, unless a second signal (Ctrl-C twice) or `stop(now=True)` ends it;
  then the `async with` closes the stack in reverse order, each started task cancelled and
  waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

#: How long a cancelled task may take to end at shutdown.
CANCEL_TIMEOUT = 5.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_on_signals() -> None:
    """SIGTERM and SIGINT end the process at once (exit 0), whatever it is doing, until a
    `Lifecycle` catches them, as they end a Go program such as CoreDNS: the startup has no
    client to finish with, and unwinding it (a module half imported, API calls under way)
    could take longer than the pod's grace period."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _exit)


def _exit(signum: int, frame: object) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"stopped by {signal.Signals(signum).name} before serving", file=sys.stderr)
        sys.stderr.flush()
    os._exit(0)


class Lifecycle:
    """Signals, the main loop, the lameduck and the shutdown order of one process."""

    def __init__(self) -> None:
        self.stack = contextlib.AsyncExitStack()
        #: True once the main loop has ended.
        self.stopping = False
        self._stop = asyncio.Event()
        #: Set by a second signal or `stop(now=True)`: shut down without waiting.
        self.again = asyncio.Event()
        self._ending: set[asyncio.Task[Any]] = set()
        self._checks: set[asyncio.Task[Any]] = set()
        self._failure: BaseException | None = None

    async def __aenter__(self) -> Lifecycle:
        await self.stack.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        return await self.stack.__aexit__(*exc_info)

    def catch_signals(self) -> None:
        """SIGTERM and SIGINT call `stop()` from now on (until the event loop closes)."""
        loop = asyncio.get_running_loop()
        for signum in STOP_SIGNALS:
            loop.add_signal_handler(signum, self.stop)

    def stop(self, now: bool = False) -> None:
        """End the main loop; a second call (or `now`) also ends the lameduck."""
        if now or self._stop.is_set():
            self.again.set()
        self._stop.set()

    def fail(self, error: BaseException) -> None:
        """End the main loop with this error, as if a task had raised it."""
        if self._failure is None:
            self._failure = error
        self._stop.set()

    def start(
        self, coroutine: Coroutine[Any, Any, Any], name: str, ending: bool = True
    ) -> asyncio.Task[Any]:
        """Run a task until shutdown. When an `ending` task ends (a source, the controller), the
        main loop ends; any other task (a check) may end quietly. Either ends it by raising."""
        task = asyncio.create_task(coroutine, name=name)
        self.stack.push_async_callback(_cancel, task)
        (self._ending if ending else self._checks).add(task)
        return task

    async def main_loop(self) -> None:
        """Until a signal, `stop()` or an ending task ends; raises what a task raised."""
        stopped = asyncio.create_task(self._stop.wait(), name="stop")
        watched = self._ending | self._checks | {stopped}
        try:
            while True:
                done, watched = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        raise task.exception()  # type: ignore[misc]
                if self._failure is not None:
                    raise self._failure
                if done - self._checks:
                    return
        finally:
            stopped.cancel()
            self.stopping = True

    async def lameduck(self, seconds: float) -> None:
        """Wait `seconds`, or less if a second signal comes."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.again.wait(), seconds)


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel a task and wait (a bounded time) until it has ended."""
    task.cancel()
    await asyncio.wait([task], timeout=CANCEL_TIMEOUT)
    if task.done() and not task.cancelled():
        task.exception()  # seen: a failure after the main loop is not reported twice
