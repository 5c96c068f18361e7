"""Serving measurements on the lab GPU host, one vLLM server at a time, measured by `vllm bench serve`.

    PYTHONPATH=/tmp/site python3 bench/serving/lab.py --out DIR --budget-s 540 defaults api4 ...

Each named configuration of lab_plan.json is started as its own `vllm serve` (the plan's base
arguments plus the configuration's), waited for on /health, measured by vLLM's own benchmark client
(`vllm.benchmarks.serve`, exactly what `vllm bench serve` runs, called in this process so its
imports are paid once) at each of the configuration's concurrency levels, and stopped before the
next one starts. Nothing else runs on the host meanwhile; its load average, CPU and GPU use are
sampled during every level and written to session.json beside the client's `--save-result` files.

The configuration named `tuned` has no arguments of its own: they are chosen from the ablation
results already in DIR by the rule in lab_plan.json ("tuned_rule"), declared before the run.

Only the Python standard library and vLLM (on the GPU host) are needed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

PLAN = Path(__file__).resolve().parent / "lab_plan.json"
LAB = Path(os.environ.get("LAB_DIR", "/tmp/lab"))


def say(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} lab: {message}", flush=True)


def cpu_times() -> tuple[int, int]:
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def gpu_sample() -> dict[str, float]:
    try:
        line = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            .stdout.strip()
            .splitlines()[0]
        )
        utilization, memory = (float(value) for value in line.split(","))
        return {"gpu_util_pct": utilization, "gpu_mem_mib": memory}
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return {}


class HostSampler:
    """Load average, CPU busy share and GPU use every `interval_s` while a measurement runs."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        busy, total = cpu_times()
        while not self._stop.wait(self.interval_s):
            now_busy, now_total = cpu_times()
            share = (now_busy - busy) / max(1, now_total - total)
            busy, total = now_busy, now_total
            self.samples.append(
                {"load1": os.getloadavg()[0], "cpu_busy_pct": round(100 * share, 1), **gpu_sample()}
            )

    def __enter__(self) -> HostSampler:
        self.before = {"loadavg": list(os.getloadavg())}
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        def mean(key: str) -> float | None:
            values = [sample[key] for sample in self.samples if key in sample]
            return round(sum(values) / len(values), 1) if values else None

        return {
            "before": self.before,
            "after": {"loadavg": list(os.getloadavg())},
            "mean_load1": mean("load1"),
            "mean_cpu_busy_pct": mean("cpu_busy_pct"),
            "max_cpu_busy_pct": max((s["cpu_busy_pct"] for s in self.samples), default=None),
            "mean_gpu_util_pct": mean("gpu_util_pct"),
            "samples": len(self.samples),
        }


def gpu_processes() -> list[str]:
    result = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
    )
    return [line for line in result.stdout.split() if line.strip()]


def wait_gpu_free(timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while gpu_processes() and time.monotonic() < deadline:
        time.sleep(1)


def ablation_rows(out: Path, plan: dict[str, Any]) -> dict[str, dict[str, float]]:
    """name -> output tok/s and p99 TTFT at the ablation concurrency, from the client's files in out."""
    level = plan["tuned_rule"]["concurrency"]
    rows = {}
    for path in sorted(out.glob(f"*-c{level}.json")):
        result = json.loads(path.read_text())
        rows[path.name.rsplit("-c", 1)[0]] = {
            "output_throughput": result["output_throughput"],
            "p99_ttft_ms": result["p99_ttft_ms"],
        }
    return rows


def tuned_args(out: Path, plan: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The `tuned` configuration: the rule's base plus every lever that won alone against the defaults."""
    rule = plan["tuned_rule"]
    rows = ablation_rows(out, plan)
    defaults = rows.get("defaults")
    if defaults is None:
        raise RuntimeError("tuned needs the defaults measured first")
    best: dict[str, tuple[float, str]] = {}  # flag -> (gain, lever): of levers on one flag, the best
    for lever in rule["levers"]:
        row = rows.get(lever)
        if row is None:
            continue
        gain = row["output_throughput"] / defaults["output_throughput"] - 1
        flag = plan["configs"][lever]["args"][0]
        if (
            gain >= rule["min_gain"]
            and row["p99_ttft_ms"] <= defaults["p99_ttft_ms"] * rule["max_p99_ttft_ratio"]
        ) and (flag not in best or gain > best[flag][0]):
            best[flag] = (gain, lever)
    winners = [
        lever
        for lever in rule["levers"]
        if (rows.get(lever) and best.get(plan["configs"][lever]["args"][0], (0, ""))[1] == lever)
    ]
    args = list(rule["base_args"])
    for lever in winners:
        lever_args = plan["configs"][lever]["args"]  # one flag and its value
        if lever_args[0] in args:
            index = args.index(lever_args[0])
            del args[index : index + 2]
        args += lever_args
    return args, winners


class Server:
    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.handle = log.open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            argv, stdout=self.handle, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name}: vLLM exited with {self.process.returncode} (log {self.log})"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name}: no /health within {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # API-server and engine-core children
        self.handle.close()


def bench_args(
    plan: dict[str, Any], name: str, concurrency: int, out: Path, load: dict[str, Any]
) -> argparse.Namespace:
    from vllm.benchmarks.serve import add_cli_args

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layout
        from vllm.utils import FlexibleArgumentParser
    workload = plan["workload"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    prompts = max(workload["min_prompts"], workload["prompts_per_concurrency"] * concurrency)
    argv = [
        "--backend", "vllm", "--base-url", f"http://127.0.0.1:{plan['port']}",
        "--model", plan["served_model_name"], "--tokenizer", plan["model_dir"],
        "--dataset-name", "random", "--random-input-len", str(workload["input_len"]),
        "--random-output-len", str(workload["output_len"]), "--ignore-eos",
        "--temperature", str(workload["temperature"]),
        "--max-concurrency", str(concurrency), "--num-prompts", str(prompts), "--seed", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--result-dir", str(out), "--result-filename", f"{name}-c{concurrency}.json",
        "--metadata", f"lab_config={name}", f"load1_before={load['loadavg'][0]:.2f}",
    ]  # fmt: skip
    return parser.parse_args(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="names from lab_plan.json, measured in this order")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=540, help="start nothing that would end after this")
    parser.add_argument("--plan", type=Path, default=PLAN)
    options = parser.parse_args()
    began = time.monotonic()
    plan = json.loads(options.plan.read_text())
    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    session_file = out / "session.json"
    session = json.loads(session_file.read_text()) if session_file.exists() else {"configs": {}}
    session.setdefault("host", {
        "cpus": os.cpu_count(), "gpu": subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True).stdout.strip(),
        "python": sys.version.split()[0],
    })  # fmt: skip
    from vllm import __version__ as vllm_version
    from vllm.benchmarks.serve import main as bench_main

    session["host"]["vllm"] = vllm_version
    cache = LAB / "cache"
    env = dict(os.environ)
    env.update({
        "VLLM_CACHE_ROOT": str(cache), "FLASHINFER_WORKSPACE_BASE": str(cache / "jit" / "flashinfer"),
        "TRITON_CACHE_DIR": str(cache / "jit" / "triton"), "HOME": str(LAB / "home"),
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
    })  # fmt: skip
    (LAB / "home").mkdir(parents=True, exist_ok=True)
    status = 0
    for name in options.configs:
        config = plan["configs"][name]
        done = session["configs"].get(name, {})
        if len(done.get("levels", {})) == len(config["levels"]):
            say(f"{name}: measured earlier in this session, not again")
            continue
        winners: list[str] | None = None
        args = config["args"]
        if name == "tuned":
            args, winners = tuned_args(out, plan)
        first_start = not (cache / "torch_compile_cache").exists()
        need = (
            plan["estimates_s"]["cold_start"] if first_start else plan["estimates_s"]["warm_start"]
        ) + sum(plan["estimates_s"]["level"][str(level)] for level in config["levels"])
        left = options.budget_s - (time.monotonic() - began)
        if need > left:
            say(f"{name}: skipped, needs ~{need} s, {left:.0f} s left")
            session["configs"].setdefault(name, {"skipped": f"needs ~{need} s, {left:.0f} s left"})
            continue
        wait_gpu_free()
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", plan["model_dir"],
                "--served-model-name", plan["served_model_name"], "--host", "127.0.0.1",
                "--port", str(plan["port"]), *plan["base_args"], *args]  # fmt: skip
        record: dict[str, Any] = {
            "args": args,
            "argv": argv[2:],
            "levels": {},
            "started": time.strftime("%H:%M:%S"),
        }
        if winners is not None:
            record["winners"] = winners
        session["configs"][name] = record
        say(f"{name}: starting {' '.join(args) or '(vLLM defaults)'}")
        server = Server(name, argv, out / f"{name}-server.log", env)
        try:
            record["start_to_health_s"] = round(
                server.wait_healthy(f"http://127.0.0.1:{plan['port']}/health", plan["start_timeout_s"]), 1
            )
            say(f"{name}: healthy after {record['start_to_health_s']} s")
            for level in config["levels"]:
                with HostSampler() as sampler:
                    result = bench_main(bench_args(plan, name, level, out, sampler.before))
                record["levels"][str(level)] = {"host": sampler.summary(), "file": f"{name}-c{level}.json"}
                say(
                    f"{name} c={level}: {result['output_throughput']:.0f} output tok/s, TTFT mean "
                    f"{result['mean_ttft_ms']:.0f} p99 {result['p99_ttft_ms']:.0f} ms, TPOT mean "
                    f"{result['mean_tpot_ms']:.1f} ms, {result['completed']}/{result['num_prompts']} done, "
                    f"CPU busy {record['levels'][str(level)]['host']['mean_cpu_busy_pct']} %"
                )
                session_file.write_text(json.dumps(session, indent=1))
        except Exception as error:
            record["error"] = str(error)
            say(f"{name}: FAILED {error}")
            status = 1
        finally:
            server.stop()
            session_file.write_text(json.dumps(session, indent=1))
    shutil.rmtree(LAB / "home", ignore_errors=True)
    say(f"done in {time.monotonic() - began:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
