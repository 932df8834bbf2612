"""Settings, from flags (and the Corefile, tests/unit/test_corefile.py) through one table per
plugin, into the one frozen configuration."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import toposdns.resolve.autopath as autopath
from tests.helpers import kubernetes
from toposdns.cli import main
from toposdns.config import PLUGINS, Reading, ServeConfig
from toposdns.options import ConfigError, Origin, address_value, field_default
from toposdns.resolve.autopath import parse_search_domains, read_search_domains
from toposdns.resolve.client import TrustedService
from toposdns.serve.forward_cache import CacheSettings


def serve(flags: dict[str, Any]) -> ServeConfig:
    """The configuration `toposdns serve` builds from these flags (and --snapshot)."""
    return Reading().read_flags({"--snapshot": "x.yaml", **flags}).done()


def test_zones_default_and_lists() -> None:
    config = kubernetes({})
    assert config.zones == (("cluster", "local"), ("in-addr", "arpa"), ("ip6", "arpa"))
    assert config.primary_zone == ("cluster", "local")
    config = kubernetes({"--zone": ["in-addr.arpa", "Example.Org.,cluster.local"]})
    assert config.zones == (("in-addr", "arpa"), ("example", "org"), ("cluster", "local"))
    assert config.primary_zone == ("Example", "Org")  # its configured case, for PTR targets


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["in-addr.arpa"], "--zone in-addr.arpa: at least one zone must be a forward zone"),
        (["a..b"], "--zone a..b: 'a..b' is not a domain name"),
    ],
)
def test_bad_zones(values: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        kubernetes({"--zone": values})


def test_listen() -> None:
    def listen(text: str) -> tuple[str, int]:
        return address_value(text, Origin("--listen", text))

    assert listen("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert listen("[::1]:53") == ("::1", 53)
    assert listen(":53") == ("0.0.0.0", 53)
    for bad in ("localhost:53", "127.0.0.1", "127.0.0.1:99999"):
        with pytest.raises(ConfigError, match="--listen"):
            listen(bad)
    bound = serve({"--listen": "127.0.0.1:5353"}).bind
    assert (bound.host, bound.port) == ("127.0.0.1", 5353)


def test_ttl_range() -> None:
    assert kubernetes({"--ttl": "0"}).ttl == 0 and kubernetes({"--ttl": "3600"}).ttl == 3600
    with pytest.raises(ConfigError, match=re.escape("--ttl 3601: must be between 0 and 3600")):
        kubernetes({"--ttl": "3601"})


def test_every_plugin_is_a_field_of_the_configuration_with_its_defaults() -> None:
    # The options objects hold the only copy of their defaults: no flag, no setting.
    config = serve({})
    for plugin in PLUGINS:
        assert field_default(ServeConfig, plugin.name) == plugin.default()
    assert config.kubernetes == kubernetes({})
    assert config.upstreams == ()  # a snapshot: no upstreams unless named


def test_flags_name_their_help_default_from_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "TTL of answers, 0 to 3600 (default 5)" in text
    assert "repeatable (default cluster.local, in-" in text  # argparse breaks at the dash
    assert "(default 0.0.0.0:53; port 0 picks one)" in text


def test_search_domains_are_checked() -> None:
    too_many = "search " + " ".join(f"d{i}.example" for i in range(33))
    with pytest.raises(ConfigError, match="resolv.conf: 33 search domains; .* at most 32"):
        parse_search_domains(too_many, "resolv.conf")
    with pytest.raises(ConfigError, match="search domain: 'a..b' is not a domain name"):
        parse_search_domains("search a..b\n", "resolv.conf")


def test_resolv_conf_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A missing default file gives no search domains, as CoreDNS; a named one must be there.
    monkeypatch.setattr(autopath, "DEFAULT_RESOLV_CONF", tmp_path / "missing")
    assert read_search_domains(None) == ()
    with pytest.raises(ConfigError, match="cannot read it"):
        read_search_domains(tmp_path / "missing")
    huge = tmp_path / "huge"
    huge.write_text("#" * 70000)
    with pytest.raises(ConfigError, match="larger than 65536 bytes"):
        read_search_domains(huge)
    node = tmp_path / "resolv.conf"
    node.write_text("search Corp.Example\n")
    monkeypatch.setattr(autopath, "DEFAULT_RESOLV_CONF", node)
    assert read_search_domains(None) == (("corp", "example"),)
    assert serve({"--autopath": True}).autopath.search == (("corp", "example"),)


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
    settings = cache(*flags)
    got = tuple((p.capacity, p.max_ttl, p.min_ttl) for p in (settings.success, settings.denial))
    assert got == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ((0, None, None), "--cache-max-ttl 0: TTL must be between 1 and"),  # cache 0
        ((-1, None, None), "--cache-max-ttl -1: TTL must be between 1 and"),  # cache -1
        ((None, "", None), "--cache-success: expected CAPACITY [TTL [MINTTL]]"),  # success
        ((None, "15", "aaa"), "--cache-denial aaa: expected CAPACITY"),  # denial aaa
        ((None, "10,0", None), "--cache-success 10,0: TTL must be between 1 and"),
        ((None, "0", None), "--cache-success 0: CAPACITY must be between 1 and"),
        ((None, "10,20,30,40", None), "expected CAPACITY [TTL [MINTTL]]"),
    ],
)
def test_bad_cache_flags(flags: tuple[int | None, str | None, str | None], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        cache(*flags)


def test_cache_disable() -> None:
    settings = cache(
        None, None, None, ["success:cluster.local", "denial:Cluster.Local.,example.org", "denial"]
    )
    assert settings.success.disabled == (("cluster", "local"),)
    assert settings.denial.disabled == (("cluster", "local"), ("example", "org"), ())
    assert not settings.success.keeps(("web", "shop", "svc", "cluster", "local"))
    assert settings.success.keeps(("www", "example", "org"))
    for bad in ("positive:cluster.local", "success:a..b"):
        with pytest.raises(ConfigError, match="--cache-disable"):
            cache(None, None, None, [bad])


def cache(
    max_ttl: int | None, success: str | None, denial: str | None, disable: list[str] | None = None
) -> CacheSettings:
    """The forward cache from its flags."""
    flags = {"--cache-success": success, "--cache-denial": denial, "--cache-disable": disable}
    return serve({"--cache-max-ttl": None if max_ttl is None else str(max_ttl), **flags}).cache


# forward's `max_concurrent` (plugin/forward/setup_test.go TestSetupMaxConcurrent)
def test_max_concurrent() -> None:
    assert serve({"--max-concurrent": "1000"}).forward.max_concurrent == 1000
    for bad in ("0", "-4", "many"):
        with pytest.raises(ConfigError, match="--max-concurrent"):
            serve({"--max-concurrent": bad})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-concurrent", "0"], "toposdns serve: --max-concurrent 0: must be between 1 and"),
        (["--cache-max-ttl", "0"], "toposdns serve: --cache-max-ttl 0: TTL must be between 1"),
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
        ("--lameduck", "soon", "--lameduck soon: expected a duration such as 5s or 500ms"),
        ("--workers", "0", "--workers 0: must be between 1 and 1024"),
        ("--tcp-max-connections", "0", "--tcp-max-connections 0: must be between 1 and"),
    ],
)
def test_numeric_options_are_checked(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--snapshot", "examples/cluster.yaml", option, value]) == 2
    assert message in capsys.readouterr().err


def test_kubernetes_option_flags() -> None:
    resolver = serve({"--zonal": True, "--ignore-empty-service": True}).kubernetes
    assert (resolver.zonal, resolver.ignore_empty_service, resolver.noendpoints) == (
        True,
        True,
        False,
    )
    assert serve({"--noendpoints": True}).kubernetes.noendpoints


def test_zonal_needs_the_endpoints(capsys: pytest.CaptureFixture[str]) -> None:
    # CoreDNS's setup.go refuses `zonal` with `noendpoints` too.
    assert main(["serve", "--snapshot", "x.yaml", "--zonal", "--noendpoints"]) == 2
    assert "--zonal: requires the EndpointSlice watch; remove --noendpoints" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("args", "listeners"),
    [
        ([], []),
        (["--http", ":9153"], [(("0.0.0.0", 9153), {"/health", "/ready", "/explain", "/metrics"})]),
        (
            ["--health", ":8080", "--ready", ":8181", "--metrics", ":9153"],
            [
                (("0.0.0.0", 8080), {"/health"}),
                (("0.0.0.0", 8181), {"/ready"}),
                (("0.0.0.0", 9153), {"/metrics"}),
            ],
        ),
        # One address named twice is one listener; port 0 picks a new port each time.
        (
            ["--health", "127.0.0.1:8080", "--ready", "127.0.0.1:8080", "--explain", "[::1]:0"],
            [(("127.0.0.1", 8080), {"/health", "/ready"}), (("::1", 0), {"/explain"})],
        ),
        (
            ["--metrics", "127.0.0.1:0", "--explain", "127.0.0.1:0"],
            [(("127.0.0.1", 0), {"/explain"}), (("127.0.0.1", 0), {"/metrics"})],
        ),
    ],
)
def test_http_listeners(args: list[str], listeners: list[tuple[tuple[str, int], set[str]]]) -> None:
    settings = serve(dict(zip(args[::2], args[1::2], strict=True)))
    assert settings.http_listeners() == listeners
    assert settings.serves_metrics == any("/metrics" in paths for _, paths in listeners)


def test_http_addresses_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--snapshot", "x.yaml", "--explain", "localhost:9154"]) == 2
    assert "--explain localhost:9154: 'localhost' is not an IP address" in capsys.readouterr().err


def test_ecs_trust_service() -> None:
    config = serve({"--ecs-trust-service": "kube-system/coredns,other/dns"})
    assert config.toposdns.ecs_trust_services == (
        TrustedService("kube-system", "coredns"),
        TrustedService("other", "dns"),
    )
    assert serve({}).toposdns.ecs_trust_services == ()


@pytest.mark.parametrize(
    ("value", "namespaces"),
    [
        (None, {"toposdns"}),  # the controller's, where the manifests run it
        ("infra", {"infra"}),
        ("toposdns,infra", {"toposdns", "infra"}),
        ("*", {"*"}),  # every namespace, as before
    ],
)
def test_locator_namespaces(value: str | None, namespaces: set[str]) -> None:
    config = serve({} if value is None else {"--locator-namespaces": value})
    assert config.toposdns.locator_namespaces == namespaces


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("Infra", "'Infra' is not a namespace name (or *: every namespace), e.g. toposdns"),
        ("a/b", "'a/b' is not a namespace name"),
        (",", "expected a namespace, e.g. toposdns"),
    ],
)
def test_bad_locator_namespaces(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--snapshot=x.yaml", f"--locator-namespaces={value}"]) == 2
    assert f"toposdns serve: --locator-namespaces {value}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["coredns", "kube-system/", "/coredns", "a/b/c", "Kube/dns"])
def test_bad_ecs_trust_service(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--snapshot=x.yaml", f"--ecs-trust-service={value}"]) == 2
    assert capsys.readouterr().err == (
        f"toposdns serve: --ecs-trust-service {value}: {value!r} is not NAMESPACE/NAME, "
        "e.g. kube-system/coredns\n"
    )
