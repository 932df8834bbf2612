"""CoreDNS's `cache` setup tables (plugin/cache/setup_test.go at the commit
docs/coredns-compatibility.md names: TestSetup, TestServeStale, TestServeStaleFailureRecheck,
TestServfail, TestDisable, TestKeepttl), as data, through the Corefile reader: each directive
in the kubernetes server block and in a server block without kubernetes (a stub domain's).
TestServeStalePolicy is left out: `serve_stale_policy` is not supported (the last test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toposdns.config import Reading
from toposdns.corefile import read_corefile
from toposdns.options import ConfigError
from toposdns.serve.forward_cache import CacheSettings, Prefetch, ServeStale

#: setup.go's defaults: capacity, the maximum TTLs of denials and answers, the minimum TTL.
CAP, NTTL, PTTL, MINTTL = 10_000, 1800, 3600, 5
HOUR, MINUTE = 3600.0, 60.0
WHERE = ["kubernetes block", "block without kubernetes"]


def read_cache(tmp_path: Path, directive: str, where: str) -> CacheSettings:
    """The `cache` settings of a Corefile whose kubernetes block, or whose stub domain's
    block, holds `directive` (a `cache` line and its block)."""
    body = "\n".join("    " + line.strip() for line in directive.splitlines())
    if where == "kubernetes block":
        text = f".:53 {{\n    kubernetes cluster.local\n{body}\n}}\n"
    else:
        text = (
            ".:53 {\n    kubernetes cluster.local\n}\n"
            f"consul.local:53 {{\n    forward . 192.0.2.53\n{body}\n}}\n"
        )
    path = tmp_path / "Corefile"
    path.write_text(text)
    config = read_corefile(path, Reading()).done()
    return config.cache if where == "kubernetes block" else config.blocks[0].cache


def block(options: str) -> str:
    """`cache { OPTIONS }`, as setup_test.go's later tables write their input."""
    return f"cache {{\n{options}\n}}"


# TestSetup: (input, (ncap, pcap, nttl, minnttl, pttl, minpttl, prefetch))
SETUP = [
    ("cache", (CAP, CAP, NTTL, MINTTL, PTTL, MINTTL, 0)),
    ("cache {\n}", (CAP, CAP, NTTL, MINTTL, PTTL, MINTTL, 0)),
    ("cache example.nl {\nsuccess 10\n}", (CAP, 10, NTTL, MINTTL, PTTL, MINTTL, 0)),
    ("cache example.nl {\nsuccess 10 1800 30\n}", (CAP, 10, NTTL, MINTTL, 1800, 30, 0)),
    ("cache example.nl {\nsuccess 10\ndenial 10 15\n}", (10, 10, 15, MINTTL, PTTL, MINTTL, 0)),
    ("cache example.nl {\nsuccess 10\ndenial 10 15 2\n}", (10, 10, 15, 2, PTTL, MINTTL, 0)),
    ("cache 25 example.nl {\nsuccess 10\ndenial 10 15\n}", (10, 10, 15, MINTTL, 25, MINTTL, 0)),
    ("cache 25 example.nl {\nsuccess 10\ndenial 10 15 5\n}", (10, 10, 15, 5, 25, MINTTL, 0)),
    ("cache aaa example.nl", (CAP, CAP, NTTL, MINTTL, PTTL, MINTTL, 0)),
    ("cache {\nprefetch 10\n}", (CAP, CAP, NTTL, MINTTL, PTTL, MINTTL, 10)),
]
# TestSetup's failures: (input, what the error names)
SETUP_ERRORS = [
    ("cache example.nl {\nsuccess\ndenial 10 15\n}", "success: expected CAPACITY"),
    ("cache example.nl {\nsuccess 15\ndenial aaa\n}", "denial aaa: expected CAPACITY"),
    ("cache example.nl {\npositive 15\nnegative aaa\n}", "positive: not an option of cache"),
    ("cache 0 example.nl", "TTL must be between 1 and"),
    ("cache -1 example.nl", "TTL must be between 1 and"),
    ("cache 1 example.nl {\npositive 0\n}", "positive: not an option of cache"),
    ("cache 1 example.nl {\npositive 0\nprefetch -1\n}", "positive: not an option"),
    ("cache 1 example.nl {\nprefetch 0 blurp\n}", "'blurp' is not a duration"),
    ("cache\ncache", "cache: given twice in the server block"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("text", "expected"), SETUP)
def test_setup(
    tmp_path: Path, where: str, text: str, expected: tuple[int, int, int, int, int, int, int]
) -> None:
    cache = read_cache(tmp_path, text, where)
    success, denial = cache.success, cache.denial
    got = (denial.capacity, success.capacity, denial.max_ttl, denial.min_ttl)
    assert (*got, success.max_ttl, success.min_ttl, cache.prefetch.amount) == expected


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("text", "message"), SETUP_ERRORS)
def test_setup_errors(tmp_path: Path, where: str, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        read_cache(tmp_path, text, where)
    shown = str(error.value)
    assert message in shown and "Corefile:" in shown and "\n" not in shown


def test_zones_after_the_ttl_are_the_zones_cached(tmp_path: Path) -> None:
    # `cache aaa example.nl`: "aaa" is no TTL, so a zone (setup.go's Atoi); only names under
    # the zones are kept.
    for where in WHERE:
        cache = read_cache(tmp_path, "cache aaa example.nl", where)
        assert cache.success.zones == cache.denial.zones == (("aaa",), ("example", "nl"))
        assert cache.success.keeps(("www", "example", "nl"))
        assert not cache.denial.keeps(("example", "org"))
        assert read_cache(tmp_path, "cache 30", where).success.keeps(("example", "org"))


# TestServeStale: (options, (staleUpTo, verifyStale, verifyStaleTimeout, staleTTL))
SERVE_STALE = [
    ("serve_stale", (HOUR, False, 0, 0)),
    ("serve_stale 20m", (20 * MINUTE, False, 0, 0)),
    ("serve_stale 1h20m", (80 * MINUTE, False, 0, 0)),
    ("serve_stale 0m", (0, False, 0, 0)),
    ("serve_stale 0", (0, False, 0, 0)),
    ("serve_stale 0 verify", (0, True, 0, 0)),
    ("serve_stale 0 immediate", (0, False, 0, 0)),
    ("serve_stale 0 VERIFY", (0, True, 0, 0)),
    ("serve_stale 1h immediate 30s", (HOUR, False, 0, 30)),
    ("serve_stale 1h immediate 30s 30s", (HOUR, False, 0, 30)),
    ("serve_stale 1h immediate 4294967295s", (HOUR, False, 0, 2**32 - 1)),
    ("serve_stale 1h immediate 0", (HOUR, False, 0, 0)),
    ("serve_stale 1h verify 100ms", (HOUR, True, 0.1, 0)),
    ("serve_stale 1h verify 100ms 30s", (HOUR, True, 0.1, 30)),
    ("serve_stale 1h verify 100ms 30s 30s", (HOUR, True, 0.1, 30)),
    ("serve_stale 1h verify 0", (HOUR, True, 0, 0)),
    ("serve_stale 1h verify 0 1m", (HOUR, True, 0, 60)),
    ("serve_stale 1h VERIFY 250ms", (HOUR, True, 0.25, 0)),
]
SERVE_STALE_ERRORS = [
    ("serve_stale 20", "'20' is not a duration"),
    ("serve_stale -20m", "must not be negative"),
    ("serve_stale aa", "'aa' is not a duration"),
    ("serve_stale 1m nono", "nono: expected immediate or verify"),
    ("serve_stale 0 after nono", "after: expected immediate or verify"),
    ("serve_stale 1h immediate 100ms", "100ms: the TTL of stale replies must be whole seconds"),
    ("serve_stale 1h immediate 4294967296s", "at most 4294967295s"),
    ("serve_stale 1h immediate -1s", "-1s: must not be negative"),
    ("serve_stale 1h immediate garbage", "'garbage' is not a duration"),
    ("serve_stale 1h immediate 30s extra", "'extra' is not a duration"),
    ("serve_stale 1h verify -1ms", "-1ms: must not be negative"),
    ("serve_stale 1h verify garbage", "'garbage' is not a duration"),
    ("serve_stale 1h verify 100ms 500ms", "500ms: the TTL of stale replies must be whole"),
    ("serve_stale 1h verify 100ms -1s", "-1s: must not be negative"),
    ("serve_stale 1h verify 100ms garbage", "'garbage' is not a duration"),
    ("serve_stale 1h verify 100ms 30s extra", "'extra' is not a duration"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("options", "expected"), SERVE_STALE)
def test_serve_stale(
    tmp_path: Path, where: str, options: str, expected: tuple[float, bool, float, int]
) -> None:
    stale = read_cache(tmp_path, block(options), where).stale
    assert (stale.up_to, stale.verify, stale.verify_timeout, stale.ttl) == expected


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("options", "message"), SERVE_STALE_ERRORS)
def test_serve_stale_errors(tmp_path: Path, where: str, options: str, message: str) -> None:
    with pytest.raises(ConfigError, match="Corefile:[0-9]+: serve_stale") as error:
        read_cache(tmp_path, block(options), where)
    assert message in str(error.value)


# TestServeStaleFailureRecheck: (options, the failure recheck in seconds, or the error)
FAILURE_RECHECK = [
    ("serve_stale 1h immediate 30s 30s", 30.0),
    ("serve_stale 1h immediate 0 0", 0.0),
    ("serve_stale 1h verify 100ms 30s 250ms", 0.25),
    ("serve_stale 1h verify 0 0 5m", 300.0),
    ("serve_stale 1h immediate 30s -1s", "-1s: must not be negative"),
    ("serve_stale 1h immediate 30s 5m1s", "5m1s: must be at most 5m"),
    ("serve_stale 1h immediate 30s invalid", "'invalid' is not a duration"),
    ("serve_stale 1h immediate 30s 30s extra", "extra: too many words"),
    ("serve_stale 1h verify 100ms 30s -1s", "-1s: must not be negative"),
    ("serve_stale 1h verify 100ms 30s 30s extra", "extra: too many words"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("options", "expected"), FAILURE_RECHECK)
def test_serve_stale_failure_recheck(
    tmp_path: Path, where: str, options: str, expected: float | str
) -> None:
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match="Corefile:[0-9]+: serve_stale") as error:
            read_cache(tmp_path, block(options), where)
        assert expected in str(error.value)
    else:
        assert read_cache(tmp_path, block(options), where).stale.recheck == expected


# TestServfail: (options, the SERVFAIL TTL in seconds, or the error)
SERVFAIL = [
    ("servfail 1s", 1),
    ("servfail 5m", 300),
    ("servfail 0s", 0),
    ("servfail 0", 0),
    ("servfail", "servfail: expected a duration"),
    ("servfail 6m", "6m: must be at most 5m"),
    ("servfail 20", "'20' is not a duration"),
    ("servfail -1s", "-1s: must not be negative"),
    ("servfail aa", "'aa' is not a duration"),
    ("servfail 1m invalid", "servfail 1m invalid: expected a duration"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("options", "expected"), SERVFAIL)
def test_servfail(tmp_path: Path, where: str, options: str, expected: int | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match="Corefile:[0-9]+: servfail") as error:
            read_cache(tmp_path, block(options), where)
        assert expected in str(error.value)
    else:
        assert read_cache(tmp_path, block(options), where).servfail_ttl == expected


ORG_COM = (("example", "com"), ("example", "org"))
# TestDisable: (options, (denial's disabled zones, success's), or the error)
DISABLE = [
    ("disable denial example.com example.org", (ORG_COM, ())),
    ("disable success example.com example.org", ((), ORG_COM)),
    ("disable denial", (((),), ())),
    ("disable success", ((), ((),))),
    (
        "disable denial example.com example.org\ndisable success example.com example.org",
        (ORG_COM, ORG_COM),
    ),
    ("disable invalid example.com example.org", "expected success or denial"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("options", "expected"), DISABLE)
def test_disable(tmp_path: Path, where: str, options: str, expected: object) -> None:
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match="Corefile:[0-9]+: disable invalid") as error:
            read_cache(tmp_path, block(options), where)
        assert expected in str(error.value)
    else:
        cache = read_cache(tmp_path, block(options), where)
        assert (cache.denial.disabled, cache.success.disabled) == expected


@pytest.mark.parametrize("where", WHERE)
def test_keepttl(tmp_path: Path, where: str) -> None:
    assert read_cache(tmp_path, block("keepttl"), where).keepttl
    assert not read_cache(tmp_path, "cache", where).keepttl
    with pytest.raises(ConfigError, match="Corefile:7: keepttl arg1: takes no value"):
        read_cache(tmp_path, block("keepttl arg1"), "block without kubernetes")


# prefetch AMOUNT [DURATION [PERCENTAGE%]] (README; setup.go's checks): (options, expected)
PREFETCH = [
    ("prefetch 10", Prefetch(10, 60.0, 10)),
    ("prefetch 2 10m", Prefetch(2, 600.0, 10)),
    ("prefetch 2 10m 20%", Prefetch(2, 600.0, 20)),
    ("prefetch 0", Prefetch(0)),
    ("prefetch", "expected AMOUNT [DURATION [PERCENTAGE%]]"),
    ("prefetch 1 1m 10% x", "expected AMOUNT [DURATION [PERCENTAGE%]]"),
    ("prefetch -1", "AMOUNT must be between 0 and"),
    ("prefetch x", "'x' is not a whole number"),
    ("prefetch 1 1m 20", "20: expected a percentage with its %"),
    ("prefetch 1 1m 9%", "PERCENTAGE must be between 10 and 90"),
    ("prefetch 1 1m 91%", "PERCENTAGE must be between 10 and 90"),
    ("prefetch 1 1m x%", "x%: expected a percentage with its %"),
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("options", "expected"), PREFETCH)
def test_prefetch(tmp_path: Path, where: str, options: str, expected: Prefetch | str) -> None:
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match="Corefile:[0-9]+: prefetch") as error:
            read_cache(tmp_path, block(options), where)
        assert expected in str(error.value)
    else:
        assert read_cache(tmp_path, block(options), where).prefetch == expected


def test_the_flags_spell_the_same_settings() -> None:
    flags = {
        "--snapshot": "x.yaml",
        "--cache-prefetch": "2,10m,20%",
        "--cache-serve-stale": "1h,verify,100ms,30s",
    }
    cache = Reading().read_flags(flags).done().cache
    assert cache.prefetch == Prefetch(2, 600.0, 20)
    assert cache.stale == ServeStale(HOUR, True, 0.1, 30)
    alone = Reading().read_flags({"--snapshot": "x.yaml", "--cache-serve-stale": True}).done()
    assert alone.cache.stale == ServeStale(HOUR)  # no value: CoreDNS's `serve_stale` alone
    with pytest.raises(ConfigError, match="--cache-serve-stale 20: '20' is not a duration"):
        Reading().read_flags({"--snapshot": "x.yaml", "--cache-serve-stale": "20"})


def test_serve_stale_policy_is_refused_with_what_is_supported(tmp_path: Path) -> None:
    # TestServeStalePolicy's cases are left out: toposdns keeps one entry per question, not a
    # positive and a negative one, so prefer_positive has nothing to prefer.
    with pytest.raises(ConfigError) as error:
        read_cache(tmp_path, block("serve_stale\nserve_stale_policy prefer_positive"), WHERE[0])
    assert "Corefile:5: serve_stale_policy: not an option of cache; " in str(error.value)
    assert "keepttl, prefetch, serve_stale, servfail, success" in str(error.value)
