"""The `forward` block's options at work, against stub upstreams on loopback (tests/upstream.py):
which transport the upstream sees (`force_tcp`, `prefer_udp`), the order upstreams are tried in
(`policy`), an upstream marked down and back (`max_fails`, `health_check`), replies passed on to
the next upstream by their rcode (`failover`), the names not
forwarded (FROM, `except`), TCP and TLS connections reused and closed (`expire`), and DNS over
TLS with its certificate checked (`tls`, `tls_servername`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import dnslib
import pytest

from tests.certificates import Certificates, make_certificates
from tests.upstream import StubUpstream, stub_upstream
from toposdns.metrics import PROXY_CONN_CACHE_HITS, PROXY_CONN_CACHE_MISSES, UPSTREAM_ERRORS
from toposdns.serve import upstream as upstream_module
from toposdns.serve.blocks import Forwarding
from toposdns.serve.chain import Request
from toposdns.serve.forward import Forwarder, ForwardOptions
from toposdns.serve.transport import UDP4
from toposdns.serve.upstream import Upstream, UpstreamError
from toposdns.wire.codes import SERVFAIL
from toposdns.wire.decode import decode_query

RECORDS = {
    ("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"],
    ("big.example.test", "A"): ["big.example.test. 300 IN A 192.0.2.11"],
}


def query(name: str, qid: int = 7) -> bytes:
    record = dnslib.DNSRecord.question(name, "A")
    record.header.id = qid
    return bytes(record.pack())


def plain(stub: StubUpstream, port: int = 0) -> Upstream:
    return Upstream("127.0.0.1", port or stub.port)


def run(
    test: Callable[[Forwarder], Awaitable[None]],
    upstreams: list[Upstream],
    timeout: float = 2.0,
    **options: Any,
) -> None:
    """`test` with a forwarder to `upstreams` by `options` (ForwardOptions fields), closed
    after."""

    async def main() -> None:
        settings = ForwardOptions(upstreams=tuple(upstreams), **options)
        forwarder = Forwarder(upstreams, timeout=timeout, options=settings)
        try:
            await test(forwarder)
        finally:
            await forwarder.close()

    asyncio.run(main())


def counter(metric: Any, *labels: str) -> float:
    value: float = metric.labels(*labels)._value.get()
    return value


# ---- force_tcp / prefer_udp: the transport to the upstream, whatever the client used

TRANSPORTS = [
    ("the client's, UDP", {}, False, ["udp"]),
    ("the client's, TCP", {}, True, ["tcp"]),
    ("prefer_udp for a TCP client", {"prefer_udp": True}, True, ["udp"]),
    ("force_tcp for a UDP client", {"force_tcp": True}, False, ["tcp"]),
    ("force_tcp wins over prefer_udp", {"force_tcp": True, "prefer_udp": True}, False, ["tcp"]),
]


@pytest.mark.parametrize(
    ("options", "client_tcp", "seen"), [c[1:] for c in TRANSPORTS], ids=[c[0] for c in TRANSPORTS]
)
def test_the_transport_to_the_upstream(
    options: dict[str, bool], client_tcp: bool, seen: list[str]
) -> None:
    with stub_upstream(RECORDS) as stub:

        async def test(forwarder: Forwarder) -> None:
            reply = await forwarder.forward(query("www.example.test"), client_tcp, 65535)
            assert isinstance(reply, bytes) and dnslib.DNSRecord.parse(reply).rr

        run(test, [plain(stub)], **options)
        assert [proto for proto, _, _ in stub.queries] == seen


def test_prefer_udp_asks_again_over_tcp_when_truncated() -> None:
    with stub_upstream(RECORDS, "truncate", tcp_mode="answer") as stub:

        async def test(forwarder: Forwarder) -> None:
            reply = await forwarder.forward(query("big.example.test"), True, 65535)
            assert isinstance(reply, bytes) and dnslib.DNSRecord.parse(reply).rr

        run(test, [plain(stub)], prefer_udp=True)
        assert [proto for proto, _, _ in stub.queries] == ["udp", "tcp"]


# ---- policy: the order upstreams are tried in


@contextlib.contextmanager
def three_stubs() -> Iterator[list[StubUpstream]]:
    with stub_upstream(RECORDS) as a, stub_upstream(RECORDS) as b, stub_upstream(RECORDS) as c:
        yield [a, b, c]


def first_asked(stubs: list[StubUpstream], names: list[str]) -> list[int]:
    """For each name, which stub was asked it (each is answered by the first one tried)."""
    return [next(i for i, stub in enumerate(stubs) if name in stub.names()) for name in names]


POLICIES = [
    ("sequential", [0, 0, 0, 0, 0, 0], ()),
    # CoreDNS's roundRobin.List: the count goes up first, so the second upstream leads.
    ("round_robin", [1, 2, 0, 1, 2, 0], ()),
    # The one that is down is left out of each list: [1,0,2] -> 0, [2,0,1] -> 2, [0,1,2] -> 0.
    ("round_robin", [0, 2, 0, 0, 2, 0], (1,)),
    ("sequential", [1, 1, 1, 1, 1, 1], (0,)),
]


@pytest.mark.parametrize(("policy", "expected", "down"), POLICIES)
def test_policy_orders_the_healthy_upstreams(
    policy: str, expected: list[int], down: tuple[int, ...]
) -> None:
    names = [f"n{i}.example.test" for i in range(len(expected))]
    with three_stubs() as stubs:

        async def test(forwarder: Forwarder) -> None:
            for index in down:
                forwarder.upstreams[index].udp.fails = 2
            for name in names:
                assert isinstance(await forwarder.forward(query(name), False, 512), bytes)

        run(test, [plain(stub) for stub in stubs], policy=policy)
        assert first_asked(stubs, names) == expected


def test_random_policy_spreads_the_queries() -> None:
    names = [f"r{i}.example.test" for i in range(30)]
    with three_stubs() as stubs:

        async def test(forwarder: Forwarder) -> None:
            for name in names:
                assert isinstance(await forwarder.forward(query(name), False, 512), bytes)

        run(test, [plain(stub) for stub in stubs])
        # Each upstream leads about a third of the time (none is left out but once in 10^5).
        assert set(first_asked(stubs, names)) == {0, 1, 2}


# ---- failover: CoreDNS's setup_test.go TestFailover and forward_test.go
# TestForwardFailoverStopsAfterAllUpstreams, with `policy sequential`: (name, the stubs' modes
# in order, failover's rcodes, the rcode the client gets, how many times each stub is asked)

FAILOVERS = [
    ("failover set, the third works", ["servfail", "refused", "answer"], {2, 5}, 0, [1, 1, 1]),
    ("failover not set, the first fails", ["servfail", "refused", "answer"], set(), 2, [1, 0, 0]),
    ("failover not set, the first works", ["answer", "servfail", "refused"], set(), 0, [1, 0, 0]),
    ("every upstream fails: the last reply", ["servfail", "servfail"], {2}, 2, [1, 1]),
    ("an rcode failover does not name", ["refused", "answer"], {2}, 5, [1, 0]),
]


@pytest.mark.parametrize(
    ("modes", "failover", "rcode", "asked"),
    [c[1:] for c in FAILOVERS],
    ids=[c[0] for c in FAILOVERS],
)
def test_failover_asks_the_next_upstream_for_the_rcodes_it_names(
    modes: list[str], failover: set[int], rcode: int, asked: list[int]
) -> None:
    with contextlib.ExitStack() as stack:
        stubs = [stack.enter_context(stub_upstream(RECORDS, mode)) for mode in modes]

        async def test(forwarder: Forwarder) -> None:
            reply = await forwarder.forward(query("www.example.test"), False, 512)
            assert isinstance(reply, bytes)
            message = dnslib.DNSRecord.parse(reply)
            assert message.header.rcode == rcode
            assert bool(message.rr) == (rcode == 0)
            # An rcode is an answer: no upstream is marked as failing for it.
            assert all(upstream.udp.fails == 0 for upstream in forwarder.upstreams)

        run(
            test, [plain(stub) for stub in stubs], policy="sequential", failover=frozenset(failover)
        )
        assert [len(stub.names()) for stub in stubs] == asked


# ---- max_fails, health_check


def test_max_fails_is_the_failures_in_a_row_that_mark_an_upstream_down() -> None:
    async def test(forwarder: Forwarder) -> None:
        (upstream,) = forwarder.upstreams
        failure = UpstreamError("timeout", "no reply")
        for _ in range(2):
            upstream.failed(False, failure)
        assert not upstream.udp.down
        upstream.failed(False, failure)
        assert upstream.udp.down and upstream.udp.probe is not None

    run(test, [Upstream("127.0.0.1", 9)], max_fails=3, health_check=60.0)


def test_max_fails_0_never_marks_an_upstream_down_nor_probes_it() -> None:
    async def test(forwarder: Forwarder) -> None:
        (upstream,) = forwarder.upstreams
        for _ in range(10):
            upstream.failed(True, UpstreamError("closed", "closed"))
        assert not upstream.tcp.down and upstream.tcp.probe is None
        assert forwarder.order(tcp=True) == [upstream]

    run(test, [Upstream("127.0.0.1", 9)], max_fails=0)


def test_an_upstream_marked_down_is_probed_as_health_check_says_and_comes_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "toposdns")
    monkeypatch.setattr(upstream_module, "HEALTH_TIMEOUT", 0.2)
    with stub_upstream(RECORDS, "silent") as bad, stub_upstream(RECORDS) as good:

        async def test(forwarder: Forwarder) -> None:
            # The first query finds `bad` silent: one failure marks it down, `good` answers.
            assert isinstance(await forwarder.forward(query("a.example.test"), False, 512), bytes)
            assert forwarder.upstreams[0].udp.down
            await forwarder.forward(query("b.example.test"), False, 512)
            assert "b.example.test" not in bad.names()  # down: not tried
            # Probed every 0.1 s, with `health_check`'s name and without RD (`no_rec`).
            deadline = time.monotonic() + 5
            while sum(q[1:] == ("example.org", "NS") for q in bad.queries) < 2:
                assert time.monotonic() < deadline, bad.queries
                await asyncio.sleep(0.05)
            probes = [i for i, q in enumerate(bad.queries) if q[1:] == ("example.org", "NS")]
            assert not any(bad.recursion[i] for i in probes)
            bad.mode = "answer"
            while forwarder.upstreams[0].udp.down:
                assert time.monotonic() < deadline + 5
                await asyncio.sleep(0.05)
            await forwarder.forward(query("c.example.test"), False, 512)
            assert "c.example.test" in bad.names()  # back, and first again (sequential)

        upstreams = [plain(bad), plain(good)]
        run(
            test,
            upstreams,
            timeout=0.3,
            policy="sequential",
            max_fails=1,
            health_check=0.1,
            health_recursion=False,
            health_domain=("example", "org"),
        )
    assert f"upstream 127.0.0.1:{bad.port} is unhealthy over udp" in caplog.text
    assert "probing it every 0.1s" in caplog.text
    assert f"upstream 127.0.0.1:{bad.port} is healthy again over udp" in caplog.text


# ---- FROM and except


INTERNAL = (("internal", "example", "org"),)
FROM_EXCEPT = [
    ("under FROM", "www.example.org", INTERNAL, True),
    ("FROM in other letter case", "WWW.Example.ORG", INTERNAL, True),
    ("outside FROM", "www.example.test", INTERNAL, False),
    ("a name ending like FROM", "wwwexample.org", INTERNAL, False),
    ("under an except zone", "x.internal.example.org", INTERNAL, False),
    ("an except zone itself", "INTERNAL.example.org", INTERNAL, False),
    # forward.go isAllowedDomain: FROM itself is forwarded whatever `except` says.
    ("FROM itself, excepted", "example.org", (("example", "org"),), True),
    ("under FROM, excepted", "www.example.org", (("example", "org"),), False),
]


@pytest.mark.parametrize(
    ("name", "ignored", "forwarded"),
    [c[1:] for c in FROM_EXCEPT],
    ids=[c[0] for c in FROM_EXCEPT],
)
def test_only_names_under_from_and_outside_except_are_forwarded(
    name: str, ignored: tuple[tuple[str, ...], ...], forwarded: bool
) -> None:
    with stub_upstream(RECORDS) as stub:

        async def test(forwarder: Forwarder) -> None:
            assert forwarder.scoped
            outcome = await forwarder.forward(query(name), False, 512)
            assert (outcome != SERVFAIL) is forwarded
            # In a block's chain, a name not forwarded goes to the next plugin.
            request = Request(decode_query(query(name)), query(name), UDP4, "127.0.0.2")
            handler = Forwarding(forwarder)
            reply = handler.serve(request, lambda request: b"next")
            assert (reply != b"next") is forwarded
            if not isinstance(reply, bytes | None):
                await reply

        run(test, [plain(stub)], zone=("example", "org"), ignored=ignored)
        assert bool(stub.names()) is forwarded


def test_from_the_root_without_except_checks_nothing() -> None:
    forwarder = Forwarder([Upstream("127.0.0.1")])
    assert not forwarder.scoped and forwarder.forwards(("any", "name"))


# ---- connections reused, bounded in idle time (expire)


def test_tcp_connections_are_reused_and_closed_after_expire() -> None:
    with stub_upstream(RECORDS) as stub:

        async def test(forwarder: Forwarder) -> None:
            hits = counter(PROXY_CONN_CACHE_HITS, "forward", str(plain(stub)), "tcp")
            for i in range(3):
                await forwarder.forward(query(f"t{i}.example.test"), True, 65535)
            assert stub.tcp_accepted == 1  # one connection for the three
            assert counter(PROXY_CONN_CACHE_HITS, "forward", str(plain(stub)), "tcp") == hits + 2
            assert stub.tcp_open == 1
            await asyncio.sleep(0.6)  # idle past `expire`: closed
            assert stub.tcp_open == 0
            await forwarder.forward(query("t9.example.test"), True, 65535)
            assert stub.tcp_accepted == 2

        run(test, [plain(stub)], expire=0.3)


def test_expire_0_keeps_no_connection() -> None:
    with stub_upstream(RECORDS) as stub:

        async def test(forwarder: Forwarder) -> None:
            for i in range(3):
                await forwarder.forward(query(f"e{i}.example.test"), True, 65535)
            assert stub.tcp_accepted == 3

        run(test, [plain(stub)], expire=0.0)


def test_a_connection_the_upstream_closed_is_no_failure_of_its() -> None:
    with stub_upstream(RECORDS) as stub:
        stub.replies_per_connection = 1  # the upstream closes each after one reply

        async def test(forwarder: Forwarder) -> None:
            for i in range(4):
                reply = await forwarder.forward(query(f"c{i}.example.test"), True, 65535)
                assert isinstance(reply, bytes)
                await asyncio.sleep(0.02 * (i % 2))  # its close seen now before reuse, now not
            assert forwarder.upstreams[0].tcp.fails == 0
            assert stub.tcp_accepted == 4

        run(test, [plain(stub)])


# ---- DNS over TLS


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"), ("dns.test",))


TLS_NAMES = [
    ("tls_servername", "", "dns.test", True),
    ("the upstream's own name", "dns.test", "", True),
    ("another name", "", "other.test", False),
    ("none: the address, which the certificate does not name", "", "", False),
]


@pytest.mark.parametrize(
    ("own", "servername", "accepted"), [c[1:] for c in TLS_NAMES], ids=[c[0] for c in TLS_NAMES]
)
def test_dns_over_tls_checks_the_certificate_and_reuses_the_connection(
    certificates: Certificates, own: str, servername: str, accepted: bool
) -> None:
    with stub_upstream(RECORDS, tls=certificates.server_context()) as stub:
        upstream = Upstream("127.0.0.1", stub.tls_port, True, own)

        async def test(forwarder: Forwarder) -> None:
            misses = counter(PROXY_CONN_CACHE_MISSES, "forward", str(upstream), "tcp-tls")
            refused = counter(UPSTREAM_ERRORS, str(upstream), "tls", "tls")
            for i in range(3):  # over UDP from the client: TLS all the same
                reply = await forwarder.forward(query(f"s{i}.example.test", i), False, 512)
                assert isinstance(reply, bytes) is accepted
            if accepted:
                assert [q[0] for q in stub.queries] == ["tls"] * 3
                assert stub.tcp_accepted == 1  # one handshake for the three
                new = counter(PROXY_CONN_CACHE_MISSES, "forward", str(upstream), "tcp-tls")
                assert new == misses + 1
            else:
                assert not stub.names()
                # Two tries a query (two passes over the one upstream), each refused.
                assert counter(UPSTREAM_ERRORS, str(upstream), "tls", "tls") == refused + 6

        # No probes (max_fails 0): none is left in a handshake when the stub stops.
        files = (str(certificates.ca),)
        run(test, [upstream], tls=files, tls_servername=servername, max_fails=0)


def test_dns_over_tls_against_the_system_cas_refuses_a_private_ca(
    certificates: Certificates,
) -> None:
    with stub_upstream(RECORDS, tls=certificates.server_context()) as stub:

        async def test(forwarder: Forwarder) -> None:
            assert await forwarder.forward(query("x.example.test"), False, 512) == SERVFAIL
            assert not stub.names()

        upstream = Upstream("127.0.0.1", stub.tls_port, True)
        run(test, [upstream], tls_servername="dns.test", max_fails=0)


def test_a_failing_tls_upstream_is_probed_over_tls(
    certificates: Certificates, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(upstream_module, "HEALTH_TIMEOUT", 0.3)
    with stub_upstream(RECORDS, tls=certificates.server_context()) as stub:
        upstream = Upstream("127.0.0.1", stub.tls_port, True, "dns.test")

        async def test(forwarder: Forwarder) -> None:
            (health,) = forwarder.upstreams
            health.failed(False, UpstreamError("timeout", "no reply"))
            assert health.tcp.fails == 1 and health.udp.fails == 0
            deadline = time.monotonic() + 5
            while health.tcp.fails:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            assert ("tls", "", "NS") in stub.queries  # `. NS` over TLS

        run(test, [upstream], tls=(str(certificates.ca),), health_check=0.1)
