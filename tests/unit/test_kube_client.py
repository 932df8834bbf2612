"""The one raw request helper (toposdns/kube/client.py) against the stand-in API server, through
the real client: any status comes back with its decoded body and Retry-After; no answer raises."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.kubeapi import FakeApiServer
from toposdns.kube.client import (
    NETWORK_ERRORS,
    Reachability,
    Reply,
    apis_of,
    connect,
    decode,
    request,
)
from toposdns.kube.resources import POD_LOCATOR

LOCATOR = {
    "apiVersion": POD_LOCATOR.api_version,
    "kind": POD_LOCATOR.kind,
    "metadata": {"name": "web-1", "namespace": "shop"},
    "addresses": ["10.1.0.1"],
    "nodeName": "n1",
    "nodeLabels": {},
}


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.add(LOCATOR)
    server.start()
    yield server
    server.stop()


def get_locator(kubeconfig: Path, name: str, timeout: float = 5.0) -> Reply:
    async def call() -> Reply:
        client = await connect(kubeconfig)
        try:
            method = apis_of(client).custom.get_namespaced_custom_object_without_preload_content
            args = (POD_LOCATOR.group, POD_LOCATOR.version, "shop", POD_LOCATOR.plural, name)
            return await request(method, *args, timeout=timeout)
        finally:
            await client.close()

    return asyncio.run(call())


def test_an_object(api: FakeApiServer, tmp_path: Path) -> None:
    reply = get_locator(api.write_kubeconfig(tmp_path / "kubeconfig"), "web-1")
    assert (reply.status, reply.retry_after) == (200, None)
    assert reply.body["addresses"] == ["10.1.0.1"]


def test_an_error_status_with_its_message(api: FakeApiServer, tmp_path: Path) -> None:
    reply = get_locator(api.write_kubeconfig(tmp_path / "kubeconfig"), "gone")
    assert reply.status == 404 and reply.body["reason"] == "NotFound"
    assert reply.message == 'podlocators.toposdns.io "gone" not found'


def test_retry_after(api: FakeApiServer, tmp_path: Path) -> None:
    api.fail_next("podlocators", 429, retry_after=3)
    reply = get_locator(api.write_kubeconfig(tmp_path / "kubeconfig"), "web-1")
    assert (reply.status, reply.retry_after) == (429, 3.0)


def test_no_answer_raises(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api.stop()
    with pytest.raises(NETWORK_ERRORS):
        get_locator(kubeconfig, "web-1")


def test_a_silent_server_times_out(api: FakeApiServer, tmp_path: Path) -> None:
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        silent = f"http://127.0.0.1:{listener.getsockname()[1]}"
        kubeconfig.write_text(kubeconfig.read_text().replace(api.url, silent))
        with pytest.raises(TimeoutError):
            get_locator(kubeconfig, "web-1", timeout=0.2)


@pytest.mark.parametrize(
    "data, body, message",
    [
        (
            b'{"kind": "Status", "message": "forbidden: no"}',
            {"kind": "Status", "message": "forbidden: no"},
            "forbidden: no",
        ),
        (
            b'{"kind": "Status", "reason": "Conflict"}',
            {"kind": "Status", "reason": "Conflict"},
            "Conflict",
        ),
        (b"[1, 2]", [1, 2], "[1, 2]"),
        (b"", None, ""),
        (b"<html>bad gateway</html>", "<html>bad gateway</html>", "<html>bad gateway</html>"),
        (b"x" * 500, "x" * 200, "x" * 200),
    ],
)
def test_bodies_and_messages(data: bytes, body: Any, message: str) -> None:
    assert decode(data) == body
    assert Reply(500, decode(data), None).message == message


def test_an_outage_is_one_line_down_and_one_line_back(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    reachability = Reachability(
        clock=lambda: now[0], wall=lambda: datetime(2026, 11, 25, 10, 0, 5, tzinfo=UTC)
    )
    caplog.set_level(logging.DEBUG, logger="toposdns")
    reachability.answered()  # answered all along: nothing to say
    for _ in range(36):  # every watch and the lease retrying, for 25 s
        reachability.failed(aiohttp.ClientConnectionError("Cannot connect to host 10.96.0.1:443"))
        now[0] += 0.7
    reachability.answered()
    reachability.answered()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            "API unreachable since 10:00:05: Cannot connect to host 10.96.0.1:443; "
            "keeping the last data and retrying",
        ),
        ("INFO", "API back after 25.2s"),
    ]
    caplog.clear()
    reachability.failed(TimeoutError())  # the next outage is news again
    assert [r.getMessage() for r in caplog.records] == [
        "API unreachable since 10:00:05: TimeoutError; keeping the last data and retrying"
    ]
