"""Tensor parallelism (issue 9): how a TP=2 model is rendered and planned.

The render tests run the real Pulumi program under mocks (tests.conftest.rendered); the planner tests
compare the planner with its own formulas. (The lab runner of 2026-11-29, bench/tensor_parallel, was
deleted with the home-made load generator it measured with; issue 17.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.vllm_arguments import (
    DISTRIBUTED_EXECUTOR_BACKEND,
    FLASHINFER_ALLREDUCE_BACKEND_ENV,
    reserved_flag_problems,
)
from domain.architecture import (
    activation_dtype,
    kv_heads_per_gpu,
    linear_weight_dtype,
    model_shape,
    weight_bytes_per_gpu,
)
from domain.capacity import plan_platform
from domain.config import ConfigError
from domain.config.engine import DEFAULT_NCCL_ENV, VllmEngineConfig
from domain.vllm_flags import check_server_arguments
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT, model_workloads, rendered

TP_MODEL = "qwen2-5-7b-tp2"
LAB_GPU_GROUP = "h200"
"""The prod GPU group whose GPU the lab has (H200)."""


def _with_size(config: Any, model_name: str, gpus_per_replica: int) -> Any:
    """`config` with the named model at another gpus_per_replica."""
    models = [
        model.model_copy(update={"gpus_per_replica": gpus_per_replica}) if model.name == model_name else model
        for model in config.models
    ]
    return config.model_copy(update={"models": models})


def _vllm_container(result: RenderResult, model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = model_workloads(result, f"vllm-{model}")[0]
    spec = deployment["spec"]["template"]["spec"]
    return spec, next(c for c in spec["containers"] if c["name"] == "vllm")


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {item["name"]: item.get("value") for item in container["env"]}


def _value(args: list[str], flag: str) -> str:
    assert args.count(flag) == 1, f"{flag} appears {args.count(flag)} times in {args}"
    return args[args.index(flag) + 1]


def _models(stack: str) -> list[Any]:
    return list(load_stack(stack).models)


# --- rendering ------------------------------------------------------------------------------------------


def test_tp2_pod_requests_and_limits_exactly_its_two_gpus() -> None:
    model = next(m for m in _models("prod") if m.name == TP_MODEL)
    assert model.gpus_per_replica == 2
    spec, container = _vllm_container(rendered("prod"), TP_MODEL)
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "2"
    # One pod holds the whole GPU set: no other container of the pod asks for a GPU.
    others = [c for c in spec["containers"] + spec["initContainers"] if c is not container]
    assert all("nvidia.com/gpu" not in str(c.get("resources")) for c in others)


def test_tp2_arguments_carry_the_size_and_vllms_multiprocessing_backend() -> None:
    _, container = _vllm_container(rendered("prod"), TP_MODEL)
    args = container["args"]
    assert _value(args, "--tensor-parallel-size") == "2"
    assert _value(args, "--distributed-executor-backend") == DISTRIBUTED_EXECUTOR_BACKEND == "mp"
    for flag in ("--pipeline-parallel-size", "--data-parallel-size", "--nnodes"):
        assert flag not in args  # the replica never spans pods or nodes


TP_STACKS = ("staging", "prod")
"""The stacks that serve a tensor-parallel model (dev has single-GPU models only)."""


@pytest.mark.parametrize("stack", TP_STACKS)
def test_rendered_tensor_parallel_arguments_pass_the_pinned_vllm_flag_snapshot(stack: str) -> None:
    parallel = [m for m in _models(stack) if m.tensor_parallel_size > 1]
    assert parallel, f"{stack} has no tensor-parallel model to check"
    for model in parallel:
        _, container = _vllm_container(rendered(stack), model.name)
        assert check_server_arguments(container["args"]) == [], model.name


@pytest.mark.parametrize("stack", TP_STACKS)
def test_tensor_parallel_pods_get_the_configured_nccl_environment(stack: str) -> None:
    parallel = [m for m in _models(stack) if m.tensor_parallel_size > 1]
    assert parallel, f"{stack} has no tensor-parallel model to check"
    for model in parallel:
        _, container = _vllm_container(rendered(stack), model.name)
        nccl = {k: v for k, v in _env(container).items() if k.startswith(("NCCL_", "TORCH_NCCL_"))}
        assert nccl == model.vllm.nccl_env
        assert nccl["NCCL_NVLS_ENABLE"] == "0" and nccl["NCCL_IB_DISABLE"] == "1"
        # The fused all-reduce's backend: trtllm unless the model says otherwise (docs/tensor-parallel.md).
        assert _env(container)[FLASHINFER_ALLREDUCE_BACKEND_ENV] == model.vllm.flashinfer_allreduce_backend
        assert model.vllm.flashinfer_allreduce_backend == "trtllm"


def test_single_gpu_pods_have_no_nccl_environment_and_no_distributed_backend(
    stack_render: RenderResult,
) -> None:
    single = [m for m in _models(stack_render.stack) if m.tensor_parallel_size == 1]
    assert single, f"{stack_render.stack} has no single-GPU model to check"
    for model in single:
        _, container = _vllm_container(stack_render, model.name)
        assert not [name for name in _env(container) if "NCCL" in name], model.name
        assert FLASHINFER_ALLREDUCE_BACKEND_ENV not in _env(container), model.name
        assert "--distributed-executor-backend" not in container["args"]


def test_tp2_pod_has_a_memory_backed_dev_shm_of_the_configured_size() -> None:
    model = next(m for m in _models("prod") if m.name == TP_MODEL)
    spec, container = _vllm_container(rendered("prod"), TP_MODEL)
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{model.resources.shm_size_gib:g}Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    # NCCL's SHM transport and vLLM's worker message queues need far less than the default 8 GiB
    # (docs/tensor-parallel.md); the stack must not size it below the default.
    default_shm = type(model.resources).model_fields["shm_size_gib"].default
    assert model.resources.shm_size_gib >= default_shm


def test_a_replica_larger_than_its_nodes_is_rejected_at_validate_time(tmp_path: Path) -> None:
    document = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    models = document["config"]["vllm-platform:models"]
    index = next(i for i, m in enumerate(models) if m["name"] == TP_MODEL)
    models[index]["gpus_per_replica"] = 8  # g6e.12xlarge and g6e.24xlarge have 4 L40S each
    stack_file = tmp_path / "Pulumi.prod.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as raised:
        load_stack("prod", stack_file=stack_file)
    assert f"models[{index}].gpus_per_replica" in str(raised.value)
    assert "one node" in str(raised.value)


@pytest.mark.e2e
def test_real_pinned_vllm_parser_accepts_the_tp2_arguments_as_rendered() -> None:
    from tests.support.vllm_server import check_many_with_real_vllm

    _, container = _vllm_container(rendered("prod"), TP_MODEL)
    lists = [container["args"]]
    assert check_many_with_real_vllm(lists) == [None] * len(lists)


def test_distributed_backend_in_extra_args_is_rejected_with_the_fix() -> None:
    problems = reserved_flag_problems(
        ["--distributed-executor-backend", "ray"], ("models", 0, "vllm", "extra_args")
    )
    assert len(problems) == 1
    assert "in each pod" in problems[0].message and "nodes_per_replica" in problems[0].message
    assert "never Ray" in problems[0].message


# --- the nccl_env setting -----------------------------------------------------------------------------


def test_nccl_env_keys_override_the_defaults_and_keep_the_others() -> None:
    engine = VllmEngineConfig(nccl_env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo"})
    assert engine.nccl_env == {**DEFAULT_NCCL_ENV, "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "lo"}
    assert VllmEngineConfig().nccl_env == DEFAULT_NCCL_ENV


def test_nccl_env_accepts_whole_numbers_as_text_and_rejects_booleans() -> None:
    assert VllmEngineConfig(nccl_env={"NCCL_NVLS_ENABLE": 1}).nccl_env["NCCL_NVLS_ENABLE"] == "1"
    with pytest.raises(ValueError, match="NCCL_IB_DISABLE: give the value as text"):
        VllmEngineConfig(nccl_env={"NCCL_IB_DISABLE": True})


def test_nccl_env_rejects_other_variables_with_the_key_path(tmp_path: Path) -> None:
    document = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    models = document["config"]["vllm-platform:models"]
    index = next(i for i, m in enumerate(models) if m["name"] == TP_MODEL)
    models[index].setdefault("vllm", {})["nccl_env"] = {"LD_PRELOAD": "/tmp/x.so"}
    stack_file = tmp_path / "Pulumi.prod.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as raised:
        load_stack("prod", stack_file=stack_file)
    message = str(raised.value)
    assert f"models[{index}].vllm.nccl_env" in message and "'LD_PRELOAD' is not an NCCL setting" in message


def test_a_flashinfer_allreduce_backend_vllm_does_not_know_is_rejected_with_the_key_path(
    tmp_path: Path,
) -> None:
    document = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.prod.yaml").read_text())
    models = document["config"]["vllm-platform:models"]
    index = next(i for i, m in enumerate(models) if m["name"] == TP_MODEL)
    models[index].setdefault("vllm", {})["flashinfer_allreduce_backend"] = "nccl"
    stack_file = tmp_path / "Pulumi.prod.yaml"
    stack_file.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as raised:
        load_stack("prod", stack_file=stack_file)
    message = str(raised.value)
    assert f"models[{index}].vllm.flashinfer_allreduce_backend" in message
    assert "'trtllm'" in message and "'mnnvl'" in message


def test_a_model_can_choose_vllms_own_flashinfer_allreduce_backend() -> None:
    from components.vllm_arguments import tensor_parallel_environment

    model = next(m for m in _models("prod") if m.name == TP_MODEL)
    chosen = model.model_copy(
        update={"vllm": model.vllm.model_copy(update={"flashinfer_allreduce_backend": "mnnvl"})}
    )
    env = {item["name"]: item["value"] for item in tensor_parallel_environment(chosen)}
    assert env[FLASHINFER_ALLREDUCE_BACKEND_ENV] == "mnnvl" and env["NCCL_NVLS_ENABLE"] == "0"


def test_every_default_nccl_setting_is_explained_in_the_docs() -> None:
    text = (REPO_ROOT / "docs" / "tensor-parallel.md").read_text()
    for name, value in DEFAULT_NCCL_ENV.items():
        assert f"{name}={value}" in text, name


# --- the capacity plan for TP=2 ------------------------------------------------------------------------


def _plans(group: str | None = None) -> tuple[Any, Any]:
    """(TP=2 plan, TP=1 plan) of the prod model on `group` (its own by default), same settings."""
    config = load_stack("prod")
    plans = []
    for size in (2, 1):
        variant_config = _with_size(config, TP_MODEL, size)
        platform = plan_platform(variant_config)
        candidates = [platform.models[TP_MODEL], *platform.alternatives]
        wanted = group or platform.models[TP_MODEL].gpu_group
        plans.append(next(p for p in candidates if p.model == TP_MODEL and p.gpu_group == wanted))
    return plans[0], plans[1]


@pytest.mark.parametrize("group", [None, LAB_GPU_GROUP])
def test_tp2_splits_the_kv_heads_so_each_gpu_stores_half_a_tokens_kv(group: str | None) -> None:
    tp2, tp1 = _plans(group)
    shape = model_shape(next(m for m in _models("prod") if m.name == TP_MODEL))
    assert kv_heads_per_gpu(shape, 2) * 2 == shape.num_key_value_heads
    assert tp2.kv_cache_bytes_per_token * 2 == tp1.kv_cache_bytes_per_token


@pytest.mark.parametrize("group", [None, LAB_GPU_GROUP])
def test_tp2_weights_per_gpu_are_half_plus_the_replicated_parts(group: str | None) -> None:
    tp2, tp1 = _plans(group)
    model = next(m for m in _models("prod") if m.name == TP_MODEL)
    shape = model_shape(model)
    compute = activation_dtype(shape, model.vllm.dtype)
    linear = linear_weight_dtype(shape, model.vllm.quantization, compute)
    assert tp2.weight_bytes_per_gpu == weight_bytes_per_gpu(
        shape, 2, linear_dtype=linear, compute_dtype=compute
    )
    assert tp1.weight_bytes_per_gpu / 2 < tp2.weight_bytes_per_gpu < tp1.weight_bytes_per_gpu * 0.55


@pytest.mark.parametrize("group", [None, LAB_GPU_GROUP])
def test_tp2_holds_more_than_twice_the_kv_tokens_of_tp1_at_the_same_utilization(group: str | None) -> None:
    tp2, tp1 = _plans(group)
    assert tp2.memory.requested_bytes == tp1.memory.requested_bytes  # same GPU, same utilisation
    # Each GPU's cache is larger (less weight on it) and each token takes half of it per GPU.
    assert tp2.memory.kv_cache_bytes > tp1.memory.kv_cache_bytes
    assert tp2.kv_cache.tokens > 2 * tp1.kv_cache.tokens
    assert tp2.fits and tp1.fits
