"""CoreDNS's `forward` setup tests (plugin/forward/setup_test.go, setup_policy_test.go), their
tables as data, read through the Corefile parser: each input is a `forward` directive in a
server block with kubernetes, and gives either the options it sets or the error it stops at
(at file:line). The inputs CoreDNS accepts and toposdns refuses (DNS over HTTPS, host names,
a second `forward` in one block, the options not supported) are rows too, with the reason;
docs/coredns-compatibility.md lists them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toposdns.config import ServeConfig
from toposdns.corefile import read_corefile
from toposdns.options import ConfigError
from toposdns.serve.forward import ForwardOptions, Upstream

#: (CoreDNS test and row, the directive as CoreDNS's test writes it, what it sets here: a
#: dict of ForwardOptions fields, or the error's text after `Corefile:`).
CASES: list[tuple[str, str, dict[str, Any] | str]] = [
    # TestSetup, positive
    ("TestSetup/0", "forward . 127.0.0.1", {
        "zone": (), "ignored": (), "max_fails": 2, "health_recursion": True,
        "health_domain": (), "force_tcp": False, "prefer_udp": False,
        "upstreams": (Upstream("127.0.0.1"),),
    }),
    ("TestSetup/1", "forward . 127.0.0.1 {\nhealth_check 0.5s domain example.org\n}\n", {
        "health_check": 0.5, "health_domain": ("example", "org"), "health_recursion": True,
    }),
    ("TestSetup/2", "forward . 127.0.0.1 {\nexcept miek.nl\n}\n", {"ignored": (("miek", "nl"),)}),
    ("TestSetup/3", "forward . 127.0.0.1 {\nmax_fails 3\n}\n", {"max_fails": 3}),
    ("TestSetup/4", "forward . 127.0.0.1 {\nforce_tcp\n}\n", {"force_tcp": True}),
    ("TestSetup/5", "forward . 127.0.0.1 {\nprefer_udp\n}\n", {"prefer_udp": True}),
    ("TestSetup/6", "forward . 127.0.0.1 {\nforce_tcp\nprefer_udp\n}\n", {
        "force_tcp": True, "prefer_udp": True,
    }),
    ("TestSetup/7", "forward . 127.0.0.1:53", {"upstreams": (Upstream("127.0.0.1", 53),)}),
    ("TestSetup/8", "forward . 127.0.0.1:8080", {"upstreams": (Upstream("127.0.0.1", 8080),)}),
    ("TestSetup/9", "forward . [::1]:53", {"upstreams": (Upstream("::1", 53),)}),
    ("TestSetup/10", "forward . [2003::1]:53", {"upstreams": (Upstream("2003::1", 53),)}),
    ("TestSetup/11", "forward . 127.0.0.1 \n", {"zone": ()}),
    ("TestSetup/12", "forward 10.9.3.0/18 127.0.0.1", {
        "zone": ("0", "9", "10", "in-addr", "arpa"),
    }),
    # CoreDNS chains a second forward after the first; toposdns takes one per server block.
    ("TestSetup/13", "forward . ::1\nforward com ::2", "4: forward: given twice in the server"),
    ("TestSetup/14", "forward . tls://[2400:3200::1%dns.alidns.com]:853 {\ntls\n}\n", {
        "upstreams": (Upstream("2400:3200::1", 853, True, "dns.alidns.com"),), "tls": (),
    }),
    # DNS over HTTPS is not supported here.
    ("TestSetup/15", "forward . https://127.0.0.1 \n", "DNS over HTTPS is not supported"),
    # TestSetup, negative
    ("TestSetup/16", "forward . https://1.1.1.1/ \n", "DNS over HTTPS is not supported"),
    # CoreDNS looks host names up at startup ("failed to resolve"); toposdns takes addresses.
    ("TestSetup/17", "forward . a27.0.0.1", "host names are not looked up"),
    ("TestSetup/18", "forward . 127.0.0.1 {\nblaatl\n}\n", "4: blaatl: not an option of forward"),
    ("TestSetup/19", "forward . 127.0.0.1 {\nhealth_check 0.5s domain\n}\n",
     "4: health_check 0.5s domain: domain: expected a name"),
    ("TestSetup/20", f"forward {'x' * 64} 127.0.0.1 \n", "is not a domain name"),
    # TestSetupTLS
    ("TestSetupTLS/0", "forward . tls://127.0.0.1 {\ntls_servername dns\n}", {
        "upstreams": (Upstream("127.0.0.1", 853, True),), "tls_servername": "dns",
    }),
    ("TestSetupTLS/1", "forward . tls://127.0.0.1%example.net {\ntls\n}", {
        "upstreams": (Upstream("127.0.0.1", 853, True, "example.net"),),
    }),
    ("TestSetupTLS/2",
     "forward . tls://127.0.0.1%example.net:854 tls://127.0.0.2%example.net "
     "tls://fe80::1%example.com {\ntls\n}", {
        "upstreams": (
            Upstream("127.0.0.1", 854, True, "example.net"),
            Upstream("127.0.0.2", 853, True, "example.net"),
            Upstream("fe80::1", 853, True, "example.com"),
        ),
    }),
    ("TestSetupTLS/3", "forward . tls://127.0.0.1%example.net:854 {\ntls\n}", {
        "upstreams": (Upstream("127.0.0.1", 854, True, "example.net"),),
    }),
    ("TestSetupTLS/4", "forward . tls://127.0.0.1%example.net:854 {\ntls_servername foo\n}",
     "3: forward: both forward ('foo') and proxy level ('example.net') TLS servernames are set "
     "for upstream proxy 'tls://127.0.0.1:854'"),
    # A name or TLS settings for plain upstreams: accepted and unused, as by CoreDNS.
    ("TestSetupTLS/5", "forward . 127.0.0.1 {\ntls_servername dns\n}", {"tls_servername": "dns"}),
    ("TestSetupTLS/6", "forward . 127.0.0.1 {\ntls\n}", {"tls": ()}),
    ("TestSetupTLS/7", "forward . tls://127.0.0.1", {
        "upstreams": (Upstream("127.0.0.1", 853, True),), "tls": None, "tls_servername": "",
    }),
    ("TestSetupTLS/8", "forward . tls://[2400:3200::1%dns.alidns.com]:853 {\ntls\n}", {
        "upstreams": (Upstream("2400:3200::1", 853, True, "dns.alidns.com"),),
    }),
    ("TestSetupTLS/9",
     "forward . tls://[2400:3200::1]:853 {\ntls\ntls_servername dns.alidns.com\n}", {
        "upstreams": (Upstream("2400:3200::1", 853, True),), "tls_servername": "dns.alidns.com",
    }),
    # TestSetupResolvconf ({dir}: the test's directory, where it writes the files)
    ("TestSetupResolvconf/0", "forward . {dir}/resolv.conf", {
        "upstreams": (Upstream("10.10.255.252"), Upstream("10.10.255.253")),
    }),
    ("TestSetupResolvconf/1", "forward . {dir}/null.conf", "no upstream: the files given"),
    ("TestSetupResolvconf/2", "forward . {dir}/resolv-ipv6.conf", {
        "upstreams": (Upstream("0388:d254:7aec:6892:9f7f:e93b:5806:1b0f"),),
    }),
    ("TestSetupResolvconf/3", "forward . {dir}/empty.conf 127.0.0.1", {
        "upstreams": (Upstream("127.0.0.1"),),
    }),
    # TestSetupMaxConcurrent (0 is refused here too: every input is bounded)
    ("TestSetupMaxConcurrent/0", "forward . 127.0.0.1 {\nmax_concurrent 1000\n}\n", {
        "max_concurrent": 1000,
    }),
    ("TestSetupMaxConcurrent/1", "forward . 127.0.0.1 {\nmax_concurrent many\n}\n",
     "4: max_concurrent many: expected a whole number"),
    ("TestSetupMaxConcurrent/2", "forward . 127.0.0.1 {\nmax_concurrent -4\n}\n",
     "4: max_concurrent -4: must be between 1 and"),
    # TestSetupHealthCheck
    ("TestSetupHealthCheck/0", "forward . 127.0.0.1\n", {
        "health_recursion": True, "health_domain": (), "health_check": 0.5,
    }),
    ("TestSetupHealthCheck/1", "forward . 127.0.0.1 {\nhealth_check 0.5s\n}\n", {
        "health_recursion": True, "health_domain": (),
    }),
    ("TestSetupHealthCheck/2", "forward . 127.0.0.1 {\nhealth_check 0.5s no_rec\n}\n", {
        "health_recursion": False, "health_domain": (),
    }),
    ("TestSetupHealthCheck/3",
     "forward . 127.0.0.1 {\nhealth_check 0.5s no_rec domain example.org\n}\n", {
        "health_recursion": False, "health_domain": ("example", "org"),
    }),
    ("TestSetupHealthCheck/4", "forward . 127.0.0.1 {\nhealth_check 0.5s domain example.org\n}\n", {
        "health_recursion": True, "health_domain": ("example", "org"),
    }),
    ("TestSetupHealthCheck/5", "forward . 127.0.0.1 {\nhealth_check 0.5s domain .\n}\n", {
        "health_domain": (),
    }),
    ("TestSetupHealthCheck/6",
     "forward . 127.0.0.1 {\nhealth_check 0.5s domain example.org.\n}\n", {
        "health_domain": ("example", "org"),
    }),
    ("TestSetupHealthCheck/7", "forward . 127.0.0.1 {\nhealth_check no_rec\n}\n",
     "4: health_check no_rec: expected a duration such as 5s"),
    ("TestSetupHealthCheck/8", "forward . 127.0.0.1 {\nhealth_check domain example.org\n}\n",
     "expected a duration such as 5s"),
    ("TestSetupHealthCheck/9", "forward . 127.0.0.1 {\nhealth_check 0.5s rec\n}\n",
     "unknown option 'rec'"),
    ("TestSetupHealthCheck/10", "forward . 127.0.0.1 {\nhealth_check 0.5s domain\n}\n",
     "domain: expected a name"),
    ("TestSetupHealthCheck/11",
     "forward . 127.0.0.1 {\nhealth_check 0.5s domain example..org\n}\n",
     "'example..org' is not a domain name"),
    # TestSetupPolicy
    ("TestSetupPolicy/0", "forward . 127.0.0.1 {\npolicy random\n}\n", {"policy": "random"}),
    ("TestSetupPolicy/1", "forward . 127.0.0.1 {\npolicy round_robin\n}\n", {
        "policy": "round_robin",
    }),
    ("TestSetupPolicy/2", "forward . 127.0.0.1 {\npolicy sequential\n}\n", {
        "policy": "sequential",
    }),
    ("TestSetupPolicy/3", "forward . 127.0.0.1 {\npolicy random2\n}\n",
     "4: policy random2: unknown policy 'random2'"),
    # The values CoreDNS's parseBlock refuses, of the options supported here.
    ("max_fails -1", "forward . 127.0.0.1 {\nmax_fails -1\n}\n",
     "4: max_fails -1: must be between 0 and 4294967295"),
    ("max_fails 0", "forward . 127.0.0.1 {\nmax_fails 0\n}\n", {"max_fails": 0}),
    ("expire negative", "forward . 127.0.0.1 {\nexpire -1s\n}\n", "4: expire -1s: must be between"),
    ("expire", "forward . 127.0.0.1 {\nexpire 30s\n}\n", {"expire": 30.0}),
    ("except, no zone", "forward . 127.0.0.1 {\nexcept\n}\n", "4: except: expected at least one"),
    ("except twice", "forward . 127.0.0.1 {\nexcept a.org\nexcept B.org c.org\n}\n", {
        "ignored": (("a", "org"), ("b", "org"), ("c", "org")),
    }),
    ("force_tcp with a value", "forward . 127.0.0.1 {\nforce_tcp yes\n}\n", "takes no value"),
    ("tls, 4 files", "forward . tls://127.0.0.1 {\ntls a b c d\n}\n", "expected at most 3 files"),
    ("tls, a missing CA", "forward . tls://127.0.0.1 {\ntls /nonexistent/ca.pem\n}\n",
     "4: tls /nonexistent/ca.pem: cannot use these files for TLS"),
    ("FROM only", "forward example.org 127.0.0.1", {"zone": ("example", "org")}),
    ("no TO", "forward .", "3: forward .: expected `forward FROM TO...`"),
    ("grpc", "forward . grpc://127.0.0.1", "'grpc' is not supported as a destination"),
    # TestFailoverValidation, and the rcodes of TestFailover (any letter case)
    ("TestFailoverValidation/NoErrorDisallowed", "forward . 127.0.0.1 {\nfailover NOERROR\n}\n",
     "4: failover NOERROR: NoError cannot be used in failover"),
    ("TestFailoverValidation/InvalidRcode",
     "forward . 127.0.0.1 {\nfailover NOT_A_VALID_RCODE\n}\n", "is not a valid rcode"),
    ("TestFailover/0", "forward . 127.0.0.1 {\npolicy sequential\nfailover ServFail Refused\n}\n",
     {"failover": frozenset({2, 5}), "policy": "sequential"}),
    ("failover, no rcode", "forward . 127.0.0.1 {\nfailover\n}\n",
     "4: failover: expected at least one rcode"),
    # Options of CoreDNS 1.14's forward that toposdns does not have (TestSourceAddress,
    # TestSetupMaxConnectAttempts, TestSetupMaxIdleConns, TestNextAlternate,
    # TestFailfastAllUnhealthyUpstreams, TestSetupMaxAge,
    # TestSetupReadTimeout): refused, with what is supported.
    *(
        (f"unsupported {option}", f"forward . 127.0.0.1 {{\n{option}\n}}\n",
         f"4: {option.split()[0]}: not an option of forward; supported: except, expire")
        for option in (
            "source_address 192.0.2.1", "max_connect_attempts 0", "max_idle_conns 10",
            "next NXDOMAIN", "next_on_nodata", "failfast_all_unhealthy_upstreams",
            "max_age 30s", "read_timeout 5s", "doh_method GET",
            "resolver 10.0.0.1",
        )
    ),
]  # fmt: skip

RESOLV_CONF = {
    "resolv.conf": "nameserver 10.10.255.252\nnameserver 10.10.255.253",
    "resolv-ipv6.conf": "nameserver 0388:d254:7aec:6892:9f7f:e93b:5806:1b0f%en0",
    "empty.conf": "# nameserver 1.1.1.1\n# nameserver 1.0.0.1",
    "null.conf": "",
}


def read_forward(tmp_path: Path, directive: str) -> ServeConfig:
    for name, text in RESOLV_CONF.items():
        (tmp_path / name).write_text(text)
    corefile = tmp_path / "Corefile"
    directive = directive.replace("{dir}", str(tmp_path))
    corefile.write_text(f".:53 {{\n  kubernetes cluster.local\n  {directive}\n}}\n")
    return read_corefile(corefile).done()


@pytest.mark.parametrize(
    ("directive", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_coredns_setup_table(
    tmp_path: Path, directive: str, expected: dict[str, Any] | str
) -> None:
    if isinstance(expected, str):
        with pytest.raises(ConfigError) as error:
            read_forward(tmp_path, directive)
        shown = str(error.value).replace(str(tmp_path) + "/", "")
        assert f"Corefile:{expected}" in shown or expected in shown, shown
        assert shown.startswith("Corefile:") and "\n" not in shown
        return
    options = read_forward(tmp_path, directive).forward
    assert {field: getattr(options, field) for field in expected} == expected


def test_the_defaults_are_coredns_defaults() -> None:
    # forward.go New(): max_fails 2, expire 10s, random, health checks every 0.5s with RD at `.`.
    options = ForwardOptions()
    assert (options.max_fails, options.expire, options.policy) == (2, 10.0, "random")
    assert (options.health_check, options.health_recursion, options.health_domain) == (
        0.5,
        True,
        (),
    )
    assert (options.force_tcp, options.prefer_udp, options.zone, options.ignored) == (
        False,
        False,
        (),
        (),
    )
    checks = options.checks
    assert checks.question == b"\x00\x00\x02\x00\x01"  # . IN NS
    domain = ForwardOptions(health_domain=("example", "org"), health_recursion=False).checks
    assert domain.question == b"\x07example\x03org\x00\x00\x02\x00\x01"
    assert not domain.recursion
