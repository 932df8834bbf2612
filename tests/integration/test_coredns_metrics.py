"""CoreDNS's own series on /metrics, with CoreDNS's names, types and label names, after traffic:
the server watching the stand-in API, forwarding to one upstream that answers and one that
sends garbage, in one process and as a supervisor of two workers."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rcode
import pytest
from prometheus_client import Metric
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.support import (
    STOP_TIMEOUT,
    CorefileServer,
    Server,
    copy_snapshot,
    dig,
    free_ports,
    http_get,
    wait_until,
)
from tests.kubeapi import FakeApiServer
from tests.objects import endpoint_slice, service
from tests.upstream import stub_upstream
from toposdns import REVISION_VARIABLE

pytestmark = pytest.mark.integration

#: Family, type and label names, as CoreDNS 1.14 exports them (plugin/metrics/vars/vars.go,
#: plugin/cache/metrics.go, plugin/pkg/proxy/metrics.go, plugin/reload/metrics.go,
#: plugin/kubernetes/object/metrics.go). Counter families are named without `_total`.
COREDNS_SERIES = [
    ("coredns_build_info", "gauge", {"version", "revision", "goversion"}),
    ("coredns_panics", "counter", set()),
    ("coredns_plugin_enabled", "gauge", {"server", "zone", "view", "name"}),
    ("coredns_dns_requests", "counter", {"server", "zone", "view", "proto", "family", "type"}),
    ("coredns_dns_responses", "counter", {"server", "zone", "view", "rcode", "plugin"}),
    ("coredns_dns_request_duration_seconds", "histogram", {"server", "zone", "view"}),
    ("coredns_cache_entries", "gauge", {"server", "type", "zones", "view"}),
    ("coredns_cache_requests", "counter", {"server", "zones", "view"}),
    ("coredns_cache_hits", "counter", {"server", "type", "zones", "view"}),
    ("coredns_cache_misses", "counter", {"server", "zones", "view"}),
    ("coredns_cache_prefetch", "counter", {"server", "zones", "view"}),
    ("coredns_cache_served_stale", "counter", {"server", "zones", "view"}),
    ("coredns_cache_evictions", "counter", {"server", "type", "zones", "view"}),
    ("coredns_proxy_request_duration_seconds", "histogram", {"proxy_name", "to", "rcode"}),
    ("coredns_proxy_healthcheck_failures", "counter", {"proxy_name", "to"}),
    ("coredns_reload_failed", "counter", set()),
    ("coredns_kubernetes_dns_programming_duration_seconds", "histogram", {"service_kind"}),
]
TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"
#: Names forwarded once each: the garbage upstream is tried for one of them but once in 2**10.
FORWARDED_ONCE = 10
#: The git commit an image build passes in (any 40 hex digits).
REVISION = "0123456789abcdef0123456789abcdef01234567"
UPSTREAM = {("www.example.test", "A"): ["www.example.test. 300 IN A 192.0.2.10"]}
#: A service of the snapshot file (tests/integration/snapshot.yaml).
CLUSTER_NAME = "frontend.shop.svc.cluster.local"


def triggered_slice(name: str, service_name: str, ip: str, triggered: float) -> dict[str, Any]:
    """An EndpointSlice as the endpoint controller writes it, with its trigger time."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(triggered))
    return endpoint_slice(
        service_name,
        endpoints=[{"addresses": [ip], "conditions": {"ready": True}}],
        name=name,
        annotations={TRIGGER_TIME: f"{stamp}.{int(triggered % 1 * 1e9):09d}Z"},
    )


def scrape(port: int) -> dict[str, Metric]:
    status, text = http_get(port, "/metrics")
    assert status == 200
    return {family.name: family for family in text_string_to_metric_families(text)}


def traffic(server: Server) -> None:
    """Queries of each kind: answered from the zones, denied, forwarded three times (then
    cached), and ten other names forwarded once each (so both upstreams get some)."""
    for _ in range(3):
        assert dig(server, "web.shop.svc.cluster.local").status == "NOERROR"
        assert dig(server, "nothing.shop.svc.cluster.local").status == "NXDOMAIN"
        assert dig(server, "www.example.test").status == "NOERROR"
    for i in range(FORWARDED_ONCE):
        dig(server, f"n{i}.example.test")


@pytest.fixture(params=["1", "2"], ids=["single", "workers"])
def running(
    request: pytest.FixtureRequest, api: FakeApiServer, tmp_path: Path
) -> Iterator[tuple[Server, int, FakeApiServer]]:
    """A server on the stand-in API with two upstreams, and its metrics port."""
    api.add(service("db", cluster_ip="None"))
    with stub_upstream(UPSTREAM) as good, stub_upstream(UPSTREAM, mode="garbage") as bad:
        upstreams = f"127.0.0.1:{good.port},127.0.0.1:{bad.port}"
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        server = Server(
            None,
            (
                "--kubeconfig",
                str(kubeconfig),
                "--http",
                "127.0.0.1:0",
                "--upstream",
                upstreams,
                "--loadbalance",
                "--workers",
                request.param,
            ),
            wrapper=("env", f"{REVISION_VARIABLE}={REVISION}"),  # as the image sets it
        )
        try:
            server.wait_ready(30)  # connecting to the API takes a while on a loaded machine
            http = int(server.wait_for_log(r"/metrics on 127\.0\.0\.1:(\d+)").group(1))
            yield server, http, api
        finally:
            assert server.stop(STOP_TIMEOUT) == 0, server.log()


def test_coredns_series_are_present_with_their_labels(
    running: tuple[Server, int, FakeApiServer],
) -> None:
    server, http, api = running
    api.wait_for_watches(4)
    api.add(triggered_slice("db-a", "db", "10.1.0.7", time.time() - 0.5))
    api.add(triggered_slice("web-a", "web", "10.1.0.8", time.time() - 0.5))
    asked = []  # the queries sent, all of which the cache counts

    def db_answers() -> bool:
        asked.append("db")
        return bool(dig(server, "db.shop.svc.cluster.local", "+short").text)

    assert wait_until(db_answers, 5)
    traffic(server)
    # The garbage upstream fails its queries, then its health checks.
    name = "coredns_proxy_healthcheck_failures"
    assert wait_until(lambda: name in scrape(http) and scrape(http)[name].samples, 10)

    families = scrape(http)
    for family_name, kind, labels in COREDNS_SERIES:
        assert family_name in families, f"{family_name} is missing"
        family = families[family_name]
        assert family.type == kind, family_name
        assert family.samples, f"{family_name} has no samples"
        for sample in family.samples:
            names = set(sample.labels) - {"le"}
            assert names == labels, f"{sample.name}: labels {sorted(names)}"

    def value(family_name: str, **labels: str) -> float:
        return sum(
            s.value
            for s in families[family_name].samples
            if s.name in (family_name, f"{family_name}_total", f"{family_name}_count")
            and labels.items() <= s.labels.items()
        )

    server_label = f"dns://127.0.0.1:{server.port}"  # `--listen`, as `bind`
    assert value("coredns_build_info") == 1  # once, whatever the number of workers
    (info,) = families["coredns_build_info"].samples
    assert info.labels["revision"] == REVISION  # the image's build argument
    enabled = {s.labels["name"] for s in families["coredns_plugin_enabled"].samples}
    assert enabled == {
        "errors",
        "kubernetes",
        "prometheus",
        "forward",
        "cache",
        "loop",
        "loadbalance",
    }
    assert all(
        (s.labels["server"], s.labels["zone"], s.value) == (server_label, ".", 1)
        for s in families["coredns_plugin_enabled"].samples
    )
    # Every query goes through the cache, as through a `cache` in front of kubernetes and
    # forward: web, nothing and www.example.test each a miss, then two hits (with workers each
    # has its own cache: a miss in each that gets it first), the other forwarded names misses.
    cache = {"server": server_label, "zones": ".", "view": ""}
    success = value("coredns_cache_hits", type="success", **cache)
    denial = value("coredns_cache_hits", type="denial", **cache)
    misses = value("coredns_cache_misses", **cache)
    sent = len(asked) + 9 + FORWARDED_ONCE
    assert value("coredns_cache_requests", **cache) == success + denial + misses == sent
    if server.args[-1] == "1":
        assert success >= 4 and denial >= 2  # and db's, as its slice arrived
    else:
        assert success >= 2 and denial >= 1
    assert value("coredns_cache_entries", type="success", **cache) >= 2
    assert value("coredns_cache_entries", type="denial", **cache) >= 1
    assert value("coredns_proxy_request_duration_seconds", rcode="NOERROR") >= 1
    assert value("coredns_panics") == 0 and value("coredns_reload_failed") == 0
    # Both slices were triggered half a second before they arrived.
    programming = "coredns_kubernetes_dns_programming_duration_seconds"
    sums = {
        s.labels["service_kind"]: s.value
        for s in families[programming].samples
        if s.name == f"{programming}_sum"
    }
    for kind in ("headless_with_selector", "cluster_ip"):
        assert value(programming, service_kind=kind) == 1
        assert 0.4 < sums[kind] < 30, (kind, sums)


def blocks_corefile(tmp_path: Path, ports: dict[str, int], upstreams: list[int]) -> Path:
    """Two server blocks on one port (the kubernetes block's `.` and a stub domain with a
    template before its cache and forward) and one block on another port with `bind`, every
    block with `prometheus`."""
    snapshot = copy_snapshot(tmp_path)
    (tmp_path / "hosts").write_text("192.0.2.50 www.example.org\n")
    one, two, metrics = ports["one"], ports["two"], ports["metrics"]
    path = tmp_path / "Corefile"
    path.write_text(
        f""".:{one} {{
    bind 127.0.0.1
    kubernetes cluster.local
    prometheus 127.0.0.1:{metrics}
    cache 30
    forward . 127.0.0.1:{upstreams[0]}
    toposdns {{
        snapshot {snapshot}
        workers {ports["workers"]}
    }}
}}
consul.local:{one} {{
    prometheus 127.0.0.1:{metrics}
    template IN A consul.local {{
        match "^tpl[.]consul[.]local[.]$"
        answer "{{{{ .Name }}}} 60 IN A 192.0.2.60"
        fallthrough
    }}
    cache 30
    forward . 127.0.0.1:{upstreams[1]}
}}
example.org:{two} {{
    bind 127.0.0.1
    prometheus 127.0.0.1:{metrics}
    hosts {tmp_path / "hosts"} {{
        fallthrough
    }}
    forward . 127.0.0.1:{upstreams[1]}
}}
"""
    )
    return path


def ask_with(port: int, name: str, do: bool) -> dns.message.Message:
    """A query to 127.0.0.1:`port` over UDP, its DO bit set or not."""
    query = dns.message.make_query(name, "A", want_dnssec=do)
    return dns.query.udp(query, "127.0.0.1", port=port, timeout=3.0)


@pytest.mark.parametrize("workers", [1, 2])
def test_each_series_carries_its_server_and_zone(tmp_path: Path, workers: int) -> None:
    # As CoreDNS labels them: `server` is the address of the server (dns://ADDR:PORT with
    # `bind`), `zone` the zone of the block the query was routed by, `dropped` for a name no
    # block of the port holds; queries with the DO bit set are counted apart, per zone.
    ports = free_ports("one", "two", "metrics")
    one, two = ports["one"], ports["two"]
    records = {
        ("example.com", "A"): ["example.com. 300 IN A 192.0.2.1"],
        ("web.consul.local", "A"): ["web.consul.local. 60 IN A 192.0.2.53"],
        ("mail.example.org", "A"): ["mail.example.org. 60 IN A 192.0.2.25"],
    }
    with stub_upstream(records) as main, stub_upstream(records) as stub:
        path = blocks_corefile(tmp_path, {**ports, "workers": workers}, [main.port, stub.port])
        server = CorefileServer(path)
        try:
            server.wait_ready(30)
            asked: Counter[tuple[int, str]] = Counter()
            flagged: Counter[tuple[int, str]] = Counter()
            for round in range(4):
                do = bool(round % 2)
                for port, name, zone, rcode in (
                    (one, CLUSTER_NAME, ".", "NOERROR"),
                    (one, "example.com", ".", "NOERROR"),
                    (one, "web.consul.local", "consul.local.", "NOERROR"),
                    (one, "tpl.consul.local", "consul.local.", "NOERROR"),
                    (two, "www.example.org", "example.org.", "NOERROR"),
                    (two, "mail.example.org", "example.org.", "NOERROR"),
                    (two, "example.com", "dropped", "REFUSED"),
                ):
                    reply = ask_with(port, name, do)
                    assert dns.rcode.to_text(reply.rcode()) == rcode, (port, name)
                    asked[port, zone] += 1
                    flagged[port, zone] += do
            assert stub.names().count("web.consul.local") >= 1
            labels = {one: f"dns://127.0.0.1:{one}", two: f"dns://127.0.0.1:{two}"}
            expected = {(labels[port], zone): count for (port, zone), count in asked.items()}
            expected_do = {(labels[port], zone): n for (port, zone), n in flagged.items()}

            def by_server_and_zone(family: Metric) -> dict[tuple[str, str], float]:
                found: dict[tuple[str, str], float] = {}
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        key = (sample.labels["server"], sample.labels["zone"])
                        found[key] = found.get(key, 0) + sample.value
                return found

            families = scrape(ports["metrics"])
            assert by_server_and_zone(families["coredns_dns_requests"]) == expected
            assert by_server_and_zone(families["coredns_dns_responses"]) == expected
            assert by_server_and_zone(families["coredns_dns_do_requests"]) == expected_do
            # Every series with a `server` label names the server it counted on.
            servers = {
                (family.name, sample.labels["server"])
                for family in families.values()
                for sample in family.samples
                if "server" in sample.labels
            }
            for family_name in (
                "coredns_dns_request_duration_seconds",
                "coredns_dns_request_size_bytes",
                "coredns_dns_response_size_bytes",
                "coredns_cache_requests",
                "coredns_plugin_enabled",
            ):
                assert {s for name, s in servers if name == family_name} == set(labels.values()), (
                    family_name
                )
            assert {s for _, s in servers} == set(labels.values())
            matches = families["coredns_template_matches"].samples
            assert {(s.labels["server"], s.labels["zone"], s.value) for s in matches} == {
                (labels[one], "consul.local.", 4)
            }
        finally:
            assert server.stop(STOP_TIMEOUT) == 0, server.log()
