"""Where DNS is served: the address (CoreDNS's `bind`, and the port of the server block, or
`--listen`), and the UDP and TCP sockets bound to it."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace

from toposdns.options import Origin, Plugin, Setting, address_value

# Large socket buffers absorb bursts instead of dropping queries while the loop is busy.
UDP_BUFFER_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ListenOptions:
    """The DNS address, UDP and TCP; port 0 picks a free one."""

    host: str = "0.0.0.0"
    port: int = 53

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def server_label(host: str, port: int) -> str:
    """The `server` label CoreDNS gives the server on this address (the address it listens
    on): `dns://:PORT` on every address, `dns://ADDR:PORT` on one (`bind`), IPv6 in brackets."""
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = not host
    return f"dns://:{port}" if unspecified else f"dns://{ListenOptions(host, port)}"


def _listen(options: ListenOptions, words: Sequence[str], origin: Origin) -> ListenOptions:
    if len(words) != 1:
        raise origin.error("expected HOST:PORT, e.g. 127.0.0.1:5353")
    host, port = address_value(words[0], origin)
    return replace(options, host=host, port=port)


def _bind(options: ListenOptions, words: Sequence[str], origin: Origin) -> ListenOptions:
    """`bind ADDRESS`: one IP address (interface names and several addresses: not supported)."""
    if len(words) != 1:
        raise origin.error("expected one IP address, e.g. bind 127.0.0.1")
    try:
        host = str(ipaddress.ip_address(words[0]))
    except ValueError:
        raise origin.error(
            f"{words[0]!r} is not an IP address (interface names are not supported)"
        ) from None
    return replace(options, host=host)


BIND: Plugin[ListenOptions] = Plugin(
    "bind",
    ListenOptions,
    (
        Setting("", _bind),
        Setting(
            None,
            _listen,
            "--listen",
            "HOST:PORT",
            f"DNS address, UDP and TCP (default {ListenOptions()}; port 0 picks one)",
        ),
    ),
)


def bind_pair(
    family: int, host: str, port: int, reuse_port: bool = False, listen: bool = True
) -> tuple[socket.socket, socket.socket]:
    """A UDP and a TCP socket bound to one port (with `reuse_port`, a port other such sockets
    share: the kernel spreads queries among them). For port 0 the kernel picks the UDP port,
    which TCP may already use: then try another, a bounded number of times."""
    for attempt in range(1 if port else 20):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, UDP_BUFFER_BYTES)
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UDP_BUFFER_BYTES)
        tcp = socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        for sock in (udp, tcp) if reuse_port else ():
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            udp.bind((host, port))
            tcp.bind((host, udp.getsockname()[1]))
            if listen:
                tcp.listen(1024)
        except OSError:
            udp.close()
            tcp.close()
            if port or attempt == 19:
                raise
            continue
        return udp, tcp
    raise AssertionError("unreachable")
