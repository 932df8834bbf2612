"""Static checks of the `Dockerfile`, `requirements.lock` and `.dockerignore` (no container engine
runs here).

The image must be a two-stage build on Debian 12's Python 3.11, both bases pinned by digest: the
builder installs every dependency from the hashed lock file into a virtual environment, then the
project's own wheel, compiled, and gives the venv's interpreter the file capability to bind port
53 (as CoreDNS's image does); the runtime stage is distroless (no shell, pip or apt), copies only
that venv, runs as a numeric non-root user, writes nothing at run time, and starts `toposdns`.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.unit.test_manifests import images, kustomize
from toposdns import REVISION_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BUILDER_BASE = "debian:12-slim"
RUNTIME_BASE = "gcr.io/distroless/python3-debian12:nonroot"
VENV = "/opt/venv"
LOCK = ROOT / "requirements.lock"
#: The venv's interpreter that carries cap_net_bind_service (the ENTRYPOINT's).
CAPABLE = f"{VENV}/bin/python3.11"


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    image: str
    name: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_instructions(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continued instruction are skipped, as Docker does
        if not pending:
            start = number
        pending.append(line[:-1].strip() if line.endswith("\\") else line)
        if not line.endswith("\\"):
            keyword, _, args = " ".join(part for part in pending if part).partition(" ")
            instructions.append(Instruction(keyword.upper(), args.strip(), start))
            pending = []
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def parse_stages(instructions: list[Instruction]) -> list[Stage]:
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            assert not [w for w in words if w.startswith("--")], "no FROM --platform"
            assert len(words) == 3 and words[1].upper() == "AS", f"name every stage: {words}"
            stages.append(Stage(image=words[0], name=words[2]))
        else:
            assert stages or instruction.keyword == "ARG", f"{instruction.keyword} before FROM"
            if stages:
                stages[-1].instructions.append(instruction)
    return stages


def env_values(stage: Stage) -> dict[str, str]:
    values: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for word in shlex.split(instruction.args):
            key, sep, value = word.partition("=")
            assert sep, f"write ENV as KEY=value (line {instruction.line})"
            values[key] = value
    return values


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


INSTRUCTIONS = parse_instructions(DOCKERFILE.read_text())
STAGES = parse_stages(INSTRUCTIONS)
BUILDER = STAGES[0]
RUNTIME = STAGES[-1]


def test_parser_joins_continuations() -> None:
    parsed = parse_instructions(
        "# c\nFROM a AS b\nRUN x \\\n  # note\n && y\nENV A=1 \\\n    B=2\n"
    )
    assert [(i.keyword, i.args) for i in parsed] == [
        ("FROM", "a AS b"),
        ("RUN", "x && y"),
        ("ENV", "A=1 B=2"),
    ]


def test_two_stages_on_bases_pinned_by_digest() -> None:
    assert [stage.name for stage in STAGES] == ["builder", "runtime"]
    # A tag to read, and the digest that decides; never `latest`. Both Debian 12: the venv built
    # with Debian 12's python3 runs on the distroless image's (the same Python 3.11).
    for stage, base in ((BUILDER, BUILDER_BASE), (RUNTIME, RUNTIME_BASE)):
        assert re.fullmatch(re.escape(base) + r"@sha256:[0-9a-f]{64}", stage.image), stage.image
    assert "latest" not in DOCKERFILE.read_text().lower()


def test_no_add() -> None:
    # COPY only: ADD would fetch URLs and unpack archives.
    assert not [i for i in INSTRUCTIONS if i.keyword == "ADD"]


def builder_steps() -> list[str]:
    commands = " && ".join(i.args for i in BUILDER.all("RUN"))
    return [step.strip() for step in commands.split("&&")]


def test_builder_installs_the_locked_dependencies_then_the_wheel_into_a_venv() -> None:
    steps = builder_steps()
    # A copy of the interpreter, not a link to the base's: the capability goes on this file.
    venv = [s for s in steps if s == f"python3 -m venv --copies {VENV}"]
    assert venv, f"create the venv at {VENV} with --copies"
    pip = f"{VENV}/bin/pip"
    locked = [shlex.split(s) for s in steps if s.startswith(f"{pip} install") and "-r" in s]
    assert len(locked) == 1, "the dependencies from the lock file, in one install"
    (lock_install,) = locked
    assert lock_install[lock_install.index("-r") + 1] == LOCK.name
    # Every file checked against the lock's hashes; nothing pip would add unpinned; no sdist
    # built from source in the image.
    assert {"--require-hashes", "--no-deps"} <= set(lock_install)
    assert lock_install[lock_install.index("--only-binary") + 1] == ":all:"
    wheel = [s for s in steps if s.startswith(f"{pip} wheel")]
    assert len(wheel) == 1, "build the project's wheel with pip wheel"
    wheel_args = shlex.split(wheel[0])
    # Offline, with the build tools the lock installed (no unpinned build environment).
    assert {"--no-deps", "--no-build-isolation", "--no-index"} <= set(wheel_args)
    wheel_dir = wheel_args[wheel_args.index("--wheel-dir") + 1]
    installs = [s for s in steps if s.startswith(f"{pip} install") and "-r" not in s]
    assert len(installs) == 1
    install = shlex.split(installs[0])
    assert "--compile" in install, "compile bytecode at build time"
    assert "--no-compile" not in install
    # From the wheel just built, not from the index or the source tree.
    assert {"--no-index", "--no-deps"} <= set(install)
    assert install[install.index("--find-links") + 1] == wheel_dir
    assert "toposdns" in install
    assert "." not in install and "-e" not in install
    # Then pip and the build tools leave the venv: the runtime gets no installer.
    (uninstall,) = [shlex.split(s) for s in steps if s.startswith(f"{pip} uninstall")]
    assert {"pip", "setuptools", "wheel", "--yes"} <= set(uninstall)
    order = [venv[0], " ".join(lock_install), wheel[0], installs[0], " ".join(uninstall)]
    assert [steps.index(s) if s in steps else -1 for s in order] == sorted(
        steps.index(s) if s in steps else -1 for s in order
    )


def test_interpreter_binds_port_53_with_a_file_capability() -> None:
    # As CoreDNS's image: `setcap cap_net_bind_service=+ep` on what the ENTRYPOINT runs, so a
    # non-root user binds :53 where the pod adds NET_BIND_SERVICE (kubeadm) and sets no sysctl.
    steps = builder_steps()
    (setcap,) = [shlex.split(s) for s in steps if s.startswith("setcap ")]
    assert setcap == ["setcap", "cap_net_bind_service=+ep", CAPABLE]
    assert steps.index(" ".join(setcap)) == len(steps) - 1, "after the last change to the venv"
    assert "libcap2-bin" in " ".join(steps), "setcap comes from Debian's libcap2-bin"
    (entrypoint,) = RUNTIME.all("ENTRYPOINT")
    assert exec_form(entrypoint) == [CAPABLE, "-m", "toposdns"]


def locked_requirements() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock: name -> (the line as pip reads it, its hashes)."""
    entries: list[list[str]] = []
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[0].isspace():
            entries[-1].append(line.strip())
        else:
            entries.append([line.strip()])
    locked = {}
    for first, *rest in entries:
        requirement = first.rstrip(" \\")
        hashes = [word for line in rest for word in line.split() if word.startswith("--hash=")]
        locked[canonicalize_name(Requirement(requirement).name)] = (requirement, hashes)
    return locked


def test_lock_file_pins_every_dependency_with_hashes() -> None:
    locked = locked_requirements()
    for requirement, hashes in locked.values():
        (specifier,) = Requirement(requirement).specifier
        assert specifier.operator == "==", f"pin with ==: {requirement}"
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes)
    pinned = {
        name: Version(next(iter(Requirement(r).specifier)).version)
        for name, (r, _) in locked.items()
    }
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    for line in wanted:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{line}: not in {LOCK.name}; run the command in its header"
        assert pinned[name] in requirement.specifier, f"{line}: locked {pinned[name]}"
    text = LOCK.read_text()
    assert "file://" not in text and "--index-url" not in text and "--find-links" not in text


def test_builder_copies_what_the_build_needs() -> None:
    sources = []
    for instruction in BUILDER.all("COPY"):
        words = shlex.split(instruction.args)
        assert not [w for w in words if w.startswith("--from")]
        sources += words[:-1]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "setup.py", pyproject["project"]["readme"], "toposdns", LOCK.name}
    assert needed <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source


def test_runtime_copies_only_the_venv() -> None:
    copies = [shlex.split(i.args) for i in RUNTIME.all("COPY")]
    assert copies == [["--from=builder", VENV, VENV]]
    # Distroless: no shell to RUN anything with, and nothing to install with.
    assert not RUNTIME.all("RUN")


def test_runtime_environment() -> None:
    env = env_values(RUNTIME)
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"
    assert CAPABLE.startswith(env["PATH"].split(":")[0] + "/")
    assert env["PYTHONUNBUFFERED"] == "1"
    # Bytecode comes from the build; nothing is written next to the modules at run time.
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_runtime_passes_the_git_revision_to_build_info() -> None:
    # `--build-arg REVISION=...` reaches the variable build_revision() reads, and the label.
    args = [i.args for i in RUNTIME.all("ARG")]
    assert 'REVISION=""' in args
    assert env_values(RUNTIME)[REVISION_VARIABLE] == "${REVISION}"
    labels = " ".join(i.args for i in RUNTIME.all("LABEL"))
    assert 'org.opencontainers.image.revision="${REVISION}"' in labels


def test_runtime_user_is_numeric_non_root() -> None:
    users = RUNTIME.all("USER")
    assert users and users[-1].args == "65532:65532"
    # Nothing after the last USER runs as root.
    last = RUNTIME.instructions.index(users[-1])
    assert not [i for i in RUNTIME.instructions[last:] if i.keyword == "RUN"]


def test_exposed_ports() -> None:
    exposed = set()
    for instruction in RUNTIME.all("EXPOSE"):
        for port in instruction.args.split():
            number, _, protocol = port.partition("/")
            exposed.add((int(number), protocol or "tcp"))
    # DNS; health, ready and metrics where CoreDNS serves them.
    assert exposed == {(53, "tcp"), (53, "udp"), (8080, "tcp"), (8181, "tcp"), (9153, "tcp")}


def test_entrypoint_exec_form() -> None:
    (entrypoint,) = RUNTIME.all("ENTRYPOINT")
    assert exec_form(entrypoint)[1:] == ["-m", "toposdns"]
    for cmd in RUNTIME.all("CMD"):
        exec_form(cmd)


def test_manifests_run_the_interpreter_without_the_capability() -> None:
    # Their pods drop every capability (port 53 comes from a pod sysctl): a +ep binary would not
    # even start there, so they run the venv's other interpreter.
    for _, item in images(kustomize(ROOT / "manifests")):
        assert item["command"] == [f"{VENV}/bin/python3", "-m", "toposdns"]
        assert item["command"][0] != CAPABLE


def ignore_rules() -> list[tuple[bool, str]]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, line.lstrip("!").strip("/")))
    return rules


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match syntax, plus `**`) as a regular expression."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignored(path: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for negated, pattern in ignore_rules():
        regex = pattern_regex(pattern)
        if any(regex.fullmatch(candidate) for candidate in candidates):
            verdict = not negated
    return verdict


def test_ignore_patterns() -> None:
    assert pattern_regex("*").fullmatch("tests")
    assert not pattern_regex("*").fullmatch("tests/x")
    assert pattern_regex("**/*.py[cod]").fullmatch("a/b/c.pyc")
    assert pattern_regex("**/__pycache__").fullmatch("__pycache__")


@pytest.mark.parametrize(
    "path",
    ["pyproject.toml", "README.md", "toposdns/__init__.py", "toposdns/wire/decode.py"],
)
def test_dockerignore_keeps_the_build_inputs(path: str) -> None:
    assert (ROOT / path).exists()
    assert not ignored(path)


@pytest.mark.parametrize(
    "path",
    [
        ".git/config",
        "tests/unit/test_dockerfile.py",
        "manifests/base/deployment.yaml",
        "bench/run.py",
        "toposdns/__pycache__/cli.cpython-311.pyc",
        ".venv/bin/python",
        "Dockerfile",
        "requirements.in",
    ],
)
def test_dockerignore_drops_the_rest(path: str) -> None:
    assert ignored(path)


def test_dockerignore_keeps_every_copied_source() -> None:
    for stage in STAGES:
        for instruction in stage.all("COPY"):
            words = shlex.split(instruction.args)
            if any(w.startswith("--from") for w in words):
                continue
            for source in words[:-1]:
                assert not ignored(source), f"{source} is copied but .dockerignore drops it"
