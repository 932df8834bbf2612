"""CoreDNS's `hosts` in a live server: k3s's default Corefile with its NodeHosts file beside the
kubernetes plugin, CoreDNS's own lookup table through the Corefile, a stub domain's block, and
the entries gauge with workers."""

from __future__ import annotations

import re
from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import dns.reversename
import pytest

from tests.integration.support import ask_port as ask
from tests.integration.support import (
    copy_snapshot,
    free_ports,
    http_get,
    replace_file,
    rrset_texts,
    wait_until,
)
from tests.integration.support import serve_corefile as serve
from tests.unit.test_hosts import HOSTS_EXAMPLE, LOOKUP_A
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

UPSTREAM = {
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"],
    ("api.example.org", "A"): ["api.example.org. 300 IN A 192.0.2.81"],
}
#: What k3s writes into the coredns ConfigMap's NodeHosts: one line per node.
NODE_HOSTS = "172.18.0.2 k3s-server\n172.18.0.3 k3s-agent-1\n"


def entries_gauge(port: int, path: Path) -> float | None:
    status, text = http_get(port, "/metrics")
    assert status == 200, text
    pattern = rf'^coredns_hosts_entries{{hostsfile="{re.escape(str(path))}"}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_k3s_default_corefile_with_its_node_hosts(tmp_path: Path) -> None:
    """k3s's default (its manifests' coredns.yaml): `hosts /etc/coredns/NodeHosts { ttl 60
    reload 15s fallthrough }` between kubernetes and forward."""
    snapshot = copy_snapshot(tmp_path)
    node_hosts = tmp_path / "NodeHosts"
    node_hosts.write_text(NODE_HOSTS)
    ports = free_ports("dns", "metrics")
    with stub_upstream(UPSTREAM) as upstream:
        server = serve(
            tmp_path,
            f""".:{ports["dns"]} {{
    bind 127.0.0.1
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
    }}
    hosts {node_hosts} {{
      ttl 60
      reload 15s
      fallthrough
    }}
    prometheus 127.0.0.1:{ports["metrics"]}
    forward . 127.0.0.1:{upstream.port}
    cache 30
    loop
    reload
    loadbalance
    toposdns {{
        snapshot {snapshot}
    }}
}}
""",
        )
        port = ports["dns"]
        try:
            for tcp in (False, True):
                node = ask(port, "k3s-server", tcp=tcp)
                assert node.flags & dns.flags.AA
                # `ttl 60`, capped at 30 by `cache 30` ahead of hosts, as CoreDNS's first reply.
                assert rrset_texts(node.answer) == {"k3s-server. 30 IN A 172.18.0.2"}
                ptr = ask(port, dns.reversename.from_address("172.18.0.3"), "PTR", tcp=tcp)
                assert rrset_texts(ptr.answer) == {
                    "3.0.18.172.in-addr.arpa. 30 IN PTR k3s-agent-1."
                }
                # A name of the file without the type asked: NODATA, not the upstream's.
                nodata = ask(port, "k3s-server", "AAAA", tcp=tcp)
                assert nodata.rcode() == dns.rcode.NOERROR and not nodata.answer
                # Cluster names, and addresses the file does not have, pass on to kubernetes.
                cluster = ask(port, "frontend.shop.svc.cluster.local", tcp=tcp)
                assert rrset_texts(cluster.answer) == {
                    "frontend.shop.svc.cluster.local. 5 IN A 10.96.10.10"
                }
                reverse = ask(port, dns.reversename.from_address("10.96.10.10"), "PTR", tcp=tcp)
                assert rrset_texts(reverse.answer) == {
                    "10.10.96.10.in-addr.arpa. 5 IN PTR frontend.shop.svc.cluster.local."
                }
                # Other names fall through to the upstream (`cache 30` caps the TTL).
                other = ask(port, "example.org", tcp=tcp)
                assert rrset_texts(other.answer) == {"example.org. 30 IN A 192.0.2.80"}
            assert "k3s-server" not in upstream.names() and "example.org" in upstream.names()
            assert entries_gauge(ports["metrics"], node_hosts) == 4
            # k3s adds a node, and a line claims a cluster name (cached above): both are
            # answered from the file once `reload` has seen it.
            replace_file(
                node_hosts,
                NODE_HOSTS
                + "172.18.0.4 k3s-agent-2\n172.18.0.99 frontend.shop.svc.cluster.local\n",
            )
            assert wait_until(lambda: ask(port, "k3s-agent-2").answer != [], 30, 0.5), server.log()
            claimed = ask(port, "frontend.shop.svc.cluster.local")
            assert rrset_texts(claimed.answer) == {
                "frontend.shop.svc.cluster.local. 30 IN A 172.18.0.99"
            }
            assert entries_gauge(ports["metrics"], node_hosts) == 8
            assert f"hosts: {node_hosts}: 8 entries" in server.log()
        finally:
            assert server.stop() == 0, server.log()


def test_corednss_lookup_table_through_a_live_server(tmp_path: Path) -> None:
    """hosts_test.go's table, its file read through a Corefile; fallthrough where the table
    falls through, and no upstream."""
    snapshot = copy_snapshot(tmp_path)
    (tmp_path / "hosts").write_text(HOSTS_EXAMPLE)
    port = free_ports("dns")["dns"]
    server = serve(
        tmp_path,
        f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    hosts {tmp_path / "hosts"} {{
        fallthrough fallthrough-example.org
    }}
    toposdns {{
        snapshot {snapshot}
    }}
}}
""",
    )
    try:
        for name, qtype, rcode, answer in LOOKUP_A:
            for tcp in (False, True):
                reply = ask(port, name, qtype, tcp=tcp)
                assert dns.rcode.to_text(reply.rcode()) == rcode, (name, qtype)
                assert rrset_texts(reply.answer) == {" ".join(line.split()) for line in answer}, (
                    name,
                    qtype,
                )
                assert bool(reply.flags & dns.flags.AA) == (rcode == "NOERROR")
    finally:
        assert server.stop() == 0, server.log()


def test_hosts_in_a_stub_domains_block_before_its_forward(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(UPSTREAM) as upstream:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    toposdns {{
        snapshot {snapshot}
    }}
}}
example.org:{port} {{
    hosts {tmp_path / "nothere"} {{
        192.0.2.7 web.example.org
        ttl 30
        fallthrough
    }}
    forward . 127.0.0.1:{upstream.port}
}}
""",
        )
        try:
            for tcp in (False, True):
                web = ask(port, "web.example.org", tcp=tcp)
                assert rrset_texts(web.answer) == {"web.example.org. 30 IN A 192.0.2.7"}
                api = ask(port, "api.example.org", tcp=tcp)
                assert rrset_texts(api.answer) == {"api.example.org. 300 IN A 192.0.2.81"}
            assert "web.example.org" not in upstream.names()
            assert "hosts: " in server.log() and "No such file or directory" in server.log()
        finally:
            assert server.stop() == 0, server.log()


def test_the_entries_gauge_is_the_files_with_workers(tmp_path: Path) -> None:
    """Each worker reads the file; /metrics shows its entries once, not summed."""
    snapshot = copy_snapshot(tmp_path)
    node_hosts = tmp_path / "NodeHosts"
    node_hosts.write_text(NODE_HOSTS)
    ports = free_ports("dns", "metrics")
    server = serve(
        tmp_path,
        f""".:{ports["dns"]} {{
    bind 127.0.0.1
    kubernetes cluster.local
    hosts {node_hosts} {{
        fallthrough
    }}
    prometheus 127.0.0.1:{ports["metrics"]}
    toposdns {{
        snapshot {snapshot}
        workers 2
    }}
}}
""",
    )
    try:
        assert rrset_texts(ask(ports["dns"], "k3s-server").answer) == {
            "k3s-server. 3600 IN A 172.18.0.2"
        }
        assert wait_until(lambda: entries_gauge(ports["metrics"], node_hosts) is not None, 10)
        assert entries_gauge(ports["metrics"], node_hosts) == 4
    finally:
        assert server.stop() == 0, server.log()
