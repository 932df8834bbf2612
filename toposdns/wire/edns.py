"""The cheap first look at a query: its cache key, and what its EDNS options ask of the reply.

A plain query (one question with an uncompressed name, no other records but an optional OPT) is
answered from cached replies without being decoded: the key is the message after its ID, its
name in lower case, without the OPT record's buffer size and options. Letter case and buffer
size only change the bytes of a reply, never what it says, so they are not allowed to multiply
what is cached: the reply is cut to each query's buffer as it goes out (wire/encode.py `fit`). The
options (cookies, Client Subnet, padding...) differ per client, so they are read on their own
(`read_options`) and the reply's OPT record is written per query (`reply_opt`). Anything else
is not a plain query and takes the full decoder.
"""

from __future__ import annotations

from collections.abc import Iterable
from struct import pack

from toposdns.wire.codes import CLIENT_SUBNET, ECHOED_OPTIONS
from toposdns.wire.decode import read_client_subnet, split_options

#: The most bytes of options a reply echoes (each option with its code and length): what is
#: left of 512 bytes, the smallest UDP limit, after the header, the longest question (a
#: 255-octet name, type and class), the OPT record and the largest Client Subnet option it
#: echoes (an IPv6 /128). Within it, no reply's OPT record can take it past its limit however
#: large the query was; clients need far less (a cookie takes 44 bytes, a query padded to a
#: 128-byte block less than 128).
ECHOED_BYTES = 512 - 12 - (255 + 4) - 11 - (4 + 4 + 16)

_ONE_QUESTION = b"\x00\x01\x00\x00\x00\x00\x00\x00"
_ONE_QUESTION_OPT = b"\x00\x01\x00\x00\x00\x00\x00\x01"
_ROOT_OPT = b"\x00\x00\x29"


def split_query(data: bytes) -> tuple[bytes, bytes] | None:
    """(cache key, raw EDNS options) of a plain query, or None for any other message.

    The key is everything after the ID up to the OPT record's data length, but the buffer size:
    flags, counts, the question with its name in lower case, and the OPT's owner, type and flags
    (`plain_key` for a query without OPT). None says nothing about validity: the full decoder
    decides what the message gets.
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
        return (plain_key(data), b"") if end == len(data) else None
    if data[end : end + 3] != _ROOT_OPT or end + 11 > len(data):
        return None
    rdlength = (data[end + 9] << 8) | data[end + 10]
    if end + 11 + rdlength != len(data):
        return None
    key = data[2 : end - 4].lower() + data[end - 4 : end + 3] + data[end + 5 : end + 9]
    return key, data[end + 11 :]


def plain_key(data: bytes) -> bytes:
    """The cache key of a plain query without OPT record (`split_query`): the flags, counts and
    name, lower-cased, and the type and class. Of a plain query's flags and counts only the AD
    bit can change with that, and no reply depends on it; any other message gets a key no plain
    query has. For a name already in lower case it is the query's bytes after the ID, as they
    are: the UDP frontend looks those up first."""
    return data[2:-4].lower() + data[-4:]


def plain_question_end(data: bytes, key: bytes) -> int:
    """Where the question of a plain query ends, read off its key (`split_query` walked its
    name once; any other message: wire/decode.py `question_end`): the key runs from the flags
    to the question's end, then, when there is an OPT record, through that record's owner, type
    and flags (7 bytes)."""
    return len(key) + 2 - (7 if data[11] else 0)


def buffer_size(data: bytes, key: bytes) -> int:
    """The EDNS buffer size a plain query with an OPT record announces."""
    end = plain_question_end(data, key)
    return (data[end + 3] << 8) | data[end + 4]


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


def echoed(options: Iterable[tuple[int, bytes]]) -> bytes:
    """The options a reply echoes, as the OPT record's data: those of ECHOED_OPTIONS, in the
    order asked, each as it came (CoreDNS's `supportedOptions`), while they fit in
    `ECHOED_BYTES` together: one that would pass it is left out, as RFC 7830 leaves out padding
    that would pass the UDP payload size (Client Subnet is echoed on its own, with its
    scope)."""
    parts = []
    size = 0
    for code, value in options:
        if code in ECHOED_OPTIONS and size + 4 + len(value) <= ECHOED_BYTES:
            parts.append(pack("!HH", code, len(value)) + value)
            size += 4 + len(value)
    return b"".join(parts)


def read_options(options: bytes) -> EchoedOptions:
    """What a reply echoes of an OPT record's options; ValueError when they are malformed
    (FORMERR), as the full decoder reads them. Callers remember the result per options."""
    pairs = split_options(options)
    plain = echoed(pairs)
    subnet = None
    for code, value in pairs:
        if code == CLIENT_SUBNET:
            found = read_client_subnet(value)  # each checked: a malformed one is FORMERR
            # The first counts: the one a forwarder's `rewrite edns0 subnet set` overwrote;
            # a later one is the client's own.
            if subnet is None:
                subnet = found
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


def reply_opt(opt: bytes, size: int, rdata: bytes) -> bytes:
    """A reply's OPT record (`opt`: one without options, as cached) for one query: its buffer
    size `size` (CoreDNS echoes the query's) and `rdata` as its options."""
    return opt[:3] + pack("!H", size) + opt[5:9] + pack("!H", len(rdata)) + rdata
