"""setup.py without a working C compiler: one warning line per part, and plain Python installed.

The build runs in a copy of the tree with the mypyc list cut to one small module (the type
check of the whole list takes a minute), and with CC=false: a compiler that fails on every file,
as a machine without gcc or without the Python headers does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.build_form import ROOT

ONE_MODULE = 'compiled = ["toposdns/wire/codes.py"]'


def build(tree: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree,
        env={**os.environ, "CC": "false", "TOPOSDNS_COMPILE": "auto", **environment},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("setup.py", "README.md"):
        (tmp_path / name).write_text((ROOT / name).read_text())
    pyproject = (ROOT / "pyproject.toml").read_text()
    listed = re.sub(r"compiled = \[.*?\]", ONE_MODULE, pyproject, count=1, flags=re.S)
    assert ONE_MODULE in listed
    (tmp_path / "pyproject.toml").write_text(listed)
    for source in (ROOT / "toposdns").rglob("*"):
        if source.suffix in {".py", ".c", ".pyi", ".typed"}:
            target = tmp_path / source.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return tmp_path


def test_no_compiler_installs_plain_python_with_one_warning_each(tree: Path) -> None:
    done = build(tree)
    assert done.returncode == 0, done.stderr[-2000:]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING: toposdns")]
    assert warnings == [
        "WARNING: toposdns: building the C extension failed (false exited with status 1); "
        "installing without it: UDP is then answered one datagram per system call",
        "WARNING: toposdns: compiling with mypyc failed (false exited with status 1); "
        "installing plain Python, which runs the same but slower",
    ]
    assert not list(tree.rglob("*.so"))
    imported = subprocess.run(
        [sys.executable, "-c", "import toposdns.wire.codes as m; print(m.__file__)"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == str(tree / "toposdns" / "wire" / "codes.py")


def test_a_required_build_fails_instead(tree: Path) -> None:
    done = build(tree, TOPOSDNS_COMPILE="required")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "toposdns: compiling with mypyc failed (false exited with status 1) "
        "and TOPOSDNS_COMPILE=required"
    )
    assert not list(tree.rglob("*__mypyc*.so"))
