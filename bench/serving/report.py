"""The serving report from the lab sessions' raw files (vLLM's own `vllm bench serve` results).

    .venv/bin/python -m bench.serving.report bench/serving/raw/2026-12-01-b bench/serving/raw/2026-12-02
    .venv/bin/python -m bench.serving.report   # every session of raw/ with fresh seeds

Reads each folder's `<config>-s<k>-c<C>.json` (the client's --save-result files; k = the configuration's
k-th fresh server of that session) and session.json (lab.py: jobs, seeds, host load); writes
bench/serving/RESULTS.md and bench/serving/throughput.png. Every fresh server of a configuration counts,
whichever session it ran in (issue 27's bar is three fresh servers per configuration at 256): the tables
pool them (median and range over all), and show each session's median beside the pooled one, with the
ratio to that session's own defaults, so a reader sees whether pooling across hosts is fair.
LoRA runs (`...-c256-a<N>.json`, N adapters in use) are bench/lora/report.py's, not this report's.
tests/test_bench_serving_lab.py keeps the committed report equal to what this makes from the committed
raw files.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
LEVELS = (1, 16, 64, 256)
# `\.json$` right after the level: a LoRA run's `-a<N>` suffix does not match, so `profile-lora` is
# never a serving configuration here.
NAME = re.compile(r"^(?P<config>.+)-s(?P<server>\d+)-c(?P<level>\d+)\.json$")
ORDER = ("defaults", "profile", "profile-fp8w", "profile-auth")
WEIGHTS = {
    "checkpoint": "the real-size checkpoint (read by vLLM's default loader or fastsafetensors)",
    "dummy": "dummy weights (`--load-format dummy`)",
    "full-vocab": "a tokenizer that knows every id (bench/serving/mkmodel.py), either weights",
}
"""What a lab server's tokens cost its API process. Until 2026-12-02-b the lab's model folder had a
tokenizer of 16,000 entries for a model of 128,256 output ids, and its servers ran one of two random
weight sets (session.json's job `load`), uniform in [-1e-3, 1e-3] with the same shapes: the same GPU
work, but different draws, so the model emitted different ids. vLLM's output processor spends ~9x as
long on an id its tokenizer does not know (bench/serving/detokenize.py), and with one API-server
process (vLLM's defaults) the dummy weights served 28 % less than the checkpoint in one session (issue
27). So those servers are pooled per weight set and compared with the defaults on the same weights.
A session whose model folder's tokenizer knows every id (session.json `model_folder`, lab.py) is
`full-vocab`, whichever weights it loads."""
SUFFIXES = {"checkpoint": "", "dummy": " · dummy", "full-vocab": " · full vocab"}
"""A group's name is its configuration's plus the suffix of its weights ("defaults · dummy")."""
DUMMY = SUFFIXES["dummy"]
METRICS = ("output_throughput", "p99_ttft_ms", "mean_ttft_ms", "mean_tpot_ms")

Results = dict[str, dict[int, list[dict[str, Any]]]]
"""group (configuration and weights, `group()`) -> level -> the client's results, one per fresh server."""


def weights_of(load: str | None, model_folder: dict[str, int] | None = None) -> str:
    """A server's weight set (WEIGHTS): `full-vocab` where its session's tokenizer knows every id of
    the model, else `dummy`, or `checkpoint` for the real-size checkpoint's loaders."""
    folder = model_folder or {}
    if folder.get("model_vocab") and folder.get("tokenizer_knows") == folder["model_vocab"]:
        return "full-vocab"
    return "dummy" if load == "dummy" else "checkpoint"


def group(config: str, weights: str) -> str:
    return f"{config}{SUFFIXES[weights]}"


def weights_in(name: str) -> str:
    found = (weights for weights, suffix in SUFFIXES.items() if suffix and name.endswith(suffix))
    return next(found, "checkpoint")


def config_of(name: str) -> str:
    return name.removesuffix(SUFFIXES[weights_in(name)])


def reference(name: str) -> str:
    """The group a group is compared with: vLLM's defaults on the same weights."""
    return group("defaults", weights_in(name))


@dataclass(frozen=True)
class Session:
    """One raw folder: its name (the date), its client results and session.json."""

    raw: Path
    results: Results
    data: dict[str, Any]

    @property
    def name(self) -> str:
        return self.raw.name


def server_loads(session: dict[str, Any]) -> dict[str, str | None]:
    """session.json's started servers (`<config>-s<N>`) -> the weights each loaded (the job's `load`)."""
    return {job["label"]: job.get("load") for job in session.get("jobs", {}).values() if "label" in job}


def load(raw: Path) -> tuple[Results, dict[str, Any]]:
    """group -> level -> the client's results, one per fresh server (server order); and session.json."""
    session = json.loads((raw / "session.json").read_text())
    loads = server_loads(session)
    results: Results = {}
    for path in sorted(raw.glob("*-s*-c*.json"), key=lambda p: _sort_key(p.name)):
        match = NAME.match(path.name)
        if not match:
            continue
        result = json.loads(path.read_text())
        result["_server"] = int(match["server"])
        result["_session"] = raw.name
        weights = weights_of(loads.get(f"{match['config']}-s{match['server']}"), session.get("model_folder"))
        name = group(match["config"], weights)
        results.setdefault(name, {}).setdefault(int(match["level"]), []).append(result)
    return results, session


def load_sessions(raws: Path | list[Path]) -> list[Session]:
    """Each folder's results, in the order given (a single folder is a list of one)."""
    folders = [raws] if isinstance(raws, Path) else list(raws)
    if not folders:
        raise ValueError("no raw folder given")
    return [Session(raw, *load(raw)) for raw in folders]


def pooled(sessions: list[Session]) -> Results:
    """config -> level -> every fresh server's result across the sessions (session order)."""
    out: Results = {}
    for session in sessions:
        for name, by_level in session.results.items():
            for level, runs in by_level.items():
                out.setdefault(name, {}).setdefault(level, []).extend(runs)
    return out


def fresh_seed_sessions(root: Path) -> list[Path]:
    """The folders of `root` whose session.json has a `seed_base`: lab.py gives every run its own seed
    from it. The 2026-12-01 ablation session has none (its 64/16/1 runs reused seed 0, issue 27)."""
    found = []
    for folder in sorted(path for path in root.iterdir() if path.is_dir()):
        session = folder / "session.json"
        if session.exists() and "seed_base" in json.loads(session.read_text()):
            found.append(folder)
    return found


def _sort_key(name: str) -> tuple[str, int, int]:
    match = NAME.match(name)
    return (match["config"], int(match["server"]), int(match["level"])) if match else (name, 0, 0)


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], fmt: str = ",.0f") -> str:
    if len(values) == 1:
        return f"{values[0]:{fmt}} (1 server)"
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}}, {len(values)} servers)"


def gain(value: float, reference: float) -> str:
    return f"{100 * (value / reference - 1):+.1f} %"


def percent_or_dash(values: list[float]) -> str:
    return f"{median(values):.1f} %" if values else "-"


def configs_in_order(results: dict[str, Any]) -> list[str]:
    """The groups: the checkpoint's first, then the dummy weights'; the main configurations first."""

    def key(name: str) -> tuple[int, int, str]:
        config = config_of(name)
        rank = ORDER.index(config) if config in ORDER else len(ORDER)
        return (list(WEIGHTS).index(weights_in(name)), rank, config)

    return sorted(results, key=key)


def value_list(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [run[key] for run in runs]


def distribution(values: list[float], digits: int = 1) -> dict[str, Any]:
    """Median, min, max and every value (rounded to `digits` decimals), as the summaries record a metric."""
    return {
        "median": round(median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "values": [round(value, digits) for value in values],
    }


def throughputs(runs: list[dict[str, Any]]) -> list[float]:
    return value_list(runs, "output_throughput")


def session_medians(sessions: list[Session], name: str, level: int) -> dict[str, tuple[float, int]]:
    """session -> (median output tok/s, servers) of `name` at `level`, for the sessions that ran it."""
    out = {}
    for session in sessions:
        runs = session.results.get(name, {}).get(level)
        if runs:
            out[session.name] = (median(throughputs(runs)), len(runs))
    return out


def same_session_ratios(sessions: list[Session], name: str, level: int) -> dict[str, float]:
    """session -> that session's median of `name` / that session's defaults median on the same weights,
    where it has both."""
    ratios = {}
    for session in sessions:
        runs = session.results.get(name, {}).get(level)
        defaults = session.results.get(reference(name), {}).get(level)
        if runs and defaults:
            ratios[session.name] = median(throughputs(runs)) / median(throughputs(defaults))
    return ratios


def summary(raws: Path | list[Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """group -> level -> median and range of output tok/s, p99 TTFT, mean TTFT and mean TPOT over every
    fresh server of the sessions; each session's median and server count; the ratio to the defaults on
    the same weights (pooled medians) and each session's ratio to its own defaults on those weights."""
    sessions = load_sessions(raws)
    results = pooled(sessions)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, by_level in results.items():
        for level, runs in by_level.items():
            entry: dict[str, Any] = {}
            for key in METRICS:
                entry[key] = distribution(value_list(runs, key))
            entry["servers"] = len(runs)
            entry["sessions"] = {
                session: {"output_throughput_median": round(value, 1), "servers": count}
                for session, (value, count) in session_medians(sessions, name, level).items()
            }
            defaults = results.get(reference(name), {}).get(level)
            entry["vs_defaults"] = (
                round(median(throughputs(runs)) / median(throughputs(defaults)), 4) if defaults else None
            )
            entry["vs_defaults_same_session"] = {
                session: round(ratio, 4)
                for session, ratio in same_session_ratios(sessions, name, level).items()
            }
            out.setdefault(name, {})[str(level)] = entry
    return out


def shown(path: Path) -> str:
    """A folder as the report names it: relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def host_line(session: Session) -> str:
    host = session.data.get("host", {})
    gpu = host.get("gpu", "unknown GPU").split(",")[0]
    return (
        f"{session.name}: one {gpu} ({host.get('cpus', '?')} CPUs), vLLM {host.get('vllm', '?')}, "
        f"Python {host.get('python', '?')}"
    )


def host_load(sessions: list[Session], name: str, level: int) -> str:
    """Median host CPU busy / GPU util over the runs of `name` at `level` (session.json's samples)."""
    cpu, gpu = [], []
    for session in sessions:
        by_file = {run.get("file"): run for run in session.data.get("runs", []) if run.get("ok")}
        for result in session.results.get(name, {}).get(level, []):
            file = f"{config_of(name)}-s{result['_server']}-c{level}.json"
            host = by_file.get(file, {}).get("host", {})
            if host.get("mean_cpu_busy_pct") is not None:
                cpu.append(host["mean_cpu_busy_pct"])
            if host.get("mean_gpu_util_pct") is not None:
                gpu.append(host["mean_gpu_util_pct"])
    return f"{percent_or_dash(cpu)} / {percent_or_dash(gpu)}"


def level_table(sessions: list[Session], level: int, weights: str) -> list[str]:
    """Median (range) over every fresh server that ran `level` on `weights`, pooled across sessions,
    with each session's median and its ratio to that session's own defaults on the same weights."""
    results = pooled(sessions)
    defaults = results.get(group("defaults", weights), {}).get(level)
    base = median(throughputs(defaults)) if defaults else None
    lines = [
        "| configuration | output tok/s | per session (servers) | vs defaults (pooled medians) "
        "| vs defaults, same session | p99 TTFT ms | mean TTFT ms | mean TPOT ms "
        "| host CPU busy / GPU util |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for name in configs_in_order(results):
        runs = results[name].get(level)
        if not runs or weights_in(name) != weights:
            continue
        value = median(throughputs(runs))
        per_session = "; ".join(
            f"{session}: {median_value:,.0f} ({count})"
            for session, (median_value, count) in session_medians(sessions, name, level).items()
        )
        if name == reference(name):
            versus, same = "(reference)", "(reference)"
        else:
            versus = f"{gain(value, base)} ({value / base:.2f}x)" if base else "-"
            ratios = same_session_ratios(sessions, name, level)
            same = "; ".join(f"{session}: {gain(ratio, 1)}" for session, ratio in ratios.items()) or "-"
        tpot_fmt = ".1f" if level > 1 else ".2f"
        lines.append(
            f"| {name} | {spread(throughputs(runs))} | {per_session} | {versus} | {same} | "
            f"{spread(value_list(runs, 'p99_ttft_ms'))} | {spread(value_list(runs, 'mean_ttft_ms'))} | "
            f"{spread(value_list(runs, 'mean_tpot_ms'), tpot_fmt)} | {host_load(sessions, name, level)} |"
        )
    return lines


def configuration_rows(sessions: list[Session], names: list[str]) -> list[str]:
    """Each configuration's arguments; one row per distinct set where sessions ran it differently."""
    rows = []
    for name in names:
        by_args: dict[str, list[str]] = {}
        for session in sessions:
            if not any(config_of(ran) == name for ran in session.results):
                continue
            args = session_args(session).get(name)
            text = "(not recorded)" if args is None else args or "(vLLM's defaults)"
            by_args.setdefault(text, []).append(session.name)
        for text, names_of_sessions in by_args.items():
            where = f" ({', '.join(names_of_sessions)})" if len(by_args) > 1 else ""
            rows.append(f"| {name}{where} | `{text}` |")
    return rows


def session_args(session: Session) -> dict[str, str]:
    """config -> its arguments after `--max-model-len 16384`: the session's lab_plan.json where it lists
    them, else the server command line session.json recorded (`tuned` is derived during the session)."""
    args = {}
    for job in session.data.get("jobs", {}).values():
        argv = job.get("argv", [])
        if "config" in job and "--max-model-len" in argv:
            args[job["config"]] = " ".join(argv[argv.index("--max-model-len") + 2 :])
    plan_file = session.raw / "lab_plan.json"
    configs = json.loads(plan_file.read_text())["configs"] if plan_file.exists() else {}
    args.update(
        {name: " ".join(config["args"]) for name, config in configs.items() if config.get("args") is not None}
    )
    return args


def weights_gap(sessions: list[Session]) -> str:
    """Each session that ran the defaults on both weight sets: the dummy weights' median at 256 against
    the checkpoint's."""
    gaps = []
    for session in sessions:
        dummy = session.results.get(group("defaults", "dummy"), {}).get(256)
        real = session.results.get("defaults", {}).get(256)
        if dummy and real:
            slow, fast = median(throughputs(dummy)), median(throughputs(real))
            gaps.append(
                f"{session.name}: {slow:,.0f} on the dummy weights against {fast:,.0f} on the "
                f"checkpoint, {gain(slow / fast, 1)}"
            )
    return "; ".join(gaps) or "no session ran both"


def render(raws: Path | list[Path]) -> str:
    sessions = load_sessions(raws)
    results = pooled(sessions)
    names = configs_in_order(results)
    discarded = sum(
        not run.get("ok", True)
        for session in sessions
        for run in session.data.get("runs", [])
        if "adapters" not in run  # LoRA runs: bench/lora's
    )
    discarded_text = f"{discarded} discarded" if discarded else "none failed"
    folders = " and ".join(f"`{shown(session.raw)}`" for session in sessions)
    lines = [
        "# Serving benchmark results",
        "",
        f"Generated by `bench/serving/report.py` from {folders} (do not edit).",
        *(f"{host_line(session)};" for session in sessions),
        "Llama-3.1-8B shape, 512 random prompt tokens, 256 output tokens forced (`--ignore-eos`), greedy.",
        "Client: vLLM's own `vllm bench serve` (random dataset, `--max-concurrency C`, 4 x C prompts, at",
        "least 8), **every run with its own `--seed`** (no prompt is served twice, so vLLM's prefix cache",
        "holds nothing a run can reuse). Every configuration at 256 ran on fresh servers (one server per",
        "row of `session.json`, started with the environment the prod stack renders); the lower levels",
        "ran on the servers listed under Every run, after their 256 run. One server at a time, nothing",
        f"else on the host; a run with a failed request was discarded and re-run ({discarded_text}). The",
        'tables pool every fresh server of a configuration across the sessions; "per session" and',
        '"same session" show whether the sessions agree.',
        "",
        "**Weights.** A server ran one of two random weight sets of the same shapes (the job's `load`):",
        "the GPU does the same work on both, but the model emits different token ids. Until 2026-12-02-b",
        "the lab's tokenizer knew 16,000 of the model's 128,256 ids, and vLLM's output processor spends",
        "about 9x as long on an id its tokenizer does not know ([detokenize.py](detokenize.py),",
        "[cpu/](cpu/)). vLLM's defaults, with one API-server process, moved with the weights where one",
        f"session ran both ({weights_gap(sessions)}); see the GPU util column. So every table pools a",
        "configuration's servers per weight set and compares them with the defaults on the same weights;",
        f"groups on the dummy weights are named `<configuration>{DUMMY}`, those of sessions whose",
        f"tokenizer knows every id `<configuration>{SUFFIXES['full-vocab']}`.",
    ]
    for weights, label in WEIGHTS.items():
        groups = [name for name in names if weights_in(name) == weights and 256 in results[name]]
        if not groups:
            continue
        lines += [
            "",
            f"## 256 concurrent on {label}: median (range) over fresh servers",
            "",
            *level_table(sessions, 256, weights),
        ]
        defaults = results.get(group("defaults", weights), {}).get(256)
        if defaults:
            lines += [
                "",
                f"Defaults' median at 256 on these weights: {median(throughputs(defaults)):,.0f} output "
                f"tok/s, p99 TTFT {median(value_list(defaults, 'p99_ttft_ms')):,.0f} ms.",
            ]
    middle = [level for level in (64, 16) if any(level in results[name] for name in names)]
    if middle:
        lines += [
            "",
            f"## {' and '.join(str(level) for level in middle)} concurrent (fresh prompts; median over the "
            "servers that ran them)",
            "",
            "| C | configuration | output tok/s | vs defaults | p99 TTFT ms | mean TTFT ms | mean TPOT ms |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
    for level in middle:
        for name in names:
            base = results.get(reference(name), {}).get(level)
            runs = results[name].get(level)
            if not runs:
                continue
            value = median(throughputs(runs))
            versus = gain(value, median(throughputs(base))) if base else "-"
            lines.append(
                f"| {level} | {name} | {value:,.0f} | {versus} | "
                f"{median(value_list(runs, 'p99_ttft_ms')):,.0f} | "
                f"{median(value_list(runs, 'mean_ttft_ms')):,.0f} | "
                f"{median(value_list(runs, 'mean_tpot_ms')):.2f} |"
            )
    for weights, label in WEIGHTS.items():
        if not any(1 in results[name] for name in names if weights_in(name) == weights):
            continue
        lines += [
            "",
            f"## 1 concurrent on {label}: median (range) over every server that ran it",
            "",
            *level_table(sessions, 1, weights),
        ]
    lines += [
        "",
        "## Configurations",
        "",
        "| configuration | arguments after `--max-model-len 16384` |",
        "| --- | --- |",
        *configuration_rows(sessions, list(dict.fromkeys(config_of(name) for name in names))),
        "",
        "## Every run",
        "",
        "LoRA runs (`adapters` in session.json) are in [bench/lora/RESULTS.md](../lora/RESULTS.md).",
        "",
        "| session | server | case | load | C | seed | output tok/s | p99 TTFT ms | CPU busy / GPU util |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for session in sessions:
        jobs = session.data.get("jobs", {})
        for run in session.data.get("runs", []):
            if "adapters" in run:
                continue
            job = next((j for j in jobs.values() if j.get("label") == run["label"]), {})
            file = session.raw / run["file"]
            result = json.loads(file.read_text()) if file.exists() else {}
            host_run = run.get("host", {})
            lines.append(
                f"| {session.name} | {run['label']} | {job.get('case', '-')} | {job.get('load', '-')} | "
                f"{run['level']} | {run['seed']} | "
                f"{result.get('output_throughput', 0):,.0f} | {result.get('p99_ttft_ms', 0):,.0f} | "
                f"{host_run.get('mean_cpu_busy_pct')} % / {host_run.get('mean_gpu_util_pct')} % |"
            )
    for session in sessions:
        jobs = session.data.get("jobs", {})
        skipped = [f"{name} ({job['skipped']})" for name, job in jobs.items() if "skipped" in job]
        if skipped:
            lines += ["", f"Not run in {session.name} (device time): " + "; ".join(skipped) + "."]
    return "\n".join(lines) + "\n"


def plot(raws: Path | list[Path], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = pooled(load_sessions(raws))
    figure, axis = plt.subplots(figsize=(6, 4), dpi=100)
    for name in configs_in_order(results):
        levels = sorted(results[name])
        if len(levels) > 2:  # the curves: the groups run at 256, 64, 16 and 1
            values = [median(throughputs(results[name][c])) for c in levels]
            axis.plot(levels, values, marker="o", label=f"vLLM {name}")
    axis.set_xscale("log", base=2)
    axis.set_xlabel("concurrent requests")
    axis.set_ylabel("output tokens/s (median over fresh servers)")
    axis.set_title("vllm bench serve, one H200, 512 in / 256 out, fresh prompts")
    axis.grid(True, alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(target, metadata={"Software": None})
    plt.close(figure)


def main() -> int:
    raws = [Path(arg).resolve() for arg in sys.argv[1:]] or fresh_seed_sessions(HERE / "raw")
    (HERE / "RESULTS.md").write_text(render(raws))
    plot(raws, HERE / "throughput.png")
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'throughput.png'} from {', '.join(r.name for r in raws)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
