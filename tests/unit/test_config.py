"""Command-line values to validated settings."""

from __future__ import annotations

from pathlib import Path

import pytest

import toposdns.cli as cli
from toposdns.config import (
    ConfigError,
    check_ttl,
    parse_listen,
    parse_search_domains,
    parse_zones,
)


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


def test_search_domains_are_checked() -> None:
    too_many = "search " + " ".join(f"d{i}.example" for i in range(33))
    with pytest.raises(ConfigError, match="resolv.conf: 33 search domains; .* at most 32"):
        parse_search_domains(too_many, "resolv.conf")
    with pytest.raises(ConfigError, match="search domain 'a..b' is not a domain name"):
        parse_search_domains("search a..b\n", "resolv.conf")


def test_resolv_conf_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A missing default file gives no search domains, as CoreDNS; a named one must be there.
    monkeypatch.setattr(cli, "DEFAULT_RESOLV_CONF", tmp_path / "missing")
    assert cli.read_search_domains(None) == ()
    with pytest.raises(ConfigError, match="cannot read it"):
        cli.read_search_domains(tmp_path / "missing")
    huge = tmp_path / "huge"
    huge.write_text("#" * 70000)
    with pytest.raises(ConfigError, match="larger than 65536 bytes"):
        cli.read_search_domains(huge)
    node = tmp_path / "resolv.conf"
    node.write_text("search Corp.Example\n")
    monkeypatch.setattr(cli, "DEFAULT_RESOLV_CONF", node)
    assert cli.read_search_domains(None) == (("corp", "example"),)
