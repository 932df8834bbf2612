"""The default Corefiles of ten Kubernetes distributions (tests/corefiles/), each read as
`toposdns -conf` reads it: with its ConfigMaps' files, with the optional coredns-custom
ConfigMap absent, and every placeholder one tests/distributions.py knows and README.md names."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributions import (
    CORE_FILES,
    DISTRIBUTIONS,
    PLACEHOLDER,
    PLACEHOLDERS,
    custom_files,
    fill,
    render,
)
from toposdns.config import ServeConfig
from toposdns.corefile import read_corefile
from toposdns.serve.upstream import Upstream

SNAPSHOT = Path(__file__).parents[1] / "integration" / "snapshot.yaml"
CLUSTER_ZONES = (("cluster", "local"), ("in-addr", "arpa"), ("ip6", "arpa"))
#: The distributions whose Deployment mounts a coredns-custom ConfigMap at custom/.
WITH_CUSTOM = ("k3s", "aks")


def values(directory: Path) -> dict[str, str]:
    return {
        "DNS_PORT": "5353",
        "HEALTH": "127.0.0.1:18080",
        "READY": "127.0.0.1:18181",
        "METRICS": "127.0.0.1:19153",
        "UPSTREAM": "127.0.0.1:5300",
        "STUB_UPSTREAM": "127.0.0.1:5301",
        "SNAPSHOT": str(SNAPSHOT),
        "DIR": str(directory),
    }


def read(name: str, directory: Path, custom: bool = True) -> ServeConfig:
    return read_corefile(render(name, directory, values(directory), custom)).done()


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_every_distributions_corefile_is_accepted(name: str, tmp_path: Path) -> None:
    config = read(name, tmp_path)
    assert (config.bind.host, config.bind.port) == ("127.0.0.1", 5353)
    assert config.kubernetes.zones == CLUSTER_ZONES
    assert config.kubernetes.fallthrough == (("in-addr", "arpa"), ("ip6", "arpa"))
    assert config.kubernetes.pods == "insecure"
    assert config.snapshot.path == SNAPSHOT
    assert config.upstreams == (Upstream("127.0.0.1", 5300),)
    assert config.health.address == ("127.0.0.1", 18080)
    assert config.ready.address == ("127.0.0.1", 18181)
    assert config.prometheus.address == ("127.0.0.1", 19153)
    assert config.reload.enabled and config.loadbalance.round_robin
    stubs = [block for block in config.blocks if block.zones == (("example", "consul"),)]
    if name in WITH_CUSTOM:
        # custom/consul.server: its own block, with its own upstream and cache.
        assert len(config.blocks) == 1 and len(stubs) == 1
        assert stubs[0].forward.upstreams == (Upstream("127.0.0.1", 5301),)
        assert stubs[0].cache.success.max_ttl == 30
    else:
        assert config.blocks == ()


@pytest.mark.parametrize("name", WITH_CUSTOM)
def test_without_the_coredns_custom_configmap(name: str, tmp_path: Path) -> None:
    # The ConfigMap is optional: its imports then match no file, and CoreDNS starts.
    config = read(name, tmp_path, custom=False)
    assert config.blocks == () and not list((tmp_path / "custom").iterdir())
    assert config.kubernetes.zones == CLUSTER_ZONES


def test_the_custom_folders_hold_one_override_and_one_server_each() -> None:
    for name in DISTRIBUTIONS:
        suffixes = sorted(path.suffix for path in custom_files(name))
        assert suffixes == ([".override", ".server"] if name in WITH_CUSTOM else []), name


def test_every_distribution_has_its_directory_and_its_readme_section() -> None:
    assert sorted(path.name for path in CORE_FILES.iterdir() if path.is_dir()) == sorted(
        DISTRIBUTIONS
    )
    readme = (CORE_FILES / "README.md").read_text()
    for name in DISTRIBUTIONS:
        assert (CORE_FILES / name / "Corefile").is_file(), name
        assert f"`{name}/`" in readme, f"README.md says nothing of {name}/"


def test_every_placeholder_is_known_and_described() -> None:
    readme = (CORE_FILES / "README.md").read_text()
    used = {
        match.group(1)
        for path in CORE_FILES.rglob("*")
        if path.is_file() and path.name != "README.md"
        for match in PLACEHOLDER.finditer(path.read_text())
    }
    assert used == set(PLACEHOLDERS)
    for key in PLACEHOLDERS:
        assert f"`@{key}@`" in readme, key


def test_a_placeholder_without_a_value_is_refused() -> None:
    with pytest.raises(ValueError, match=r"k3s/Corefile: no value for placeholder @DIR@"):
        fill("hosts @DIR@/NodeHosts", {}, "k3s/Corefile")
    assert fill("forward . @UPSTREAM@", {"UPSTREAM": "127.0.0.1:53"}, "x") == (
        "forward . 127.0.0.1:53"
    )
