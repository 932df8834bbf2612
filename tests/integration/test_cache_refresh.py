"""The forward cache's `prefetch` and `serve_stale` through a real server, from a Corefile: a
name stays answered from the stale cache while its upstream does not answer (at once, or after
`verify` asked first), in the kubernetes block and in a stub domain's block; a popular name is
asked again before it expires, so that clients never wait for it; both counted on /metrics."""

from __future__ import annotations

import time
from pathlib import Path

import dns.flags
import dns.message
import dns.query
import dns.rcode
import pytest

from tests.integration.support import ask_port as ask
from tests.integration.support import (
    copy_snapshot,
    free_ports,
    metric_total,
    rrset_texts,
    wait_until,
)
from tests.integration.support import serve_corefile as serve
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

MAIN = {("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"]}
STUB = {("web.consul.local", "A"): ["web.consul.local. 300 IN A 192.0.2.53"]}


def addresses(reply: dns.message.Message) -> list[str]:
    return [rr.to_text() for rrset in reply.answer for rr in rrset]


def test_a_name_is_answered_from_the_stale_cache_while_its_upstream_is_down(
    tmp_path: Path,
) -> None:
    snapshot = copy_snapshot(tmp_path)
    ports = free_ports("dns", "metrics")
    port = ports["dns"]
    with stub_upstream(dict(MAIN)) as main, stub_upstream(STUB) as stub:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    prometheus 127.0.0.1:{ports["metrics"]}
    forward . 127.0.0.1:{main.port}
    cache 2 {{
        serve_stale 1h immediate
    }}
    toposdns {{
        snapshot {snapshot}
    }}
}}
consul.local:{port} {{
    forward . 127.0.0.1:{stub.port}
    cache 2 {{
        serve_stale 1h verify 300ms
    }}
}}
""",
        )
        try:
            assert rrset_texts(ask(port, "www.example.test").answer) == {
                "www.example.test. 2 IN A 192.0.2.10"
            }
            assert rrset_texts(ask(port, "web.consul.local").answer) == {
                "web.consul.local. 2 IN A 192.0.2.53"
            }
            main.mode = stub.mode = "silent"
            time.sleep(2.5)  # both expired
            for _ in range(2):
                # Expired, the upstreams silent: the stale answers, with TTL 0.
                assert rrset_texts(ask(port, "www.example.test").answer) == {
                    "www.example.test. 0 IN A 192.0.2.10"
                }
                assert rrset_texts(ask(port, "web.consul.local").answer) == {
                    "web.consul.local. 0 IN A 192.0.2.53"
                }
            # Each stale answer went with a refresh that the silent upstreams did not answer.
            assert main.names().count("www.example.test") >= 2
            assert stub.names().count("web.consul.local") >= 2
            # The cluster's own names are answered as ever.
            assert ask(port, "frontend.shop.svc.cluster.local").answer
            assert metric_total(ports["metrics"], "coredns_cache_served_stale_total") == 4
            # The upstream is back: the refresh in the background replaces the stale answer.
            main.mode = "answer"
            main.records[("www.example.test", "A")] = ["www.example.test. 300 IN A 192.0.2.11"]
            assert wait_until(
                lambda: addresses(ask(port, "www.example.test")) == ["192.0.2.11"], timeout=10
            ), server.log()
            assert "Traceback" not in server.log()
        finally:
            assert server.stop() == 0, server.log()


def test_a_popular_name_is_prefetched_before_it_expires(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    ports = free_ports("dns", "metrics")
    port = ports["dns"]
    with stub_upstream(dict(MAIN)) as main:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    prometheus 127.0.0.1:{ports["metrics"]}
    forward . 127.0.0.1:{main.port}
    cache 10 {{
        prefetch 1 1m 90%
    }}
    toposdns {{
        snapshot {snapshot}
    }}
}}
""",
        )
        try:
            started = time.monotonic()
            first = ask(port, "www.example.test")
            assert addresses(first) == ["192.0.2.10"] and not first.flags & dns.flags.AA
            main.records[("www.example.test", "A")] = ["www.example.test. 300 IN A 192.0.2.11"]
            time.sleep(1.5)
            # Asked with 9 s of its 10 left: answered from the cache (AA), and asked upstream
            # again in the background.
            hit = ask(port, "www.example.test")
            assert addresses(hit) == ["192.0.2.10"] and hit.flags & dns.flags.AA
            assert hit.answer[0].ttl <= 9
            assert wait_until(lambda: main.names().count("www.example.test") == 2, timeout=5)
            # The cache holds the new answer before the first one expires; clients never
            # waited for it.
            refreshed = ask(port, "www.example.test")
            assert time.monotonic() - started < 10, "too slow to see it before it expires"
            assert addresses(refreshed) == ["192.0.2.11"] and refreshed.flags & dns.flags.AA
            assert metric_total(ports["metrics"], "coredns_cache_prefetch_total") >= 1
            assert ask(port, "frontend.shop.svc.cluster.local").rcode() == dns.rcode.NOERROR
        finally:
            assert server.stop() == 0, server.log()
