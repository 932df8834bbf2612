"""Test-wide fixtures."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _logs_reach_caplog() -> Iterator[None]:
    # cli.main() configures the `toposdns` logger for a terminal; tests read it through caplog.
    logger = logging.getLogger("toposdns")
    yield
    logger.handlers.clear()
    logger.propagate = True
