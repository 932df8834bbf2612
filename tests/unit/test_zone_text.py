"""One record read from its zone-file text, as miekg/dns's NewRR reads a `template`'s: the
header by miekg/dns's rules, the rdata checked against dnspython's own parser."""

from __future__ import annotations

import dns.name
import dns.rdata
import dns.rdataclass
import dns.rdatatype
import pytest

from toposdns.wire.encode import name_wire, record_wire
from toposdns.wire.records import Raw
from toposdns.wire.zone_text import read_record

# (text, owner, TTL, class, type, the rdata as dnspython writes it)
RECORDS = [
    ("ip-10-95-12-8.example. 60 IN A 10.95.12.8", "ip-10-95-12-8.example.", 60, "IN", "A",
     "10.95.12.8"),
    ("ns0.example. IN A 203.0.113.8", "ns0.example.", 3600, "IN", "A", "203.0.113.8"),
    ("x.example. IN 60 AAAA 2001:DB8::1", "x.example.", 60, "IN", "AAAA", "2001:db8::1"),
    ("x.example. 1h30m AAAA ::ffff:1.2.3.4", "x.example.", 5400, "IN", "AAAA", "::ffff:1.2.3.4"),
    ("foogle.com 60 IN CNAME google.com", "foogle.com.", 60, "IN", "CNAME", "google.com."),
    ("example. IN NS ns0.example.com.", "example.", 3600, "IN", "NS", "ns0.example.com."),
    ("4.3.2.1.in-addr.arpa. 60 PTR ip-1-2-3-4.example.", "4.3.2.1.in-addr.arpa.", 60, "IN",
     "PTR", "ip-1-2-3-4.example."),
    ("a.example. 60 MX 10 a.example.", "a.example.", 60, "IN", "MX", "10 a.example."),
    ("_x._tcp.example. 60 SRV 1 2 3 t", "_x._tcp.example.", 60, "IN", "SRV", "1 2 3 t."),
    ("invalid. 60 IN SOA ns.invalid. hostmaster.invalid. (1 60 60 60 60)", "invalid.", 60, "IN",
     "SOA", "ns.invalid. hostmaster.invalid. 1 60 60 60 60"),
    ("example.com 60 IN SOA ns.example.com hostmaster.example.com (\n 1 ; serial\n 1h 2m 3d 4w )",
     "example.com.", 60, "IN", "SOA",
     "ns.example.com. hostmaster.example.com. 1 3600 120 259200 2419200"),
    ('t.example. 60 IN TXT "a b" c "d\\"e" f\\032g', "t.example.", 60, "IN", "TXT",
     '"a b" "c" "d\\"e" "f g"'),
    ('t.example. 60 IN TXT "' + "x" * 300 + '"', "t.example.", 60, "IN", "TXT",
     '"' + "x" * 255 + '" "' + "x" * 45 + '"'),
    ("h.example. 60 IN HINFO amd64 linux 6", "h.example.", 60, "IN", "HINFO",
     '"amd64" "linux 6"'),
    ('c.example. 60 IN CAA 0 issue "ca.example"', "c.example.", 60, "IN", "CAA",
     '0 issue "ca.example"'),
    ("s.example. 60 IN SSHFP 1 1 " + "0123456789" * 4, "s.example.", 60, "IN", "SSHFP",
     "1 1 " + "0123456789" * 4),
    ("g.example. 60 IN TYPE65280 \\# 3 abcdef", "g.example.", 60, "IN", "TYPE65280",
     "\\# 3 abcdef"),
    ("g.example. 60 IN NS \\# 3 016100", "g.example.", 60, "IN", "NS", "a."),
    ('coredns.invalid. 60 CH TXT "test"', "coredns.invalid.", 60, "CH", "TXT", '"test"'),
    ("a\\.b\\;c\\032d.example. 60 IN A 1.2.3.4", "a\\.b\\;c\\ d.example.", 60, "IN", "A",
     "1.2.3.4"),
    ("@ 60 IN A 1.2.3.4\nsecond.example. 60 IN A 5.6.7.8", ".", 60, "IN", "A", "1.2.3.4"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "owner", "ttl", "rclass", "rtype", "rdata"), RECORDS)
def test_reads_a_record_as_miekg_dns_does(
    text: str, owner: str, ttl: int, rclass: str, rtype: str, rdata: str
) -> None:
    record = read_record(text)
    assert record is not None
    code = dns.rdatatype.from_text(rtype)
    klass = dns.rdataclass.from_text(rclass)
    assert (record.name, record.rtype, record.ttl) == (
        tuple(label.decode("latin-1") for label in dns.name.from_text(owner).labels[:-1]),
        code,
        ttl,
    )
    expected = dns.rdata.from_text(
        klass, code, rdata, origin=dns.name.root, relativize=False
    ).to_wire()
    data = record.rdata
    written = record_wire(record)
    assert written[len(name_wire(record.name)) + 2 : len(name_wire(record.name)) + 4] == (
        klass.to_bytes(2, "big")
    )
    if isinstance(data, Raw):
        assert (data.data, data.rclass) == (expected, klass)
    else:
        assert written[len(name_wire(record.name)) + 10 :] == expected


@pytest.mark.parametrize("text", ["", "   ", "; only a comment", "\n\n"])
def test_no_record(text: str) -> None:
    assert read_record(text) is None


# (text, what is wrong)
BAD = [
    ("test.example.", "no record type"),
    ("test.example. 60 IN", "no record type"),
    (" 60 IN A 1.2.3.4", "no owner name"),
    ("x.example. 60 IN FOO 1", "not a TTL, class or type: 'FOO'"),
    ("x.example. 60 IN A 1.2.3.4 extra", "A takes 1 fields"),
    ("x.example. 60 IN A 300.2.3.4", "bad A address"),
    ("x.example. 60 IN A 01.2.3.4", "bad A address"),
    ("x.example. 60 IN AAAA fe80::1%eth0", "bad AAAA address"),
    ("x.example. 60 IN MX 70000 a.", "bad MX preference"),
    ("x.example. 60 IN SOA a. b. x 1 1 1 1", "bad SOA serial"),
    ("x.example. 60 IN SOA a. b. 1 1 1 1 z", "bad SOA zone parameter"),
    ('x.example. 60 IN CNAME "a.example."', "a name cannot be quoted"),
    ("x..example. 60 IN A 1.2.3.4", "empty label"),
    ("x.example. 60 IN A ( 1.2.3.4", "never closed"),
    ('x.example. 60 IN TXT "open', "never closed"),
    ("x.example. 60 IN NS \\# 3 0161", "rdata of 2 octets, not 3"),
    ('x.example. 60 IN URI 10 1 "https://example"', "URI records are not read here"),
    (("a" * 64) + ".example. 60 IN A 1.2.3.4", "longer than 63"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_refuses_what_is_not_a_record(text: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        read_record(text)
    assert message in str(error.value)
