"""A stub upstream DNS server on loopback for forwarding tests: it answers from a table, or
misbehaves on purpose (stays silent, or truncates every UDP reply so the client must use TCP)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import dnslib


class StubUpstream:
    """UDP and TCP on 127.0.0.1:port, in a thread. `records` maps (name, type) to zone lines."""

    def __init__(self, records: dict[tuple[str, str], list[str]], mode: str = "answer") -> None:
        self.records = records
        self.mode = mode  # answer | silent | truncate
        self.queries: list[tuple[str, str, str]] = []  # (proto, name, type)
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

    def answer(self, data: bytes, tcp: bool) -> bytes | None:
        query = dnslib.DNSRecord.parse(data)
        name = str(query.q.qname).rstrip(".").lower()
        qtype = dnslib.QTYPE[query.q.qtype]
        self.queries.append(("tcp" if tcp else "udp", name, qtype))
        if self.mode == "silent":
            return None
        reply = query.reply()
        reply.header.aa = 0  # a recursive resolver's answer
        reply.header.ra = 1
        lines = self.records.get((name, qtype))
        if lines is None:
            reply.header.rcode = dnslib.RCODE.NXDOMAIN
            reply.add_auth(
                *dnslib.RR.fromZone(
                    "test. 60 IN SOA ns.test. hostmaster.test. 1 7200 1800 86400 30"
                )
            )
        elif self.mode == "truncate" and not tcp:
            reply.header.tc = 1
        else:
            for line in lines:
                reply.add_answer(*dnslib.RR.fromZone(line))
        return bytes(reply.pack())

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        stub = self

        class Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport

            def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
                reply = stub.answer(data, tcp=False)
                if reply is not None:
                    self.transport.sendto(reply, addr)  # type: ignore[attr-defined]

        async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    length = int.from_bytes(await reader.readexactly(2), "big")
                    reply = stub.answer(await reader.readexactly(length), tcp=True)
                    if reply is not None:
                        writer.write(len(reply).to_bytes(2, "big") + reply)
                        await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        async def start() -> tuple[asyncio.BaseTransport, asyncio.Server]:
            transport, _ = await self._loop.create_datagram_endpoint(
                Udp, local_addr=("127.0.0.1", 0)
            )
            self.port = transport.get_extra_info("sockname")[1]
            return transport, await asyncio.start_server(tcp, "127.0.0.1", self.port)

        transport, server = self._loop.run_until_complete(start())
        self._ready.set()
        self._loop.run_forever()
        transport.close()
        server.close()
        self._loop.run_until_complete(server.wait_closed())
        for task in asyncio.all_tasks(self._loop):
            task.cancel()
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()


@contextmanager
def stub_upstream(
    records: dict[tuple[str, str], list[str]], mode: str = "answer"
) -> Iterator[StubUpstream]:
    """A started StubUpstream, stopped afterwards."""
    stub = StubUpstream(records, mode)
    stub.start()
    try:
        yield stub
    finally:
        stub.stop()
