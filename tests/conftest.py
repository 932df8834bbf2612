"""Test-wide fixtures."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from tests import build_form


def pytest_report_header() -> str:
    return f"toposdns: {build_form.form()}"


def pytest_sessionstart(session: pytest.Session) -> None:
    # Before any test: a stale or unexpected build would make every result about other code.
    wrong = build_form.problems()
    if wrong:
        pytest.exit("toposdns build: " + "; ".join(wrong), returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(autouse=True)
def _logs_reach_caplog() -> Iterator[None]:
    # cli.main() configures the `toposdns` logger for a terminal; tests read it through caplog.
    logger = logging.getLogger("toposdns")
    yield
    logger.handlers.clear()
    logger.propagate = True
