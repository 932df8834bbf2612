"""DNS numbers, named once: record types, rcodes, header flag bits, EDNS option codes; and
the form names take in memory.

RFC 1035 (types, rcodes, header), RFC 3596 (AAAA), RFC 2782 (SRV), RFC 6891 (OPT, BADVERS),
RFC 7871 (Client Subnet), RFC 7873 (COOKIE). Every layer takes its numbers from here.
"""

from __future__ import annotations

#: A domain name as its labels, exactly as asked (latin-1 text); the root is the empty tuple.
Name = tuple[str, ...]

# Record types.
A, NS, CNAME, SOA, PTR, HINFO, MX, TXT, AAAA, SRV, OPT, IXFR, AXFR, ANY = (
    1, 2, 5, 6, 12, 13, 15, 16, 28, 33, 41, 251, 252, 255,
)  # fmt: skip
DS = 43  # RFC 4034: its question goes to the parent zone's server block
CLASS_IN = 1

# Response codes (BADVERS needs the OPT record's extended rcode bits).
NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED = 0, 1, 2, 3, 4, 5
BADVERS = 16
RCODE_NAMES = {
    NOERROR: "NOERROR",
    FORMERR: "FORMERR",
    SERVFAIL: "SERVFAIL",
    NXDOMAIN: "NXDOMAIN",
    NOTIMP: "NOTIMP",
    REFUSED: "REFUSED",
    BADVERS: "BADVERS",
}

# Header flag bits, in the 16-bit flags word.
QR = 0x8000
OPCODE = 0x7800
AA = 0x0400
TC = 0x0200
RD = 0x0100
RA = 0x0080
AD = 0x0020
CD = 0x0010
RCODE = 0x000F
#: What a reply copies from its query: the opcode, RD and CD (miekg/dns SetReply, CoreDNS).
COPIED_FLAGS = OPCODE | RD | CD

#: The top bits of a label length byte that make it a compression pointer (RFC 1035 4.1.4).
POINTER = 0xC0

# EDNS option codes.
NSID, CLIENT_SUBNET, EXPIRE, COOKIE, TCP_KEEPALIVE, PADDING = 3, 8, 9, 10, 11, 12
#: EDNS options CoreDNS echoes back (request.SupportedOptions): NSID, EXPIRE, COOKIE,
#: TCP-KEEPALIVE and PADDING. Everything else, Client Subnet included, is dropped.
ECHOED_OPTIONS = frozenset({NSID, EXPIRE, COOKIE, TCP_KEEPALIVE, PADDING})
#: The OPT TTL field's DO bit.
DO = 0x8000
