"""kubeadm's Corefile under `toposdns -conf FILE`, against the stand-in API: the answers CoreDNS
gives there, health, ready and metrics on their own ports, and `reload` of a ConfigMap update
(a symlink swap) without losing a query, or refused with its line when broken, and of a file
written in place in steps, applied only once whole.

The Corefile is kubeadm's, changed only where a loopback test must: the ports, `bind
127.0.0.1`, `kubeconfig`, the upstream address and `reload 2s`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import dns.edns
import dns.exception
import dns.message
import dns.query
import dns.rcode
import pytest

from tests.configmap import ConfigMap
from tests.integration.support import (
    CorefileServer,
    copy_snapshot,
    dig,
    free_ports,
    http_get,
    metric_total,
    udp,
    wait_until,
)
from tests.kubeapi import FakeApiServer
from tests.objects import headless, service
from tests.upstream import stub_upstream
from toposdns.reload import SETTLE

pytestmark = pytest.mark.integration

UPSTREAM = {
    ("8.8.8.8.in-addr.arpa", "PTR"): ["8.8.8.8.in-addr.arpa. 300 IN PTR dns.google."],
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"],
}
#: A headless Service with three ready endpoints, for `loadbalance`.
LB_OBJECTS = headless(
    "lb",
    "shop",
    [{"addresses": [f"10.244.0.{i}"], "conditions": {"ready": True}} for i in (1, 2, 3)],
)


def kubeadm_corefile(ports: dict[str, int], kubeconfig: Path, upstream: int, ttl: int = 30) -> str:
    return f"""\
.:{ports["dns"]} {{
    bind 127.0.0.1
    errors
    health 127.0.0.1:{ports["health"]} {{
       lameduck 5s
    }}
    ready 127.0.0.1:{ports["ready"]}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
       kubeconfig {kubeconfig}
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl {ttl}
    }}
    prometheus 127.0.0.1:{ports["metrics"]}
    forward . 127.0.0.1:{upstream} {{
       max_concurrent 1000
    }}
    cache 30 {{
       disable success cluster.local
       disable denial cluster.local
    }}
    loop
    reload 2s
    loadbalance
}}
"""


@pytest.fixture
def cluster(api: FakeApiServer) -> FakeApiServer:
    for obj in LB_OBJECTS:
        api.add(obj)
    return api


@pytest.fixture
def running(cluster: FakeApiServer, tmp_path: Path) -> Iterator[tuple[CorefileServer, ConfigMap]]:
    ports = free_ports("dns", "health", "ready", "metrics")
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    (tmp_path / "coredns").mkdir()
    configmap = ConfigMap(tmp_path / "coredns")
    with stub_upstream(UPSTREAM) as upstream:
        configmap.write(kubeadm_corefile(ports, kubeconfig, upstream.port))
        server = CorefileServer(configmap.path)
        try:
            server.wait_ready(30)
            server.ports = ports  # type: ignore[attr-defined]
            server.kubeconfig = kubeconfig  # type: ignore[attr-defined]
            server.upstream = upstream.port  # type: ignore[attr-defined]
            yield server, configmap
        finally:
            assert server.stop(15) == 0, server.log()  # after the 5 s lameduck


def test_kubeadms_corefile_answers_as_coredns_there(
    running: tuple[CorefileServer, ConfigMap], cluster: FakeApiServer
) -> None:
    server, _ = running
    ports = server.ports  # type: ignore[attr-defined]
    web = dig(server, "web.shop.svc.cluster.local")
    assert web.rdata("A") == ["10.96.0.5"] and int(web.answer[0][1]) == 30  # ttl 30
    pod = dig(server, "10-244-0-9.shop.pod.cluster.local")
    assert pod.rdata("A") == ["10.244.0.9"]  # pods insecure
    reverse = dig(server, "-x", "8.8.8.8")  # fallthrough in-addr.arpa to forward
    assert reverse.rdata("PTR") == ["dns.google."] and "aa" not in reverse.flags
    outside = dig(server, "example.org")
    assert outside.rdata("A") == ["192.0.2.80"] and int(outside.answer[0][1]) <= 30  # cache 30
    # In the cluster's zone nothing is cached: a Service that appears is found at once.
    assert dig(server, "new.shop.svc.cluster.local").status == "NXDOMAIN"
    cluster.add(service("new", "shop", cluster_ip="10.96.0.7"))
    assert wait_until(lambda: dig(server, "new.shop.svc.cluster.local").status == "NOERROR", 5)
    query = dns.message.make_query("lb.shop.svc.cluster.local", "A")
    orders = {tuple(str(rr) for rr in udp(server, query).answer[0]) for _ in range(20)}
    assert len(orders) > 1  # loadbalance
    # Health, ready and metrics, each on its own port.
    assert http_get(ports["health"], "/health") == (200, "OK")
    assert http_get(ports["ready"], "/ready") == (200, "OK")
    assert metric_total(ports["metrics"], "coredns_dns_requests_total") > 0


def test_a_reload_applies_within_the_interval_without_losing_a_query(
    running: tuple[CorefileServer, ConfigMap],
) -> None:
    server, configmap = running
    ports = server.ports  # type: ignore[attr-defined]
    kubeconfig, upstream = server.kubeconfig, server.upstream  # type: ignore[attr-defined]
    query = dns.message.make_query("web.shop.svc.cluster.local", "A")
    configmap.write(kubeadm_corefile(ports, kubeconfig, upstream, ttl=10))
    changed_at, sent, lost, ttl = time.monotonic(), 0, 0, 30
    # reload 2s (jitter at most 1s), then read again SETTLE seconds later
    while ttl != 10 and time.monotonic() < changed_at + 2 + 1 + SETTLE + 4:
        sent += 1
        try:
            ttl = udp(server, query, timeout=1.0).answer[0].ttl
        except dns.exception.Timeout:
            lost += 1
        time.sleep(0.01)
    assert ttl == 10, server.tail()
    assert time.monotonic() - changed_at < 2 + 1 + SETTLE + 2  # and a margin
    assert lost == 0 and sent > 10
    assert server.find("reload: applied the changed Corefile") is not None
    # A broken Corefile is refused with its line; the running configuration keeps serving.
    broken = kubeadm_corefile(ports, kubeconfig, upstream, ttl=10).replace("ttl 10", "ttl 99999")
    configmap.write(broken)
    line = server.wait_for_log("reload: the Corefile is not applied", 2 + 1 + SETTLE + 4).string
    assert f"{configmap.path}:12: ttl 99999: must be between 0 and 3600" in line
    assert metric_total(ports["metrics"], "coredns_reload_failed_total") == 1
    assert udp(server, query).answer[0].ttl == 10


def test_every_worker_applies_a_reload(tmp_path: Path) -> None:
    (tmp_path / "coredns").mkdir()
    configmap = ConfigMap(tmp_path / "coredns")
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]

    def corefile(ttl: int) -> str:
        return (
            f".:{port} {{\n  bind 127.0.0.1\n  kubernetes cluster.local {{\n    ttl {ttl}\n  }}\n"
            f"  reload 2s\n  toposdns {{\n    snapshot {snapshot}\n    workers 2\n  }}\n}}\n"
        )

    configmap.write(corefile(30))
    server = CorefileServer(configmap.path)
    try:
        server.wait_ready(30)
        query = dns.message.make_query("frontend.shop.svc.cluster.local", "A")
        assert {rr.ttl for rr in (udp(server, query).answer[0] for _ in range(8))} == {30}
        configmap.write(corefile(7))

        def every_worker_has_it() -> bool:  # the kernel spreads the queries over both
            return {udp(server, query).answer[0].ttl for _ in range(16)} == {7}

        assert wait_until(every_worker_has_it, 2 + 1 + SETTLE + 4), server.tail()
    finally:
        assert server.stop(15) == 0, server.log()


def test_acl_screens_udp_and_tcp_by_source(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    corefile = tmp_path / "Corefile"
    corefile.write_text(
        f".:{port} {{\n  bind 127.0.0.1\n  kubernetes cluster.local\n"
        f"  acl {{\n    drop net 127.0.0.3\n    block net 127.0.0.2\n  }}\n"
        f"  toposdns {{\n    snapshot {snapshot}\n    workers 1\n  }}\n}}\n"
    )
    server = CorefileServer(corefile)
    try:
        server.wait_ready(30)
        query = dns.message.make_query("frontend.shop.svc.cluster.local", "A")
        for ask in (dns.query.udp, dns.query.tcp):
            assert ask(query, "127.0.0.1", port=port, timeout=2).answer  # allowed
            blocked = ask(query, "127.0.0.1", port=port, timeout=2, source="127.0.0.2")
            assert blocked.rcode() == dns.rcode.REFUSED and not blocked.answer
            assert [o.code for o in blocked.options] == [dns.edns.EDE]
        with pytest.raises(dns.exception.Timeout):
            dns.query.udp(query, "127.0.0.1", port=port, timeout=1, source="127.0.0.3")
    finally:
        assert server.stop() == 0, server.log()


def test_a_corefile_written_in_steps_is_applied_only_once_it_stays_the_same(
    tmp_path: Path,
) -> None:
    """A Corefile rewritten in place in two steps, its `acl` block 3 s after the rest (longer
    than `reload 2s 0s` takes to see the first step, shorter than SETTLE): the first step is
    never applied, so 127.0.0.2 is refused throughout, and the whole file is."""
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    corefile = tmp_path / "Corefile"

    def text(ttl: int, acl: bool) -> str:
        block = "  acl {\n    block net 127.0.0.2\n  }\n" if acl else ""
        return (
            f".:{port} {{\n  bind 127.0.0.1\n  kubernetes cluster.local {{\n    ttl {ttl}\n  }}\n"
            f"  reload 2s 0s\n{block}"
            f"  toposdns {{\n    snapshot {snapshot}\n    workers 1\n  }}\n}}\n"
        )

    corefile.write_text(text(30, acl=True))
    server = CorefileServer(corefile)
    query = dns.message.make_query("frontend.shop.svc.cluster.local", "A")

    def refused() -> bool:
        reply = dns.query.udp(query, "127.0.0.1", port=port, timeout=2, source="127.0.0.2")
        return reply.rcode() == dns.rcode.REFUSED and not reply.answer

    def ttl() -> int:
        return int(dns.query.udp(query, "127.0.0.1", port=port, timeout=2).answer[0].ttl)

    try:
        server.wait_ready(30)
        assert refused() and ttl() == 30
        corefile.write_text(text(10, acl=False))  # in place: the acl is not there yet
        first_step = time.monotonic()
        while time.monotonic() < first_step + 3:
            assert refused(), f"the file without its acl was applied:\n{server.tail()}"
            time.sleep(0.05)
        corefile.write_text(text(10, acl=True))
        whole = time.monotonic()
        while ttl() != 10 and time.monotonic() < whole + 2 + SETTLE + 4:
            assert refused(), f"the file without its acl was applied:\n{server.tail()}"
            time.sleep(0.05)
        assert ttl() == 10 and refused(), server.tail()
        assert server.log().count("reload: applied the changed Corefile") == 1
        assert server.find("reload: the Corefile is not applied") is None
    finally:
        assert server.stop() == 0, server.log()
