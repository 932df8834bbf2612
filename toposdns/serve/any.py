"""CoreDNS's `any`: an ANY question gets RFC 8482's minimal reply, one HINFO record.

CoreDNS's plugin answers every ANY question so. toposdns answers those the upstreams would
be asked (a name outside the kubernetes zones, or one that falls through): the reply an
upstream gives ANY is as large as it likes, an open amplifier. The zones answer their own ANY
questions, as the kubernetes plugin would after `any` in CoreDNS's chain. It is on unless
`--forward-any`; `any` in a Corefile says so too.

The handler runs where CoreDNS's `plugin.cfg` puts `any`, before `kubernetes`, and marks the
request (`Request.upstream_any`); `forward` (serve/forward.py `Forwarding`) then answers the
HINFO in the upstreams' place, under this plugin's name.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from toposdns.options import Plugin, Setting, none, sets
from toposdns.serve.chain import Next, Reply, Request
from toposdns.wire.codes import ANY, Name


@dataclass(frozen=True, slots=True)
class AnyOptions:
    """CoreDNS's `any`: ANY for a name the upstreams would answer gets RFC 8482's minimal
    reply. On unless `--forward-any`; `any` in a Corefile says so too."""

    minimal: bool = True


ANY_PLUGIN: Plugin[AnyOptions] = Plugin(
    "any",
    AnyOptions,
    (
        Setting("", sets("minimal", none)),
        Setting(
            None,
            lambda options, words, origin: replace(options, minimal=False),
            "--forward-any",
            help="forward ANY questions for names outside the zones; by default they get RFC "
            "8482's minimal answer, a HINFO record, as from CoreDNS's `any` plugin",
        ),
    ),
)


class Any:
    """The `any` handler: no ANY question goes upstream."""

    name = "any"

    def serve(self, request: Request, next: Next) -> Reply:
        if request.query.qtype == ANY:
            request.upstream_any = False
        return next(request)


def make_any(options: AnyOptions, zones: tuple[Name, ...]) -> Any | None:
    """The `any` handler; None with `--forward-any`. (Its rule holds for every name.)"""
    return Any() if options.minimal else None
