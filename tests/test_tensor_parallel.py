"""Tensor parallelism (issue 9): how a TP=2 model is rendered and planned, and the GPU check's tools.

The render tests run the real Pulumi program under mocks (tests.conftest.rendered); the planner tests
compare the planner with its own formulas; bench/tensor_parallel's runner is exercised end to end
against the stand-in server, and its analysis against results made from the planner's numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.serving.prepare import load_lab_flags
from bench.serving.vllm_log import parse_log
from bench.tensor_parallel import analyze, prepare, run
from components.vllm_arguments import (
    DISTRIBUTED_EXECUTOR_BACKEND,
    FLASHINFER_ALLREDUCE_BACKEND_ENV,
    reserved_flag_problems,
)
from infra.capacity import plan_platform
from infra.capacity.architecture import (
    activation_dtype,
    kv_heads_per_gpu,
    linear_weight_dtype,
    weight_bytes_per_gpu,
)
from infra.capacity.plan import model_shape
from infra.config import ConfigError
from infra.config.models import DEFAULT_NCCL_ENV, VllmEngineConfig
from infra.render import RenderResult
from infra.stack_checks import load_stack
from infra.vllm_flags import check_server_arguments
from tests.conftest import REPO_ROOT, model_workloads, rendered

TP_MODEL = prepare.MODEL


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
def test_real_pinned_vllm_parser_accepts_the_tp2_arguments_as_rendered_and_as_run_in_the_lab() -> None:
    from tests.support.vllm_server import check_many_with_real_vllm

    plan = json.loads(prepare.PLAN_FILE.read_text())
    _, container = _vllm_container(rendered("prod"), TP_MODEL)
    lists = [container["args"], *(variant["serve_args"] for variant in plan["variants"].values())]
    assert check_many_with_real_vllm(lists) == [None] * len(lists)


def test_distributed_backend_in_extra_args_is_rejected_with_the_fix() -> None:
    problems = reserved_flag_problems(
        ["--distributed-executor-backend", "ray"], ("models", 0, "vllm", "extra_args")
    )
    assert len(problems) == 1
    assert "gpus_per_replica" in problems[0].message and "one pod" in problems[0].message


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
        variant_config, _ = prepare._with_size(config, TP_MODEL, size)
        platform = plan_platform(variant_config)
        candidates = [platform.models[TP_MODEL], *platform.alternatives]
        wanted = group or platform.models[TP_MODEL].gpu_group
        plans.append(next(p for p in candidates if p.model == TP_MODEL and p.gpu_group == wanted))
    return plans[0], plans[1]


@pytest.mark.parametrize("group", [None, prepare.LAB_GPU_GROUP])
def test_tp2_splits_the_kv_heads_so_each_gpu_stores_half_a_tokens_kv(group: str | None) -> None:
    tp2, tp1 = _plans(group)
    shape = model_shape(next(m for m in _models("prod") if m.name == TP_MODEL))
    assert kv_heads_per_gpu(shape, 2) * 2 == shape.num_key_value_heads
    assert tp2.kv_cache_bytes_per_token * 2 == tp1.kv_cache_bytes_per_token


@pytest.mark.parametrize("group", [None, prepare.LAB_GPU_GROUP])
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


@pytest.mark.parametrize("group", [None, prepare.LAB_GPU_GROUP])
def test_tp2_holds_more_than_twice_the_kv_tokens_of_tp1_at_the_same_utilization(group: str | None) -> None:
    tp2, tp1 = _plans(group)
    assert tp2.memory.requested_bytes == tp1.memory.requested_bytes  # same GPU, same utilisation
    # Each GPU's cache is larger (less weight on it) and each token takes half of it per GPU.
    assert tp2.memory.kv_cache_bytes > tp1.memory.kv_cache_bytes
    assert tp2.kv_cache.tokens > 2 * tp1.kv_cache.tokens
    assert tp2.fits and tp1.fits


# --- bench/tensor_parallel: plan -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp_plan() -> dict[str, Any]:
    return prepare.build_plan(result=rendered(prepare.STACK))


def test_committed_tp_plan_is_what_prepare_makes_from_the_current_stack(tp_plan: dict[str, Any]) -> None:
    committed = json.loads(prepare.PLAN_FILE.read_text())
    assert committed == json.loads(json.dumps(tp_plan)), (
        "bench/tensor_parallel/plan.json is stale: run `.venv/bin/python -m bench.tensor_parallel.prepare` "
        "and commit it"
    )


def test_plan_tp2_is_the_rendered_deployment_and_tp1_differs_only_in_parallelism(
    tp_plan: dict[str, Any],
) -> None:
    _, container = _vllm_container(rendered("prod"), TP_MODEL)
    tp2, tp1 = tp_plan["variants"]["tp2"], tp_plan["variants"]["tp1"]
    assert tp2["rendered"]["args"] == container["args"]
    assert tp2["rendered"]["gpus"] == {"request": "2", "limit": "2"}
    assert tp1["rendered"]["gpus"] == {"request": "1", "limit": "1"}
    expected_tp1 = [a for a in container["args"] if a not in ("--distributed-executor-backend", "mp")]
    expected_tp1[expected_tp1.index("--tensor-parallel-size") + 1] = "1"
    assert tp1["rendered"]["args"] == expected_tp1
    assert tp1["rendered"]["nccl_env"] == {} and tp2["rendered"]["nccl_env"] == DEFAULT_NCCL_ENV


def test_lab_commands_serve_the_qwen_shape_and_record_every_change(tp_plan: dict[str, Any]) -> None:
    for variant in tp_plan["variants"].values():
        args = variant["serve_args"]
        assert args[0] == prepare.LAB_MODEL_DIR and _value(args, "--load-format") == "dummy"
        removed = {c["what"] for c in variant["changes"] if c["action"] == "removed"}
        for token in variant["rendered"]["args"][1:]:
            if token.startswith("--"):
                assert token in args or token in removed, token
        assert _value(args, "--tensor-parallel-size") == str(variant["tensor_parallel_size"])


def test_lab_environment_keeps_nvlink_multicast_off_in_both_variants(tp_plan: dict[str, Any]) -> None:
    for variant in tp_plan["variants"].values():
        for name, value in prepare.LAB_SAFETY_ENV.items():
            assert variant["env"][name] == value
    assert tp_plan["variants"]["tp2"]["env"]["NCCL_IB_DISABLE"] == DEFAULT_NCCL_ENV["NCCL_IB_DISABLE"]


def test_tp_starts_log_nccls_transport_choice_as_a_recorded_lab_change(tp_plan: dict[str, Any]) -> None:
    for name, variant in tp_plan["variants"].items():
        debug = [c for c in variant["changes"] if c["what"] == "env NCCL_DEBUG"]
        if variant["tensor_parallel_size"] > 1:
            assert variant["env"]["NCCL_DEBUG"] == "INFO", name
            assert debug == [
                {
                    "what": "env NCCL_DEBUG",
                    "action": "replaced",
                    "from": DEFAULT_NCCL_ENV["NCCL_DEBUG"],
                    "to": "INFO",
                    "why": prepare.LAB_DIAGNOSTIC_WHY,
                }
            ]
        else:
            assert "NCCL_DEBUG" not in variant["env"] and debug == [], name
    # The rendered (stack) side is untouched: the stack keeps WARN.
    assert tp_plan["variants"]["tp2"]["rendered"]["nccl_env"]["NCCL_DEBUG"] == "WARN"


def test_tp2_nccl_is_tp2_plus_exactly_the_two_diagnosis_changes(tp_plan: dict[str, Any]) -> None:
    tp2, diagnosis = tp_plan["variants"]["tp2"], tp_plan["variants"]["tp2-nccl"]
    assert diagnosis["serve_args"] == [*tp2["serve_args"], "--disable-custom-all-reduce"]
    assert diagnosis["env"] == {**tp2["env"], "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    assert diagnosis["changes"][: len(tp2["changes"])] == tp2["changes"]
    added = diagnosis["changes"][len(tp2["changes"]) :]
    assert [(c["what"], c["action"], c["to"]) for c in added] == [
        ("--disable-custom-all-reduce", "added", "(switch)"),
        ("env VLLM_ALLREDUCE_USE_SYMM_MEM", "added", "0"),
    ]
    assert all(c["why"].startswith("lab diagnosis, not the stack's configuration") for c in added)
    assert "not the stack's configuration" in diagnosis["lab_diagnosis"]
    # Same GPUs, port and rendered source as tp2; the lab vLLM's parser accepts the flag.
    for key in ("tensor_parallel_size", "rendered", "port", "served_model_name"):
        assert diagnosis[key] == tp2[key], key
    assert check_server_arguments(diagnosis["serve_args"], flags=load_lab_flags()) == []
    # The stack's own variants do not carry the diagnosis.
    assert "--disable-custom-all-reduce" not in tp2["serve_args"] + tp_plan["variants"]["tp1"]["serve_args"]


def test_tp2_nofuse_is_tp2_without_the_fused_all_reduce_and_the_stack_sets_trtllm(
    tp_plan: dict[str, Any],
) -> None:
    tp2, diagnosis = tp_plan["variants"]["tp2"], tp_plan["variants"]["tp2-nofuse"]
    fusion_off = '{"pass_config": {"fuse_allreduce_rms": false}}'
    assert diagnosis["serve_args"] == [*tp2["serve_args"], "--compilation-config", fusion_off]
    assert json.loads(fusion_off) == {"pass_config": {"fuse_allreduce_rms": False}}
    assert diagnosis["env"] == tp2["env"]
    added = diagnosis["changes"][len(tp2["changes"]) :]
    assert [(c["what"], c["action"], c["to"]) for c in added] == [
        ("--compilation-config", "added", fusion_off)
    ]
    assert check_server_arguments(diagnosis["serve_args"], flags=load_lab_flags()) == []
    # The stack's tp2 carries the backend that started in the lab, from the render, not a lab change.
    assert tp2["env"]["VLLM_FLASHINFER_ALLREDUCE_BACKEND"] == "trtllm"
    assert not [c for c in tp2["changes"] if "FLASHINFER_ALLREDUCE" in c["what"]]
    assert "VLLM_FLASHINFER_ALLREDUCE_BACKEND" not in tp_plan["variants"]["tp1"]["env"]


# --- bench/tensor_parallel: runner ---------------------------------------------------------------------


def _run_cli(tmp_path: Path, *args: str, plan: Path | None = None, timeout: float = 120) -> tuple[int, str]:
    env = dict(
        os.environ,
        TP_WORK_DIR=str(tmp_path / "work"),
        BENCH_WORK_DIR=str(tmp_path / "bench-work"),
        PYTHONPATH=str(REPO_ROOT),
    )
    command = [
        sys.executable,
        "-m",
        "bench.tensor_parallel.run",
        "--fake-server",
        "--out",
        str(tmp_path / "out"),
    ]
    if plan is not None:
        command += ["--plan", str(plan)]
    done = subprocess.run(
        [*command, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    return done.returncode, done.stdout + done.stderr


def _registered_groups(tmp_path: Path) -> list[str]:
    registry = tmp_path / "work" / "process-groups"
    return registry.read_text().split() if registry.exists() else []


def test_runner_measures_both_variants_against_the_stand_in_server(tmp_path: Path) -> None:
    code, output = _run_cli(tmp_path, "--budget-s", "90")
    assert code == 0, output
    result = json.loads((tmp_path / "out" / run.RESULT_FILE).read_text())
    assert result["status"] == "completed" and list(result["runs"]) == ["tp2", "tp1"]
    for name, record in result["runs"].items():
        assert record["status"] == "completed", record
        assert record["time_to_health_s"] > 0
        logged = parse_log((tmp_path / "out" / f"tp-{name}-log.txt").read_text().splitlines())
        assert record["kv_cache"]["kv_cache_tokens"] == logged["kv_cache_tokens"]
        assert record["kv_cache"]["max_concurrency"] == logged["max_concurrency"]
        assert record["load"]["completed"] == run.SMALL_WORKLOAD["num_prompts"]
        assert record["load"]["failed"] == 0
        assert len(record["load_requests"]) == run.SMALL_WORKLOAD["num_prompts"]
        for key, value in prepare.LAB_SAFETY_ENV.items():
            assert record["env_runner"][key] == value
    assert result["runs"]["tp2"]["env_from_plan"]["NCCL_DEBUG"] == prepare.LAB_DIAGNOSTIC_ENV_TP["NCCL_DEBUG"]
    assert "NCCL_DEBUG" not in result["runs"]["tp1"]["env_from_plan"]
    assert "--tensor-parallel-size" in result["runs"]["tp2"]["command"]
    assert _registered_groups(tmp_path) == []  # every server's process group was stopped


def test_runner_budget_stops_the_server_and_keeps_what_was_measured(tmp_path: Path) -> None:
    plan = json.loads(prepare.PLAN_FILE.read_text())
    # The stand-in server takes 60 s to come up; the budget ends long before.
    plan["variants"]["tp2"]["serve_args"] += ["--startup-s", "60"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    code, output = _run_cli(tmp_path, "--only", "tp2", "--budget-s", "6", plan=plan_file, timeout=60)
    assert code == 124, output
    result = json.loads((tmp_path / "out" / run.RESULT_FILE).read_text())
    assert result["status"].startswith("stopped: budget")
    record = result["runs"]["tp2"]
    assert record["command"] and record["status"].startswith("stopped: budget")
    assert "time_to_health_s" not in record
    assert _registered_groups(tmp_path) == []


STAND_IN = """
import argparse, os, signal, subprocess, sys, time

cli = argparse.ArgumentParser()
cli.add_argument("--fake-port", type=int, required=True)
cli.add_argument("--behaviour", required=True)
cli.add_argument("--gap-s", type=float, default=0.0)
cli.add_argument("--pid-file", required=True)
options, _ = cli.parse_known_args()
stamp = "INFO 11-29 18:26:51 [x.py:1]"
say = lambda text: print(f"(Worker_TP0 pid={os.getpid()}) {stamp} {text}", flush=True)
say("Model loading took 7.16 GiB memory and 1.9 seconds")
say("torch.compile took 21.47 s in total")
if options.behaviour == "stall":  # a worker that never finishes its profiling run, and its child
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open(options.pid_file, "w").write(str(child.pid))
    time.sleep(300)
elif options.behaviour == "worker-failed":  # 2026-11-29 19:58: a worker raised; the server hung on
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open(options.pid_file, "w").write(str(child.pid))
    time.sleep(0.5)
    print(f"(EngineCore pid={os.getpid()}) ERROR 11-29 18:27:51 [core.py:1330] RuntimeError: Worker failed "
          "with error 'CUDA error: CUBLAS_STATUS_INTERNAL_ERROR when calling `cublasCreate(handle)`', please "
          "check the stack trace above for the root cause", flush=True)
    time.sleep(300)
elif options.behaviour == "post-capture-gap":  # KV cache, capture, then silence, then serving
    open(options.pid_file, "w").write(str(os.getpid()))
    say("Available KV cache memory: 110.18 GiB")
    say("GPU KV cache size: 2,063,088 tokens")
    say("Maximum concurrency for 8,192 tokens per request: 251.84x")
    say("Graph capturing finished in 5 secs, took 0.54 GiB")
    time.sleep(options.gap_s)
    sys.argv = [sys.argv[0], "--fake-port", str(options.fake_port), "--startup-s", "0"]
    from bench.serving.fake_server import main
    main()
elif options.behaviour == "exit-ignoring-term":  # the start fails; a child outlives SIGTERM
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time\\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('child: SIGTERM ignored', flush=True))\\n"
            "time.sleep(300)",
        ]
    )
    open(options.pid_file, "w").write(str(child.pid))
    time.sleep(1)
    print("RuntimeError: stand-in start failure", flush=True)
    sys.exit(1)
"""


def _stand_in_cli(
    tmp_path: Path, behaviour: str, *args: str, gap_s: float = 0.0, py_spy: str | None = None
) -> tuple[int, str, dict[str, Any], int]:
    """run.py --fake-server --only tp2 against STAND_IN; (exit code, output, tp.json, the pid it wrote)."""
    (tmp_path / "stand_in_tp.py").write_text(STAND_IN)
    plan = json.loads(prepare.PLAN_FILE.read_text())
    pid_file = tmp_path / "stand-in.pid"
    plan["variants"]["tp2"]["serve_args"] += [
        "--behaviour",
        behaviour,
        "--gap-s",
        str(gap_s),
        "--pid-file",
        str(pid_file),
    ]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    env = dict(
        os.environ,
        TP_WORK_DIR=str(tmp_path / "work"),
        BENCH_WORK_DIR=str(tmp_path / "bench-work"),
        PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO_ROOT}",
        TP_FAKE_SERVER="stand_in_tp",
        TP_PY_SPY=py_spy or str(tmp_path / "no-py-spy-here"),
    )
    command = [sys.executable, "-m", "bench.tensor_parallel.run", "--fake-server", "--only", "tp2"]
    command += ["--out", str(tmp_path / "out"), "--plan", str(plan_file), *args]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    result = json.loads((tmp_path / "out" / run.RESULT_FILE).read_text())
    pid = int(pid_file.read_text()) if pid_file.exists() else -1
    return done.returncode, done.stdout + done.stderr, result, pid


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_stall_after_compile_is_declared_with_py_spy_dumps_of_every_process(tmp_path: Path) -> None:
    fake_py_spy = tmp_path / "py-spy"
    fake_py_spy.write_text('#!/bin/sh\necho "Thread 1 (idle): MainThread (fake py-spy $*)"\n')
    fake_py_spy.chmod(0o755)
    code, output, result, child = _stand_in_cli(
        tmp_path, "stall", "--budget-s", "90", "--stall-limit-s", "2", py_spy=str(fake_py_spy)
    )
    assert code == 1, output
    record = result["runs"]["tp2"]
    assert record["status"] == "stalled", record
    assert record["error"].startswith("StallError: tp2: stalled: no KV-cache size")
    assert "after torch_compile_s" in record["error"] and "tp-tp2-stall.txt" in record["error"]
    stall = record["stall"]
    assert stall["after_milestone"] == "torch_compile_s" and stall["limit_s"] == 2
    assert 2 <= stall["waited_s"] < 10
    assert stall["milestone_at_s"] == record["milestones_s"]["torch_compile_s"]
    assert "kv_cache_tokens" not in record["milestones_s"]
    assert stall["dump_file"] == "tp-tp2-stall.txt"
    assert stall["py_spy"] == "found" and stall["py_spy_path"] == str(fake_py_spy)
    pids = {p["pid"] for p in stall["processes"]}
    assert child in pids and len(pids) == 2  # the stand-in and its child: the whole process group
    assert stall["py_spy_dumps"] == {str(pid): "ok" for pid in pids}
    dump = (tmp_path / "out" / "tp-tp2-stall.txt").read_text()
    for pid in pids:
        assert f"(fake py-spy dump --pid {pid})" in dump
    assert "$ df -h /dev/shm" in dump and "nvidia-smi" in dump
    assert "torch.compile took 21.47 s in total" in dump  # the log tail
    # Declared long before the 60 s health timeout of the stand-in mode; the group was stopped.
    assert record["steps"][-1]["at_s"] < 30
    log = (tmp_path / "out" / "tp-tp2-log.txt").read_text()
    assert "torch.compile took" in log
    assert not _alive(child) and _registered_groups(tmp_path) == []


def test_a_failed_worker_ends_the_start_after_a_grace_instead_of_at_the_stall_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers of a start whose worker raised hang in their exit handlers (2026-11-29 19:58): the
    # runner must not wait for the stall limit (here 60 s) but stop it the grace after the error line.
    code, output, result, child = _stand_in_cli(tmp_path, "worker-failed", "--budget-s", "90",
                                                "--stall-limit-s", "60")
    assert code == 1, output
    record = result["runs"]["tp2"]
    assert record["status"] == "failed", record
    assert record["error"].startswith("WorkerFailedError: tp2: a worker failed at ")
    assert "CUBLAS_STATUS_INTERNAL_ERROR" in record["error"]
    stall = record["stall"]
    assert stall["after_milestone"] == "worker_failed" and stall["limit_s"] == run.WORKER_EXIT_GRACE_S
    assert stall["worker_error"].startswith("CUDA error: CUBLAS_STATUS_INTERNAL_ERROR")
    assert run.WORKER_EXIT_GRACE_S <= stall["waited_s"] < run.WORKER_EXIT_GRACE_S + 10  # rounded to 0.1 s
    assert record["steps"][-1]["at_s"] < 60  # long before the 60 s stall limit
    assert not _alive(child) and _registered_groups(tmp_path) == []
    # The report names the failure, not a stall.
    attempts = analyze.failed_attempts([(tmp_path / "out" / run.RESULT_FILE, result)])
    table = "\n".join(analyze.render_failed_starts(attempts, {}))
    assert "a worker failed at" in table and "CUBLAS_STATUS_INTERNAL_ERROR" in table


def test_stall_record_says_when_py_spy_is_absent(tmp_path: Path) -> None:
    code, output, result, _ = _stand_in_cli(tmp_path, "stall", "--budget-s", "90", "--stall-limit-s", "1")
    assert code == 1, output
    stall = result["runs"]["tp2"]["stall"]
    assert stall["py_spy"] == "absent" and stall["py_spy_dumps"] == {}
    assert stall["py_spy_path"] == f"not found in {tmp_path / 'no-py-spy-here'}"
    assert "py-spy: absent" in (tmp_path / "out" / stall["dump_file"]).read_text()
    assert "(py-spy absent)" in result["runs"]["tp2"]["error"]


def test_silent_gap_after_graph_capture_is_not_a_stall(tmp_path: Path) -> None:
    # KV cache logged, then 4 s of silence (vLLM 0.26's kernel warm-up) with a 1 s stall limit.
    code, output, result, _ = _stand_in_cli(
        tmp_path, "post-capture-gap", "--budget-s", "90", "--stall-limit-s", "1", gap_s=4
    )
    assert code == 0, output
    record = result["runs"]["tp2"]
    assert record["status"] == "completed" and "stall" not in record
    assert record["time_to_health_s"] > 4
    assert record["milestones_s"]["graph_capture_s"] <= record["time_to_health_s"] - 3
    assert record["kv_cache"]["kv_cache_tokens"] == 2_063_088


def test_failed_start_keeps_its_log_and_the_health_wait_leaves_room_for_the_stop(tmp_path: Path) -> None:
    # No stall check: the start never gets healthy; the wait must end before the budget does.
    budget = run.STOP_RESERVE_S + 12
    code, output, result, child = _stand_in_cli(
        tmp_path, "stall", "--budget-s", str(budget), "--stall-limit-s", "0"
    )
    assert code == 1, output
    assert result["status"] == "failed"  # not "stopped: budget": the stop and the save fitted
    record = result["runs"]["tp2"]
    assert record["status"] == "failed" and "no health within" in record["error"]
    assert record["milestones_s"]["torch_compile_s"] > 0 and "stall" not in record
    assert record["steps"][-1]["step"].startswith("stopped tp2")
    assert "torch.compile took" in (tmp_path / "out" / "tp-tp2-log.txt").read_text()
    assert not _alive(child) and _registered_groups(tmp_path) == []


def test_budget_running_out_during_the_stop_still_saves_the_log_and_kills_the_group(tmp_path: Path) -> None:
    # The start fails at once; a child ignores SIGTERM, so the 30 s stop outlasts the 8 s budget.
    code, output, result, child = _stand_in_cli(tmp_path, "exit-ignoring-term", "--budget-s", "8")
    assert code == 124, output
    assert result["status"].startswith("stopped: budget")
    record = result["runs"]["tp2"]
    assert record["status"] == "failed" and "exited with code 1" in record["error"]
    log = (tmp_path / "out" / "tp-tp2-log.txt").read_text()
    assert "RuntimeError: stand-in start failure" in log
    assert "child: SIGTERM ignored" in log  # saved again after the stop that finish() completed
    assert not _alive(child) and _registered_groups(tmp_path) == []


def test_stop_saves_the_log_before_stopping_and_keeps_an_interrupted_server(tmp_path: Path) -> None:
    plan = json.loads(prepare.PLAN_FILE.read_text())
    runner = run.Runner(
        plan,
        tmp_path,
        60,
        run.Mode("fake", sys.executable),
        gpu=0,
        keep_compile_cache=False,
        vllm_debug=False,
    )
    log_path = tmp_path / "server.log"
    log_path.write_text("line before the stop\n")
    saved = tmp_path / "tp-tp2-log.txt"

    class Server:
        name, command = "tp2", ["vllm", "serve"]
        calls: list[float] = []

        def __init__(self) -> None:
            self.log_path = log_path

        def stop(self, grace_s: float) -> float:
            self.calls.append(grace_s)
            assert saved.read_text() == f"$ vllm serve\n{log_path.read_text()}"  # saved before the stop
            if len(self.calls) == 1:
                log_path.write_text("line before the stop\nline of the shutdown\n")
                raise run.BudgetExhaustedError("budget of 60 s exhausted")
            return 1.0

    server = Server()
    runner.server = server  # type: ignore[assignment]
    with pytest.raises(run.BudgetExhaustedError):
        runner.stop_server()
    assert runner.server is server  # finish() stops it again
    assert saved.read_text().endswith("line of the shutdown\n")  # and saved after the cut stop
    runner.finish("stopped: budget of 60 s exhausted")
    assert server.calls == [run.STOP_GRACE_S, run.FINISH_GRACE_S] and runner.server is None


def test_stall_check_fires_only_between_compile_end_and_the_kv_cache_size() -> None:
    limit = run.STALL_LIMIT_S["gpu"]
    compiled = {"model_load_s": 102.7, "torch_compile_s": 130.7}
    assert run.stalled_after(compiled, 130.7 + limit - 1, limit, "torch_compile_s") is None
    assert run.stalled_after(compiled, 130.7 + limit + 5, limit, "torch_compile_s") == (130.7, limit + 5)
    # After the KV-cache size: capture, then 100-130 s of silence (warm-up) is never a stall.
    ready = {**compiled, "kv_cache_tokens": 133.7, "graph_capture_s": 140.0}
    assert run.stalled_after(ready, 140.0 + 3 * limit, limit, "torch_compile_s") is None
    # Before compile has ended (loading, compiling) the health timeout alone applies.
    assert run.stalled_after({"model_load_s": 102.7}, 102.7 + 3 * limit, limit, "torch_compile_s") is None
    assert run.stalled_after(compiled, 1e6, 0, "torch_compile_s") is None  # --stall-limit-s 0: off
    # With compilation off the model load is the milestone the KV-cache size must follow.
    assert run.stall_anchor(["/m", "--enforce-eager"]) == "model_load_s"
    assert run.stall_anchor(["/m", "-O", "0"]) == run.stall_anchor(["/m", "-O0"]) == "model_load_s"
    plan = json.loads(prepare.PLAN_FILE.read_text())
    assert {run.stall_anchor(v["serve_args"]) for v in plan["variants"].values()} == {"torch_compile_s"}
    assert run.stalled_after({"model_load_s": 10.0}, 10.0 + limit + 1, limit, "model_load_s") == (
        10.0,
        limit + 1,
    )
    # The default is far above TP=1's 3 s from compile end to KV-cache size and below the health timeout.
    assert 3 * 10 < limit < run.HEALTH_TIMEOUT_S["gpu"] / 2


def test_runner_refuses_tp2_on_the_cpu_build_and_says_where_to_run_it(tmp_path: Path) -> None:
    plan = json.loads(prepare.PLAN_FILE.read_text())
    runner = run.Runner(
        plan, tmp_path, 60, run.Mode("cpu", sys.executable), gpu=0, keep_compile_cache=False, vllm_debug=False
    )
    with pytest.raises(run.RunError, match="two-GPU host"):
        runner.check_host(plan["variants"]["tp2"], [0, 1])


def test_tp1_runs_on_the_gpu_given_and_tp2_on_the_first_two(tmp_path: Path) -> None:
    plan = json.loads(prepare.PLAN_FILE.read_text())
    runner = run.Runner(
        plan, tmp_path, 60, run.Mode("gpu", sys.executable), gpu=1, keep_compile_cache=False, vllm_debug=False
    )
    assert runner.visible_gpus(1) == [1] and runner.visible_gpus(2) == [0, 1]
    command, env, port, _ = runner.server_setup("tp2", plan["variants"]["tp2"], [0, 1])
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert command[-len(plan["variants"]["tp2"]["serve_args"]) :] == plan["variants"]["tp2"]["serve_args"]
    assert port == plan["variants"]["tp2"]["port"]


def test_memory_lines_are_attributed_to_each_tensor_parallel_worker() -> None:
    stamp = "INFO 12-01 10:00:00 [file.py:1]"
    log = "\n".join(
        [
            f"(Worker_TP0 pid=11) {stamp} Model loading took 7.10 GiB memory and 2.0 seconds",
            f"(Worker_TP1 pid=12) {stamp} Model loading took 7.12 GiB memory and 2.1 seconds",
            f"(Worker_TP0 pid=11) {stamp} Available KV cache memory: 117.40 GiB",
            f"(Worker_TP1 pid=12) {stamp} Available KV cache memory: 117.30 GiB",
            f"(EngineCore_DP0 pid=10) {stamp} GPU KV cache size: 4,397,000 tokens",
            f"(EngineCore_DP0 pid=10) {stamp} Maximum concurrency for 8,192 tokens per request: 536.74x",
        ]
    )
    processes = run.process_facts(log)
    assert set(processes) == {"Worker_TP0", "Worker_TP1", "EngineCore_DP0"}
    summary = run.kv_summary(processes, parse_log(log.splitlines()))
    assert summary["weights_gib_per_gpu"] == [7.10, 7.12]
    assert summary["available_kv_cache_gib_per_gpu"] == [117.40, 117.30]
    assert summary["kv_cache_tokens"] == 4_397_000 and summary["max_concurrency"] == 536.74
    observed = analyze.observed_numbers({"tensor_parallel_size": 2, "kv_cache": summary})
    # vLLM sizes the cache for the worker with the least room; the report shows that one.
    assert observed["available_kv_cache_gib_per_gpu"] == 117.30
    assert observed["weights_gib_per_gpu"] == 7.12 and observed["workers_reporting"] == 2


# --- bench/tensor_parallel: analysis -------------------------------------------------------------------


def _raw_run(
    predicted: dict[str, Any], tokens_factor: float, throughput: float, tp: int, status: str = "completed"
) -> dict[str, Any]:
    return {
        "tensor_parallel_size": tp,
        "status": status,
        "time_to_health_s": 150.0,
        "command": ["python3", "-m", "vllm.entrypoints.cli.main", "serve"],
        "kv_cache": {
            "kv_cache_tokens": round(predicted["kv_cache_tokens"] * tokens_factor),
            "max_concurrency": predicted["max_concurrency"] * tokens_factor,
            "max_concurrency_tokens": predicted["max_model_len"],
            "weights_gib_per_gpu": [predicted["weights_gib_per_gpu"]] * tp,
            "available_kv_cache_gib_per_gpu": [predicted["available_kv_cache_gib_per_gpu"] * tokens_factor]
            * tp,
        },
        "load": {
            "concurrency": 64,
            "completed": 128,
            "failed": 0,
            "output_throughput_tok_s": throughput,
            "total_throughput_tok_s": throughput * 3,
            "ttft_ms": {"mean": 100.0, "p99": 300.0},
            "tpot_ms": {"mean": 10.0, "p99": 12.0},
        },
    }


def _write_raw(
    path: Path, runs: dict[str, Any], mode: str = "gpu", started: str = "2026-12-01T10:00:00"
) -> None:
    path.write_text(
        json.dumps(
            {
                "mode": mode,
                "started_at": started,
                "runs": runs,
                "gpus": [{"index": 0, "name": "NVIDIA H200"}],
                "software": {"vllm": "0.26.0"},
            }
        )
    )


@pytest.fixture(scope="module")
def predicted() -> dict[str, Any]:
    return analyze.predictions()


def test_predictions_are_the_planners_for_tp2_and_a_tp1_variant_on_the_lab_gpu(
    predicted: dict[str, Any],
) -> None:
    tp2, tp1 = _plans(prepare.LAB_GPU_GROUP)
    assert predicted["tp2"]["lab"] == analyze.plan_summary(tp2)
    assert predicted["tp1"]["lab"] == analyze.plan_summary(tp1)
    assert (
        predicted["tp2"]["lab"]["gpu_model"] == "H200"
        and predicted["tp1"]["lab"]["tensor_parallel_size"] == 1
    )
    own2, _ = _plans()
    assert predicted["tp2"]["own_group"] == analyze.plan_summary(own2)


def test_analysis_reports_the_percent_difference_from_the_plan(
    tmp_path: Path, predicted: dict[str, Any]
) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    _write_raw(raw / "tp2.json", {"tp2": _raw_run(predicted["tp2"]["lab"], 1.02, 6000.0, 2)})
    _write_raw(raw / "tp1.json", {"tp1": _raw_run(predicted["tp1"]["lab"], 0.95, 4000.0, 1)})
    results = analyze.analyze(raw, prepare.PLAN_FILE)
    variants = results["comparison"]["variants"]
    assert variants["tp2"]["difference_pct"]["kv_cache_tokens"] == pytest.approx(2.0, abs=0.01)
    assert variants["tp1"]["difference_pct"]["kv_cache_tokens"] == pytest.approx(-5.0, abs=0.01)
    assert variants["tp2"]["kv_cache_tokens_within_tolerance"] is True
    assert variants["tp1"]["kv_cache_tokens_within_tolerance"] is False
    assert variants["tp2"]["difference_pct"]["weights_gib_per_gpu"] == 0
    ratios = results["comparison"]["tp2_over_tp1"]
    assert ratios["output_tok_s_per_replica"] == pytest.approx(1.5)
    assert ratios["output_tok_s_per_gpu"] == pytest.approx(0.75)
    expected_ratio = predicted["tp2"]["lab"]["kv_cache_tokens"] / predicted["tp1"]["lab"]["kv_cache_tokens"]
    assert ratios["kv_cache_tokens_predicted"] == pytest.approx(expected_ratio, abs=0.001)
    from tests.test_capacity_observations import Observation  # the observation file's own schema

    observations = {o["name"]: o for o in results["capacity_observations"]}
    for entry in observations.values():
        Observation.model_validate(entry)
    assert observations["tensor-parallel-tp2"]["tensor_parallel_size"] == 2
    assert (
        observations["tensor-parallel-tp1"]["kv_cache_tokens"]
        == variants["tp1"]["observed"]["kv_cache_tokens"]
    )
    report = analyze.render_markdown(results)
    assert "+2.0 %" in report and "-5.0 %" in report
    assert f"{variants['tp2']['observed']['kv_cache_tokens']:,}" in report


def test_analysis_keeps_the_completed_later_run_of_a_variant(
    tmp_path: Path, predicted: dict[str, Any]
) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    lab = predicted["tp2"]["lab"]
    _write_raw(raw / "a.json", {"tp2": _raw_run(lab, 1.0, 1000.0, 2)}, started="2026-12-01T10:00:00")
    _write_raw(raw / "b.json", {"tp2": _raw_run(lab, 1.0, 2000.0, 2)}, started="2026-12-01T11:00:00")
    _write_raw(
        raw / "c.json", {"tp2": _raw_run(lab, 1.0, 3000.0, 2, status="failed")}, started="2026-12-01T12:00:00"
    )
    runs = analyze.load_runs(raw)
    assert runs["tp2"]["load"]["output_throughput_tok_s"] == 2000.0


def test_analysis_refuses_rehearsal_results_and_explains_an_empty_raw_folder(
    tmp_path: Path, predicted: dict[str, Any]
) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    assert analyze.main(["--raw", str(raw), "--results", str(tmp_path / "results")]) == 2
    _write_raw(raw / "fake.json", {"tp1": _raw_run(predicted["tp1"]["lab"], 1.0, 10.0, 1)}, mode="fake")
    with pytest.raises(analyze.NoResultsError, match="rehearsal"):
        analyze.load_runs(raw)
    assert analyze.load_runs(raw, allow_rehearsal=True)["tp1"]["tensor_parallel_size"] == 1
