"""`toposdns explain`: why a client gets the records it gets.

It runs the same resolver the server runs, with a trace, and tells which locator placed the
client and why it is believed (its namespace), the locators of other namespaces that claim the
client but are ignored, which policy applied (or why it was ignored), which tier matched, the
candidates and the records returned; with --autopath, the names of the client's search path the
server tries, up to the first it finds or the first it must ask the upstreams for.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from toposdns.resolve.answer import Answer
from toposdns.resolve.autopath import (
    NO_AUTOPATH,
    AutopathOptions,
    candidates,
    completed,
    goes_on,
    local_answer,
    walk,
)
from toposdns.resolve.client import Client, identify
from toposdns.resolve.qname import InvalidName, parse_request
from toposdns.resolve.resolver import Decision, ResolverConfig, match_zone, resolve
from toposdns.store.model import NODE_NAME, PodLocator
from toposdns.store.placement import EVERY_NAMESPACE
from toposdns.store.snapshot import Snapshot
from toposdns.store.topology import ROTATION, Labels, Policy
from toposdns.wire.codes import RCODE_NAMES, Name
from toposdns.wire.records import name_text, type_code, type_name

# A label as typed: printable ASCII but a backslash (escapes are not read); spaces are not.
_LABEL = re.compile(r"[!-\[\]-~]{1,63}")
MAX_NAME_WIRE = 255
#: Ignored PodLocators claiming a client that are named; the others are counted.
SHOWN_IGNORED = 5


@dataclass(frozen=True, slots=True)
class Step:
    """A name of the search path that autopath tries: the zones' answer, or None when the
    server asks its upstreams for it (and the rest, until one exists)."""

    name: Name
    answer: Answer | None


@dataclass(frozen=True, slots=True)
class Explanation:
    """Everything `explain` reports for one question from one client."""

    client: Client
    name: Name
    qtype: int
    answer: Answer
    decisions: list[Decision] = field(default_factory=list)
    #: The policy of the headless service the name belongs to, when no decision was needed.
    idle_policy: tuple[str, Policy] | None = None
    #: With --autopath, for a pod asking below its first search domain: the names tried.
    autopath: tuple[Step, ...] | None = None
    #: The namespaces whose PodLocators are believed (`--locator-namespaces`).
    believed: frozenset[str] = frozenset()
    #: PodLocators of other namespaces claiming the client, each with what of it they claim
    #: (the address, or a CIDR holding it), and how many they are in all.
    ignored: tuple[tuple[PodLocator, str], ...] = ()
    ignored_count: int = 0


def explain(
    snapshot: Snapshot,
    config: ResolverConfig,
    address: str,
    name: Name,
    qtype: int,
    autopath: AutopathOptions = NO_AUTOPATH,
) -> Explanation:
    """Resolve `name` for a client at `address` (or in the prefix `address/length`, as a
    forwarder's Client Subnet would give it), keeping the topology decisions (and with
    `autopath` on, the search-path walk the server would take)."""
    host, _, length = address.partition("/")
    client = identify(snapshot, host, bool(length), int(length) if length else None)
    decisions: list[Decision] = []
    answer = resolve(name, qtype, snapshot, config, client.labels, decisions)
    steps = None
    locator = client.locator
    names = None
    if autopath.enabled and locator is not None and not locator.is_node:
        names = candidates(name, locator.namespace_of_pod, config, autopath.search)
    if names is not None:
        decisions = []  # the walk's, whose first name is the name asked
        steps = _walk(snapshot, config, client, names, qtype, decisions)
        last = steps[-1].answer
        if last is not None and not goes_on(last):
            answer = completed(last, name)
        elif steps[0].answer is not None:
            answer = steps[0].answer  # the reply to the first name, if none exists
    ignored = ignored_claims(snapshot, host, int(length) if length else None)
    return Explanation(
        client,
        name,
        qtype,
        answer,
        decisions,
        _service_policy(snapshot, config, name),
        steps,
        snapshot.locator_namespaces,
        tuple(ignored[:SHOWN_IGNORED]),
        len(ignored),
    )


def ignored_claims(
    snapshot: Snapshot, address: str, length: int | None = None
) -> list[tuple[PodLocator, str]]:
    """The PodLocators that are not believed (their namespace) but claim the address, or the
    prefix `address/length`: exactly, or by a CIDR holding it whole. Each with what it claims,
    ordered by namespace and name. A scan of the ignored ones, which only explain needs."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return []
    key = str(ip)
    if length is not None and length >= ip.max_prefixlen:
        length = None
    found = []
    for locator in snapshot.ignored.values():
        if length is None and key in locator.addresses:
            found.append((locator, key))
            continue
        for cidr in locator.cidrs:
            network = ipaddress.ip_network(cidr)
            if network.version == ip.version and ip in network:
                if length is None or network.prefixlen <= length:
                    found.append((locator, cidr))
                    break
    found.sort(key=lambda claim: (claim[0].namespace, claim[0].name))
    return found


def _walk(
    snapshot: Snapshot,
    config: ResolverConfig,
    client: Client,
    names: tuple[Name, ...],
    qtype: int,
    decisions: list[Decision],
) -> tuple[Step, ...]:
    """The names autopath tries in the zones, up to the first that exists or that only the
    upstreams can answer."""

    def local(name: Name) -> Answer | None:
        return local_answer(name, qtype, snapshot, config, client.labels, decisions)

    return tuple(Step(names[index], answer) for index, answer in walk(names, 0, local))


def parse_question(address: str, name: str, qtype: str) -> tuple[str, Name, int]:
    """The client address, name and type of an explain request (the command line's arguments,
    or the parameters of /explain), checked; ValueError says what is wrong. The client may be
    a prefix, `ADDRESS/LENGTH`, as a forwarder's Client Subnet gives it (the bits past LENGTH
    are cleared, as the forwarder clears them)."""
    try:
        if "/" in address:
            address = str(ipaddress.ip_network(address, strict=False))
        else:
            ipaddress.ip_address(address)
    except ValueError:
        shown = _shown(address)
        raise ValueError(
            f"client {shown} does not appear to be an IPv4 or IPv6 address, or a prefix "
            "ADDRESS/LENGTH"
        ) from None
    try:
        code = type_code(qtype)
    except ValueError:
        raise ValueError(f"unknown record type {_shown(qtype)}") from None
    return address, parse_name(name), code


def parse_name(text: str) -> Name:
    """A name as typed (a final dot is optional; "." is the root) as labels, or ValueError if
    it could not be asked in DNS."""
    if not text:
        raise ValueError("the name is empty")
    labels = tuple(text.removesuffix(".").split(".")) if text != "." else ()
    for label in labels:
        if not label:
            raise ValueError(f"name {_shown(text)} has an empty label")
        if not _LABEL.fullmatch(label):
            raise ValueError(
                f"name {_shown(text)}: label {_shown(label)} is not 1 to 63 printable ASCII "
                "characters without spaces or backslashes"
            )
    if sum(len(label) + 1 for label in labels) + 1 > MAX_NAME_WIRE:
        raise ValueError(f"name {_shown(text)} is longer than {MAX_NAME_WIRE} octets")
    return labels


def _shown(text: str) -> str:
    """User input quoted in a message, cut short: it may be anything an HTTP client sent."""
    return repr(text) if len(text) <= 64 else repr(text[:64]) + "..."


def _service_policy(
    snapshot: Snapshot, config: ResolverConfig, name: Name
) -> tuple[str, Policy] | None:
    lower = tuple(label.lower() for label in name)
    zone_len = match_zone(lower, config.zones)
    if zone_len is None:
        return None
    try:
        request = parse_request(lower[: len(lower) - zone_len])
    except InvalidName:
        return None
    policy = snapshot.policies.get((request.namespace, request.service))
    if policy is None:
        return None
    return f"{request.namespace}/{request.service}", policy


def _labels_text(labels: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(_node_labels(labels).items())) or "(none)"


def _node_labels(labels: Labels) -> dict[str, str]:
    """The labels as the locator or slice gives them, without the node name that topology
    compares too (NODE_NAME), which the client line and `node` fields show."""
    return {key: value for key, value in labels.items() if key != NODE_NAME}


def _placement(client: Client) -> str:
    locator = client.locator
    placement = client.placement
    if placement.conflict:
        names = " and ".join(f"{held.namespace}/{held.name}" for held in placement.conflict)
        return (
            f"PodLocators {names} all claim {placement.via}, the longest prefix holding it: "
            "nobody inside it is placed, the client has no labels"
        )
    if locator is None:
        if client.length is not None:
            return "no PodLocator CIDR holds all of this prefix: the client has no labels"
        return "no PodLocator holds this address or a prefix of it: the client has no labels"
    kind = "node locator" if locator.is_node else "PodLocator"
    found = f"{kind} {locator.namespace}/{locator.name} on node {locator.node_name or '?'}"
    if placement.via != client.address:
        return f"{found}, through its CIDR {placement.via}"
    return f"{found}, through its address {placement.via}"


def _believed_text(result: Explanation) -> str:
    """Why the locator that placed the client is believed."""
    if EVERY_NAMESPACE in result.believed:
        return "--locator-namespaces=* believes the PodLocators of every namespace"
    listed = ",".join(sorted(result.believed))
    namespace = result.client.locator.namespace if result.client.locator else "?"
    return f"namespace {namespace} is in --locator-namespaces={listed}"


def _soft_text(decision: Decision) -> list[str]:
    """Soft topology: the tiers taken, and what SRV and the rotation of A and AAAA carry."""
    selection, candidates = decision.selection, decision.candidates
    lines = []
    if selection.taken:
        lines.append(f"  tiers taken: {', '.join(selection.taken)}")
    if selection.srv:
        lines.append("  SRV (priority, group weight):")
        lines.extend(
            f"    {','.join(candidates[i][0].addresses):18} priority {priority}, "
            f"group {group} shares {share}"
            for i, priority, group, share in selection.srv
        )
    if selection.rotation:
        # Each reply takes the next turn of the client's rotation; `answer` below is turn 0's.
        lines.append(
            "  weights for A/AAAA: "
            + ", ".join(f"{share}/{ROTATION}" for share, _ in selection.rotation)
            + " of the replies, in turn (the answer below: the first turn's)"
        )
    return lines


def _ignored_text(result: Explanation) -> list[str]:
    """A line per ignored PodLocator claiming the client (a few), and the count of the rest."""
    listed = ",".join(sorted(result.believed))
    lines = [
        f"  ignored: {'node locator' if held.is_node else 'PodLocator'} "
        f"{held.namespace}/{held.name} claims {what}, but only the PodLocators of "
        f"--locator-namespaces={listed} are believed"
        for held, what in result.ignored
    ]
    if result.ignored_count > len(result.ignored):
        more = result.ignored_count - len(result.ignored)
        lines.append(f"  ignored: {more} more PodLocators of other namespaces claim it")
    return lines


def _client_text(client: Client) -> str:
    return client.address if client.length is None else f"{client.address}/{client.length}"


def render_text(result: Explanation) -> str:
    """The explanation for a person."""
    client = result.client
    lines = [f"client {_client_text(client)}: {_placement(client)}"]
    if client.locator is not None:
        lines.append(f"  believed: {_believed_text(result)}")
    lines.extend(_ignored_text(result))
    lines += [
        f"  labels: {_labels_text(client.labels)}",
        f"question: {name_text(result.name)} {type_name(result.qtype)}",
    ]
    if not result.decisions:
        if result.idle_policy is None:
            lines.append("topology: not applied (not a headless service with a policy)")
        else:
            service, policy = result.idle_policy
            lines.append(f"service {service} (headless): policy {policy.describe()}")
            lines.extend(f"  ignored: {error}" for error in (*policy.errors, *policy.soft_errors))
            lines.append("  not applied: no ready endpoint to choose from, or not the service name")
    for decision in result.decisions:
        svc, policy = decision.service, decision.policy
        lines.append(f"service {svc.namespace}/{svc.name} (headless): policy {policy.describe()}")
        for error in (*policy.errors, *policy.soft_errors):
            lines.append(f"  ignored: {error}")
        if policy.active:
            lines.append(f"  mode: {policy.mode}")
        chosen = set(decision.selection.chosen)
        lines.append("  candidates:")
        for i, (endpoint, labels) in enumerate(decision.candidates):
            mark = "chosen" if i in chosen else "-"
            address = ",".join(endpoint.addresses)
            lines.append(f"    {mark:6} {address:18} {_labels_text(labels)}")
        lines.append(f"  rule: {decision.selection.rule}")
        lines.extend(_soft_text(decision))
    if result.autopath is not None:
        lines.extend(_autopath_text(result))
    answer = result.answer
    if answer.fallthrough:
        lines.append("answer: not in the cluster; the upstreams answer (--fallthrough)")
    else:
        lines.append(f"answer: {RCODE_NAMES.get(answer.rcode, answer.rcode)}")
    for section, records in (
        ("answer", answer.answer),
        ("authority", answer.authority),
        ("additional", answer.additional),
    ):
        for rr in records:
            lines.append(f"  {section:10} {rr}")
    return "\n".join(lines)


def _autopath_text(result: Explanation) -> list[str]:
    assert result.autopath is not None and result.client.locator is not None
    lines = [f"autopath: the client's pod is in namespace {result.client.locator.namespace_of_pod}"]
    for step in result.autopath:
        if step.answer is None:
            lines.append(
                f"  upstream {name_text(step.name)}  asked upstream, and the names after it, "
                "until one exists; if none does, the answer below"
            )
        elif goes_on(step.answer):
            lines.append(f"  tried    {name_text(step.name)}  NXDOMAIN")
        else:
            rcode = RCODE_NAMES.get(step.answer.rcode, str(step.answer.rcode))
            lines.append(f"  found    {name_text(step.name)}  {rcode}")
    return lines


def render_json(result: Explanation) -> dict[str, Any]:
    """The explanation for tools."""
    client = result.client
    locator = client.locator
    answer = result.answer
    return {
        "client": {
            "address": _client_text(client),
            "locator": None
            if locator is None
            else {
                "namespace": locator.namespace,
                "name": locator.name,
                "pod_namespace": None if locator.is_node else locator.namespace_of_pod,
                "node": locator.node_name,
                "kind": "node" if locator.is_node else "pod",
                "via": "address" if client.placement.via == client.address else "cidr",
                "matched": client.placement.via,
            },
            "conflict": [f"{held.namespace}/{held.name}" for held in client.placement.conflict],
            "locator_namespaces": sorted(result.believed),
            "ignored": [
                {"locator": f"{held.namespace}/{held.name}", "matched": what}
                for held, what in result.ignored
            ],
            "ignored_count": result.ignored_count,
            "labels": _node_labels(client.labels),
        },
        "question": {"name": name_text(result.name), "type": type_name(result.qtype)},
        "topology": [
            {
                "service": f"{d.service.namespace}/{d.service.name}",
                "policy": {
                    "source": d.policy.source,
                    "keys": list(d.policy.keys),
                    "hints": d.policy.hints,
                    "node_hints": d.policy.node_hints,
                    "valid": not d.policy.errors,
                    "errors": list(d.policy.errors),
                    "mode": d.policy.mode,
                    "weights": list(d.policy.weights),
                    "soft_errors": list(d.policy.soft_errors),
                },
                "candidates": [
                    {
                        "addresses": list(ep.addresses),
                        "labels": _node_labels(labels),
                        "chosen": i in d.selection.chosen,
                    }
                    for i, (ep, labels) in enumerate(d.candidates)
                ],
                "rule": d.selection.rule,
                "tier": d.selection.tier,
                "tiers_taken": list(d.selection.taken),
                "srv": [
                    {"addresses": list(d.candidates[i][0].addresses), "priority": p, "share": w}
                    for i, p, _, w in d.selection.srv
                ],
                "rotation": [
                    {
                        "share": share,
                        "addresses": [a for i in held for a in d.candidates[i][0].addresses],
                    }
                    for share, held in d.selection.rotation
                ],
            }
            for d in result.decisions
        ],
        "autopath": None
        if result.autopath is None
        else [
            {
                "name": name_text(step.name),
                "rcode": None
                if step.answer is None
                else RCODE_NAMES.get(step.answer.rcode, str(step.answer.rcode)),
                "upstream": step.answer is None,
            }
            for step in result.autopath
        ],
        "fallthrough": answer.fallthrough,
        "rcode": RCODE_NAMES.get(answer.rcode, str(answer.rcode)),
        "answer": [str(rr) for rr in answer.answer],
        "authority": [str(rr) for rr in answer.authority],
        "additional": [str(rr) for rr in answer.additional],
    }
