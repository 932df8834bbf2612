"""The controller's settings, validated from the command line; no I/O here."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from toposdns.kube.names import is_dns_label, is_dns_subdomain, qualified_name_errors
from toposdns.options import ConfigError, Origin, address_value, choice, duration_value

#: The node labels topology needs, copied by default.
DEFAULT_LABEL_KEYS = (
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)
#: client-go's leader election jitter factor: the renew deadline must exceed retry period x this.
JITTER_FACTOR = 1.2

#: `--pod-locators`: which pods get a locator of their own.
POD_LOCATOR_MODES = ("auto", "all", "none")
#: `--node-cidrs`: where a node's pod ranges come from.
NODE_CIDR_MODES = ("spec", "learned", "auto")
PodLocatorMode = Literal["auto", "all", "none"]
NodeCidrMode = Literal["spec", "learned", "auto"]

_KEY_CHARS = re.compile(r"[-A-Za-z0-9_./]+")


@dataclass(frozen=True, slots=True)
class LabelFilter:
    """Which node labels a locator carries: these exact keys, and keys with these prefixes."""

    keys: frozenset[str] = frozenset(DEFAULT_LABEL_KEYS)
    prefixes: tuple[str, ...] = ()

    def wants(self, key: str) -> bool:
        """True if a label with this key is copied."""
        return key in self.keys or any(key.startswith(p) for p in self.prefixes)

    def select(self, labels: Mapping[str, object]) -> dict[str, str]:
        """The copied labels (string values only), sorted by key."""
        return {
            k: v for k, v in sorted(labels.items()) if isinstance(v, str) and self.wants(str(k))
        }


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Leader election timings, as client-go's LeaderElectionConfig (seconds)."""

    name: str = "toposdns-controller"
    #: How long a lease holds without renewal before another replica may take it.
    duration: float = 15.0
    #: How long the leader keeps trying to renew before it stops writing.
    renew_deadline: float = 10.0
    #: How often a replica tries to acquire or renew.
    retry_period: float = 2.0


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """Everything `toposdns controller` needs."""

    #: Where the node locators and the Lease live.
    namespace: str
    labels: LabelFilter = field(default_factory=LabelFilter)
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    #: This replica's holderIdentity in the Lease (empty: pod name or hostname + random).
    identity: str = ""
    #: Token bucket rate for API writes (and the re-reads that go with them); 0: unlimited.
    writes_per_second: float = 50.0
    #: Writes in flight at once.
    workers: int = 8
    #: How long a changed key waits before it is reconciled, so a burst costs one write.
    coalesce: float = 0.05
    #: Retry backoff of a key whose write failed: doubles from initial up to max.
    backoff_initial: float = 0.05
    backoff_max: float = 30.0
    #: Timeout of one API request (writes and Lease calls).
    request_timeout: float = 30.0
    #: /health, /ready and /metrics address; None for none.
    http: tuple[str, int] | None = None
    #: The kubeconfig to use (None: in-cluster, else ~/.kube/config).
    kubeconfig: Path | None = None
    #: Which pods get a locator of their own: `auto`, those their node's locator does not
    #: place; `all`; `none`.
    pod_locators: PodLocatorMode = "auto"
    #: Where node locators' `cidrs` come from: `spec` (Node.spec.podCIDRs), `learned` (from
    #: the pods' addresses), `auto` (spec where set, else learned).
    node_cidrs: NodeCidrMode = "spec"


def check_namespace(namespace: str) -> str:
    """A namespace name (a DNS label)."""
    if not is_dns_label(namespace):
        raise ConfigError(
            f"--namespace {namespace!r}: not a namespace name (lower-case letters, digits and "
            "'-', at most 63); in a pod pass --namespace=$(POD_NAMESPACE)"
        )
    return namespace


def check_label_key(key: str, option: str) -> str:
    """A label key: an optional DNS subdomain prefix and '/', then a name of at most 63."""
    if qualified_name_errors(key):
        raise ConfigError(
            f"{option} {key!r}: not a label key, e.g. topology.kubernetes.io/zone or rack"
        )
    return key


def parse_label_keys(texts: Iterable[str]) -> frozenset[str]:
    """Comma-separated `--node-label-keys` values, added to the default keys."""
    keys = set(DEFAULT_LABEL_KEYS)
    for text in texts:
        for part in filter(None, (p.strip() for p in text.split(","))):
            keys.add(check_label_key(part, "--node-label-keys"))
    return frozenset(keys)


def parse_label_prefixes(texts: Iterable[str]) -> tuple[str, ...]:
    """Comma-separated `--node-label-prefixes` values, e.g. `topology.kubernetes.io/`."""
    prefixes: list[str] = []
    for text in texts:
        for part in filter(None, (p.strip() for p in text.split(","))):
            if not _KEY_CHARS.fullmatch(part) or part.count("/") > 1:
                raise ConfigError(
                    f"--node-label-prefixes {part!r}: not the start of a label key, "
                    "e.g. topology.kubernetes.io/"
                )
            if part not in prefixes:
                prefixes.append(part)
    return tuple(prefixes)


def check_lease(lease: LeaseSettings) -> LeaseSettings:
    """client-go's rules: duration > renew deadline > 1.2 x retry period > 0."""
    if not is_dns_subdomain(lease.name):
        raise ConfigError(f"--lease-name {lease.name!r}: not an object name, e.g. toposdns")
    if lease.retry_period <= 0:
        raise ConfigError("--retry-period: must be positive, e.g. 2s")
    if lease.renew_deadline <= JITTER_FACTOR * lease.retry_period:
        raise ConfigError(
            f"--renew-deadline {lease.renew_deadline:g}s: must be longer than "
            f"{JITTER_FACTOR} x --retry-period ({lease.retry_period:g}s)"
        )
    if lease.duration <= lease.renew_deadline:
        raise ConfigError(
            f"--lease-duration {lease.duration:g}s: must be longer than --renew-deadline "
            f"({lease.renew_deadline:g}s)"
        )
    if lease.duration < 1:
        raise ConfigError("--lease-duration: at least 1s (the Lease counts whole seconds)")
    return lease


def check_rate(rate: float) -> float:
    """`--writes-per-second`: positive, or 0 for no limit."""
    if rate < 0:
        raise ConfigError(f"--writes-per-second {rate:g}: must be positive (or 0: no limit)")
    return rate


def add_cidr_options(parser: argparse.ArgumentParser) -> None:
    """`--pod-locators` and `--node-cidrs`, on `toposdns controller`'s command line."""
    defaults = ControllerConfig(namespace="default")
    parser.add_argument(
        "--pod-locators",
        metavar="|".join(POD_LOCATOR_MODES),
        default=defaults.pod_locators,
        help="which pods get a PodLocator of their own: auto, those whose addresses their "
        "node's locator does not place (outside its pod ranges, or inside another node's); "
        "all; none (default %(default)s)",
    )
    parser.add_argument(
        "--node-cidrs",
        metavar="|".join(NODE_CIDR_MODES),
        default=defaults.node_cidrs,
        help="the pod ranges node locators carry: spec (Node.spec.podCIDRs), learned (aligned "
        "prefixes from where each node's pods are: IPv4 /24 to /26, IPv6 /64 to /120, for "
        "Calico IPAM blocks or AWS VPC CNI prefixes), auto (spec where set, else learned) "
        "(default %(default)s)",
    )


def controller_config(args: argparse.Namespace) -> ControllerConfig:
    """`toposdns controller`'s settings from its parsed command line, every one validated."""
    return ControllerConfig(
        namespace=check_namespace(args.namespace),
        labels=LabelFilter(
            parse_label_keys(args.node_label_keys),
            parse_label_prefixes(args.node_label_prefixes),
        ),
        lease=check_lease(
            LeaseSettings(
                name=args.lease_name,
                duration=_seconds(args.lease_duration, "--lease-duration"),
                renew_deadline=_seconds(args.renew_deadline, "--renew-deadline"),
                retry_period=_seconds(args.retry_period, "--retry-period"),
            )
        ),
        identity=args.identity,
        writes_per_second=check_rate(args.writes_per_second),
        http=address_value(args.http, Origin("--http", args.http)),
        kubeconfig=args.kubeconfig,
        pod_locators=_choice(args.pod_locators, "--pod-locators", POD_LOCATOR_MODES),
        node_cidrs=_choice(args.node_cidrs, "--node-cidrs", NODE_CIDR_MODES),
    )


def _seconds(text: str, flag: str) -> float:
    return duration_value(text, Origin(flag, text))


def _choice(value: str, flag: str, modes: tuple[str, ...]) -> Any:
    return choice(*modes)([value], Origin(flag, value))
