"""A server block's chain of plugins, as CoreDNS's: each plugin answers a query or passes it on.

A query that reaches a block (serve/blocks.py) runs down its chain in the order of CoreDNS's
`plugin.cfg`, whatever order the Corefile wrote the directives in. Each plugin's handler gets
the `Request` and the rest of the chain (`Next`), and either answers, passes the request on
(`fallthrough`, or a name that is not its), or passes on a changed request and changes the
reply that comes back (`rewrite`). The end of the chain answers SERVFAIL, as CoreDNS's
`plugin.NextOrFailure` does when no plugin is left.

A reply is the message's bytes, None for no reply, or a coroutine that gives one of them once
an upstream has answered. Every server block runs so, the kubernetes one too (its chain ends in
`kubernetes` and `forward`, serve/responder.py); what runs before a chain (the reply cache,
the server's counting) is the server's, as CoreDNS's dnsserver is in front of its plugins.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toposdns.metrics import PANICS
from toposdns.serve.transport import Transport
from toposdns.wire.codes import SERVFAIL
from toposdns.wire.decode import Query
from toposdns.wire.encode import MAX_TCP_SIZE, encode_bare, udp_limit
from toposdns.wire.records import name_text, type_name

log = logging.getLogger("toposdns")

#: CoreDNS 1.14's plugin.cfg, the order a chain runs its plugins in, whatever order a Corefile
#: writes them (the plugins toposdns has are among them).
ORDER = (
    "root", "metadata", "geoip", "cancel", "tls", "quic", "timeouts", "multisocket", "reload",
    "nsid", "bufsize", "bind", "debug", "trace", "ready", "health", "pprof", "prometheus",
    "errors", "log", "dnstap", "local", "dns64", "acl", "any", "chaos", "loadbalance", "tsig",
    "cache", "rewrite", "header", "dnssec", "autopath", "minimal", "template", "transfer",
    "hosts", "route53", "azure", "clouddns", "k8s_external", "kubernetes", "file", "auto",
    "secondary", "etcd", "loop", "forward", "grpc", "erratic", "whoami", "on", "sign", "view",
    "nomad",
)  # fmt: skip

#: What answering a query gives: the reply, no reply, or a reply that needs an upstream first.
Reply = bytes | None | Coroutine[Any, Any, bytes | None]


@dataclass(slots=True)
class Request:
    """One query as the plugins of a chain see it; `written_by` is set as the reply comes
    back: the plugin that wrote it (CoreDNS's `plugin` metrics label)."""

    #: The query decoded (its buffer size already bounded by `bufsize`).
    query: Query
    #: The message as it arrived.
    data: bytes
    transport: Transport
    #: The client's address.
    source: str
    #: The server block's zone the query was routed by (CoreDNS's `zone` metrics label).
    zone: str = "."
    #: The plugin whose handler wrote the reply, once one has ("" until then).
    written_by: str = ""
    #: Whether an ANY question may go upstream: `any` says no, and `forward` then answers RFC
    #: 8482's HINFO in the upstreams' place (CoreDNS's `any` answers every ANY before the
    #: other plugins; here `kubernetes` answers the ANY questions of its zones first).
    upstream_any: bool = True

    @property
    def limit(self) -> int:
        """The largest reply this query may get: 64 KiB over TCP, else its UDP buffer."""
        return MAX_TCP_SIZE if self.transport.tcp else udp_limit(self.query.edns)


#: The rest of a chain, from the next plugin on.
Next = Callable[[Request], Reply]


class Handler(Protocol):
    """A plugin's query handler (CoreDNS's `plugin.Handler`)."""

    #: The plugin's name, as in the Corefile and the metrics' `plugin` label.
    name: str

    def serve(self, request: Request, next: Next) -> Reply:
        """The reply to `request`: answered here, or `next(request)` (perhaps changed)."""
        ...


def end_of_chain(request: Request) -> Reply:
    """What a request gets when every plugin has passed it on: SERVFAIL, as CoreDNS."""
    return encode_bare(request.query, SERVFAIL)


def failed(query: Query) -> bytes:
    """SERVFAIL for a bug in a handler, with the traceback in the log (CoreDNS's panic
    recovery, counted in `coredns_panics_total`)."""
    PANICS.inc()
    log.exception(
        "internal error answering %s %s; replied SERVFAIL",
        name_text(query.name),
        type_name(query.qtype),
    )
    return encode_bare(query, SERVFAIL)


def chain(handlers: Sequence[Handler], end: Next = end_of_chain) -> Next:
    """The handlers linked in order: the first gets each request, each the rest, the last
    `end`."""
    link: Next = end
    for handler in reversed(handlers):
        link = _linked(handler, link)
    return link


def _linked(handler: Handler, rest: Next) -> Next:
    serve, name = handler.serve, handler.name

    def link(request: Request) -> Reply:
        reply = serve(request, rest)
        # A plugin after this one that wrote the reply has said so already.
        if not request.written_by:
            request.written_by = name
        return reply

    return link
