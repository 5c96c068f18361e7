"""Start-up report from one lab session's stamped server logs: bench/startup/summary.json and RESULTS.md.

    .venv/bin/python -m bench.startup.report bench/startup/raw/2026-12-01-b

Reads session.json (bench/serving/lab.py: each server's case, cache folder, bytecode mode and weight
loader), every `<server>-server.log.gz` (phases by bench/startup/phases.py), `importtime-*.txt.gz`
(`python -X importtime`) and writes the median seconds per phase per case, the weight-load GB/s per
loader and the import times. tests/test_startup_report.py keeps both files equal to what this makes.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench.startup import phases

HERE = Path(__file__).resolve().parent
CASES = (
    ("cold", "nothing cached: the first server on a fresh machine (no bytecode, as the image renders)"),
    ("same-host", "caches written by earlier servers on this host; no bytecode (today's render)"),
    ("same-host+bytecode-written", "caches as above; this start writes bytecode into the cache folder"),
    ("same-host+bytecode", "caches as above; bytecode read from the cache folder (PYTHONPYCACHEPREFIX)"),
    ("copied", "caches (and bytecode) written in another folder, copied in before the start"),
    ("concurrent-first", "two servers started at the same moment on one empty cache (0.4 of the GPU each)"),
    ("after-concurrent", "the next start on the cache those two wrote (bytecode kept)"),
)
COLUMNS = ("before_engine", *(name for name, _ in phases.PHASES), "api_ready", "start_to_health")


def case_of(job: dict[str, Any], first_bytecode_writer: bool) -> str:
    case = job.get("case", "")
    if case == "same-host" and job.get("bytecode") == "shared":
        return "same-host+bytecode-written" if first_bytecode_writer else "same-host+bytecode"
    return case


def servers(raw: Path) -> list[dict[str, Any]]:
    """One row per server start: its case, configuration, loader and phases."""
    session = json.loads((raw / "session.json").read_text())
    rows = []
    caches_with_bytecode: set[str] = set()
    for job_id, job in session["jobs"].items():
        first_writer = job.get("bytecode") == "shared" and job.get("cache") not in caches_with_bytecode
        if job.get("bytecode") == "shared":
            caches_with_bytecode.add(job.get("cache", ""))
        if job.get("copy_cache_from") or job.get("case") == "copied":
            first_writer = False  # the copy holds the source folder's bytecode
        members = job.get("servers") or ([job] if "log" in job else [])
        for member in members:
            log = raw / f"{member['log']}.gz"
            if not log.exists():
                continue
            parsed = phases.parse_file(log)
            rows.append({
                "job": job_id, "server": member.get("label", job_id), "case": case_of(job, first_writer),
                "bytecode_read": job.get("bytecode") == "shared" and not first_writer,
                "config": job["config"], "load": job.get("load", "dummy"), "bytecode": job.get("bytecode"),
                "cache": job.get("cache"), **parsed,
            })  # fmt: skip
    return rows


def value(row: dict[str, Any], column: str) -> float | None:
    if column == "before_engine":
        return row["before_engine_s"]
    if column == "start_to_health":
        return row["start_to_health_s"]
    return row["phases"].get(column)


def summarise(rows: list[dict[str, Any]], column: str) -> dict[str, float] | None:
    values = [v for v in (value(row, column) for row in rows) if v is not None]
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 1),
        "min": round(min(values), 1),
        "max": round(max(values), 1),
    }


def weight_loads(rows: list[dict[str, Any]], total_bytes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"bytes": total_bytes}
    for loader in ("default", "fastsafetensors"):
        samples = [
            {"server": row["server"], "config": row["config"], "read_s": row["weights_read_s"],
             "gb_per_s": round(total_bytes / 1e9 / row["weights_read_s"], 2)}
            for row in rows if row["load"] == loader and row["weights_read_s"]
        ]  # fmt: skip
        bf16 = [s["gb_per_s"] for s in samples if s["config"] != "profile-fp8w"]
        every = [s["gb_per_s"] for s in samples]
        out[loader] = {
            "gb_per_s_median_bf16": round(statistics.median(bf16), 2) if bf16 else None,
            "gb_per_s_range_bf16": [min(bf16), max(bf16)] if bf16 else None,
            "gb_per_s_median_all": round(statistics.median(every), 2) if every else None,
            "samples": samples,
        }
    return out


def import_times(raw: Path) -> dict[str, Any]:
    session = json.loads((raw / "session.json").read_text())
    runs = session["jobs"].get("imports", {}).get("runs", {})
    out: dict[str, Any] = {}
    for mode, run in runs.items():
        path = raw / f"{run['file']}.gz"
        packages: Counter[str] = Counter()
        if path.exists():
            with gzip.open(path, "rt") as handle:
                for line in handle:
                    match = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
                    if match:
                        packages[match.group(2).split(".")[0]] += int(match.group(1))
        out[mode] = {
            "wall_s": run["wall_s"],
            "self_s_total": round(sum(packages.values()) / 1e6, 1),
            "top_packages_s": {name: round(us / 1e6, 1) for name, us in packages.most_common(8)},
        }
    return out


def build(raw: Path) -> dict[str, Any]:
    rows = servers(raw)
    total_bytes = json.loads((raw / "mkckpt.log").read_text().strip().splitlines()[-1])["bytes"]
    cases: dict[str, Any] = {}
    for case, about in CASES:
        members = [row for row in rows if row["case"] == case]
        if not members:
            continue
        cases[case] = {
            "about": about,
            "servers": [f"{row['server']} ({row['config']}, {row['load']})" for row in members],
            "seconds": {column: summarise(members, column) for column in COLUMNS},
            "compile_cache_loaded": [row["compile_cache_loaded"] for row in members],
        }
    warm = [row for row in rows if row["case"] != "cold" and row["phases"]["model_config"] is not None
            and row["phases"]["model_config"] < 1]  # fmt: skip
    bytecode = {
        "none": summarise([row for row in warm if row["bytecode"] == "none"], "before_engine"),
        "written_by_this_start": summarise(
            [row for row in warm if row["bytecode"] == "shared" and not row["bytecode_read"]], "before_engine"
        ),
        "read": summarise([row for row in warm if row["bytecode_read"]], "before_engine"),
        "about": "before_engine seconds of starts whose model-info and other caches were warm, by bytecode",
    }
    return {
        "source": str(raw.relative_to(HERE.parent.parent)),
        "before_engine_by_bytecode": bytecode,
        "how": "bench/startup/README.md",
        "cases": cases,
        "weight_load": weight_loads(rows, total_bytes),
        "imports": import_times(raw),
        "servers": [
            {
                key: row[key]
                for key in (
                    "server",
                    "case",
                    "config",
                    "load",
                    "bytecode",
                    "start_to_health_s",
                    "before_engine_s",
                    "engine_init_s",
                    "phases",
                    "weights_read_s",
                    "compile_s",
                    "compile_cache_loaded",
                )
            }
            for row in rows
        ],
    }


def render(summary: dict[str, Any]) -> str:
    lines = [
        "# Start-up results",
        "",
        f"Generated by `bench/startup/report.py` from `{summary['source']}` (do not edit); how to re-run",
        "and what the numbers mean: [README.md](README.md). Seconds, median (min-max) over a case's servers.",
        "",
        "## Phases per case",
        "",
        "| phase | " + " | ".join(summary["cases"]) + " |",
        "| --- | " + " | ".join("---" for _ in summary["cases"]) + " |",
    ]
    for column in COLUMNS:
        cells = []
        for case in summary["cases"].values():
            stats = case["seconds"][column]
            if stats is None:
                cells.append("-")
            elif stats["min"] == stats["max"]:
                cells.append(f"{stats['median']}")
            else:
                cells.append(f"{stats['median']} ({stats['min']}-{stats['max']})")
        lines.append(f"| {column} | " + " | ".join(cells) + " |")
    lines += ["", "| case | what | servers (configuration, weight loader) |", "| --- | --- | --- |"]
    for name, case in summary["cases"].items():
        lines.append(f"| {name} | {case['about']} | {'; '.join(case['servers'])} |")
    loads = summary["weight_load"]
    lines += [
        "",
        f"## Weight loading: {loads['bytes'] / 1e9:.2f} GB of safetensors (4 shards), local disk",
        "",
        "| loader | GB/s, bf16 loads: median (range) | every load (GB/s) |",
        "| --- | --- | --- |",
    ]
    for loader in ("default", "fastsafetensors"):
        entry = loads[loader]
        every = ", ".join(f"{s['gb_per_s']} ({s['server']})" for s in entry["samples"])
        span = entry["gb_per_s_range_bf16"]
        lines.append(f"| {loader} | {entry['gb_per_s_median_bf16']} ({span[0]}-{span[1]}) | {every} |")
    by_code = summary["before_engine_by_bytecode"]
    lines += [
        "",
        "## Before the engine, warm caches, by bytecode",
        "",
        "| bytecode | seconds |",
        "| --- | --- |",
    ]
    for mode in ("none", "written_by_this_start", "read"):
        stats = by_code[mode]
        if stats:
            lines.append(f"| {mode} | {stats['median']} ({stats['min']}-{stats['max']}) |")
    lines += ["", "## Imports (`python -X importtime` of the server's modules, one process)", "",
              "| bytecode | wall s | top packages (self time, s) |", "| --- | --- | --- |"]  # fmt: skip
    for mode, run in summary["imports"].items():
        top = ", ".join(f"{name} {seconds}" for name, seconds in run["top_packages_s"].items())
        lines.append(f"| {mode} | {run['wall_s']} | {top} |")
    lines += [
        "",
        "## Every server",
        "",
        "| server | case | config | loader | to /health | before engine | engine init | compile "
        "| JIT+warm-up |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in summary["servers"]:
        lines.append(
            f"| {row['server']} | {row['case']} | {row['config']} | {row['load']} | "
            f"{row['start_to_health_s']} | "
            f"{row['before_engine_s']} | {row['engine_init_s']} | {row['compile_s']} | "
            f"{row['phases']['jit_warmup']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    raw = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else max((HERE / "raw").iterdir())
    summary = build(raw)
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (HERE / "RESULTS.md").write_text(render(summary))
    print(f"wrote {HERE / 'summary.json'} and {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
