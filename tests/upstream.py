"""Fake upstream DNS servers on loopback for forwarding tests: they answer from a table, or
misbehave on purpose, one way per mode, over UDP and TCP (`tcp_mode` may differ):

- `answer`: as a recursive resolver would (BIND, unbound): over UDP, a reply larger than the
  query's buffer (its EDNS size, else 512) is TC with no records; `truncate`: TC over UDP for
  names in the table, so the client must use TCP; `slow`: answers after `delay` seconds;
- `silent`: never answers; `close`: TCP closes on accept (UDP stays silent);
- `midreply`: half a reply (TCP: then closes); `short`: a 3-byte reply; `garbage`: the right ID
  and then bytes that parse as nothing; `wrong_id`: a good reply with another ID;
- `wrong_question`: `evil.example. A 6.6.6.6`, whatever was asked;
- `relay`: passes every query on to `relay_to` (host, port) over UDP and relays the reply back,
  with the same ID or, with `new_ids`, a fresh one, as a resolver in a loop would.

Health probes (`. NS`) get the same treatment as every other query. The stub records each query
it gets (with its RD flag), the TCP connections it accepted and the most it had open at once.
Given a TLS context (`tls`), it also serves DNS over TLS on `tls_port`, as TCP is served.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dnslib

MODES = frozenset(
    {"answer", "truncate", "slow", "silent", "close", "midreply", "short", "garbage", "wrong_id"}
    | {"wrong_question", "relay", "servfail", "refused"}
)


class StubUpstream:
    """UDP and TCP on 127.0.0.1:port, in a thread. `records` maps (name, type) to zone lines."""

    def __init__(
        self,
        records: dict[tuple[str, str], list[str]],
        mode: str = "answer",
        tcp_mode: str | None = None,
        delay: float = 0.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        assert mode in MODES and (tcp_mode is None or tcp_mode in MODES)
        self.tls = tls
        self.tls_port = 0
        self.records = records
        self.mode = mode
        self.tcp_mode = tcp_mode or mode
        self.delay = delay
        #: Replies a TCP or TLS connection gets before the stub closes it (0: no limit), as
        #: servers close idle connections.
        self.replies_per_connection = 0
        self.relay_to: tuple[str, int] | None = None
        self.new_ids = False
        self.queries: list[tuple[str, str, str]] = []  # (proto, name, type)
        #: The RD flag of each query, in the order of `queries`.
        self.recursion: list[bool] = []
        #: The EDNS buffer size of each query (0 without EDNS), in the order of `queries`.
        self.buffer_sizes: list[int] = []
        self.relayed = 0
        self.tcp_accepted = 0
        self.tcp_open = 0
        self.tcp_most_open = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(5):
            raise RuntimeError("stub upstream did not start")

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def names(self) -> list[str]:
        """The names asked so far, health probes and loop checks left out."""
        return [name for _, name, qtype in self.queries if qtype not in ("NS", "HINFO")]

    def answer(self, data: bytes, tcp: bool, proto: str = "") -> bytes | None:
        """The reply to one query as this stub's mode has it, or None for none."""
        mode = self.tcp_mode if tcp else self.mode
        query = dnslib.DNSRecord.parse(data)
        name = str(query.q.qname).rstrip(".").lower()
        qtype = dnslib.QTYPE[query.q.qtype]
        self.queries.append((proto or ("tcp" if tcp else "udp"), name, qtype))
        self.recursion.append(bool(query.header.rd))
        self.buffer_sizes.append(next((rr.rclass for rr in query.ar if rr.rtype == 41), 0))
        if mode in ("silent", "close"):
            return None
        if mode == "short":
            return data[:3]
        if mode == "garbage":
            return data[:2] + b"\x81\x80\x00\x01\x00\x07\x00\x00\x00\x00" + bytes(range(40))
        reply = query.reply()
        reply.header.aa = 0  # a recursive resolver's answer
        reply.header.ra = 1
        if mode in ("servfail", "refused"):  # a failing resolver's bare reply
            reply.header.rcode = getattr(dnslib.RCODE, mode.upper())
            return bytes(reply.pack())
        if mode == "wrong_question":
            reply.questions = [dnslib.DNSQuestion("evil.example.")]
            reply.add_answer(*dnslib.RR.fromZone("evil.example. 300 IN A 6.6.6.6"))
            return bytes(reply.pack())
        lines = self.records.get((name, qtype))
        if lines is None:
            reply.header.rcode = dnslib.RCODE.NXDOMAIN
            reply.add_auth(
                *dnslib.RR.fromZone(
                    "test. 60 IN SOA ns.test. hostmaster.test. 1 7200 1800 86400 30"
                )
            )
        elif mode == "truncate" and not tcp:
            reply.header.tc = 1
        else:
            for line in lines:
                reply.add_answer(*dnslib.RR.fromZone(line))
        packed = bytes(reply.pack())
        if not tcp and len(packed) > _buffer_size(query):
            reply.rr = []
            reply.header.tc = 1
            packed = bytes(reply.pack())
        if mode == "midreply":
            return packed[: len(packed) // 2]
        if mode == "wrong_id":
            return ((int.from_bytes(packed[:2], "big") + 1) % 65536).to_bytes(2, "big") + packed[2:]
        return packed

    async def reply(self, data: bytes, tcp: bool, proto: str = "") -> bytes | None:
        """`answer`, after the delay of a slow stub, or from `relay_to` for a relay."""
        mode = self.tcp_mode if tcp else self.mode
        if mode == "relay" and self.relay_to is not None:
            self.relayed += 1
            return await self._relay(data)
        reply = self.answer(data, tcp, proto)
        if mode == "slow":
            await asyncio.sleep(self.delay)
        return reply

    async def _relay(self, data: bytes) -> bytes | None:
        assert self.relay_to is not None
        qid = random.getrandbits(16).to_bytes(2, "big") if self.new_ids else data[:2]
        waiter: asyncio.Future[bytes] = self._loop.create_future()

        class Once(asyncio.DatagramProtocol):
            def datagram_received(self, reply: bytes, addr: object) -> None:
                if not waiter.done():
                    waiter.set_result(reply)

        transport, _ = await self._loop.create_datagram_endpoint(Once, remote_addr=self.relay_to)
        try:
            transport.sendto(qid + data[2:])
            reply = await asyncio.wait_for(waiter, 2.0)
        except TimeoutError:
            return None
        finally:
            transport.close()
        return data[:2] + reply[2:]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        stub = self
        tasks: set[asyncio.Task[None]] = set()

        class Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport

            def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
                async def send() -> None:
                    reply = await stub.reply(data, tcp=False)
                    if reply is not None:
                        self.transport.sendto(reply, addr)  # type: ignore[attr-defined]

                task = stub._loop.create_task(send())
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        async def tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await tcp(reader, writer, "tls")

        async def tcp(
            reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proto: str = "tcp"
        ) -> None:
            stub.tcp_accepted += 1
            stub.tcp_open += 1
            stub.tcp_most_open = max(stub.tcp_most_open, stub.tcp_open)
            replied = 0
            try:
                if stub.tcp_mode == "close":
                    return
                while True:
                    length = int.from_bytes(await reader.readexactly(2), "big")
                    reply = await stub.reply(await reader.readexactly(length), True, proto)
                    if reply is None:
                        continue
                    if stub.tcp_mode == "midreply":
                        writer.write(len(reply * 2).to_bytes(2, "big") + reply)
                        return
                    writer.write(len(reply).to_bytes(2, "big") + reply)
                    await writer.drain()
                    replied += 1
                    if replied == stub.replies_per_connection:
                        return
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                stub.tcp_open -= 1
                writer.close()

        async def start() -> tuple[asyncio.BaseTransport, asyncio.Server]:
            # The kernel picks a UDP port that TCP may use already: then try another.
            for _ in range(20):
                transport, _ = await self._loop.create_datagram_endpoint(
                    Udp, local_addr=("127.0.0.1", 0)
                )
                self.port = transport.get_extra_info("sockname")[1]
                try:
                    return transport, await asyncio.start_server(tcp, "127.0.0.1", self.port)
                except OSError:
                    transport.close()
            raise RuntimeError("no port free for both UDP and TCP")

        transport, server = self._loop.run_until_complete(start())
        secure = None
        if self.tls is not None:
            secure = self._loop.run_until_complete(
                asyncio.start_server(tls, "127.0.0.1", 0, ssl=self.tls)
            )
            self.tls_port = secure.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        transport.close()
        server.close()
        if secure is not None:
            secure.close()
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(asyncio.sleep(0))  # transports close on the next round
        self._loop.close()


def _buffer_size(query: dnslib.DNSRecord) -> int:
    """The largest UDP reply a query takes: its EDNS buffer size (at least 512), else 512."""
    for rr in query.ar:
        if rr.rtype == dnslib.QTYPE.OPT:
            return max(512, rr.rclass)
    return 512


@contextmanager
def stub_upstream(
    records: dict[tuple[str, str], list[str]],
    mode: str = "answer",
    tcp_mode: str | None = None,
    delay: float = 0.0,
    tls: ssl.SSLContext | None = None,
) -> Iterator[StubUpstream]:
    """A started StubUpstream, stopped afterwards."""
    stub = StubUpstream(records, mode, tcp_mode, delay, tls)
    stub.start()
    try:
        yield stub
    finally:
        stub.stop()
