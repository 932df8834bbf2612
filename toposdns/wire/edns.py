"""The cheap first look at a query: its cache key, and what its EDNS options ask of the reply.

A plain query (one question with an uncompressed name, no other records but an optional OPT) is
answered from cached replies without being decoded: the key is the message after its ID, without
the OPT record's options. The options (cookies, Client Subnet, padding...) differ per client, so
they are read on their own (`read_options`) and the reply's OPT record is spliced per query
(`splice_options`). Anything else is not a plain query and takes the full decoder.
"""

from __future__ import annotations

import ipaddress
from socket import AF_INET, AF_INET6, inet_ntop
from struct import error as StructError
from struct import pack, unpack_from

from toposdns.wire.codes import CLIENT_SUBNET, COOKIE, EXPIRE, NSID, PADDING, TCP_KEEPALIVE

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
    """Read the OPT record's options; ValueError when they are malformed (FORMERR)."""
    try:
        return _read_options(options)
    except StructError:
        raise ValueError("EDNS option shorter than its header") from None


def _read_options(options: bytes) -> EchoedOptions:
    echoed = []
    subnet = None
    offset = 0
    while offset < len(options):
        code, length = unpack_from("!HH", options, offset)
        value = options[offset + 4 : offset + 4 + length]
        if len(value) != length:
            raise ValueError("EDNS option runs past the end of the OPT record")
        if code in ECHOED_OPTIONS:
            echoed.append(options[offset : offset + 4 + length])
        elif code == CLIENT_SUBNET:
            subnet = value  # the last one counts, as the full decoder reads them
            check_client_subnet(value)
        offset += 4 + length
    plain = b"".join(echoed)
    if subnet is None:
        return EchoedOptions(plain, plain, None)
    family, source_prefix = unpack_from("!HB", subnet)
    raw = subnet[4:]
    head = pack("!HHHB", CLIENT_SUBNET, len(subnet), family, source_prefix)
    address = subnet_address(family, raw)
    return EchoedOptions(
        plain + head + b"\x00" + raw,
        plain + head + bytes((source_prefix,)) + raw,
        (address, source_prefix),
    )


def check_client_subnet(value: bytes) -> None:
    """ValueError for what RFC 7871 §7.1.1 answers with FORMERR."""
    family, source_prefix, scope_prefix = unpack_from("!HBB", value)
    if family not in (1, 2):
        raise ValueError(f"ECS family {family} is neither IPv4 (1) nor IPv6 (2)")
    raw = value[4:]
    if source_prefix > (32 if family == 1 else 128) or scope_prefix != 0:
        raise ValueError("ECS prefix lengths out of range")
    if len(raw) != (source_prefix + 7) // 8:
        raise ValueError("ECS address longer or shorter than its source prefix")
    if raw and source_prefix % 8 and raw[-1] & (0xFF >> (source_prefix % 8)):
        raise ValueError("ECS address has bits set past its source prefix")


def subnet_address(family: int, raw: bytes) -> str:
    """The canonical text of a Client Subnet address (zero-padded), as the locators key it."""
    if family == 1:
        return inet_ntop(AF_INET, raw + bytes(4 - len(raw)))
    padded = raw + bytes(16 - len(raw))
    text = inet_ntop(AF_INET6, padded)
    # inet_ntop writes IPv4-mapped addresses with a dotted tail; ipaddress does not.
    return str(ipaddress.IPv6Address(padded)) if "." in text else text


def splice_options(reply: bytes, rdata: bytes) -> bytes:
    """A reply whose OPT record, last in the message and empty, gets `rdata` as its options."""
    return reply[:-2] + pack("!H", len(rdata)) + rdata
