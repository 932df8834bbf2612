"""CoreDNS's `forward` (with the `cache` in front of it): queries for names outside the served
zones go to upstream servers.

`forward FROM TO... { except IGNORED_NAMES...; force_tcp; prefer_udp; expire DURATION;
max_fails INTEGER; tls [CERT KEY] [CA]; tls_servername NAME; policy random|round_robin|
sequential; health_check DURATION [no_rec] [domain FQDN]; failover RCODE...; max_concurrent
MAX }`, as CoreDNS 1.14's README and setup.go read it. TO is `IP[:PORT]`, `[IPv6]:PORT`, `dns://...`,
`tls://IP[%NAME][:PORT]` (DNS over TLS, port 853) or a resolv.conf file; at most 15. Not here:
DNS over HTTPS, host names as TO, and the other options (`next`, `read_timeout`,
`max_idle_conns`, `source_address`, ...), which stop startup with what is supported; one
`forward` per server block.

- FROM: only names under it, and not under an `except` zone (FROM itself always), are
  forwarded; the others go to the next plugin (`forwards`), which in a block without one is
  SERVFAIL, as CoreDNS's `plugin.NextOrFailure`. With FROM `.` and no `except` (kubeadm's),
  nothing is checked per query (`scoped` is False).
- Bounded: at most `max_concurrent` forwarded queries at once (kubeadm's Corefile sets 1000);
  one more gets REFUSED at once, as from CoreDNS's `max_concurrent`. A query has `BUDGET` seconds
  in all, each try at most `timeout`, and at most two passes over the upstreams (CoreDNS's
  defaults: 5 s, 2 s, twice the upstreams).
- One question, one upstream query: a query whose cache key is already on its way upstream waits
  for that answer instead of being sent again. Besides sparing the upstreams a burst of the same
  name, this is what stops a loop through other resolvers from going round (loop.py).
- Upstreams are tried in the order `policy` gives (random by default; round_robin starts one
  further each query; sequential always from the first) among those healthy over the transport
  in use (upstream.py: `max_fails`, `health_check`); when none is, all are, in random order
  (CoreDNS counts this as its health check broken). Every failure moves the query on to the
  next upstream, and so does a reply whose rcode `failover` names, until every upstream has
  given one (the last is then relayed). A reply is relayed, and cached, only if it parses and
  answers the question asked; when the only replies were to other questions the client gets
  FORMERR, as from CoreDNS, and when none came SERVFAIL.
- A query goes upstream over the transport it came by (UDP or TCP), or over TCP with
  `force_tcp`, over UDP with `prefer_udp` (`force_tcp` wins); a truncated UDP reply is asked
  again over TCP. A `tls://` upstream is always asked over TLS. TCP and TLS connections are
  reused (connections.py, `expire`). Upstreams are asked with an EDNS buffer of
  `UPSTREAM_UDP_SIZE` (1232 bytes, DNS Flag Day 2020's size, which needs no IP fragments),
  whatever the client's, so that most answers come back whole over UDP.
- Replies pass through the cache as they pass through CoreDNS's `cache` (forward_cache.py). The
  cache keeps whole answers: a client whose buffer is smaller gets as many whole records as fit
  with TC set, as from the zones, and its retry over TCP is answered from the cache.
- Running out of sockets here (EMFILE and the like) answers SERVFAIL and is logged once; it is
  never counted against an upstream.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import random
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from struct import pack, unpack_from

import dnslib

from toposdns.metrics import (
    FORWARD_HEALTHCHECK_BROKEN,
    FORWARD_MAX_CONCURRENT_REJECTS,
    PROXY_CONN_CACHE_MISSES,
    PROXY_DURATION,
)
from toposdns.options import (
    Network,
    Origin,
    Plugin,
    Setting,
    adds,
    domain,
    domain_as_written,
    integer,
    networks,
    none,
    one,
    seconds,
    sets,
)
from toposdns.serve.chain import Next, Reply, Request, failed
from toposdns.serve.connections import EXPIRE, Connections, tls_context
from toposdns.serve.forward_cache import CacheSettings, Entry, ForwardCache, Refresher
from toposdns.serve.loop import LoopGuard
from toposdns.serve.upstream import (
    HEADER_SIZE,
    MISMATCHES,
    HealthChecks,
    LocalError,
    Upstream,
    UpstreamError,
    UpstreamHealth,
    check_reply,
    send_udp,
)
from toposdns.wire.codes import (
    AAAA,
    AD,
    ANY,
    CNAME,
    FORMERR,
    NS,
    OPT,
    RCODE,
    RCODE_NAMES,
    REFUSED,
    SERVFAIL,
    TC,
    A,
    Name,
)
from toposdns.wire.decode import question_end, read_name, record_spans
from toposdns.wire.encode import encode_bare, encode_minimal_any, encode_opt, truncate
from toposdns.wire.records import RR, name_text

__all__ = [
    "FORWARD",
    "ForwardOptions",
    "Forwarder",
    "Forwarding",
    "Upstream",
    "answer_records",
    "build_query",
    "forwarder_for",
    "loop_checked",
    "parse_upstreams",
    "resolv_conf_upstreams",
]

log = logging.getLogger("toposdns")

BUDGET = 5.0
PASSES = 2
MAX_CONCURRENT = 1000
UPSTREAM_UDP_SIZE = 1232
#: Sources whose `--forward-allow` verdict is remembered at most.
MAX_ADMITTED = 65536
#: CoreDNS's forward takes at most this many upstreams.
MAX_UPSTREAMS = 15
POLICIES = ("random", "round_robin", "sequential")
#: CoreDNS reads `max_fails` as a 32-bit unsigned number.
MAX_FAILS = 2**32 - 1
#: The rcodes `failover` may name, by miekg/dns's names (any letter case): those a reply's
#: header holds, but NOERROR, which CoreDNS refuses there.
FAILOVER_RCODES = {
    "FORMERR": 1, "SERVFAIL": 2, "NXDOMAIN": 3, "NOTIMP": 4, "REFUSED": 5, "YXDOMAIN": 6,
    "YXRRSET": 7, "NXRRSET": 8, "NOTAUTH": 9, "NOTZONE": 10,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ForwardOptions:
    """CoreDNS's `forward FROM TO... { ... }` (`--upstream`, `--max-concurrent`), with its
    defaults."""

    #: Where names outside the zones go; empty: they are refused. None: not configured (the
    #: server then takes resolv.conf's nameservers when watching a cluster).
    upstreams: tuple[Upstream, ...] | None = None
    #: Forwarded queries in flight at most; more get REFUSED.
    max_concurrent: int = MAX_CONCURRENT
    #: `--forward-allow`: the sources whose names outside the zones are forwarded; the rest
    #: get REFUSED (empty: every source, as CoreDNS's `forward`). A Corefile says it with `acl`.
    allow: tuple[Network, ...] = ()
    #: FROM, lower case: only names under it are forwarded (the root: every name).
    zone: Name = ()
    #: `except`: names under these zones are not forwarded (FROM itself always is).
    ignored: tuple[Name, ...] = ()
    #: `force_tcp`: ask the upstreams over TCP whatever the client used.
    force_tcp: bool = False
    #: `prefer_udp`: ask over UDP whatever the client used (TCP when truncated).
    prefer_udp: bool = False
    #: `policy`: the order upstreams are tried in.
    policy: str = "random"
    #: `max_fails`: failures in a row that mark an upstream down; 0: never.
    max_fails: int = 2
    #: `health_check DURATION [no_rec] [domain FQDN]`: seconds between probes of a failing
    #: upstream, whether they ask for recursion, and the name they ask (NS).
    health_check: float = 0.5
    health_recursion: bool = True
    health_domain: Name = ()
    #: `expire`: seconds a TCP or TLS connection is kept idle for reuse.
    expire: float = EXPIRE
    #: `tls [CERT KEY] [CA]`: the files of the TLS client settings (None: not given, the
    #: system's CAs).
    tls: tuple[str, ...] | None = None
    #: `tls_servername`: the name a TLS upstream's certificate must carry.
    tls_servername: str = ""
    #: `failover RCODE...`: replies with these rcodes send the query on to the next upstream.
    failover: frozenset[int] = frozenset()

    @property
    def checks(self) -> HealthChecks:
        """The upstreams' health checks as these options set them."""
        question = b"".join(bytes((len(label),)) + label.encode() for label in self.health_domain)
        return HealthChecks(
            self.max_fails, self.health_check, question + b"\x00" + pack("!HH", NS, 1),
            self.health_recursion,
        )  # fmt: skip


def parse_upstreams(words: Sequence[str], origin: Origin) -> tuple[Upstream, ...]:
    """Upstreams: `IP`, `IP:PORT`, `[IPv6]:PORT`, with `dns://` or `tls://` before any (TLS:
    `IP%NAME` names the certificate, the port is 853 by default), or a resolv.conf file whose
    nameservers are taken, as CoreDNS's `forward . /etc/resolv.conf`."""
    upstreams: list[Upstream] = []
    for word in words:
        scheme, sep, rest = word.partition("://")
        if not sep:
            scheme, rest = "dns", word
        scheme = scheme.lower()
        if scheme == "https":
            raise origin.error(
                f"{word}: DNS over HTTPS is not supported; forward over tls:// or plain DNS"
            )
        if scheme not in ("dns", "tls"):
            raise origin.error(
                f"{word}: {scheme!r} is not supported as a destination protocol in forward; "
                "use dns:// or tls://"
            )
        if scheme == "dns" and _is_file(rest):
            upstreams.extend(_from_file(rest, origin))
            continue
        upstreams.append(_upstream(rest, scheme == "tls", origin))
    if not upstreams:
        raise origin.error("no upstream: the files given have no nameserver line")
    if len(upstreams) > MAX_UPSTREAMS:
        raise origin.error(f"more than {MAX_UPSTREAMS} upstreams, as CoreDNS allows")
    return tuple(upstreams)


def _is_file(text: str) -> bool:
    """A path rather than an address: it has a slash, or names a file here."""
    return "/" in text or (not text[:1].isdigit() and ":" not in text and os.path.isfile(text))


def _from_file(path: str, origin: Origin) -> list[Upstream]:
    try:
        with open(path) as file:
            text = file.read(1 << 16)
    except OSError as exc:
        raise origin.error(f"{path}: cannot read it ({exc.strerror or exc})") from None
    return resolv_conf_nameservers(text)


def _upstream(text: str, tls: bool, origin: Origin) -> Upstream:
    """`HOST[%NAME][:PORT]` or `[HOST[%NAME]]:PORT`, HOST an IP address."""
    host, port = text, ""
    if text.startswith("["):
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    elif text.count(":") == 1:
        host, port = text.split(":")
    host, _, name = host.partition("%")
    number = -1
    try:
        ipaddress.ip_address(host)
        number = int(port or (853 if tls else 53))
    except ValueError:
        pass
    if not 0 < number < 65536:
        example = "tls://9.9.9.9%dns.quad9.net" if tls else "10.0.0.10:53"
        raise origin.error(
            f"{text!r}: expected IP[:PORT] or [IPv6]:PORT (host names are not looked up), "
            f"e.g. {example}"
        )
    if name and tls:
        domain_as_written(name, origin)
    return Upstream(host, number, tls, name if tls else "")


def _flag_upstreams(words: Sequence[str], origin: Origin) -> tuple[Upstream, ...]:
    """`--upstream IP[:PORT],...`, or `none` to refuse names outside the zones."""
    if [word.lower() for word in words] == ["none"]:
        return ()
    return parse_upstreams(words, origin)


def _from_to(options: ForwardOptions, words: Sequence[str], origin: Origin) -> ForwardOptions:
    """`forward FROM TO...`."""
    if len(words) < 2:
        raise origin.error("expected `forward FROM TO...`, e.g. forward . /etc/resolv.conf")
    zone = _zones(words[:1], origin)[0]
    return replace(options, zone=zone, upstreams=parse_upstreams(words[1:], origin))


def _zones(words: Sequence[str], origin: Origin) -> tuple[Name, ...]:
    """Zones as CoreDNS's `plugin.Host(...).NormalizeExact` reads them: a domain, or a CIDR,
    whose reverse zone is taken (the first, when its prefix is not on a label boundary)."""
    if not words:
        raise origin.error("expected at least one zone, e.g. example.org")
    zones = []
    for word in words:
        if "/" not in word:
            zones.append(domain(word, origin))
            continue
        try:
            network = ipaddress.ip_network(word, strict=False)
        except ValueError:
            raise origin.error(f"{word!r} is neither a domain nor a CIDR") from None
        bits = 8 if network.version == 4 else 4
        count = -(-network.prefixlen // bits)  # labels, rounded up to a whole one
        labels = network.network_address.reverse_pointer.split(".")
        zones.append(tuple(labels[len(labels) - 2 - count :]))
    return tuple(zones)


def _health_check(options: ForwardOptions, words: Sequence[str], origin: Origin) -> ForwardOptions:
    """`health_check DURATION [no_rec] [domain FQDN]`."""
    if not words:
        raise origin.error("expected a duration, e.g. health_check 5s")
    interval = seconds(0.0, 3600.0)(words[:1], origin)
    recursion, rest = True, list(words[1:])
    name: Name = ()
    while rest:
        word = rest.pop(0)
        if word == "no_rec":
            recursion = False
        elif word == "domain":
            if not rest:
                raise origin.error("domain: expected a name, e.g. domain example.org")
            name = domain(rest.pop(0), origin)
        else:
            raise origin.error(f"unknown option {word!r}; expected no_rec or domain FQDN")
    return replace(options, health_check=interval, health_recursion=recursion, health_domain=name)


def _policy(words: Sequence[str], origin: Origin) -> str:
    word = one(words, origin, "round_robin")
    if word not in POLICIES:
        raise origin.error(f"unknown policy {word!r}; expected {', '.join(POLICIES)}")
    return word


def _tls(words: Sequence[str], origin: Origin) -> tuple[str, ...]:
    """`tls [CERT KEY] [CA]`: the files, checked now so that a bad one stops startup here."""
    if len(words) > 3:
        raise origin.error("expected at most 3 files: tls [CERT KEY] [CA]")
    try:
        tls_context(words)
    except (OSError, ssl.SSLError) as exc:
        raise origin.error(f"cannot use these files for TLS ({exc})") from None
    return tuple(words)


def _servername(words: Sequence[str], origin: Origin) -> str:
    name = one(words, origin, "dns.quad9.net")
    domain_as_written(name, origin)
    return name


def _failover(words: Sequence[str], origin: Origin) -> frozenset[int]:
    """`failover RCODE...`: rcode names, as CoreDNS reads them (NOERROR refused)."""
    if not words:
        raise origin.error("expected at least one rcode, e.g. failover SERVFAIL REFUSED")
    rcodes = set()
    for word in words:
        if word.upper() == "NOERROR":
            raise origin.error("NoError cannot be used in failover; name the failures to retry")
        rcode = FAILOVER_RCODES.get(word.upper())
        if rcode is None:
            raise origin.error(
                f"{word} is not a valid rcode; expected some of {', '.join(FAILOVER_RCODES)}"
            )
        rcodes.add(rcode)
    return frozenset(rcodes)


def _checked(options: ForwardOptions, origin: Origin) -> ForwardOptions:
    """A certificate name per upstream and one for all cannot both be given, as CoreDNS says."""
    for upstream in options.upstreams or ():
        if options.tls_servername and upstream.server_name:
            raise origin.error(
                f"both forward ({options.tls_servername!r}) and proxy level "
                f"({upstream.server_name!r}) TLS servernames are set for upstream proxy "
                f"'tls://{upstream}'; give one of them"
            )
    return options


FORWARD: Plugin[ForwardOptions] = Plugin(
    "forward",
    ForwardOptions,
    (
        Setting("", _from_to),
        Setting(
            None,
            sets("upstreams", _flag_upstreams),
            "--upstream",
            "IP[:PORT],...",
            "forward names outside the zones here ('none': refuse them). Default: the "
            "nameservers of /etc/resolv.conf when watching a cluster, none with --snapshot",
        ),
        Setting(
            "max_concurrent",
            sets("max_concurrent", integer(1, 1_000_000, "1000")),
            "--max-concurrent",
            "N",
            "forward at most N queries at once; more get REFUSED, as CoreDNS's forward "
            "max_concurrent (default {default}, as kubeadm's Corefile)",
            shows="max_concurrent",
        ),
        Setting(
            None,
            sets("allow", networks),
            "--forward-allow",
            "CIDR,...",
            "forward names outside the zones only for queries from these networks; others get "
            "REFUSED, so that no one outside the cluster uses it as an open resolver (default: "
            "any source, as CoreDNS's forward)",
        ),
        Setting("except", adds("ignored", _zones)),
        Setting("force_tcp", sets("force_tcp", none)),
        Setting("prefer_udp", sets("prefer_udp", none)),
        Setting("policy", sets("policy", _policy)),
        Setting("max_fails", sets("max_fails", integer(0, MAX_FAILS, "2"))),
        Setting("health_check", _health_check),
        Setting("expire", sets("expire", seconds(0.0, 86400.0))),
        Setting("tls", sets("tls", _tls)),
        Setting("tls_servername", sets("tls_servername", _servername)),
        Setting("failover", sets("failover", _failover)),
    ),
    check=_checked,
)


def forwarder_for(options: ForwardOptions, cache: CacheSettings) -> Forwarder | None:
    """The forwarder these options make, with `cache`; None without upstreams."""
    if not options.upstreams:
        return None
    return Forwarder(
        options.upstreams,
        max_concurrent=options.max_concurrent,
        cache=cache,
        allow=options.allow,
        options=options,
    )


def loop_checked(options: ForwardOptions, zone: Name = ()) -> tuple[Upstream, ...]:
    """The upstreams CoreDNS's `loop` probe, `<random>.<random>.ZONE` (its server block's
    zone), would go through: the plain DNS ones (toposdns serves no TLS, so a `tls://`
    upstream is never this server), and none when these options do not forward that name
    (FROM does not hold the zone, or an `except` does: its random labels match no zone)."""

    def under(name: Name, parent: Name) -> bool:
        return len(name) >= len(parent) and name[len(name) - len(parent) :] == parent

    if not under(zone, options.zone) or any(under(zone, ignored) for ignored in options.ignored):
        return ()
    return tuple(upstream for upstream in options.upstreams or () if not upstream.tls)


#: What forwarding gives: the reply, or the rcode to answer with.
Outcome = bytes | int


class Forwarder:
    """Sends queries to upstream servers; caches what they answer."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        timeout: float = 2.0,
        max_concurrent: int = MAX_CONCURRENT,
        cache: CacheSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        allow: tuple[Network, ...] = (),
        options: ForwardOptions | None = None,
    ) -> None:
        """`options` gives the rest of the `forward` block (FROM, `except`, transports,
        `policy`, health checks, `expire`, TLS); its upstreams, `max_concurrent` and `allow`
        are the arguments'."""
        options = options or ForwardOptions()
        self.options = options
        context = None
        if any(upstream.tls for upstream in upstreams):
            context = tls_context(options.tls or ())
        self.connections = [
            Connections(
                upstream,
                options.expire,
                context if upstream.tls else None,
                upstream.server_name or options.tls_servername,
            )
            for upstream in upstreams
        ]
        checks = options.checks
        self.upstreams = [
            UpstreamHealth(upstream, checks, partial(streams.exchange, reuse=False))
            for upstream, streams in zip(upstreams, self.connections, strict=True)
        ]
        self.streams = {id(u): c for u, c in zip(self.upstreams, self.connections, strict=True)}
        #: FROM and `except`: True when some names are not forwarded (`forwards`).
        self.zone = options.zone
        self.ignored = options.ignored
        self.scoped = bool(options.zone or options.ignored)
        self.force_tcp = options.force_tcp
        self.prefer_udp = options.prefer_udp
        self.policy = options.policy
        self.failover = options.failover
        #: round_robin's count of queries, which picks the first upstream of each.
        self.robin = 0
        self.allow = allow
        #: `admits` by source address, decided once per source (cleared when it grows large).
        self.admitted: dict[str, bool] = {}
        self.timeout = timeout
        self.max_concurrent = max_concurrent
        self.clock = clock
        self.cache = ForwardCache(cache or CacheSettings(), clock)
        #: prefetch, serve_stale, keepttl: what a cache hit does beyond its reply.
        self.refresher = Refresher(self.cache, self) if self.cache.settings.refreshing else None
        self.loops = LoopGuard()
        #: Forwarded queries in flight, and those on their way upstream by cache key.
        self.outstanding = 0
        self.inflight: dict[bytes, asyncio.Future[Entry | int]] = {}
        self.refusing = False
        #: What this process ran short of (logged once), or "".
        self.short_of = ""

    def forwards(self, name: Name) -> bool:
        """True if `name` is under FROM and, unless it is FROM itself, under no `except` zone,
        as CoreDNS's `match`; the rest goes to the next plugin."""
        lowered = tuple(label.lower() for label in name)
        zone = self.zone
        if len(lowered) < len(zone) or lowered[len(lowered) - len(zone) :] != zone:
            return False
        if lowered == zone:
            return True
        return not any(
            len(lowered) >= len(ignored) and lowered[len(lowered) - len(ignored) :] == ignored
            for ignored in self.ignored
        )

    def admits(self, source: str) -> bool:
        """True if queries from `source` may be forwarded (`--forward-allow`)."""
        if not self.allow:
            return True
        admitted = self.admitted.get(source)
        if admitted is None:
            try:
                address = ipaddress.ip_address(source.partition("%")[0])
                admitted = any(address in network for network in self.allow)
            except ValueError:
                admitted = False
            if len(self.admitted) >= MAX_ADMITTED:
                self.admitted.clear()
            self.admitted[source] = admitted
        return admitted

    async def forward(
        self, data: bytes, tcp: bool, limit: int, opt: bytes = b"", hits: list[int] | None = None
    ) -> Outcome:
        """The reply to a raw query (ID as the client's), or the rcode to answer it with.

        `limit` is the largest reply the client takes: a truncated UDP reply is retried over TCP
        only to be relayed if the whole answer fits. `opt` is the OPT record this client's reply
        carries (the upstream's is dropped, as CoreDNS's cache drops it). A reply from the cache
        counts in `hits` by its kind (serve/query_metrics.py: 1 success, 2 denial).
        """
        if self.scoped:
            name, end = read_name(data, HEADER_SIZE)
            end += 4
            if not self.forwards(name):
                return SERVFAIL  # not forward's: no plugin after it here, as CoreDNS's end
        else:
            end = question_end(data)
        if self.loops.came_back(data[:2], data[HEADER_SIZE:end]):
            return SERVFAIL
        key = cache_key(data, end, bool(opt))
        ad = bool(key[2] or data[3] & AD)  # the client asked for DNSSEC or for AD
        cached = self.cache.get(key)
        if cached is not None:
            if hits is not None:
                hits[1 if cached.kind == "success" else 2] += 1
            now, hit = self.clock(), True
            if self.refresher is not None:
                cached, now, hit = await self.refresher.serve(cached, key, data, end, tcp, now)
            return truncate(
                cached.render(data[:2], now, opt, ad, hit, data[HEADER_SIZE:end]), limit
            )
        if self.outstanding >= self.max_concurrent:
            FORWARD_MAX_CONCURRENT_REJECTS.inc()
            if not self.refusing:
                self.refusing = True
                log.warning(
                    "forwarding: %d queries in flight (--max-concurrent); refusing more",
                    self.outstanding,
                )
            return REFUSED
        self.outstanding += 1
        try:
            outcome = await self._once(key, data, end, tcp)
        finally:
            self.outstanding -= 1
            if self.refusing and self.outstanding <= self.max_concurrent // 2:
                self.refusing = False
                log.info("forwarding: %d queries in flight; accepting again", self.outstanding)
        if isinstance(outcome, int):
            return outcome
        return truncate(
            outcome.render(data[:2], self.clock(), opt, ad, False, data[HEADER_SIZE:end]), limit
        )

    async def refetch(
        self, key: bytes, data: bytes, end: int, tcp: bool, background: bool
    ) -> Entry | int | None:
        """The upstreams' answer to refresh a cached reply (forward_cache.py `Refresher`),
        counted in the queries in flight as a client's; None when `max_concurrent` are, or
        half of it for a refresh in the `background`, so that clients keep the rest."""
        limit = max(1, self.max_concurrent // 2) if background else self.max_concurrent
        if self.outstanding >= limit:
            return None
        self.outstanding += 1
        try:
            return await self._once(key, data, end, tcp)
        finally:
            self.outstanding -= 1

    async def close(self) -> None:
        """Stop health probes and cache refreshes; close the connections waiting for reuse."""
        if self.refresher is not None:
            await self.refresher.close()
        tasks = [task for upstream in self.upstreams for task in upstream.stop_probes()]
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(connections.close() for connections in self.connections))

    async def _once(self, key: bytes, data: bytes, end: int, tcp: bool) -> Entry | int:
        """Ask the upstreams, unless the same question is on its way already over the same
        transport (a TCP client must not get what UDP left truncated): then its answer."""
        # The transport to the upstreams: the client's, unless force_tcp or prefer_udp.
        if self.force_tcp:
            tcp = True
        elif self.prefer_udp:
            tcp = False
        flight = key + (b"t" if tcp else b"u")
        pending = self.inflight.get(flight)
        if pending is not None:
            return await asyncio.shield(pending)
        pending = self.inflight[flight] = asyncio.get_running_loop().create_future()
        outcome: Entry | int = SERVFAIL
        try:
            outcome = await self._resolve(key, upstream_query(data, end), end, tcp)
        finally:
            del self.inflight[flight]
            pending.set_result(outcome)
        return outcome

    async def _resolve(self, key: bytes, data: bytes, end: int, tcp: bool) -> Entry | int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BUDGET
        failure = SERVFAIL
        #: Replies `failover` sent on: once every upstream has given one, the last is relayed.
        failovers = 0
        for _ in range(PASSES):
            for upstream in self.order(tcp):
                if loop.time() >= deadline:
                    return failure
                started = time.perf_counter()
                try:
                    reply, message = await self._exchange(upstream, data, end, tcp, deadline)
                except LocalError as error:
                    if not self.short_of:
                        self.short_of = str(error)
                        log.warning(
                            "cannot forward: %s here (not the upstreams' fault); answering "
                            "SERVFAIL until it clears",
                            error,
                        )
                    return SERVFAIL
                except UpstreamError as error:
                    upstream.failed(tcp, error)
                    if error.kind in MISMATCHES:
                        failure = FORMERR
                    continue
                if self.short_of:
                    self.short_of = ""
                    log.info("forwarding works again")
                upstream.succeeded(tcp)
                rcode = reply[3] & RCODE
                seconds = time.perf_counter() - started
                name = RCODE_NAMES.get(rcode, str(rcode))
                PROXY_DURATION.labels("forward", str(upstream), name).observe(seconds)
                if rcode in self.failover:
                    failovers += 1
                    if failovers < len(self.upstreams):
                        continue
                return self.cache.store(key, reply, message)
        return failure

    def order(self, tcp: bool) -> list[UpstreamHealth]:
        """The upstreams healthy over this transport, in the order `policy` lists them; all of
        them, shuffled, if none is (CoreDNS then picks at random, whatever the policy)."""
        healthy = [u for u in self.listed() if not u.health(tcp).down]
        if not healthy:
            FORWARD_HEALTHCHECK_BROKEN.inc()
            healthy = list(self.upstreams)
            random.shuffle(healthy)
        return healthy

    def listed(self) -> list[UpstreamHealth]:
        """Every upstream, in the order of CoreDNS's policy for one query: `random` shuffled;
        `round_robin` the next one first, then the others as configured (its `List`);
        `sequential` as configured."""
        upstreams = self.upstreams
        if self.policy == "sequential" or len(upstreams) == 1:
            return upstreams
        if self.policy == "round_robin":
            self.robin += 1
            first = self.robin % len(upstreams)
            return [upstreams[first], *upstreams[:first], *upstreams[first + 1 :]]
        shuffled = list(upstreams)
        random.shuffle(shuffled)
        return shuffled

    async def _exchange(
        self,
        upstream: UpstreamHealth,
        data: bytes,
        end: int,
        tcp: bool,
        deadline: float,
    ) -> tuple[bytes, dnslib.DNSRecord]:
        """One try with one upstream: the checked reply and its parse."""
        loop = asyncio.get_running_loop()
        question = data[HEADER_SIZE:end]
        qid = self.loops.sending(upstream.upstream, question)
        query = qid + data[2:]
        streams = self.streams[id(upstream)]
        try:
            timeout = min(self.timeout, deadline - loop.time())
            if tcp or upstream.upstream.tls:
                reply = await streams.exchange(query, timeout)
            else:
                # A socket of its own per query, where CoreDNS reuses one: a miss, as it counts.
                PROXY_CONN_CACHE_MISSES.labels("forward", str(upstream), "udp").inc()
                reply = await send_udp(upstream.upstream, query, timeout)
            message = check_reply(query, reply)
            if tcp or upstream.upstream.tls or not reply[2] & TC >> 8:
                return reply, message
            # Truncated: the whole answer needs TCP, and is cached whole. If that fails, or
            # there is no time left, the truncated reply is relayed (never cached) and the
            # client retries over TCP itself.
            timeout = min(self.timeout, deadline - loop.time())
            if timeout <= 0:
                return reply, message
            try:
                whole = await streams.exchange(query, timeout)
                whole_message = check_reply(query, whole)
            except LocalError:
                return reply, message
            except UpstreamError as error:
                upstream.failed(True, error)
                return reply, message
            upstream.succeeded(True)
            return whole, whole_message
        finally:
            self.loops.answered(qid, question)


class Forwarding:
    """CoreDNS's `forward` (with its `cache`) in a server block's chain, the kubernetes block's
    too (where it gets the names outside the zones and those that fall through)."""

    name = "forward"

    def __init__(self, forwarder: Forwarder, hits: list[int] | None = None) -> None:
        self.forwarder = forwarder
        #: Where the forward cache's hits of clients' queries count (the server's `cache`
        #: metrics, serve/query_metrics.py), when it counts them.
        self.hits = hits

    def serve(self, request: Request, next: Next) -> Reply:
        forwarder = self.forwarder
        query = request.query
        if not forwarder.admits(request.source):
            # Outside `--forward-allow`, as CoreDNS's `acl` block in front would refuse it.
            request.written_by = "acl"
            return encode_bare(query, REFUSED)
        if query.qtype == ANY and not request.upstream_any:
            request.written_by = "any"  # serve/any.py: RFC 8482's reply, not the upstreams'
            return encode_minimal_any(query)
        if forwarder.scoped and not forwarder.forwards(query.name):
            return next(request)  # outside FROM, or under `except`: as CoreDNS's match
        return self.relayed(request)

    async def relayed(self, request: Request) -> bytes | None:
        """The upstream's reply, or the rcode the forwarder gives when there is none."""
        query = request.query
        try:
            opt = encode_opt(query.edns) if query.edns is not None else b""
            reply = await self.forwarder.forward(
                request.data, request.transport.tcp, request.limit, opt, self.hits
            )
        except Exception:
            return failed(query)
        # An rcode when no upstream gave a usable answer: SERVFAIL, REFUSED or FORMERR.
        return reply if isinstance(reply, bytes) else encode_bare(query, reply)


def cache_key(data: bytes, end: int, edns: bool) -> bytes:
    """What the answer depends on, as CoreDNS's cache keys it: the question with its name in
    lower case (so that random letter case, as 0x20-randomizing resolvers send, cannot multiply
    the entries or pass the cache by), RD, CD and DO. Not the transport nor the client's buffer
    size: the cache keeps whole answers, cut per client. Client-specific EDNS options (cookies)
    are left out."""
    do = _do_bit(data) if edns else 0
    return bytes((data[2] & 0x01, data[3] & 0x10, do)) + data[HEADER_SIZE:end].lower()


def _do_bit(data: bytes) -> int:
    """The DO bit of a query's OPT record (0 if none)."""
    for _start, at, _, rtype, _ in record_spans(data):
        if rtype == OPT:
            return data[at + 2] >> 7
    return 0


def upstream_query(data: bytes, end: int) -> bytes:
    """The query as it goes upstream: its OPT record's buffer size set to UPSTREAM_UDP_SIZE, or
    an OPT record with that size (and no DO bit) added when it has none."""
    for _start, at, _, rtype, section in record_spans(data):
        if rtype == OPT and section == 2:
            return data[: at - 2] + pack("!H", UPSTREAM_UDP_SIZE) + data[at:]
    arcount = unpack_from("!H", data, 10)[0] + 1
    opt = b"\x00" + pack("!HHIH", OPT, UPSTREAM_UDP_SIZE, 0, 0)
    return data[:10] + pack("!H", arcount) + data[12:] + opt


def resolv_conf_upstreams(path: str = "/etc/resolv.conf") -> list[Upstream]:
    """The nameservers of resolv.conf, as `forward . /etc/resolv.conf` uses (none when it
    cannot be read)."""
    try:
        with open(path) as file:
            return resolv_conf_nameservers(file.read(1 << 16))
    except OSError:
        return []


def resolv_conf_nameservers(text: str) -> list[Upstream]:
    """The `nameserver` lines of a resolv.conf's text (an IPv6 zone, `%eth0`, dropped); lines
    that are not an address are skipped, as CoreDNS's parser skips them."""
    upstreams = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            host = fields[1].split("%")[0]
            try:
                ipaddress.ip_address(host)
            except ValueError:
                continue
            upstreams.append(Upstream(host))
    return upstreams


def build_query(name: Name, qtype: int) -> bytes:
    """A recursive query for a name, as CoreDNS's upstream lookup of a CNAME target sends."""
    record = dnslib.DNSRecord.question(name_text(name), dnslib.QTYPE.get(qtype))
    return bytes(record.pack())


def answer_records(reply: bytes) -> tuple[tuple[RR, ...], bool]:
    """The address and CNAME records of an upstream reply's answer section, and its TC bit."""
    message = dnslib.DNSRecord.parse(reply)
    records = []
    for rr in message.rr:
        name = tuple(label.decode("latin-1") for label in rr.rname.label)
        if rr.rtype in (A, AAAA):
            records.append(RR(name, rr.rtype, rr.ttl, str(rr.rdata)))
        elif rr.rtype == CNAME:
            target = tuple(label.decode("latin-1") for label in rr.rdata.label.label)
            records.append(RR(name, CNAME, rr.ttl, target))
    return tuple(records), bool(message.header.tc)
