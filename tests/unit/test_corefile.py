"""The Corefile, read as CoreDNS reads it, into the configuration the flags build."""

from __future__ import annotations

from pathlib import Path

import dnslib
import pytest

from toposdns.cli import main
from toposdns.config import Reading, ServeConfig
from toposdns.corefile import read_corefile
from toposdns.options import ConfigError
from toposdns.serve.acl import Acl
from toposdns.serve.forward import Upstream
from toposdns.serve.listen import ListenOptions

#: kubeadm's Corefile, as `kubeadm init` writes it into the coredns ConfigMap.
KUBEADM = """\
.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
"""


def read(tmp_path: Path, text: str, name: str = "Corefile") -> ServeConfig:
    path = tmp_path / name
    path.write_text(text)
    return read_corefile(path).done()


def test_kubeadms_corefile(tmp_path: Path) -> None:
    config = read(tmp_path, KUBEADM)
    k8s = config.kubernetes
    assert k8s.zones == (("cluster", "local"), ("in-addr", "arpa"), ("ip6", "arpa"))
    assert (k8s.ttl, k8s.pods) == (30, "insecure")
    assert k8s.fallthrough == (("in-addr", "arpa"), ("ip6", "arpa"))
    assert (config.bind.host, config.bind.port) == ("0.0.0.0", 53)
    assert config.health.address == ("0.0.0.0", 8080) and config.health.lameduck == 5
    assert config.ready.address == ("0.0.0.0", 8181)
    assert config.prometheus.address == ("0.0.0.0", 9153)
    assert config.forward.max_concurrent == 1000
    assert config.upstreams  # /etc/resolv.conf's nameservers
    for policy in (config.cache.success, config.cache.denial):
        assert policy.max_ttl == 30 and policy.disabled == (("cluster", "local"),)
    assert config.loadbalance.round_robin
    assert config.reload.enabled and config.reload.interval == 30
    assert not config.autopath.enabled and config.toposdns.http is None


def test_flags_and_corefile_build_the_same_configuration(tmp_path: Path) -> None:
    flags = {
        "--listen": "127.0.0.1:5353",
        "--zone": ["cluster.local,in-addr.arpa"],
        "--ttl": "30",
        "--pods": "verified",
        "--endpoint-pod-names": True,
        "--fallthrough": ["in-addr.arpa"],
        "--zonal": True,
        "--ignore-empty-service": True,
        "--upstream": "192.0.2.53:5300",
        "--max-concurrent": "10",
        "--cache-max-ttl": "30",
        "--cache-success": "100,20,2",
        "--cache-disable": ["denial:cluster.local"],
        "--loadbalance": True,
        "--lameduck": "2s",
        "--ecs-trust": "10.0.0.0/8",
        "--locator-namespaces": "toposdns,infra",
        "--workers": "1",
        "--startup-timeout": "3s",
        "--tcp-idle-timeout": "4s",
    }
    corefile = """
    .:5353 {
        bind 127.0.0.1
        kubernetes cluster.local in-addr.arpa {
            ttl 30
            pods verified
            endpoint_pod_names
            fallthrough in-addr.arpa
            zonal
            ignore empty_service
            startup_timeout 3s
        }
        forward . 192.0.2.53:5300 {
            max_concurrent 10
        }
        cache 30 {
            success 100 20 2
            disable denial cluster.local
        }
        loadbalance round_robin
        health {
            lameduck 2s
        }
        toposdns {
            ecs_trust 10.0.0.0/8
            locator_namespaces toposdns infra
            workers 1
            tcp_idle_timeout 4s
        }
    }
    """
    from_flags = Reading().read_flags(flags).done()
    from_file = read(tmp_path, corefile)
    # What only a Corefile says: health is served at CoreDNS's address.
    assert from_file.health.address == ("0.0.0.0", 8080)
    from_file = from_file.__class__(
        **{
            name: getattr(from_file, name)
            for name in ServeConfig.__dataclass_fields__
            if name != "health"
        },
        health=from_flags.health,
    )
    assert from_file == from_flags
    assert from_file.upstreams == (Upstream("192.0.2.53", 5300),)


def test_syntax_comments_quotes_environment_snippets_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTER_DOMAIN", "example.internal")
    monkeypatch.setenv("DNS_TTL", "7")
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "a.conf").write_text("loadbalance\n")
    config = read(
        tmp_path,
        """
        # a comment
        (common) {
            errors   # trailing comment
            loop
        }
        dns://.:1053 {
            import common
            import extra/*.conf
            kubernetes {$CLUSTER_DOMAIN} "in-addr.arpa" {
                ttl {$DNS_TTL}
            }
        }
        """,
    )
    assert config.kubernetes.zones == (("example", "internal"), ("in-addr", "arpa"))
    assert config.kubernetes.ttl == 7 and config.bind.port == 1053
    assert config.loadbalance.round_robin
    # What a Corefile leaves out is off, as in CoreDNS.
    assert config.upstreams == () and config.health.lameduck == 0
    assert config.cache.success.disabled == ((),) and not config.reload.enabled


def test_one_block_without_braces_and_zones_from_the_key(tmp_path: Path) -> None:
    config = read(tmp_path, "cluster.local:5300\nkubernetes\n")
    assert config.kubernetes.zones == (("cluster", "local"),) and config.bind.port == 5300


def test_log_with_names_and_classes(tmp_path: Path) -> None:
    assert not read(tmp_path, ".:53 {\n  kubernetes\n}\n").log.enabled  # off unless given
    plain = read(tmp_path, ".:53 {\n  kubernetes\n  log\n}\n").log
    assert plain.enabled and plain.names == () and plain.classes == frozenset()
    some = read(
        tmp_path, ".:53 {\n  kubernetes\n  log Example.ORG {\n    class denial error\n  }\n}\n"
    ).log
    assert some.names == (("example", "org"),) and some.classes == {"denial", "error"}
    every = read(tmp_path, ".:53 {\n  kubernetes\n  log {\n    class all\n  }\n}\n").log
    assert every.classes == frozenset()


def test_server_blocks_beside_the_kubernetes_one(tmp_path: Path) -> None:
    config = read(
        tmp_path,
        """\
        cluster.local:53 {
            kubernetes
            prometheus
            forward . 192.0.2.1
        }
        . {
            errors
            forward . 192.0.2.2:5353 {
                max_concurrent 10
            }
            cache 30
            loop
        }
        consul.local:53 Service.Consul:53 {
            prometheus
            forward . 192.0.2.3
        }
        """,
    )
    assert config.block_zones == (("cluster", "local"),)
    assert config.upstreams == (Upstream("192.0.2.1", 53),)
    root, consul = config.blocks
    assert root.zones == ((),) and root.place.endswith("/Corefile:6")
    assert root.forward.upstreams == (Upstream("192.0.2.2", 5353),)
    assert root.forward.max_concurrent == 10
    assert root.cache.success.max_ttl == 30 and root.cache.success.disabled == ()
    assert consul.zones == (("consul", "local"), ("service", "consul"))
    # A block without cache keeps nothing, as in CoreDNS.
    assert consul.cache.success.disabled == ((),) and consul.cache.denial.disabled == ((),)


PORTS = """\
.:53 {
    kubernetes cluster.local
    prometheus :9153
    forward . 192.0.2.1
}
consul.local:53 {
    forward . 192.0.2.3
}
.:5353 {
    forward . 192.0.2.2
    errors
    prometheus :9153
}
example.org:5353 {
    forward . 192.0.2.4
}
example.org:5354 {
    bind 127.0.0.2
    forward . 192.0.2.5
}
example.org:5353 {
    bind 127.0.0.3
    forward . 192.0.2.6
}
consul.local:53 {
    bind 0.0.0.0
    cache
}
"""


def test_server_blocks_on_ports_of_their_own(tmp_path: Path) -> None:
    """Each port (and bind address) a server of its own, as CoreDNS's: a zone may be served
    once per address, and a block on the kubernetes block's port is routed beside it."""
    path = tmp_path / "Corefile"
    path.write_text(PORTS.replace("consul.local:53 {\n    bind 0.0.0.0\n    cache\n}\n", ""))
    config = read_corefile(path).done()
    consul, root, example, bound, other = config.blocks
    assert (consul.port, consul.bind) == (None, None)
    assert (root.port, root.bind, example.port) == (5353, None, 5353)
    assert (bound.port, bound.bind, other.port, other.bind) == (
        5354,
        "127.0.0.2",
        5353,
        "127.0.0.3",
    )
    # CoreDNS's plugin order, for coredns_plugin_enabled; `bind` is not in the chain.
    assert root.plugins == ("prometheus", "errors", "forward") and bound.plugins == ("forward",)
    assert config.port_blocks == (consul,)
    assert config.servers() == {
        ListenOptions("0.0.0.0", 5353): (root, example),
        ListenOptions("127.0.0.2", 5354): (bound,),
        ListenOptions("127.0.0.3", 5353): (other,),
    }
    # Flags that follow move the kubernetes block, its port's blocks with it; the others
    # listen on its host unless they bind their own.
    moved = read_corefile(path).read_flags({"--listen": "127.0.0.1:1053"}).done()
    assert moved.port_blocks == (moved.blocks[0],)
    assert list(moved.servers()) == [
        ListenOptions("127.0.0.1", 5353),
        ListenOptions("127.0.0.2", 5354),
        ListenOptions("127.0.0.3", 5353),
    ]
    # A bind that says the kubernetes block's address is no address of its own.
    with pytest.raises(ConfigError, match="the zone consul.local on port 53 is another"):
        read(tmp_path, PORTS)


# Each: a Corefile CoreDNS would reject, or one toposdns cannot serve, and the line it gets.
REFUSED = [
    (".:53 {\n    kubernetes\n    file db.example.org\n}\n", "Corefile:3: file: unknown plugin;"),
    (".:53 {\n    kubernetes {\n        tls a b c\n    }\n}\n", "Corefile:3: tls: not an option"),
    (".:53 {\n  kubernetes {\n    ttl 3601\n  }\n}\n", "Corefile:3: ttl 3601: must be between"),
    (".:53 {\n  kubernetes {\n    pods maybe\n  }\n}\n", "Corefile:3: pods maybe: expected one"),
    (".:53 {\n  kubernetes\n  kubernetes\n}\n", "Corefile:3: kubernetes: given twice"),
    (
        ".:53 {\n  kubernetes\n}\n.:54 {\n  kubernetes\n}\n",
        "Corefile:4: .:54: a second server block with kubernetes (the first is at line 1)",
    ),
    (
        ".:53 {\n  kubernetes\n}\na.b:54 c.d:55 {\n  forward . 1.1.1.1\n}\n",
        "Corefile:4: a.b:54: every key of the server block must have the same port",
    ),
    (
        ".:53 {\n  kubernetes\n}\n.:54 {\n  forward . 1.1.1.1\n}\n.:54 {\n  cache\n}\n",
        "Corefile:7: .:54: the zone . on port 54 is another server block's already (line 4)",
    ),
    (
        ".:53 {\n  kubernetes\n}\n.:54 {\n  bind 127.0.0.2\n}\n.:54 {\n  bind 127.0.0.2\n}\n",
        "Corefile:7: .:54: the zone . on port 54 on 127.0.0.2 is another server block's already",
    ),
    (
        ".:53 {\n  kubernetes\n}\nconsul.local:53 {\n  bind 127.0.0.2\n}\n",
        "Corefile:5: bind: a bind address of its own in a server block on the kubernetes "
        "block's port 53: toposdns serves that port's blocks on the kubernetes block's address "
        "(0.0.0.0); give the bind there, or put this block on a port of its own",
    ),
    (
        ".:53 {\n  kubernetes\n}\n.:54 {\n  bind eth0\n}\n",
        "Corefile:5: bind eth0: 'eth0' is not an IP address",
    ),
    (
        ".:53 {\n  kubernetes\n}\n.:53 {\n  forward . 1.1.1.1\n}\n",
        "Corefile:4: .:53: the zone . on port 53 is another server block's already (line 1)",
    ),
    (
        ".:53 {\n  kubernetes\n}\na.b:53 {\n  forward . 1.1.1.1\n}\nA.b:53 {\n  cache\n}\n",
        "Corefile:7: A.b:53: the zone A.b on port 53 is another server block's already (line 4)",
    ),
    (
        ".:53 {\n  kubernetes\n}\nconsul.local {\n  acl\n}\n",
        "Corefile:5: acl: not supported in a server block without kubernetes; supported there: "
        "bind, cache, errors, forward, hosts, log, loop, prometheus, rewrite, template",
    ),
    (
        ".:53 {\n  kubernetes\n}\nconsul.local {\n  log\n}\n",
        "Corefile:5: log: log in a server block without kubernetes: toposdns logs as the "
        "kubernetes block's plain `log` says",
    ),
    (
        ".:53 {\n  kubernetes\n  prometheus :9153\n}\nconsul.local {\n  prometheus :9154\n}\n",
        "Corefile:6: prometheus: a prometheus address other than the kubernetes block's",
    ),
    (".:53 {\n  kubernetes\n", "Corefile:1: .:53: this block is never closed"),
    (".:53 {\n  health { lameduck 5s }\n}\n", "Corefile:2: {: a { must end its line"),
    (".:53 {\n  errors\n}\n", "Corefile:1: .:53: no kubernetes plugin in any server block"),
    ("tls://.:853 {\n  kubernetes\n}\n", "Corefile:1: tls://.:853: tls:// servers are not"),
    (".:53 {\n  kubernetes\n  forward example.org 1.1.1.1\n}\n", "only is not supported"),
    (".:53 {\n  kubernetes\n  reload 1s\n}\n", "Corefile:3: reload 1s: the interval must be"),
    (".:53 {\n  kubernetes\n  cache 30 example..org\n}\n", "Corefile:3: cache 30 example..org"),
    (".:53 {\n  kubernetes\n  health :8080 :8081\n}\n", "expected at most one address"),
    (".:53 {\n  kubernetes {\n    kubeconfig /k ctx\n  }\n}\n", "Corefile:3: kubeconfig /k ctx"),
    (".:53 {\n  kubernetes\n  loop 1\n}\n", "Corefile:3: loop: takes no arguments"),
    (".:53 {\n  kubernetes\n  log . {combined}\n}\n", "Corefile:3: log . {combined}: a log"),
    (".:53 {\n  kubernetes\n  log {\n    class some\n  }\n}\n", "Corefile:4: class some"),
    (".:53 {\n  kubernetes\n  import missing\n}\n", "Corefile:3: missing: no snippet"),
    ('.:53 {\n  kubernetes "cluster.local\n}\n', "Corefile:2: a quote that is never closed"),
    ("(s) {\n  import s\n}\n.:53 {\n  import s\n  kubernetes\n}\n", "nested more than 10"),
    # plugin/kubernetes/setup_test.go: the options' argument counts
    (".:53 {\n  kubernetes {\n    namespaces\n  }\n}\n", "Corefile:3: namespaces: expected"),
    (".:53 {\n  kubernetes {\n    endpoint_pod_names x\n  }\n}\n", "takes no value"),
    (".:53 {\n  kubernetes {\n    pods giant_seed\n  }\n}\n", "expected one of disabled"),
    (".:53 {\n  kubernetes {\n    ttl\n  }\n}\n", "Corefile:3: ttl: expected one value"),
    (".:53 {\n  kubernetes {\n    startup_timeout\n  }\n}\n", "Corefile:3: startup_timeout"),
    (".:53 {\n  kubernetes in-addr.arpa\n}\n", "at least one zone must be a forward zone"),
    (".:53 {\n  kubernetes {\n    zonal yes\n  }\n}\n", "Corefile:3: zonal yes: takes no value"),
    (".:53 {\n  kubernetes {\n    noendpoints 1\n  }\n}\n", "noendpoints 1: takes no value"),
    (".:53 {\n  kubernetes {\n    ignore x\n  }\n}\n", "ignore x: unable to parse ignore"),
    (
        ".:53 {\n  kubernetes {\n    zonal\n    noendpoints\n  }\n}\n",
        "zonal requires the endpoint cache; remove noendpoints",
    ),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_refused_with_file_line_and_word(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        read(tmp_path, text)
    shown = str(error.value).replace(str(tmp_path) + "/", "")
    assert message in shown and "\n" not in shown


def test_an_unknown_plugin_lists_what_is_supported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="supported: (acl|any|autopath), "):
        read(tmp_path, ".:53 {\n  kubernetes\n  file db.example.org\n}\n")


def test_dash_conf_starts_the_server_from_the_corefile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[object] = []
    monkeypatch.setattr("toposdns.server.run", started.append)
    path = tmp_path / "Corefile"
    path.write_text(".:53 {\n  kubernetes\n  foo\n}\n")
    assert main(["-conf", str(path)]) == 2
    assert f"{path}:3: foo: unknown plugin" in capsys.readouterr().err and not started
    path.write_text(".:0 {\n  kubernetes cluster.local\n  toposdns {\n    workers 1\n  }\n}\n")
    assert main([f"-conf={path}", "--snapshot", "x.yaml"]) == 0 and len(started) == 1
    started[0].close()  # type: ignore[attr-defined]


def test_the_bounds_on_what_a_query_costs_are_read_as_flags_are(tmp_path: Path) -> None:
    corefile = ".:53 {\n  kubernetes\n  bufsize 1400\n  any\n"
    corefile += "  toposdns {\n    cache_max_bytes 8Mi\n    forward_cache_max_bytes 2Mi\n  }\n}\n"
    config = read(tmp_path, corefile)
    assert (config.bufsize.size, config.any.minimal) == (1400, True)
    assert (config.cache_bounds.max_bytes, config.cache_bounds.forward_max_bytes) == (
        8 << 20,
        2 << 20,
    )
    with pytest.raises(ConfigError, match=r"Corefile:3: bufsize 100: must be between 512"):
        read(tmp_path, ".:53 {\n  kubernetes\n  bufsize 100\n}\n")


# plugin/acl's README examples and acl_test.go's cases, through the Corefile: (acl block,
# query source, type, name) -> what the client gets.
EXCEPT = "acl {\n    allow net 192.168.1.0/24\n    block net 192.168.0.0/16\n  }"
ONLY = "acl {\n    allow net 192.168.0.0/24 192.168.1.0/24\n    block\n  }"
ACL_CASES = [
    ("acl {\n    block type A net 192.168.0.0/16\n  }", "192.168.1.2", "A", "REFUSED"),
    ("acl {\n    block type A net 192.168.0.0/16\n  }", "192.168.1.2", "AAAA", "pass"),
    ("acl {\n    block type A net 192.168.0.0/16\n  }", "10.0.0.1", "A", "pass"),
    ("acl {\n    filter type A net 192.168.0.0/16\n  }", "192.168.1.2", "A", "NOERROR"),
    (
        "acl {\n    allow net 192.168.1.0/24\n    block net 192.168.0.0/16\n  }",
        "192.168.1.9",
        "A",
        "pass",
    ),
    (
        "acl {\n    allow net 192.168.1.0/24\n    block net 192.168.0.0/16\n  }",
        "192.168.2.9",
        "A",
        "REFUSED",
    ),
    (
        "acl {\n    allow net 192.168.0.0/24 192.168.1.0/24\n    block\n  }",
        "10.1.1.1",
        "MX",
        "REFUSED",
    ),
    ("acl a.example.org {\n    block net 192.168.1.0/24\n  }", "192.168.1.5", "A", "REFUSED"),
    ("acl example.com {\n    block net 192.168.1.0/24\n  }", "192.168.1.5", "A", "pass"),
    ("acl {\n    drop net *\n  }", "::1", "A", "drop"),
    ("acl {\n    block type * net 2001:db8::/32\n  }", "2001:db8::5", "TXT", "REFUSED"),
    ("acl {\n    allow net 10.0.0.0/8\n  }\n  acl {\n    block\n  }", "10.2.3.4", "A", "pass"),
    ("acl {\n    allow net 10.0.0.0/8\n  }\n  acl {\n    block\n  }", "11.2.3.4", "A", "REFUSED"),
]


@pytest.mark.parametrize(("block", "source", "qtype", "expected"), ACL_CASES)
def test_acl(tmp_path: Path, block: str, source: str, qtype: str, expected: str) -> None:
    config = read(tmp_path, f".:53 {{\n  kubernetes\n  {block}\n}}\n")
    query = dnslib.DNSRecord.question("a.example.org", qtype)
    query.header.id = 4321
    verdict = Acl(config.acl).screen(bytes(query.pack()), source)
    if expected in ("pass", "drop"):
        assert verdict == (None if expected == "pass" else b"")
        return
    assert verdict is not None
    reply = dnslib.DNSRecord.parse(verdict)
    assert dnslib.RCODE[reply.header.rcode] == expected and reply.header.id == 4321
    assert reply.header.qr and reply.header.rd and not reply.rr
    (opt,) = reply.ar
    assert opt.rtype == dnslib.QTYPE.OPT and opt.rclass == 4096 and opt.ttl == 0x8000
    info = 15 if expected == "REFUSED" else 17  # Extended DNS Error Blocked, Filtered
    assert opt.rdata[0].code == 15 and opt.rdata[0].data == info.to_bytes(2, "big")


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("acl {\n    deny net 10.0.0.0/8\n  }", "Corefile:4: deny: not an option of acl"),
        ("acl {\n    block net 10.0.0.300/8\n  }", "'10.0.0.300/8' is not an address or CIDR"),
        ("acl {\n    block type BOGUS\n  }", "'BOGUS' is not a record type"),
        ("acl {\n    block 10.0.0.0/8\n  }", "expected `type QTYPE...` and `net SOURCE...`"),
    ],
)
def test_acl_refused(tmp_path: Path, block: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        read(tmp_path, f".:53 {{\n  kubernetes\n  {block}\n}}\n")
    assert message in str(error.value)
