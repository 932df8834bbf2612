"""A stand-in for a CoreDNS server block that forwards, for tests: what the cluster zone's block
of the `coredns-forward` overlay (`rewrite edns0 subnet` and `forward`) and NodeLocal DNSCache's
(`cache` and `forward`, NodeLocal being CoreDNS itself) do to a query on its way to toposdns.
It is written from the plugins' documentation and tests (CoreDNS 1.14, plugin/rewrite/README.md
and edns0.go's behaviour, plugin/cache/README.md), not from their code:

- `rewrite [continue|stop] edns0 subnet ACTION V4 V6`: the query gets an OPT record (buffer
  4096) if it has none; then the first Client Subnet option, if any, is overwritten with the
  address the query came from, cut to V4 or V6 bits, SCOPE 0, by `set` and `replace`, and left
  as it is by `append`. Only the first: a later one stays as the client wrote it. Without one,
  `set` and `append` add one. `unset` removes every Client Subnet option. (`revert` is refused.)
  This is toposdns's own `rewrite` (serve/rewrite.py `client_subnet`, `rewrite_subnet`), played
  here on the query as dnspython holds it: the tables of tests/unit/test_coredns_forwarder.py
  hold both to CoreDNS's.
- `cache [TTL]` or `cache { success CAPACITY [TTL [MINTTL]] / denial ... }`: replies are kept
  under the name in lower case, the type, the class and the DO and CD bits, and nothing else:
  not the Client Subnet. NOERROR with records and NXDOMAIN or NODATA with an SOA are kept for
  their smallest TTL, within [MINTTL, TTL] (defaults 5 s and 3600 s, 1800 s for denials);
  SERVFAIL for 5 s; truncated replies and other errors never. Every record of a reply it writes
  has that time, counted down on a hit, as its TTL, and the OPT record is the query's, without
  the options the upstream echoed. The cache runs after `rewrite`, as plugin.cfg orders
  them, and neither sees the other's work: the key has no options.
- `forward . ADDRESS { force_tcp | prefer_udp | max_concurrent N }`: to the upstream the test
  gives (ADDRESS is a cluster address), from the hop's own address (a CoreDNS pod's, a node's),
  over TCP with `force_tcp`, else UDP; the upstream's reply goes back as it came, with the
  client's ID.

Directives that only watch (errors, log, health, ready, prometheus, reload, loop, bind) are
accepted and do nothing; any other is refused, so that a configuration this stand-in cannot
play fails the test instead of passing unchecked. It serves UDP and TCP on one loopback address
and port, one query at a time on each, in a thread each; every socket read has a timeout.
"""

from __future__ import annotations

import copy
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import dns.edns
import dns.exception
import dns.flags
import dns.message
import dns.query
import dns.rcode
import dns.rdatatype

from toposdns.corefile import expand, lex, server_blocks
from toposdns.serve.rewrite import client_subnet, rewrite_subnet

#: What a directive of a server block is here: its words, and the words of each line of its
#: own block.
Directive = tuple[list[str], list[list[str]]]

#: Directives that change nothing a query or its reply carries.
WATCHING = frozenset({"errors", "log", "health", "ready", "prometheus", "reload", "loop", "bind"})

#: Each exchange with the upstream, and each read from a client, at most.
TIMEOUT = 2.0


def corefile_block(text: str, zone: str) -> list[Directive]:
    """The directives of the server block keyed `zone` (`cluster.local:53`) in a Corefile."""
    for keys, directives in server_blocks(expand(lex(text, "Corefile"), Path("."), {}, 0)):
        if [key.text for key in keys] == [zone]:
            return [
                ([t.text for t in line], [[t.text for t in inner] for inner in body])
                for line, body in directives
            ]
    raise ValueError(f"no server block {zone} in the Corefile")


def shown_corefile(markdown: str, heading: str) -> str:
    """The one Corefile a Markdown page shows under `## heading`: the fenced block without a
    language whose first line opens a server block."""
    section = markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks: list[list[str]] = []
    fence: str | None = None
    for line in section.splitlines():
        if line.startswith("```"):
            if fence is None:
                fence = line[3:].strip()
                blocks.append([])
            else:
                if fence:  # a block of another language (sh, yaml)
                    blocks.pop()
                fence = None
        elif fence is not None:
            blocks[-1].append(line)
    (found,) = [b for b in blocks if b and b[0].rstrip().endswith("{")]
    return "\n".join(found) + "\n"


@dataclass(frozen=True)
class SubnetRewrite:
    """`rewrite edns0 subnet ACTION [V4 V6]`."""

    action: str
    v4: int = 0
    v6: int = 0

    @classmethod
    def parse(cls, words: list[str]) -> SubnetRewrite:
        args = words[1:]
        if args and args[0] in ("continue", "stop"):
            args = args[1:]
        if args[:2] != ["edns0", "subnet"]:
            raise ValueError(f"rewrite: this stand-in plays `edns0 subnet` only: {words}")
        action, lengths = args[2], args[3:]
        if action == "unset" and not lengths:
            return cls(action)
        if action not in ("set", "append", "replace") or len(lengths) != 2:
            raise ValueError(f"rewrite edns0 subnet: not played here: {words}")
        v4, v6 = int(lengths[0]), int(lengths[1])
        if not (0 <= v4 <= 32 and 0 <= v6 <= 128):
            raise ValueError(f"rewrite edns0 subnet: prefix lengths out of range: {words}")
        return cls(action, v4, v6)

    def apply(self, query: dns.message.Message, client: str) -> None:
        """Rewrite `query`'s Client Subnet options as CoreDNS does for a query from `client`."""
        if query.edns < 0:
            query.use_edns(0, 0, 4096)
        options = [(int(option.otype), option.to_wire()) for option in query.options]
        value = b""
        if self.action != "unset":
            subnet = client_subnet(client, self.v4, self.v6)
            assert subnet is not None, f"the client {client!r} is no address"
            value = subnet
        rewrite_subnet(options, self.action, value)
        written = [dns.edns.option_from_wire(code, data, 0, len(data)) for code, data in options]
        query.use_edns(query.edns, query.ednsflags, query.payload, options=written)


@dataclass
class CacheRules:
    """`cache`: how long a reply is kept, by kind (seconds)."""

    success_ttl: int = 3600
    success_min: int = 5
    denial_ttl: int = 1800
    denial_min: int = 5
    failure_ttl: int = 5

    @classmethod
    def parse(cls, words: list[str], body: list[list[str]]) -> CacheRules:
        rules = cls()
        if len(words) > 1 and words[1].isdigit():
            rules.success_ttl = rules.denial_ttl = int(words[1])
        for line in body:
            kind, values = line[0], [int(word) for word in line[2:]]
            if kind not in ("success", "denial") or len(line) < 2 or len(values) > 2:
                raise ValueError(f"cache: option not played here: {line}")
            if values:
                setattr(rules, f"{kind}_ttl", values[0])
            if len(values) > 1:
                setattr(rules, f"{kind}_min", values[1])
        return rules

    def keep_for(self, reply: dns.message.Message) -> int:
        """Seconds to keep `reply`, 0 for never."""
        if reply.flags & dns.flags.TC:
            return 0
        rcode = reply.rcode()
        if rcode == dns.rcode.SERVFAIL:
            return self.failure_ttl
        has_soa = any(rrset.rdtype == dns.rdatatype.SOA for rrset in reply.authority)
        if rcode == dns.rcode.NXDOMAIN or (rcode == dns.rcode.NOERROR and not reply.answer):
            if not has_soa:
                return 0
            low, high = self.denial_min, self.denial_ttl
        elif rcode == dns.rcode.NOERROR:
            low, high = self.success_min, self.success_ttl
        else:
            return 0
        ttls = [rrset.ttl for section in (reply.answer, reply.authority) for rrset in section]
        ttls += [rrset.ttl for rrset in reply.additional]  # the OPT record is not among these
        return min(max(min(ttls, default=high), low), high)


@dataclass
class Kept:
    """A cached reply and when it was kept."""

    reply: dns.message.Message
    stored: float
    ttl: int


@dataclass
class CorefileForwarder:
    """One server block played on `listen` (a loopback address), forwarding to `upstream` from
    `listen` itself: the address the next hop sees."""

    directives: list[Directive]
    listen: str
    upstream: tuple[str, int]
    clock: Callable[[], float] = time.monotonic
    rewrite: SubnetRewrite | None = None
    cache: CacheRules | None = None
    force_tcp: bool = False
    #: Queries answered from the cache, and sent upstream.
    hits: int = 0
    forwarded: int = 0
    kept: dict[tuple[str, int, int, bool, bool], Kept] = field(default_factory=dict)
    #: What went wrong in the serving threads (a bug here): `close` fails the test with it.
    failures: list[str] = field(default_factory=list)
    port: int = 0

    def __post_init__(self) -> None:
        forwards = 0
        for words, body in self.directives:
            name = words[0]
            if name in WATCHING:
                continue
            if name == "rewrite":
                if self.rewrite is not None:
                    raise ValueError("more than one rewrite: not played here")
                self.rewrite = SubnetRewrite.parse(words)
            elif name == "cache":
                self.cache = CacheRules.parse(words, body)
            elif name == "forward":
                forwards += 1
                options = {line[0] for line in body}
                if words[1] != "." or options - {"force_tcp", "prefer_udp", "max_concurrent"}:
                    raise ValueError(f"forward: not played here: {words} {body}")
                self.force_tcp = "force_tcp" in options
            else:
                raise ValueError(f"{name}: this stand-in does not play it")
        if forwards != 1:
            raise ValueError("a forwarding block needs one forward")
        self._stop = threading.Event()
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._udp.bind((self.listen, 0))
        self.port = int(self._udp.getsockname()[1])
        self._tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._tcp.bind((self.listen, self.port))
        self._tcp.listen(8)
        for sock in (self._udp, self._tcp):
            sock.settimeout(0.1)
        self._threads = [
            threading.Thread(target=self._serve_udp, daemon=True),
            threading.Thread(target=self._serve_tcp, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return (self.listen, self.port)

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._udp.close()
        self._tcp.close()
        assert not self.failures, "\n".join(self.failures)

    def __enter__(self) -> CorefileForwarder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def answer(self, data: bytes, client: str) -> bytes | None:
        """The reply to one query from `client`, or None for a message that is none."""
        try:
            return self._answer(data, client)
        except Exception:  # a bug of the stand-in: reported by `close`, never swallowed
            self.failures.append(traceback.format_exc())
            return None

    def _answer(self, data: bytes, client: str) -> bytes | None:
        try:
            query = dns.message.from_wire(data)
        except dns.exception.DNSException:
            return None
        if self.rewrite is not None:
            self.rewrite.apply(query, client)
        key = None
        if self.cache is not None and query.question:
            question = query.question[0]
            do = bool(query.ednsflags & dns.flags.DO)
            cd = bool(query.flags & dns.flags.CD)
            key = (question.name.to_text().lower(), question.rdtype, question.rdclass, do, cd)
            kept = self.kept.get(key)
            now = self.clock()
            if kept is not None and now - kept.stored < kept.ttl:
                self.hits += 1
                return self._from_cache(kept, query, now)
        reply = self._forward(query)
        reply.id = query.id
        if self.cache is None or key is None:
            return reply.to_wire()
        ttl = self.cache.keep_for(reply)
        if ttl > 0:
            self.kept[key] = Kept(reply, self.clock(), ttl)
        return self._written(reply, query, ttl)

    def _from_cache(self, kept: Kept, query: dns.message.Message, now: float) -> bytes:
        reply = dns.message.make_response(query)
        reply.set_rcode(kept.reply.rcode())
        reply.flags |= dns.flags.AA  # CoreDNS's cache sets it on every reply it builds
        for source, target in (
            (kept.reply.answer, reply.answer),
            (kept.reply.authority, reply.authority),
            (kept.reply.additional, reply.additional),
        ):
            target.extend(copy.copy(rrset) for rrset in source)
        return self._written(reply, query, max(0, kept.ttl - int(now - kept.stored)))

    @staticmethod
    def _written(reply: dns.message.Message, query: dns.message.Message, ttl: int) -> bytes:
        """A reply as the cache writes it: every record's TTL is `ttl` (what is left of the
        time it is kept), and the OPT record is the query's, without options."""
        for section in (reply.answer, reply.authority, reply.additional):
            for rrset in section:
                rrset.ttl = ttl
        if query.edns >= 0:
            reply.use_edns(0, query.ednsflags & dns.flags.DO, query.payload)
        else:
            reply.use_edns(False)
        return reply.to_wire()

    def _forward(self, query: dns.message.Message) -> dns.message.Message:
        self.forwarded += 1
        host, port = self.upstream
        try:
            if self.force_tcp:
                return dns.query.tcp(query, host, port=port, timeout=TIMEOUT, source=self.listen)
            return dns.query.udp(query, host, port=port, timeout=TIMEOUT, source=self.listen)
        except (OSError, dns.exception.DNSException):
            failed = dns.message.make_response(query)
            failed.set_rcode(dns.rcode.SERVFAIL)
            return failed

    def _serve_udp(self) -> None:
        while not self._stop.is_set():
            try:
                data, (client, port) = self._udp.recvfrom(65535)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = self.answer(data, client)
            if reply is not None:
                self._udp.sendto(reply, (client, port))

    def _serve_tcp(self) -> None:
        while not self._stop.is_set():
            try:
                connection, (client, _) = self._tcp.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                connection.settimeout(TIMEOUT)
                try:
                    while not self._stop.is_set():
                        head = _read(connection, 2)
                        if head is None:
                            break
                        data = _read(connection, struct.unpack("!H", head)[0])
                        reply = self.answer(data or b"", client)
                        if reply is None:
                            break
                        connection.sendall(struct.pack("!H", len(reply)) + reply)
                except OSError:
                    continue


def _read(connection: socket.socket, size: int) -> bytes | None:
    """Exactly `size` bytes, or None when the peer closed first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data
