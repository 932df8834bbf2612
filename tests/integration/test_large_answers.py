"""A service too large for one DNS message, asked of the real server: what CoreDNS gives (the
records that fit, TC set), never an internal error, and from the cache on repeat.

The tenant's slice: one EndpointSlice of 1,000 endpoints and 100 ports (within the API's
limits), 100,000 SRV records. And the mild, legitimate form: 1,000 endpoints with one port,
whose SRV reply is over 64 KiB uncompressed.
"""

from __future__ import annotations

import json
from pathlib import Path

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest

from tests.integration.support import StartServer, dig, metric_total, tcp, udp
from tests.objects import endpoint, endpoint_slice, namespace, service

pytestmark = pytest.mark.integration

BIG = "big.shop.svc.cluster.local."
WIDE = "wide.shop.svc.cluster.local."


def headless_service(name: str, endpoints: int, ports: int, octet: int) -> list[dict[str, object]]:
    listed = [{"name": f"p{j}", "port": 1000 + j, "protocol": "TCP"} for j in range(ports)]
    members = [endpoint(f"10.{octet}.{i >> 8}.{i & 255}") for i in range(1, endpoints + 1)]
    return [
        service(name, "shop", cluster_ip="None"),
        endpoint_slice(name, "shop", members, ports=listed),
    ]


def large_snapshot(directory: Path) -> Path:
    objects = [
        namespace("shop"),
        *headless_service("big", 1000, 100, 20),
        *headless_service("wide", 1000, 1, 21),
    ]
    path = directory / "large.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


def srv_records(reply: dns.message.Message, section: str = "answer") -> int:
    return sum(len(rrset) for rrset in getattr(reply, section) if rrset.rdtype == dns.rdatatype.SRV)


def test_a_service_too_large_for_a_message_is_cut_as_coredns_cuts_it_and_cached(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = start_server("--http", "127.0.0.1:0", snapshot=large_snapshot(tmp_path))
    http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
    query = dns.message.make_query(BIG, "SRV", use_edns=0, payload=1232)

    # Over UDP: the SRV records that fit 1,232 bytes, TC set. Asked again: from the cache.
    replies = []
    for _ in range(2):
        hits = metric_total(http, "coredns_cache_hits_total")
        replies.append(udp(server, query))
    first, again = replies
    for reply in replies:
        assert reply.rcode() == dns.rcode.NOERROR and reply.flags & dns.flags.TC
        assert 10 < srv_records(reply) < 40
    assert first.answer == again.answer
    assert metric_total(http, "coredns_cache_hits_total") == hits + 1

    # Over TCP: the 64 KiB that fit, TC still set (no message holds the rest), a cache hit.
    reply = tcp(server, query)
    assert reply.rcode() == dns.rcode.NOERROR and reply.flags & dns.flags.TC
    assert 1000 < srv_records(reply) < 2000 and len(reply.to_wire()) > 60_000
    assert metric_total(http, "coredns_cache_hits_total") == hits + 2

    # dig sees the same, over UDP (not retrying over TCP) and TCP.
    for transport, low, high in (("+ignore", 10, 40), ("+tcp", 1000, 2000)):
        seen = dig(server, transport, "+bufsize=1232", BIG, "SRV")
        assert seen.status == "NOERROR" and "tc" in seen.flags, seen.text
        assert low < len(seen.rdata("SRV")) < high

    assert metric_total(http, "coredns_panics_total") == 0
    log = server.log()
    assert "Traceback" not in log and "internal error" not in log, log


def test_a_thousand_endpoint_service_is_a_hit_on_repeat(
    start_server: StartServer, tmp_path: Path
) -> None:
    server = start_server("--http", "127.0.0.1:0", snapshot=large_snapshot(tmp_path))
    http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
    query = dns.message.make_query(WIDE, "SRV", use_edns=0, payload=1232)
    # 130 KB uncompressed, 83 KB compressed: every SRV record, then the addresses that fit.
    whole = tcp(server, query)
    assert whole.rcode() == dns.rcode.NOERROR and whole.flags & dns.flags.TC
    assert srv_records(whole) == 1000 and 0 < len(whole.additional) < 1000
    hits = metric_total(http, "coredns_cache_hits_total")
    assert tcp(server, query).answer == whole.answer
    cut = udp(server, query)
    assert cut.flags & dns.flags.TC and 0 < srv_records(cut) < 40
    assert metric_total(http, "coredns_cache_hits_total") == hits + 2
