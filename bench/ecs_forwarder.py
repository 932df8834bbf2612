"""A forwarder between pods and toposdns, for `bench/hostile.py`: CoreDNS with
`rewrite edns0 subnet MODE 32 128` in front of `forward`, and optionally NodeLocal DNSCache's
`cache` (keyed on the name and type only, as CoreDNS's cache is).

The rewrite follows CoreDNS's plugin/rewrite (edns0.go, the subnet rule), with the client's
address as the forwarder sees it, at /32 (IPv4) or /128 (IPv6):

- `set`: overwrite the query's Client Subnet option if it has one, else add one;
- `append`: add one only if the query has none (a pod's own option is kept);
- `replace`: overwrite one if there is one, add none;
- None: no rewrite (the query goes on as the pod sent it).

A query without an OPT record gets one (buffer 4096, as CoreDNS's setupEdns0Opt) when an option
is added. The reply goes back as toposdns wrote it, its ID the pod's. UDP on one loopback
address, one query at a time, forwarded over UDP (or TCP: NodeLocal's `force_tcp`), 2 s each.
"""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import threading
import time

import dns.edns
import dns.exception
import dns.message
import dns.query
import dns.rcode

MODES = ("set", "append", "replace")


def rewrite_subnet(query: dns.message.Message, mode: str | None, client: str) -> None:
    """Apply `rewrite edns0 subnet MODE 32 128` to `query` in place, for a pod at `client`."""
    if mode is None:
        return
    mine = dns.edns.ECSOption(client, 32 if ipaddress.ip_address(client).version == 4 else 128)
    options = list(query.options)
    for i, option in enumerate(options):
        if option.otype == dns.edns.OptionType.ECS:
            if mode in ("set", "replace"):
                options[i] = mine
                _set_options(query, options)
            return  # `append` keeps the option the query came with
    if mode in ("set", "append"):
        _set_options(query, [*options, mine])


def _set_options(query: dns.message.Message, options: list[dns.edns.Option]) -> None:
    payload = query.payload if query.edns >= 0 else 4096
    query.use_edns(0, query.ednsflags, payload, options=options)


class Forwarder:
    """A UDP listener at `address` that rewrites as `mode` says and forwards to
    127.0.0.1:`upstream_port` from `address`; `cache_seconds` > 0 caches replies by name and
    type for at most that long (or their smallest TTL)."""

    def __init__(
        self,
        address: str,
        upstream_port: int,
        mode: str | None,
        *,
        cache_seconds: float = 0.0,
        tcp: bool = False,
    ) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(f"rewrite edns0 subnet {mode!r}: expected one of {MODES}")
        self.address = address
        self.upstream_port = upstream_port
        self.mode = mode
        self.cache_seconds = cache_seconds
        self.tcp = tcp
        self.forwarded = 0
        self.cache_hits = 0
        self._cache: dict[tuple[str, int, int], tuple[float, dns.message.Message]] = {}
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((address, 0))
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def at(self) -> tuple[str, int]:
        """Where pods send their queries."""
        return self.address, self.port

    def __enter__(self) -> Forwarder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self._sock.close()

    def _run(self) -> None:
        poll = select.poll()  # not select(): file descriptors may be past 1024
        poll.register(self._sock, select.POLLIN)
        while not self._stop.is_set():
            if not poll.poll(100):
                continue
            try:
                data, client = self._sock.recvfrom(65535)
            except OSError:
                continue
            with contextlib.suppress(dns.exception.DNSException, OSError, ValueError):
                reply = self._answer(dns.message.from_wire(data), client[0])
                if reply is not None:
                    self._sock.sendto(reply.to_wire(), client)

    def _answer(self, query: dns.message.Message, client: str) -> dns.message.Message | None:
        question = query.question[0]
        key = (question.name.to_text().lower(), question.rdtype, question.rdclass)
        cached = self._cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            self.cache_hits += 1
            reply = cached[1]
            reply.id = query.id
            return reply
        pod_id = query.id
        rewrite_subnet(query, self.mode, client)
        ask = dns.query.tcp if self.tcp else dns.query.udp
        reply = ask(query, "127.0.0.1", timeout=2.0, port=self.upstream_port, source=self.address)
        self.forwarded += 1
        if self.cache_seconds > 0 and reply.rcode() in (dns.rcode.NOERROR, dns.rcode.NXDOMAIN):
            ttls = [rrset.ttl for rrset in [*reply.answer, *reply.authority]]
            keep = min([self.cache_seconds, *ttls])
            self._cache[key] = (time.monotonic() + keep, reply)
        reply.id = pod_id
        return reply
