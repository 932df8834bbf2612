"""Forwarding names outside the zones to an upstream: relay, cache with TTLs, timeouts and
failover, TC over UDP retried over TCP, ExternalName targets; and the metrics that count it."""

from __future__ import annotations

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import StartServer, dig
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

EXAMPLE = {
    ("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"],
    ("api.payments.example.com", "A"): ["api.payments.example.com. 60 IN A 192.0.2.20"],
    ("big.example.test", "A"): [f"big.example.test. 300 IN A 192.0.2.{i}" for i in range(1, 60)],
}


def test_relays_and_caches_with_ttls_counting_down(start_server: StartServer) -> None:
    with stub_upstream(EXAMPLE) as upstream:
        server = start_server("--upstream", f"127.0.0.1:{upstream.port}")
        first = dig(server, "www.example.test")
        assert first.status == "NOERROR" and first.rdata("A") == ["192.0.2.10"]
        assert "aa" not in first.flags and "ra" in first.flags  # the upstream's own flags
        assert first.answer[0][1] == "300"
        time.sleep(1.1)
        second = dig(server, "www.example.test")
        assert second.rdata("A") == ["192.0.2.10"] and int(second.answer[0][1]) < 300
        missing = dig(server, "nowhere.example.test")
        assert missing.status == "NXDOMAIN" and [rr[3] for rr in missing.authority] == ["SOA"]
        dig(server, "nowhere.example.test")
        assert [q[1] for q in upstream.queries].count("www.example.test") == 1
        assert [q[1] for q in upstream.queries].count("nowhere.example.test") == 1
        # Cluster names are still answered here, never forwarded.
        assert dig(server, "web.shop.svc.cluster.local", "+short").text.strip()
        assert all("cluster.local" not in q[1] for q in upstream.queries)


def test_a_silent_upstream_times_out_and_the_next_one_answers(start_server: StartServer) -> None:
    with stub_upstream(EXAMPLE, mode="silent") as silent, stub_upstream(EXAMPLE) as good:
        alone = start_server("--upstream", f"127.0.0.1:{silent.port}")
        started = time.monotonic()
        assert dig(alone, "www.example.test", "+time=8").status == "SERVFAIL"
        # Two tries of 2 s each, as CoreDNS's forward (read timeout 2 s, twice the upstreams).
        assert 3.5 < time.monotonic() - started < 6

        both = start_server("--upstream", f"127.0.0.1:{silent.port},127.0.0.1:{good.port}")
        # Upstreams are tried in random order; a new name each time misses the cache. Once the
        # silent one has failed twice it is marked down and only probed in the background.
        for i in range(40):
            out = dig(both, f"n{i}.example.test", "+time=6")
            assert out.status == "NXDOMAIN", out.text  # the good upstream's answer
            if "is unhealthy" in both.log():
                break
        both.wait_for_log(rf"upstream 127\.0\.0\.1:{silent.port} is unhealthy", timeout=1)
        started = time.monotonic()
        for i in range(5):
            assert dig(both, f"m{i}.example.test").status == "NXDOMAIN"
        assert time.monotonic() - started < 2  # no more 2 s waits on the silent upstream


def test_truncated_udp_is_retried_over_tcp(start_server: StartServer) -> None:
    with stub_upstream(EXAMPLE, mode="truncate") as upstream:
        server = start_server("--upstream", f"127.0.0.1:{upstream.port}")
        whole = dig(server, "big.example.test", "+bufsize=4096", "+ignore")
        assert "tc" not in whole.flags and len(whole.rdata("A")) == 59
        assert [q[0] for q in upstream.queries if q[1] == "big.example.test"] == ["udp", "tcp"]


def test_a_large_answer_is_cut_to_each_clients_buffer_and_fetched_once(
    start_server: StartServer,
) -> None:
    """80 A records (1,314 bytes) from an upstream that, as BIND and unbound do, answers a UDP
    query too large for its buffer with TC and no records."""
    records = [f"large.example.test. 300 IN A 192.0.2.{i}" for i in range(1, 81)]
    with stub_upstream({("large.example.test", "A"): records}) as upstream:
        server = start_server("--upstream", f"127.0.0.1:{upstream.port}")

        def asked() -> list[tuple[str, int]]:
            return [
                (proto, size)
                for (proto, name, _), size in zip(
                    upstream.queries, upstream.buffer_sizes, strict=False
                )
                if name == "large.example.test"
            ]

        # As many whole records as fit in 512 bytes (header and question: 34; 16 each), TC set.
        plain = dig(server, "large.example.test", "+noedns", "+ignore")
        assert plain.status == "NOERROR" and "tc" in plain.flags
        assert plain.rdata("A") == [f"192.0.2.{i}" for i in range(1, 30)]
        # Asked with a 1232-byte buffer, truncated, fetched whole over TCP once.
        assert asked() == [("udp", 1232), ("tcp", 1232)]
        again = dig(server, "large.example.test", "+noedns", "+ignore")
        assert "tc" in again.flags and len(again.answer) == 29
        flag_day = dig(server, "large.example.test", "+bufsize=1232", "+nocookie", "+ignore")
        assert "tc" in flag_day.flags and len(flag_day.answer) == 74  # its OPT takes 11 bytes
        retry = dig(server, "large.example.test", "+tcp")
        assert "tc" not in retry.flags and retry.rdata("A") == [r.split()[-1] for r in records]
        assert asked() == [("udp", 1232), ("tcp", 1232)]  # the rest came from the cache


def test_externalname_target_outside_the_zone_is_chased(start_server: StartServer) -> None:
    with stub_upstream(EXAMPLE) as upstream:
        server = start_server("--upstream", f"127.0.0.1:{upstream.port}")
        out = dig(server, "payments.shop.svc.cluster.local")
        assert out.status == "NOERROR" and "aa" in out.flags
        assert [rr[3] for rr in out.answer] == ["CNAME", "A"]
        assert out.answer[1][4] == "192.0.2.20" and out.answer[1][1] == "60"
        assert ("udp", "api.payments.example.com", "A") in upstream.queries


def test_externalname_targets_go_upstream_only_for_sources_in_forward_allow(
    start_server: StartServer,
) -> None:
    """Outside --forward-allow an ExternalName is its CNAME alone, as from CoreDNS with an `acl`
    block refusing the target to that client: its upstream lookup goes through the plugins
    again, with the client's address. Not fetched for it, nor taken from the forward cache."""
    name = "payments.shop.svc.cluster.local"
    target = "api.payments.example.com"
    with stub_upstream(EXAMPLE) as upstream:
        server = start_server(
            "--upstream", f"127.0.0.1:{upstream.port}", "--forward-allow", "127.0.0.1/32"
        )

        def cname_alone(*args: str) -> None:
            out = dig(server, "-b", "127.0.0.2", name, *args)
            assert out.status == "NOERROR" and "aa" in out.flags, out.text
            assert [(rr[3], rr[4]) for rr in out.answer] == [("CNAME", f"{target}.")], out.text

        for transport in ("+notcp", "+tcp"):
            cname_alone(transport)
        assert target not in upstream.names()
        assert dig(server, "-b", "127.0.0.2", target).status == "REFUSED"
        inside = dig(server, name)  # from 127.0.0.1
        assert [rr[3] for rr in inside.answer] == ["CNAME", "A"]
        # Cached upstream now: still the CNAME alone outside, and no more upstream queries.
        for transport in ("+notcp", "+tcp"):
            cname_alone(transport)
        assert dig(server, name).rdata("A") == ["192.0.2.20"]
        assert upstream.names().count(target) == 1


def test_metrics_count_queries_by_type_rcode_and_plugin(start_server: StartServer) -> None:
    with stub_upstream(EXAMPLE) as upstream:
        server = start_server("--upstream", f"127.0.0.1:{upstream.port}", "--http", "127.0.0.1:0")
        http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
        for _ in range(5):
            dig(server, "web.shop.svc.cluster.local")  # answered, then from the wire cache
        for _ in range(3):
            dig(server, "nothing.shop.svc.cluster.local", "+tcp")
        dig(server, "www.example.test")
        dig(server, "web.shop.svc.cluster.local", "SRV")
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=2) as response:
            text = response.read().decode()
        samples = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        base = {"server": f"dns://127.0.0.1:{server.port}", "zone": ".", "view": ""}

        def value(name: str, **labels: str) -> float:
            key = (name, tuple(sorted({**base, **labels}.items())))
            assert key in samples, f"no {key} in:\n{text}"
            return samples[key]

        requests = "coredns_dns_requests_total"
        assert value(requests, proto="udp", family="1", type="A") == 6
        assert value(requests, proto="tcp", family="1", type="A") == 3
        assert value(requests, proto="udp", family="1", type="SRV") == 1
        responses = "coredns_dns_responses_total"
        assert value(responses, rcode="NOERROR", plugin="kubernetes") == 6
        assert value(responses, rcode="NXDOMAIN", plugin="kubernetes") == 3
        assert value(responses, rcode="NOERROR", plugin="forward") == 1
        assert value("coredns_dns_request_duration_seconds_count") == 10
        assert value("coredns_dns_request_duration_seconds_bucket", le="+Inf") == 10
        assert value("coredns_dns_request_size_bytes_count", proto="tcp") == 3
        assert value("coredns_dns_response_size_bytes_count", proto="udp") == 7
        proxy = {"proxy_name": "forward", "to": f"127.0.0.1:{upstream.port}", "rcode": "NOERROR"}
        key = ("coredns_proxy_request_duration_seconds_count", tuple(sorted(proxy.items())))
        assert samples[key] == 1
        labels = (("server", f"dns://127.0.0.1:{server.port}"), ("view", ""), ("zones", "."))
        # The cache sees every query: the first of each name a miss, the rest hits.
        assert samples[("coredns_cache_requests_total", labels)] == 10
        assert samples[("coredns_cache_misses_total", labels)] == 4
        hits = {"success": 4, "denial": 2}
        for kind, count in hits.items():
            key = ("coredns_cache_hits_total", tuple(sorted((*labels, ("type", kind)))))
            assert samples[key] == count
