"""Local step: the exact `vllm serve` command the stack deploys, made runnable on the lab H200.

    .venv/bin/python -m bench.serving.prepare            # writes bench/serving/plan.json

Renders the real Pulumi program for the prod stack (`infra.render.render_stack`), takes the vLLM
container of the H200 8B model's Deployment, and rewrites only what the lab forces:
- the model path becomes the lab's weightless model directory, served with `--load-format dummy`
  (random weights: same shapes, memory and speed);
- flags (or flag values) that the lab's vLLM 0.26.0 does not accept are removed, checked against
  its parser snapshot (data/vllm-0.26.0-server-flags.json); the stack deploys 0.32.0;
- environment: secrets are dropped, paths on the pod's emptyDir volumes become a scratch folder
  emptied before every start (as a new pod has), and VLLM_CACHE_ROOT on the shared model volume, with
  the JIT caches inside it, becomes one host folder kept between starts (as the shared volume is).
Every change is recorded in plan.json with its reason. The GPU phases re-check the arguments with
vLLM 0.26.0's real parser before starting it (phases.py selftest).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from domain.versions import LAB_GPU_VLLM_VERSION, VLLM_VERSION
from domain.vllm_flags import ServerFlags, check_server_arguments, load_server_flags, read_server_flags

HERE = Path(__file__).resolve().parent
PLAN_FILE = HERE / "plan.json"
LAB_FLAGS_FILE = HERE / "data" / f"vllm-{LAB_GPU_VLLM_VERSION}-server-flags.json"

STACK = "prod"
MODEL = "llama-3-1-8b"
LAB_MODEL_DIR = "/tmp/m/llama8b"
SHARED_CACHE = "{shared_cache}"
"""Placeholder the GPU phases replace by a host folder kept between server starts."""
SCRATCH = "{scratch}"
"""Placeholder the GPU phases replace by a folder emptied before every server start."""

# The benchmark's workload (issue 8): random 512-token prompts, 256 forced output tokens.
WORKLOAD: dict[str, Any] = {
    "input_len": 512,
    "output_len": 256,
    "concurrency": [1, 8, 16, 64, 256],
    # ~10-40 s per level on an H200: at least 8 requests, about 4 waves of the concurrency.
    "num_prompts": {"1": 8, "8": 32, "16": 64, "64": 256, "256": 1024},
    # No new requests after this long; a level ends when the requests in flight have finished.
    "level_time_cap_s": 40,
    # The comparison levels first (64: vLLM vs Transformers, 256: tuned vs defaults), so that a
    # phase short of time drops the least important ones.
    "level_order": [64, 256, 16, 8, 1],
}
BASELINE = {"batch_sizes": [1, 8, 16, 64, 256], "input_len": 512, "output_len": 256}
PROBE_UTILIZATION = 0.60
"""The capacity planner's second calibration point (KV-cache log lines at another utilisation)."""
CAPACITY_PLAN = "bench/capacity/kv_cache_plan.json"
CAPACITY_RUNS: dict[str, list[str]] = {"defaults": [], "baseline": []}
"""Runs of the capacity engineer's measure_kv_cache.py that ride along in the phases' spare time:
none now, they were measured on the lab H200 on 2026-11-29 (commit 565d0b3)."""


@dataclass(frozen=True)
class Change:
    what: str
    action: str  # replaced | removed | added
    before: str | None
    after: str | None
    why: str

    def as_json(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "action": self.action,
            "from": self.before,
            "to": self.after,
            "why": self.why,
        }


def load_lab_flags(path: Path = LAB_FLAGS_FILE) -> ServerFlags:
    """The lab vLLM's (0.26.0) parser, snapshotted like the pinned one (domain/vllm_flags.py)."""
    return read_server_flags(path)


def split_flags(args: list[str], flags: ServerFlags) -> tuple[str, list[list[str]]]:
    """(model, [[flag, *values], ...]) for `vllm serve` arguments as the stack builds them."""
    if not args or args[0].startswith("-"):
        raise ValueError(
            f"expected the model path first (as components/vllm_arguments.py builds it), got {args[:3]}"
        )
    groups: list[list[str]] = []
    for token in args[1:]:
        if token.startswith("--"):
            groups.append([token])
        elif not groups:
            raise ValueError(f"a second positional argument {token!r} before any flag")
        else:
            groups[-1].append(token)
    for group in groups:
        name = group[0].split("=", 1)[0]
        option = flags.options.get(name)
        if option is not None and not option.takes_value and len(group) > 1:
            raise ValueError(f"{name} is a switch but is followed by {group[1:]}")
    return args[0], groups


def translate_arguments(
    rendered: list[str], *, lab_flags: ServerFlags, stack_flags: ServerFlags, model_dir: str
) -> tuple[list[str], list[Change]]:
    """The rendered arguments made runnable by the lab's vLLM, and every change with its reason."""
    model, groups = split_flags(rendered, stack_flags)
    changes = [
        Change(
            "model",
            "replaced",
            model,
            model_dir,
            "the lab host has a weightless Llama-3.1-8B-shaped directory (shared/gpu/mkmodel.py)",
        )
    ]
    kept: list[str] = [model_dir]
    for group in groups:
        name, _, inline = group[0].partition("=")
        values = [inline] if inline else group[1:]
        option = lab_flags.options.get(name)
        if option is None:
            changes.append(
                Change(
                    name,
                    "removed",
                    " ".join(group),
                    None,
                    f"vLLM {lab_flags.vllm_version} has no {name} (the stack's {stack_flags.vllm_version} "
                    "has); the lab cannot run a newer vLLM on its PyTorch 2.11",
                )
            )
            continue
        if option.choices is not None and any(value not in option.choices for value in values):
            changes.append(
                Change(
                    name,
                    "removed",
                    " ".join(group),
                    None,
                    f"vLLM {lab_flags.vllm_version} accepts only {', '.join(option.choices)} for {name}",
                )
            )
            continue
        kept += group
    if "--load-format" in {group[0].split("=", 1)[0] for group in groups}:
        raise ValueError("the stack sets --load-format; the benchmark must replace it by 'dummy' explicitly")
    kept += ["--load-format", "dummy"]
    changes.append(
        Change(
            "--load-format",
            "added",
            None,
            "dummy",
            "random weights of the real shapes: same memory and speed, nothing to download",
        )
    )
    problems = check_server_arguments(kept, flags=lab_flags)
    if problems:
        raise ValueError(
            f"the translated arguments still fail vLLM {lab_flags.vllm_version}'s parser: {problems}"
        )
    return kept, changes


def _volume_kinds(pod_spec: dict[str, Any]) -> dict[str, str]:
    kinds = {}
    for volume in pod_spec.get("volumes", []):
        kind = next((key for key in volume if key != "name"), "unknown")
        kinds[volume["name"]] = kind
    return kinds


def translate_environment(
    container: dict[str, Any], pod_spec: dict[str, Any]
) -> tuple[dict[str, str], list[Change]]:
    """The container's environment for a lab process; paths on pod volumes mapped as a pod sees them."""
    kinds = _volume_kinds(pod_spec)
    mounts = sorted(
        ((mount["mountPath"], mount["name"]) for mount in container.get("volumeMounts", [])),
        key=lambda item: -len(item[0]),
    )
    env: dict[str, str] = {}
    changes: list[Change] = []
    cache_root = next(
        (str(item["value"]) for item in container.get("env", []) if item["name"] == "VLLM_CACHE_ROOT"), None
    )
    for item in container.get("env", []):
        name = item["name"]
        if "value" not in item:
            changes.append(
                Change(
                    f"env {name}",
                    "removed",
                    "(from a Secret)",
                    None,
                    "the benchmark server runs without an API key; the client sends none",
                )
            )
            continue
        value = str(item["value"])
        replacement = _lab_path(name, value, cache_root, mounts, kinds)
        if replacement is not None:
            lab_value, why = replacement
            env[name] = lab_value
            changes.append(Change(f"env {name}", "replaced", value, lab_value, why))
            continue
        env[name] = value
    return env, changes


def _lab_path(
    name: str,
    value: str,
    cache_root: str | None,
    mounts: list[tuple[str, str]],
    kinds: dict[str, str],
) -> tuple[str, str] | None:
    """Where a pod path in the environment points in the lab, and why; None for other values."""
    if name == "VLLM_CACHE_ROOT":
        return (
            SHARED_CACHE,
            "the compile cache on the shared model volume: one host folder kept between "
            "starts, so a second start finds it as a new replica does",
        )
    if cache_root is not None and value.startswith(cache_root + "/"):
        return (
            SHARED_CACHE + value[len(cache_root) :],
            "inside the compile cache on the shared model volume (JIT kernel caches): kept "
            "between starts with it, so a second start finds them as a new replica does",
        )
    mount = next(
        ((path, volume) for path, volume in mounts if value == path or value.startswith(path + "/")), None
    )
    if mount is not None and kinds.get(mount[1]) == "emptyDir":
        return (
            f"{SCRATCH}/{mount[1]}{value[len(mount[0]) :]}",
            f"on the pod's emptyDir '{mount[1]}': empty in every new pod, so a folder "
            "emptied before every server start",
        )
    return None


def find_vllm_container(result: Any, model: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    namespace = f"vllm-{model}"
    # A canary model's pods run under an Argo Rollouts Rollout with the same pod template.
    deployments = [o for kind in ("Deployment", "Rollout") for o in result.find(kind, namespace=namespace)]
    if len(deployments) != 1:
        raise LookupError(
            f"expected one Deployment or Rollout in namespace {namespace}, the render has {len(deployments)}"
        )
    deployment = deployments[0]
    pod_spec = deployment["spec"]["template"]["spec"]
    containers = [c for c in pod_spec["containers"] if list(c.get("command", []))[-2:] == ["vllm", "serve"]]
    if len(containers) != 1:
        raise LookupError(
            f"expected one `vllm serve` container in {namespace}/{deployment['metadata']['name']}"
        )
    return deployment, pod_spec, containers[0]


def _flag_value(args: list[str], flag: str) -> str:
    index = args.index(flag)
    return args[index + 1]


def build_plan(stack: str = STACK, model: str = MODEL, result: Any = None) -> dict[str, Any]:
    """The plan for `model` of `stack`; `result` is that stack's RenderResult when already rendered."""
    from infra.render import render_stack
    from infra.stack_checks import load_stack

    result = result if result is not None else render_stack(stack)
    deployment, pod_spec, container = find_vllm_container(result, model)
    rendered = list(container["args"])
    lab_flags = load_lab_flags()
    stack_flags = load_server_flags(VLLM_VERSION)
    serve_args, arg_changes = translate_arguments(
        rendered, lab_flags=lab_flags, stack_flags=stack_flags, model_dir=LAB_MODEL_DIR
    )
    env, env_changes = translate_environment(container, pod_spec)
    config = load_stack(stack)
    engine = next(m for m in config.models if m.name == model).vllm
    profile = None
    if engine.tuning_profile is not None:
        from domain.catalogue.tuning_profiles import tuning_profiles

        chosen = tuning_profiles()[engine.tuning_profile]
        profile = {
            "name": chosen.name,
            "settings": chosen.setting_values(),
            "extra_args": [entry.args for entry in chosen.extra_args],
        }

    served_name = _flag_value(serve_args, "--served-model-name")
    port = int(_flag_value(serve_args, "--port"))
    max_model_len = _flag_value(serve_args, "--max-model-len")
    # vLLM's defaults: nothing but what the workload needs to be comparable (same model, same
    # context limit, same name for the client, same port).
    defaults_args = [
        LAB_MODEL_DIR,
        "--served-model-name",
        served_name,
        "--port",
        str(port),
        "--max-model-len",
        max_model_len,
        "--load-format",
        "dummy",
    ]
    probes = [
        {
            "name": f"stack-util-{PROBE_UTILIZATION:.2f}",
            "serve_args": _with_utilization(serve_args, PROBE_UTILIZATION),
        },
        {
            "name": f"defaults-util-{PROBE_UTILIZATION:.2f}",
            "serve_args": [*defaults_args, "--gpu-memory-utilization", f"{PROBE_UTILIZATION:g}"],
        },
    ]
    for probe in probes:
        if check_server_arguments(probe["serve_args"], flags=lab_flags):
            raise ValueError(f"probe {probe['name']} arguments fail vLLM {lab_flags.vllm_version}'s parser")
    return {
        "generated_by": "bench/serving/prepare.py",
        "stack": stack,
        "stack_file": result.stack_file,
        "model": model,
        "stack_vllm_version": VLLM_VERSION,
        "lab_vllm_version": LAB_GPU_VLLM_VERSION,
        "tuning_profile": profile,
        "deployment": {
            "namespace": deployment["metadata"]["namespace"],
            "name": deployment["metadata"]["name"],
            "container": container["name"],
            "command": container["command"],
            "args": rendered,
        },
        "lab": {
            "model_dir": LAB_MODEL_DIR,
            "served_model_name": served_name,
            "port": port,
            "serve_args": serve_args,
            "env": env,
            "changes": [change.as_json() for change in arg_changes + env_changes],
        },
        "defaults": {"serve_args": defaults_args},
        "probes": probes,
        "workload": WORKLOAD,
        "baseline": BASELINE,
        "capacity": {"plan_file": CAPACITY_PLAN, "runs": CAPACITY_RUNS},
    }


def _with_utilization(args: list[str], utilization: float) -> list[str]:
    result = list(args)
    result[result.index("--gpu-memory-utilization") + 1] = f"{utilization:g}"
    return result


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--output", type=Path, default=PLAN_FILE)
    args = cli.parse_args()
    plan = build_plan()
    args.output.write_text(json.dumps(plan, indent=1) + "\n")
    print(f"wrote {args.output}: vllm serve {' '.join(plan['lab']['serve_args'])}")
    for change in plan["lab"]["changes"]:
        print(
            f"  {change['action']:8} {change['what']}: {change['from']} -> {change['to']} ({change['why']})"
        )


if __name__ == "__main__":
    main()
