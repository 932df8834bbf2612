"""The supervisor's messages to its workers survive the socket, whichever build runs.

A reloaded configuration goes to every worker pickled (`Reconfigure`); its options include
frozen dataclasses of modules compiled with mypyc, which pickle's default cannot make again.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields, replace

import pytest

from toposdns.config import ServeConfig
from toposdns.resolve.resolver import ResolverConfig
from toposdns.serve.any import AnyOptions
from toposdns.serve.cache import CacheBoundOptions
from toposdns.wire.encode import BufsizeOptions
from toposdns.workers.messages import Reconfigure, Stop, frame, receive


def carried(message: Reconfigure | Stop) -> object:
    async def through_a_stream() -> object:
        reader = asyncio.StreamReader()
        reader.feed_data(frame(message))
        reader.feed_eof()
        return await receive(reader)

    return asyncio.run(through_a_stream())


@pytest.mark.parametrize(
    "config",
    [
        ServeConfig(),
        replace(
            ServeConfig(),
            kubernetes=ResolverConfig(zones=(("example", "org"),), ttl=7, pods="insecure"),
            cache_bounds=CacheBoundOptions(max_bytes=1 << 20),
            bufsize=BufsizeOptions(size=1232),
            any=AnyOptions(minimal=False),
        ),
    ],
    ids=["defaults", "changed"],
)
def test_a_reloaded_configuration_reaches_the_worker_whole(config: ServeConfig) -> None:
    got = carried(Reconfigure(config))
    assert isinstance(got, Reconfigure) and got == Reconfigure(config)
    for field in fields(config):
        assert type(getattr(got.config, field.name)) is type(getattr(config, field.name))


def test_other_messages_too() -> None:
    assert carried(Stop(now=True)) == Stop(now=True)
