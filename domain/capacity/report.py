"""`vllm-platform plan`: the capacity plan as a table for people and as JSON for tools."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from domain.capacity import memory
from domain.capacity.plan import ModelPlan, PlatformPlan
from domain.capacity.startup import PHASES
from domain.capacity.time_to_serve import WARM_POD_READY_TARGET_SECONDS, ServingTimes, Step
from domain.capacity.wake import Case, WakePlan
from domain.versions import VLLM_VERSION

GIB = 1 << 30


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            cell.rjust(width) if index in right else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), line(["-" * width for width in widths]), *(line(row) for row in rows)]


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def _placement(plan: ModelPlan) -> str:
    if plan.nodes_per_replica > 1:
        return (
            f"{plan.gpu_group} ({plan.nodes_per_replica} nodes × {plan.gpus_per_node}× {plan.gpu_model}, "
            f"TP {plan.tensor_parallel_size} × PP {plan.pipeline_parallel_size}"
            + (f" × DP {plan.data_parallel_size})" if plan.data_parallel_size > 1 else ")")
        )
    return f"{plan.gpu_group} ({plan.tensor_parallel_size}× {plan.gpu_model})"


def _status(plan: ModelPlan) -> str:
    if not plan.fits:
        return "CANNOT START"
    if not plan.max_num_seqs_reachable:
        return f"ok; KV cache caps concurrency at {plan.typical_concurrency:.0f} < max_num_seqs"
    return "ok"


def _concurrency(plan: ModelPlan, value: float) -> str:
    return f"{value:,.1f}" if plan.fits else "-"


def format_plan_table(plan: PlatformPlan) -> str:
    models = list(plan.models.values())
    lines = [
        f"Capacity plan, per GPU of one replica (vLLM {VLLM_VERSION} memory arithmetic; docs/capacity.md)",
        "",
    ]
    lines += _table(
        [
            "model",
            "GPU group",
            "weights",
            "KV cache",
            "KV tokens",
            "at max_model_len",
            "at typical length",
            "max_num_seqs",
            "startup",
            "status",
        ],
        [
            [
                p.model,
                _placement(p),
                f"{_gib(p.weight_bytes_per_gpu)} GiB",
                f"{_gib(max(0, p.memory.kv_cache_bytes))} GiB",
                f"{p.kv_cache.tokens:,}",
                f"{_concurrency(p, p.kv_cache.max_concurrency)} of {p.max_model_len:,}",
                f"{_concurrency(p, p.typical_concurrency)} of {p.typical_request_tokens:,}",
                str(p.max_num_seqs),
                f"{p.startup_budget_seconds} s",
                _status(p),
            ]
            for p in models
        ],
        right={2, 3, 4, 5, 6, 7, 8},
    )
    lines += [
        "",
        "  KV tokens: what vLLM logs as `GPU KV cache size`; at ...: how many requests of that many tokens "
        "fit in the KV cache at once",
    ]
    lines += ["", "Memory per GPU in GiB: vLLM may use CUDA total × util; the KV cache gets what is left"]
    lines += _table(
        [
            "model",
            "GPU",
            "CUDA total",
            "util",
            "requested",
            "weights",
            "LoRA slots",
            "activation",
            "non-torch",
            "CUDA graphs",
            "KV cache",
            "KV B/token",
            "batch tokens",
        ],
        [
            [
                p.model,
                p.gpu_model,
                _gib(p.memory.cuda_total_bytes),
                f"{p.memory.requested_bytes / p.memory.cuda_total_bytes:.2f}",
                _gib(p.memory.requested_bytes),
                _gib(p.memory.weight_bytes),
                _gib(p.memory.lora_bytes),
                _gib(p.memory.activation_peak_bytes),
                _gib(p.memory.non_torch_bytes),
                _gib(p.memory.cudagraph_bytes),
                _gib(p.memory.kv_cache_bytes),
                f"{p.kv_cache_bytes_per_token:,}",
                f"{p.max_num_batched_tokens:,}",
            ]
            for p in models
        ],
        right=set(range(2, 13)),
    )
    phase_names = list(PHASES)
    lines += ["", "Startup budget in seconds (the serving unit's startupProbe allows `budget`)"]
    lines += _table(
        ["model", *phase_names, "expected", "safety", "budget"],
        [
            [
                p.model,
                *(f"{dict(p.startup.phases).get(name, 0):.0f}" for name in phase_names),
                f"{p.startup.expected_seconds:.0f}",
                f"x{p.startup.safety_factor:g}",
                str(p.startup_budget_seconds),
            ]
            for p in models
        ],
        right=set(range(1, len(phase_names) + 4)),
    )
    lines += ["", *_node_source_lines(models)]
    if plan.tenants:
        lines += ["", *_tenant_lines(plan)]
    for p in models:
        lines += ["", *_serving_lines(p.serving)]
        if p.wake.scales_to_zero:
            lines += ["", *_wake_lines(p.wake)]
    lines += _group_lines(models)
    for name, candidate in plan.candidates.items():
        lines += [
            f"  {name}: its canary's candidate runs in groups of its own beside the stable ones "
            f'(docs/multi-node.md, "Canary"): each holds {candidate.gpu_hours_per_day} GPU-hours a day, '
            f"{_gib(max(0, candidate.memory.kv_cache_bytes))} GiB of KV cache per GPU "
            f"({candidate.kv_cache.tokens:,} tokens per replica); {_status(candidate)}",
        ]
    if plan.alternatives:
        lines += [
            "",
            "The same models on the stack's other GPU groups (same gpus_per_replica), for comparison",
        ]
        lines += _table(
            ["model", "GPU group", "weights", "KV cache", "KV tokens", "at max_model_len", "status"],
            [
                [
                    p.model,
                    _placement(p),
                    f"{_gib(p.weight_bytes_per_gpu)} GiB",
                    f"{_gib(max(0, p.memory.kv_cache_bytes))} GiB",
                    f"{p.kv_cache.tokens:,}",
                    f"{_concurrency(p, p.kv_cache.max_concurrency)} of {p.max_model_len:,}",
                    _status(p),
                ]
                for p in plan.alternatives
            ],
            right={2, 3, 4, 5},
        )
    problems = [(p, problem) for p in [*models, *plan.alternatives] for problem in p.problems]
    if problems:
        lines += ["", "Why some cannot start"]
        for p, problem in problems:
            lines.append(f"  {p.model} on {p.gpu_group}: {problem.message}")
    return "\n".join(lines)


def _group_lines(models: Sequence[ModelPlan]) -> list[str]:
    """What a replica larger than one node needs (issue 42): its nodes and GPUs, how its parallelism
    splits them, how long a group takes to start, and what one group holds in a day."""
    groups = [p for p in models if p.nodes_per_replica > 1]
    if not groups:
        return []
    lines = ["", "Replicas larger than one node (LeaderWorkerSet groups; docs/multi-node.md)"]
    for p in groups:
        expected = round(p.startup.expected_seconds)
        rendezvous = dict(p.startup.phases).get("group_rendezvous", 0.0)
        split = f"tensor parallel {p.tensor_parallel_size} × pipeline {p.pipeline_parallel_size}"
        tokens = f"{p.kv_cache.tokens:,} tokens per replica"
        if p.data_parallel_size > 1:
            experts = ", experts spread over tensor × data ranks" if p.expert_parallel else ""
            split += f" × data {p.data_parallel_size}{experts}"
            tokens = (
                f"{p.kv_cache.tokens:,} tokens per data-parallel rank, each its own engine with "
                f"max_num_seqs {p.max_num_seqs}; {p.data_parallel_size * p.kv_cache.tokens:,} per replica"
            )
        lines += [
            f"  {p.model}: one replica is {p.nodes_per_replica} nodes of {p.gpus_per_node}× {p.gpu_model} "
            f"= {p.gpus_per_replica_total} GPUs, {split}; per GPU of the largest stage "
            f"{_gib(p.weight_bytes_per_gpu)} GiB of weights and {_gib(max(0, p.memory.kv_cache_bytes))} GiB "
            f"of KV cache ({tokens})",
            f"    a group starts in about {expected} s on cold nodes: its slowest member (members start "
            f"in parallel) plus {rendezvous:.0f} s of rendezvous; the leader's startupProbe allows "
            f"{p.startup_budget_seconds} s",
            f"    one warm group holds {p.gpu_hours_per_day} GPU-hours a day ({p.nodes_per_replica} nodes "
            "around the clock); a failed member recreates the whole group, which costs one group start",
        ]
    return lines


_SOURCES = {
    "stack": "tenants[].max_concurrent_requests",
    "default": "default: max_num_seqs x engines at the fewest replicas / tenants on the model",
    "none": "none: the only tenant on the model",
}


def _tenant_lines(plan: PlatformPlan) -> list[str]:
    """Each tenant's in-flight limit per model; past its share a pod answers 429."""
    lines = [
        "Tenants' sequences (prompts x n) in flight at once, per model (past its share, counted over "
        "all its API-server processes, a pod answers 429)"
    ]
    return lines + _table(
        ["model", "tenant", "limit", "per pod", "from"],
        [
            [
                row.model,
                row.tenant,
                "-" if row.max_concurrent_requests is None else str(row.max_concurrent_requests),
                "-" if row.per_pod is None else str(row.per_pod),
                _SOURCES[row.source],
            ]
            for row in plan.tenants
        ],
        right={2, 3},
    )


def _node_source_lines(models: Sequence[ModelPlan]) -> list[str]:
    """Where a new replica's node comes from, which types it may be, and how long it takes."""
    sources = [(p, p.node_source) for p in models if p.node_source is not None]
    lines = ["Where a new replica's node comes from (docs/autoscaling.md)"]
    lines += _table(
        [
            "model",
            "GPU group",
            "path",
            "instance types (GPUs)",
            "capacity types",
            "fits on",
            "GPU limit",
            "new node, s",
        ],
        [
            [
                p.model,
                p.gpu_group,
                source.path,
                ", ".join(f"{name} ({gpus})" for name, gpus in source.instance_types),
                " > ".join(source.capacity_types),
                f"all; worst case {source.worst_case}" if p.fits else "-",
                str(source.gpu_limit),
                f"{source.new_node_seconds:.0f}",
            ]
            for p, source in sources
        ],
        right={6, 7},
    )
    return lines


def _serving_lines(serving: ServingTimes) -> list[str]:
    """One table: the steps to a serving replica on a warm and on a new node, then the autoscaler's
    windows; the source of every number below it."""
    warm = {step.name: step for step in serving.warm_node.steps}
    new = {step.name: step for step in serving.new_node.steps}
    names = list(dict.fromkeys([*new, *warm]))
    names.sort(key=lambda name: ["signal", "node", "pod"].index((new.get(name) or warm[name]).stage))
    target = WARM_POD_READY_TARGET_SECONDS
    lines = [
        f"Time to a serving replica of {serving.model}, in seconds (measured start-up: "
        f"domain/catalogue/startup_timings.yaml; target: a pod on a warm node Ready <= {target} s)"
    ]
    rows = [
        [name, f"{warm[name].seconds:.0f}" if name in warm else "-", f"{new[name].seconds:.0f}"]
        for name in names
    ]
    rows += [
        [
            "= pod Ready (scheduled to Ready)",
            f"{serving.warm_node.pod_ready_seconds:.0f}",
            f"{serving.new_node.pod_ready_seconds:.0f}",
        ],
        [
            f"= serving, from {'the load rising' if serving.autoscaled else 'the replica being added'}",
            f"{serving.warm_node.seconds():.0f}",
            f"{serving.new_node.seconds():.0f}",
        ],
    ]
    rows += [[f"window: {window.name}", window.value, window.value] for window in serving.windows]
    lines += _table(["step", "warm node", "new node"], rows, right={1, 2})
    if serving.meets_target:
        lines.append(f"  a pod on a warm node is Ready within {target} s")
    else:
        ready = serving.warm_node.pod_ready_seconds
        lines.append(
            f"  NOT within {target} s on a warm node ({ready:.0f} s, {ready - target:.0f} s over); "
            "its time goes to " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in serving.blockers)
        )
    if serving.unlike_the_measurement:
        lines.append(f"  note: {serving.unlike_the_measurement}")
    lines.append(f"  sources ({serving.measured_on}):")
    for name in names:
        if name in warm and warm[name].source != new[name].source:
            lines.append(f"    {name}, warm node: {warm[name].source}")
            lines.append(f"    {name}, new node: {new[name].source}")
        else:
            lines.append(f"    {name}: {new[name].source}")
    lines += [f"    window {window.name}: {window.source}" for window in serving.windows]
    return lines


def _wake_lines(wake: WakePlan) -> list[str]:
    """A to-zero model: first request -> first token on a warm and on a new node, the router's hold,
    and what one warm replica would cost instead."""
    warm = {step.name: step for step in wake.warm_node}
    new = {step.name: step for step in wake.new_node}
    names = list(dict.fromkeys([*new, *warm]))
    names.sort(key=lambda name: ["signal", "node", "pod"].index((new.get(name) or warm[name]).stage))
    lines = [f"Wake of {wake.model} from zero replicas: its first request to its first token, in seconds"]
    rows = [
        [name, f"{warm[name].seconds:.0f}" if name in warm else "-", f"{new[name].seconds:.0f}"]
        for name in names
    ]
    rows.append(["= first token", f"{wake.seconds('warm_node'):.0f}", f"{wake.seconds('new_node'):.0f}"])
    lines += _table(["step", "warm node", "new node"], rows, right={1, 2})
    expected = wake.expected_case.replace("_", " ")
    why = (
        "its GPU group may be at zero nodes (min_size 0)"
        if wake.expected_case == "new_node"
        else ("its GPU group keeps nodes (min_size > 0)")
    )
    lines += [
        f"  expected: {expected} ({wake.expected_seconds:.0f} s), since {why}",
        f"  the router holds each request up to {wake.hold_seconds} s ({wake.hold_source}), then answers 503",
        f"  one replica kept warm instead (min_replicas 1): {wake.warm_replica_gpu_hours_per_day} "
        "GPU-hours a day",
    ]
    if wake.idle_group_gpu_hours_per_day:
        lines.append(
            f"  its GPU group's min_size alone keeps {wake.idle_group_gpu_hours_per_day} GPU-hours a day"
        )
    return lines


def _steps_json(steps: Iterable[Step]) -> list[dict[str, Any]]:
    return [
        {"name": s.name, "stage": s.stage, "seconds": round(s.seconds, 1), "source": s.source} for s in steps
    ]


def _wake_json(wake: WakePlan) -> dict[str, Any]:
    def case(name: Case) -> dict[str, Any]:
        steps = wake.warm_node if name == "warm_node" else wake.new_node
        return {"steps": _steps_json(steps), "first_token_seconds": round(wake.seconds(name), 1)}

    return {
        "scales_to_zero": wake.scales_to_zero,
        "warm_node": case("warm_node"),
        "new_node": case("new_node"),
        "expected_case": wake.expected_case,
        "hold_seconds": wake.hold_seconds,
        "hold_source": wake.hold_source,
        "warm_replica_gpu_hours_per_day": wake.warm_replica_gpu_hours_per_day,
        "idle_group_gpu_hours_per_day": wake.idle_group_gpu_hours_per_day,
    }


def _serving_json(serving: ServingTimes) -> dict[str, Any]:
    def case(steps: Any) -> dict[str, Any]:
        return {
            "steps": _steps_json(steps.steps),
            "pod_ready_seconds": round(steps.pod_ready_seconds, 1),
            "total_seconds": round(steps.seconds(), 1),
        }

    return {
        "measured_on": serving.measured_on,
        "unlike_the_measurement": serving.unlike_the_measurement,
        "warm_node": case(serving.warm_node),
        "new_node": case(serving.new_node),
        "warm_pod_ready_target_seconds": WARM_POD_READY_TARGET_SECONDS,
        "meets_target": serving.meets_target,
        "in_the_way": [{"name": name, "seconds": seconds} for name, seconds in serving.blockers],
        "autoscaler_windows": [
            {"name": w.name, "value": w.value, "source": w.source} for w in serving.windows
        ],
    }


def _model_json(plan: ModelPlan) -> dict[str, Any]:
    return {
        "model": plan.model,
        "gpu_group": plan.gpu_group,
        "gpu_model": plan.gpu_model,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "pipeline_parallel_size": plan.pipeline_parallel_size,
        "data_parallel_size": plan.data_parallel_size,
        "expert_parallel": plan.expert_parallel,
        "nodes_per_replica": plan.nodes_per_replica,
        "gpus_per_replica": plan.gpus_per_replica_total,
        "gpu_hours_per_day_per_replica": plan.gpu_hours_per_day,
        "fits": plan.fits,
        "parameters": int(plan.parameters),
        "memory_bytes_per_gpu": {
            "nvidia_smi_total": plan.memory.gpu_total_bytes,
            "cuda_total": plan.memory.cuda_total_bytes,
            "requested": plan.memory.requested_bytes,
            "weights": plan.memory.weight_bytes,
            "lora_slots": plan.memory.lora_bytes,
            "activation_peak": plan.memory.activation_peak_bytes,
            "non_torch": plan.memory.non_torch_bytes,
            "cuda_graphs": plan.memory.cudagraph_bytes,
            "kv_cache": plan.memory.kv_cache_bytes,
        },
        "lora_cpu_cache_bytes": plan.lora_cpu_cache_bytes,
        "kv_cache": {
            "bytes_per_token_per_gpu": plan.kv_cache_bytes_per_token,
            "block_size_tokens": plan.kv_cache.block_size_tokens,
            "page_bytes_per_layer": plan.kv_cache.page_bytes_per_layer,
            "num_blocks": plan.kv_cache.num_blocks,
            "tokens": plan.kv_cache.tokens,
        },
        "concurrency": {
            "max_model_len": plan.max_model_len,
            "requests_at_max_model_len": round(plan.kv_cache.max_concurrency, 2),
            "typical_request_tokens": plan.typical_request_tokens,
            "requests_at_typical_length": round(plan.typical_concurrency, 2),
            "max_num_seqs": plan.max_num_seqs,
            "max_num_seqs_reachable": plan.max_num_seqs_reachable,
            "max_num_batched_tokens": plan.max_num_batched_tokens,
        },
        "startup": {
            "phases_seconds": {name: round(seconds, 1) for name, seconds in plan.startup.phases},
            "expected_seconds": round(plan.startup.expected_seconds, 1),
            "safety_factor": plan.startup.safety_factor,
            "budget_seconds": plan.startup_budget_seconds,
        },
        "node_source": (
            {
                "provisioner": plan.node_source.provisioner,
                "path": plan.node_source.path,
                "instance_types": {name: gpus for name, gpus in plan.node_source.instance_types},
                "capacity_types": list(plan.node_source.capacity_types),
                "worst_case_instance_type": plan.node_source.worst_case,
                "gpu_limit": plan.node_source.gpu_limit,
                "new_node_seconds": round(plan.node_source.new_node_seconds, 1),
            }
            if plan.node_source is not None
            else None
        ),
        "time_to_serve": _serving_json(plan.serving),
        "wake_from_zero": _wake_json(plan.wake),
        "problems": [
            {"at": list(problem.at), "value": problem.value, "message": problem.message}
            for problem in plan.problems
        ],
    }


def plan_as_json(plan: PlatformPlan) -> dict[str, Any]:
    return {
        "vllm_version": VLLM_VERSION,
        "assumptions": {
            "driver_reserved_bytes": memory.DRIVER_RESERVED_BYTES,
            "non_torch_increase_bytes": memory.NON_TORCH_INCREASE_BYTES,
            "block_size_tokens": memory.BLOCK_SIZE_TOKENS,
        },
        "models": {name: _model_json(model_plan) for name, model_plan in plan.models.items()},
        "alternatives": [_model_json(model_plan) for model_plan in plan.alternatives],
        "candidates": {name: _model_json(model_plan) for name, model_plan in plan.candidates.items()},
        "tenants": [
            {
                "model": row.model,
                "tenant": row.tenant,
                "max_concurrent_requests": row.max_concurrent_requests,
                "per_pod": row.per_pod,
                "source": row.source,
            }
            for row in plan.tenants
        ],
    }
