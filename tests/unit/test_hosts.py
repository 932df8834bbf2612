"""CoreDNS's `hosts`: its own test tables (plugin/hosts/setup_test.go, hosts_test.go,
hostsfile_test.go and wildcard_test.go at the commit docs/coredns-compatibility.md names), as
data, through the Corefile reader and the handler; then what toposdns bounds and reloads."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import dnslib
import pytest

from tests.helpers import config_of, snapshot_of
from tests.objects import SHOP_WEB
from toposdns.config import ServeConfig
from toposdns.corefile import read_corefile
from toposdns.metrics import ANSWERING
from toposdns.options import ConfigError
from toposdns.serve import hosts as hosts_module
from toposdns.serve.blocks import BlockConfig, block_chain, block_forwarder
from toposdns.serve.chain import Request
from toposdns.serve.forward import ForwardOptions, Upstream
from toposdns.serve.hosts import (
    MAX_RECORDS,
    Hosts,
    HostsOptions,
    Inline,
    make_hosts,
    parse,
    read_hosts,
    reverse_zones,
)
from toposdns.serve.responder import UDP4, Responder
from toposdns.server import DnsServer
from toposdns.wire.decode import decode_query

#: What the next plugin gives in these tests (CoreDNS's tests use `test.NextHandler`).
NEXT = b"next"
ROOT = ((),)


def read(tmp_path: Path, hosts: str) -> ServeConfig:
    corefile = tmp_path / "Corefile"
    corefile.write_text(f".:53 {{\n    kubernetes cluster.local\n    {hosts}\n}}\n")
    return read_corefile(corefile).done()


def labels(*zones: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(zone.rstrip(".").split(".")) if zone != "." else () for zone in zones)


# ----- setup_test.go TestHostsParse: the Corefile text -> the file, the zones (none: the server
# block's) and the fallthrough zones; or an error.
SETUP = [
    ("hosts\n", "/etc/hosts", (), ()),
    ("hosts /tmp", "/tmp", (), ()),
    ("hosts /etc/hosts miek.nl.", "/etc/hosts", labels("miek.nl."), ()),
    (
        "hosts /etc/hosts miek.nl. pun.gent.",
        "/etc/hosts",
        labels("miek.nl.", "pun.gent."),
        (),
    ),
    ("hosts {\n fallthrough\n }", "/etc/hosts", (), ROOT),
    ("hosts /tmp {\n fallthrough\n }", "/tmp", (), ROOT),
    ("hosts /etc/hosts miek.nl. {\n fallthrough\n }", "/etc/hosts", labels("miek.nl."), ROOT),
    (
        "hosts /etc/hosts miek.nl 10.0.0.9/8 {\n fallthrough\n }",
        "/etc/hosts",
        labels("miek.nl.", "10.in-addr.arpa."),
        ROOT,
    ),
]


@pytest.mark.parametrize(("text", "path", "zones", "fallthrough"), SETUP)
def test_setup(
    tmp_path: Path,
    text: str,
    path: str,
    zones: tuple[tuple[str, ...], ...],
    fallthrough: tuple[tuple[str, ...], ...],
) -> None:
    options = read(tmp_path, text).hosts
    assert options.enabled
    assert (options.path, options.zones, options.fallthrough) == (Path(path), zones, fallthrough)


def test_setup_hosts_twice_in_a_block_is_refused(tmp_path: Path) -> None:
    twice = "hosts /etc/hosts {\n fallthrough\n }\n hosts /etc/hosts {\n fallthrough\n }"
    with pytest.raises(ConfigError, match=r"Corefile:6: hosts: given twice .*line 3"):
        read(tmp_path, twice)


# ----- setup_test.go TestHostsInlineParse: the inline entries' PTR names, the fallthrough
# zones; an entry after `fallthrough` is refused.
INLINE_SETUP = [
    (
        "hosts highly_unlikely_to_exist_hosts_file example.org {\n"
        "    10.0.0.1 example.org\n    fallthrough\n}",
        {"10.0.0.1": ["example.org"]},
        ROOT,
    ),
    (
        "hosts highly_unlikely_to_exist_hosts_file example.org {\n    10.0.0.1 example.org\n}",
        {"10.0.0.1": ["example.org"]},
        (),
    ),
]


@pytest.mark.parametrize(("text", "names", "fallthrough"), INLINE_SETUP)
def test_setup_inline(
    tmp_path: Path,
    text: str,
    names: dict[str, list[str]],
    fallthrough: tuple[tuple[str, ...], ...],
) -> None:
    options = read(tmp_path, text).hosts
    assert options.fallthrough == fallthrough
    hosts = make_hosts(options, ROOT)
    assert hosts is not None and hosts.inline.names == names


def test_setup_inline_after_fallthrough_is_refused(tmp_path: Path) -> None:
    text = (
        "hosts highly_unlikely_to_exist_hosts_file example.org {\n"
        "    fallthrough\n    10.0.0.1 example.org\n}"
    )
    with pytest.raises(ConfigError) as error:
        read(tmp_path, text)
    assert str(error.value) == (
        f"{tmp_path}/Corefile:5: hosts 10.0.0.1 example.org: unknown property '10.0.0.1': "
        "write the entries before fallthrough, as CoreDNS requires"
    )


# ----- setup_test.go TestHostsParseFallthroughUnsupported
UNSUPPORTED_SETUP = [
    ("hosts {\n fallthrough\n fallthrough_unsupported\n}", ""),
    ("hosts {\n fallthrough_unsupported\n fallthrough example.org\n}", ""),
    ("hosts {\n fallthrough_unsupported\n}", "fallthrough_unsupported requires fallthrough"),
    (
        "hosts {\n fallthrough\n fallthrough_unsupported example.org\n}",
        "fallthrough_unsupported example.org: takes no value",
    ),
]


@pytest.mark.parametrize(("text", "error"), UNSUPPORTED_SETUP)
def test_setup_fallthrough_unsupported(tmp_path: Path, text: str, error: str) -> None:
    if error:
        with pytest.raises(ConfigError, match=error):
            read(tmp_path, text)
    else:
        assert read(tmp_path, text).hosts.fallthrough_unsupported


# ----- toposdns's own checks of the Corefile: the rest of each option, with file:line.
REFUSED = [
    ("hosts {\n ttl\n}", "Corefile:4: ttl: expected one value, e.g. 60"),
    ("hosts {\n ttl 0\n}", "Corefile:4: ttl 0: must be between 1 and 65535"),
    ("hosts {\n ttl 65536\n}", "Corefile:4: ttl 65536: must be between 1 and 65535"),
    ("hosts {\n ttl soon\n}", "Corefile:4: ttl soon: expected a whole number, e.g. 60"),
    ("hosts {\n reload\n}", "Corefile:4: reload: expected one duration"),
    ("hosts {\n reload -5s\n}", "Corefile:4: reload -5s: must not be negative"),
    ("hosts {\n reload soon\n}", "Corefile:4: reload soon: expected a duration"),
    ("hosts {\n no_reverse please\n}", "Corefile:4: no_reverse please: takes no value"),
    ("hosts /etc/hosts a..b", "Corefile:3: hosts /etc/hosts a..b: 'a..b' is not a domain"),
    ("hosts /etc/hosts 10.0.0.0/33", "'10.0.0.0/33' is neither a zone nor a CIDR"),
    ("hosts /etc/hosts/nested", "Corefile:3: hosts: unable to access hosts file"),
    ('hosts {\n "10.0.0.1" a\n}', "Corefile:4: 10.0.0.1: not an option of hosts"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused_with_file_line_and_word(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        read(tmp_path, text)


def test_options_as_written(tmp_path: Path) -> None:
    text = (
        "hosts /etc/coredns/NodeHosts dns://example.org:53 fd00::/7 {\n"
        "    192.0.2.1 a.example.org\n    ttl 60\n    reload 2h45m\n    no_reverse\n"
        "    fallthrough 10.0.0.0/9\n}"
    )
    options = read(tmp_path, text).hosts
    assert options == HostsOptions(
        enabled=True,
        path=Path("/etc/coredns/NodeHosts"),
        zones=labels("example.org", "c.f.ip6.arpa", "d.f.ip6.arpa"),
        inline=(Inline("192.0.2.1 a.example.org", f"{tmp_path}/Corefile:4"),),
        ttl=60,
        reload=9900.0,
        reverse=False,
        fallthrough=labels(*(f"{n}.10.in-addr.arpa" for n in range(128))),
    )
    assert read(tmp_path, "hosts {\n reload 0\n}").hosts.reload == 0


def test_a_block_without_kubernetes_takes_hosts(tmp_path: Path) -> None:
    corefile = tmp_path / "Corefile"
    corefile.write_text(
        ".:53 {\n  kubernetes cluster.local\n}\n"
        "example.org {\n  hosts {\n    192.0.2.7 web.example.org\n    fallthrough\n  }\n"
        "  forward . 127.0.0.1:5399\n}\n"
    )
    config = read_corefile(corefile).done()
    assert not config.hosts.enabled
    (block,) = config.blocks
    assert block.hosts.enabled and block.hosts.fallthrough == ROOT


@pytest.mark.parametrize(
    ("cidr", "zones"),
    [
        # cidr_test.go's reverse zones
        ("10.0.0.0/8", ["10.in-addr.arpa"]),
        ("10.0.0.0/16", ["0.10.in-addr.arpa"]),
        ("10.0.0.0/15", ["0.10.in-addr.arpa", "1.10.in-addr.arpa"]),
        ("10.0.0.0/24", ["0.0.10.in-addr.arpa"]),
        ("0.0.0.0/0", ["in-addr.arpa"]),
        ("fd00::/7", ["d.f.ip6.arpa", "c.f.ip6.arpa"]),
        ("::/0", ["ip6.arpa"]),
    ],
)
def test_a_cidr_stands_for_its_reverse_zones(cidr: str, zones: list[str]) -> None:
    import ipaddress

    found = reverse_zones(ipaddress.ip_network(cidr, strict=False))
    assert sorted(found) == sorted(labels(*zones))


# ----- the handler: a query in, the reply (or NEXT) out.


def hosts_of(
    tmp_path: Path,
    text: str,
    *,
    zones: tuple[tuple[str, ...], ...] = ROOT,
    fallthrough: tuple[tuple[str, ...], ...] = (),
    unsupported: bool = False,
    reverse: bool = True,
    inline: Sequence[str] = (),
    ttl: int = 3600,
) -> Hosts:
    path = tmp_path / "hosts"
    path.write_text(text)
    options = HostsOptions(
        enabled=True,
        path=path,
        inline=tuple(Inline(line, f"Corefile:{n}") for n, line in enumerate(inline, 1)),
        ttl=ttl,
        reverse=reverse,
        fallthrough=fallthrough,
        fallthrough_unsupported=unsupported,
    )
    hosts = make_hosts(options, zones)
    assert hosts is not None
    return hosts


def ask(hosts: Hosts, name: str, qtype: str = "A", edns: bool = False) -> dnslib.DNSRecord | bytes:
    query = dnslib.DNSRecord.question(name, qtype)
    if edns:
        query.add_ar(dnslib.EDNS0(udp_len=1232, opts=[dnslib.EDNSOption(10, b"cookie!!")]))
    data = bytes(query.pack())
    reply = hosts.serve(Request(decode_query(data), data, UDP4, "127.0.0.1"), lambda _: NEXT)
    assert isinstance(reply, bytes)
    return reply if reply == NEXT else dnslib.DNSRecord.parse(reply)


def texts(reply: dnslib.DNSRecord) -> list[str]:
    return sorted(" ".join(str(rr).split()) for rr in reply.rr)


def replied(hosts: Hosts, name: str, qtype: str = "A") -> dnslib.DNSRecord:
    """The handler's own reply (not passed on)."""
    reply = ask(hosts, name, qtype)
    assert isinstance(reply, dnslib.DNSRecord), f"{name} {qtype} passed on"
    return reply


def rdata(hosts: Hosts, name: str, qtype: str = "A") -> list[str]:
    """The rdata of the handler's answer, in order."""
    return [str(rr.rdata) for rr in replied(hosts, name, qtype).rr]


# hosts_test.go's hostsExample and TestLookupA's cases: (name, type, rcode, answer), with
# fallthrough (fall.Root) for fallthrough-example.org only, as there.
HOSTS_EXAMPLE = """
127.0.0.1 localhost localhost.domain
::1 localhost localhost.domain
10.0.0.1 example.org
::FFFF:10.0.0.2 example.com
10.0.0.3 fallthrough-example.org
1.2.3.4 aa.example.com
5.6.7.8 *.apps.example.com
reload 5s
timeout 3600
"""
LOOKUP_A = [
    ("example.org.", "A", "NOERROR", ["example.org. 3600 IN A 10.0.0.1"]),
    ("example.com.", "A", "NOERROR", ["example.com. 3600 IN A 10.0.0.2"]),
    ("localhost.", "AAAA", "NOERROR", ["localhost. 3600 IN AAAA ::1"]),
    (
        "1.0.0.10.in-addr.arpa.",
        "PTR",
        "NOERROR",
        ["1.0.0.10.in-addr.arpa. 3600 IN PTR example.org."],
    ),
    (
        "2.0.0.10.in-addr.arpa.",
        "PTR",
        "NOERROR",
        ["2.0.0.10.in-addr.arpa. 3600 IN PTR example.com."],
    ),
    (
        "1.0.0.127.in-addr.arpa.",
        "PTR",
        "NOERROR",
        [
            "1.0.0.127.in-addr.arpa. 3600 IN PTR localhost.",
            "1.0.0.127.in-addr.arpa. 3600 IN PTR localhost.domain.",
        ],
    ),
    ("example.org.", "AAAA", "NOERROR", []),
    ("example.org.", "MX", "NOERROR", []),
    ("fallthrough-example.org.", "AAAA", "NOERROR", []),
    # CoreDNS's table lists 5.6.7.8 here, but its check is skipped when the handler writes no
    # reply, as here: `*.apps.example.com` holds the names below apps.example.com, not itself,
    # so the name has no entry and, without fallthrough, gets SERVFAIL.
    ("apps.example.com.", "A", "SERVFAIL", []),
    ("aa.example.com.", "A", "NOERROR", ["aa.example.com. 3600 IN A 1.2.3.4"]),
]


@pytest.mark.parametrize(("name", "qtype", "rcode", "answer"), LOOKUP_A)
def test_lookup(tmp_path: Path, name: str, qtype: str, rcode: str, answer: list[str]) -> None:
    fall = ROOT if name == "fallthrough-example.org." else ()
    reply = ask(hosts_of(tmp_path, HOSTS_EXAMPLE, fallthrough=fall), name, qtype)
    assert isinstance(reply, dnslib.DNSRecord)
    assert dnslib.RCODE.get(reply.header.rcode) == rcode
    assert texts(reply) == sorted(answer)
    assert reply.header.aa == (rcode == "NOERROR")  # m.Authoritative; SERVFAIL comes bare


# hosts_test.go TestFallthroughUnsupportedType: a TXT question, (name, fallthrough zones,
# fallthrough_unsupported, passed on?); else authoritative NODATA.
UNSUPPORTED = [
    ("example.org.", ROOT, False, False),
    ("example.org.", ROOT, True, True),
    ("example.org.", labels("example.net."), True, False),
    ("missing.example.org.", ROOT, False, True),
]


@pytest.mark.parametrize(("name", "fall", "unsupported", "passed"), UNSUPPORTED)
def test_fallthrough_unsupported_type(
    tmp_path: Path,
    name: str,
    fall: tuple[tuple[str, ...], ...],
    unsupported: bool,
    passed: bool,
) -> None:
    hosts = hosts_of(tmp_path, HOSTS_EXAMPLE, fallthrough=fall, unsupported=unsupported)
    reply = ask(hosts, name, "TXT")
    if passed:
        assert reply == NEXT
    else:
        assert isinstance(reply, dnslib.DNSRecord)
        assert reply.header.rcode == 0 and reply.header.aa and not reply.rr


# hostsfile_test.go's files and TestLookupStaticHost: (name, IPv4, IPv6), each asked as
# written, lower and upper case.
HOSTS = """255.255.255.255	broadcasthost
	127.0.0.2	odin
	127.0.0.3	odin  # inline comment
	::2             odin
	127.1.1.1	thor
	# aliases
	127.1.1.2	ullr ullrhost
	fe80::1%lo0	localhost
	# Bogus entries that must be ignored.
	123.123.123	loki
	321.321.321.321"""
SINGLE_LINE = "127.0.0.2  odin"
IPV4 = """# See https://tools.ietf.org/html/rfc1123.
	#

	# internet address and host name
	127.0.0.1	localhost	# inline comment separated by tab
	127.0.0.2	localhost       # inline comment separated by space

	# internet address, host name and aliases
	127.0.0.3	localhost	localhost.localdomain"""
IPV6 = """# See https://tools.ietf.org/html/rfc5952, https://tools.ietf.org/html/rfc4007.

	# internet address and host name
	::1						localhost	# inline comment separated by tab
	fe80:0000:0000:0000:0000:0000:0000:0001		localhost       # inline comment separated by space

	# internet address with zone identifier and host name
	fe80:0000:0000:0000:0000:0000:0000:0002%lo0	localhost

	# internet address, host name and aliases
	fe80::3%lo0					localhost	localhost.localdomain"""
CASE = """127.0.0.1	PreserveMe	PreserveMe.local
		::1		PreserveMe	PreserveMe.local"""
WILDCARD = """
127.0.0.53 *.example.org
127.0.1.52 *.intern.example.org
127.0.0.54 foo.example.org
192.168.33.10 *.example.com
192.168.33.11 a.example.com
192.168.33.12 b.example.com
"""
STATIC_HOST = [
    (HOSTS, "odin.", ["127.0.0.2", "127.0.0.3"], ["::2"]),
    (HOSTS, "thor.", ["127.1.1.1"], []),
    (HOSTS, "ullr.", ["127.1.1.2"], []),
    (HOSTS, "ullrhost.", ["127.1.1.2"], []),
    (HOSTS, "localhost.", [], ["fe80::1"]),
    (SINGLE_LINE, "odin.", ["127.0.0.2"], []),
    (IPV4, "localhost.", ["127.0.0.1", "127.0.0.2", "127.0.0.3"], []),
    (IPV4, "localhost.localdomain.", ["127.0.0.3"], []),
    (IPV6, "localhost.", [], ["::1", "fe80::1", "fe80::2", "fe80::3"]),
    (IPV6, "localhost.localdomain.", [], ["fe80::3"]),
    (CASE, "PreserveMe.", ["127.0.0.1"], ["::1"]),
    (CASE, "PreserveMe.local.", ["127.0.0.1"], ["::1"]),
    # wildcard_test.go TestLookupWildcardHost
    (WILDCARD, "foo.example.org.", ["127.0.0.54"], []),
    (WILDCARD, "bar.example.org.", ["127.0.0.53"], []),
    (WILDCARD, "bar.intern.example.org.", ["127.0.1.52"], []),
    (WILDCARD, "a.example.com.", ["192.168.33.11"], []),
    (WILDCARD, "b.example.com.", ["192.168.33.12"], []),
    (WILDCARD, "c.example.com.", ["192.168.33.10"], []),
    (WILDCARD, "example.com.", [], []),
    (WILDCARD, "deep.foo.example.org.", [], []),
    # wildcard_test.go TestReplaceWithAsteriskLabel: the wildcard a name falls under
    ("192.0.2.1 *.com", "example.com.", ["192.0.2.1"], []),
    ("192.0.2.1 *.intern.example.com", "bar.intern.example.com.", ["192.0.2.1"], []),
    ("192.0.2.1 *", ".", [], []),
]


@pytest.mark.parametrize(("text", "name", "v4", "v6"), STATIC_HOST)
def test_lookup_static_host(
    tmp_path: Path, text: str, name: str, v4: list[str], v6: list[str]
) -> None:
    hosts = hosts_of(tmp_path, text)
    for asked in {name, name.lower(), name.upper()}:
        for qtype, wanted in (("A", v4), ("AAAA", v6)):
            reply = ask(hosts, asked, qtype)
            assert isinstance(reply, dnslib.DNSRecord)
            if not v4 and not v6:  # no entry, no fallthrough
                assert dnslib.RCODE.get(reply.header.rcode) == "SERVFAIL"
                continue
            assert reply.header.rcode == 0 and reply.header.aa  # an answer, or NODATA
            assert [str(rr.rdata) for rr in reply.rr] == wanted
            # The owner is the name in lower case, as CoreDNS's `state.Name()`.
            assert {str(rr.rname) for rr in reply.rr} <= {name.lower()}


# hostsfile_test.go TestLookupStaticAddr: (address, the names of its PTR answer)
STATIC_ADDR = [
    (HOSTS, "255.255.255.255", ["broadcasthost."]),
    (HOSTS, "127.0.0.2", ["odin."]),
    (HOSTS, "127.0.0.3", ["odin."]),
    (HOSTS, "::2", ["odin."]),
    (HOSTS, "127.1.1.1", ["thor."]),
    (HOSTS, "127.1.1.2", ["ullr.", "ullrhost."]),
    (HOSTS, "fe80::1", ["localhost."]),
    (SINGLE_LINE, "127.0.0.2", ["odin."]),
    (IPV4, "127.0.0.1", ["localhost."]),
    (IPV4, "127.0.0.2", ["localhost."]),
    (IPV4, "127.0.0.3", ["localhost.", "localhost.localdomain."]),
    (IPV6, "::1", ["localhost."]),
    (IPV6, "fe80::1", ["localhost."]),
    (IPV6, "fe80::2", ["localhost."]),
    (IPV6, "fe80::3", ["localhost.", "localhost.localdomain."]),
    (CASE, "127.0.0.1", ["preserveme.", "preserveme.local."]),
    (CASE, "::1", ["preserveme.", "preserveme.local."]),
    # Wildcards give no PTR (README); an address without names goes to the next plugin.
    (WILDCARD, "127.0.0.53", []),
    (WILDCARD, "127.0.0.54", ["foo.example.org."]),
]


@pytest.mark.parametrize(("text", "address", "names"), STATIC_ADDR)
def test_lookup_static_addr(tmp_path: Path, text: str, address: str, names: list[str]) -> None:
    import ipaddress

    reverse = ipaddress.ip_address(address).reverse_pointer
    reply = ask(hosts_of(tmp_path, text), reverse, "PTR")
    if not names:
        assert reply == NEXT
        return
    assert isinstance(reply, dnslib.DNSRecord) and reply.header.aa
    assert [str(rr.rdata) for rr in reply.rr] == names  # in the file's order


# Left out: TestHostCacheModification (Go slices shared with callers; nothing here hands its
# lists out) and TestLookupStaticHostReloadRace (Go's data race; a reload here replaces the
# entries in one assignment on the event loop's thread).

# ----- the rest of the rules, read from hosts.go, hostsfile.go and setup.go


def test_names_outside_the_zones(tmp_path: Path) -> None:
    text = "10.0.0.1 a.example.org b.example.net\n"
    hosts = hosts_of(tmp_path, text, zones=labels("example.org"))
    assert rdata(hosts, "a.example.org") == ["10.0.0.1"]
    # A name outside the zones goes on whatever fallthrough says; one in them without entries
    # gets SERVFAIL (no fallthrough), as hosts.go.
    assert ask(hosts, "b.example.net") == NEXT
    assert replied(hosts, "c.example.org").header.rcode == dnslib.RCODE.SERVFAIL
    # An entry outside the zones is not kept at all: no PTR for it either; PTR is answered
    # whatever the zones (10.in-addr.arpa is not among them).
    assert rdata(hosts, "1.0.0.10.in-addr.arpa", "PTR") == ["a.example.org."]
    assert hosts.file.size == 2  # CoreDNS's Len: a.example.org's address and its PTR
    # A PTR question for an address without names, or for a reverse name that stands for none,
    # goes on (never SERVFAIL), fallthrough or not.
    for name in ("2.0.0.10.in-addr.arpa", "0.10.in-addr.arpa", "in-addr.arpa", "x.in-addr.arpa"):
        assert ask(hosts, name, "PTR") == NEXT


def test_fallthrough_zones(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, "10.0.0.1 a.example.org\n", fallthrough=labels("in-addr.arpa"))
    assert ask(hosts, "b.example.org") != NEXT  # SERVFAIL: not a fallthrough zone
    assert ask(hosts, "5.0.0.10.in-addr.arpa") == NEXT  # an A question in one
    hosts = hosts_of(tmp_path, "10.0.0.1 a.example.org\n", fallthrough=ROOT)
    assert ask(hosts, "b.example.org") == ask(hosts, "b.example.org", "MX") == NEXT
    # A name with entries is answered, NODATA included, fallthrough or not.
    assert replied(hosts, "a.example.org", "AAAA").header.aa


def test_ipv4_mapped_ipv6_is_ipv4_and_its_ip6_arpa_name_too(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, "::ffff:10.0.0.2 mapped\n::10.0.0.3 compatible\n")
    assert texts(replied(hosts, "mapped")) == ["mapped. 3600 IN A 10.0.0.2"]
    assert rdata(hosts, "mapped", "AAAA") == []
    # Go prints an IPv4-mapped address as IPv4, so its ip6.arpa name finds the entry too.
    import ipaddress

    for address in ("10.0.0.2", "::ffff:10.0.0.2"):
        name = ipaddress.ip_address(address).reverse_pointer
        assert rdata(hosts, name, "PTR") == ["mapped."]
    # An IPv4-compatible address (::a.b.c.d) is IPv6.
    assert rdata(hosts, "compatible", "AAAA") == ["::a00:3"]


def test_duplicates_answer_as_often_as_listed_file_then_inline(tmp_path: Path) -> None:
    text = "10.0.0.1 dup\n10.0.0.1 dup\n10.0.0.2 dup\n"
    hosts = hosts_of(tmp_path, text, inline=["10.0.0.9 dup", "10.0.0.1 dup"])
    assert rdata(hosts, "dup") == [
        "10.0.0.1",
        "10.0.0.1",
        "10.0.0.2",
        "10.0.0.9",
        "10.0.0.1",
    ]
    assert rdata(hosts, "1.0.0.10.in-addr.arpa", "PTR") == ["dup."] * 3
    # A wildcard of the inline entries answers a name only the file's wildcard misses.
    hosts = hosts_of(tmp_path, "10.0.0.1 a.example.org\n", inline=["10.0.0.2 *.example.org"])
    assert rdata(hosts, "a.example.org") == ["10.0.0.1", "10.0.0.2"]


def test_ttl_case_and_the_question_kept(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, "10.0.0.1 Web.Example.org\n", ttl=60)
    reply = ask(hosts, "WEB.example.ORG")
    assert isinstance(reply, dnslib.DNSRecord)
    assert str(reply.q.qname) == "WEB.example.ORG."
    assert texts(reply) == ["web.example.org. 60 IN A 10.0.0.1"]
    ptr = replied(hosts, "1.0.0.10.IN-ADDR.ARPA", "PTR")
    assert texts(ptr) == ["1.0.0.10.in-addr.arpa. 60 IN PTR web.example.org."]


def test_no_reverse(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, "10.0.0.1 a\n", reverse=False)
    assert ask(hosts, "1.0.0.10.in-addr.arpa", "PTR") == NEXT
    assert hosts.file.size == 1
    assert rdata(hosts, "a") == ["10.0.0.1"]


def test_what_a_line_may_hold(tmp_path: Path) -> None:
    text = (
        "10.0.0.1\n"  # no name
        "010.0.0.1 leading-zero\n"  # Go's ParseIP refuses leading zeros
        "fe80::1%eth0 zoned\r\n"  # a zone dropped; a CRLF line
        "10.0.0.2 ok a..b bad'quote (paren) naïve " + "x" * 64 + ".long ok2.\n"
        "10.0.0.3 " + "y" * (64 << 10) + "\n"  # longer than bufio.Scanner reads
    )
    hosts = hosts_of(tmp_path, text)
    assert rdata(hosts, "zoned", "AAAA") == ["fe80::1"]
    assert rdata(hosts, "ok") == rdata(hosts, "ok2") == ["10.0.0.2"]
    assert sorted(hosts.file.v4) == ["ok", "ok2"] and sorted(hosts.file.v6) == ["zoned"]


def test_an_answer_is_bounded_before_it_is_encoded(tmp_path: Path) -> None:
    text = "".join(f"10.0.{n >> 8}.{n & 255} many\n" for n in range(MAX_RECORDS + 10))
    hosts = hosts_of(tmp_path, text)
    assert len(hosts.addresses("many", None, False)) == MAX_RECORDS
    reply = ask(hosts, "many", edns=True)
    assert isinstance(reply, dnslib.DNSRecord) and reply.header.tc  # cut to the UDP buffer


def test_an_inline_line_that_is_no_entry_is_logged_with_its_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "toposdns"):
        hosts = hosts_of(tmp_path, "", inline=["10.0.0.1 a", "reloadd 5s"])
    assert hosts.inline.size == 2
    assert "Corefile:2: hosts: 'reloadd 5s' is neither an option nor an entry" in caplog.text


def test_parse_bounds_the_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hosts_module, "MAX_ENTRIES", 3)
    parsed = parse([b"10.0.0.1 a b", b"10.0.0.2 c d", b"10.0.0.3 e"], frozenset(ROOT), True)
    assert parsed.cut == 2 and sorted(parsed.entries.v4) == ["a", "b", "c"]


# ----- the file: read when it changes, bounded, faults logged once


def test_reload_reads_a_changed_file_and_keeps_the_last_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hosts = hosts_of(tmp_path, "10.0.0.1 a\n", inline=["10.0.0.9 inline"])
    path = hosts.path
    changes: list[str] = []
    hosts.on_change = lambda: changes.append("changed")

    async def run() -> None:
        assert not await hosts.reload()  # unchanged: not read again
        path.write_text("10.0.0.1 a\n10.0.0.2 b\n")
        assert await hosts.reload()
        assert changes == ["changed"] and rdata(hosts, "b") == ["10.0.0.2"]
        os.utime(path, ns=(1, 1))  # touched, the same entries: read, nothing changed
        assert not await hosts.reload()
        with caplog.at_level(logging.WARNING, "toposdns"):
            path.unlink()
            assert not await hosts.reload()
            assert not await hosts.reload()
        # Gone: the entries read before stay, and so do the inline ones; logged once.
        assert rdata(hosts, "b") == ["10.0.0.2"] and rdata(hosts, "inline") == ["10.0.0.9"]
        assert caplog.text.count("cannot read it (No such file or directory)") == 1
        assert "serving the 4 entries read from it before and the Corefile's" in caplog.text
        os.mkfifo(path)
        assert not await hosts.reload()  # opened without blocking, and refused
        assert "not a regular file" in caplog.text
        path.unlink()
        path.write_bytes(b"#" * (hosts_module.MAX_FILE_BYTES + 1))
        assert not await hosts.reload()
        assert "larger than 4 MiB: not read" in caplog.text
        path.write_text("10.0.0.3 c\n")
        assert await hosts.reload()
        assert replied(hosts, "b").header.rcode == dnslib.RCODE.SERVFAIL
        assert rdata(hosts, "c") == ["10.0.0.3"]
        assert changes == ["changed"] * 2

    asyncio.run(run())


def test_watch_reads_again_every_reload(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, "10.0.0.1 a\n")
    hosts.options = replace(hosts.options, reload=0.05)  # below MIN_RELOAD: 0.1 s

    async def run() -> None:
        task = asyncio.create_task(hosts.watch())
        hosts.path.write_text("10.0.0.2 b\n10.0.0.3 c\n")  # another size: seen at once
        for _ in range(100):
            await asyncio.sleep(0.05)
            if "b" in hosts.file.v4:
                break
        task.cancel()
        assert "b" in hosts.file.v4
        hosts.options = replace(hosts.options, reload=0)
        await asyncio.wait_for(hosts.watch(), 1)  # reload 0: the file is read once only

    asyncio.run(run())


def test_read_hosts_of_what_is_not_a_file(tmp_path: Path) -> None:
    assert read_hosts(tmp_path, None, frozenset(ROOT), True).problem == "not a regular file"
    missing = read_hosts(tmp_path / "nothere", None, frozenset(ROOT), True)
    assert missing.problem == "cannot read it (No such file or directory)"


def test_metrics(tmp_path: Path) -> None:
    hosts = hosts_of(tmp_path, "10.0.0.1 a b\n", inline=["10.0.0.2 c"])
    path = str(hosts.path)
    assert ANSWERING.get_sample_value("coredns_hosts_entries", {"hostsfile": path}) == 6
    mtime = hosts.path.stat().st_mtime_ns / 1e9
    assert ANSWERING.get_sample_value("coredns_hosts_reload_timestamp_seconds") == mtime
    hosts.forget()
    assert ANSWERING.get_sample_value("coredns_hosts_entries", {"hostsfile": path}) is None


# ----- in the server: the kubernetes block's front, a block's chain


def front_of(tmp_path: Path) -> Responder:
    """A kubernetes block without an upstream, with `hosts` before it."""
    hosts = hosts_of(tmp_path, "192.0.2.1 node1\n", fallthrough=ROOT)
    return Responder(config_of(), snapshot_of(SHOP_WEB), plugins=[hosts])


def respond(responder: Responder, query: dnslib.DNSRecord) -> dnslib.DNSRecord:
    reply = responder.respond(bytes(query.pack()), UDP4, "127.0.0.1")
    assert isinstance(reply, bytes)
    return dnslib.DNSRecord.parse(reply)


def test_the_kubernetes_block_echoes_the_cookie_on_what_hosts_answers(tmp_path: Path) -> None:
    responder = front_of(tmp_path)
    for name, answer in (("node1", "192.0.2.1"), ("web.shop.svc.cluster.local", "10.96.0.5")):
        query = dnslib.DNSRecord.question(name, "A")
        query.add_ar(dnslib.EDNS0(udp_len=1232, opts=[dnslib.EDNSOption(10, b"cookie!!")]))
        reply = respond(responder, query)
        assert [str(rr.rdata) for rr in reply.rr] == [answer]
        assert [opt.data for rr in reply.ar for opt in rr.rdata] == [b"cookie!!"]


def test_without_an_upstream_hosts_still_answers_outside_the_kubernetes_zones(
    tmp_path: Path,
) -> None:
    # CoreDNS's hosts answers before kubernetes passes the name on; a name neither has is
    # REFUSED, as before.
    responder = front_of(tmp_path)
    assert responder.forwarder is None
    extra = dnslib.RR("x", dnslib.QTYPE.A, rdata=dnslib.A("192.0.2.9"))
    for plain in (True, False):  # the plain path, and the decoder's (a record after the question)
        query = dnslib.DNSRecord.question("node1", "A")
        other = dnslib.DNSRecord.question("example.org", "A")
        if not plain:
            query.add_ar(extra)
            other.add_ar(extra)
        assert [str(rr.rdata) for rr in respond(responder, query).rr] == ["192.0.2.1"]
        assert respond(responder, other).header.rcode == dnslib.RCODE.REFUSED


def test_a_file_that_changes_drops_the_replies_the_server_cached(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("192.0.2.1 node1\n")
    hosts = HostsOptions(enabled=True, path=tmp_path / "hosts", fallthrough=ROOT)
    config = replace(
        ServeConfig(), hosts=hosts, forward=replace(ServeConfig().forward, upstreams=())
    )
    server = DnsServer(config, config_of(), snapshot_of(SHOP_WEB))
    name = "web.shop.svc.cluster.local"

    def answer() -> list[str]:
        data = bytes(dnslib.DNSRecord.question(name, "A").pack())
        reply = server.responder.respond(data, UDP4, "127.0.0.1")
        assert isinstance(reply, bytes)
        return [str(rr.rdata) for rr in dnslib.DNSRecord.parse(reply).rr]

    assert answer() == ["10.96.0.5"] and len(server.responder.cache.table) == 1
    (tmp_path / "hosts").write_text(f"192.0.2.1 node1\n192.0.2.99 {name}\n")
    (front,) = [handler for handler in server.front_handlers if handler.name == "hosts"]
    assert isinstance(front, Hosts) and asyncio.run(front.reload())
    assert answer() == ["192.0.2.99"]


def test_a_blocks_chain_runs_hosts_before_forward(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("192.0.2.7 web.example.org\n")
    options = HostsOptions(enabled=True, path=tmp_path / "hosts", fallthrough=ROOT)
    upstreams = ForwardOptions(upstreams=(Upstream("127.0.0.1", 1),))
    config = BlockConfig(labels("example.org"), forward=upstreams, hosts=options)
    forwarder = block_forwarder(config, 1 << 20)
    assert forwarder is not None
    _, handlers = block_chain(config, forwarder)
    assert [handler.name for handler in handlers] == ["hosts", "forward"]
    link, handlers = block_chain(replace(config, forward=ForwardOptions(upstreams=())), None)
    assert [handler.name for handler in handlers] == ["hosts"]
    data = bytes(dnslib.DNSRecord.question("web.example.org", "A").pack())
    reply = link(Request(decode_query(data), data, UDP4, "127.0.0.1"))
    assert isinstance(reply, bytes) and dnslib.DNSRecord.parse(reply).rr
    # Without forward, a name hosts passes on gets SERVFAIL at the chain's end.
    data = bytes(dnslib.DNSRecord.question("other.example.org", "A").pack())
    reply = link(Request(decode_query(data), data, UDP4, "127.0.0.1"))
    assert isinstance(reply, bytes) and dnslib.DNSRecord.parse(reply).header.rcode == 2


def test_a_reloaded_corefile_replaces_the_hosts_handler(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("192.0.2.1 node1\n")
    (tmp_path / "b").write_text("192.0.2.2 node1\n192.0.2.3 node2\n")
    hosts = HostsOptions(enabled=True, path=tmp_path / "a", fallthrough=ROOT)
    config = replace(
        ServeConfig(), hosts=hosts, forward=replace(ServeConfig().forward, upstreams=())
    )
    server = DnsServer(config, config_of(), snapshot_of(SHOP_WEB))
    (before,) = [handler for handler in server.front_handlers if handler.name == "hosts"]
    server.reconfigure(replace(config, kubernetes=config_of(ttl=7)))  # hosts as it was: kept
    assert before in server.front_handlers
    server.reconfigure(replace(config, hosts=replace(hosts, path=tmp_path / "b")))
    (after,) = [handler for handler in server.front_handlers if handler.name == "hosts"]
    assert after is not before
    data = bytes(dnslib.DNSRecord.question("node1", "A").pack())
    reply = server.responder.respond(data, UDP4, "127.0.0.1")
    assert isinstance(reply, bytes)
    assert [str(rr.rdata) for rr in dnslib.DNSRecord.parse(reply).rr] == ["192.0.2.2"]
    gauge = "coredns_hosts_entries"
    assert ANSWERING.get_sample_value(gauge, {"hostsfile": str(tmp_path / "a")}) is None
    assert ANSWERING.get_sample_value(gauge, {"hostsfile": str(tmp_path / "b")}) == 4


def test_without_zones_hosts_takes_the_server_blocks(tmp_path: Path) -> None:
    corefile = tmp_path / "Corefile"
    corefile.write_text(
        "cluster.local:53 {\n  kubernetes\n  hosts nothere {\n"
        "    10.0.0.1 node.cluster.local\n    10.0.0.2 node.example.org\n  }\n}\n"
    )
    config = read_corefile(corefile).done()
    server = DnsServer(config, config.kubernetes, snapshot_of(SHOP_WEB))
    (front,) = [handler for handler in server.front_handlers if handler.name == "hosts"]
    assert isinstance(front, Hosts) and front.zones == frozenset(labels("cluster.local"))
    assert sorted(front.inline.v4) == ["node.cluster.local"]
