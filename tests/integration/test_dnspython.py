"""Wire-level behaviour over UDP and TCP, asked with dnspython and hand-made packets."""

from __future__ import annotations

import struct

import dns.edns
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import pytest

from tests.integration.support import Server, addresses, raw_udp, rrset_texts, tcp, udp

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared_server(both_frontends: Server) -> Server:
    """Every test here runs with each UDP frontend."""
    return both_frontends


BIG = "big.data.svc.cluster.local."
BIG_IPS = {f"10.244.100.{i}" for i in range(1, 61)}


def question_text(reply: dns.message.Message) -> list[str]:
    return [rrset.to_text() for rrset in reply.question]


@pytest.mark.parametrize("send", [udp, tcp], ids=["udp", "tcp"])
def test_answers_over_udp_and_tcp(shared_server: Server, send: object) -> None:
    query = dns.message.make_query("web.shop.svc.cluster.local.", "A")
    reply = send(shared_server, query)  # type: ignore[operator]
    assert reply.id == query.id
    assert reply.rcode() == dns.rcode.NOERROR
    assert reply.flags & dns.flags.AA and reply.flags & dns.flags.QR
    assert not reply.flags & dns.flags.RA and not reply.flags & dns.flags.TC
    assert rrset_texts(reply.answer) == {
        "web.shop.svc.cluster.local. 5 IN A 10.244.1.10",
        "web.shop.svc.cluster.local. 5 IN A 10.244.2.11",
    }
    assert reply.authority == [] and reply.additional == []
    assert reply.edns == -1  # no OPT in the query, none in the reply


def test_srv_additional_over_tcp(shared_server: Server) -> None:
    reply = tcp(shared_server, dns.message.make_query("workers.data.svc.cluster.local.", "SRV"))
    assert reply.rcode() == dns.rcode.NOERROR
    # Three entries (two IPv4, one IPv6) give weight floor(100 / 3) = 33.
    owner = "workers.data.svc.cluster.local. 5 IN SRV 0 33 9000"
    assert rrset_texts(reply.answer) == {
        f"{owner} 10-244-3-5.workers.data.svc.cluster.local.",
        f"{owner} 10-244-3-6.workers.data.svc.cluster.local.",
        f"{owner} fd00-244--5.workers.data.svc.cluster.local.",
    }
    assert rrset_texts(reply.additional) == {
        "10-244-3-5.workers.data.svc.cluster.local. 5 IN A 10.244.3.5",
        "10-244-3-6.workers.data.svc.cluster.local. 5 IN A 10.244.3.6",
        "fd00-244--5.workers.data.svc.cluster.local. 5 IN AAAA fd00:244::5",
    }


@pytest.mark.parametrize(
    ("payload", "truncated"),
    [(None, True), (256, True), (512, True), (1232, False), (4096, False)],
    ids=["no-edns", "256", "512", "1232", "4096"],
)
def test_edns_payload_size_decides_truncation(
    shared_server: Server, payload: int | None, truncated: bool
) -> None:
    if payload is None:
        query = dns.message.make_query(BIG, "A")
    else:
        query = dns.message.make_query(BIG, "A", use_edns=0, payload=payload)
    wire = query.to_wire()
    data = raw_udp(shared_server, wire, timeout=2.0)
    assert data is not None
    # Below 512 the limit is 512 anyway.
    assert len(data) <= max(512, payload or 512)
    reply = dns.message.from_wire(data)
    assert reply.id == query.id
    assert reply.rcode() == dns.rcode.NOERROR
    assert question_text(reply) == [f"{BIG} IN A"]
    assert bool(reply.flags & dns.flags.TC) == truncated
    found = addresses(reply)
    assert found <= BIG_IPS
    if truncated:
        assert 0 < len(found) < 60
    else:
        assert found == BIG_IPS
    if payload is None:
        assert reply.edns == -1
    else:  # the client's size, lowered to --max-udp-size (1232) as CoreDNS's bufsize does
        assert reply.edns == 0 and reply.payload == min(payload, 1232)


def test_truncated_reply_at_512_holds_as_many_as_fit(shared_server: Server) -> None:
    no_edns = dns.message.from_wire(
        raw_udp(shared_server, dns.message.make_query(BIG, "A").to_wire(), 2.0) or b""
    )
    small = dns.message.from_wire(
        raw_udp(
            shared_server,
            dns.message.make_query(BIG, "A", use_edns=0, payload=256).to_wire(),
            2.0,
        )
        or b""
    )
    # 256 is raised to 512; the OPT record (11 bytes) costs room, so at most as many records.
    assert len(addresses(small)) <= len(addresses(no_edns))
    assert len(addresses(no_edns)) >= 25  # compressed A records are 16 bytes each


def test_tcp_answer_is_never_truncated(shared_server: Server) -> None:
    reply = tcp(shared_server, dns.message.make_query(BIG, "A", use_edns=0, payload=512))
    assert not reply.flags & dns.flags.TC
    assert addresses(reply) == BIG_IPS


def test_edns_version_1_gets_badvers(shared_server: Server) -> None:
    query = dns.message.make_query("frontend.shop.svc.cluster.local.", "A", use_edns=1)
    for send in (udp, tcp):
        reply = send(shared_server, query)
        assert reply.id == query.id
        assert reply.rcode() == dns.rcode.BADVERS == 16
        assert reply.edns == 0
        assert question_text(reply) == ["frontend.shop.svc.cluster.local. IN A"]
        assert reply.answer == []


def test_do_bit_is_echoed(shared_server: Server) -> None:
    query = dns.message.make_query("frontend.shop.svc.cluster.local.", "A", want_dnssec=True)
    reply = udp(shared_server, query)
    assert reply.ednsflags & dns.flags.DO
    assert addresses(reply) == {"10.96.10.10"}
    plain = udp(
        shared_server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A", use_edns=0)
    )
    assert plain.edns == 0 and not plain.ednsflags & dns.flags.DO


def test_edns_options_cookie_echoed_ecs_scoped_others_dropped(shared_server: Server) -> None:
    cookie = dns.edns.GenericOption(dns.edns.COOKIE, b"\x01\x02\x03\x04\x05\x06\x07\x08")
    subnet = dns.edns.ECSOption("192.0.2.0", 24)
    private = dns.edns.GenericOption(65001, b"local")
    query = dns.message.make_query(
        "frontend.shop.svc.cluster.local.", "A", use_edns=0, options=[cookie, subnet, private]
    )
    reply = udp(shared_server, query)
    assert addresses(reply) == {"10.96.10.10"}
    # The cookie comes back unchanged (CoreDNS); ECS is echoed with SCOPE 0 because this
    # answer does not depend on the client (RFC 7871, docs/topology.md); other options are dropped.
    assert sorted((o.otype, o.to_wire()) for o in reply.options) == [
        (dns.edns.ECS, b"\x00\x01\x18\x00\xc0\x00\x02"),
        (dns.edns.COOKIE, b"\x01\x02\x03\x04\x05\x06\x07\x08"),
    ]


def test_class_ch_is_refused(shared_server: Server) -> None:
    query = dns.message.make_query(
        "frontend.shop.svc.cluster.local.", "A", rdclass=dns.rdataclass.CH
    )
    reply = udp(shared_server, query)
    assert reply.rcode() == dns.rcode.REFUSED
    assert question_text(reply) == ["frontend.shop.svc.cluster.local. CH A"]
    assert reply.answer == [] and not reply.flags & dns.flags.AA


@pytest.mark.parametrize("opcode", [dns.opcode.NOTIFY, dns.opcode.STATUS, dns.opcode.UPDATE])
def test_other_opcodes_get_notimp(shared_server: Server, opcode: int) -> None:
    query = dns.message.make_query("frontend.shop.svc.cluster.local.", "A")
    query.set_opcode(opcode)
    data = raw_udp(shared_server, query.to_wire(), timeout=2.0)
    assert data is not None
    reply = dns.message.from_wire(data)
    assert reply.id == query.id
    assert reply.flags & dns.flags.QR
    assert reply.opcode() == opcode
    assert reply.rcode() == dns.rcode.NOTIMP
    assert reply.answer == []


def test_garbage_after_header_is_formerr_with_same_id(shared_server: Server) -> None:
    header = struct.pack("!6H", 0xBEEF, 0x0100, 1, 0, 0, 0)
    for garbage in (b"\xff\xfe\xfd", b"\x05abc", b"\x03www\x00\x00"):
        data = raw_udp(shared_server, header + garbage, timeout=2.0)
        assert data is not None, garbage
        qid, flags = struct.unpack_from("!2H", data)
        assert qid == 0xBEEF
        assert flags & 0x8000  # QR
        assert flags & 0x000F == dns.rcode.FORMERR
        assert flags & 0x0100  # RD copied


def test_short_packet_gets_no_reply_and_server_lives(shared_server: Server) -> None:
    for short in (b"", b"\x12", b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00"):
        assert raw_udp(shared_server, short, timeout=0.5) is None
    reply = udp(shared_server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
    assert addresses(reply) == {"10.96.10.10"}


def test_response_packet_gets_no_reply(shared_server: Server) -> None:
    query = dns.message.make_query("frontend.shop.svc.cluster.local.", "A")
    query.flags |= dns.flags.QR
    assert raw_udp(shared_server, query.to_wire(), timeout=0.5) is None
    reply = udp(shared_server, dns.message.make_query("frontend.shop.svc.cluster.local.", "A"))
    assert addresses(reply) == {"10.96.10.10"}


def test_axfr_is_refused_without_aa(shared_server: Server) -> None:
    reply = tcp(shared_server, dns.message.make_query("cluster.local.", "AXFR"))
    assert reply.rcode() == dns.rcode.REFUSED
    assert not reply.flags & dns.flags.AA
    assert reply.answer == [] and reply.authority == []


def test_rd_and_cd_are_copied(shared_server: Server) -> None:
    query = dns.message.make_query("frontend.shop.svc.cluster.local.", "A")
    query.flags = dns.flags.CD  # RD off, CD on
    reply = udp(shared_server, query)
    assert reply.flags & dns.flags.CD
    assert not reply.flags & dns.flags.RD
    assert not reply.flags & dns.flags.AD
    assert addresses(reply) == {"10.96.10.10"}
