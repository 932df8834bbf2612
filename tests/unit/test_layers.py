"""The store and the pure Kubernetes rules import nothing from the layers above them, nor the
Kubernetes client: they stay importable (and testable) without a cluster in sight."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "toposdns"
#: Module files, and the imports each must not make (prefixes of module names).
RULES = {
    "store/*.py": (
        "toposdns.source",
        "toposdns.controller",
        "toposdns.serve",
        "toposdns.kube.client",
        "kubernetes",
        "aiohttp",
    ),
    "kube/names.py": ("toposdns.", "kubernetes", "aiohttp"),
    "kube/resources.py": ("toposdns.", "kubernetes", "aiohttp"),
}


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("pattern", RULES)
def test_no_import_up_the_layers(pattern: str) -> None:
    files = sorted(PACKAGE.glob(pattern))
    assert files, f"no module matches {pattern}"
    wrong = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in sorted(imported(path))
        if name.startswith(RULES[pattern])
    ]
    assert wrong == []
