"""Static checks of the `Dockerfile` and `.dockerignore` (no container engine is needed).

The image must be a two-stage build on python:3.11-slim: the builder turns the project into a
wheel and installs it, compiled, into a virtual environment; the runtime stage copies only that
venv, runs as a numeric non-root user, writes nothing at run time, and starts `toposdns`.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
BASE = "python:3.11-slim"
VENV = "/opt/venv"


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


def test_multi_stage_on_pinned_slim_python() -> None:
    assert len(STAGES) >= 2
    assert [stage.name for stage in STAGES] == ["builder", "runtime"]
    for stage in STAGES:
        # A tag always, optionally a digest on top; never an implicit or explicit `latest`.
        assert re.fullmatch(re.escape(BASE) + r"(@sha256:[0-9a-f]{64})?", stage.image), stage.image
    assert "latest" not in DOCKERFILE.read_text().lower()


def test_no_add() -> None:
    # COPY only: ADD would fetch URLs and unpack archives.
    assert not [i for i in INSTRUCTIONS if i.keyword == "ADD"]


def test_builder_installs_the_wheel_into_a_venv() -> None:
    commands = " && ".join(i.args for i in BUILDER.all("RUN"))
    steps = [step.strip() for step in commands.split("&&")]
    wheel = [s for s in steps if re.match(r"pip wheel\b", s) or "-m pip wheel" in s]
    assert len(wheel) == 1, "build the project's wheel with pip wheel"
    wheel_dir = re.search(r"--wheel-dir[ =](\S+)", wheel[0])
    assert wheel_dir, "pip wheel --wheel-dir DIR"
    venv = [s for s in steps if re.fullmatch(r"python3? -m venv " + re.escape(VENV), s)]
    assert venv, f"create the venv at {VENV}"
    installs = [s for s in steps if s.startswith(f"{VENV}/bin/pip install")]
    assert len(installs) == 1
    install = shlex.split(installs[0])
    assert "--compile" in install, "compile bytecode at build time"
    assert "--no-compile" not in install
    # From the wheels just built, not from the index or the source tree.
    assert "--no-index" in install
    find_links = [install[i + 1] for i, w in enumerate(install) if w == "--find-links"]
    find_links += [w.partition("=")[2] for w in install if w.startswith("--find-links=")]
    assert find_links == [wheel_dir[1]]
    assert "toposdns" in install
    assert "." not in install and "-e" not in install
    assert steps.index(wheel[0]) < steps.index(venv[0]) < steps.index(installs[0])


def test_builder_copies_what_the_build_needs() -> None:
    sources = []
    for instruction in BUILDER.all("COPY"):
        words = shlex.split(instruction.args)
        assert not [w for w in words if w.startswith("--from")]
        sources += words[:-1]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"], "toposdns"}
    assert needed <= set(sources)
    for source in sources:
        assert (ROOT / source).exists(), source


def test_runtime_copies_only_the_venv() -> None:
    copies = [shlex.split(i.args) for i in RUNTIME.all("COPY")]
    assert copies == [["--from=builder", VENV, VENV]]
    runs = " ".join(i.args for i in RUNTIME.all("RUN"))
    assert not re.search(r"\bpip\b|apt-get|curl|wget", runs), "no installs in the runtime stage"


def test_runtime_environment() -> None:
    env = env_values(RUNTIME)
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"
    assert env["PYTHONUNBUFFERED"] == "1"
    # Bytecode comes from the build; nothing is written next to the modules at run time.
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


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
    assert exposed == {(53, "tcp"), (53, "udp"), (9153, "tcp")}


def test_entrypoint_exec_form() -> None:
    (entrypoint,) = RUNTIME.all("ENTRYPOINT")
    assert exec_form(entrypoint) == ["toposdns"]
    for cmd in RUNTIME.all("CMD"):
        exec_form(cmd)


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
