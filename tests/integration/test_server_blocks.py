"""Several server blocks on one port, as CoreDNS routes them: a stub domain's own block with its
own upstream, the cluster zone split from `.`, and REFUSED for a name no block holds."""

from __future__ import annotations

from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import pytest

from tests.integration.support import CorefileServer, copy_snapshot, free_ports, rrset_texts
from tests.integration.support import ask_port as ask
from tests.integration.support import serve_corefile as serve
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

MAIN = {("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"]}
STUB = {
    ("web.consul.local", "A"): ["web.consul.local. 60 IN A 192.0.2.53"],
    ("example.org", "A"): ["example.org. 300 IN A 198.51.100.1"],
}


def test_a_stub_domain_goes_to_its_own_blocks_upstream(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(MAIN) as main, stub_upstream(STUB) as stub:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    errors
    kubernetes cluster.local
    forward . 127.0.0.1:{main.port}
    toposdns {{
        snapshot {snapshot}
    }}
}}
consul.local:{port} {{
    errors
    cache 30
    forward . 127.0.0.1:{stub.port}
}}
""",
        )
        try:
            for tcp in (False, True):
                cluster = ask(port, "frontend.shop.svc.cluster.local", tcp=tcp)
                assert cluster.rcode() == dns.rcode.NOERROR and cluster.answer
                stubbed = ask(port, "web.consul.local", tcp=tcp)
                # `cache 30` caps the TTL, as CoreDNS's cache does.
                assert rrset_texts(stubbed.answer) == {"web.consul.local. 30 IN A 192.0.2.53"}
                other = ask(port, "example.org", tcp=tcp)
                assert rrset_texts(other.answer) == {"example.org. 300 IN A 192.0.2.80"}
            # The block's cache answers the repeats: its upstream saw the name once per transport.
            assert 1 <= stub.names().count("web.consul.local") <= 2
            assert "web.consul.local" not in main.names() and "example.org" in main.names()
            assert "example.org" not in stub.names()
        finally:
            assert server.stop() == 0, server.log()


def test_the_cluster_zone_in_its_own_block_and_names_no_block_holds(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(MAIN) as upstream:
        server = serve(
            tmp_path,
            f"""cluster.local:{port} {{
    bind 127.0.0.1
    kubernetes
    toposdns {{
        snapshot {snapshot}
    }}
}}
example.org:{port} {{
    forward . 127.0.0.1:{upstream.port}
}}
""",
        )
        try:
            for tcp in (False, True):
                assert ask(port, "frontend.shop.svc.cluster.local", tcp=tcp).answer
                forwarded = ask(port, "example.org", tcp=tcp)
                assert rrset_texts(forwarded.answer) == {"example.org. 300 IN A 192.0.2.80"}
                # In no block's zone: REFUSED, as from CoreDNS's server.
                assert ask(port, "example.net", tcp=tcp).rcode() == dns.rcode.REFUSED
            # The kubernetes block answers its zone whatever the query's form: no OPT, OPT.
            query = dns.message.make_query("nothere.cluster.local", "A", use_edns=0)
            reply = dns.query.udp(query, "127.0.0.1", port=port, timeout=3)
            assert reply.rcode() == dns.rcode.NXDOMAIN
        finally:
            assert server.stop() == 0, server.log()


def test_forward_allow_screens_every_blocks_forwarding(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    corefile = tmp_path / "Corefile"
    with stub_upstream(MAIN) as main, stub_upstream(STUB) as stub:
        corefile.write_text(
            f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    forward . 127.0.0.1:{main.port}
    toposdns {{
        snapshot {snapshot}
    }}
}}
consul.local:{port} {{
    forward . 127.0.0.1:{stub.port}
}}
"""
        )
        server = CorefileServer(corefile, "--forward-allow", "127.0.0.0/30")
        try:
            server.wait_ready(30)
            for name in ("web.consul.local", "example.org"):
                query = dns.message.make_query(name, "A")
                allowed = dns.query.udp(query, "127.0.0.1", port=port, timeout=3)
                assert allowed.answer
                outside = dns.query.udp(query, "127.0.0.1", port=port, source="127.0.0.9")
                assert outside.rcode() == dns.rcode.REFUSED and not outside.answer
            assert stub.names() == ["web.consul.local"] and main.names() == ["example.org"]
        finally:
            assert server.stop() == 0, server.log()
