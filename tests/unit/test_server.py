"""The DNS server's assembly: a reloaded configuration applied to a running server."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from dataclasses import replace
from typing import Any

import dnslib
import pytest

import toposdns.server as server
from toposdns.config import Reading, ServeConfig
from toposdns.metrics import ANSWERING
from toposdns.serve.blocks import BlockConfig
from toposdns.serve.forward import ForwardOptions, Upstream
from toposdns.serve.listen import ListenOptions, server_label
from toposdns.serve.query_log import LoggedUdpProtocol
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


#: What the store holds: kept as it is while watching a cluster (the watch keeps only what the
#: running settings need), applied at once from a snapshot file (its data holds everything).
WATCHED = [
    ({"--endpoint-pod-names": True}, "endpoint_pod_names"),
    ({"--noendpoints": True}, "noendpoints"),
]


@pytest.mark.parametrize(("flags", "waiting"), WATCHED)
def test_a_reload_of_what_the_watch_holds_waits_for_a_restart(
    flags: dict[str, Any], waiting: str
) -> None:
    watching = {"--snapshot": None, "--kubeconfig": "kubeconfig", "--ttl": "9"}
    running = config_of(**{**watching, "--ttl": "5"})
    applied, named = server.restart_only(config_of(**watching, **flags), running)
    assert named == [waiting]
    assert applied == config_of(**watching), "the rest applies, this waits"
    reloaded = config_of(**flags)
    assert server.restart_only(reloaded, config_of()) == (reloaded, [])


#: The blocks beside the kubernetes block as they run: a stub domain on its port, and
#: example.org on a port of its own.
STUB = BlockConfig((("consul", "local"),), "Corefile:5")
OTHER = BlockConfig((("example", "org"),), "Corefile:8", port=5301)
UPSTREAM = ForwardOptions(upstreams=(Upstream("192.0.2.9", 53),))

# Each: the blocks a reload brings, and whether they wait for a restart (their addresses, the
# sockets to listen on, changed) or apply at once.
BLOCK_RELOADS = [
    ((STUB, replace(OTHER, forward=UPSTREAM)), False),
    ((STUB, replace(OTHER, zones=(("example", "net"),))), False),
    ((STUB, OTHER, BlockConfig((("a", "b"),))), False),  # a stub domain beside kubernetes
    ((OTHER,), False),
    ((STUB, replace(OTHER, port=5302)), True),
    ((STUB, replace(OTHER, bind="127.0.0.2")), True),
    ((STUB,), True),  # its port gone
    ((STUB, OTHER, replace(OTHER, port=5303)), True),  # a new port
    ((replace(STUB, port=5301), OTHER), False),  # onto a port already served
    ((replace(STUB, port=5304), OTHER), True),  # off the kubernetes block's port
]


@pytest.mark.parametrize(("blocks", "waits"), BLOCK_RELOADS)
def test_a_reload_that_changes_the_blocks_ports_waits_for_a_restart(
    blocks: tuple[BlockConfig, ...], waits: bool
) -> None:
    running = replace(config_of(), blocks=(STUB, OTHER))
    reloaded = replace(config_of(**{"--ttl": "9"}), blocks=blocks)
    applied, named = server.restart_only(reloaded, running)
    assert applied.kubernetes.ttl == 9, "the rest applies"
    if waits:
        assert named == ["server block ports"] and applied.blocks == running.blocks
    else:
        assert named == [] and applied == reloaded


def rcode(address: tuple[str, int], name: str, tcp: bool = False) -> int:
    """The rcode of the reply to an A query for `name`, asked of `address`."""
    data = bytes(dnslib.DNSRecord.question(name).pack())
    kind = socket.SOCK_STREAM if tcp else socket.SOCK_DGRAM
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.settimeout(2)
        if tcp:
            sock.connect(address)
            sock.sendall(len(data).to_bytes(2, "big") + data)
            reply = sock.recv(65535)[2:]
        else:
            sock.sendto(data, address)
            reply = sock.recv(65535)
    return int(dnslib.DNSRecord.parse(reply).header.rcode)


def test_a_port_of_its_own_answers_its_blocks_and_a_reload_replaces_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server, "FORWARD_BUDGET", 0.01)
    # Nothing in the block answers: the end of its chain does, SERVFAIL, as CoreDNS's.
    block = BlockConfig(
        (("example", "org"),), "Corefile:9", port=0, bind="127.0.0.2", plugins=("prometheus",)
    )

    async def run() -> None:
        flags = {"--http": "127.0.0.1:0", "--query-log": True}
        first = replace(config_of(**flags), blocks=(block,))
        dns = DnsServer(first, answering(first), Snapshot(synced=True))
        async with contextlib.AsyncExitStack() as stack:
            dns.register(stack)
            port = await dns.start(stack, 0)
            ((address, other),) = dns.ports().items()
            assert address == ListenOptions("127.0.0.2", 0) and other > 0
            # Logged as CoreDNS's: the kubernetes block's port, not one whose blocks lack `log`.
            (kubernetes,), (its_own,) = dns.udp, dns.others[0].udp
            assert isinstance(kubernetes, LoggedUdpProtocol)
            assert not isinstance(its_own, LoggedUdpProtocol)
            at = ("127.0.0.2", other)

            async def asked(where: tuple[str, int], name: str, tcp: bool = False) -> int:
                return await asyncio.to_thread(rcode, where, name, tcp)

            for tcp in (False, True):
                assert await asked(at, "www.example.org", tcp) == dnslib.RCODE.SERVFAIL
                # The cluster is the kubernetes block's, on its own port only.
                assert await asked(at, "web.shop.svc.cluster.local", tcp) == dnslib.RCODE.REFUSED
                assert await asked(("127.0.0.1", port), "x.cluster.local") == dnslib.RCODE.NXDOMAIN
            # A reload that keeps the address replaces the port's blocks from the next query.
            net = replace(block, zones=(("example", "net"),))
            assert dns.reconfigure(replace(first, blocks=(net,))) == []
            assert await asked(at, "www.example.org") == dnslib.RCODE.REFUSED
            assert await asked(at, "www.example.net", tcp=True) == dnslib.RCODE.SERVFAIL
            # One that moves it waits: the port answers as it did.
            moved = replace(first, blocks=(replace(block, port=5301),))
            assert dns.reconfigure(moved) == ["server block ports"]
            assert await asked(at, "www.example.net") == dnslib.RCODE.SERVFAIL
            # Each port's queries under its own `server` label, in one registry.
            requests: dict[str, float] = {}
            for family in ANSWERING.collect():
                if family.name == "coredns_dns_requests":
                    for sample in family.samples:
                        where = sample.labels["server"]
                        requests[where] = requests.get(where, 0) + sample.value
            assert requests == {f"dns://127.0.0.1:{port}": 2, f"dns://127.0.0.2:{other}": 7}

    asyncio.run(run())


# (address listened on, port, the `server` label CoreDNS gives it: core/dnsserver's
# `Transport + "://" + net.JoinHostPort(host, port)`, the host empty without `bind`)
SERVER_LABELS = [
    ("0.0.0.0", 53, "dns://:53"),
    ("::", 5353, "dns://:5353"),
    ("127.0.0.1", 53, "dns://127.0.0.1:53"),
    ("10.0.0.10", 1053, "dns://10.0.0.10:1053"),
    ("::1", 53, "dns://[::1]:53"),
    ("fd00::a", 53, "dns://[fd00::a]:53"),
]


@pytest.mark.parametrize(("host", "port", "expected"), SERVER_LABELS)
def test_the_server_label_is_the_address_listened_on(host: str, port: int, expected: str) -> None:
    assert server_label(host, port) == expected


def test_the_caches_line_says_which_bound_was_set() -> None:
    both = config_of(**{"--cache-max-bytes": "8Mi", "--forward-cache-max-bytes": "4Mi"})
    assert server.cache_budget(both).endswith("per DNS process (as set)")
    one = server.cache_budget(config_of(**{"--cache-max-bytes": "8Mi"}))
    assert one.startswith("caches: in-zone replies up to 8.0 MiB")
    assert re.search(
        r"\((no container memory limit: the defaults|from the container's memory limit of "
        r"\d+ MiB) where not set\)$",
        one,
    )
