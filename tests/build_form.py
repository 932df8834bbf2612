"""Which form of toposdns the tests run: the modules compiled with mypyc, or plain Python.

`python -m pytest` imports `toposdns` from the source tree, so the compiled form is what
`pip install -e .` (or `python setup.py build_ext --inplace`) built there: the .so files next
to the .py files. TOPOSDNS_COMPILE, the variable setup.py reads, says what the suite expects:
`required` (CI: every listed module compiled), `no` (plain Python: `python -m tests.plain`),
or unset/`auto` (either, but all or none). In every case a compiled module older than its
source is an error: it would test code that is no longer there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: setup.py's group_name: mypyc's runtime library is `toposdns__mypyc`.
GROUP = "toposdns"


def compiled_modules() -> list[str]:
    """The modules pyproject.toml lists for mypyc, as dotted names."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["toposdns"]["compiled"]
    return [path.removesuffix(".py").replace("/", ".") for path in listed]


def origins() -> dict[str, Path]:
    """Each listed module -> the file it is imported from."""
    found = {}
    for name in compiled_modules():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        found[name] = Path(spec.origin)
    return found


def is_compiled(origin: Path) -> bool:
    return origin.suffix in {".so", ".pyd"}


def form() -> str:
    """`compiled` or `plain Python`, as the header of a test run shows it."""
    loaded = origins().values()
    compiled = sum(map(is_compiled, loaded))
    return f"compiled ({compiled} modules)" if compiled else "plain Python"


def problems() -> list[str]:
    """What is wrong with the form the tests would run, against what TOPOSDNS_COMPILE expects."""
    rebuild = "rebuild with `python setup.py build_ext --inplace` (or delete the .so files)"
    expected = os.environ.get("TOPOSDNS_COMPILE", "auto")
    found = origins()
    compiled = [name for name, origin in found.items() if is_compiled(origin)]
    plain = [name for name, origin in found.items() if not is_compiled(origin)]
    wrong = []
    # The code is in the group's runtime library (each module's own .so only imports it, and
    # setuptools leaves those alone when they did not change): sources newer than it are stale.
    libraries = list(ROOT.glob(f"{GROUP}__mypyc.*.so"))
    for name in compiled:
        source = found[name].parent / (name.rpartition(".")[2] + ".py")
        if not libraries or source.stat().st_mtime > libraries[0].stat().st_mtime:
            wrong.append(f"{name}: {source.name} is newer than its compiled form: {rebuild}")
    listed = {ROOT.joinpath(*name.split(".")) for name in found}
    for stray in sorted((ROOT / "toposdns").rglob("*.so")):
        module = stray.parent / stray.name.partition(".")[0]
        if is_mypyc_output(stray.parent, stray.name) and module not in listed:
            wrong.append(f"{stray} is compiled but not listed in pyproject.toml: delete it")
    if expected == "required" and plain:
        wrong.append(f"TOPOSDNS_COMPILE=required, but plain Python: {', '.join(plain)}")
    elif expected == "no" and compiled:
        wrong.append(f"TOPOSDNS_COMPILE=no, but compiled: {', '.join(compiled)}")
    elif compiled and plain:
        wrong.append(f"only some modules compiled (plain: {', '.join(plain)}): {rebuild}")
    return wrong


def is_mypyc_output(directory: Path, name: str) -> bool:
    """A module mypyc built (it has a .py of the same name next to it), or its runtime library.
    The C extension (serve/datagrams, from a .c file) is not one."""
    if not name.endswith((".so", ".pyd")):
        return False
    module = name.partition(".")[0]
    return module == f"{GROUP}__mypyc" or (directory / f"{module}.py").exists()


#: What a plain copy of the tree leaves out besides mypyc's output: caches, environments.
NOT_COPIED = shutil.ignore_patterns(
    "__pycache__", ".git", ".venv", "build", "*.egg-info", ".*_cache", ".hypo*"
)


def ignored(directory: str, names: list[str]) -> set[str]:
    """shutil.copytree's `ignore`: mypyc's output and NOT_COPIED."""
    mypyc = {name for name in names if is_mypyc_output(Path(directory), name)}
    return mypyc | set(NOT_COPIED(directory, names))


def copy_plain(destination: Path, what: str = ".") -> Path:
    """A copy of the tree (or of `what` in it) without mypyc's modules: plain Python (the C
    extension stays, so that only mypyc differs)."""
    shutil.copytree(
        ROOT / what, destination / what, ignore=ignored, symlinks=True, dirs_exist_ok=True
    )
    return destination
