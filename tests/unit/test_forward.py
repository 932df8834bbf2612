"""The forwarder's pure parts and its bounds: which replies are taken (CoreDNS's
`request.Match`), health per transport, one upstream query per question in flight, REFUSED past
--max-concurrent, our own queries known when they come back, local shortages not blamed on the
upstream. The upstream is an asyncio UDP server in the test's own loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import dnslib
import pytest

from toposdns.serve import forward
from toposdns.serve.forward import Forwarder, cache_key, upstream_query
from toposdns.serve.upstream import LocalError, Upstream, UpstreamError, check_reply
from toposdns.wire.codes import FORMERR, REFUSED, SERVFAIL
from toposdns.wire.decode import question_end

QUERY = dnslib.DNSRecord.question("www.example.test.", "A")
QUERY.header.id = 0x4242
WIRE = bytes(QUERY.pack())


def reply_to(query: dnslib.DNSRecord, **changes: Any) -> bytes:
    reply = query.reply()
    for field, value in changes.items():
        setattr(reply.header, field, value)
    return bytes(reply.pack())


def other_question(name: str, qtype: str = "A") -> bytes:
    reply = QUERY.reply()
    reply.questions = [dnslib.DNSQuestion(name, getattr(dnslib.QTYPE, qtype))]
    return bytes(reply.pack())


CHECKS = [
    ("the reply", reply_to(QUERY), ""),
    ("the name in other case", other_question("WWW.Example.TEST."), ""),
    ("a query, not a reply", WIRE, "not_response"),
    ("garbage after the header", WIRE[:2] + b"\x81\x80\x00\x01\x00\x05" + bytes(30), "malformed"),
    ("another name", other_question("evil.example."), "wrong_question"),
    ("another type", other_question("www.example.test.", "AAAA"), "wrong_question"),
    ("no question", WIRE[:2] + b"\x81\x80" + bytes(8), "wrong_question"),
]


@pytest.mark.parametrize(("reply", "kind"), [c[1:] for c in CHECKS], ids=[c[0] for c in CHECKS])
def test_check_reply(reply: bytes, kind: str) -> None:
    if not kind:
        assert check_reply(WIRE, reply).q.qname == "www.example.test."
        return
    with pytest.raises(UpstreamError) as raised:
        check_reply(WIRE, reply)
    assert raised.value.kind == kind


def test_cache_key_is_the_question_as_asked_with_the_flags_answers_depend_on() -> None:
    end = question_end(WIRE)
    assert WIRE[12:end] == b"\x03www\x07example\x04test\x00\x00\x01\x00\x01"
    key = cache_key(WIRE, end, edns=False)
    other_id = b"\x00\x01" + WIRE[2:]
    assert cache_key(other_id, end, False) == key
    no_rd = WIRE[:2] + bytes((WIRE[2] & ~0x01,)) + WIRE[3:]
    assert cache_key(no_rd, end, False) != key
    do = dnslib.DNSRecord.question("www.example.test.", "A")
    do.add_ar(dnslib.EDNS0(udp_len=4096, flags="do"))
    assert cache_key(bytes(do.pack()), end, True) != key
    big = dnslib.DNSRecord.question("www.example.test.", "A")
    big.add_ar(dnslib.EDNS0(udp_len=4096))
    assert cache_key(bytes(big.pack()), end, True) == key  # whole answers are cut per client
    shouted = dnslib.DNSRecord.question("WwW.ExAmPlE.TeSt.", "A").pack()
    assert cache_key(bytes(shouted), end, False) == key  # letter case is folded, as CoreDNS's


def test_a_name_in_another_case_is_a_hit_with_its_own_question() -> None:
    # 0x20-randomizing resolvers ask each name in new letter case: one upstream query for all,
    # and each reply's question as its query asked it (they compare it byte for byte).
    async def test(forwarder: Forwarder, upstream: FakeUpstream) -> None:
        names = ("www.example.test.", "WWW.Example.TEST.", "wWw.eXaMpLe.tEsT.")
        for qid, name in enumerate(names, 1):
            reply = await forwarder.forward(query(name, qid), False, 512)
            assert isinstance(reply, bytes)
            parsed = dnslib.DNSRecord.parse(reply)
            assert (parsed.header.id, str(parsed.q.qname)) == (qid, name)
            assert [str(rr.rdata) for rr in parsed.rr] == ["192.0.2.1"]
        assert len(upstream.queries) == 1
        assert len(forwarder.cache.success) == 1

    def address(asked: dnslib.DNSRecord) -> bytes:
        reply = asked.reply()
        reply.add_answer(dnslib.RR(asked.q.qname, rdata=dnslib.A("192.0.2.1"), ttl=300))
        return bytes(reply.pack())

    with_upstream(test, answer=address)


UPSTREAM_QUERIES = [
    ("no OPT: one is added", {}, (1232, 0)),
    ("a small buffer is raised", {"udp_len": 512}, (1232, 0)),
    ("a large buffer is lowered", {"udp_len": 65535}, (1232, 0)),
    ("DO is kept", {"udp_len": 4096, "flags": "do"}, (1232, 0x8000)),
]


@pytest.mark.parametrize(
    ("edns", "expected"), [c[1:] for c in UPSTREAM_QUERIES], ids=[c[0] for c in UPSTREAM_QUERIES]
)
def test_upstreams_are_asked_with_a_buffer_of_1232(
    edns: dict[str, Any], expected: tuple[int, int]
) -> None:
    record = dnslib.DNSRecord.question("www.example.test.", "A")
    if edns:
        record.add_ar(dnslib.EDNS0(**edns))
    data = bytes(record.pack())
    sent = dnslib.DNSRecord.parse(upstream_query(data, question_end(data)))
    (opt,) = sent.ar
    assert (opt.rclass, opt.ttl) == expected
    assert sent.q == record.q


class FakeUpstream(asyncio.DatagramProtocol):
    """Answers each query after `delay`, with what `answer` makes of it."""

    def __init__(self, answer: Callable[[dnslib.DNSRecord], bytes], delay: float = 0.0) -> None:
        self.answer = answer
        self.delay = delay
        self.queries: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.DatagramTransport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queries.append(data)
        reply = self.answer(dnslib.DNSRecord.parse(data))
        asyncio.get_running_loop().call_later(self.delay, self.transport.sendto, reply, addr)


def with_upstream(
    test: Callable[[Forwarder, FakeUpstream], Awaitable[None]],
    answer: Callable[[dnslib.DNSRecord], bytes] = reply_to,
    delay: float = 0.0,
    **options: Any,
) -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        transport, upstream = await loop.create_datagram_endpoint(
            lambda: FakeUpstream(answer, delay), local_addr=("127.0.0.1", 0)
        )
        port = transport.get_extra_info("sockname")[1]
        forwarder = Forwarder([Upstream("127.0.0.1", port)], **options)
        try:
            await test(forwarder, upstream)
        finally:
            await forwarder.close()
            transport.close()

    asyncio.run(run())


def query(name: str, qid: int) -> bytes:
    record = dnslib.DNSRecord.question(name, "A")
    record.header.id = qid
    return bytes(record.pack())


def test_one_upstream_query_per_question_in_flight() -> None:
    async def test(forwarder: Forwarder, upstream: FakeUpstream) -> None:
        replies = await asyncio.gather(
            *(forwarder.forward(query("same.example.", qid), False, 512) for qid in (1, 2, 3))
        )
        assert [r[:2] for r in replies if isinstance(r, bytes)] == [
            b"\x00\x01",
            b"\x00\x02",
            b"\x00\x03",
        ]
        assert len(upstream.queries) == 1

    with_upstream(test, delay=0.05)


def test_refused_past_max_concurrent() -> None:
    async def test(forwarder: Forwarder, upstream: FakeUpstream) -> None:
        first = asyncio.ensure_future(forwarder.forward(query("a.example.", 1), False, 512))
        await asyncio.sleep(0.01)
        assert await forwarder.forward(query("b.example.", 2), False, 512) == REFUSED
        assert isinstance(await first, bytes)
        assert isinstance(await forwarder.forward(query("b.example.", 3), False, 512), bytes)

    with_upstream(test, delay=0.05, max_concurrent=1)


def test_a_reply_to_another_question_is_formerr_and_counts_against_the_upstream() -> None:
    def evil(query: dnslib.DNSRecord) -> bytes:
        reply = query.reply()
        reply.questions = [dnslib.DNSQuestion("evil.example.")]
        reply.add_answer(*dnslib.RR.fromZone("evil.example. 300 IN A 6.6.6.6"))
        return bytes(reply.pack())

    async def test(forwarder: Forwarder, upstream: FakeUpstream) -> None:
        assert await forwarder.forward(query("bank.example.com.", 7), False, 512) == FORMERR
        assert forwarder.upstreams[0].udp.fails >= 1
        assert not forwarder.cache.success and not forwarder.cache.denial

    with_upstream(test, answer=evil)


def test_our_own_query_coming_back_is_not_forwarded_again() -> None:
    async def test(forwarder: Forwarder, upstream: FakeUpstream) -> None:
        data = query("loop.example.", 9)
        end = question_end(data)
        qid = forwarder.loops.sending(forwarder.upstreams[0].upstream, data[12:end])
        assert await forwarder.forward(qid + data[2:], False, 512) == SERVFAIL
        assert upstream.queries == []
        forwarder.loops.answered(qid, data[12:end])
        assert isinstance(await forwarder.forward(qid + data[2:], False, 512), bytes)

    with_upstream(test)


def test_running_out_of_sockets_is_not_the_upstreams_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    async def no_files(*_: object) -> bytes:
        raise LocalError("Too many open files")

    async def test(forwarder: Forwarder, upstream: FakeUpstream) -> None:
        monkeypatch.setattr(forward, "send_udp", no_files)
        assert await forwarder.forward(query("a.example.", 1), False, 512) == SERVFAIL
        assert forwarder.upstreams[0].udp.fails == 0 and forwarder.short_of
        monkeypatch.undo()
        assert isinstance(await forwarder.forward(query("a.example.", 2), False, 512), bytes)
        assert not forwarder.short_of

    with_upstream(test)


def test_health_is_kept_per_transport() -> None:
    async def test() -> None:
        forwarder = Forwarder([Upstream("127.0.0.1", 9)], timeout=0.1)  # the discard port
        (upstream,) = forwarder.upstreams
        for _ in range(2):
            upstream.failed(True, UpstreamError("closed", "closed the connection"))
        assert upstream.tcp.down and not upstream.udp.down
        assert upstream.tcp.probe is not None and upstream.udp.probe is None
        assert forwarder.order(tcp=False) == [upstream]
        await forwarder.close()

    asyncio.run(test())
