"""The LoRA report (issue 25, item 7) from one lab session's raw files and server logs.

    .venv/bin/python -m bench.lora.report bench/serving/raw/2026-12-02 bench/startup/raw/2026-12-02

Reads the client results of the `profile-lora` servers (`profile-lora-s<k>-c256-a<N>.json`: the k-th
fresh LoRA server of the session with N adapters in use) and of the same session's `profile` servers
(`profile-s<k>-c256.json`: the base model alone, no `--enable-lora`), session.json (seeds, host load)
and the servers' gzipped logs (`<label>-server.log.gz`, read by bench/capacity/vllm_log.py). Writes
bench/lora/RESULTS.md: output tokens/s and p99 TTFT at 256 concurrent per number of adapters in use,
against the base model; and what `--enable-lora` costs in GPU memory, against domain/capacity/lora.py.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path
from typing import Any

from bench.capacity.vllm_log import parse_vllm_log
from bench.serving import report as serving
from domain.architecture import ModelShape
from domain.capacity.lora import lora_gpu_bytes
from domain.catalogue.model_shapes import lookup_preset

HERE = Path(__file__).resolve().parent
LORA_CONFIG = "profile-lora"
BASE_CONFIG = "profile"
LEVEL = 256
ADAPTERS_IN_USE = (0, 1, 4, 16)
EXPECTED_SERVERS = 3
"""Fresh servers per configuration the session plans (issue 27's bar); fewer are reported, and said."""
PRESET = "llama-3.1-8b"
LORA_NAME = re.compile(r"^(?P<config>.+)-s(?P<server>\d+)-c(?P<level>\d+)-a(?P<adapters>\d+)\.json$")
MEMORY_KEYS = (
    ("weights_gib", "Model loading took (GiB)"),
    ("available_kv_cache_gib", "Available KV cache memory (GiB)"),
    ("kv_cache_tokens", "GPU KV cache size (tokens)"),
)
GIB = 2**30
BASE_ROW = f"base model alone ({BASE_CONFIG}, no --enable-lora)"


def load_lora(raw: Path) -> dict[int, list[dict[str, Any]]]:
    """adapters in use -> the LoRA servers' results at 256 (server order)."""
    found: list[tuple[int, int, dict[str, Any]]] = []
    for path in raw.glob(f"{LORA_CONFIG}-s*-c{LEVEL}-a*.json"):
        match = LORA_NAME.match(path.name)
        if not match or match["config"] != LORA_CONFIG:
            continue
        result = json.loads(path.read_text())
        adapters = int(match["adapters"])
        if "lab_adapters" in result and int(result["lab_adapters"]) != adapters:
            raise ValueError(f"{path.name} says lab_adapters={result['lab_adapters']}, its name {adapters}")
        result["_server"] = int(match["server"])
        found.append((adapters, result["_server"], result))
    out: dict[int, list[dict[str, Any]]] = {}
    for adapters, _, result in sorted(found, key=lambda item: item[:2]):
        out.setdefault(adapters, []).append(result)
    return out


def base_runs(raw: Path) -> list[dict[str, Any]]:
    """The session's `profile` servers at 256 on the LoRA servers' weights (serving.WEIGHTS): the base
    model without `--enable-lora`."""
    results, session = serving.load(raw)
    folder = session.get("model_folder")
    weights = {serving.weights_of(job.get("load"), folder) for job in server_jobs(session, LORA_CONFIG)}
    if len(weights) > 1:
        raise ValueError(f"{raw}: the {LORA_CONFIG} servers ran different weights ({sorted(weights)})")
    group = serving.group(BASE_CONFIG, weights.pop() if weights else "checkpoint")
    return results.get(group, {}).get(LEVEL, [])


def stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    entry: dict[str, Any] = {"servers": len(runs)}
    for key in ("output_throughput", "p99_ttft_ms", "mean_tpot_ms"):
        entry[key] = serving.distribution(serving.value_list(runs, key))
    return entry


def server_jobs(session: dict[str, Any], config: str) -> list[dict[str, Any]]:
    """session.json's started servers of `config`, in start order."""
    return [job for job in session.get("jobs", {}).values() if job.get("config") == config and "label" in job]


def flag_value(args: list[str], flag: str, default: int) -> int:
    return int(args[args.index(flag) + 1]) if flag in args and args.index(flag) + 1 < len(args) else default


def lora_settings(raw: Path, session: dict[str, Any]) -> dict[str, int]:
    """The LoRA server's --max-loras, --max-lora-rank and --tensor-parallel-size, from its recorded
    command line or the session's plan (16, 16 and 1, the issue's, where neither says)."""
    args: list[str] = next((job["argv"] for job in server_jobs(session, LORA_CONFIG) if "argv" in job), [])
    plan_file = raw / "lab_plan.json"
    if not args and plan_file.exists():
        args = json.loads(plan_file.read_text())["configs"].get(LORA_CONFIG, {}).get("args") or []
    return {
        "max_loras": flag_value(args, "--max-loras", 16),
        "max_lora_rank": flag_value(args, "--max-lora-rank", 16),
        "tensor_parallel_size": flag_value(args, "--tensor-parallel-size", 1),
    }


def planner_bytes(settings: dict[str, int]) -> int:
    """What domain/capacity/lora.py sets aside for the LoRA slots of the Llama-3.1-8B shape (bf16)."""
    preset = lookup_preset(PRESET)
    assert preset is not None, PRESET
    shape = ModelShape.from_values(preset.architecture)
    return lora_gpu_bytes(
        shape,
        tensor_parallel_size=settings["tensor_parallel_size"],
        max_loras=settings["max_loras"],
        max_lora_rank=settings["max_lora_rank"],
        dtype_bytes=2,
    )


def server_log(logs: Path, job: dict[str, Any]) -> Path | None:
    name = job.get("log") or f"{job['label']}-server.log"
    for candidate in (logs / f"{name}.gz", logs / name):
        if candidate.exists():
            return candidate
    return None


def read_log(path: Path) -> str:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return raw.decode(errors="replace")


def memory(raw: Path, logs: Path | None, session: dict[str, Any]) -> dict[str, Any]:
    """Each base and LoRA server's start-up memory lines, their medians, LoRA minus base, and the
    planner's LoRA slots beside it. `missing` names the logs not found (all of them without `logs`)."""
    servers: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    for config in (BASE_CONFIG, LORA_CONFIG):
        for job in server_jobs(session, config):
            path = server_log(logs, job) if logs is not None and logs.is_dir() else None
            record = parse_vllm_log(read_log(path)) if path else {}
            if not any(key in record for key, _ in MEMORY_KEYS):
                missing.append(job["label"])
                continue
            servers[job["label"]] = {"config": config, **{key: record.get(key) for key, _ in MEMORY_KEYS}}
    medians: dict[str, dict[str, float | None]] = {}
    for config in (BASE_CONFIG, LORA_CONFIG):
        rows = [row for row in servers.values() if row["config"] == config]
        medians[config] = {
            key: serving.median(values)
            if (values := [row[key] for row in rows if row[key] is not None])
            else None
            for key, _ in MEMORY_KEYS
        }
    delta = {
        key: (
            medians[LORA_CONFIG][key] - medians[BASE_CONFIG][key]
            if medians[LORA_CONFIG][key] is not None and medians[BASE_CONFIG][key] is not None
            else None
        )
        for key, _ in MEMORY_KEYS
    }
    settings = lora_settings(raw, session)
    planned_gib = planner_bytes(settings) / GIB
    # The slots load with the model, so "Model loading" grows by them and the KV cache shrinks by them.
    planned = {"weights_gib": planned_gib, "available_kv_cache_gib": -planned_gib}
    error = {
        key: (delta[key] - planned[key]) / abs(planned[key]) if delta.get(key) is not None else None
        for key in planned
    }
    return {
        "servers": servers,
        "missing": missing,
        "median": medians,
        "lora_minus_base": delta,
        "planner_settings": settings,
        "planner_gib": planned_gib,
        "planned": planned,
        "relative_error": error,
    }


def summary(raw: Path, logs: Path | None = None) -> dict[str, Any]:
    """Structured numbers: the base model and each number of adapters in use at 256 (median, range,
    servers), each median against the base model's, and the memory comparison (with `logs`)."""
    session = json.loads((raw / "session.json").read_text())
    base = base_runs(raw)
    lora = load_lora(raw)
    base_stats = stats(base) if base else None
    by_adapters = {str(count): stats(runs) for count, runs in sorted(lora.items())}
    vs_base = {
        count: (
            round(
                100 * (entry["output_throughput"]["median"] / base_stats["output_throughput"]["median"] - 1),
                2,
            )
            if base_stats
            else None
        )
        for count, entry in by_adapters.items()
    }
    return {
        "base": base_stats,
        "adapters": by_adapters,
        "vs_base_pct": vs_base,
        "base_servers": len(base),
        "lora_servers": len({run["_server"] for runs in lora.values() for run in runs}),
        "memory": memory(raw, logs, session),
    }


def spread(entry: dict[str, Any], key: str, fmt: str = ",.0f") -> str:
    values = entry[key]
    if entry["servers"] == 1:
        return f"{values['median']:{fmt}} (1 server)"
    return (
        f"{values['median']:{fmt}} ({values['min']:{fmt}}-{values['max']:{fmt}}, {entry['servers']} servers)"
    )


def number(value: float | None, fmt: str) -> str:
    return "-" if value is None else f"{value:{fmt}}"


def workload_text(raw: Path, runs: list[dict[str, Any]]) -> str:
    plan_file = raw / "lab_plan.json"
    workload = json.loads(plan_file.read_text()).get("workload", {}) if plan_file.exists() else {}
    prompts = sorted({run["num_prompts"] for run in runs if "num_prompts" in run})
    return (
        f"{workload.get('input_len', 512)} random prompt tokens, {workload.get('output_len', 256)} output "
        f"tokens forced (`--ignore-eos`), greedy, {' or '.join(f'{p:,}' for p in prompts) or '?'} prompts "
        f"at {LEVEL} concurrent; vLLM's own `vllm bench serve`, a fresh `--seed` (fresh prompts) every run"
    )


def render(raw: Path, logs: Path) -> str:
    session = json.loads((raw / "session.json").read_text())
    numbers = summary(raw, logs)
    lora = load_lora(raw)
    base = base_runs(raw)
    host = session.get("host", {})
    settings = numbers["memory"]["planner_settings"]
    loads = sorted(
        {job.get("load", "dummy") for c in (BASE_CONFIG, LORA_CONFIG) for job in server_jobs(session, c)}
    )
    lines = [
        "# LoRA serving results (issue 25, item 7)",
        "",
        f"Generated by `bench/lora/report.py` from `{serving.shown(raw)}` (client results, session.json) and "
        f"`{serving.shown(logs)}` (server logs) (do not edit).",
        f"One {host.get('gpu', 'unknown GPU').split(',')[0]} ({host.get('cpus', '?')} CPUs), "
        f"vLLM {host.get('vllm', '?')}, Python {host.get('python', '?')}; Llama-3.1-8B shape, weights "
        f"loaded as: {', '.join(loads) or '?'}.",
        f"Workload: {workload_text(raw, [*base, *(run for runs in lora.values() for run in runs)])}.",
        "Adapters: `bench/lora/make_adapters.py --config-json /tmp/m/llama8b/config.json --rank 16",
        "--count 16`: 16 adapters of random rank-16 tensors (bf16) on all seven linear layers (q, k, v, o,",
        "gate, up, down) of every decoder layer, in PEFT's format; vLLM's cost of an adapter depends on its",
        "shape, not its values.",
        f"LoRA server (`{LORA_CONFIG}`): the `{BASE_CONFIG}` arguments plus `--enable-lora --max-loras "
        f"{settings['max_loras']} --max-lora-rank {settings['max_lora_rank']} --max-cpu-loras 16 "
        "--lora-modules a00=/tmp/lora/adapter-00 ... a15=/tmp/lora/adapter-15`.",
        "Each fresh LoRA server ran at 256 concurrent four times, each with its own seed: every request",
        "naming the base model (0 adapters in use), then the client's `--lora-modules` with the first 1, 4",
        "and 16 adapter names (`--lora-assignment round-robin`). The base model alone: the same session's",
        f"`{BASE_CONFIG}` servers (no `--enable-lora`). One server at a time on the host.",
        "",
    ]
    if numbers["lora_servers"] < EXPECTED_SERVERS or numbers["base_servers"] < EXPECTED_SERVERS:
        lines += [
            f"**Fewer fresh servers than planned ({EXPECTED_SERVERS} of each)**: "
            f"{numbers['lora_servers']} LoRA server(s) and {numbers['base_servers']} base server(s) ran; the "
            "medians below are over those.",
            "",
        ]
    lines += [
        "## 256 concurrent: median (range) over fresh servers",
        "",
        "| server | output tok/s | vs base (median) | p99 TTFT ms | mean TPOT ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    base_stats = numbers["base"]
    if base_stats:
        lines.append(
            f"| {BASE_ROW} | {spread(base_stats, 'output_throughput')} | (reference) | "
            f"{spread(base_stats, 'p99_ttft_ms')} | {spread(base_stats, 'mean_tpot_ms', '.1f')} |"
        )
    else:
        lines.append(f"| {BASE_ROW} | not run | - | - | - |")
    for count in ADAPTERS_IN_USE:
        entry = numbers["adapters"].get(str(count))
        what = f"LoRA server, {count} adapter{'' if count == 1 else 's'} in use"
        if entry is None:
            lines.append(f"| {what} | not run | - | - | - |")
            continue
        versus = numbers["vs_base_pct"][str(count)]
        lines.append(
            f"| {what} | {spread(entry, 'output_throughput')} | "
            f"{'-' if versus is None else f'{versus:+.1f} %'} | {spread(entry, 'p99_ttft_ms')} | "
            f"{spread(entry, 'mean_tpot_ms', '.1f')} |"
        )
    lines += ["", *memory_section(numbers["memory"], logs), "", *every_run(raw, session)]
    return "\n".join(lines) + "\n"


def memory_section(found: dict[str, Any], logs: Path) -> list[str]:
    settings = found["planner_settings"]
    lines = [
        "## GPU memory: the servers' start-up log lines",
        "",
    ]
    if not found["servers"]:
        return [
            *lines,
            f"No server log with vLLM's memory lines under `{serving.shown(logs)}`: no memory table.",
        ]
    lines += [
        "| server | configuration | " + " | ".join(title for _, title in MEMORY_KEYS) + " |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, row in found["servers"].items():
        lines.append(
            f"| {label} | {row['config']} | {number(row['weights_gib'], '.2f')} | "
            f"{number(row['available_kv_cache_gib'], '.2f')} | {number(row['kv_cache_tokens'], ',.0f')} |"
        )
    if found["missing"]:
        lines += ["", f"No memory lines found for: {', '.join(found['missing'])} (log missing or cut short)."]
    planned, delta, error = found["planned"], found["lora_minus_base"], found["relative_error"]
    median = found["median"]
    lines += [
        "",
        f"LoRA minus base (medians), against the planner: `domain/capacity/lora.py` "
        f"`lora_gpu_bytes({PRESET}, tensor_parallel_size={settings['tensor_parallel_size']}, "
        f"max_loras={settings['max_loras']}, max_lora_rank={settings['max_lora_rank']}, dtype_bytes=2)` = "
        f'{found["planner_gib"]:.3f} GiB, set aside while the model loads (so in "Model loading", and '
        "out of the KV cache).",
        "",
        "| quantity | base (median) | LoRA (median) | LoRA - base | planner | error vs planner |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, title in MEMORY_KEYS:
        fmt, signed = (",.0f", "+,.0f") if key == "kv_cache_tokens" else (".2f", "+.2f")
        plan_text = number(planned.get(key), "+.3f")
        error_text = "-" if error.get(key) is None else f"{100 * error[key]:+.1f} %"
        lines.append(
            f"| {title} | {number(median[BASE_CONFIG][key], fmt)} | "
            f"{number(median[LORA_CONFIG][key], fmt)} | {number(delta[key], signed)} | {plan_text} | "
            f"{error_text} |"
        )
    return lines


def every_run(raw: Path, session: dict[str, Any]) -> list[str]:
    """The LoRA servers' runs and the base servers' runs at 256, as session.json lists them."""
    lines = [
        "## Every run",
        "",
        "| server | load | adapters in use | seed | output tok/s | p99 TTFT ms | host CPU busy / GPU util |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    jobs = {job["label"]: job for job in session.get("jobs", {}).values() if "label" in job}
    for run in session.get("runs", []):
        config = run["label"].rsplit("-s", 1)[0]
        if not (config == LORA_CONFIG or (config == BASE_CONFIG and run["level"] == LEVEL)):
            continue
        file = raw / run["file"]
        result = json.loads(file.read_text()) if file.exists() else {}
        adapters = run.get("adapters", "base (no --enable-lora)" if config == BASE_CONFIG else "?")
        host = run.get("host", {})
        note = "" if run.get("ok") else " (discarded: a request failed)"
        lines.append(
            f"| {run['label']} | {jobs.get(run['label'], {}).get('load', '-')} | {adapters} | "
            f"{run['seed']} | {result.get('output_throughput', 0):,.0f}{note} | "
            f"{result.get('p99_ttft_ms', 0):,.0f} | "
            f"{host.get('mean_cpu_busy_pct')} % / {host.get('mean_gpu_util_pct')} % |"
        )
    return lines


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    raw, logs = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    (HERE / "RESULTS.md").write_text(render(raw, logs))
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
