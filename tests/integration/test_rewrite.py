"""CoreDNS's `rewrite` in a live server: cluster names under other names in the kubernetes block
(`name exact`, with and without `answer auto`, and `name suffix ... answer auto`), a rewritten
name the upstream answers, and a stub domain's block that rewrites before it forwards."""

from __future__ import annotations

from pathlib import Path

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import pytest

from tests.integration.support import ask_port as ask
from tests.integration.support import copy_snapshot, free_ports
from tests.integration.support import serve_corefile as serve
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

UPSTREAM = {
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"],
    ("api.example.org", "A"): ["api.example.org. 300 IN A 192.0.2.81"],
}


def records(reply: dns.message.Message) -> set[tuple[str, str, str]]:
    """(owner, type, rdata) of each answer record."""
    return {
        (rrset.name.to_text(), dns.rdatatype.to_text(rrset.rdtype), rdata.to_text())
        for rrset in reply.answer
        for rdata in rrset
    }


def renamed(found: set[tuple[str, str, str]], name: str) -> set[tuple[str, str, str]]:
    return {(name, rtype, rdata) for _, rtype, rdata in found}


def test_cluster_names_under_the_names_asked(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(UPSTREAM) as upstream:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa
    rewrite name exact foo.example.com web.shop.svc.cluster.local
    rewrite name exact bar.example.com web.shop.svc.cluster.local answer auto
    rewrite name suffix .corp.internal .svc.cluster.local answer auto
    rewrite name exact outside.example.com example.org
    forward . 127.0.0.1:{upstream.port}
    cache 30
    toposdns {{
        snapshot {snapshot}
    }}
}}
""",
        )
        try:
            for tcp in (False, True):
                web = ask(port, "web.shop.svc.cluster.local", tcp=tcp)
                assert web.rcode() == dns.rcode.NOERROR and web.answer, server.log()
                for name in ("foo.example.com.", "bar.example.com.", "Foo.Example.COM."):
                    for _ in range(2):  # a rewritten query is answered again, not cached
                        reply = ask(port, name, tcp=tcp)
                        assert reply.question[0].name.to_text() == name
                        assert reply.flags & dns.flags.AA
                        assert records(reply) == renamed(records(web), name.lower())
                frontend = ask(port, "frontend.shop.corp.internal", tcp=tcp)
                assert records(frontend) == {("frontend.shop.corp.internal.", "A", "10.96.10.10")}
                # `answer auto` maps the names an SRV record holds back too.
                srv = ask(port, "_http._tcp.frontend.shop.corp.internal", "SRV", tcp=tcp)
                assert records(srv) == {
                    (
                        "_http._tcp.frontend.shop.corp.internal.",
                        "SRV",
                        "0 100 80 frontend.shop.corp.internal.",
                    )
                }
                # A name the rules leave alone, and one rewritten out of the zones: the
                # block's forward answers it, under the name asked.
                assert records(ask(port, "frontend.shop.svc.cluster.local", tcp=tcp)) == {
                    ("frontend.shop.svc.cluster.local.", "A", "10.96.10.10")
                }
                outside = ask(port, "outside.example.com", tcp=tcp)
                assert records(outside) == {("outside.example.com.", "A", "192.0.2.80")}
            assert "example.org" in upstream.names()
            assert "outside.example.com" not in upstream.names()
        finally:
            assert server.stop() == 0, server.log()


def test_a_stub_domains_block_rewrites_before_it_forwards(tmp_path: Path) -> None:
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
corp.example:{port} {{
    rewrite stop {{
        name suffix .corp.example .example.org
        answer auto
    }}
    forward . 127.0.0.1:{upstream.port}
}}
""",
        )
        try:
            for tcp in (False, True):
                reply = ask(port, "api.corp.example", tcp=tcp)
                assert reply.question[0].name.to_text() == "api.corp.example."
                assert records(reply) == {("api.corp.example.", "A", "192.0.2.81")}
                missing = ask(port, "nothing.corp.example", tcp=tcp)
                assert missing.question[0].name.to_text() == "nothing.corp.example."
            assert "api.example.org" in upstream.names()
            assert "api.corp.example" not in upstream.names()
        finally:
            assert server.stop() == 0, server.log()
