"""The lifecycle every process lives: what ends the main loop, what it raises, the lameduck a
second stop cuts short, and the shutdown order (reverse, cancelled tasks awaited)."""

from __future__ import annotations

import asyncio
import time

import pytest

from toposdns.lifecycle import Lifecycle


async def forever() -> None:
    await asyncio.sleep(3600)


async def fails_soon() -> None:
    await asyncio.sleep(0)
    raise RuntimeError("source broke")


def test_stop_ends_the_main_loop_and_the_lameduck_waits() -> None:
    async def main() -> float:
        async with Lifecycle() as life:
            life.start(forever(), "source")
            asyncio.get_running_loop().call_later(0.01, life.stop)
            await life.main_loop()
            assert life.stopping
            started = time.monotonic()
            await life.lameduck(0.2)
            return time.monotonic() - started

    assert asyncio.run(main()) >= 0.19


def test_a_second_stop_ends_the_lameduck() -> None:
    async def main() -> float:
        async with Lifecycle() as life:
            life.stop()
            await life.main_loop()
            asyncio.get_running_loop().call_later(0.01, life.stop)
            started = time.monotonic()
            await life.lameduck(30)
            return time.monotonic() - started

    assert asyncio.run(main()) < 5


def test_a_failing_task_is_raised_and_a_passing_check_is_not_the_end() -> None:
    async def main() -> None:
        async with Lifecycle() as life:
            life.start(asyncio.sleep(0), "a check that passes", ending=False)
            life.start(fails_soon(), "source")
            await life.main_loop()

    with pytest.raises(RuntimeError, match="source broke"):
        asyncio.run(main())


def test_an_ending_task_that_returns_ends_the_main_loop() -> None:
    async def main() -> bool:
        async with Lifecycle() as life:
            life.start(asyncio.sleep(0), "supervisor channel")
            await life.main_loop()
            return life.stopping

    assert asyncio.run(main())


def test_fail_ends_the_main_loop_with_the_error() -> None:
    async def main() -> None:
        async with Lifecycle() as life:
            life.start(forever(), "source")
            asyncio.get_running_loop().call_later(0.01, life.fail, ValueError("a loop"))
            await life.main_loop()

    with pytest.raises(ValueError, match="a loop"):
        asyncio.run(main())


def test_shutdown_closes_in_reverse_and_awaits_cancelled_tasks() -> None:
    order: list[str] = []

    async def task() -> None:
        try:
            await forever()
        finally:
            await asyncio.sleep(0.01)  # takes a moment to end
            order.append("task ended")

    async def main() -> None:
        async with Lifecycle() as life:
            life.stack.callback(order.append, "closed first opened")
            life.start(task(), "source")
            life.stack.callback(order.append, "closed last opened")
            life.stop()
            await life.main_loop()

    asyncio.run(main())
    assert order == ["closed last opened", "task ended", "closed first opened"]
