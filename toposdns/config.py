"""Validated settings for the server, built from its parsed command line.

Every option is checked here, with a message that says what to do; `cli.py` only parses and
reports. The only files read are the small ones options name: resolv.conf for upstreams and
search domains.
"""

from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path

from toposdns.resolve.resolver import REVERSE_ZONES, ResolverConfig
from toposdns.serve.forward import Upstream, resolv_conf_upstreams
from toposdns.serve.forward_cache import CachePolicy, CacheSettings
from toposdns.wire.codes import Name
from toposdns.workers.cpus import usable_cpus

DEFAULT_ZONES = ("cluster.local", "in-addr.arpa", "ip6.arpa")
POD_MODES = ("disabled", "insecure", "verified")
#: Where the node's search domains come from: the server's own resolv.conf, the node's when the
#: pod has `dnsPolicy: Default` (CoreDNS's kubernetes plugin reads the same file).
DEFAULT_RESOLV_CONF = Path("/etc/resolv.conf")
#: The kubelet writes at most 32 names in a pod's search line (MaxDNSSearchPaths).
MAX_SEARCH_DOMAINS = 32


class ConfigError(ValueError):
    """A setting that cannot work, with what to do about it."""


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Everything `toposdns serve` needs."""

    snapshot: Path | None
    #: Larger snapshot files are refused before they are read.
    snapshot_max_bytes: int = 64 * 1024 * 1024
    listen_host: str = "0.0.0.0"
    listen_port: int = 53
    resolver: ResolverConfig = field(default_factory=ResolverConfig)
    #: Forwarders whose EDNS Client Subnet is believed (none by default).
    ecs_trust: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    tcp_idle_timeout: float = 10.0
    #: Once a TCP message's first byte is in, the rest must follow within this many seconds.
    tcp_read_timeout: float = 3.0
    tcp_max_connections: int = 1024
    #: /health, /ready, /explain and /metrics on one address, for local use; None: none.
    http: tuple[str, int] | None = None
    #: Each endpoint on an address of its own, as CoreDNS's health, ready and prometheus
    #: plugins (their Corefile defaults: :8080, :8181, :9153); None: not there.
    health: tuple[str, int] | None = None
    ready: tuple[str, int] | None = None
    metrics: tuple[str, int] | None = None
    #: /explain tells where every client is placed: only on an address given for it.
    explain: tuple[str, int] | None = None
    #: Without a snapshot: the kubeconfig to use (None: in-cluster, else ~/.kube/config).
    kubeconfig: Path | None = None
    #: How long to wait for the first sync before answering anyway.
    startup_timeout: float = 5.0
    #: Where names outside the zones go; empty: they are refused.
    upstreams: tuple[Upstream, ...] = ()
    #: After SIGTERM, how long to keep answering with /ready failing.
    lameduck: float = 5.0
    #: Forwarded queries in flight at most; more get REFUSED (CoreDNS `max_concurrent`).
    max_concurrent: int = 1000
    #: The cache of forwarded answers (CoreDNS `cache`).
    cache: CacheSettings = field(default_factory=CacheSettings)
    #: Vary the order of A, AAAA and MX records from reply to reply (CoreDNS `loadbalance`).
    loadbalance: bool = False
    #: Processes answering DNS; above 1, a supervisor runs the source and forks them.
    workers: int = 1

    def http_listeners(self) -> list[tuple[tuple[str, int], set[str]]]:
        """Each HTTP address to listen on, with the paths served there: the endpoints given
        one address share a listener (but port 0 picks a new port each time)."""
        given = (
            (self.http, ("/health", "/ready", "/explain", "/metrics")),
            (self.health, ("/health",)),
            (self.ready, ("/ready",)),
            (self.explain, ("/explain",)),
            (self.metrics, ("/metrics",)),
        )
        listeners: list[tuple[tuple[str, int], set[str]]] = []
        for address, paths in given:
            if address is None:
                continue
            same = [have for at, have in listeners if at == address and address[1] != 0]
            if same:
                same[0].update(paths)
            else:
                listeners.append((address, set(paths)))
        return listeners

    @property
    def serves_metrics(self) -> bool:
        """Whether some address serves /metrics (queries are counted only then)."""
        return self.http is not None or self.metrics is not None


def parse_zones(values: list[str]) -> tuple[tuple[Name, ...], Name]:
    """Zones from repeatable, comma-separated `--zone` values.

    Returns the lower-cased zones in order, and the first non-reverse zone in its given case,
    which PTR answers point into.
    """
    texts = [part.strip() for value in values for part in value.split(",") if part.strip()]
    zones: list[Name] = []
    primary: Name | None = None
    for text in texts or DEFAULT_ZONES:
        labels = tuple(label for label in text.rstrip(".").split(".")) if text != "." else ()
        if any(not label or len(label) > 63 for label in labels):
            raise ConfigError(f"--zone {text!r}: not a domain name")
        lower = tuple(label.lower() for label in labels)
        if lower in zones:
            continue
        zones.append(lower)
        if primary is None and lower[-2:] not in REVERSE_ZONES:
            primary = labels
    if primary is None:
        raise ConfigError("--zone: at least one zone must be a forward zone, e.g. cluster.local")
    return tuple(zones), primary


def parse_fallthrough(values: list[str], zones: tuple[Name, ...]) -> tuple[Name, ...]:
    """`--fallthrough` zones from repeatable, comma-separated values, as lower-case labels.

    The flag without a zone (an empty value) or with `.` means every zone, as CoreDNS's
    `fallthrough` without arguments. A zone must overlap a served zone, or nothing could fall.
    """
    texts = [part.strip() for value in values for part in value.split(",")]
    found: list[Name] = []
    for text in texts:
        if text in ("", "."):
            labels: Name = ()
        else:
            labels = tuple(label.lower() for label in text.rstrip(".").split("."))
            if any(not label or len(label) > 63 for label in labels):
                raise ConfigError(f"--fallthrough {text!r}: not a domain name")
        if not any(
            labels[len(labels) - len(zone) :] == zone or zone[len(zone) - len(labels) :] == labels
            for zone in zones
        ):
            served = ", ".join(".".join(zone) or "." for zone in zones)
            raise ConfigError(
                f"--fallthrough {text!r}: holds no name of the served zones ({served}); "
                "name one of them or a zone inside one, e.g. in-addr.arpa"
            )
        if labels not in found:
            found.append(labels)
    return tuple(found)


def parse_search_domains(text: str, source: str) -> tuple[Name, ...]:
    """The search domains of a resolv.conf, lower-cased: the last `search` or `domain` line
    counts, as for the resolver (and miekg/dns's ClientConfigFromReader)."""
    domains: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "search":
            domains = fields[1:]
        elif fields and fields[0] == "domain":
            domains = fields[1:2]
    if len(domains) > MAX_SEARCH_DOMAINS:
        raise ConfigError(
            f"{source}: {len(domains)} search domains; a pod's search line holds at most "
            f"{MAX_SEARCH_DOMAINS}"
        )
    names: list[Name] = []
    for domain in domains:
        if domain == ".":
            continue
        labels = tuple(label.lower() for label in domain.rstrip(".").split("."))
        if any(not label or len(label) > 63 for label in labels):
            raise ConfigError(f"{source}: search domain {domain!r} is not a domain name")
        names.append(labels)
    return tuple(names)


def parse_listen(text: str, option: str = "--listen") -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT; port 0 picks a free port."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"{option} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:5353")
    host = host.strip("[]") or "0.0.0.0"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"{option} {text!r}: {host!r} is not an IP address") from None
    return host, int(port_text)


def check_ttl(ttl: int) -> int:
    """CoreDNS accepts TTLs from 0 to 3600."""
    if not 0 <= ttl <= 3600:
        raise ConfigError(f"--ttl {ttl}: must be between 0 and 3600")
    return ttl


def parse_networks(text: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A comma-separated CIDR list, as `--ecs-trust` takes."""
    networks = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ConfigError(f"--ecs-trust: {part!r} is not a CIDR, e.g. 10.244.0.0/16") from None
    return tuple(networks)


def parse_duration(text: str, option: str) -> float:
    """Seconds from `5`, `5s`, `500ms` or `1m`."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0}
    for suffix in ("ms", "s", "m"):
        if text.endswith(suffix):
            number, scale = text[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = text, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected a duration such as 5s or 500ms") from None
    if value < 0:
        raise ConfigError(f"{option} {text!r}: must not be negative")
    return value


def parse_size(text: str, option: str) -> int:
    """Bytes from `1048576`, `512Ki`, `64Mi` or `1Gi` (Kubernetes quantity suffixes)."""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}
    number, scale = text, 1
    if text[-2:] in units:
        number, scale = text[:-2], units[text[-2:]]
    if not number.isdigit() or int(number) == 0:
        raise ConfigError(f"{option} {text!r}: expected a size such as 64Mi, 512Ki or 1048576")
    return int(number) * scale


def parse_upstreams(text: str) -> tuple[Upstream, ...]:
    """`--upstream IP[:PORT],[V6]:PORT,...`; `none` for no forwarding."""
    if text.strip().lower() == "none":
        return ()
    upstreams = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, port = part, "53"
        if part.startswith("["):
            host, _, port = part[1:].partition("]")
            port = port.removeprefix(":") or "53"
        elif part.count(":") == 1:
            host, port = part.split(":")
        try:
            ipaddress.ip_address(host)
            number = int(port)
        except ValueError:
            number = -1
        if not 0 < number < 65536:
            raise ConfigError(f"--upstream {part!r}: expected IP[:PORT] or [IPv6]:PORT")
        upstreams.append(Upstream(host, number))
    return tuple(upstreams)


MAX_TTL = 2**31 - 1  # RFC 2181 section 8
MAX_CACHE_CAPACITY = 1_000_000


MAX_WORKERS = 1024


def check_workers(value: int) -> int:
    """`--workers`: from 1 to 1024."""
    if not 1 <= value <= MAX_WORKERS:
        raise ConfigError(
            f"--workers {value}: must be between 1 and {MAX_WORKERS}; one per CPU of the pod "
            "(the default) is usually best"
        )
    return value


def check_max_concurrent(value: int) -> int:
    """`--max-concurrent`: at least 1."""
    if value < 1:
        raise ConfigError(
            f"--max-concurrent {value}: must be at least 1 (kubeadm's Corefile: 1000)"
        )
    return value


def parse_cache(
    max_ttl: int | None, success: str | None, denial: str | None, disable: list[str]
) -> CacheSettings:
    """The cache settings from `--cache-max-ttl SECONDS` (both caches, as `cache SECONDS`),
    `--cache-success` and `--cache-denial CAPACITY[,TTL[,MINTTL]]` (as `success CAPACITY TTL
    MINTTL`, whose TTL wins over --cache-max-ttl) and repeatable `--cache-disable
    success|denial[:ZONE,...]` (as `disable success|denial ZONES`; no zones: everywhere)."""
    defaults = CacheSettings()
    policies = {"success": defaults.success, "denial": defaults.denial}
    if max_ttl is not None:
        _check_number("--cache-max-ttl", str(max_ttl), max_ttl, 1, MAX_TTL)
        policies = {kind: replace(p, max_ttl=max_ttl) for kind, p in policies.items()}
    for kind, text in (("success", success), ("denial", denial)):
        if text is not None:
            policies[kind] = _cache_policy(f"--cache-{kind}", text, policies[kind])
    for text in disable:
        kind, _, zones = text.partition(":")
        if kind not in policies:
            raise ConfigError(
                f"--cache-disable {text!r}: expected success or denial, then :ZONE[,ZONE], "
                "e.g. success:cluster.local"
            )
        names = [parse_domain(z.strip(), "--cache-disable") for z in zones.split(",") if z.strip()]
        disabled = policies[kind].disabled + tuple(names or [()])
        policies[kind] = replace(policies[kind], disabled=disabled)
    return CacheSettings(success=policies["success"], denial=policies["denial"])


def _cache_policy(option: str, text: str, policy: CachePolicy) -> CachePolicy:
    parts = [part.strip() for part in text.split(",")]
    if not 1 <= len(parts) <= 3 or not all(part.isdigit() for part in parts):
        raise ConfigError(
            f"{option} {text!r}: expected CAPACITY[,TTL[,MINTTL]] in whole numbers, "
            f"e.g. {option} 10000,30,5"
        )
    numbers = [int(part) for part in parts]
    _check_number(option, text, numbers[0], 1, MAX_CACHE_CAPACITY, "CAPACITY")
    policy = replace(policy, capacity=numbers[0])
    if len(numbers) > 1:
        _check_number(option, text, numbers[1], 1, MAX_TTL, "TTL")
        policy = replace(policy, max_ttl=numbers[1])
    if len(numbers) > 2:
        _check_number(option, text, numbers[2], 0, MAX_TTL, "MINTTL")
        policy = replace(policy, min_ttl=numbers[2])
    return policy


def _check_number(option: str, text: str, value: int, low: int, high: int, what: str = "") -> None:
    if not low <= value <= high:
        subject = f"{what} must be" if what else "must be"
        raise ConfigError(f"{option} {text}: {subject} between {low} and {high}")


def parse_domain(text: str, option: str) -> Name:
    """A domain name as lower-case labels; `.` is the root, ()."""
    if text == ".":
        return ()
    labels = tuple(text.rstrip(".").lower().split("."))
    if any(not label or len(label) > 63 for label in labels):
        raise ConfigError(f"{option}: {text!r} is not a domain name")
    return labels


def resolver_config(args: argparse.Namespace) -> ResolverConfig:
    """The answer options shared by `serve` and `explain`."""
    zones, primary = parse_zones(args.zone)
    if args.autopath_resolv_conf is not None and not args.autopath:
        raise ConfigError("--autopath-resolv-conf: only read with --autopath; add --autopath")
    return ResolverConfig(
        zones=zones,
        ttl=check_ttl(args.ttl),
        pods=args.pods,
        endpoint_pod_names=args.endpoint_pod_names,
        namespaces=frozenset(ns.strip() for ns in args.namespaces.split(",") if ns.strip()),
        primary_zone=primary,
        fallthrough=parse_fallthrough(args.fallthrough, zones),
        autopath=args.autopath,
        autopath_search=read_search_domains(args.autopath_resolv_conf) if args.autopath else (),
    )


#: A resolv.conf is a few lines; reading more than this is a mistake in the path.
MAX_RESOLV_CONF_BYTES = 65536


def read_search_domains(path: Path | None) -> tuple[Name, ...]:
    """The node's search domains for --autopath. A missing default file gives none, as in
    CoreDNS; a file named on the command line must be readable."""
    try:
        with open(path or DEFAULT_RESOLV_CONF, "rb") as file:
            data = file.read(MAX_RESOLV_CONF_BYTES + 1)
    except OSError as exc:
        if path is None:
            return ()
        raise ConfigError(
            f"--autopath-resolv-conf {path}: cannot read it ({exc.strerror or exc}); "
            "name the node's resolv.conf"
        ) from None
    source = str(path or DEFAULT_RESOLV_CONF)
    if len(data) > MAX_RESOLV_CONF_BYTES:
        raise ConfigError(f"{source}: larger than {MAX_RESOLV_CONF_BYTES} bytes: not a resolv.conf")
    return parse_search_domains(data.decode("latin-1"), source)


def upstreams_of(args: argparse.Namespace) -> tuple[Upstream, ...]:
    """--upstream, or with none the nameservers of resolv.conf (none with --snapshot)."""
    if args.upstream is not None:
        return parse_upstreams(args.upstream)
    if args.snapshot is not None:
        return ()  # a snapshot is a closed world: a demo or a test must not reach out
    return tuple(resolv_conf_upstreams())


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """`toposdns serve`'s settings from its parsed command line, every one validated."""
    host, port = parse_listen(args.listen)
    return ServeConfig(
        snapshot=args.snapshot,
        snapshot_max_bytes=parse_size(args.snapshot_max_bytes, "--snapshot-max-bytes"),
        listen_host=host,
        listen_port=port,
        resolver=resolver_config(args),
        ecs_trust=parse_networks(args.ecs_trust),
        tcp_idle_timeout=check_seconds("--tcp-idle-timeout", args.tcp_idle_timeout),
        tcp_read_timeout=check_seconds("--tcp-read-timeout", args.tcp_read_timeout),
        tcp_max_connections=check_count("--tcp-max-connections", args.tcp_max_connections),
        http=parse_listen(args.http, "--http") if args.http else None,
        health=parse_listen(args.health, "--health") if args.health else None,
        ready=parse_listen(args.ready, "--ready") if args.ready else None,
        metrics=parse_listen(args.metrics, "--metrics") if args.metrics else None,
        explain=parse_listen(args.explain, "--explain") if args.explain else None,
        kubeconfig=args.kubeconfig,
        startup_timeout=check_seconds("--startup-timeout", args.startup_timeout, low=0.0),
        upstreams=upstreams_of(args),
        lameduck=parse_duration(args.lameduck, "--lameduck"),
        max_concurrent=check_max_concurrent(args.max_concurrent),
        cache=parse_cache(
            args.cache_max_ttl, args.cache_success, args.cache_denial, args.cache_disable
        ),
        loadbalance=args.loadbalance,
        workers=check_workers(usable_cpus() if args.workers is None else args.workers),
    )


def check_seconds(option: str, value: float, low: float = 0.001, high: float = 3600.0) -> float:
    """A time in seconds within sane bounds, as `--ttl` is checked."""
    if not low <= value <= high:
        raise ConfigError(f"{option} {value:g}: must be between {low:g} and {high:g} seconds")
    return value


def check_count(option: str, value: int, low: int = 1, high: int = 1_000_000) -> int:
    """A count within sane bounds."""
    if not low <= value <= high:
        raise ConfigError(f"{option} {value}: must be between {low} and {high}")
    return value
