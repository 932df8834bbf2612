"""Build toposdns: the per-query modules compiled with mypyc, or plain Python if that fails.

The modules compiled are listed in pyproject.toml, `[tool.toposdns] compiled` (the one list;
docs/architecture.md, "Compiled modules", says why these). Every one of them stays importable
as plain Python: the wheel carries the .py files too, and a build that cannot compile (no C
compiler, no Python headers, mypyc missing) warns in one line and installs them uncompiled.

TOPOSDNS_COMPILE chooses: `auto` (the default: compile, else fall back with the warning),
`required` (the image's build: fail rather than fall back), `no` (plain Python, no warning).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MODES = ("auto", "required", "no")


def compiled_paths() -> list[str]:
    """The source files pyproject.toml lists for mypyc, relative to this directory."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        listed: list[str] = tomllib.load(file)["tool"]["toposdns"]["compiled"]
    return listed


def fall_back(what: str) -> None:
    """The one warning line of a build that installs plain Python (or, if required, the error)."""
    if MODE == "required":
        sys.exit(f"toposdns: compiling with mypyc failed ({what}) and TOPOSDNS_COMPILE=required")
    print(
        f"WARNING: toposdns: compiling with mypyc failed ({what}); "
        "installing plain Python, which runs the same but slower",
        file=sys.stderr,
        flush=True,
    )


class BuildOrFallBack(build_ext):  # type: ignore[misc]
    """build_ext that runs mypyc only when it builds (not for metadata: it takes a while), and
    turns a failure to compile the C into a plain-Python install."""

    def finalize_options(self) -> None:
        self.distribution.ext_modules = extensions()
        super().finalize_options()

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # CompileError, LinkError, a missing compiler: all the same
            # All or nothing: the modules share mypyc's runtime library, and a wheel with some
            # of them compiled would be neither build.
            for extension in self.extensions:
                Path(self.get_ext_fullpath(extension.name)).unlink(missing_ok=True)
            fall_back(first_line(error))


def first_line(error: BaseException) -> str:
    """The failure in a few words: the compiler's command line is long, its status is not."""
    text = str(error).strip()
    command = re.search(r"Command '\['([^']*)'.*returned non-zero exit status (\d+)", text, re.S)
    if command:
        return f"{command[1]} exited with status {command[2]}"
    lines = text.splitlines()
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}".rstrip(": ")


def extensions() -> list[Any]:
    """mypyc's extension modules for the listed files, or none where it cannot make them."""
    if MODE == "no":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as error:
        fall_back(f"mypyc is not installed: {error}")
        return []
    try:
        # One group, one shared runtime library (toposdns__mypyc). mypyc type-checks first, where
        # pip builds: an isolated environment has none of the dependencies or stubs. The code
        # is mypy --strict already (CI checks that); here a missing library is only Any.
        options = ["--config-file", os.devnull, "--ignore-missing-imports"]
        return list(mypycify([*options, *compiled_paths()], group_name="toposdns"))
    except (Exception, SystemExit) as error:
        fall_back(first_line(error))
        return []


MODE = os.environ.get("TOPOSDNS_COMPILE", "auto")
if MODE not in MODES:
    sys.exit(f"toposdns: TOPOSDNS_COMPILE={MODE!r}: use one of {', '.join(MODES)}")

# A stand-in until build_ext runs mypyc: it marks the wheel as built for this platform.
STAND_IN = [] if MODE == "no" else [Extension("toposdns__mypyc", sources=[])]
setup(ext_modules=STAND_IN, cmdclass={"build_ext": BuildOrFallBack})
