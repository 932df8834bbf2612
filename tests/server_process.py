"""A server child process for the tests and the benchmarks: `python -m toposdns ...` (or any
command, such as knotd), run from the repository root in its own process group.

Its stderr is read by a thread, with the time of each line, so callers can wait for a log line;
CPU and memory come from /proc. Every wait is bounded, and `stop` always ends the process: a
hung server fails a test or a benchmark instead of hanging it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STOP_TIMEOUT = 5.0


def toposdns_command(*args: str) -> list[str]:
    """The command line of `python -m toposdns ARGS` with this interpreter."""
    return [sys.executable, "-m", "toposdns", *args]


class ServerProcess:
    """One server process; `lines` holds (seconds since start, line) of its stderr."""

    def __init__(self, command: Sequence[str], cwd: Path = REPO) -> None:
        self.command = list(command)
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._eof = False
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.command,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own group: stop() reaches anything it starts
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))
                self._changed.notify_all()
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """Everything the process wrote to stderr so far."""
        with self._changed:
            return "\n".join(line for _, line in self.lines)

    def tail(self, n: int = 15) -> str:
        """The last `n` lines of its stderr."""
        with self._changed:
            return "\n".join(line for _, line in self.lines[-n:])

    def line_count(self) -> int:
        with self._changed:
            return len(self.lines)

    def find(self, pattern: re.Pattern[str] | str) -> tuple[float, re.Match[str]] | None:
        """The first log line matching `pattern` now, with when it came; None if none."""
        regex = re.compile(pattern)
        with self._changed:
            for at, line in self.lines:
                found = regex.search(line)
                if found:
                    return at, found
        return None

    def wait_for_log(
        self, pattern: re.Pattern[str] | str, timeout: float = 5.0, start: int = 0
    ) -> re.Match[str]:
        """The first match of `pattern` in a line at index >= start; AssertionError if none
        came within `timeout` seconds (or the process ended first)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for _, line in self.lines[start:]:
                    found = regex.search(line)
                    if found:
                        return found
                remaining = deadline - time.monotonic()
                if self._eof or remaining <= 0:
                    raise AssertionError(
                        f"no log line matching {regex.pattern!r} within {timeout}s; log:\n"
                        + "\n".join(line for _, line in self.lines)
                    )
                self._changed.wait(min(remaining, 0.2))

    @property
    def name(self) -> str:
        """The start of its command line, e.g. `python -m toposdns serve`."""
        return " ".join([Path(self.command[0]).name, *self.command[1:4]])

    def check_alive(self) -> None:
        """RuntimeError, with the end of the log, if the process has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")

    def wait_until(self, check: Callable[[], bool], timeout: float, interval: float) -> float:
        """Poll `check` until true; the seconds since the start. RuntimeError if the process
        exits first, TimeoutError after `timeout` seconds from its start."""
        deadline = self.started + timeout
        while True:
            self.check_alive()
            if check():
                return time.monotonic() - self.started
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.name}: not ready after {timeout:.0f} s:\n{self.tail()}")
            time.sleep(interval)

    def memory(self) -> tuple[float, float]:
        """(VmHWM, VmRSS) in MiB."""
        values = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) / 1024
        return values["VmHWM"], values["VmRSS"]

    def processes(self) -> list[int]:
        """The process and its descendants, such as the workers of `serve --workers N`."""
        found, waiting = [], [self.pid]
        while waiting:
            pid = waiting.pop()
            found.append(pid)
            for children in Path(f"/proc/{pid}/task").glob("*/children"):
                with contextlib.suppress(OSError):
                    waiting += [int(child) for child in children.read_text().split()]
        return found

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the process and its descendants used so far (0 for those
        gone)."""
        ticks = 0
        for pid in self.processes():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def pss_mb(self) -> float:
        """Proportional set size in MiB, summed over the process and its descendants: memory
        they share (copy-on-write after a fork) counts once in all."""
        kib = 0
        for pid in self.processes():
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        kib += int(line.split()[1])
        return kib / 1024

    def send_signal(self, sig: signal.Signals) -> None:
        """Send `sig` to the process group, if the process still runs."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)  # start_new_session: the group id is its pid

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then the exit code; None (after SIGKILL) if it did not exit in time."""
        self.send_signal(signal.SIGTERM)
        try:
            code: int | None = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self._reader.join(2.0)
        if self.proc.stderr is not None and not self._reader.is_alive():
            self.proc.stderr.close()
        return code

    def kill(self) -> None:
        """SIGKILL to the process group, and wait for the process."""
        self.send_signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5.0)
