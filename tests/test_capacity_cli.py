"""`vllm-platform plan STACK [--file PATH] [--json]` through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from domain.capacity import plan_platform
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT, STACKS

CLI = Path(sys.executable).parent / "vllm-platform"


def _run(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), "plan", *arguments],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("stack", STACKS)
def test_plan_prints_a_row_for_every_model_on_every_gpu_group(stack: str) -> None:
    done = _run(stack)
    assert done.returncode == 0, done.stderr
    plan = plan_platform(load_stack(stack))
    rows = [line for line in done.stdout.splitlines() if line and not line.startswith((" ", "-"))]
    config = load_stack(stack)
    for model in config.models:
        for group in config.node_groups.gpu:
            row = next(
                (line for line in rows if line.startswith(f"{model.name} ") and f" {group} (" in line), None
            )
            assert row is not None, f"no row for {model.name} on {group}:\n{done.stdout}"
            placed = (
                plan.models[model.name]
                if group == model.gpu_group
                else next(p for p in plan.alternatives if p.model == model.name and p.gpu_group == group)
            )
            assert f"{placed.kv_cache.tokens:,}" in row
            assert ("CANNOT START" in row) == (not placed.fits)
    for model in plan.models.values():
        assert f"{model.startup_budget_seconds} s" in done.stdout


@pytest.mark.parametrize("stack", STACKS)
def test_plan_json_accounts_for_every_byte_vllm_may_use(stack: str) -> None:
    done = _run(stack, "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    config = load_stack(stack)
    assert set(document["models"]) == {model.name for model in config.models}
    for model in config.models:
        entry = document["models"][model.name]
        assert entry["gpu_group"] == model.gpu_group
        assert entry["tensor_parallel_size"] == model.gpus_per_replica
        parts = entry["memory_bytes_per_gpu"]
        assert parts["requested"] == (
            parts["weights"]
            + parts["activation_peak"]
            + parts["non_torch"]
            + parts["cuda_graphs"]
            + parts["kv_cache"]
        )
        kv = entry["kv_cache"]
        assert (
            kv["num_blocks"] * kv["page_bytes_per_layer"]
            <= parts["kv_cache"] // model.architecture.resolved()["num_hidden_layers"]
        )
        assert entry["concurrency"]["max_num_seqs"] == model.vllm.max_num_seqs
        assert entry["startup"]["budget_seconds"] >= sum(entry["startup"]["phases_seconds"].values())
    assert len(document["alternatives"]) == len(config.models) * (len(config.node_groups.gpu) - 1)


def test_plan_of_a_stack_whose_model_cannot_start_exits_2_with_the_reason() -> None:
    done = _run("bad", "--file", str(REPO_ROOT / "tests" / "bad-stacks" / "model-does-not-fit-gpu.yaml"))
    assert done.returncode == 2
    assert "vllm-platform:models[0].gpus_per_replica = 1" in done.stderr
    assert "does not fit" in done.stderr
