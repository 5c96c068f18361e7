"""Starts vLLM on a GPU once per planned run and records how it sized its KV cache.

Runs on the GPU host (Python 3.12, CUDA PyTorch, vLLM importable, e.g. PYTHONPATH=/tmp/site; no
network), standard library only besides what vLLM brings:

    PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site python3 bench/capacity/measure_kv_cache.py \\
        bench/capacity/kv_cache_plan.json --out /tmp/kv_cache_observations.json [--only NAME ...]

For each run of the plan file it starts `python3 -m vllm.entrypoints.openai.api_server --model DIR
--load-format dummy ...` in its own session, follows its log until vLLM has logged `GPU KV cache
size` and `Maximum concurrency` (or exits, or times out), then stops the whole session and waits
until the GPU's memory is free again before the next run. Harmless import tracebacks that vLLM logs
as warnings do not stop the wait; only the process exiting does. The observations file is
rewritten after every run (runs already in it are kept unless run again), so a run cut short by a
time limit loses nothing recorded before it. The format is what tests/data/kv_cache_observations.json
holds (bench/capacity/README.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_log import kv_cache_reported, parse_vllm_log_line, strip_decorations

SETTINGS_FLAGS = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "kv_cache_dtype": "--kv-cache-dtype",
}
PROGRESS_MARKERS = (
    "Model loading took",
    "Available KV cache memory",
    "GPU KV cache size",
    "Maximum concurrency",
    "Profiling CUDA graph memory",
    "Memory profiling takes",
    "Estimated ",
    "worker requested memory",
    "Error",
    "error:",
    "OutOfMemory",
)
REPORTED = ("weights_gib", "available_kv_cache_gib", "kv_cache_tokens", "max_concurrency")
STARTED = time.monotonic()


def say(message: str) -> None:
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp} +{time.monotonic() - STARTED:7.1f}s] {message}", flush=True)


def run_text(command: list[str], timeout: float = 120) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def last_line(command: list[str], timeout: float = 300) -> str | None:
    """The last line a Python one-liner prints (importing vLLM logs INFO lines to stdout first)."""
    text = run_text(command, timeout)
    return text.splitlines()[-1].strip() if text else None


def gpu_info(python: str) -> dict[str, Any]:
    """What the GPU reports about its memory, from nvidia-smi and from CUDA itself."""
    info: dict[str, Any] = {}
    line = run_text(
        [
            "nvidia-smi",
            "--query-gpu=name,memory.total,memory.reserved,driver_version",
            "--format=csv,noheader,nounits",
        ]
    )
    if line is None:  # older drivers have no memory.reserved
        line = run_text(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]
        )
        fields = ["name", "nvidia_smi_memory_total_mib", "driver_version"]
    else:
        fields = ["name", "nvidia_smi_memory_total_mib", "nvidia_smi_memory_reserved_mib", "driver_version"]
    if line:
        for key, value in zip(fields, line.splitlines()[0].split(", "), strict=False):
            info[key] = int(value) if key.endswith("_mib") and value.strip().isdigit() else value.strip()
    total = last_line([python, "-c", "import torch; print(torch.cuda.mem_get_info()[1])"])
    if total and total.isdigit():
        info["cuda_total_bytes"] = int(total)
    return info


def gpu_used_mib() -> int | None:
    text = run_text(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], timeout=30)
    return int(text.splitlines()[0]) if text and text.splitlines()[0].isdigit() else None


def wait_for_free_gpu(idle_mib: int, timeout_seconds: float) -> None:
    deadline = time.monotonic() + timeout_seconds
    while True:
        used = gpu_used_mib()
        if used is not None and used <= idle_mib:
            say(f"GPU free ({used} MiB used)")
            return
        if time.monotonic() > deadline:
            raise SystemExit(
                f"GPU memory still in use after {timeout_seconds:.0f} s ({used} MiB); stop the other "
                "process first: vLLM refuses to start when free memory is below its share"
            )
        time.sleep(2)


def build_command(python: str, run: dict[str, Any], port: int) -> list[str]:
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        run["model_dir"],
        "--load-format",
        "dummy",
        "--port",
        str(port),
    ]
    for key, flag in SETTINGS_FLAGS.items():
        if run.get(key) is not None:
            command += [flag, str(run[key])]
    if run.get("enforce_eager"):
        command.append("--enforce-eager")
    return command + list(run.get("extra_args", []))


def stop_session(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the server's whole process group (engine core included), SIGKILL if it lingers."""
    for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            # The group leader is gone; give its children the same grace.
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                os.killpg(process.pid, 0)
                time.sleep(1)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def measure(
    run: dict[str, Any], python: str, port: int, timeout_seconds: float, log_dir: Path, debug: bool
) -> dict[str, Any]:
    command = build_command(python, run, port)
    env = dict(os.environ, PYTHONUNBUFFERED="1", NO_COLOR="1", VLLM_LOGGING_COLOR="0")
    if debug:
        env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    log_path = log_dir / f"{run['name']}.log"
    say(f"{run['name']}: starting {' '.join(command)}")
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=env,
        start_new_session=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    record: dict[str, Any] = {}
    outcome = "timed out"
    tail: list[str] = []
    try:
        with log_path.open("w") as log:
            while True:
                remaining = timeout_seconds - (time.monotonic() - started)
                if remaining <= 0:
                    break
                try:
                    line = lines.get(timeout=min(remaining, 1))
                except queue.Empty:
                    # The server may be gone while a child of it still holds the log pipe open.
                    if process.poll() is None:
                        continue
                    line = None
                if line is None:
                    outcome = f"vLLM exited with code {process.wait()} before sizing its KV cache"
                    break
                log.write(line)
                text = strip_decorations(line)
                tail = [*tail, text][-40:]
                parse_vllm_log_line(text, record)
                if any(marker in text for marker in PROGRESS_MARKERS):
                    say(f"{run['name']}: {text.strip()[:240]}")
                if kv_cache_reported(record):
                    outcome = "ok"
                    break
    finally:
        stop_session(process)
    observation: dict[str, Any] = {
        "name": run["name"],
        "preset": run["preset"],
        "tensor_parallel_size": run.get("tensor_parallel_size", 1),
        "settings": {key: run.get(key) for key in (*SETTINGS_FLAGS, "enforce_eager", "extra_args")},
        "command": command,
        "outcome": outcome,
        "seconds_to_kv_cache_line": round(time.monotonic() - started, 1),
        **record,
    }
    if outcome != "ok":
        observation["log_tail"] = tail
    found = [f"{key}={record[key]}" for key in REPORTED if key in record]
    say(f"{run['name']}: {outcome}; {', '.join(found)}")
    return observation


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path, help="plan file (bench/capacity/kv_cache_plan.json)")
    parser.add_argument("--out", type=Path, required=True, help="observations file, rewritten after each run")
    parser.add_argument("--only", action="append", default=[], help="run only this run name (repeatable)")
    parser.add_argument(
        "--python", default=sys.executable, help="Python that imports vLLM (default: this one)"
    )
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--timeout-seconds", type=float, default=540, help="per run, start to KV-cache line")
    parser.add_argument("--idle-mib", type=int, default=2048, help="GPU memory used that counts as free")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp/kv_cache_logs"))
    parser.add_argument("--no-debug", action="store_true", help="INFO logs only (no profiling breakdown)")
    args = parser.parse_args(argv)

    plan = json.loads(args.plan.read_text())
    runs = [run for run in plan["runs"] if not args.only or run["name"] in args.only]
    unknown = set(args.only) - {run["name"] for run in plan["runs"]}
    if unknown:
        raise SystemExit(f"no run named {', '.join(sorted(unknown))} in {args.plan}")
    for run in runs:
        if not (Path(run["model_dir"]) / "config.json").is_file():
            raise SystemExit(
                f"{run['name']}: {run['model_dir']}/config.json is missing; create it first "
                "(bench/capacity/README.md: mkmodel.py / mkshape.py)"
            )
    args.log_dir.mkdir(parents=True, exist_ok=True)

    document: dict[str, Any] = (
        json.loads(args.out.read_text()) if args.out.is_file() else {"observations": []}
    )
    document["vllm_version"] = last_line([args.python, "-c", "import vllm; print(vllm.__version__)"])
    document["gpu"] = gpu_info(args.python)
    document["recorded_on"] = datetime.date.today().isoformat()
    say(f"vLLM {document['vllm_version']}, GPU {document['gpu']}")
    for run in runs:
        wait_for_free_gpu(args.idle_mib, timeout_seconds=180)
        observation = measure(
            run, args.python, args.port, args.timeout_seconds, args.log_dir, not args.no_debug
        )
        document["observations"] = [o for o in document["observations"] if o["name"] != run["name"]] + [
            observation
        ]
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    wait_for_free_gpu(args.idle_mib, timeout_seconds=180)
    failed = [o["name"] for o in document["observations"] if o["outcome"] != "ok"]
    say(
        f"wrote {args.out}; {len(document['observations'])} observations"
        + (f", failed: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
