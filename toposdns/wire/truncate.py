"""Fit a reply to one query's size limit, as CoreDNS's `Scrub` (miekg/dns `Truncate`) does.

A reply is cached once, whole, for every buffer size; each query gets it cut to its own limit
here. A reply goes out uncompressed when it fits (and, over UDP, stays under the fragmentation
limit); else compressed; and when even that does not fit, cut after the last whole record that
does, with TC set, the question always kept and the OPT record last. Names are compressed by
pointing back at earlier ones only, so a compressed reply cut at a record boundary is the reply
the encoder writes for that limit (wire/encode.py), byte for byte.
"""

from __future__ import annotations

from struct import pack

from toposdns.wire.codes import OPT, TC
from toposdns.wire.decode import record_spans


def fit(
    whole: bytes, compressed: bytes | None, opt: bytes, limit: int, fragment: int
) -> bytes | None:
    """The reply for one query: `whole` (uncompressed) or `compressed`, both complete and ending
    in a cached OPT record (`opt` replaces it: the query's own) or in none (`opt` is b""),
    within `limit` bytes; `fragment` > 0 is the UDP fragmentation limit. Both forms start at
    the flags, without the ID: `limit` and `fragment` count the ID too. None when the reply
    needs the compressed form and there is none (the caller builds it anew)."""
    kept = len(opt) and 11  # the cached OPT record, without options
    size = len(whole) - kept + len(opt) + 2
    if size <= limit and (not fragment or size <= fragment):
        return whole[: len(whole) - kept] + opt if kept else whole
    if compressed is None:
        return None
    body = compressed[: len(compressed) - kept] if kept else compressed
    if len(body) + len(opt) + 2 <= limit:
        return body + opt
    return truncate(b"\x00\x00" + compressed, opt, limit)[2:]


def truncate(message: bytes, opt: bytes, limit: int) -> bytes:
    """A message cut after its last whole record that, with `opt` after it, fits in `limit`
    bytes (its own OPT record, if any, is left out); TC set and the section counts fixed."""
    spans = record_spans(message)
    budget = limit - len(opt)
    counts = [0, 0, 0]
    end = spans[0][0] if spans else len(message)  # the header and the question
    for _, _, stop, rtype, section in spans:
        if stop > budget or rtype == OPT:
            break
        counts[section] += 1
        end = stop
    header = message[:2] + bytes((message[2] | TC >> 8, message[3])) + message[4:6]
    counts[2] += 1 if opt else 0
    return header + pack("!3H", *counts) + message[12:end] + opt
