"""CoreDNS's `template` in the real server: AKS's default Corefile's two templates in the
kubernetes block, in front of `forward` to a stand-in upstream, and a template in a stub
domain's own block."""

from __future__ import annotations

from pathlib import Path

import dns.message
import dns.query
import dns.rcode
import pytest

from tests.integration.support import (
    CorefileServer,
    copy_snapshot,
    free_ports,
    metric_total,
    rrset_texts,
)
from tests.integration.support import ask_port as ask
from tests.upstream import stub_upstream

pytestmark = pytest.mark.integration

UPSTREAM = {
    ("vm1.internal.cloudapp.net", "A"): ["vm1.internal.cloudapp.net. 60 IN A 10.224.0.4"],
    ("b.c.d.internal.cloudapp.net", "A"): ["b.c.d.internal.cloudapp.net. 60 IN A 10.224.0.5"],
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"],
    ("www.example.net", "A"): ["www.example.net. 300 IN A 192.0.2.81"],
}

#: AKS's default Corefile (the kube-system/coredns ConfigMap AKS writes), its upstream, data
#: and addresses replaced for the test (and `health` without its 5 s lameduck).
AKS = """\
.:{port} {{
    errors
    ready 127.0.0.1:{ready}
    health 127.0.0.1:{health}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
      pods insecure
      fallthrough in-addr.arpa ip6.arpa
      ttl 30
    }}
    prometheus 127.0.0.1:{metrics}
    forward . 127.0.0.1:{upstream}
    cache 30
    loop
    reload
    loadbalance
    import custom/*.override
    template ANY ANY internal.cloudapp.net {{
      match "^(?:[^.]+\\.){{4,}}internal\\.cloudapp\\.net\\.$"
      rcode NXDOMAIN
      fallthrough
    }}
    template ANY ANY reddog.microsoft.com {{
      rcode NXDOMAIN
    }}
    bind 127.0.0.1
    toposdns {{
        snapshot {snapshot}
    }}
}}
import custom/*.server
"""


#: A README example of CoreDNS's: names that spell an address answer with it.
IP_TEMPLATE = """\
    template IN A example.net {
      match "^ip-(?P<a>[0-9]+)-(?P<b>[0-9]+)-(?P<c>[0-9]+)-(?P<d>[0-9]+)[.]example[.]net[.]$"
      answer "{{ .Name }} 60 IN A {{ .Group.a }}.{{ .Group.b }}.{{ .Group.c }}.{{ .Group.d }}"
      fallthrough
    }
"""


def test_aks_default_templates(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    ports = free_ports("dns", "ready", "metrics", "health")
    (tmp_path / "custom").mkdir()
    with stub_upstream(UPSTREAM) as upstream:
        corefile = tmp_path / "Corefile"
        corefile.write_text(
            AKS.format(
                port=ports["dns"],
                ready=ports["ready"],
                health=ports["health"],
                metrics=ports["metrics"],
                upstream=upstream.port,
                snapshot=snapshot,
            )
        )
        server = CorefileServer(corefile)
        server.wait_ready(30)
        port = ports["dns"]
        try:
            for tcp in (False, True):
                # Four labels or more before internal.cloudapp.net: a search path's
                # completion of a name that was whole already.
                for name in ("a.b.c.d.internal.cloudapp.net", "x.y.z.w.v.internal.cloudapp.net"):
                    reply = ask(port, name, tcp=tcp)
                    assert reply.rcode() == dns.rcode.NXDOMAIN, reply
                    assert reply.flags & dns.flags.AA and not reply.answer
                # Fewer fall through the template, to kubernetes, then the upstream.
                reply = ask(port, "vm1.internal.cloudapp.net", tcp=tcp)
                assert rrset_texts(reply.answer) == {
                    "vm1.internal.cloudapp.net. 30 IN A 10.224.0.4"
                }
                reply = ask(port, "b.c.d.internal.cloudapp.net", tcp=tcp)
                assert reply.rcode() == dns.rcode.NOERROR and reply.answer
                # Every name under reddog.microsoft.com, and the zone itself: NXDOMAIN.
                for name in ("reddog.microsoft.com", "host.reddog.microsoft.com"):
                    for rtype in ("A", "AAAA", "TXT"):
                        reply = ask(port, name, rtype, tcp=tcp)
                        assert reply.rcode() == dns.rcode.NXDOMAIN, reply
                # The cluster's names and other names answer as before.
                cluster = ask(port, "frontend.shop.svc.cluster.local", tcp=tcp)
                assert cluster.rcode() == dns.rcode.NOERROR and cluster.answer
                missing = ask(port, "nothere.shop.svc.cluster.local", tcp=tcp)
                assert missing.rcode() == dns.rcode.NXDOMAIN and missing.authority
                forwarded = ask(port, "example.org", tcp=tcp)
                assert rrset_texts(forwarded.answer) == {"example.org. 30 IN A 192.0.2.80"}
            asked = upstream.names()
            assert "a.b.c.d.internal.cloudapp.net" not in asked
            assert not [name for name in asked if name.endswith("reddog.microsoft.com")]
            assert "vm1.internal.cloudapp.net" in asked
            matches = metric_total(ports["metrics"], "coredns_template_matches_total")
            assert matches == 2 * (2 + 2 * 3)
        finally:
            assert server.stop() == 0, server.log()


def test_a_stub_domains_template_answers_before_its_forward(tmp_path: Path) -> None:
    snapshot = copy_snapshot(tmp_path)
    port = free_ports("dns")["dns"]
    with stub_upstream(UPSTREAM) as upstream:
        corefile = tmp_path / "Corefile"
        corefile.write_text(
            f".:{port} {{\n bind 127.0.0.1\n kubernetes cluster.local\n"
            f" toposdns {{\n  snapshot {snapshot}\n }}\n}}\n"
            f"example.net:{port} {{\n{IP_TEMPLATE} forward . 127.0.0.1:{upstream.port}\n}}\n"
        )
        server = CorefileServer(corefile)
        server.wait_ready(30)
        try:
            for tcp in (False, True):
                reply = ask(port, "ip-192-0-2-7.example.net", tcp=tcp)
                assert rrset_texts(reply.answer) == {"ip-192-0-2-7.example.net. 60 IN A 192.0.2.7"}
                assert reply.flags & dns.flags.AA
                forwarded = ask(port, "www.example.net", tcp=tcp)
                assert rrset_texts(forwarded.answer) == {"www.example.net. 300 IN A 192.0.2.81"}
            assert "ip-192-0-2-7.example.net" not in upstream.names()
        finally:
            assert server.stop() == 0, server.log()
