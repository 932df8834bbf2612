"""glibc's stub resolver as a real client: `getent ahosts NAME` with a resolv.conf of our own,
bind-mounted over /etc/resolv.conf in a private mount namespace (`unshare --mount`, root only).

glibc asks port 53 only, so the server listens on a loopback address of its own, e.g.
127.53.x.y:53; the kernel then sends from 127.0.0.1, which is where the test's pod must be.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
from pathlib import Path

import yaml

from tests import objects

GETENT_TIMEOUT = 30.0


def unavailable() -> str | None:
    """Why glibc cannot be used as a client here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root, for unshare --mount and port 53"
    for tool in ("unshare", "getent", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        done = subprocess.run(
            ["unshare", "--mount", "true"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --mount failed: {exc}"
    if done.returncode != 0:
        return f"unshare --mount is not permitted here: {done.stderr.strip()}"
    return None


def free_loopback_53() -> str:
    """A loopback address whose port 53 is free now, for UDP and TCP."""
    for _ in range(50):
        address = f"127.53.{random.randint(1, 254)}.{random.randint(1, 254)}"
        try:
            for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
                with socket.socket(socket.AF_INET, kind) as sock:
                    sock.bind((address, 53))
        except OSError:
            continue
        return address
    raise RuntimeError("no free loopback address with port 53")


def resolv_conf(
    directory: Path, nameserver: str, search: list[str], options: str = "ndots:5"
) -> Path:
    """A pod's resolv.conf as the kubelet writes it (`options ndots:5`)."""
    path = directory / "resolv.conf"
    path.write_text(f"search {' '.join(search)}\nnameserver {nameserver}\noptions {options}\n")
    return path


def getent_ahosts(conf: Path, name: str) -> subprocess.CompletedProcess[str]:
    """`getent ahosts NAME` with `conf` as /etc/resolv.conf; exit 0 with addresses, 2 if none."""
    script = 'mount --bind "$1" /etc/resolv.conf && exec getent ahosts "$2"'
    return subprocess.run(
        ["unshare", "--mount", "sh", "-c", script, "sh", str(conf), name],
        capture_output=True,
        text=True,
        timeout=GETENT_TIMEOUT,
    )


def pod_locator(namespace: str, name: str = "glibc") -> str:
    """A snapshot item: a PodLocator placing 127.0.0.1, where getent's queries come from, as a
    pod of `namespace` (in the controller's namespace, as the controller writes it)."""
    locator = objects.pod_locator(
        f"{namespace}.{name}",
        "toposdns",
        addresses=["127.0.0.1"],
        node_labels={"kubernetes.io/hostname": "node-a"},
        labels={"toposdns.io/pod-namespace": namespace},
    )
    return yaml.safe_dump([locator], sort_keys=False)


def addresses(done: subprocess.CompletedProcess[str]) -> set[str]:
    """The addresses getent printed."""
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}
