"""logs.Tally: events that come in floods are logged as a line at once, then one per window."""

from __future__ import annotations

import asyncio
import logging

import pytest

from toposdns.logs import Tally


def test_tally_logs_the_first_at_once_then_counts(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="toposdns")
    tally = Tally(
        logging.getLogger("toposdns"),
        logging.WARNING,
        "refused a connection %s",
        "refused %d more connections in the last %gs, the last %s",
        interval=60,
    )

    def end_window() -> None:  # what the timer does after `interval`
        assert tally.timer is not None
        tally.timer.cancel()
        tally.flush()

    async def scenario() -> None:
        for i in range(5):
            tally.add(f"from 10.0.0.{i}")
        assert len(caplog.records) == 1
        end_window()  # one line for the other four; the flood may go on: a new window
        tally.add("from 10.0.0.9")
        end_window()
        end_window()  # a quiet window: no line, and the tally closes
        assert tally.timer is None
        tally.add("from 10.0.0.10")  # after a quiet spell: at once again
        assert tally.timer is not None
        tally.timer.cancel()

    asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == [
        "refused a connection from 10.0.0.0",
        "refused 4 more connections in the last 60s, the last from 10.0.0.4",
        "refused 1 more connections in the last 60s, the last from 10.0.0.9",
        "refused a connection from 10.0.0.10",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}
