"""The CoreDNS stand-in (tests/coredns_forwarder.py) against CoreDNS's documented behaviour.

`rewrite edns0 subnet`: the first table is TestRewriteEDNS0Subnet of CoreDNS's
plugin/rewrite/rewrite_test.go, as data (its test writers ask from 10.240.0.1 and
fe80::42:ff:feca:4c65); the second holds the actions on a query that already carries options,
as plugin/rewrite/README.md describes them (`set` adds or replaces, `append` adds only when
there is none, `replace` only replaces, `unset` removes). `cache`: its key and how long it keeps
a reply, as plugin/cache/README.md describes them.
"""

from __future__ import annotations

import dns.edns
import dns.flags
import dns.message
import dns.rcode
import dns.rrset
import pytest

from tests.coredns_forwarder import CacheRules, CorefileForwarder, SubnetRewrite, corefile_block
from tests.upstream import StubUpstream

V4_CLIENT = "10.240.0.1"
V6_CLIENT = "fe80::42:ff:feca:4c65"


def subnets(query: dns.message.Message) -> list[tuple[int, int, str]]:
    """(source prefix, scope, address) of each Client Subnet option, in order."""
    return [
        (o.srclen, o.scopelen, o.address)
        for o in query.options
        if isinstance(o, dns.edns.ECSOption)
    ]


# (client, rule's words after `rewrite edns0`, the option the query then carries)
COREDNS_TABLE = [
    (V4_CLIENT, "subnet set 24 56", (24, 0, "10.240.0.0")),
    (V4_CLIENT, "subnet set 32 56", (32, 0, "10.240.0.1")),
    (V4_CLIENT, "subnet set 0 56", (0, 0, "0.0.0.0")),
    (V6_CLIENT, "subnet set 24 56", (56, 0, "fe80::")),
    (V6_CLIENT, "subnet set 24 128", (128, 0, "fe80::42:ff:feca:4c65")),
    (V6_CLIENT, "subnet set 24 0", (0, 0, "::")),
]


@pytest.mark.parametrize(("client", "rule", "option"), COREDNS_TABLE)
def test_subnet_rules_of_corednss_tests(
    client: str, rule: str, option: tuple[int, int, str]
) -> None:
    query = dns.message.make_query("example.com.", "A")
    SubnetRewrite.parse(["rewrite", "stop", "edns0", *rule.split()]).apply(query, client)
    assert query.edns == 0 and query.payload == 4096  # an OPT record added, as CoreDNS adds it
    assert subnets(query) == [option]


POD = "10.244.1.7"
OWN = (32, 0, POD)
CLAIMED = dns.edns.ECSOption("10.244.3.9", 32)
OTHER = dns.edns.ECSOption("192.0.2.0", 24)
COOKIE = dns.edns.GenericOption(dns.edns.OptionType.COOKIE, b"\x01" * 8)

# (action, the options the pod sent, the Client Subnets that go on)
ACTIONS = [
    ("set", [], [OWN]),
    ("set", [CLAIMED], [OWN]),
    ("set", [CLAIMED, OTHER], [OWN, (24, 0, "192.0.2.0")]),  # only the first is overwritten
    ("append", [], [OWN]),
    ("append", [CLAIMED], [(32, 0, "10.244.3.9")]),  # the pod's own is kept: the forgery
    ("replace", [], []),
    ("replace", [CLAIMED], [OWN]),
    ("unset", [CLAIMED, OTHER], []),
]


@pytest.mark.parametrize(("action", "sent", "after"), ACTIONS)
def test_subnet_actions_on_a_query_with_options(
    action: str, sent: list[dns.edns.Option], after: list[tuple[int, int, str]]
) -> None:
    query = dns.message.make_query("web.shop.svc.cluster.local.", "A", use_edns=0)
    query.use_edns(0, dns.flags.DO, 1232, options=[COOKIE, *sent])
    words = ["rewrite", "edns0", "subnet", action] + ([] if action == "unset" else ["32", "128"])
    SubnetRewrite.parse(words).apply(query, POD)
    assert subnets(query) == after
    assert COOKIE in query.options and query.ednsflags & dns.flags.DO and query.payload == 1232


@pytest.mark.parametrize(
    "words",
    [
        "rewrite edns0 subnet set 33 128",
        "rewrite edns0 subnet set 32 128 revert",
        "rewrite name a b",
    ],
)
def test_rules_it_does_not_play_are_refused(words: str) -> None:
    with pytest.raises(ValueError):
        SubnetRewrite.parse(words.split())


def reply(
    rcode: dns.rcode.Rcode, answer_ttl: int | None, soa_ttl: int | None
) -> dns.message.Message:
    message = dns.message.make_response(dns.message.make_query("web.example.", "A"))
    message.set_rcode(rcode)
    if answer_ttl is not None:
        message.answer.append(dns.rrset.from_text("web.example.", answer_ttl, "IN", "A", "1.2.3.4"))
    if soa_ttl is not None:
        soa = "ns.example. hostmaster.example. 1 7200 1800 86400 30"
        message.authority.append(dns.rrset.from_text("example.", soa_ttl, "IN", "SOA", soa))
    return message


# NodeLocal DNSCache's cluster zone: `success 9984 30`, `denial 9984 5`.
NODELOCAL = CacheRules.parse(["cache"], [["success", "9984", "30"], ["denial", "9984", "5"]])


@pytest.mark.parametrize(
    ("kept", "rcode", "answer_ttl", "soa_ttl"),
    [
        (30, dns.rcode.NOERROR, 300, None),  # capped at the success TTL
        (5, dns.rcode.NOERROR, 1, None),  # raised to the minimum
        (5, dns.rcode.NOERROR, None, 30),  # NODATA: a denial
        (5, dns.rcode.NXDOMAIN, None, 30),
        (0, dns.rcode.NXDOMAIN, None, None),  # no SOA: never
        (0, dns.rcode.NOERROR, None, None),  # NODATA without SOA: never
        (5, dns.rcode.SERVFAIL, None, None),
        (0, dns.rcode.REFUSED, None, None),
    ],
)
def test_how_long_a_reply_is_kept(
    kept: int, rcode: dns.rcode.Rcode, answer_ttl: int | None, soa_ttl: int | None
) -> None:
    assert NODELOCAL.keep_for(reply(rcode, answer_ttl, soa_ttl)) == kept


def test_truncated_replies_are_never_kept() -> None:
    truncated = reply(dns.rcode.NOERROR, 30, None)
    truncated.flags |= dns.flags.TC
    assert NODELOCAL.keep_for(truncated) == 0


def test_the_cache_key_is_the_question_not_the_client_subnet() -> None:
    # One node cache: two pods ask the same name in other letter cases, each with its own
    # subnet; the second is a hit, whatever its subnet says, with the TTL counted down.
    block = corefile_block(
        "cluster.local:53 {\n cache 30\n forward . 10.96.0.10\n}\n", "cluster.local:53"
    )
    upstream = StubUpstream({("web.example", "A"): ["web.example. 300 IN A 1.2.3.4"]})
    upstream.start()
    now = [100.0]
    try:
        with CorefileForwarder(
            block, "127.0.0.1", ("127.0.0.1", upstream.port), lambda: now[0]
        ) as hop:
            ttls = []
            for name, subnet in (("web.example.", "10.1.0.1"), ("WEB.example.", "10.2.0.1")):
                query = dns.message.make_query(name, "A", use_edns=0)
                query.use_edns(0, 0, 1232, options=[dns.edns.ECSOption(subnet, 32)])
                answer = hop.answer(query.to_wire(), "127.0.0.2")
                assert answer is not None
                (rrset,) = dns.message.from_wire(answer).answer
                ttls.append(rrset.ttl)
                now[0] += 10
            assert (hop.forwarded, hop.hits, ttls) == (1, 1, [30, 20])
            now[0] += 10  # 30 s after it was kept: expired
            hop.answer(dns.message.make_query("web.example.", "A").to_wire(), "127.0.0.2")
            assert (hop.forwarded, hop.hits) == (2, 1)
    finally:
        upstream.stop()


def test_directives_it_does_not_play_are_refused() -> None:
    block = corefile_block(
        "cluster.local:53 {\n template IN A x\n forward . 1.2.3.4\n}\n", "cluster.local:53"
    )
    with pytest.raises(ValueError, match="template"):
        CorefileForwarder(block, "127.0.0.1", ("127.0.0.1", 9))
