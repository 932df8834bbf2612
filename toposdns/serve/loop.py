"""Forwarding loops: found at startup as CoreDNS's `loop` plugin finds them, and cut short always.

A loop is an upstream that sends queries back to this server: most often a node's resolv.conf
that names the cluster DNS, or a local stub (127.0.0.53) in front of it. Every forwarded query
would then go round until something gives out.

- At startup (the upstreams are set once, for the life of the process), `<random>.<random>.
  HINFO` goes to each upstream. If that query reaches this server, the upstream forwards back
  here: the server stops with an error that names it, as CoreDNS's `loop` halts the process
  (in a pod, CrashLoopBackOff with the reason in the log beats a DNS server eating CPU).
- Whatever the startup check saw, no query makes unbounded work. Every query on its way upstream
  is remembered by the ID and question this server sent until its reply comes; a query that
  arrives with that same ID and question is our own, come back (the upstream is this server, or
  forwards without changing the ID): it gets SERVFAIL and is not forwarded again, and the loop is
  logged once per upstream. A loop through a resolver that changes IDs is cut by the forwarder:
  a question already on its way upstream is not sent again, the new query waits for the first
  one's answer (forward.py), so a looping query goes round once. `--max-concurrent` bounds what
  any number of them can hold.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from struct import pack

from toposdns.metrics import FORWARD_LOOPS
from toposdns.serve.upstream import LocalError, Upstream, UpstreamError, send_udp
from toposdns.wire.codes import RD, Name
from toposdns.wire.decode import read_name

log = logging.getLogger("toposdns")

HINFO = 13
#: How long the startup check keeps trying an upstream that does not answer (CoreDNS's 30 s).
CHECK_PERIOD = 30.0
CHECK_TIMEOUT = 2.0
TROUBLESHOOTING = "https://coredns.io/plugins/loop#troubleshooting"


class LoopError(Exception):
    """An upstream forwards this server's queries back to it."""


class LoopGuard:
    """The queries this server has on their way upstream, to know them when they come back."""

    def __init__(self) -> None:
        #: ID + question of each query sent upstream and not yet answered.
        self.outgoing: dict[bytes, Upstream] = {}
        #: Question of each startup probe, and the probes seen coming back.
        self.probes: dict[bytes, Upstream] = {}
        self.looped: set[bytes] = set()
        self.reported: set[str] = set()
        #: Told the question of each probe that comes back (a worker tells its supervisor,
        #: which sent the probe).
        self.on_probe: Callable[[bytes], None] | None = None

    def sending(self, upstream: Upstream, question: bytes) -> bytes:
        """A new random ID for a query to `upstream`, remembered with its question (the bytes
        after the header, type and class included) until `answered`."""
        while True:
            qid = secrets.randbits(16).to_bytes(2, "big")
            if qid + question not in self.outgoing:
                self.outgoing[qid + question] = upstream
                return qid

    def answered(self, qid: bytes, question: bytes) -> None:
        self.outgoing.pop(qid + question, None)

    def came_back(self, qid: bytes, question: bytes) -> bool:
        """True if a query with this ID and question is one this server sent upstream."""
        upstream = self.outgoing.get(qid + question)
        if upstream is not None:
            FORWARD_LOOPS.labels(str(upstream)).inc()
            if str(upstream) not in self.reported:
                self.reported.add(str(upstream))
                log.error(
                    "forwarding loop: a query sent to upstream %s came back to this server; "
                    "such queries get SERVFAIL instead of going round. Point --upstream at a "
                    "resolver that does not forward to toposdns (%s)",
                    upstream,
                    TROUBLESHOOTING,
                )
            return True
        if question in self.probes:
            self.looped.add(question)
            if self.on_probe is not None:
                self.on_probe(question)
            return True
        return False

    def probe(self, upstream: Upstream, zone: Name = ()) -> bytes:
        """A new probe question (`<random>.<random>.ZONE HINFO`, ZONE that of the server block
        whose upstream it goes through, as CoreDNS's `loop`) for `upstream`, known as a probe
        from now on, also to the processes forked after."""
        labels = (str(secrets.randbits(62)), str(secrets.randbits(62)), *zone)
        name = (
            b"".join(bytes((len(label),)) + label.encode("latin-1") for label in labels) + b"\x00"
        )
        question = name + pack("!HH", HINFO, 1)
        self.probes[question] = upstream
        return question

    async def check(self, upstreams: Sequence[tuple[Name, Upstream]], server: str) -> None:
        """Send a probe through every upstream, under the zone given with it; LoopError if one
        comes back to `server`."""
        probes = {self.probe(upstream, zone): upstream for zone, upstream in upstreams}
        await self.send_probes(probes, server)

    async def send_probes(self, probes: dict[bytes, Upstream], server: str) -> None:
        """Send probes made with `probe`; LoopError if one comes back to this process."""
        await asyncio.gather(*(self._check(q, upstream, server) for q, upstream in probes.items()))

    async def _check(self, question: bytes, upstream: Upstream, server: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CHECK_PERIOD
        try:
            # Until the upstream answers: a loop shows before that, as the probe comes back.
            while question not in self.looped:
                query = pack("!6H", secrets.randbits(16), RD, 1, 0, 0, 0) + question
                try:
                    await send_udp(upstream, query, CHECK_TIMEOUT)
                    break
                except (UpstreamError, LocalError):
                    if loop.time() >= deadline:
                        break
                    await asyncio.sleep(1)
        finally:
            del self.probes[question]
        if question in self.looped:
            raise loop_error(upstream, question, server)


def loop_error(upstream: Upstream, question: bytes, server: str) -> LoopError:
    """The error that stops the server when the probe `question` came back through `upstream`."""
    labels, _ = read_name(question, 0)
    return LoopError(
        f'Loop ({upstream} -> {server}) detected: the query "HINFO {".".join(labels)}." '
        f"sent to upstream {upstream} came back to this server, so forwarded queries would "
        "go round forever. Point --upstream (or the resolv.conf it comes from, e.g. "
        f"kubelet's resolvConf) at a resolver that does not forward to toposdns; see "
        f"{TROUBLESHOOTING}"
    )
