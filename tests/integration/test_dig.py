"""The running server asked with dig, as an operator would: records, flags and rcodes."""

from __future__ import annotations

import re

import pytest

from tests.integration.support import Dig, Server, StartServer, dig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def shared_server(both_frontends: Server) -> Server:
    """Every test here runs with each UDP frontend."""
    return both_frontends


ZONE_SOA = re.compile(
    r"^ns\.dns\.cluster\.local\. hostmaster\.cluster\.local\. \d+ 7200 1800 86400 5$"
)


def assert_positive(reply: Dig) -> None:
    """An authoritative answer as CoreDNS writes it: AA, no RA, no authority section."""
    assert reply.status == "NOERROR", reply.text
    assert "aa" in reply.flags and "qr" in reply.flags, reply.text
    assert "ra" not in reply.flags, reply.text
    assert reply.authority == [], reply.text


def assert_soa_authority(reply: Dig, zone: str = "cluster.local.") -> None:
    assert reply.answer == [], reply.text
    assert len(reply.authority) == 1, reply.text
    owner, ttl, klass, rtype, *rdata = reply.authority[0]
    assert (owner, ttl, klass, rtype) == (zone, "5", "IN", "SOA"), reply.text
    expected = ZONE_SOA.pattern.replace("cluster\\.local", re.escape(zone.rstrip(".")))
    assert re.match(expected, " ".join(rdata)), reply.text


def test_clusterip_a(shared_server: Server) -> None:
    reply = dig(shared_server, "frontend.shop.svc.cluster.local", "A")
    assert_positive(reply)
    assert reply.question == [["frontend.shop.svc.cluster.local.", "IN", "A"]]
    assert reply.answer == [["frontend.shop.svc.cluster.local.", "5", "IN", "A", "10.96.10.10"]]
    assert "(UDP)" in reply.server


def test_dual_stack_a_and_aaaa(shared_server: Server) -> None:
    a = dig(shared_server, "api.shop.svc.cluster.local", "A")
    aaaa = dig(shared_server, "api.shop.svc.cluster.local", "AAAA")
    assert_positive(a)
    assert_positive(aaaa)
    assert a.rdata("A") == ["10.96.10.20"] and a.rdata("AAAA") == []
    assert aaaa.rdata("AAAA") == ["fd00:10:96::20"] and aaaa.rdata("A") == []


def test_clusterip_without_v6_is_nodata(shared_server: Server) -> None:
    reply = dig(shared_server, "frontend.shop.svc.cluster.local", "AAAA")
    assert reply.status == "NOERROR" and "aa" in reply.flags
    assert_soa_authority(reply)


def test_headless_a_lists_ready_endpoints(shared_server: Server) -> None:
    web = dig(shared_server, "web.shop.svc.cluster.local", "A")
    assert_positive(web)
    assert sorted(web.rdata("A")) == ["10.244.1.10", "10.244.2.11"]
    workers = dig(shared_server, "workers.data.svc.cluster.local", "A")
    assert_positive(workers)
    # 10.244.3.7 is ready: false.
    assert sorted(workers.rdata("A")) == ["10.244.3.5", "10.244.3.6"]
    workers6 = dig(shared_server, "workers.data.svc.cluster.local", "AAAA")
    assert workers6.rdata("AAAA") == ["fd00:244::5"]


def test_endpoint_names(shared_server: Server) -> None:
    web0 = dig(shared_server, "web-0.web.shop.svc.cluster.local")
    assert_positive(web0)
    assert web0.answer == [["web-0.web.shop.svc.cluster.local.", "5", "IN", "A", "10.244.1.10"]]
    dashed = dig(shared_server, "10-244-3-6.workers.data.svc.cluster.local")
    assert_positive(dashed)
    assert dashed.rdata("A") == ["10.244.3.6"]
    # An endpoint that has a hostname is not reachable under its dashed IP.
    hidden = dig(shared_server, "10-244-1-10.web.shop.svc.cluster.local")
    assert hidden.status == "NXDOMAIN"
    assert_soa_authority(hidden)


def test_srv_with_additional_records(shared_server: Server) -> None:
    reply = dig(shared_server, "+additional", "_http._tcp.web.shop.svc.cluster.local", "SRV")
    assert_positive(reply)
    assert sorted(reply.rdata("SRV")) == [
        "0 50 80 web-0.web.shop.svc.cluster.local.",
        "0 50 80 web-1.web.shop.svc.cluster.local.",
    ]
    extra = sorted((rr[0], rr[3], rr[4]) for rr in reply.additional)
    assert extra == [
        ("web-0.web.shop.svc.cluster.local.", "A", "10.244.1.10"),
        ("web-1.web.shop.svc.cluster.local.", "A", "10.244.2.11"),
    ]


def test_srv_of_dual_stack_clusterip(shared_server: Server) -> None:
    reply = dig(shared_server, "+additional", "api.shop.svc.cluster.local", "SRV")
    assert_positive(reply)
    # Two entries (one per address) make one SRV of weight 50, with both addresses as glue.
    assert reply.rdata("SRV") == ["0 50 443 api.shop.svc.cluster.local."]
    extra = sorted((rr[0], rr[3], rr[4]) for rr in reply.additional)
    assert extra == [
        ("api.shop.svc.cluster.local.", "A", "10.96.10.20"),
        ("api.shop.svc.cluster.local.", "AAAA", "fd00:10:96::20"),
    ]


def test_srv_unknown_port_is_nxdomain(shared_server: Server) -> None:
    reply = dig(shared_server, "_grpc._udp.web.shop.svc.cluster.local", "SRV")
    assert reply.status == "NXDOMAIN" and "aa" in reply.flags
    assert_soa_authority(reply)


def test_ptr_of_endpoint_and_service(shared_server: Server) -> None:
    endpoint = dig(shared_server, "-x", "10.244.1.10")
    assert_positive(endpoint)
    assert endpoint.answer == [
        ["10.1.244.10.in-addr.arpa.", "5", "IN", "PTR", "web-0.web.shop.svc.cluster.local."]
    ]
    vip = dig(shared_server, "-x", "10.96.10.10")
    assert_positive(vip)
    assert vip.rdata("PTR") == ["frontend.shop.svc.cluster.local."]
    vip6 = dig(shared_server, "-x", "fd00:10:96::20")
    assert_positive(vip6)
    assert vip6.rdata("PTR") == ["api.shop.svc.cluster.local."]


def test_ptr_unknown_is_nxdomain_with_reverse_soa(shared_server: Server) -> None:
    reply = dig(shared_server, "-x", "10.1.2.3")
    assert reply.status == "NXDOMAIN" and "aa" in reply.flags
    assert_soa_authority(reply, zone="in-addr.arpa.")


def test_externalname_in_zone_is_chased(shared_server: Server) -> None:
    reply = dig(shared_server, "storefront.shop.svc.cluster.local", "A")
    assert_positive(reply)
    assert reply.answer == [
        [
            "storefront.shop.svc.cluster.local.",
            "5",
            "IN",
            "CNAME",
            "frontend.shop.svc.cluster.local.",
        ],
        ["frontend.shop.svc.cluster.local.", "5", "IN", "A", "10.96.10.10"],
    ]


def test_externalname_out_of_zone_is_a_lone_cname(shared_server: Server) -> None:
    reply = dig(shared_server, "payments.shop.svc.cluster.local", "A")
    assert_positive(reply)
    assert reply.answer == [
        ["payments.shop.svc.cluster.local.", "5", "IN", "CNAME", "api.payments.example.com."]
    ]
    txt = dig(shared_server, "payments.shop.svc.cluster.local", "TXT")
    assert txt.status == "NOERROR"
    assert_soa_authority(txt)  # NODATA, without the CNAME


def test_headless_without_ready_endpoints_is_nxdomain(shared_server: Server) -> None:
    for args in (("A",), ("AAAA",), ("SRV",)):
        reply = dig(shared_server, "idle.shop.svc.cluster.local", *args)
        assert reply.status == "NXDOMAIN", reply.text
        assert_soa_authority(reply)
    endpoint = dig(shared_server, "10-244-4-1.idle.shop.svc.cluster.local")
    assert endpoint.status == "NXDOMAIN"


def test_tcp(shared_server: Server) -> None:
    reply = dig(shared_server, "+tcp", "web.shop.svc.cluster.local", "A")
    assert_positive(reply)
    assert "(TCP)" in reply.server
    assert sorted(reply.rdata("A")) == ["10.244.1.10", "10.244.2.11"]


def test_udp_truncation_keeps_question_and_tcp_has_all(shared_server: Server) -> None:
    name = "big.data.svc.cluster.local"
    expected = sorted(f"10.244.100.{i}" for i in range(1, 61))
    cut = dig(shared_server, "+bufsize=512", "+ignore", name, "A")
    assert cut.status == "NOERROR"
    assert {"qr", "aa", "tc"} <= cut.flags, cut.text
    assert cut.question == [[f"{name}.", "IN", "A"]]
    assert 0 < len(cut.answer) < 60
    assert set(cut.rdata("A")) <= set(expected)
    assert "MSG SIZE  rcvd: " in cut.text
    size = int(re.search(r"MSG SIZE\s+rcvd: (\d+)", cut.text).group(1))  # type: ignore[union-attr]
    assert size <= 512
    full = dig(shared_server, "+tcp", name, "A")
    assert_positive(full)
    assert "tc" not in full.flags
    assert sorted(full.rdata("A")) == expected
    # Without +ignore, dig itself retries over TCP and gets everything.
    retried = dig(shared_server, "+bufsize=512", name, "A")
    assert "Truncated, retrying in TCP mode." in retried.text
    assert sorted(retried.rdata("A")) == expected


def test_nxdomain_has_soa_and_aa(shared_server: Server) -> None:
    reply = dig(shared_server, "nosuch.shop.svc.cluster.local", "A")
    assert reply.status == "NXDOMAIN"
    assert {"qr", "aa"} <= reply.flags and "ra" not in reply.flags
    assert_soa_authority(reply)
    namespace = dig(shared_server, "frontend.nosuchns.svc.cluster.local", "A")
    assert namespace.status == "NXDOMAIN"
    assert_soa_authority(namespace)


def test_outside_the_zone_is_refused(shared_server: Server) -> None:
    reply = dig(shared_server, "www.example.com", "A")
    assert reply.status == "REFUSED"
    assert reply.answer == [] and reply.authority == []
    assert "aa" not in reply.flags and "ra" not in reply.flags
    assert reply.question == [["www.example.com.", "IN", "A"]]


def test_never_recursion_available(shared_server: Server) -> None:
    for args in (
        ("frontend.shop.svc.cluster.local",),
        ("nosuch.shop.svc.cluster.local",),
        ("cluster.local", "SOA"),
        ("-x", "10.244.2.11"),
        ("www.example.com",),
    ):
        reply = dig(shared_server, *args)
        assert "qr" in reply.flags and "ra" not in reply.flags, reply.text
        assert "rd" in reply.flags  # RD is copied from the query


def test_norecurse_still_answered(shared_server: Server) -> None:
    reply = dig(shared_server, "+norecurse", "frontend.shop.svc.cluster.local", "A")
    assert_positive(reply)
    assert "rd" not in reply.flags
    assert reply.rdata("A") == ["10.96.10.10"]


def test_mixed_case_owner_keeps_case(shared_server: Server) -> None:
    reply = dig(shared_server, "Web-0.WEB.Shop.svc.Cluster.LOCAL", "A")
    assert_positive(reply)
    assert reply.question == [["Web-0.WEB.Shop.svc.Cluster.LOCAL.", "IN", "A"]]
    assert reply.answer == [["Web-0.WEB.Shop.svc.Cluster.LOCAL.", "5", "IN", "A", "10.244.1.10"]]
    # Negative answers use the zone as cased in the query.
    missing = dig(shared_server, "nosuch.shop.svc.Cluster.LOCAL", "A")
    assert missing.status == "NXDOMAIN"
    assert missing.authority[0][0] == "Cluster.LOCAL."
    assert missing.authority[0][4:6] == ["ns.dns.Cluster.LOCAL.", "hostmaster.Cluster.LOCAL."]


def test_cookie_is_echoed(shared_server: Server) -> None:
    reply = dig(shared_server, "frontend.shop.svc.cluster.local", "A")
    assert re.match(r"; COOKIE: [0-9a-f]{16} \(echoed\)$", reply.cookie), reply.text
    assert "version: 0" in reply.edns and "udp: 1232" in reply.edns
    plain = dig(shared_server, "+nocookie", "+noedns", "frontend.shop.svc.cluster.local", "A")
    assert plain.cookie == "" and plain.edns == ""
    assert plain.rdata("A") == ["10.96.10.10"]


def test_apex_soa_and_dns_version(shared_server: Server) -> None:
    soa = dig(shared_server, "cluster.local", "SOA")
    assert_positive(soa)
    assert len(soa.answer) == 1 and soa.answer[0][:4] == ["cluster.local.", "5", "IN", "SOA"]
    assert ZONE_SOA.match(" ".join(soa.answer[0][4:]))
    txt = dig(shared_server, "dns-version.cluster.local", "TXT")
    assert_positive(txt)
    assert txt.answer == [["dns-version.cluster.local.", "28800", "IN", "TXT", '"1.1.0"']]


def test_zonal_names_need_the_option(shared_server: Server, start_server: StartServer) -> None:
    pinned = "zone-a.pin._zone.web.shop.svc.cluster.local"
    assert dig(shared_server, pinned, "A").status == "NXDOMAIN"
    zonal = start_server("--zonal")
    reply = dig(zonal, pinned, "A")
    assert_positive(reply)
    assert reply.rdata("A") == ["10.244.1.10"]
    empty = dig(zonal, "zone-c.pin._zone.web.shop.svc.cluster.local", "A")
    assert empty.status == "NOERROR" and empty.answer == []
    preferred = dig(zonal, "zone-c.prefer._zone.web.shop.svc.cluster.local", "A")
    assert sorted(preferred.rdata("A")) == ["10.244.1.10", "10.244.2.11"]
