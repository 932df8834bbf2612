"""The README's two commands, as a newcomer on stock Debian runs them.

The first command installs toposdns and serves the bundled example; the second installs what the
tests need and runs them, and `.ci/run` runs it verbatim. Debian's own `python3` is externally
managed (PEP 668): a `pip install` outside a virtual environment is refused, so both commands
make one. The slow test here runs the first command's install step in a fresh copy of the
repository with Debian's `/usr/bin/python3` first on `PATH` (about a minute: `-m "not install"`
leaves it out while developing).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from toposdns import __version__

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3")


def readme_commands() -> list[str]:
    """The one-line `sh` blocks of the README that start with apt-get: try it, then test it."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [block.strip() for block in blocks if block.startswith("apt-get ")]


def steps(command: str) -> list[str]:
    return [step.strip() for step in command.split(" && ")]


def test_readme_has_the_two_commands() -> None:
    try_it, test_it = readme_commands()
    assert steps(try_it)[-1].startswith("toposdns serve --snapshot examples/cluster.yaml ")
    assert steps(test_it)[-1] == "python -m pytest"
    for command in (try_it, test_it):
        install = steps(command)
        # Debian's python3 needs python3-venv for `-m venv`; both commands install into .venv.
        assert "python3-venv" in install[1].split()
        assert install[2:4] == ["python3 -m venv .venv", ". .venv/bin/activate"]
        assert install[4].startswith("pip install ")
        assert not [step for step in install if step.startswith(("sudo pip", "pip3 install"))]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    test_it = readme_commands()[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    runs = [line for line in ci if line.startswith(test_it)]
    assert runs == [f"{test_it} || status=$?"], "keep .ci/run's test line equal to the README's"
    # The linters run after it, from the virtual environment it activated.
    after = ci[ci.index(runs[0]) :]
    assert {"mypy", "ruff check toposdns tests bench"} <= set(after)


def fresh_copy(destination: Path) -> None:
    """The files a clone would have, as they are in this tree now."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, tracked):
        source = ROOT / os.fsdecode(name)
        if source.is_file():
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def debian_python_reason() -> str | None:
    if not DEBIAN_PYTHON.exists():
        return "no Debian python3 at /usr/bin/python3"
    probe = subprocess.run(
        [DEBIAN_PYTHON, "-c", "import sys, venv, ensurepip; print(sys.version_info >= (3, 11))"],
        capture_output=True,
        text=True,
    )
    if probe.stdout.strip() != "True":
        return "/usr/bin/python3 is older than 3.11 or lacks venv (apt-get install python3-venv)"
    return None


@pytest.mark.install
@pytest.mark.timeout(600)
def test_first_command_installs_with_debians_python(tmp_path: Path) -> None:
    reason = debian_python_reason()
    if reason:
        pytest.skip(reason)
    clone = tmp_path / "toposdns"
    fresh_copy(clone)
    install = steps(readme_commands()[0])
    # apt-get has run for this suite already; the rest is the install, up to serving.
    assert install[0].startswith("apt-get update") and install[1].startswith("apt-get install")
    assert install[-1].startswith("toposdns serve")
    environment = {
        key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL"))
    }
    # Debian's interpreter first: whatever python3 a developer has (pyenv, this suite's venv)
    # comes after it, as on a stock machine.
    environment["PATH"] = os.pathsep.join(["/usr/bin", "/bin", environment.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-c", " && ".join(install[2:-1])],
        cwd=clone,
        env=environment,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = (clone / ".venv" / "pyvenv.cfg").read_text()
    assert re.search(r"^home = /usr/bin$", config, re.M), config
    version = subprocess.run(
        [clone / ".venv" / "bin" / "toposdns", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == f"toposdns {__version__}"
    # With the README's packages the C extension is built (else a warning, and no batching).
    subprocess.run(
        [clone / ".venv" / "bin" / "python", "-c", "import toposdns.serve.datagrams"],
        cwd=tmp_path,
        check=True,
    )
    # The installed package is the copy's, not this tree's (nothing leaks in from sys.path).
    where = subprocess.run(
        [clone / ".venv" / "bin" / "python", "-c", "import toposdns; print(toposdns.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(clone / ".venv" / "lib")), where.stdout
