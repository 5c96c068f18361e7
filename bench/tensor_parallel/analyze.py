"""GPU results of the tensor-parallel check next to the capacity planner's predictions.

    .venv/bin/python -m bench.tensor_parallel.analyze     # raw/*.json -> results/{RESULTS.md,results.json}

Raw files are copies of run.py's `$OUT/tp.json`, one per GPU command under any name (e.g.
raw/tp2.json and raw/tp1.json); a variant measured twice keeps its completed, later run.

Predictions come from the planner itself (`infra.capacity.plan_platform`) on the prod stack: the
TP=2 model, and a TP=1 variant of it (gpus_per_replica 1, nothing else changed), each on the prod
GPU group whose GPU the lab has (H200) — the lab measures the same settings on the same GPU model —
and on the model's own group (L40S) for reference. The report gives the % difference of vLLM's
logged `GPU KV cache size`, `Available KV cache memory` and `Model loading took` from the plan, and
the load run's throughput and latencies at C = 64 for both.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.serving.vllm_log import parse_log
from bench.tensor_parallel.prepare import (
    LAB_DIAGNOSES,
    LAB_GPU_GROUP,
    MODEL,
    PLAN_FILE,
    STACK,
    VARIANTS,
    _with_size,
)

HERE = Path(__file__).resolve().parent
RAW_DIR = HERE / "raw"
RESULTS_DIR = HERE / "results"
TOLERANCE_PCT = 3.0
"""How close the planner must come to vLLM's KV-cache size (tests/test_capacity_observations.py)."""
GIB = 1 << 30


class NoResultsError(RuntimeError):
    pass


# --- inputs -----------------------------------------------------------------------------------------


def read_raw(raw_dir: Path, allow_rehearsal: bool = False) -> list[tuple[Path, dict[str, Any]]]:
    """The run.py results in `raw_dir` (files with `runs`), each read once; rehearsals refused."""
    documents = []
    for path in sorted(raw_dir.glob("*.json")):
        document = json.loads(path.read_text())
        if "runs" not in document:
            continue
        if document.get("mode") != "gpu" and not allow_rehearsal:
            raise NoResultsError(f"{path} is a {document.get('mode')} rehearsal, not a GPU run; remove it")
        documents.append((path, document))
    return documents


def load_runs(raw_dir: Path, allow_rehearsal: bool = False) -> dict[str, dict[str, Any]]:
    """Variant -> its record from the raw files, with the file's host facts under `host`."""
    return best_runs(read_raw(raw_dir, allow_rehearsal))


def best_runs(documents: list[tuple[Path, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Variant -> its completed, later record (`_better`), with the file's host facts under `host`."""
    runs: dict[str, dict[str, Any]] = {}
    for path, document in documents:
        host = {
            "file": path.name,
            "started_at": document.get("started_at"),
            "mode": document.get("mode"),
            "gpus": document.get("gpus"),
            "software": document.get("software"),
        }
        for name, record in document["runs"].items():
            candidate = {**record, "host": host}
            held = runs.get(name)
            if held is None or _better(candidate, held):
                runs[name] = candidate
    return runs


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    new_done, old_done = new.get("status") == "completed", old.get("status") == "completed"
    if new_done != old_done:
        return new_done
    return str(new["host"].get("started_at")) >= str(old["host"].get("started_at"))


_LAB_MILESTONE = re.compile(r"\+\s*[\d.]+s\] (?P<variant>[\w-]+): (?P<name>\w+) = \S+ at (?P<at>[\d.]+) s$")
_LAB_STALL_STEP = re.compile(r"(?P<variant>[\w-]+): .*(stall|no health)", re.IGNORECASE)


def failed_attempts(documents: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every start in the raw files that did not complete, oldest first, with what it reached.

    Milestones come from the record (`milestones_s`) or, for runs whose record kept none, from the
    lab log beside the file (`<stem>-lab.log`: run.py's progress lines, "tp2: torch_compile_s = 21.47
    at 116.2 s"). The error is cut to its first line and the lines that name the failure
    (`what():`, `Exception raised from`), not the whole traceback.
    """
    attempts = []
    for path, document in documents:
        for name, record in document["runs"].items():
            if record.get("status") == "completed":
                continue
            milestones = dict(record.get("milestones_s") or {})
            lab_log = path.with_name(f"{path.stem}-lab.log")
            if not milestones and lab_log.exists():
                for line in lab_log.read_text(errors="replace").splitlines():
                    match = _LAB_MILESTONE.search(line.strip())
                    if match and match["variant"] == name:
                        milestones.setdefault(match["name"], float(match["at"]))
            facts = dict(record.get("log_facts") or {})
            server_log = path.with_name(f"{path.stem}-server-log.txt.gz")
            if server_log.exists():  # runs from before run.py kept log_facts
                with gzip.open(server_log, "rt", errors="replace") as lines:
                    facts = {**parse_log(lines), **facts}
            error = str(record.get("error") or "")
            error_lines = error.splitlines()
            named = [
                line.strip().removesuffix(" (most recent call first):")
                for line in error_lines[1:]
                if line.strip().startswith(("what():", "Exception raised from"))
            ]
            attempts.append(
                {
                    "file": path.name,
                    "variant": name,
                    "started_at": document.get("started_at"),
                    "status": record.get("status"),
                    "budget_s": document.get("budget_s"),
                    "error": error_lines[0] if error_lines else None,
                    "error_detail": named,
                    "milestones_s": milestones,
                    "stall": record.get("stall"),
                    "env_runner": record.get("env_runner"),
                    "command": record.get("command"),
                    "raised_at_exit": "Py_FinalizeEx" in error,
                    "worker_error": facts.get("worker_failed"),
                    "allreduce_backend": facts.get("flashinfer_allreduce_backend"),
                }
            )
    return sorted(attempts, key=lambda attempt: str(attempt["started_at"]))


# --- predictions -----------------------------------------------------------------------------------


def plan_summary(plan: Any) -> dict[str, Any]:
    """The planner's numbers for one model on one GPU group, in the units vLLM logs them."""
    memory = plan.memory
    return {
        "gpu_group": plan.gpu_group,
        "gpu_model": plan.gpu_model,
        "tensor_parallel_size": plan.tensor_parallel_size,
        "weights_gib_per_gpu": round(memory.weight_bytes / GIB, 3),
        "activation_peak_gib": round(memory.activation_peak_bytes / GIB, 3),
        "non_torch_gib": round(memory.non_torch_bytes / GIB, 3),
        "cuda_graphs_gib": round(memory.cudagraph_bytes / GIB, 3),
        "requested_gib": round(memory.requested_bytes / GIB, 3),
        "available_kv_cache_gib_per_gpu": round(memory.kv_cache_bytes / GIB, 3),
        "kv_bytes_per_token_per_gpu": plan.kv_cache_bytes_per_token,
        "kv_cache_tokens": plan.kv_cache.tokens,
        "max_concurrency": round(plan.kv_cache.max_concurrency, 2),
        "typical_concurrency": round(plan.typical_concurrency, 1),
        "max_model_len": plan.max_model_len,
        "max_num_seqs": plan.max_num_seqs,
        "max_num_batched_tokens": plan.max_num_batched_tokens,
        "fits": plan.fits,
        # What a cold start to /health covers in the lab (dummy weights: no image pull, copy or read).
        "engine_start_and_compile_s": sum(
            seconds
            for phase, seconds in plan.startup.phases
            if phase in ("engine_start", "compile", "allreduce_jit")
        ),
        "startup_budget_s": plan.startup_budget_seconds,
    }


def predictions(stack: str = STACK, model: str = MODEL, lab_group: str = LAB_GPU_GROUP) -> dict[str, Any]:
    """Variant -> {"lab": plan on the lab's GPU group, "own_group": plan on the model's own group}."""
    from infra.capacity import plan_platform
    from infra.stack_checks import load_stack

    config = load_stack(stack)
    result: dict[str, Any] = {}
    for name, size in VARIANTS.items():
        variant_config, variant = _with_size(config, model, size)
        platform = plan_platform(variant_config)
        plans = [platform.models[model], *(p for p in platform.alternatives if p.model == model)]
        lab = next((p for p in plans if p.gpu_group == lab_group), None)
        if lab is None:
            raise LookupError(f"the {stack} stack has no GPU group '{lab_group}' to plan {model} on")
        result[name] = {
            "lab": plan_summary(lab),
            "own_group": plan_summary(platform.models[model]),
            "gpu_memory_utilization": variant.vllm.gpu_memory_utilization,
        }
    return result


# --- comparison ------------------------------------------------------------------------------------


def percent_difference(observed: float | None, predicted: float | None) -> float | None:
    """(observed - predicted) / predicted, in percent; None when either is missing."""
    if observed is None or not predicted:
        return None
    return round((observed - predicted) / predicted * 100, 2)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else round(numerator / denominator, 3)


def observed_numbers(record: dict[str, Any]) -> dict[str, Any]:
    kv = record.get("kv_cache") or {}
    weights = kv.get("weights_gib_per_gpu") or []
    available = kv.get("available_kv_cache_gib_per_gpu") or []
    load = record.get("load") or {}
    tp = record.get("tensor_parallel_size") or 1
    output = load.get("output_throughput_tok_s")
    return {
        "status": record.get("status"),
        "tensor_parallel_size": tp,
        "time_to_health_s": record.get("time_to_health_s"),
        "compile_cache": record.get("compile_cache"),
        "kv_cache_tokens": kv.get("kv_cache_tokens"),
        "max_concurrency": kv.get("max_concurrency"),
        "max_concurrency_tokens": kv.get("max_concurrency_tokens"),
        # vLLM sizes the KV cache for the worker with the least room; weights are the largest share.
        "available_kv_cache_gib_per_gpu": min(available) if available else None,
        "weights_gib_per_gpu": max(weights) if weights else None,
        "workers_reporting": max(len(weights), len(available)),
        "load": {
            "concurrency": load.get("concurrency"),
            "completed": load.get("completed"),
            "failed": load.get("failed"),
            "output_tok_s": output,
            "output_tok_s_per_gpu": None if output is None else round(output / tp, 1),
            "total_tok_s": load.get("total_throughput_tok_s"),
            "ttft_ms": load.get("ttft_ms"),
            "tpot_ms": load.get("tpot_ms"),
            "gpu": load.get("gpu"),
            "skipped": load.get("skipped"),
        }
        if load
        else None,
        "error": record.get("error"),
    }


def compare(
    runs: dict[str, dict[str, Any]], predicted: dict[str, Any], plan: dict[str, Any] | None = None
) -> dict[str, Any]:
    variants: dict[str, Any] = {}
    # A lab diagnosis (tp2 with one all-reduce path changed) has tp2's prediction: the planner does not
    # model the all-reduce buffers, and every other setting is the same.
    names = [*VARIANTS, *(d.name for d in LAB_DIAGNOSES if d.name in runs)]
    for name in names:
        lab = predicted[name if name in VARIANTS else "tp2"]["lab"]
        record = runs.get(name)
        own_group = predicted[name if name in VARIANTS else "tp2"]["own_group"]
        entry: dict[str, Any] = {"predicted": lab, "predicted_own_group": own_group}
        if record is None:
            entry["observed"] = None
            variants[name] = entry
            continue
        observed = observed_numbers(record)
        entry["observed"] = observed
        entry["difference_pct"] = {
            "kv_cache_tokens": percent_difference(observed["kv_cache_tokens"], lab["kv_cache_tokens"]),
            "available_kv_cache_gib_per_gpu": percent_difference(
                observed["available_kv_cache_gib_per_gpu"], lab["available_kv_cache_gib_per_gpu"]
            ),
            "weights_gib_per_gpu": percent_difference(
                observed["weights_gib_per_gpu"], lab["weights_gib_per_gpu"]
            ),
        }
        tokens_diff = entry["difference_pct"]["kv_cache_tokens"]
        entry["kv_cache_tokens_within_tolerance"] = (
            None if tokens_diff is None else abs(tokens_diff) <= TOLERANCE_PCT
        )
        if plan is not None and record.get("command"):
            serve_args = plan["variants"][name]["serve_args"]
            entry["measured_current_plan"] = record["command"][-len(serve_args) :] == serve_args
        variants[name] = entry
    # TP=2 is the stack's own arguments when they started; a lab diagnosis stands in only when not.
    tp2_source = "tp2"
    if not _completed(variants["tp2"]):
        tp2_source = next(
            (d.name for d in LAB_DIAGNOSES if _completed(variants.get(d.name) or {})), "tp2"
        )
    tp2, tp1 = variants[tp2_source], variants["tp1"]
    observed_tp2, observed_tp1 = tp2.get("observed") or {}, tp1.get("observed") or {}
    load2, load1 = observed_tp2.get("load") or {}, observed_tp1.get("load") or {}
    ratios = {
        "kv_cache_tokens_observed": _ratio(
            observed_tp2.get("kv_cache_tokens"), observed_tp1.get("kv_cache_tokens")
        ),
        "kv_cache_tokens_predicted": _ratio(
            tp2["predicted"]["kv_cache_tokens"], tp1["predicted"]["kv_cache_tokens"]
        ),
        "output_tok_s_per_replica": _ratio(load2.get("output_tok_s"), load1.get("output_tok_s")),
        "output_tok_s_per_gpu": _ratio(load2.get("output_tok_s_per_gpu"), load1.get("output_tok_s_per_gpu")),
        "tpot_mean": _ratio(
            (load2.get("tpot_ms") or {}).get("mean"), (load1.get("tpot_ms") or {}).get("mean")
        ),
    }
    return {"variants": variants, "tp2_source": tp2_source, "tp2_over_tp1": ratios}


def _diagnosis_changes(name: str) -> str:
    """A lab diagnosis's changes to tp2, as the report names them."""
    diagnosis = next(d for d in LAB_DIAGNOSES if d.name == name)
    changes = [f"`{' '.join(tokens)}`" for tokens, _ in diagnosis.flags]
    changes += [f"`{env}={value}`" for env, value, _ in diagnosis.env]
    return " and ".join(changes)


def _completed(entry: dict[str, Any]) -> bool:
    return (entry.get("observed") or {}).get("status") == "completed"


def capacity_observations(runs: dict[str, dict[str, Any]], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Entries in the format of tests/data/kv_cache_observations.json, to fold into it (README)."""
    entries = []
    for name, record in sorted(runs.items()):
        kv = record.get("kv_cache") or {}
        if kv.get("kv_cache_tokens") is None:
            continue
        args = plan["variants"][name]["serve_args"]

        def value(flag: str, args: list[str] = args) -> str:
            return args[args.index(flag) + 1]

        available = kv.get("available_kv_cache_gib_per_gpu") or []
        weights = kv.get("weights_gib_per_gpu") or []
        entries.append(
            {
                "name": f"tensor-parallel-{name}",
                "preset": "qwen2.5-7b",
                "tensor_parallel_size": record["tensor_parallel_size"],
                "settings": {
                    "gpu_memory_utilization": float(value("--gpu-memory-utilization")),
                    "max_model_len": int(value("--max-model-len")),
                    "max_num_seqs": int(value("--max-num-seqs")),
                    "kv_cache_dtype": value("--kv-cache-dtype"),
                    "extra_args": [
                        a for a in args if a in ("--enable-prefix-caching", "--no-enable-prefix-caching")
                    ],
                },
                "command": record.get("command"),
                "outcome": "ok",
                "weights_gib": max(weights) if weights else None,
                "available_kv_cache_gib": min(available) if available else None,
                "kv_cache_tokens": kv["kv_cache_tokens"],
                "max_concurrency": kv.get("max_concurrency"),
                "max_concurrency_tokens": kv.get("max_concurrency_tokens"),
            }
        )
    return entries


# --- report ------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1, suffix: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}{suffix}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{suffix}"
    return f"{value}{suffix}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f} %"


def _display(path: Path) -> str:
    """The path relative to the repository when inside it (reports must not name a developer's home)."""
    try:
        return str(path.resolve().relative_to(HERE.parents[1])) + "/"
    except ValueError:
        return str(path) + "/"


def _row(label: str, tp2: str, tp1: str) -> str:
    return f"| {label} | {tp2} | {tp1} |"


def _quoted(message: str) -> str:
    """A log message inside a Markdown code span: its own backticks become quotes."""
    return message.replace("`", "'")


def render_failed_starts(
    failed: list[dict[str, Any]],
    completed: dict[str, dict[str, float]],
    completed_backends: dict[str, str | None] | None = None,
) -> list[str]:
    """Each start that did not reach /health: how far it got, then the silence, and how it ended."""
    if not failed:
        return []
    lines = [
        "",
        "## Starts that did not reach /health",
        "",
        "| file | variant | fused all-reduce backend (log) | reached (s after launch) | then | ended |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for attempt in failed:
        milestones = attempt["milestones_s"]
        reached = ", ".join(
            f"{name} {at:.0f}" for name, at in sorted(milestones.items(), key=lambda kv: kv[1])
        )
        last = max(milestones.values(), default=None)
        stall = attempt.get("stall") or {}
        if stall.get("worker_error"):
            then = (
                f"a worker failed at {stall.get('milestone_at_s', '?')} s"
                f" (`{_quoted(stall['worker_error'])}`); the server still ran"
                f" {stall.get('waited_s', '?')} s later"
            )
        elif stall:
            waited, after = stall.get("waited_s", "?"), stall.get("after_milestone")
            then = f"stalled: no KV-cache line {waited} s after {after}"
            if attempt.get("worker_error"):
                failed_at = milestones.get("worker_failed")
                then += (
                    f"; its log: a worker failed{f' at {failed_at:.0f} s' if failed_at else ''}"
                    f" (`{_quoted(attempt['worker_error'])}`) and the server did not exit"
                )
        elif last is not None:
            then = "no further milestone until the health timeout"
        else:
            then = "–"
        ended = "; ".join([attempt["error"] or attempt["status"] or "?", *attempt["error_detail"]])
        backend = attempt.get("allreduce_backend") or "–"
        lines.append(
            f"| {attempt['file']} | {attempt['variant']} | {backend} | {reached or '–'} | {then} | {ended} |"
        )
    if any(attempt["raised_at_exit"] for attempt in failed):
        lines += [
            "",
            "The CUDA error in the last column was raised while the server's worker processes exited"
            " (`Py_FinalizeEx` in its traceback). It is in the log tail read when the start was declared"
            " failed, before the runner stopped anything: the workers were exiting on their own, after"
            " whatever stopped the start's progress.",
        ]
    for name, milestones in completed.items():
        if "torch_compile_s" in milestones and "kv_cache_tokens" in milestones:
            lines += [
                "",
                f"For comparison, {name} logged its KV-cache size "
                f"{milestones['kv_cache_tokens'] - milestones['torch_compile_s']:.0f} s after torch.compile"
                f" ended ({milestones['torch_compile_s']:.0f} s → {milestones['kv_cache_tokens']:.0f} s).",
            ]
    # What changed between the failed starts and a completed one of the same variant: the backend.
    for name, backend in (completed_backends or {}).items():
        tried = {a["allreduce_backend"] for a in failed if a["variant"].startswith(name)}
        failed_with = sorted(tried - {backend, None})
        if backend and failed_with:
            lines += [
                "",
                f"{name} completed with the fused all-reduce backend `{backend}`; every start above that"
                f" logged its backend used `{'`, `'.join(failed_with)}` and failed in its first forward pass"
                " (docs/tensor-parallel.md says why the stack sets the backend).",
            ]
    return lines


def render_markdown(results: dict[str, Any]) -> str:
    comparison = results["comparison"]
    v = comparison["variants"]
    tp2_source = comparison.get("tp2_source", "tp2")
    tp2, tp1 = v[tp2_source], v["tp1"]
    o2, o1 = tp2.get("observed") or {}, tp1.get("observed") or {}
    p2, p1 = tp2["predicted"], tp1["predicted"]
    d2, d1 = tp2.get("difference_pct") or {}, tp1.get("difference_pct") or {}
    host = results["host"]
    gpus = ", ".join(sorted({g["name"] for g in host.get("gpus") or []})) or "the lab GPUs"
    software = host.get("software") or {}
    utilization = results["predictions"]["tp2"]["gpu_memory_utilization"]

    def both(key: str, digits: int = 1, source: str = "observed", suffix: str = "") -> tuple[str, str]:
        first, second = (o2, o1) if source == "observed" else (p2, p1)
        return _fmt(first.get(key), digits, suffix), _fmt(second.get(key), digits, suffix)

    def diffs(key: str) -> tuple[str, str]:
        return _pct(d2.get(key)), _pct(d1.get(key))

    lines = [
        f"# Tensor parallelism: `{results['model']}` at TP=2 and TP=1 on the lab {p2['gpu_model']}",
        "",
        f"Generated by `bench/tensor_parallel/analyze.py` from `{results['raw_dir']}` "
        f"({', '.join(results['raw_files']) or 'no files'}); measured on {gpus} with vLLM "
        f"{software.get('vllm', '?')} and torch {software.get('torch', '?')} (the stack pins vLLM "
        f"{results['stack_vllm_version']}). Both servers ran the arguments and environment the "
        f"`{results['stack']}` stack renders (`plan.json`: TP=2 from the rendered Deployment, TP=1 from "
        "the same container builder at `gpus_per_replica: 1`), on the Qwen2.5-7B shape with random "
        "weights (`--load-format dummy`), a cold compile cache, and NVLink multicast off "
        "(`NCCL_NVLS_ENABLE=0`, `TORCH_SYMM_MEM_DISABLE_MULTICAST=1`, `NVSHMEM_DISABLE_NVLS=1`).",
        "",
        "Predictions: the capacity planner (`plan_platform`) for the prod stack's model on its "
        f"`{p2['gpu_group']}` group ({p2['gpu_model']}, the lab's GPU model) at the same settings "
        f"(gpu_memory_utilization {utilization:g}, max_model_len {p2['max_model_len']}, max_num_seqs "
        f"{p2['max_num_seqs']}, max_num_batched_tokens {p2['max_num_batched_tokens']}). "
        "Difference = (vLLM − planner) / planner; the planner's tolerance for the KV-cache size is "
        f"{TOLERANCE_PCT:g} %.",
        "",
        *(
            [
                f"**The TP=2 columns are the lab diagnosis `{tp2_source}`**: the stack's TP=2 arguments and"
                f" environment plus {_diagnosis_changes(tp2_source)}, because the stack's own TP=2 start"
                ' did not reach `/health` ("Starts that did not reach /health" below).',
                "",
            ]
            if tp2_source != "tp2"
            else []
        ),
        "## KV cache and weights per GPU",
        "",
        _row("", "TP=2", "TP=1"),
        _row("---", "---:", "---:"),
        _row("`GPU KV cache size`, vLLM (tokens)", *both("kv_cache_tokens")),
        _row("planner (tokens)", *both("kv_cache_tokens", source="predicted")),
        _row("difference", *diffs("kv_cache_tokens")),
        _row(
            f"within {TOLERANCE_PCT:g} %",
            _fmt(tp2.get("kv_cache_tokens_within_tolerance")),
            _fmt(tp1.get("kv_cache_tokens_within_tolerance")),
        ),
        _row(
            "`Available KV cache memory` per GPU, vLLM (GiB; least of the workers)",
            *both("available_kv_cache_gib_per_gpu", 2),
        ),
        _row("planner (GiB)", *both("available_kv_cache_gib_per_gpu", 2, source="predicted")),
        _row("difference", *diffs("available_kv_cache_gib_per_gpu")),
        _row("`Model loading took` per GPU, vLLM (GiB)", *both("weights_gib_per_gpu", 2)),
        _row("planner (GiB)", *both("weights_gib_per_gpu", 2, source="predicted")),
        _row("difference", *diffs("weights_gib_per_gpu")),
        _row("KV bytes per token per GPU, planner", *both("kv_bytes_per_token_per_gpu", source="predicted")),
        _row(f"max concurrency at {p2['max_model_len']:,} tokens, vLLM", *both("max_concurrency", 2)),
        _row("planner", *both("max_concurrency", 2, source="predicted")),
        _row("workers that logged their memory", *both("workers_reporting")),
        "",
    ]
    ratios = comparison["tp2_over_tp1"]
    lines += [
        f"TP=2 over TP=1, KV-cache tokens per replica: vLLM {_fmt(ratios['kv_cache_tokens_observed'], 2)}×, "
        f"planner {_fmt(ratios['kv_cache_tokens_predicted'], 2)}×. The planner expects more than 2×: "
        "each GPU holds half the weights and half the KV heads (Qwen2.5-7B's 4 KV heads → 2 per GPU), "
        "so the memory the split weights free also goes to the cache; only the replicated parts "
        "(norms, the rotary table) and the activations of the sampler (full vocabulary on every GPU) "
        "do not shrink.",
        "",
    ]
    l2, l1 = o2.get("load") or {}, o1.get("load") or {}
    workload = results["workload"]

    def load_pair(key: str, digits: int = 0) -> tuple[str, str]:
        return _fmt(l2.get(key), digits), _fmt(l1.get(key), digits)

    def latency(key: str) -> tuple[str, str]:
        def one(load: dict[str, Any]) -> str:
            stats = load.get(key) or {}
            return f"{_fmt(stats.get('mean'), 1, ' ms')} / {_fmt(stats.get('p99'), 1, ' ms')}"

        return one(l2), one(l1)

    lines += [
        f"## Serving at C = {workload['concurrency']} ({workload['input_len']} prompt + "
        f"{workload['output_len']} forced output tokens, {workload['num_prompts']} requests)",
        "",
        _row("", "TP=2 (2 GPUs)", "TP=1 (1 GPU)"),
        _row("---", "---:", "---:"),
        _row(
            "time to `/health`, cold compile cache",
            _fmt(o2.get("time_to_health_s"), 0, " s"),
            _fmt(o1.get("time_to_health_s"), 0, " s"),
        ),
        _row(
            "planner: engine start + compile + all-reduce JIT at TP > 1 (cold; the startupProbe adds pull,"
            " copy, load, ×1.5)",
            *both("engine_start_and_compile_s", 0, source="predicted", suffix=" s"),
        ),
        _row(
            "requests completed / failed",
            f"{_fmt(l2.get('completed'))} / {_fmt(l2.get('failed'))}",
            f"{_fmt(l1.get('completed'))} / {_fmt(l1.get('failed'))}",
        ),
        _row("output tokens/s per replica", *load_pair("output_tok_s")),
        _row("output tokens/s per GPU", *load_pair("output_tok_s_per_gpu")),
        _row("TTFT mean / p99", *latency("ttft_ms")),
        _row("TPOT mean / p99", *latency("tpot_ms")),
        "",
        f"TP=2 over TP=1: {_fmt(ratios['output_tok_s_per_replica'], 2)}× the output tokens/s per "
        f"replica, {_fmt(ratios['output_tok_s_per_gpu'], 2)}× per GPU, {_fmt(ratios['tpot_mean'], 2)}× "
        "the mean TPOT.",
        "",
    ]
    for name, entry in v.items():
        observed = entry.get("observed")
        if observed is None:
            lines.append(f"- {name}: not measured (no raw file has it).")
        elif observed.get("status") != "completed" or observed.get("error"):
            headline = str(observed.get("error") or "").splitlines()[:1]
            lines.append(
                f"- {name}: {observed.get('status')}; {headline[0] if headline else ''}".rstrip("; ")
                + ' ("Starts that did not reach /health" below).'
            )
        if entry.get("measured_current_plan") is False:
            lines.append(f"- {name}: measured with other arguments than the current plan.json (re-run it).")
    lines += render_failed_starts(
        results.get("failed_starts") or [],
        results.get("completed_milestones_s") or {},
        results.get("completed_allreduce_backends") or {},
    )
    own2, own1 = tp2["predicted_own_group"], tp1["predicted_own_group"]

    def own(key: str, digits: int = 1) -> tuple[str, str]:
        return _fmt(own2[key], digits), _fmt(own1[key], digits)

    lines += [
        "",
        f"## The planner on the model's own group ({own2['gpu_group']}, {own2['gpu_model']})",
        "",
        _row("", "TP=2", "TP=1"),
        _row("---", "---:", "---:"),
        _row("weights per GPU (GiB)", *own("weights_gib_per_gpu", 2)),
        _row("KV cache per GPU (GiB)", *own("available_kv_cache_gib_per_gpu", 2)),
        _row("KV-cache tokens per replica", *own("kv_cache_tokens")),
        _row(f"requests of {own2['max_model_len']:,} tokens at once", *own("max_concurrency")),
        _row(f"typical requests at once (max_num_seqs {own2['max_num_seqs']})", *own("typical_concurrency")),
        "",
        "## Re-running",
        "",
        'docs/tensor-parallel.md, "Re-running the GPU check"; the raw files are in `raw/`, the numbers '
        "above in `results.json` (with `capacity_observations` in the format of "
        "tests/data/kv_cache_observations.json).",
        "",
    ]
    return "\n".join(lines)


def analyze(
    raw_dir: Path = RAW_DIR, plan_file: Path = PLAN_FILE, allow_rehearsal: bool = False
) -> dict[str, Any]:
    documents = read_raw(raw_dir, allow_rehearsal)
    runs = best_runs(documents)
    if not runs:
        raise NoResultsError(
            f"no run.py results in {raw_dir}: copy each GPU command's $OUT/tp.json there "
            "(docs/tensor-parallel.md)"
        )
    plan = json.loads(plan_file.read_text())
    predicted = predictions()
    first = next(iter(runs.values()))["host"]
    return {
        "generated_by": "bench/tensor_parallel/analyze.py",
        "stack": plan["stack"],
        "model": plan["model"],
        "stack_vllm_version": plan["stack_vllm_version"],
        "lab_vllm_version": plan["lab_vllm_version"],
        "workload": plan["workload"],
        "raw_dir": _display(raw_dir),
        "raw_files": sorted({run["host"]["file"] for run in runs.values()}),
        "host": first,
        "tolerance_pct": TOLERANCE_PCT,
        "predictions": predicted,
        "comparison": compare(runs, predicted, plan),
        "capacity_observations": capacity_observations(runs, plan),
        "failed_starts": failed_attempts(documents),
        "completed_milestones_s": {
            name: run.get("milestones_s") or {}
            for name, run in runs.items()
            if run.get("status") == "completed"
        },
        "completed_allreduce_backends": {
            name: (run.get("log_facts") or {}).get("flashinfer_allreduce_backend")
            for name, run in runs.items()
            if run.get("status") == "completed"
        },
    }


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--raw", type=Path, default=RAW_DIR)
    cli.add_argument("--results", type=Path, default=RESULTS_DIR)
    cli.add_argument("--plan", type=Path, default=PLAN_FILE)
    cli.add_argument(
        "--allow-rehearsal",
        action="store_true",
        help="accept CPU/fake rehearsal files (never for committed results)",
    )
    args = cli.parse_args(argv)
    try:
        results = analyze(args.raw, args.plan, allow_rehearsal=args.allow_rehearsal)
    except NoResultsError as error:
        print(f"analyze: {error}", file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (args.results / "RESULTS.md").write_text(render_markdown(results))
    print(f"wrote {args.results / 'RESULTS.md'} and results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
