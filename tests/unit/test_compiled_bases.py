"""The compiled modules' classes derive only from the standard library and toposdns.

mypyc type-checks in pip's isolated build environment, where the dependencies are not
installed: a base class from one of them is `Any` there, and the class it compiles then fails
at run time (`SystemError` on a missing attribute, or worse), though a build in a full
environment works. This checks the sources, so it holds for either build.
"""

from __future__ import annotations

import ast
import sys

import pytest

from tests.build_form import ROOT, compiled_modules

STANDARD = sys.stdlib_module_names | {"builtins"}


def imported_from(tree: ast.Module) -> dict[str, str]:
    """Each name the module imports -> the top-level package it comes from."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = node.module.split(".")[0]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = alias.name.split(".")[0]
    return names


@pytest.mark.parametrize("module", compiled_modules())
def test_bases_come_from_the_standard_library_or_toposdns(module: str) -> None:
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    origins = imported_from(tree)
    foreign = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                root = base.value if isinstance(base, ast.Subscript) else base
                while isinstance(root, ast.Attribute):
                    root = root.value
                package = origins.get(root.id, "") if isinstance(root, ast.Name) else ""
                if package and package not in STANDARD and package != "toposdns":
                    foreign.append(f"{node.name}({ast.unparse(base)}) from {package}")
    assert foreign == []
