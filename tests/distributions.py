"""The default Corefiles of Kubernetes distributions, kept under tests/corefiles/ as each one's
ConfigMaps mount them (tests/corefiles/README.md says where each came from), and filled in for
a loopback test.

A file differs from what its distribution ships only by `bind 127.0.0.1`, a `toposdns { snapshot
… }` block appended to its kubernetes server block, and placeholders `@NAME@` where a test must
choose: the DNS port, the HTTP addresses, the upstreams, the snapshot and the directory the
ConfigMap is mounted at. `render` copies a distribution's directory with every placeholder
filled, and refuses to leave one unfilled.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

CORE_FILES = Path(__file__).parent / "corefiles"
#: Every distribution, by its directory under tests/corefiles/.
DISTRIBUTIONS = (
    "kubeadm",
    "k3s",
    "rke2",
    "eks",
    "aks",
    "microk8s",
    "talos",
    "k0s",
    "kubespray",
    "coredns-helm",
)
#: The placeholders a test fills, and what each stands for.
PLACEHOLDERS = {
    "DNS_PORT": "the DNS port of every server block (53 as shipped)",
    "HEALTH": "health's address (:8080 as shipped)",
    "READY": "ready's address (:8181 as shipped)",
    "METRICS": "prometheus's address (:9153 as shipped)",
    "UPSTREAM": "the kubernetes block's forward target (/etc/resolv.conf as shipped)",
    "STUB_UPSTREAM": "the upstream of the example stub domain in custom/*.server",
    "SNAPSHOT": "the snapshot file toposdns serves instead of the API",
    "DIR": "the directory the ConfigMap is mounted at (/etc/coredns as shipped)",
}
PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


def custom_files(name: str) -> list[Path]:
    """The example files of a distribution's `custom/` folder (its coredns-custom ConfigMap)."""
    return sorted((CORE_FILES / name / "custom").glob("*"))


def render(name: str, target: Path, values: Mapping[str, str], custom: bool = True) -> Path:
    """Distribution `name`'s files copied into `target` (its ConfigMap's mount) with every
    placeholder filled from `values`; the Corefile's path. `custom=False` leaves `custom/`
    empty, as an optional coredns-custom ConfigMap that does not exist is mounted."""
    source = CORE_FILES / name
    if not source.is_dir():
        raise ValueError(f"no distribution {name!r} under {CORE_FILES}")
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        out = target / relative
        if path.is_dir():
            out.mkdir(parents=True, exist_ok=True)  # custom/ too: mounted even when empty
            continue
        if relative.parts[0] == "custom" and not custom:
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(fill(path.read_text(), values, f"{name}/{relative}"))
    return target / "Corefile"


def fill(text: str, values: Mapping[str, str], where: str) -> str:
    """`text` with each `@NAME@` replaced by values[NAME]; ValueError naming `where` and the
    placeholder when a value is missing."""

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise ValueError(f"{where}: no value for placeholder @{key}@")
        return values[key]

    return PLACEHOLDER.sub(value, text)
