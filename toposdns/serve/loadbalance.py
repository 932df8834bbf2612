"""CoreDNS's `loadbalance round_robin`: the order of address records varies from reply to reply.

The handler shuffles the replies of the plugins after it in the chain (wire/shuffle.py says
how, as CoreDNS's plugin/loadbalance does); a reply that waits for an upstream is shuffled
once it is there. The kubernetes block's cached replies never reach it: the reply cache rotates
their addresses itself, one place per reply (serve/cache.py), in front of every plugin.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from toposdns.options import Origin, Plugin, Setting, sets
from toposdns.serve.chain import Next, Reply, Request
from toposdns.wire.codes import Name
from toposdns.wire.shuffle import shuffle_reply


@dataclass(frozen=True, slots=True)
class LoadbalanceOptions:
    """CoreDNS's `loadbalance [round_robin]` (`--loadbalance`)."""

    round_robin: bool = False


def _policy(words: Sequence[str], origin: Origin) -> bool:
    if list(words) not in ([], ["round_robin"]):
        raise origin.error("only the round_robin policy is supported")
    return True


LOADBALANCE: Plugin[LoadbalanceOptions] = Plugin(
    "loadbalance",
    LoadbalanceOptions,
    (
        Setting(
            "",
            sets("round_robin", _policy),
            "--loadbalance",
            help="vary the order of A, AAAA and MX records from reply to reply "
            "(CoreDNS `loadbalance round_robin`)",
        ),
    ),
)


class LoadBalance:
    """The `loadbalance` handler: the replies of the rest of the chain, shuffled."""

    name = "loadbalance"

    def serve(self, request: Request, next: Next) -> Reply:
        reply = next(request)
        if reply is None:
            return None
        if isinstance(reply, bytes):
            return shuffle_reply(reply) or reply
        return shuffled(reply)


async def shuffled(pending: Coroutine[Any, Any, bytes | None]) -> bytes | None:
    """A reply that waits for an upstream, shuffled once it is there."""
    reply = await pending
    return None if reply is None else shuffle_reply(reply) or reply


def make_loadbalance(options: LoadbalanceOptions, zones: tuple[Name, ...]) -> LoadBalance | None:
    """The `loadbalance` handler; None without it."""
    return LoadBalance() if options.round_robin else None
