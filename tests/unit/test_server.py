"""The DNS server's assembly: a reloaded configuration applied to a running server."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

import toposdns.server as server
from toposdns.config import Reading, ServeConfig
from toposdns.server import DnsServer, answering
from toposdns.store.snapshot import Snapshot


def config_of(**flags: Any) -> ServeConfig:
    given = {"--snapshot": "x.yaml", "--listen": "127.0.0.1:0", "--workers": "1", **flags}
    return Reading().read_flags(given).done()


def test_a_reload_applies_answers_now_and_where_to_serve_at_the_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "FORWARD_BUDGET", 0.01)

    async def run() -> None:
        first = config_of(**{"--upstream": "192.0.2.1", "--ttl": "30"})
        dns = DnsServer(first, answering(first), Snapshot(synced=True))
        async with contextlib.AsyncExitStack() as stack:
            port = await dns.start(stack, 0)
            (udp,) = dns.udp
            old_forwarder, old_responder = dns.forwarder, dns.responder
            second = config_of(
                **{"--upstream": "192.0.2.2", "--ttl": "7", "--listen": "127.0.0.1:5300"}
            )
            assert dns.reconfigure(second) == ["bind and port"]
            assert dns.responder is not old_responder and udp.responder is dns.responder
            assert dns.responder.config.ttl == 7
            assert dns.forwarder is not None and dns.forwarder is not old_forwarder
            assert dns.config.bind.port == 0, "the port stays until a restart"
            assert dns.responder.topology_counts is old_responder.topology_counts
            await asyncio.sleep(0.1)
            assert not dns.retiring  # the replaced forwarder is closed
            # Settings that leave the forwarder as it is keep it (and its cache).
            kept = dns.forwarder
            assert dns.reconfigure(config_of(**{"--upstream": "192.0.2.2", "--ttl": "5"})) == []
            assert dns.forwarder is kept
            # The store believes the locators of its namespaces from the start.
            widened = config_of(**{"--upstream": "192.0.2.2", "--locator-namespaces": "*"})
            assert dns.reconfigure(widened) == ["locator_namespaces"]
            assert dns.config.toposdns.locator_namespaces == {"toposdns"}
            assert port > 0

    asyncio.run(run())


def test_the_forwarders_of_a_reload_count_in_the_same_cache_metrics() -> None:
    async def run() -> None:
        first = config_of(**{"--upstream": "192.0.2.1", "--http": "127.0.0.1:0"})
        dns = DnsServer(first, answering(first), Snapshot(synced=True))
        assert dns.metrics is not None and dns.forwarder is not None
        counts = dns.metrics.forward_counts
        assert dns.forwarder.cache.counts is counts
        second = config_of(
            **{"--upstream": "192.0.2.1", "--http": "127.0.0.1:0", "--cache-prefetch": "2"}
        )
        dns.reconfigure(second)
        assert dns.forwarder.cache.counts is counts  # a new forwarder, the same counts
        assert dns.forwarder.refresher is not None
        await dns.close()

    asyncio.run(run())


# Each: a flag changed by a reload, and the name the warning gives it (None: applied at once).
RELOADED = [
    ({"--explain": "127.0.0.1:9999"}, "explain"),
    ({"--http": "127.0.0.1:9998"}, "http"),
    ({"--udp-batch": "off"}, "udp_batch"),
    ({"--workers": "3"}, "workers"),
    ({"--listen": "127.0.0.1:5301"}, "bind and port"),
    ({"--tcp-idle-timeout": "3s"}, "tcp"),
    ({"--query-log": True}, "log"),
    ({"--ttl": "9"}, None),
    ({"--ecs-trust": "10.0.0.0/8"}, None),
    ({"--upstream": "192.0.2.9"}, None),
    ({"--loadbalance": True}, None),
]


@pytest.mark.parametrize(("flags", "waiting"), RELOADED)
def test_every_reloaded_setting_is_applied_or_named_as_waiting(
    flags: dict[str, Any], waiting: str | None
) -> None:
    running = config_of()
    reloaded = config_of(**flags)
    assert reloaded != running
    applied, named = server.restart_only(reloaded, running)
    if waiting is None:
        assert named == [] and applied == reloaded
    else:
        assert named == [waiting] and applied == running
