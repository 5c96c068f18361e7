"""The offline render runs the real Pulumi program under mocks and writes what would be deployed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.render import RenderResult, render_stack, write_render
from tests.conftest import REPO_ROOT, STACKS, TEST_STACKS_DIR, rendered

TOP_LEVEL_TYPES = {
    "pulumi:providers:kubernetes",
    "pulumi:providers:aws",
    "vllm-platform:platform:KubernetesPlatform",
    "vllm-platform:aws:AwsInfrastructure",
}


def test_every_stack_renders_kubernetes_objects_for_every_model(stack_render: RenderResult) -> None:
    config_models = {obj["metadata"]["name"] for obj in stack_render.find("Namespace")}
    assert stack_render.kubernetes_objects
    for model in stack_render.outputs["model_endpoints"]:
        assert f"vllm-{model}" in config_models


def test_eks_stacks_create_aws_resources_and_export_the_promised_outputs(stack_render: RenderResult) -> None:
    assert stack_render.aws_resources, "mode eks builds the AWS layer"
    for key in ("kubeconfig", "cluster_name", "model_bucket", "efs_file_system_id"):
        assert key in stack_render.outputs, key
    assert stack_render.outputs["cluster_name"] == f"vllm-{stack_render.stack}"


def test_existing_mode_creates_no_aws_resources(existing_mode_render: RenderResult) -> None:
    assert existing_mode_render.aws_resources == []
    assert not [r for r in existing_mode_render.resources if r.type.startswith("aws:") or "aws:" in r.type]
    assert existing_mode_render.outputs["efs_file_system_id"] == "fs-0abc1234def567890"
    assert "kubeconfig" not in existing_mode_render.outputs


def test_every_resource_below_the_top_has_a_parent(stack_render: RenderResult) -> None:
    """Children are parented to their component (never left at the stack root)."""
    orphans = [
        f"{r.type}::{r.name}"
        for r in stack_render.resources
        if r.type not in TOP_LEVEL_TYPES
        and r.parent_urn.endswith("pulumi:pulumi:Stack::vllm-platform-" + stack_render.stack)
    ]
    assert orphans == []


def test_kubernetes_objects_have_explicit_unique_names(stack_render: RenderResult) -> None:
    seen = set()
    for obj in stack_render.kubernetes_objects:
        metadata = obj["metadata"]
        assert metadata.get("name"), obj
        key = (obj["apiVersion"], obj["kind"], metadata.get("namespace"), metadata["name"])
        assert key not in seen, key
        seen.add(key)


def test_render_is_deterministic() -> None:
    first = render_stack("dev", allow_missing_charts=True)
    second = render_stack("dev", allow_missing_charts=True)
    assert [(r.type, r.name, r.inputs) for r in first.resources] == [
        (r.type, r.name, r.inputs) for r in second.resources
    ]


def test_write_render_groups_objects_by_namespace_and_writes_aws_json(tmp_path: Path) -> None:
    result = rendered("dev")
    write_render(result, tmp_path)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "kubernetes").rglob("*.yaml"))
    assert len(files) == len(result.kubernetes_objects)
    for path in (tmp_path / "kubernetes").rglob("*.yaml"):
        obj = yaml.safe_load(path.read_text())
        assert path.parent.name == (obj["metadata"].get("namespace") or "_cluster")
    aws = json.loads((tmp_path / "aws-resources.json").read_text())
    assert {entry["type"] for entry in aws} == {r.type for r in result.aws_resources}
    outputs = json.loads((tmp_path / "stack-outputs.json").read_text())
    assert outputs["kubeconfig"] == "[secret]"


@pytest.mark.parametrize("stack", STACKS)
def test_cli_render_writes_every_stack(tmp_path: Path, stack: str) -> None:
    out = tmp_path / stack
    completed = subprocess.run(
        # Offline, as `make dev` renders; with the charts in the cache every release is expanded.
        [sys.executable, "-m", "infra.cli", "render", stack, "--out", str(out), "--allow-missing-charts"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr
    assert f"stack {stack}" in completed.stdout
    assert (out / "aws-resources.json").is_file()
    assert list((out / "kubernetes").rglob("*.yaml"))


def test_cli_invalid_config_exits_2_with_the_message_and_no_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "Pulumi.broken.yaml"
    text = (
        (REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text().replace("max_num_seqs: 64", "max_num_seqs: 0")
    )
    broken.write_text(text)
    for command in ("validate", "render"):
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "infra.cli",
                command,
                "broken",
                "--file",
                str(broken),
                "--out",
                str(tmp_path / "o"),
            ]
            if command == "render"
            else [sys.executable, "-m", "infra.cli", command, "broken", "--file", str(broken)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert completed.returncode == 2, completed
        assert "vllm-platform:models[0].vllm.max_num_seqs = 0" in completed.stderr
        assert "Traceback" not in completed.stderr
        assert not (tmp_path / "o").exists()


def test_cli_validate_accepts_a_file_outside_stacks() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "infra.cli",
            "validate",
            "existing",
            "--file",
            str(TEST_STACKS_DIR / "Pulumi.existing.yaml"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    assert "cluster mode existing" in completed.stdout


def test_pulumi_entry_point_runs_the_same_program() -> None:
    """Pulumi.yaml points at infra/, whose __main__ calls run_program: preview runs this code unchanged."""
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["main"] == "infra/"
    assert project["stackConfigDir"] == "stacks"
    assert project["runtime"]["name"] == "python"
    assert "run_program()" in (REPO_ROOT / "infra" / "__main__.py").read_text()


def test_cli_output_piped_into_a_reader_that_stops_early_is_not_an_error() -> None:
    completed = subprocess.run(
        f"{sys.executable} -m infra.cli plan prod | head -n 1",
        shell=True,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.stdout.startswith("Capacity plan")
    assert "BrokenPipeError" not in completed.stderr
