"""What every benchmark shares: logging, percentiles, free ports, a description of the machine,
and the test suite's stand-in API server, server-process wrapper, Kubernetes object builders,
stub upstream, glibc client and CoreDNS forwarder.

The benchmarks run as modules from the repository root (`python -m bench.run`), so `toposdns`,
`bench` and `tests` import from there with no path set-up.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# The stand-in API server, the process wrapper, the objects, the upstream, the clients and the
# CoreDNS forwarder are the test suite's own: the benchmarks measure against the same fakes the
# tests check the server with. Imported here only.
from tests import glibc
from tests.configmap import ConfigMap
from tests.coredns_forwarder import CorefileForwarder, Directive, corefile_block, shown_corefile
from tests.integration.support import metric_total, recv_exact
from tests.kubeapi import FakeApiServer
from tests.objects import endpoint, endpoint_slice, headless, namespace, pod_locator, service
from tests.server_process import REPO, ServerProcess, toposdns_command
from tests.upstream import StubUpstream, stub_upstream

__all__ = [
    "HOST",
    "REPO",
    "ConfigMap",
    "CorefileForwarder",
    "Directive",
    "FakeApiServer",
    "ServerProcess",
    "StubUpstream",
    "corefile_block",
    "cpu_model",
    "endpoint",
    "endpoint_slice",
    "free_port",
    "glibc",
    "headless",
    "log",
    "machine",
    "metric_total",
    "recv_exact",
    "namespace",
    "percentile",
    "pod_locator",
    "service",
    "shown_corefile",
    "stub_upstream",
    "toposdns_command",
]

HOST = "127.0.0.1"


def log(msg: str) -> None:
    """A progress line on stderr, tagged with the benchmark's name."""
    print(f"[{Path(sys.argv[0]).stem}] {msg}", file=sys.stderr, flush=True)


def percentile(sorted_vals: Sequence[float], q: float) -> float:
    """Nearest-rank percentile `q` (0-100) of sorted values; NaN for none."""
    if not sorted_vals:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_vals)))
    return sorted_vals[rank - 1]


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port the kernel says is free on loopback now."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("?" if unknown)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


def machine() -> dict[str, object]:
    """When and where a benchmark ran, for its report."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": sys.version.split()[0],
    }
