"""Command-line values to validated settings."""

from __future__ import annotations

import pytest

from toposdns.config import ConfigError, check_ttl, parse_listen, parse_zones


def test_zones_default_and_lists() -> None:
    zones, primary = parse_zones([])
    assert zones == (("cluster", "local"), ("in-addr", "arpa"), ("ip6", "arpa"))
    assert primary == ("cluster", "local")
    zones, primary = parse_zones(["in-addr.arpa", "Example.Org.,cluster.local"])
    assert zones == (("in-addr", "arpa"), ("example", "org"), ("cluster", "local"))
    assert primary == ("Example", "Org")  # its configured case, for PTR targets


@pytest.mark.parametrize("values", [["in-addr.arpa"], ["a..b"]])
def test_bad_zones(values: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse_zones(values)


def test_listen() -> None:
    assert parse_listen("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert parse_listen("[::1]:53") == ("::1", 53)
    assert parse_listen(":53") == ("0.0.0.0", 53)
    for bad in ("localhost:53", "127.0.0.1", "127.0.0.1:99999"):
        with pytest.raises(ConfigError):
            parse_listen(bad)


def test_ttl_range() -> None:
    assert check_ttl(0) == 0 and check_ttl(3600) == 3600
    with pytest.raises(ConfigError):
        check_ttl(3601)
