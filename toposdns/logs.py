"""Logging setup: one logger, `toposdns`, in text or JSON lines. No per-query logging; events
that can come in floods (refused connections, bad requests) are tallied."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send the `toposdns` logger to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger("toposdns")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False


class Tally:
    """Events that can come in floods, logged without flooding the log.

    The first event after a quiet spell is logged at once (`first % detail`); the ones that
    follow within `interval` seconds are counted and logged as one line when it ends
    (`summary % (count, interval, detail of the last)`), and so on while they keep coming.
    Must be used from the event loop.
    """

    def __init__(
        self, logger: logging.Logger, level: int, first: str, summary: str, interval: float = 5.0
    ) -> None:
        self.logger = logger
        self.level = level
        self.first = first
        self.summary = summary
        self.interval = interval
        self.count = 0
        self.last = ""
        self.timer: asyncio.TimerHandle | None = None

    def add(self, detail: str) -> None:
        """One event; `detail` says what and where, e.g. the client and the limit it hit."""
        if self.timer is None:
            self.logger.log(self.level, self.first, detail)
            self.timer = asyncio.get_running_loop().call_later(self.interval, self.flush)
        else:
            self.count += 1
            self.last = detail

    def flush(self) -> None:
        """Log the events counted since the last line, if any."""
        self.timer = None
        if self.count:
            self.logger.log(self.level, self.summary, self.count, self.interval, self.last)
            self.count = 0
            self.timer = asyncio.get_running_loop().call_later(self.interval, self.flush)
