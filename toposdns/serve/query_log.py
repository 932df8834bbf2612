"""CoreDNS's `log`: a line on stdout per query answered, in its common log format.

    [INFO] 10.0.0.7:40312 - 4660 "A IN web.ns.svc.cluster.local. udp 66 false 1232" NOERROR
    qr,aa,rd 109 0.000123s   (one line)

that is `{remote}:{port} - {>id} "{type} {class} {name} {proto} {size} {>do} {>bufsize}"
{rcode} {>rflags} {rsize} {duration}` (plugin/log, plugin/pkg/replacer): the client, the query's
ID, type, class, name in lower case, transport, size, DO bit and buffer size, then the reply's
rcode, header flags, size and the seconds it took. `log NAME…` logs only queries for names
under those; `log { class success|denial|error|all }` only replies of those classes.

Free when it is off: the frontends that log are subclasses of the plain ones, chosen when the
server starts, so a server without `log` runs the same code as before. With it, each query is
noted on the way in (by client address, port and ID) and its line written when its reply goes
out, whichever path answered it (the UDP fast path, the caches, an upstream).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, TextIO

from toposdns.options import Origin, Plugin, Setting, adds, domain, none, sets
from toposdns.serve.acl import Screen
from toposdns.serve.responder import Responder, Transport
from toposdns.serve.tcp import TcpLimits, TcpProtocol
from toposdns.serve.transport import unmapped
from toposdns.serve.udp import UdpProtocol
from toposdns.wire.codes import NOERROR, NXDOMAIN, RCODE_NAMES, Name
from toposdns.wire.decode import HEADER_SIZE, read_name, record_spans
from toposdns.wire.records import name_text, type_name

#: Reply classes of CoreDNS's response.Classify, and `all`.
CLASSES = ("success", "denial", "error", "all")
#: Queries noted and not yet answered, at most (dropped queries get no reply: forget them).
MAX_PENDING = 65_536
#: The header flags a line shows, in CoreDNS's order (`appendFlags`).
FLAGS = (
    (0x8000, "qr"),
    (0x0400, "aa"),
    (0x0200, "tc"),
    (0x0100, "rd"),
    (0x0080, "ra"),
    (0x0040, "z"),
    (0x0020, "ad"),
    (0x0010, "cd"),
)
CLASS_TEXT = {1: "IN", 3: "CH", 4: "HS", 254: "NONE", 255: "ANY"}


@dataclass(frozen=True, slots=True)
class LogOptions:
    """CoreDNS's `log`: off unless given."""

    enabled: bool = False
    #: Names whose queries are logged (lower-case labels); () for every name.
    names: tuple[Name, ...] = ()
    #: Reply classes logged; empty for all.
    classes: frozenset[str] = frozenset()


def _names(words: Sequence[str], origin: Origin) -> tuple[Name, ...]:
    if any("{" in word for word in words):
        raise origin.error("a log format is not supported: lines are in CoreDNS's common format")
    return tuple(domain(word, origin) for word in words)


def _classes(words: Sequence[str], origin: Origin) -> frozenset[str]:
    if not words:
        raise origin.error(f"expected one or more of {', '.join(CLASSES)}")
    for word in words:
        if word not in CLASSES:
            raise origin.error(f"{word!r}: expected one or more of {', '.join(CLASSES)}")
    return frozenset(words) - {"all"} if "all" not in words else frozenset()


def _on(options: LogOptions, words: Sequence[str], origin: Origin) -> LogOptions:
    names = _names(words, origin)
    return LogOptions(True, options.names + names, options.classes)


LOG: Plugin[LogOptions] = Plugin(
    "log",
    LogOptions,
    (
        Setting("", _on),
        Setting("class", sets("classes", _classes)),
        Setting(
            None,
            sets("enabled", none),
            "--query-log",
            help="write a line per query to stdout, as CoreDNS's `log` plugin (default: off)",
        ),
        Setting(
            None,
            adds("names", _names),
            "--query-log-names",
            "NAME[,NAME]",
            "with --query-log, only queries for names under these (default: every name)",
        ),
    ),
)


def reply_class(reply: bytes) -> str:
    """CoreDNS's class of a reply: success, denial (NXDOMAIN, NODATA) or error."""
    rcode = reply[3] & 0x0F
    if rcode == NOERROR:
        return "success" if reply[6:8] != b"\0\0" else "denial"
    return "denial" if rcode == NXDOMAIN else "error"


def flags_text(reply: bytes) -> str:
    """The reply's header flags as CoreDNS's log writes them (`qr,aa,rd`)."""
    flags = (reply[2] << 8) | reply[3]
    return ",".join(text for bit, text in FLAGS if flags & bit)


def query_fields(query: bytes, tcp: bool) -> tuple[str, str, str, int, str, int] | None:
    """(type, class, name, size, DO, buffer size) of a query, None when it cannot be read."""
    try:
        labels, end = read_name(query, HEADER_SIZE)
        qtype, qclass = (query[end] << 8) | query[end + 1], (query[end + 2] << 8) | query[end + 3]
        do, size = "false", 512
        for _, at, _, rtype, section in record_spans(query):
            if rtype == 41 and section == 2:
                size = max(512, (query[at - 2] << 8) | query[at - 1])
                do = "true" if query[at + 2] & 0x80 else "false"
    except (IndexError, ValueError):
        return None
    name = name_text(tuple(label.lower() for label in labels))
    return (
        type_name(qtype),
        CLASS_TEXT.get(qclass, f"CLASS{qclass}"),
        name,
        len(query),
        do,
        65535 if tcp else size,
    )


class QueryLog:
    """Notes queries as they come and writes each one's line when its reply goes out."""

    def __init__(self, options: LogOptions, out: TextIO | None = None) -> None:
        self.names = options.names
        self.classes = options.classes
        self.out = out
        #: (host, port, ID) -> (query, perf_counter when it came).
        self.pending: dict[tuple[str, int, bytes], tuple[bytes, float]] = {}

    def asked(self, host: str, port: int, query: bytes) -> None:
        """A query came from host:port."""
        if len(self.pending) >= MAX_PENDING:
            self.pending.clear()
        self.pending[(host, port, query[:2])] = (query, perf_counter())

    def answered(self, host: str, port: int, reply: bytes, tcp: bool) -> None:
        """A reply goes out to host:port: write its query's line."""
        found = self.pending.pop((host, port, reply[:2]), None)
        if found is None or len(reply) < HEADER_SIZE:
            return  # a reply to nothing noted (an acl refusal before the query was)
        query, started = found
        fields = query_fields(query, tcp)
        if fields is None:
            return
        qtype, qclass, name, size, do, bufsize = fields
        if self.names and not self.wanted(name):
            return
        if self.classes and reply_class(reply) not in self.classes:
            return
        rcode = reply[3] & 0x0F
        host = unmapped(host)  # an IPv4 client of a socket bound to `::`, as CoreDNS writes it
        remote = f"[{host}]" if ":" in host else host
        # Go's shortest form of the seconds, within the nanoseconds it measures.
        seconds = f"{perf_counter() - started:.9f}".rstrip("0").rstrip(".")
        line = (
            f"[INFO] {remote}:{port} - {(query[0] << 8) | query[1]} "
            f'"{qtype} {qclass} {name} {"tcp" if tcp else "udp"} {size} {do} {bufsize}" '
            f"{RCODE_NAMES.get(rcode, str(rcode))} {flags_text(reply)} {len(reply)} {seconds}s\n"
        )
        out = self.out or sys.stdout
        out.write(line)
        out.flush()

    def wanted(self, name: str) -> bool:
        """True if `name` (lower-case, with its dot) is under one of the names logged."""
        labels = tuple(name.rstrip(".").split(".")) if name != "." else ()
        return any(labels[len(labels) - len(zone) :] == zone or not zone for zone in self.names)


class _Datagrams:
    """A datagram transport that writes each reply's log line as it sends it."""

    def __init__(self, transport: asyncio.DatagramTransport, log: QueryLog) -> None:
        self.transport = transport
        self.log = log

    def sendto(self, data: bytes, addr: Any) -> None:
        self.transport.sendto(data, addr)
        self.log.answered(addr[0], addr[1], bytes(data), False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class LoggedUdpProtocol(UdpProtocol):
    """The UDP frontend with `log` on: each datagram noted, each reply logged."""

    def __init__(self, responder: Responder, kind: Transport, log: QueryLog) -> None:
        super().__init__(responder, kind)
        self.log = log

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(_Datagrams(transport, self.log))  # type: ignore[arg-type]

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.log.asked(addr[0], addr[1], data)
        super().datagram_received(data, addr)


class _Stream:
    """A stream transport that writes each framed reply's log line as it writes it."""

    def __init__(self, transport: asyncio.Transport, log: QueryLog) -> None:
        self.transport = transport
        self.log = log
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.host, self.port = str(peer[0]), int(peer[1])

    def write(self, data: bytes) -> None:
        self.transport.write(data)
        self.log.answered(self.host, self.port, bytes(data[2:]), True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class _Noting:
    """What the TCP frontend asks to respond: notes each message, then the responder's reply."""

    def __init__(self, responder: Responder, log: QueryLog, stream: _Stream) -> None:
        self.responder = responder
        self.log = log
        self.stream = stream

    def respond(self, data: bytes, transport: Transport, source: str, started: float) -> Any:
        self.log.asked(self.stream.host, self.stream.port, data)
        return self.responder.respond(data, transport, source, started)


class LoggedTcpProtocol(TcpProtocol):
    """The TCP frontend with `log` on: each message noted, each reply logged."""

    def __init__(
        self,
        responder: Responder,
        limits: TcpLimits,
        kind: Transport,
        log: QueryLog,
        screen: Screen | None = None,
    ) -> None:
        super().__init__(responder, limits, kind, screen)
        self.log = log

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = _Stream(transport, self.log)  # type: ignore[arg-type]
        self.responder = _Noting(self.responder, self.log, stream)  # type: ignore[assignment]
        super().connection_made(stream)  # type: ignore[arg-type]
