"""CoreDNS's `acl`: allow, block, filter or drop queries by their source address and type.

    acl [ZONES...] {
        ACTION [type QTYPE...] [net SOURCE...]
    }

ACTION is `allow`, `block` (REFUSED), `filter` (an empty NOERROR) or `drop` (no reply). Each
`acl` block applies to the names in its zones (the server block's without any); its rules are
tried in order, and the first that matches the query's type (`*`, or no `type`: any) and its
source address (`*`, or no `net`: any) decides. `allow` ends the checks; a block where no rule
matches hands the query to the next one. As CoreDNS's plugin/acl/acl.go, the REFUSED and NOERROR
replies carry an OPT record (4096 bytes, DO set) with the Extended DNS Error Blocked (15) or
Filtered (17).

It is checked first, on every query, before any cached reply; with no `acl` it costs nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from struct import pack
from typing import Literal

from toposdns.metrics import ACL_BLOCKED, ACL_DROPPED, ACL_FILTERED
from toposdns.options import Network, Origin, Plugin, Setting, domain
from toposdns.wire.codes import NOERROR, OPT, REFUSED, Name
from toposdns.wire.decode import HEADER_SIZE, read_name
from toposdns.wire.records import type_code

Action = Literal["allow", "block", "filter", "drop"]
#: A frontend's check of a query (its bytes, its source address): None when it goes on, else
#: what the client gets (b"": nothing).
Screen = Callable[[bytes, str], bytes | None]
ACTIONS: tuple[Action, ...] = ("allow", "block", "filter", "drop")
#: Extended DNS Errors (RFC 8914) CoreDNS adds to its acl replies.
EDE = 15
EDE_BLOCKED, EDE_FILTERED = 15, 17


@dataclass(frozen=True, slots=True)
class Rule:
    """`ACTION [type QTYPE...] [net SOURCE...]`: empty types or networks match any."""

    action: Action
    types: frozenset[int] = frozenset()
    networks: tuple[Network, ...] = ()

    def matches(self, qtype: int, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return (not self.types or qtype in self.types) and (
            not self.networks or any(address in network for network in self.networks)
        )


@dataclass(frozen=True, slots=True)
class Policy:
    """One `acl` block: its zones, lower-case (`()` is the root), and its rules in order."""

    zones: tuple[Name, ...]
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True, slots=True)
class AclOptions:
    """Every `acl` block of the server block, in order (none: every query is allowed)."""

    policies: tuple[Policy, ...] = ()


def _zones(options: AclOptions, words: Sequence[str], origin: Origin) -> AclOptions:
    """`acl [ZONES...]`: a new block (its zones are the server block's when none are given)."""
    zones = tuple(dict.fromkeys(domain(word, origin) for word in words or ["."]))
    return replace(options, policies=(*options.policies, Policy(zones)))


def _rule(action: Action) -> Setting[AclOptions]:
    """`ACTION [type QTYPE...] [net SOURCE...]`, added to the last block."""

    def apply(options: AclOptions, words: Sequence[str], origin: Origin) -> AclOptions:
        types: set[int] = set()
        networks: list[Network] = []
        into, every = "", set()
        for word in words:
            if word in ("type", "net"):
                into = word
            elif not into:
                raise origin.error("expected `type QTYPE...` and `net SOURCE...`")
            elif word == "*":
                every.add(into)  # every type, or every source
            elif into == "type":
                try:
                    types.add(type_code(word))
                except ValueError:
                    raise origin.error(f"{word!r} is not a record type") from None
            else:
                networks.append(_network(word, origin))
        if not options.policies:
            raise origin.error("a rule outside an acl block")
        rule = Rule(
            action,
            frozenset() if "type" in every else frozenset(types),
            () if "net" in every else tuple(networks),
        )
        last = options.policies[-1]
        policies = (*options.policies[:-1], replace(last, rules=(*last.rules, rule)))
        return replace(options, policies=policies)

    return Setting(action, apply)


def _network(word: str, origin: Origin) -> Network:
    try:
        return ipaddress.ip_network(word, strict=False)
    except ValueError:
        raise origin.error(f"{word!r} is not an address or CIDR, e.g. 10.0.0.0/8") from None


ACL: Plugin[AclOptions] = Plugin(
    "acl", AclOptions, (Setting("", _zones), *(_rule(action) for action in ACTIONS))
)


class Acl:
    """The checks of the `acl` blocks, for the frontends."""

    def __init__(self, options: AclOptions, server: str = "dns://:53") -> None:
        self.policies = options.policies
        self.server = server

    def screen(self, data: bytes, source: str) -> bytes | None:
        """None when the query goes on; else what the client gets: a reply, or b"" (none).
        A query too broken to read goes on, to be refused as the server refuses such."""
        try:
            name, end = read_name(data, HEADER_SIZE)
            qtype = (data[end] << 8) | data[end + 1]
            address = ipaddress.ip_address(source.partition("%")[0])
        except (IndexError, ValueError):
            return None
        lower = tuple(label.lower() for label in name)
        for policy in self.policies:
            zone = next((z for z in policy.zones if lower[len(lower) - len(z) :] == z), None)
            if zone is None:
                continue
            rule = next((r for r in policy.rules if r.matches(qtype, address)), None)
            if rule is None:
                continue
            if rule.action == "allow":
                return None
            label = ".".join(zone) + "."
            if rule.action == "drop":
                ACL_DROPPED.labels(self.server, label, "").inc()
                return b""
            counter, rcode, info = (
                (ACL_BLOCKED, REFUSED, EDE_BLOCKED)
                if rule.action == "block"
                else (ACL_FILTERED, NOERROR, EDE_FILTERED)
            )
            counter.labels(self.server, label, "").inc()
            return refusal(data, end + 4, rcode, info)
        return None


def refusal(data: bytes, question_end: int, rcode: int, info: int) -> bytes:
    """CoreDNS's acl reply: the question, `rcode`, and an OPT (4096, DO) with the EDE `info`."""
    # QR; the query's opcode, RD and CD (miekg/dns SetReply)
    flags = 0x8000 | (data[2] & 0x79) << 8 | (data[3] & 0x10) | rcode
    header = data[:2] + pack("!HHHHH", flags, 1, 0, 0, 1)
    option = pack("!HHH", EDE, 2, info)
    opt = b"\x00" + pack("!HHIH", OPT, 4096, 0x8000, len(option)) + option
    return header + data[HEADER_SIZE:question_end] + opt
