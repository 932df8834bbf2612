"""Imports go one way: each module imports only from its own layer or those below it, no two
modules import each other (directly or round a longer circle), and the pure layers stay clear
of the Kubernetes client and the network libraries."""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "toposdns"

#: The layers, lowest first; a module is in the first layer one of whose patterns it matches.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "__init__.py",
            "*/__init__.py",
            "logs.py",
            "metrics.py",
            "lifecycle.py",
            "options.py",
            "wire/codes.py",
            "kube/names.py",
            "kube/resources.py",
            "workers/cpus.py",
            "workers/exposition.py",
        ),
    ),
    ("wire", ("wire/*.py",)),
    ("store", ("kube/client.py", "store/*.py")),
    ("resolve", ("resolve/*.py",)),
    ("source", ("source/*.py",)),
    ("explain", ("explain.py",)),
    ("serve", ("serve/*.py",)),
    ("reload", ("reload.py",)),
    (
        "assembly",
        (
            "config.py",
            "corefile.py",
            "open_files.py",
            "server.py",
            "workers/messages.py",
            "controller/*",
        ),
    ),
    ("processes", ("workers/worker.py", "workers/supervisor.py")),
    ("command line", ("cli.py", "__main__.py")),
]
#: What the pure layers must never import, however deep (prefixes of module names).
FORBIDDEN = {
    "store/*.py": ("kubernetes", "aiohttp", "toposdns.kube.client"),
    "resolve/*.py": ("kubernetes", "aiohttp", "asyncio"),
    "wire/*.py": ("kubernetes", "aiohttp", "asyncio"),
    "kube/names.py": ("toposdns.", "kubernetes", "aiohttp"),
    "kube/resources.py": ("toposdns.", "kubernetes", "aiohttp"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            # `from toposdns import cli` imports the module toposdns.cli
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def own_imports(path: Path) -> set[str]:
    """The package's modules a file imports."""
    return {name for name in imported(path) if name in MODULES} - {module_name(path)}


def layer_of(path: Path) -> int:
    relative = str(path.relative_to(PACKAGE))
    for rank, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch(relative, pattern) for pattern in patterns):
            return rank
    raise AssertionError(f"{relative} is in no layer: add it to LAYERS")


def test_every_module_is_in_a_layer() -> None:
    for path in MODULES.values():
        layer_of(path)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_import_up_the_layers(name: str) -> None:
    path = MODULES[name]
    rank = layer_of(path)
    wrong = [
        f"{name} ({LAYERS[rank][0]}) imports {other} ({LAYERS[layer_of(MODULES[other])][0]})"
        for other in sorted(own_imports(path))
        if layer_of(MODULES[other]) > rank
    ]
    assert wrong == []


def test_no_import_circles() -> None:
    graph = {name: own_imports(path) for name, path in MODULES.items()}
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circles.append(trail[trail.index(name) :] + [name])
            return
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
    assert circles == []


@pytest.mark.parametrize("pattern", FORBIDDEN)
def test_pure_layers_keep_clear_of_the_client_and_the_network(pattern: str) -> None:
    files = sorted(PACKAGE.glob(pattern))
    assert files, f"no module matches {pattern}"
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in sorted(imported(path))
        if name.startswith(FORBIDDEN[pattern])
    ]
    assert wrong == []
