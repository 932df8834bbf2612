"""How the descriptors left after the reserve are shared between forwarded queries and TCP
clients."""

from __future__ import annotations

import pytest

from toposdns.config import ServeConfig
from toposdns.open_files import RESERVE, fit, forwards, share
from toposdns.serve.blocks import BlockConfig
from toposdns.serve.forward import ForwardOptions
from toposdns.serve.tcp import TcpOptions
from toposdns.serve.upstream import Upstream

SHARES = [
    # (what is left, --max-concurrent (0: no upstreams), --tcp-max-connections, expected)
    ("room for both", 20_000, 1000, 1024, (1000, 1024)),
    ("exactly enough", 2024, 1000, 1024, (1000, 1024)),
    ("a limit of 1024", 960, 1000, 1024, (475, 485)),
    ("no upstreams", 960, 0, 1024, (0, 960)),
    ("no upstreams, room", 960, 0, 500, (0, 500)),
    ("almost nothing left", 1, 1000, 1024, (1, 1)),
]


@pytest.mark.parametrize(
    ("available", "forwarding", "tcp", "expected"),
    [case[1:] for case in SHARES],
    ids=[case[0] for case in SHARES],
)
def test_share(available: int, forwarding: int, tcp: int, expected: tuple[int, int]) -> None:
    fitted = share(available, forwarding, tcp)
    assert fitted == expected
    if available >= 2:
        assert sum(fitted) <= available


def forwarding(concurrent: int, upstreams: int, expire: float = 10.0) -> ForwardOptions:
    hosts = tuple(Upstream(f"192.0.2.{i + 1}") for i in range(upstreams))
    return ForwardOptions(upstreams=hosts, max_concurrent=concurrent, expire=expire)


def configured(kubernetes: ForwardOptions, blocks: list[ForwardOptions], tcp: int) -> ServeConfig:
    stubs = tuple(
        BlockConfig(((f"stub{i}", "local"),), forward=options) for i, options in enumerate(blocks)
    )
    return ServeConfig(forward=kubernetes, tcp=TcpOptions(max_connections=tcp), blocks=stubs)


NONE = ForwardOptions(upstreams=())
FITS = [
    # (limit, the kubernetes block's forward, the other blocks' forwards, --tcp-max-connections,
    # expected: the forwarders' max_concurrent in that order, TCP connections, idle connections)
    ("room for all", 4096, forwarding(1000, 1), [], 1024, ((1000,), 1024, 16)),
    ("a limit of 1024", 1024, forwarding(1000, 1), [], 1024, ((467,), 477, 16)),
    # Fits alone, not with a stub domain's forwarder and its two upstreams' idle connections.
    ("a stub domain's forwarder", 2200, forwarding(1000, 1), [forwarding(1000, 2)], 1024,
     ((690, 690), 707, 48)),
    ("and another's, smaller", 2200, forwarding(1000, 1), [forwarding(1000, 2),
     forwarding(100, 1)], 1024, ((663, 663, 66), 679, 64)),
    ("stub domains alone", 1024, NONE, [forwarding(1000, 1), forwarding(1000, 1)], 1024,
     ((307, 307), 314, 32)),
    ("expire 0 keeps none idle", 1024, forwarding(1000, 3, expire=0), [], 1024, ((475,), 485, 0)),
    ("no forwarders", 1024, NONE, [], 1024, ((), 960, 0)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "kubernetes", "blocks", "tcp", "expected"),
    [case[1:] for case in FITS],
    ids=[case[0] for case in FITS],
)
def test_every_forwarder_and_its_idle_connections_fit_in_the_limit(
    limit: int,
    kubernetes: ForwardOptions,
    blocks: list[ForwardOptions],
    tcp: int,
    expected: tuple[tuple[int, ...], int, int],
) -> None:
    fitted = fit(configured(kubernetes, blocks, tcp), limit)
    concurrent = tuple(options.max_concurrent for options in forwards(fitted.config))
    assert (concurrent, fitted.config.tcp.max_connections, fitted.idle) == expected
    assert fitted.forwarding == sum(concurrent) and fitted.tcp == expected[1]
    assert sum(concurrent) + expected[1] + fitted.idle + RESERVE <= limit
