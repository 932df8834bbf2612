"""One version everywhere, and the workflow that releases it.

`toposdns --version`, the package, the newest dated CHANGELOG section, the image's label and the
image tag of every workload `kubectl kustomize` renders from `manifests/` must name the same
release; the GitHub Actions workflow must pass actionlint, test every push, and on a tag check the
tag against the package and build, scan and push the multi-arch image.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_manifests import MANIFESTS, images, kustomize
from toposdns import __version__
from toposdns.cli import main

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
REPOSITORY = "https://github.com/toposdns/toposdns"


def changelog_versions() -> list[tuple[str, str | None]]:
    """Each `## [VERSION] - DATE` heading, newest first (DATE None for Unreleased)."""
    headings = re.findall(
        r"^## \[([^\]]+)\](?: - (\S+))?$", (ROOT / "CHANGELOG.md").read_text(), re.M
    )
    return [(version, date or None) for version, date in headings]


def test_version_is_a_release() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), "a release: no .dev, rc or local part"


def test_cli_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"toposdns {__version__}\n"


def test_changelog_releases_this_version() -> None:
    versions = changelog_versions()
    assert versions[0] == ("Unreleased", None), "keep an `## [Unreleased]` section on top"
    released = versions[1:]
    assert released[0][0] == __version__, "the newest dated section is the package's version"
    for version, date in released:
        assert date and re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), f"{version}: date YYYY-MM-DD"
    dates = [date for _, date in released]
    assert dates == sorted(dates, reverse=True)


def test_changelog_link_references() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    links = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", text, re.M))
    versions = [version for version, _ in changelog_versions()]
    assert set(versions) <= set(links), "every heading has its link reference"
    assert links["Unreleased"] == f"{REPOSITORY}/compare/v{versions[1]}...HEAD"
    oldest = versions[-1]
    assert links[oldest] == f"{REPOSITORY}/releases/tag/v{oldest}"
    for newer, older in zip(versions[1:], versions[2:], strict=False):
        assert links[newer] == f"{REPOSITORY}/compare/v{older}...v{newer}"


def test_image_label_is_the_version() -> None:
    label = re.search(
        r'org\.opencontainers\.image\.version="([^"]+)"', (ROOT / "Dockerfile").read_text()
    )
    assert label and label[1] == __version__


KUSTOMIZATIONS = sorted(path.parent for path in MANIFESTS.rglob("kustomization.yaml"))


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_rendered_workload_runs_this_version(directory: Path) -> None:
    docs = kustomize(directory)
    ours = [item["image"] for _, item in images(docs) if "toposdns/toposdns" in item["image"]]
    # Other images (the autoscaler's) are pinned to their own releases; ours all to this one.
    assert set(ours) <= {f"ghcr.io/toposdns/toposdns:{__version__}"}
    if directory == MANIFESTS:
        assert len(ours) == 2, "the DNS server and the controller"
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        if "app.kubernetes.io/version" in labels:
            assert labels["app.kubernetes.io/version"] == __version__, doc["metadata"]["name"]


# --- the workflow ---------------------------------------------------------------------------------


def workflow() -> dict[Any, Any]:
    (path,) = WORKFLOWS.glob("*.yaml")
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def actionlint() -> str | None:
    # The venv's own bin first: `pip install '.[test]'` installs it there.
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else shutil.which("actionlint")


def test_actionlint_passes() -> None:
    tool = actionlint()
    if tool is None:
        pytest.skip("actionlint is not installed: pip install '.[test]' brings it")
    files = sorted(str(path) for path in WORKFLOWS.glob("*.y*ml"))
    assert files
    done = subprocess.run(
        [tool, "-no-color", *files], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_fails_a_broken_workflow(tmp_path: Path) -> None:
    # The check above means something: a mistake in an expression is caught.
    tool = actionlint()
    if tool is None:
        pytest.skip("actionlint is not installed: pip install '.[test]' brings it")
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n"
        "    steps:\n      - run: echo ${{ github.nope }}\n"
    )
    done = subprocess.run([tool, "-no-color", str(broken)], capture_output=True, text=True)
    assert done.returncode == 1 and "nope" in done.stdout


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in steps(job) if step.get("uses", "").startswith(action + "@")]


def test_workflow_tests_every_push() -> None:
    flow = workflow()
    # PyYAML reads the bare key `on` as True.
    triggers = flow[True]
    assert triggers["push"]["branches"] == ["**"] and triggers["push"]["tags"] == ["v*"]
    assert "pull_request" in triggers
    test = flow["jobs"]["test"]
    assert "if" not in test
    runs = [step["run"] for step in steps(test) if "run" in step]
    assert any(re.search(r"\bbash \.ci/run$", run.strip()) for run in runs)


def test_workflow_releases_the_tagged_image() -> None:
    jobs = workflow()["jobs"]
    image = jobs["image"]
    assert image["if"] == "startsWith(github.ref, 'refs/tags/v')"
    assert image["needs"] == "test"
    assert image["permissions"] == {"contents": "read", "packages": "write"}
    check = [step for step in steps(image) if "__version__" in step.get("run", "")]
    assert check and "GITHUB_REF_NAME" in check[0]["run"] and "exit 1" in check[0]["run"]
    order = [step.get("uses", step.get("run", "")).split("@")[0] for step in steps(image)]
    builds = uses(image, "docker/build-push-action")
    assert len(builds) == 2
    scan_build, push_build = builds
    assert scan_build["with"]["load"] is True and "push" not in scan_build["with"]
    (scan,) = uses(image, "aquasecurity/trivy-action")
    assert scan["with"]["exit-code"] == "1"
    assert push_build["with"]["push"] is True
    assert push_build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert "docker/setup-qemu-action" in order and "docker/setup-buildx-action" in order
    # Checked, then built and scanned, and only then logged in and pushed.
    assert order.index("aquasecurity/trivy-action") < order.index("docker/login-action")
    assert steps(image).index(check[0]) < steps(image).index(scan_build)
    assert "${{ steps.version.outputs.version }}" in push_build["with"]["tags"]


def test_workflow_actions_are_pinned_by_commit() -> None:
    for job in workflow()["jobs"].values():
        for step in steps(job):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]


def test_documented_images_overlay_swaps_every_image(tmp_path: Path) -> None:
    # docs/operations.md's overlay, pointed at this tree's manifests, as kubectl renders it.
    text = (ROOT / "docs" / "operations.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "images:" in b]
    overlay = yaml.safe_load(block)
    overlay["resources"] = [os.path.relpath(MANIFESTS, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    (image,) = overlay["images"]
    found = [item["image"] for _, item in images(kustomize(tmp_path))]
    assert len(found) == 2
    assert set(found) == {f"{image['newName']}:{image['newTag']}"}
