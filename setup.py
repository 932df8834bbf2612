"""Build toposdns: its C extension and its per-query modules compiled with mypyc, or plain Python
where that fails.

- `toposdns/serve/datagrams.c` (recvmmsg and sendmmsg for the UDP frontend) is the one module
  written in C. Without it (no C compiler, no Python headers, not Linux) the server answers UDP
  one datagram per system call (`--udp-batch` says so when it starts).
- The modules every query runs through (and the converter every listed object runs through)
  are compiled with mypyc: those pyproject.toml lists,
  `[tool.toposdns] compiled` (the one list; docs/architecture.md, "Compiled modules", says why
  these). Each stays importable as plain Python: the wheel carries the .py files too.

A build that cannot compile either warns in one line each and installs without it.
TOPOSDNS_COMPILE chooses for mypyc: `auto` (the default: compile, else fall back with the
warning), `required` (the image's build and CI: fail rather than fall back), `no` (plain
Python, no warning). For a work tree run in place: `python setup.py build_ext --inplace`.
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
#: The extension group mypyc builds: one shared runtime library, a small module per file.
GROUP = "toposdns"

DATAGRAMS = Extension(
    "toposdns.serve.datagrams",
    ["toposdns/serve/datagrams.c"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=c11", "-D_GNU_SOURCE"],
)


def compiled_paths() -> list[str]:
    """The source files pyproject.toml lists for mypyc, relative to this directory."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        listed: list[str] = tomllib.load(file)["tool"]["toposdns"]["compiled"]
    return listed


def first_line(error: BaseException) -> str:
    """The failure in a few words: the compiler's command line is long, its status is not."""
    text = str(error).strip()
    command = re.search(r"Command '\['([^']*)'.*returned non-zero exit status (\d+)", text, re.S)
    if command:
        return f"{command[1]} exited with status {command[2]}"
    lines = text.splitlines()
    return f"{type(error).__name__}: {lines[0][:160] if lines else ''}".rstrip(": ")


def warn(line: str) -> None:
    print(f"WARNING: toposdns: {line}", file=sys.stderr, flush=True)


def mypyc_failed(what: str) -> None:
    """The one warning line of a build that installs plain Python (or, if required, the error)."""
    if MODE == "required":
        sys.exit(f"toposdns: compiling with mypyc failed ({what}) and TOPOSDNS_COMPILE=required")
    warn(
        f"compiling with mypyc failed ({what}); installing plain Python, which runs the same "
        "but slower"
    )


def mypyc_extensions() -> list[Any]:
    """mypyc's extension modules for the listed files, or none where it cannot make them."""
    if MODE == "no":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as error:
        mypyc_failed(f"mypyc is not installed: {error}")
        return []
    try:
        # mypyc type-checks first, where pip builds: an isolated environment has none of the
        # dependencies or stubs. The code is mypy --strict already (CI checks that); here a
        # missing library is only Any.
        options = ["--config-file", os.devnull, "--ignore-missing-imports"]
        return list(mypycify([*options, *compiled_paths()], group_name=GROUP))
    except (Exception, SystemExit) as error:
        mypyc_failed(first_line(error))
        return []


def is_mypyc(extension: Any) -> bool:
    return extension is not DATAGRAMS


class BuildOrFallBack(build_ext):  # type: ignore[misc]
    """build_ext that runs mypyc only when it builds (not for metadata: it takes a while), and
    turns a failure to compile into an install without what failed."""

    def finalize_options(self) -> None:
        datagrams = [DATAGRAMS] if sys.platform.startswith("linux") else []
        self.distribution.ext_modules = datagrams + mypyc_extensions()
        super().finalize_options()

    def build_extensions(self) -> None:
        self.check_extensions_list(self.extensions)
        for extension in [e for e in self.extensions if not is_mypyc(e)]:
            try:
                self.build_extension(extension)
            except Exception as error:  # CompileError, LinkError, a missing compiler: alike
                self.extensions.remove(extension)
                warn(
                    f"building the C extension failed ({first_line(error)}); installing "
                    "without it: UDP is then answered one datagram per system call"
                )
        compiled = [e for e in self.extensions if is_mypyc(e)]
        try:
            for extension in compiled:
                self.build_extension(extension)
        except Exception as error:
            # All or nothing: the modules share mypyc's runtime library, and a wheel with some
            # of them compiled would be neither build.
            for extension in compiled:
                Path(self.get_ext_fullpath(extension.name)).unlink(missing_ok=True)
            self.extensions = [e for e in self.extensions if not is_mypyc(e)]
            mypyc_failed(first_line(error))


MODE = os.environ.get("TOPOSDNS_COMPILE", "auto")
if MODE not in MODES:
    sys.exit(f"toposdns: TOPOSDNS_COMPILE={MODE!r}: use one of {', '.join(MODES)}")

# A stand-in until build_ext runs (and mypyc with it): it marks the wheel as built for this
# platform. build_ext replaces the list.
setup(ext_modules=[DATAGRAMS], cmdclass={"build_ext": BuildOrFallBack})
