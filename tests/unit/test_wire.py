"""The hand-written codec, checked against dnslib's independent encoder and decoder."""

from __future__ import annotations

import struct

import dns.message
import dnslib
import pytest

from toposdns.resolve.answer import Answer
from toposdns.wire.codes import AAAA, CNAME, MX, NOERROR, NS, PTR, SOA, SRV, TXT, A
from toposdns.wire.decode import ClientSubnet, Dropped, Edns, Query, Rejected, decode_query
from toposdns.wire.edns import read_options, split_query
from toposdns.wire.encode import (
    encode_badvers,
    encode_bare,
    encode_rejection,
    encode_reply,
    truncate,
    udp_limit,
)
from toposdns.wire.records import RR, Mx, Raw, Soa, Srv

ZONE = ("cluster", "local")
NAME = ("web", "shop", "svc") + ZONE


def query_bytes(
    name: str = "web.shop.svc.cluster.local", qtype: str = "A", **edns: object
) -> bytes:
    q = dnslib.DNSRecord.question(name, qtype)
    q.header.id = 4242
    if edns:
        q.add_ar(dnslib.EDNS0(**edns))  # type: ignore[arg-type]
    return bytes(q.pack())


class TestDecode:
    def test_plain_query(self) -> None:
        query = decode_query(query_bytes("Web.Shop.svc.cluster.local", "SRV"))
        assert query.id == 4242
        assert query.name == ("Web", "Shop", "svc", "cluster", "local")
        assert (query.qtype, query.qclass, query.edns) == (33, 1, None)
        assert query.flags & 0x0100  # RD, as dnslib sets it

    def test_edns_with_options(self) -> None:
        cookie = dnslib.EDNSOption(10, b"\x01" * 8)
        ecs = dnslib.EDNSOption(8, bytes.fromhex("00011800c00002"))
        data = query_bytes(udp_len=1232, flags="do", opts=[cookie, ecs])
        query = decode_query(data)
        edns = query.edns
        assert edns is not None
        assert edns.udp_size == 1232 and edns.version == 0 and edns.ttl & 0x8000
        assert edns.options == ((10, b"\x01" * 8), (8, bytes.fromhex("00011800c00002")))
        assert query.ecs == ClientSubnet(1, 24, "192.0.2.0", b"\xc0\x00\x02")

    def test_ecs_ipv6(self) -> None:
        ecs = dnslib.EDNSOption(8, bytes.fromhex("00023800") + bytes.fromhex("20010db8000000"))
        query = decode_query(query_bytes(opts=[ecs]))
        assert query.ecs is not None and query.ecs.address == "2001:db8::"

    def test_the_first_of_two_ecs_options_counts(self) -> None:
        # The first is the one a forwarder's `rewrite edns0 subnet set` overwrote.
        first = dnslib.EDNSOption(8, bytes.fromhex("00011800c00002"))
        second = dnslib.EDNSOption(8, bytes.fromhex("00011800c63364"))
        data = query_bytes(opts=[first, second])
        assert decode_query(data).ecs == ClientSubnet(1, 24, "192.0.2.0", b"\xc0\x00\x02")
        split = split_query(data)
        assert split is not None and read_options(split[1]).subnet == ("192.0.2.0", 24)
        # A malformed one is FORMERR wherever it stands.
        with pytest.raises(Rejected):
            decode_query(query_bytes(opts=[first, dnslib.EDNSOption(8, b"\x00")]))

    @pytest.mark.parametrize(
        "value",
        [
            "00031800c00002",  # unknown family
            "00012100c0000201",  # /33 for IPv4
            "00011818c00002",  # scope set in a query
            "00011800c0000201",  # more address bytes than the prefix needs
            "00011700c00003",  # a bit set past /23
        ],
    )
    def test_malformed_ecs_is_formerr(self, value: str) -> None:
        with pytest.raises(Rejected) as info:
            decode_query(query_bytes(opts=[dnslib.EDNSOption(8, bytes.fromhex(value))]))
        assert info.value.rcode == 1

    def test_compression_pointers_are_followed(self) -> None:
        # An additional OPT-less record whose owner points back at the question name.
        header = struct.pack("!6H", 7, 0x0100, 1, 0, 0, 1)
        question = b"\x03web\x07cluster\x05local\x00" + struct.pack("!HH", 1, 1)
        record = b"\xc0\x10" + struct.pack("!HHIH", 1, 1, 5, 4) + bytes((10, 0, 0, 1))
        query = decode_query(header + question + record)
        assert query.name == ("web", "cluster", "local") and query.edns is None

    @pytest.mark.parametrize(
        ("data", "error"),
        [
            (b"\x00" * 11, Dropped),
            (struct.pack("!6H", 1, 0x8000, 1, 0, 0, 0), Dropped),  # a response
        ],
    )
    def test_dropped(self, data: bytes, error: type[Exception]) -> None:
        with pytest.raises(error):
            decode_query(data)

    @pytest.mark.parametrize(
        ("data", "rcode"),
        [
            (struct.pack("!6H", 1, 0x2000, 1, 0, 0, 0) + b"\x00\x00\x01\x00\x01", 4),  # UPDATE
            (struct.pack("!6H", 1, 0x1000, 1, 0, 0, 0) + b"\x00\x00\x01\x00\x01", 4),  # STATUS
            (struct.pack("!6H", 1, 0x0100, 0, 0, 0, 0), 1),  # no question
            (struct.pack("!6H", 1, 0x0100, 2, 0, 0, 0), 1),  # two questions
            (struct.pack("!6H", 1, 0x0100, 1, 0, 0, 3), 1),  # too many additional records
            (struct.pack("!6H", 1, 0x0100, 1, 0, 0, 0) + b"\x05ab", 1),  # label past the end
            (struct.pack("!6H", 1, 0x0100, 1, 0, 0, 0) + b"\x00\x00", 1),  # no qtype/qclass
            (struct.pack("!6H", 1, 0x0100, 1, 0, 0, 0) + b"\x40abc\x00\x00\x01\x00\x01", 1),
            (struct.pack("!6H", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\x00\x01\x00\x01", 1),  # loop
            (struct.pack("!6H", 1, 0x0100, 1, 0, 0, 0) + b"\x3f" + b"a" * 63 * 5, 1),  # > 255
        ],
    )
    def test_rejected(self, data: bytes, rcode: int) -> None:
        with pytest.raises(Rejected) as info:
            decode_query(data)
        assert info.value.rcode == rcode
        reply = encode_rejection(data, rcode)
        assert reply[:2] == data[:2] and len(reply) == 12
        header = dnslib.DNSRecord.parse(reply).header
        assert header.qr == 1 and header.rcode == rcode and header.q == 0

    def test_two_opt_records_are_formerr(self) -> None:
        q = dnslib.DNSRecord.question("a.cluster.local")
        q.add_ar(dnslib.EDNS0())
        q.add_ar(dnslib.EDNS0())
        with pytest.raises(Rejected):
            decode_query(bytes(q.pack()))


def sample_answer() -> Answer:
    target = ("web-0",) + NAME
    return Answer(
        NOERROR,
        (
            RR(NAME, A, 5, "10.1.0.1"),
            RR(NAME, AAAA, 5, "fd00::1"),
            RR(NAME, SRV, 5, Srv(0, 50, 80, target)),
            RR(NAME, CNAME, 5, ("svc1", "shop", "svc") + ZONE),
            RR(("1", "0", "1", "10", "in-addr", "arpa"), PTR, 5, target),
            RR(("dns-version",) + ZONE, TXT, 28800, ("1.1.0",)),
            RR(ZONE, NS, 5, ("ns", "dns") + ZONE),
        ),
        (
            RR(
                ZONE,
                SOA,
                5,
                Soa(("ns", "dns") + ZONE, ("hostmaster",) + ZONE, 7, 7200, 1800, 86400, 5),
            ),
        ),
        (RR(target, A, 5, "10.1.0.1"),),
    )


def expected_text(answer: Answer) -> list[str]:
    return [
        str(dnslib.RR.fromZone(str(rr))[0])
        for rr in answer.answer + answer.authority + answer.additional
    ]


class TestEncode:
    def query(self, edns: Edns | None = None, flags: int = 0x0110) -> Query:
        return Query(99, flags, NAME, A, 1, edns)

    @pytest.mark.parametrize("fragment_limit", [0, 1])  # 1 forces the compressed form
    def test_every_record_type_round_trips(self, fragment_limit: int) -> None:
        answer = sample_answer()
        wire = encode_reply(self.query(), answer, 65535, fragment_limit)
        reply = dnslib.DNSRecord.parse(wire)
        got = [str(rr) for rr in reply.rr + reply.auth + reply.ar]
        assert got == expected_text(answer)
        uncompressed = encode_reply(self.query(), answer, 65535)
        assert (len(wire) < len(uncompressed)) == bool(fragment_limit)

    @pytest.mark.parametrize("fragment_limit", [0, 1])  # 1 forces the compressed form
    def test_mx_and_raw_rdata_round_trip(self, fragment_limit: int) -> None:
        # A `template` renders these: MX (compressed as CoreDNS compresses it), and rdata of
        # other types or classes written as given, in their class.
        txt = b"\x05hello\x03a b"
        answer = Answer(
            NOERROR,
            (
                RR(NAME, MX, 60, Mx(10, ("mx",) + NAME)),
                RR(NAME, TXT, 60, Raw(txt)),
                RR(NAME, TXT, 60, Raw(b"\x04test", rclass=3)),
                RR(NAME, 257, 60, Raw(b"\x00\x05issueca.example")),
            ),
        )
        wire = encode_reply(self.query(), answer, 65535, fragment_limit)
        reply = dnslib.DNSRecord.parse(wire)
        assert [(rr.rtype, rr.rclass, str(rr.rdata)) for rr in reply.rr] == [
            (MX, 1, "10 mx.web.shop.svc.cluster.local."),
            (TXT, 1, '"hello","a b"'),
            (TXT, 3, '"test"'),
            (257, 1, '0 issue "ca.example"'),
        ]
        # Compressed, MX's exchange points back at the names before it.
        assert (b"\x02mx\xc0" in wire) == bool(fragment_limit)
        assert [str(rr) for rr in answer.answer][2].split("\t")[2] == "CH"

    def test_header_flags(self) -> None:
        reply = dnslib.DNSRecord.parse(encode_reply(self.query(), sample_answer(), 65535))
        h = reply.header
        assert (h.id, h.qr, h.aa, h.tc, h.rd, h.ra, h.ad, h.cd) == (99, 1, 1, 0, 1, 0, 0, 1)
        assert str(reply.q.qname) == "web.shop.svc.cluster.local."

    def test_uncompressed_when_it_fits(self) -> None:
        wire = encode_reply(self.query(), sample_answer(), 65535)
        assert b"\xc0" not in wire[12:]  # no compression pointers anywhere

    def test_truncation_keeps_question_and_sets_tc(self) -> None:
        many = tuple(RR(NAME, A, 5, f"10.0.{i // 250}.{i % 250}") for i in range(100))
        answer = Answer(NOERROR, many)
        wire = encode_reply(self.query(), answer, 512)
        assert len(wire) <= 512
        reply = dnslib.DNSRecord.parse(wire)
        assert reply.header.tc == 1 and reply.header.q == 1
        assert 0 < len(reply.rr) < 100
        assert [str(rr.rdata) for rr in reply.rr] == [rr.rdata for rr in many[: len(reply.rr)]]

    @pytest.mark.parametrize("limit", [512, 600, 777, 1232, 1500])
    @pytest.mark.parametrize("edns", [None, Edns(1232, 0x8000, ((10, b"c" * 8),))])
    def test_truncating_an_encoded_reply_cuts_as_the_encoder_does(
        self, limit: int, edns: Edns | None
    ) -> None:
        answer = Answer(
            NOERROR,
            tuple(RR(NAME, A, 5, f"10.0.{i // 250}.{i % 250}") for i in range(80)),
            additional=tuple(RR(NAME, AAAA, 5, f"fd00::{i}") for i in range(20)),
        )
        query = self.query(edns)
        whole = encode_reply(query, answer, 65535, fragment_limit=1)  # compressed, all records
        assert truncate(whole, limit) == encode_reply(query, answer, limit)
        assert truncate(whole, 65535) is whole

    def test_truncating_keeps_records_it_cannot_write(self) -> None:
        reply = dnslib.DNSRecord.question("big.example.test", "MX").reply()
        for i in range(60):
            reply.add_answer(*dnslib.RR.fromZone(f"big.example.test. 60 IN MX {i} mx{i}.example."))
        cut = dnslib.DNSRecord.parse(truncate(bytes(reply.pack()), 512))
        assert cut.header.tc == 1 and 0 < len(cut.rr) < 60
        assert [str(rr) for rr in cut.rr] == [str(rr) for rr in reply.rr[: len(cut.rr)]]

    def test_dropping_only_additional_records_sets_tc(self) -> None:
        answer = Answer(
            NOERROR,
            (RR(NAME, A, 5, "10.0.0.1"),),
            additional=tuple(RR(NAME, A, 5, f"10.9.{i}.1") for i in range(60)),
        )
        reply = dnslib.DNSRecord.parse(encode_reply(self.query(), answer, 512))
        assert reply.header.tc == 1 and len(reply.rr) == 1 and len(reply.ar) < 60

    def test_opt_echo(self) -> None:
        edns = Edns(
            1232, 0x8000 | 0x7F, ((10, b"c" * 8), (8, b"\x00\x01\x18\x00\xc0\x00\x02"), (3, b""))
        )
        wire = encode_reply(self.query(edns), sample_answer(), udp_limit(edns))
        # dnspython here: dnslib drops a zero-length option at the end of the OPT record.
        reply = dns.message.from_wire(wire)
        assert reply.edns == 0 and reply.payload == 1232
        assert reply.ednsflags == 0x8000  # DO kept, the other Z bits and the version cleared
        assert [(o.otype, o.to_wire()) for o in reply.options] == [(10, b"c" * 8), (3, b"")]

    def test_udp_limit(self) -> None:
        assert udp_limit(None) == 512
        assert udp_limit(Edns(100, 0)) == 512
        assert udp_limit(Edns(4096, 0)) == 4096

    def test_bare_and_badvers(self) -> None:
        edns = Edns(1232, 1 << 16)
        refused = dnslib.DNSRecord.parse(encode_bare(self.query(edns), 5))
        assert (refused.header.rcode, refused.header.aa, refused.header.q) == (5, 0, 1)
        badvers = dnslib.DNSRecord.parse(encode_badvers(self.query(edns)))
        opt = badvers.ar[0]
        assert badvers.header.rcode == 0 and opt.ttl >> 24 == 1 and (opt.ttl >> 16) & 0xFF == 0
        assert str(badvers.q.qname) == "web.shop.svc.cluster.local."
