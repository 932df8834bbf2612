"""What the resolver returns: the answer its records (wire/records.py) make up, with what the
server needs to know of it beyond the wire: the topology policy and tier it followed, a name to
chase upstream, the data it read.

A named tuple: made for every query that misses the cache, where a frozen dataclass costs
several times as much to build.
"""

from __future__ import annotations

from typing import NamedTuple

from toposdns.store.snapshot import Dependency
from toposdns.store.topology import Policy
from toposdns.wire.codes import Name
from toposdns.wire.records import RR


class Chase(NamedTuple):
    """An ExternalName target outside the zones: the server asks its upstream for it.

    CoreDNS appends the upstream's answer section after the CNAME (whatever its rcode) and
    copies its TC bit; when no reply comes at all, the CNAME is dropped, leaving NODATA.
    """

    target: Name
    qtype: int
    soa: RR


class Answer(NamedTuple):
    """A complete DNS answer, before it is put on the wire."""

    rcode: int
    answer: tuple[RR, ...] = ()
    authority: tuple[RR, ...] = ()
    additional: tuple[RR, ...] = ()
    #: AA: set on everything the cluster zones answer; not on REFUSED and other server errors.
    authoritative: bool = True
    #: The topology policy the answer followed when it depends on the client, else None.
    policy: Policy | None = None
    #: The tier of that policy the answer came from (`Selection.tier`); empty without a policy.
    tier: str = ""
    #: Soft topology: "spill-over" when tiers past the nearest one were added, "weighted" for
    #: an SRV answer that carries weights between tiers; empty otherwise (metrics count them).
    soft: str = ""
    #: Set when the answer ends in a CNAME to a name outside the zones.
    chase: Chase | None = None
    #: What of the snapshot the answer read: a cached reply is dropped when one changes.
    depends: frozenset[Dependency] = frozenset()
    #: True when the cluster does not have the name and a `--fallthrough` zone holds it: the
    #: upstreams answer instead (CoreDNS's `fallthrough`, then `forward`).
    fallthrough: bool = False
    #: Topology weights on A and AAAA: which tier (`Selection.rotation`'s index) answers each
    #: of ROTATION turns, and the client's counter of turns (store/turns.py `TurnCounts`;
    #: None when none was given); empty when answers do not rotate.
    schedule: tuple[int, ...] = ()
    counter: list[int] | None = None
