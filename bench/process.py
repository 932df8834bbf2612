"""A `python -m toposdns ...` child process for the benchmarks: its stderr read by a thread
(with the time of each line), /ready polled on its HTTP port, its memory and CPU from /proc."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
STOP_TIMEOUT = 5.0
READY_POLL = 0.05


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port the kernel says is free on loopback now."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


class ToposdnsProcess:
    """`python -m toposdns ARGS`, in its own process group, run from the repository root."""

    def __init__(self, args: Sequence[str], http_port: int) -> None:
        self.http_port = http_port
        self.lines: list[tuple[float, str]] = []  # (seconds since start, line)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toposdns", *args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def find(self, pattern: re.Pattern[str]) -> tuple[float, re.Match[str]] | None:
        """The first log line matching `pattern`, with when it came."""
        for at, line in list(self.lines):
            found = pattern.search(line)
            if found:
                return at, found
        return None

    def tail(self, n: int = 15) -> str:
        return "\n".join(line for _, line in self.lines[-n:])

    def check_alive(self) -> None:
        """RuntimeError, with the end of the log, if the process has exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"toposdns exited with {self.proc.returncode}:\n{self.tail()}")

    def ready(self) -> bool:
        """True if /ready answers 200 now."""
        try:
            url = f"http://{HOST}:{self.http_port}/ready"
            with urllib.request.urlopen(url, timeout=1.0) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float) -> float:
        """Seconds from process start to the first /ready 200, polling every 50 ms."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if self.ready():
                return time.monotonic() - self.started
            time.sleep(READY_POLL)
        raise TimeoutError(f"toposdns not ready after {timeout:.0f} s:\n{self.tail()}")

    def memory(self) -> tuple[float, float]:
        """(VmHWM, VmRSS) in MiB."""
        values = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) / 1024
        return values["VmHWM"], values["VmRSS"]

    def cpu_seconds(self) -> float:
        """User + system CPU seconds used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, then SIGKILL, to the whole process group; returns the exit code."""
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)  # start_new_session: group id == its pid
                try:
                    self.proc.wait(timeout)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._reader.join(timeout=2)
        return self.proc.returncode
