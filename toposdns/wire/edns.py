"""The cheap first look at a query: its cache key, and what its EDNS options ask of the reply.

A plain query (one question with an uncompressed name, no other records but an optional OPT) is
answered from cached replies without being decoded: the key is the message after its ID, without
the OPT record's options. The options (cookies, Client Subnet, padding...) differ per client, so
they are read on their own (`read_options`) and the reply's OPT record is spliced per query
(`splice_options`). Anything else is not a plain query and takes the full decoder.
"""

from __future__ import annotations

from struct import pack

from toposdns.wire.codes import CLIENT_SUBNET, COOKIE, EXPIRE, NSID, PADDING, TCP_KEEPALIVE
from toposdns.wire.decode import read_client_subnet, split_options

_ONE_QUESTION = b"\x00\x01\x00\x00\x00\x00\x00\x00"
_ONE_QUESTION_OPT = b"\x00\x01\x00\x00\x00\x00\x00\x01"
_ROOT_OPT = b"\x00\x00\x29"
#: EDNS options CoreDNS echoes back (request.SupportedOptions): NSID, EXPIRE, COOKIE,
#: TCP-KEEPALIVE and PADDING. Everything else, Client Subnet included, is dropped.
ECHOED_OPTIONS = frozenset({NSID, EXPIRE, COOKIE, TCP_KEEPALIVE, PADDING})


def split_query(data: bytes) -> tuple[bytes, bytes] | None:
    """(cache key, raw EDNS options) of a plain query, or None for any other message.

    The key is everything after the ID up to the OPT record's data length: flags, counts,
    question, and the OPT's buffer size and flags. None says nothing about validity: the full
    decoder decides what the message gets.
    """
    if len(data) < 17 or data[2] & 0xF8:  # a response, or an opcode other than QUERY
        return None
    counts = data[4:12]
    if counts != _ONE_QUESTION and counts != _ONE_QUESTION_OPT:
        return None
    end = 12
    length = data[12]
    while length:
        if length > 63:  # a compression pointer or an unknown label type
            return None
        end += length + 1
        if end > 266 or end >= len(data):  # names end within 255 octets
            return None
        length = data[end]
    end += 5  # the root label, qtype, qclass
    if counts == _ONE_QUESTION:
        return (data[2:], b"") if end == len(data) else None
    if data[end : end + 3] != _ROOT_OPT or end + 11 > len(data):
        return None
    rdlength = (data[end + 9] << 8) | data[end + 10]
    if end + 11 + rdlength != len(data):
        return None
    return data[2 : end + 9], data[end + 11 :]


def question_end(data: bytes, key: bytes) -> int:
    """Where the question of a plain query ends, read off its key: the key runs from the flags
    to the question's end, then, when there is an OPT record, through that record's 9 bytes
    before its data length."""
    return len(key) + 2 - (9 if data[11] else 0)


class EchoedOptions:
    """What a reply's OPT record carries for one query's options: the echoed options, and the
    Client Subnet option echoed with SCOPE 0 (`plain`) or with its source prefix (`scoped`,
    when the answer depended on it: RFC 7871 §7.2.2)."""

    __slots__ = ("plain", "scoped", "subnet")

    def __init__(self, plain: bytes, scoped: bytes, subnet: tuple[str, int] | None) -> None:
        self.plain = plain
        self.scoped = scoped
        #: (canonical address, source prefix) of the Client Subnet option, if any.
        self.subnet = subnet


NO_OPTIONS = EchoedOptions(b"", b"", None)


def read_options(options: bytes) -> EchoedOptions:
    """What a reply echoes of an OPT record's options; ValueError when they are malformed
    (FORMERR), as the full decoder reads them. Callers remember the result per options."""
    echoed = []
    subnet = None
    for code, value in split_options(options):
        if code in ECHOED_OPTIONS:
            echoed.append(pack("!HH", code, len(value)) + value)
        elif code == CLIENT_SUBNET:
            subnet = read_client_subnet(value)  # the last one counts
    plain = b"".join(echoed)
    if subnet is None:
        return EchoedOptions(plain, plain, None)
    head = pack(
        "!HHHB", CLIENT_SUBNET, 4 + len(subnet.raw_address), subnet.family, subnet.source_prefix
    )
    return EchoedOptions(
        plain + head + b"\x00" + subnet.raw_address,
        plain + head + bytes((subnet.source_prefix,)) + subnet.raw_address,
        (subnet.address, subnet.source_prefix),
    )


def splice_options(reply: bytes, rdata: bytes) -> bytes:
    """A reply whose OPT record, last in the message and empty, gets `rdata` as its options."""
    return reply[:-2] + pack("!H", len(rdata)) + rdata
