"""Each Kubernetes distribution's default Corefile (tests/corefiles/, with its ConfigMaps'
files) under `toposdns -conf`, against the fixture snapshot and stand-in upstreams: the answers
CoreDNS gives there.

Every distribution: the cluster's names (a Service's A, SRV and PTR, NXDOMAIN with the zone's
SOA), forwarded names and the reverse names the cluster lacks (`fallthrough in-addr.arpa`),
capped by `cache 30`, and health, ready and metrics on their ports. Then what each ships of its
own: k3s's NodeHosts, AKS's templates, kubespray's `prefer_udp`, and the example `custom/` files
of k3s and AKS: a stub domain through its own block and upstream, and the `.override`."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype
import dns.reversename
import pytest

from tests.distributions import DISTRIBUTIONS, render
from tests.integration.support import (
    STOP_TIMEOUT,
    CorefileServer,
    copy_snapshot,
    free_ports,
    http_get,
    rrset_texts,
    wait_until,
)
from tests.upstream import StubUpstream, stub_upstream

pytestmark = pytest.mark.integration

#: AKS's examples (articles/aks/coredns-custom.md): a VM's name in the VNet (6 labels), which
#: Azure DNS answers, and a search-list completion (8 labels), which never succeeds.
AKS_VM = "aks12345.myvnetid.myregion.internal.cloudapp.net"
AKS_SEARCH = "mcr.microsoft.com.myvnetid.myregion.internal.cloudapp.net"
#: The shortest name the internal.cloudapp.net template matches: 7 labels.
AKS_SEVEN = "x.aks12345.myvnetid.myregion.internal.cloudapp.net"
#: More addresses than a 1232-byte UDP reply holds: the upstream truncates it over UDP.
BIG = [f"big.example.org. 300 IN A 192.0.2.{i}" for i in range(1, 101)]

#: What the stand-in upstream of the kubernetes block answers. Names a distribution answers
#: itself are here too, with other addresses, so that one forwarded by mistake shows.
UPSTREAM = {
    ("example.org", "A"): ["example.org. 300 IN A 192.0.2.80"],
    ("8.8.8.8.in-addr.arpa", "PTR"): ["8.8.8.8.in-addr.arpa. 300 IN PTR dns.google."],
    ("web.example.consul", "A"): ["web.example.consul. 300 IN A 198.51.100.53"],
    ("example1.org", "A"): ["example1.org. 300 IN A 198.51.100.1"],
    (AKS_VM, "A"): [f"{AKS_VM}. 300 IN A 10.224.0.4"],
    (AKS_SEARCH, "A"): [f"{AKS_SEARCH}. 300 IN A 198.51.100.2"],
    (AKS_SEARCH, "AAAA"): [f"{AKS_SEARCH}. 300 IN AAAA 2001:db8::2"],
    (AKS_SEVEN, "A"): [f"{AKS_SEVEN}. 300 IN A 198.51.100.3"],
    ("reddog.microsoft.com", "A"): ["reddog.microsoft.com. 300 IN A 198.51.100.4"],
    ("web.reddog.microsoft.com", "TXT"): ['web.reddog.microsoft.com. 300 IN TXT "upstream"'],
    ("prefer-udp.example.org", "A"): ["prefer-udp.example.org. 300 IN A 192.0.2.81"],
    ("big.example.org", "A"): BIG,
}
#: What the upstream of the example stub domain (custom/consul.server) answers.
STUB = {("web.example.consul", "A"): ["web.example.consul. 60 IN A 192.0.2.53"]}
#: The kubernetes plugin's `ttl` in each Corefile (CoreDNS's default, 5, where none is set).
TTL = {
    "kubeadm": 30,
    "k3s": 5,
    "rke2": 30,
    "eks": 5,
    "aks": 30,
    "microk8s": 5,
    "talos": 30,
    "k0s": 30,
    "kubespray": 5,
    "coredns-helm": 30,
}
FRONTEND = "frontend.shop.svc.cluster.local"
#: The line a server logs on SIGTERM, with its lameduck.
LAMEDUCK = r"answering for (\S+)s more \(lameduck\)"


@dataclass
class Served:
    """One distribution's Corefile served, with its stand-in upstreams."""

    name: str
    server: CorefileServer
    upstream: StubUpstream
    stub: StubUpstream
    ports: dict[str, int]
    stdout: Path

    def ask(self, name: str, rtype: str = "A", tcp: bool = False) -> dns.message.Message:
        query = dns.message.make_query(name, rtype)
        send = dns.query.tcp if tcp else dns.query.udp
        return send(query, "127.0.0.1", port=self.ports["dns"], timeout=3)

    def reverse(self, address: str, tcp: bool = False) -> dns.message.Message:
        return self.ask(dns.reversename.from_address(address).to_text(), "PTR", tcp)


def stop(server: CorefileServer) -> int | None:
    """SIGTERM, and a second one once the lameduck shipped (5 s, 10 s) has begun, to end it;
    the exit code."""
    start = server.line_count()
    server.send_signal(signal.SIGTERM)
    with contextlib.suppress(AssertionError):
        lameduck = server.wait_for_log(LAMEDUCK, 5.0, start)
        if float(lameduck.group(1)) > 0:
            server.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.proc.wait(15)
    return server.stop(STOP_TIMEOUT)  # no signal left to send once it has exited


@pytest.fixture(scope="class")
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The distribution `request.param` served from its files, laid out as its ConfigMaps are
    mounted, in a directory of its own."""
    name: str = request.param
    directory = tmp_path_factory.mktemp(name)
    mount = directory / "coredns"
    ports = free_ports("dns", "health", "ready", "metrics")
    stdout = directory / "stdout"
    with stub_upstream(UPSTREAM) as upstream, stub_upstream(STUB) as stub:
        values = {
            "DNS_PORT": str(ports["dns"]),
            "HEALTH": f"127.0.0.1:{ports['health']}",
            "READY": f"127.0.0.1:{ports['ready']}",
            "METRICS": f"127.0.0.1:{ports['metrics']}",
            "UPSTREAM": f"127.0.0.1:{upstream.port}",
            "STUB_UPSTREAM": f"127.0.0.1:{stub.port}",
            "SNAPSHOT": str(copy_snapshot(directory)),
            "DIR": str(mount),
        }
        # Its stdout (where `log` writes) into a file: the harness reads only its stderr.
        server = CorefileServer(
            render(name, mount, values), wrapper=("sh", "-c", 'exec "$@" >"$0"', str(stdout))
        )
        server.wait_ready(30)  # ServerFailed, with its log, when it does not start
        try:
            yield Served(name, server, upstream, stub, ports, stdout)
        finally:
            assert stop(server) == 0, server.log()


def parametrized(*names: str) -> pytest.MarkDecorator:
    """The tests of a class, each against one server per distribution in `names`."""
    return pytest.mark.parametrize("served", names, indirect=True, scope="class")


@parametrized(*DISTRIBUTIONS)
class TestEveryDistribution:
    def test_the_cluster_names(self, served: Served) -> None:
        ttl = TTL[served.name]
        a = served.ask(FRONTEND)
        assert a.flags & dns.flags.AA
        assert rrset_texts(a.answer) == {f"{FRONTEND}. {ttl} IN A 10.96.10.10"}
        srv = served.ask(f"_http._tcp.{FRONTEND}", "SRV")
        assert rrset_texts(srv.answer) == {
            f"_http._tcp.{FRONTEND}. {ttl} IN SRV 0 100 80 {FRONTEND}."
        }
        assert rrset_texts(srv.additional) == {f"{FRONTEND}. {ttl} IN A 10.96.10.10"}
        ptr = served.reverse("10.96.10.10")
        assert rrset_texts(ptr.answer) == {f"10.10.96.10.in-addr.arpa. {ttl} IN PTR {FRONTEND}."}
        missing = served.ask("nothere.shop.svc.cluster.local")
        assert missing.rcode() == dns.rcode.NXDOMAIN and not missing.answer
        assert [rrset.name.to_text() for rrset in missing.authority] == ["cluster.local."]
        assert missing.authority[0].rdtype == dns.rdatatype.SOA
        for tcp in (False, True):  # over TCP as well (or from the cache, as CoreDNS's)
            again = served.ask(f"_http._tcp.{FRONTEND}", "SRV", tcp=tcp)
            assert {rd.to_text() for rd in again.answer[0]} == {f"0 100 80 {FRONTEND}."}
        assert not [name for name in served.upstream.names() if "cluster.local" in name]

    def test_forwarded_names(self, served: Served) -> None:
        outside = served.ask("example.org")
        # `cache 30` caps the upstream's 300, in the first reply already.
        assert rrset_texts(outside.answer) == {"example.org. 30 IN A 192.0.2.80"}
        assert not outside.flags & dns.flags.AA
        over_tcp = served.ask("example.org", tcp=True)
        assert {rd.to_text() for rd in over_tcp.answer[0]} == {"192.0.2.80"}
        assert over_tcp.answer[0].ttl <= 30
        # A reverse name the cluster lacks falls through `kubernetes` to `forward`.
        reverse = served.reverse("8.8.8.8")
        assert rrset_texts(reverse.answer) == {"8.8.8.8.in-addr.arpa. 30 IN PTR dns.google."}
        assert {"example.org", "8.8.8.8.in-addr.arpa"} <= set(served.upstream.names())
        assert not served.stub.names()

    def test_health_ready_and_metrics_on_their_ports(self, served: Served) -> None:
        assert http_get(served.ports["health"], "/health") == (200, "OK")
        assert http_get(served.ports["ready"], "/ready")[0] == 200
        status, text = http_get(served.ports["metrics"], "/metrics")
        assert status == 200 and "coredns_dns_requests_total" in text


class StubDomain:
    """custom/consul.server: `example.consul:53 { errors; cache 30; forward . UPSTREAM }`."""

    def test_the_stub_domain_through_its_own_block(self, served: Served) -> None:
        for tcp in (False, True):
            stubbed = served.ask("web.example.consul", tcp=tcp)
            assert {rd.to_text() for rd in stubbed.answer[0]} == {"192.0.2.53"}
            assert stubbed.answer[0].ttl <= 30  # its block's `cache 30`
        first = served.stub.names()
        assert first and set(first) == {"web.example.consul"}
        assert "web.example.consul" not in served.upstream.names()


@parametrized("k3s")
class TestK3s(StubDomain):
    def test_node_hosts_names(self, served: Served) -> None:
        node = served.ask("k3s-server-0")
        assert node.flags & dns.flags.AA
        # `ttl 60`, capped by `cache 30`, which CoreDNS runs before `hosts`.
        assert rrset_texts(node.answer) == {"k3s-server-0. 30 IN A 172.18.0.2"}
        six = served.ask("k3s-server-0", "AAAA")
        assert rrset_texts(six.answer) == {"k3s-server-0. 30 IN AAAA fd00:18::2"}
        for tcp in (False, True):
            agent = served.ask("K3S-AGENT-1", tcp=tcp)
            assert {rd.to_text() for rd in agent.answer[0]} == {"172.18.0.4"}
        ptr = served.reverse("172.18.0.4")
        assert rrset_texts(ptr.answer) == {"4.0.18.172.in-addr.arpa. 30 IN PTR k3s-agent-1."}
        # A node without an IPv6 address: the name exists, so NODATA, not the upstream's.
        nodata = served.ask("k3s-agent-0", "AAAA")
        assert nodata.rcode() == dns.rcode.NOERROR and not nodata.answer
        assert not [name for name in served.upstream.names() if name.startswith("k3s-")]

    def test_names_not_in_node_hosts_fall_through(self, served: Served) -> None:
        # `fallthrough`: to kubernetes, then to forward (the upstream has no such node).
        other = served.ask("k3s-agent-9")
        assert other.rcode() == dns.rcode.NXDOMAIN
        assert [rrset.name.to_text() for rrset in other.authority] == ["test."]
        assert "k3s-agent-9" in served.upstream.names()
        cluster = served.reverse("10.96.10.10")
        assert {rd.to_text() for rd in cluster.answer[0]} == {f"{FRONTEND}."}

    def test_the_override_logs_every_query(self, served: Served) -> None:
        # custom/log.override: `log`, imported into the default server block.
        served.ask("web.shop.svc.cluster.local")
        want = '"A IN web.shop.svc.cluster.local. udp'
        assert wait_until(lambda: want in served.stdout.read_text(), 5), (
            served.stdout.read_text() or served.server.log()
        )


@parametrized("aks")
class TestAks(StubDomain):
    @pytest.mark.parametrize(
        ("name", "rtype"),
        [
            (AKS_SEARCH, "A"),
            (AKS_SEARCH, "AAAA"),
            (AKS_SEVEN, "A"),
            ("reddog.microsoft.com", "A"),
            ("web.reddog.microsoft.com", "TXT"),
        ],
    )
    def test_the_templates_answer_nxdomain(self, served: Served, name: str, rtype: str) -> None:
        for tcp in (False, True):
            reply = served.ask(name, rtype, tcp=tcp)
            assert reply.rcode() == dns.rcode.NXDOMAIN, reply
            assert reply.flags & dns.flags.AA
            assert not reply.answer and not reply.authority
        assert name not in served.upstream.names()

    def test_shorter_names_fall_through_the_template(self, served: Served) -> None:
        vm = served.ask(AKS_VM)
        assert rrset_texts(vm.answer) == {f"{AKS_VM}. 30 IN A 10.224.0.4"}
        assert AKS_VM in served.upstream.names()

    def test_the_override_adds_hosts_entries(self, served: Served) -> None:
        # custom/hosts.override: Microsoft's example, with `fallthrough`.
        entry = served.ask("example1.org")
        assert entry.flags & dns.flags.AA
        assert rrset_texts(entry.answer) == {"example1.org. 30 IN A 10.0.0.1"}
        ptr = served.reverse("10.0.0.1")
        assert rrset_texts(ptr.answer) == {"1.0.0.10.in-addr.arpa. 30 IN PTR example1.org."}
        assert "example1.org" not in served.upstream.names()
        # Other names fall through to kubernetes, and on to forward.
        assert {rd.to_text() for rd in served.ask(FRONTEND).answer[0]} == {"10.96.10.10"}
        assert {rd.to_text() for rd in served.ask("example.org").answer[0]} == {"192.0.2.80"}


@parametrized("kubespray")
class TestKubespray:
    def test_forward_prefers_udp(self, served: Served) -> None:
        # Asked over TCP, forwarded over UDP first (`prefer_udp`).
        reply = served.ask("prefer-udp.example.org", tcp=True)
        assert {rd.to_text() for rd in reply.answer[0]} == {"192.0.2.81"}
        asked = [proto for proto, name, _ in served.upstream.queries if name.startswith("prefer")]
        assert asked == ["udp"]
        # A truncated UDP reply is asked again over TCP.
        big = served.ask("big.example.org", tcp=True)
        assert len(big.answer[0]) == len(BIG)
        asked = [proto for proto, name, _ in served.upstream.queries if name == "big.example.org"]
        assert asked == ["udp", "tcp"]
