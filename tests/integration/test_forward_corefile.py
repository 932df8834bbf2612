"""`forward`'s options through the real server, read from a Corefile by `toposdns -conf FILE`:
FROM and `except` in the kubernetes block and in a stub domain's block (names not forwarded get
SERVFAIL and never reach the upstream), `force_tcp`, and DNS over TLS to a stub with its own
certificate authority, its connection reused. (kubespray's `prefer_udp` is in
test_distributions.py, with its default Corefile.)"""

from __future__ import annotations

from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import pytest

from tests.certificates import make_certificates
from tests.integration.support import (
    ask_port,
    copy_snapshot,
    free_ports,
    rrset_texts,
)
from tests.integration.support import serve_corefile as serve
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

UPSTREAM = {
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"],
    ("www.example.org", "A"): ["www.example.org. 300 IN A 192.0.2.81"],
    ("8.8.8.8.in-addr.arpa", "PTR"): ["8.8.8.8.in-addr.arpa. 300 IN PTR dns.google."],
    ("web.consul.local", "A"): ["web.consul.local. 60 IN A 192.0.2.53"],
}
CLUSTER_NAME = "frontend.shop.svc.cluster.local"


def test_from_and_except_leave_names_to_the_next_plugin(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(UPSTREAM) as main, stub_upstream(UPSTREAM) as stub:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    forward example.org 127.0.0.1:{main.port} {{
        except internal.example.org
    }}
    toposdns {{
        snapshot {snapshot}
    }}
}}
consul.local:{port} {{
    forward . 127.0.0.1:{stub.port} {{
        except skip.consul.local
        force_tcp
        policy sequential
        max_fails 3
        health_check 1s no_rec domain consul.local
        expire 5s
    }}
}}
""",
        )
        try:
            for tcp in (False, True):
                assert ask(port, CLUSTER_NAME, tcp=tcp).answer
                forwarded = ask(port, "www.example.org", tcp=tcp)
                assert rrset_texts(forwarded.answer) == {"www.example.org. 300 IN A 192.0.2.81"}
                # Outside FROM, or under `except`: no plugin after forward, SERVFAIL.
                for name in ("example.com", "a.internal.example.org", "x.skip.consul.local"):
                    reply = ask(port, name, tcp=tcp)
                    assert reply.rcode() == dns.rcode.SERVFAIL and not reply.answer, name
                stubbed = ask(port, "web.consul.local", tcp=tcp)
                assert rrset_texts(stubbed.answer) == {"web.consul.local. 60 IN A 192.0.2.53"}
            assert set(main.names()) == {"www.example.org"}
            assert set(stub.names()) == {"web.consul.local"}
            # `force_tcp`: over TCP, asked over UDP too, on one reused connection (the startup
            # loop probe, HINFO, goes straight to the upstream over UDP).
            assert {proto for proto, _, qtype in stub.queries if qtype != "HINFO"} == {"tcp"}
            assert stub.tcp_accepted == 1
        finally:
            assert server.stop() == 0, server.log()


def test_dns_over_tls_with_its_servername(tmp_path: Path) -> None:
    certificates = make_certificates(tmp_path, ("dns.test",))
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(UPSTREAM, tls=certificates.server_context()) as upstream:
        server = serve(
            tmp_path,
            f""".:{port} {{
    bind 127.0.0.1
    kubernetes cluster.local
    forward . tls://127.0.0.1:{upstream.tls_port} {{
        tls {certificates.ca}
        tls_servername dns.test
    }}
    toposdns {{
        snapshot {snapshot}
    }}
}}
""",
        )
        try:
            for name in ("example.org", "www.example.org", "web.consul.local"):
                for tcp in (False, True):
                    reply = ask(port, name, tcp=tcp)
                    assert reply.rcode() == dns.rcode.NOERROR and reply.answer, name
            assert {proto for proto, _, _ in upstream.queries} == {"tls"}
            assert upstream.tcp_accepted == 1  # one handshake, the connection reused
            assert "Traceback" not in server.log()
        finally:
            assert server.stop() == 0, server.log()


def ask(port: int, name: str, rtype: str = "A", tcp: bool = False) -> dns.message.Message:
    return ask_port(port, name, rtype, tcp, timeout=5)
