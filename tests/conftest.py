"""Test-wide fixtures."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.server_process import REPO

DATAGRAMS_C = REPO / "toposdns" / "serve" / "datagrams.c"


def pytest_sessionstart(session: pytest.Session) -> None:
    """The batched UDP frontend's C extension, built in place before collection when the C is
    newer than it, so that the servers the tests start answer through it (`--udp-batch on`,
    the default) and its unit tests can import it."""
    built = list(DATAGRAMS_C.parent.glob("datagrams.*.so"))
    if built and all(so.stat().st_mtime >= DATAGRAMS_C.stat().st_mtime for so in built):
        return
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=REPO,
        check=True,
        timeout=300,
        capture_output=True,
    )


@pytest.fixture(autouse=True)
def _logs_reach_caplog() -> Iterator[None]:
    # cli.main() configures the `toposdns` logger for a terminal; tests read it through caplog.
    logger = logging.getLogger("toposdns")
    yield
    logger.handlers.clear()
    logger.propagate = True
