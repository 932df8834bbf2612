"""How the descriptors left after the reserve are shared between forwarded queries and TCP
clients."""

from __future__ import annotations

import pytest

from toposdns.open_files import share

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
