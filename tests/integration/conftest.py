"""Fixtures that run the real `toposdns serve` process on loopback.

- `shared_server`: one server per test module on a private copy of snapshot.yaml, for tests
  that only read.
- `start_server`: a factory for dedicated servers (options, reloads); every server it started
  is stopped at teardown, and each must exit 0 on SIGTERM within 5 s.
- `api`: the stand-in API server with a namespace and a Service, for the live source.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.support import STOP_TIMEOUT, Server, StartServer, copy_snapshot
from tests.kubeapi import FakeApiServer
from tests.objects import namespace, service


def _stop_all(servers: list[Server]) -> None:
    failures = []
    for server in servers:
        code = server.stop(STOP_TIMEOUT)
        if code != 0:
            failures.append(f"port {server.port}: exit code {code}\n{server.log()}")
    assert not failures, "server did not exit 0 on SIGTERM within 5 s:\n" + "\n".join(failures)


def _launch(servers: list[Server], snapshot: Path, *args: str) -> Server:
    server = Server(snapshot, tuple(args))
    servers.append(server)
    server.wait_ready()
    return server


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[StartServer]:
    """start_server(*args, snapshot=None) -> a running Server (default: a copy of the fixture)."""
    servers: list[Server] = []

    def start(*args: str, snapshot: Path | None = None) -> Server:
        if snapshot is None:
            snapshot = copy_snapshot(tmp_path)
        return _launch(servers, snapshot, *args)

    yield start
    _stop_all(servers)


def serve_shared(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[Server]:
    """One server on a private copy of the fixture snapshot, stopped when the generator ends."""
    servers: list[Server] = []
    snapshot = copy_snapshot(tmp_path_factory.mktemp("shared"))
    yield _launch(servers, snapshot, *args)
    _stop_all(servers)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server on the fixture snapshot, shared by a module's read-only tests."""
    yield from serve_shared(tmp_path_factory)


@pytest.fixture(scope="module", params=["on", "off"], ids=["batched", "unbatched"])
def both_frontends(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """`shared_server` with each UDP frontend in turn (--udp-batch on, then off): a module
    that asks for it as `shared_server` runs every test against both."""
    yield from serve_shared(tmp_path_factory, "--udp-batch", request.param)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    """The stand-in API server, holding namespace shop and its Service web (10.96.0.5)."""
    server = FakeApiServer()
    server.add(namespace("shop"))
    server.add(service("web", cluster_ip="10.96.0.5"))
    server.start()
    yield server
    server.stop()
