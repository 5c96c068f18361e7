"""Local step: the two `vllm serve` commands of the tensor-parallel check, from what the stack deploys.

    .venv/bin/python -m bench.tensor_parallel.prepare        # writes bench/tensor_parallel/plan.json

- tp2: the vLLM container of prod's `qwen2-5-7b-tp2` Deployment, as the real Pulumi program renders
  it (`infra.render.render_stack`): its arguments, its environment (NCCL settings included), its GPU
  request and its /dev/shm volume.
- tp1: the same model with `gpus_per_replica: 1`, built by the same container builder the program
  uses (`components.model_service.pod_template`): what the stack would deploy for a TP=1 replica.

Both are made runnable on the lab's vLLM 0.26.0 by bench/serving/prepare.py's translation (the
weightless Qwen2.5-7B-shaped directory with `--load-format dummy`, flags 0.26.0 lacks, emptyDir paths
as fresh folders, the compile cache as a host folder), and the lab host's NVLink-multicast-off
variables are added; TP>1 starts log NCCL's transport choice (NCCL_DEBUG=INFO, lab only).
- tp2-nccl: a lab diagnosis, not the stack's configuration: tp2 plus `--disable-custom-all-reduce`
  and VLLM_ALLREDUCE_USE_SYMM_MEM=0 (all-reduce through NCCL only), because the stack's tp2 stalled
  on the lab host on 2026-11-29 (NCCL_DIAGNOSIS says why each).
- tp2-nofuse: a lab diagnosis too: tp2 with vLLM's fused all-reduce + RMSNorm pass off, for when the
  stack's tp2 (trtllm backend) fails its first forward pass as mnnvl did on 2026-11-29 19:58.
Every change is recorded in plan.json with its reason; a test fails while plan.json is stale, so the
GPU run always measures what the stack renders.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.serving.phases import WARMUP
from bench.serving.prepare import (
    Change,
    find_vllm_container,
    load_lab_flags,
    translate_arguments,
    translate_environment,
)
from infra.versions import LAB_GPU_VLLM_VERSION, VLLM_VERSION
from infra.vllm_flags import check_server_arguments, load_server_flags

HERE = Path(__file__).resolve().parent
PLAN_FILE = HERE / "plan.json"

STACK = "prod"
MODEL = "qwen2-5-7b-tp2"
LAB_GPU_GROUP = "h200"
"""The prod GPU group whose GPU the lab has (H200): the planner's predictions for the lab use it."""
LAB_MODEL_DIR = "/tmp/m/qwen7b"
LAB_MODEL_SETUP = "python3 bench/capacity/mkshape.py qwen2.5-7b /tmp/m/qwen7b --tokenizer-from /tmp/m/llama8b"

LAB_SAFETY_ENV: dict[str, str] = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast stays off on the shared lab host in NCCL, PyTorch and NVSHMEM: a program that uses
it can take the host's GPUs out of service (the lab's rules). Set for both variants."""

LAB_DIAGNOSTIC_ENV_TP: dict[str, str] = {"NCCL_DEBUG": "INFO"}
"""Lab-only, for TP>1 starts: NCCL logs its communicator setup and each channel's transport
(`via P2P/CUMEM`, `via SHM`, NVLS), so the log of a start that stalls in its first all-reduce says
what NCCL chose. The stack keeps WARN (docs/tensor-parallel.md); this changes logging only."""
LAB_DIAGNOSTIC_WHY = (
    "lab diagnosis for TP>1 starts: NCCL logs its setup and the transport of each channel, so a start "
    "that stalls in its first all-reduce shows what NCCL chose (the stack keeps WARN; logging only)"
)

@dataclass(frozen=True)
class Diagnosis:
    """A lab-only variant: tp2 (the stack's command and environment, as run in the lab) plus exactly
    these changes, each recorded in plan.json with its reason. Never what the stack deploys."""

    name: str
    purpose: str
    flags: tuple[tuple[tuple[str, ...], str], ...] = ()
    """(argument tokens, why) appended to tp2's arguments."""
    env: tuple[tuple[str, str, str], ...] = ()
    """(name, value, why) added to tp2's environment (never silently replacing one tp2 sets)."""
    of: str = "tp2"


NCCL_DIAGNOSIS = Diagnosis(
    name="tp2-nccl",
    purpose=(
        "lab diagnosis, not the stack's configuration: the stack's tp2 with all-reduce through NCCL only. "
        "On 2026-11-29 the stack's TP=2 start on the lab's 2x H200 (NV18) stalled twice between the end "
        "of torch.compile and the KV-cache size, i.e. in the memory-profiling forward pass, the first one "
        "with all-reduces; TP=1 logged its KV cache 3 s after torch.compile. If this variant starts, the "
        "stall is in vLLM's own all-reduce paths on this host, not in NCCL or the stack's settings"
    ),
    flags=(
        (
            ("--disable-custom-all-reduce",),
            "lab diagnosis, not the stack's configuration: vLLM's custom all-reduce (a CUDA-IPC kernel "
            "that spins on flags in peer memory) is off, so every all-reduce goes through NCCL; that kernel "
            "is known to spin forever on some hosts, while NCCL all-reduce was seen working on this "
            "machine kind",
        ),
    ),
    env=(
        (
            "VLLM_ALLREDUCE_USE_SYMM_MEM",
            "0",
            "lab diagnosis, not the stack's configuration: vLLM 0.26.0 (envs.py, default 1) builds a "
            "SymmMemCommunicator for the TP group; with NVLink multicast off it disables itself but keeps "
            "its torch symmetric-memory allocation, and both stalled starts crashed in that allocation's "
            "destructor (CUDASymmetricMemory.cu:51, illegal memory access); 0 skips it",
        ),
    ),
)
NOFUSE_DIAGNOSIS = Diagnosis(
    name="tp2-nofuse",
    purpose=(
        "lab diagnosis, not the stack's configuration: the stack's tp2 without vLLM's fused all-reduce + "
        "RMSNorm compile pass, so no FlashInfer all-reduce workspace exists and every all-reduce is vLLM's "
        "custom all-reduce or NCCL. On 2026-11-29 19:58 the stack's tp2 (then with vLLM's own backend "
        "choice, mnnvl) and tp2-nccl both failed their first forward pass in that fused kernel "
        "(CUBLAS_STATUS_INTERNAL_ERROR after an illegal memory access); the stack now sets the trtllm "
        "backend, and this variant runs only when that start fails too"
    ),
    flags=(
        (
            ("--compilation-config", '{"pass_config": {"fuse_allreduce_rms": false}}'),
            "lab diagnosis, not the stack's configuration: vLLM enables fuse_allreduce_rms on Hopper at "
            "TP > 1 (config/vllm.py, enable_allreduce_rms_fusion); off, the all-reduce and RMSNorm run "
            "unfused (numerically the same, a few per cent slower decode)",
        ),
    ),
)
LAB_DIAGNOSES: tuple[Diagnosis, ...] = (NCCL_DIAGNOSIS, NOFUSE_DIAGNOSIS)
"""In the order the analysis prefers them for the TP=2 columns when the stack's tp2 never completed."""

# The workload: C = 64 streams of 512 prompt + 256 forced output tokens, 128 requests
# (two waves), the same shape as the serving benchmark's C=64 level (bench/serving/prepare.py).
WORKLOAD: dict[str, Any] = {
    "input_len": 512,
    "output_len": 256,
    "concurrency": 64,
    "num_prompts": 128,
    "time_cap_s": 90,
    "warmup": WARMUP,
}

VARIANTS: dict[str, int] = {"tp2": 2, "tp1": 1}
"""Variant name -> tensor-parallel size (gpus_per_replica)."""


def _with_size(config: Any, model_name: str, gpus_per_replica: int) -> tuple[Any, Any]:
    """`config` with the named model at another gpus_per_replica, and that model."""
    models = [
        model.model_copy(update={"gpus_per_replica": gpus_per_replica}) if model.name == model_name else model
        for model in config.models
    ]
    return config.model_copy(update={"models": models}), next(m for m in models if m.name == model_name)


def rendered_containers(result: Any) -> dict[str, tuple[dict[str, Any], dict[str, Any], str]]:
    """Variant -> (pod spec, vLLM container, where it came from)."""
    from components.model_service import pod_template
    from infra.capacity.plan import plan_model
    from infra.stack_checks import load_stack

    config = load_stack(STACK)
    model = next((m for m in config.models if m.name == MODEL), None)
    if model is None or model.tensor_parallel_size != VARIANTS["tp2"]:
        raise LookupError(
            f"the {STACK} stack must serve {MODEL} with gpus_per_replica: 2 (stacks/Pulumi.{STACK}.yaml)"
        )
    deployment, pod_spec, container = find_vllm_container(result, MODEL)
    where = f"rendered Deployment {deployment['metadata']['namespace']}/{deployment['metadata']['name']}"
    containers = {"tp2": (pod_spec, container, where)}
    variant_config, variant = _with_size(config, MODEL, VARIANTS["tp1"])
    plan = plan_model(variant, variant_config, variant.gpu_group)
    spec = pod_template(variant_config, variant, plan, service_account="vllm")["spec"]
    containers["tp1"] = (
        spec,
        spec["containers"][0],
        "components.model_service.pod_template for the model at gpus_per_replica 1",
    )
    return containers


def _flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def lab_variant(pod_spec: dict[str, Any], container: dict[str, Any], source: str) -> dict[str, Any]:
    """What the stack renders for one variant, and the lab command made from it (with every change)."""
    rendered = list(container["args"])
    serve_args, arg_changes = translate_arguments(
        rendered,
        lab_flags=load_lab_flags(),
        stack_flags=load_server_flags(VLLM_VERSION),
        model_dir=LAB_MODEL_DIR,
    )
    # bench/serving's translation names its own (Llama) lab directory as the reason; say ours.
    arg_changes[0] = Change(
        "model",
        "replaced",
        rendered[0],
        LAB_MODEL_DIR,
        f"the lab host has a weightless Qwen2.5-7B-shaped directory ({LAB_MODEL_SETUP})",
    )
    env, env_changes = translate_environment(container, pod_spec)
    env_changes += _override_env(
        env, LAB_SAFETY_ENV, "the shared lab host keeps NVLink multicast off in NCCL, PyTorch and NVSHMEM"
    )
    tensor_parallel_size = int(_flag_value(rendered, "--tensor-parallel-size"))
    if tensor_parallel_size > 1:
        env_changes += _override_env(env, LAB_DIAGNOSTIC_ENV_TP, LAB_DIAGNOSTIC_WHY)
    shm = next(v for v in pod_spec["volumes"] if v["name"] == "dshm")
    resources = container["resources"]
    return {
        "tensor_parallel_size": tensor_parallel_size,
        "source": source,
        "rendered": {
            "args": rendered,
            "gpus": {
                "request": resources["requests"].get("nvidia.com/gpu"),
                "limit": resources["limits"].get("nvidia.com/gpu"),
            },
            "dev_shm": shm["emptyDir"],
            "nccl_env": {e["name"]: e["value"] for e in container["env"] if e["name"].startswith("NCCL_")},
        },
        "served_model_name": _flag_value(serve_args, "--served-model-name"),
        "port": int(_flag_value(serve_args, "--port")),
        "serve_args": serve_args,
        "env": env,
        "changes": [change.as_json() for change in arg_changes + env_changes],
    }


def _override_env(env: dict[str, str], values: dict[str, str], why: str) -> list[Change]:
    """Set each of `values` in `env`; a Change for every one that was absent or different."""
    changes = []
    for name, value in values.items():
        if env.get(name) == value:
            continue
        changes.append(
            Change(f"env {name}", "replaced" if name in env else "added", env.get(name), value, why)
        )
        env[name] = value
    return changes


def diagnosis_variant(base: dict[str, Any], diagnosis: Diagnosis) -> dict[str, Any]:
    """The diagnosis's variant: `base` (its `of` variant) plus exactly its flags and environment, each
    recorded as a change; the arguments must pass the lab vLLM's parser."""
    variant = json.loads(json.dumps(base))
    lab_flags = load_lab_flags()
    serve_args = list(variant["serve_args"])
    changes = []
    for tokens, why in diagnosis.flags:
        serve_args += tokens
        changes.append(Change(tokens[0], "added", None, " ".join(tokens[1:]) or "(switch)", why))
    problems = check_server_arguments(serve_args, flags=lab_flags)
    if problems:
        raise ValueError(
            f"{diagnosis.name}'s arguments fail vLLM {lab_flags.vllm_version}'s parser: {problems}"
        )
    for name, value, why in diagnosis.env:
        if name in variant["env"]:
            raise ValueError(f"{diagnosis.of} already sets {name}; the diagnosis must replace it explicitly")
        variant["env"][name] = value
        changes.append(Change(f"env {name}", "added", None, value, why))
    variant["serve_args"] = serve_args
    variant["source"] = f"the {diagnosis.of} variant with the changes of a lab diagnosis"
    variant["lab_diagnosis"] = diagnosis.purpose
    variant["changes"] += [change.as_json() for change in changes]
    return variant


def build_plan(result: Any = None) -> dict[str, Any]:
    """The plan; `result` is the prod stack's RenderResult when already rendered."""
    from infra.render import render_stack

    result = result if result is not None else render_stack(STACK)
    variants = {name: lab_variant(*found) for name, found in rendered_containers(result).items()}
    for diagnosis in LAB_DIAGNOSES:
        variants[diagnosis.name] = diagnosis_variant(variants[diagnosis.of], diagnosis)
    return {
        "generated_by": "bench/tensor_parallel/prepare.py",
        "stack": STACK,
        "stack_file": result.stack_file,
        "model": MODEL,
        "lab_gpu_group": LAB_GPU_GROUP,
        "stack_vllm_version": VLLM_VERSION,
        "lab_vllm_version": LAB_GPU_VLLM_VERSION,
        "lab_model_dir": LAB_MODEL_DIR,
        "lab_model_setup": LAB_MODEL_SETUP,
        "lab_safety_env": LAB_SAFETY_ENV,
        "lab_diagnostic_env_tp": LAB_DIAGNOSTIC_ENV_TP,
        "workload": WORKLOAD,
        "variants": variants,
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--output", type=Path, default=PLAN_FILE)
    args = cli.parse_args()
    plan = build_plan()
    args.output.write_text(json.dumps(plan, indent=1) + "\n")
    print(f"wrote {args.output}")
    for name, variant in plan["variants"].items():
        print(f"{name}: vllm serve {' '.join(variant['serve_args'])}")
        for change in variant["changes"]:
            print(
                f"  {change['action']:8} {change['what']}: {change['from']} -> {change['to']} "
                f"({change['why']})"
            )


if __name__ == "__main__":
    main()
