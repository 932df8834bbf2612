"""Command-line values to validated settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import toposdns.config as config
from toposdns.cli import build_parser, main
from toposdns.config import (
    ConfigError,
    check_max_concurrent,
    check_ttl,
    parse_cache,
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
    monkeypatch.setattr(config, "DEFAULT_RESOLV_CONF", tmp_path / "missing")
    assert config.read_search_domains(None) == ()
    with pytest.raises(ConfigError, match="cannot read it"):
        config.read_search_domains(tmp_path / "missing")
    huge = tmp_path / "huge"
    huge.write_text("#" * 70000)
    with pytest.raises(ConfigError, match="larger than 65536 bytes"):
        config.read_search_domains(huge)
    node = tmp_path / "resolv.conf"
    node.write_text("search Corp.Example\n")
    monkeypatch.setattr(config, "DEFAULT_RESOLV_CONF", node)
    assert config.read_search_domains(None) == (("corp", "example"),)


# `cache` of CoreDNS (plugin/cache/setup_test.go TestSetup), as toposdns's flags:
# (--cache-max-ttl, --cache-success, --cache-denial) -> (success, denial) as (capacity, TTL, MINTTL)
CACHE_SETUP = [
    ((None, None, None), ((10000, 3600, 5), (10000, 1800, 5))),  # cache
    ((None, "10", None), ((10, 3600, 5), (10000, 1800, 5))),  # success 10
    ((None, "10,1800,30", None), ((10, 1800, 30), (10000, 1800, 5))),  # success 10 1800 30
    ((None, "10", "10,15"), ((10, 3600, 5), (10, 15, 5))),  # success 10; denial 10 15
    ((None, "10", "10,15,2"), ((10, 3600, 5), (10, 15, 2))),  # ... denial 10 15 2
    ((25, "10", "10,15"), ((10, 25, 5), (10, 15, 5))),  # cache 25 {success 10; denial 10 15}
    ((25, "10", "10,15,5"), ((10, 25, 5), (10, 15, 5))),
    ((30, None, None), ((10000, 30, 5), (10000, 30, 5))),  # kubeadm's `cache 30`
]


@pytest.mark.parametrize(("flags", "expected"), CACHE_SETUP)
def test_cache_flags(
    flags: tuple[int | None, str | None, str | None],
    expected: tuple[tuple[int, int, int], tuple[int, int, int]],
) -> None:
    settings = parse_cache(*flags, disable=[])
    got = tuple((p.capacity, p.max_ttl, p.min_ttl) for p in (settings.success, settings.denial))
    assert got == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((0, None, None), "--cache-max-ttl 0: must be between 1 and"),  # cache 0
        ((-1, None, None), "--cache-max-ttl -1: must be between 1 and"),  # cache -1
        ((None, "", None), "--cache-success '': expected CAPACITY[,TTL[,MINTTL]]"),  # success
        ((None, "15", "aaa"), "--cache-denial 'aaa': expected CAPACITY"),  # denial aaa
        ((None, "10,0", None), "--cache-success 10,0: TTL must be between 1 and"),
        ((None, "0", None), "--cache-success 0: CAPACITY must be between 1 and"),
        ((None, "10,20,30,40", None), "expected CAPACITY[,TTL[,MINTTL]]"),
    ],
)
def test_bad_cache_flags(flags: tuple[int | None, str | None, str | None], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_cache(*flags, disable=[])


def test_cache_disable() -> None:
    settings = parse_cache(
        None, None, None, ["success:cluster.local", "denial:Cluster.Local.,example.org", "denial"]
    )
    assert settings.success.disabled == (("cluster", "local"),)
    assert settings.denial.disabled == (("cluster", "local"), ("example", "org"), ())
    assert not settings.success.keeps(("web", "shop", "svc", "cluster", "local"))
    assert settings.success.keeps(("www", "example", "org"))
    for bad in ("positive:cluster.local", "success:a..b"):
        with pytest.raises(ConfigError, match="--cache-disable"):
            parse_cache(None, None, None, [bad])


# forward's `max_concurrent` (plugin/forward/setup_test.go TestSetupMaxConcurrent)
def test_max_concurrent() -> None:
    assert check_max_concurrent(1000) == 1000
    for bad in (0, -4):
        with pytest.raises(ConfigError, match="--max-concurrent"):
            check_max_concurrent(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-concurrent", "0"], "toposdns serve: --max-concurrent 0: must be at least 1"),
        (["--cache-max-ttl", "0"], "toposdns serve: --cache-max-ttl 0: must be between 1 and"),
        (["--cache-disable", "success:"], ""),
    ],
)
def test_serve_checks_forwarding_flags_before_starting(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[object] = []
    monkeypatch.setattr("toposdns.server.run", started.append)
    code = main(["serve", "--snapshot", "x.yaml", "--upstream", "192.0.2.53", *args])
    if message:
        assert code == 2 and message in capsys.readouterr().err and not started
    else:  # `disable success` with no zones: everywhere
        assert code == 0 and len(started) == 1
        started[0].close()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--tcp-idle-timeout", "0", "--tcp-idle-timeout 0: must be between 0.001 and 3600 seconds"),
        ("--tcp-read-timeout", "-1", "--tcp-read-timeout -1: must be between"),
        ("--startup-timeout", "99999", "--startup-timeout 99999: must be between 0 and 3600"),
        ("--tcp-max-connections", "0", "--tcp-max-connections 0: must be between 1 and"),
    ],
)
def test_numeric_options_are_checked(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--snapshot", "examples/cluster.yaml", option, value]) == 2
    assert message in capsys.readouterr().err


def test_kubernetes_option_flags() -> None:
    args = build_parser().parse_args(["serve", "--zonal", "--ignore-empty-service"])
    resolver = config.resolver_config(args)
    assert (resolver.zonal, resolver.ignore_empty_service, resolver.noendpoints) == (
        True,
        True,
        False,
    )
    assert config.resolver_config(build_parser().parse_args(["serve", "--noendpoints"])).noendpoints


def test_zonal_needs_the_endpoints(capsys: pytest.CaptureFixture[str]) -> None:
    # CoreDNS's setup.go refuses `zonal` with `noendpoints` too.
    assert main(["serve", "--snapshot", "x.yaml", "--zonal", "--noendpoints"]) == 2
    assert "--zonal: requires the EndpointSlice watch; remove --noendpoints" in (
        capsys.readouterr().err
    )
