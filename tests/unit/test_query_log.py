"""CoreDNS's `log`: which queries get a line, and what it says, from bytes in and out."""

from __future__ import annotations

import io

import dnslib
import pytest

from toposdns.serve.query_log import LogOptions, QueryLog, reply_class


def exchange(
    name: str, rcode: int = 0, answers: int = 0, edns: bool = False
) -> tuple[bytes, bytes]:
    query = dnslib.DNSRecord.question(name, "AAAA")
    query.header.id = 4660
    if edns:
        query.add_ar(dnslib.EDNS0(udp_len=1232, flags="do"))
    reply = query.reply()
    reply.header.rcode = rcode
    for _ in range(answers):
        reply.add_answer(dnslib.RR(name, dnslib.QTYPE.AAAA, rdata=dnslib.AAAA("fd00::1")))
    return bytes(query.pack()), bytes(reply.pack())


def logged(options: LogOptions, name: str, rcode: int = 0, answers: int = 0) -> str:
    out = io.StringIO()
    log = QueryLog(options, out)
    query, reply = exchange(name, rcode, answers)
    log.asked("fd00::7", 5353, query)
    log.answered("fd00::7", 5353, reply, tcp=False)
    return out.getvalue()


def test_the_common_log_format() -> None:
    out = io.StringIO()
    log = QueryLog(LogOptions(True), out)
    query, reply = exchange("Web.Shop.svc.cluster.local", answers=1, edns=True)
    log.asked("10.0.0.7", 40312, query)
    log.answered("10.0.0.7", 40999, reply, tcp=True)  # another client: not this query's line
    assert out.getvalue() == ""
    log.answered("10.0.0.7", 40312, reply, tcp=True)
    head, _, seconds = out.getvalue().rpartition(" ")
    assert head == (
        '[INFO] 10.0.0.7:40312 - 4660 "AAAA IN web.shop.svc.cluster.local. tcp '
        f'{len(query)} true 65535" NOERROR qr,aa,rd,ra {len(reply)}'
    )
    assert seconds.endswith("s\n") and float(seconds[:-2]) >= 0
    assert not log.pending


@pytest.mark.parametrize(
    ("host", "remote"),
    [
        ("::ffff:10.0.0.7", "10.0.0.7"),  # an IPv4 client of a socket bound to `::`
        ("fd00::7", "[fd00::7]"),
        ("::ffff:a00:7", "[::ffff:a00:7]"),  # not written as IPv4: left as it is
    ],
)
def test_clients_are_written_as_coredns_writes_them(host: str, remote: str) -> None:
    out = io.StringIO()
    log = QueryLog(LogOptions(True), out)
    query, reply = exchange("web.shop.svc.cluster.local")
    log.asked(host, 40312, query)
    log.answered(host, 40312, reply, tcp=False)
    assert out.getvalue().startswith(f"[INFO] {remote}:40312 - 4660 ")


@pytest.mark.parametrize(
    ("rcode", "answers", "kind"),
    [(0, 1, "success"), (0, 0, "denial"), (3, 0, "denial"), (2, 0, "error"), (5, 0, "error")],
)
def test_classes_as_coredns_classifies_replies(rcode: int, answers: int, kind: str) -> None:
    assert reply_class(exchange("a.example", rcode, answers)[1]) == kind
    only = LogOptions(True, classes=frozenset({kind}))
    assert logged(only, "a.example", rcode, answers).startswith("[INFO] [fd00::7]:5353 - 4660 ")
    other = LogOptions(True, classes=frozenset({"success", "denial", "error"} - {kind}))
    assert logged(other, "a.example", rcode, answers) == ""


def test_names_scope_the_lines() -> None:
    scoped = LogOptions(True, names=(("example", "org"),))
    assert logged(scoped, "www.Example.org")
    assert logged(scoped, "example.org")
    assert not logged(scoped, "example.com")
    assert not logged(scoped, "badexample.org")
