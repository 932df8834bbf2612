"""Build toposdns: its C extension, or plain Python if that cannot be compiled.

`toposdns/serve/datagrams.c` (recvmmsg and sendmmsg for the UDP frontend) is the one module
written in C. A build that cannot compile it (no C compiler, no Python headers, not Linux)
warns in one line and installs without it: the server then answers UDP one datagram per system
call (`--udp-batch` says so when it starts). For a work tree run in place:
`python setup.py build_ext --inplace`.
"""

from __future__ import annotations

import sys
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

DATAGRAMS = Extension(
    "toposdns.serve.datagrams",
    ["toposdns/serve/datagrams.c"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=c11", "-D_GNU_SOURCE"],
)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


class BuildOrFallBack(build_ext):  # type: ignore[misc]
    """build_ext that turns a failure to compile the C into a plain-Python install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # CompileError, LinkError, a missing compiler: all the same
            print(
                f"WARNING: toposdns: building the C extension failed ({first_line(error)}); "
                "installing without it: UDP is then answered one datagram per system call",
                file=sys.stderr,
                flush=True,
            )


def extensions() -> list[Any]:
    """The C extensions this platform can have (recvmmsg and sendmmsg are Linux's)."""
    return [DATAGRAMS] if sys.platform.startswith("linux") else []


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildOrFallBack})
