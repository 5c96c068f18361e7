"""The GPU phases of the serving benchmark; run through gpu_phase.sh (bench/serving/README.md).

    python3 -m bench.serving.phases {selftest|stack|defaults|baseline|warmstart} --out DIR [--budget-s S]
    python3 -m bench.serving.phases stack --out DIR --dry-run-cpu       # rehearsal on the CPU vLLM

stack      the stack's own arguments (plan.json): cold start to /health, load levels, warm restart
defaults   vLLM's defaults at the comparison levels, then (time permitting) a warm restart the stack
           phase had no time for and KV-cache probes at another utilisation
baseline   Transformers `generate` on static batches, then the capacity engineer's runs, if any
warmstart  the stack's arguments twice: an empty shared cache (cold), then a new pod's empty HOME
           and TMPDIR with the shared cache kept (warm); a few requests after each start
selftest   imports, the real parser on every argument list, the load generator and log parser

Each phase writes `<phase>.json` into the output folder after every step (a timeout still leaves
the data so far), `<phase>-requests.json` with every request's timings, and `<phase>-logs.txt`
with the server logs. Every server is stopped before the next starts and before the phase ends.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.serving import loadgen
from bench.serving.server import (
    WORK_DIR,
    GpuSampler,
    ServerFailedError,
    VllmServer,
    cpu_facts,
    gpu_memory_mib,
    kill_registered,
    nvidia_smi,
    wait_gpu_free,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAN_FILE = Path(__file__).resolve().parent / "plan.json"
SHARED_CACHE_DIR = Path(os.environ.get("BENCH_SHARED_CACHE", "/tmp/vllm-cache"))
"""The stack's VLLM_CACHE_ROOT (issue 8: /tmp/vllm-cache on the lab host); gpu_phase.sh moves it
under BENCH_WORK_DIR for CPU rehearsals."""
CAPACITY_SCRIPT = REPO_ROOT / "bench" / "capacity" / "measure_kv_cache.py"
LOG_BYTES_PER_SERVER = 1_500_000
WARMUP = {"concurrency": 8, "num_prompts": 16, "output_len": 16}
EXPECTED_START_S = {"health": 220.0, "kv": 110.0}
"""How long a vLLM start takes, so that a phase does not begin one it cannot finish. Lab H200,
vLLM 0.26.0, 2026-11-29 (bench/serving/raw): /health after 196-207 s, cold or warm (a JIT gap of
100-130 s that the shared JIT caches should remove); the KV-cache lines after 60-97 s."""

# CPU rehearsal (--dry-run-cpu): the same phase logic against the real vLLM 0.32.0 CPU build and
# the e2e harness's tiny Llama, with a workload a 2-core machine finishes in minutes.
DRY_RUN_WORKLOAD: dict[str, Any] = {
    "input_len": 64,
    "output_len": 16,
    "concurrency": [1, 4],
    "num_prompts": {"1": 3, "4": 8},
    "level_time_cap_s": 30,
}
DRY_RUN_BASELINE = {"batch_sizes": [1, 4], "input_len": 64, "output_len": 16}
CPU_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
DRY_RUN_EXTRA_ARGS = ["--enforce-eager"]
"""torch.compile of even the tiny model takes minutes on a busy 2-core machine; the rehearsal tests
the phase logic, not compilation."""


def ensure_tiny_model(python: str, tiny: Path) -> Path:
    """The e2e harness's tiny Llama at `tiny` for CPU rehearsals, made once, with room for the stacks'
    --max-model-len (16384 for the 8B, 8192 for the Qwen model): its positions go up to 131072."""
    if not (tiny / "config.json").exists():
        subprocess.run(
            [python, "-m", "tests.support.tiny_model", str(tiny)], cwd=REPO_ROOT, check=True, timeout=300
        )
        config = json.loads((tiny / "config.json").read_text())
        config["max_position_embeddings"] = 131072
        (tiny / "config.json").write_text(json.dumps(config, indent=2))
    return tiny


@dataclass
class Lab:
    """Where and how servers run: the GPU host, or the CPU rehearsal."""

    plan: dict[str, Any]
    dry_run_cpu: bool
    python: str
    model_dir: str
    workload: dict[str, Any]
    baseline: dict[str, Any]
    health_timeout_cold_s: float
    health_timeout_warm_s: float
    substitutions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, plan: dict[str, Any], dry_run_cpu: bool) -> Lab:
        if not dry_run_cpu:
            return cls(
                plan,
                False,
                sys.executable,
                plan["lab"]["model_dir"],
                plan["workload"],
                plan["baseline"],
                health_timeout_cold_s=420,
                health_timeout_warm_s=240,
            )
        python = os.environ.get("VLLM_PYTHON", str(REPO_ROOT / ".venv-vllm" / "bin" / "python"))
        tiny = ensure_tiny_model(python, WORK_DIR / "tiny-model")
        # A free port instead of the stack's 8000, which a developer's own vLLM may be using.
        plan = json.loads(json.dumps(plan))
        port = str(_free_port())
        for args in [
            plan["lab"]["serve_args"],
            plan["defaults"]["serve_args"],
            *(probe["serve_args"] for probe in plan["probes"]),
        ]:
            args[args.index("--port") + 1] = port
        plan["lab"]["port"] = int(port)
        return cls(
            plan,
            True,
            python,
            str(tiny),
            DRY_RUN_WORKLOAD,
            DRY_RUN_BASELINE,
            health_timeout_cold_s=900,
            health_timeout_warm_s=900,
            substitutions={plan["lab"]["model_dir"]: str(tiny)},
        )

    def server_command(self, args: list[str]) -> list[str]:
        args = [self.substitutions.get(arg, arg) for arg in args]
        if self.dry_run_cpu:
            # vllm-cpu's console script cannot run (tests/support/vllm_server.py says why).
            return [self.python, "-m", "tests.support.vllm_server", "serve", *args, *DRY_RUN_EXTRA_ARGS]
        return [self.python, "-m", "vllm.entrypoints.cli.main", "serve", *args]

    def server_env(self, start_name: str) -> dict[str, str]:
        """The pod's environment (plan.json) with an emptied scratch folder and the shared cache.

        The scratch folder has the same path at every start, emptied before it, as every pod has
        the same HOME (/home/vllm) on a fresh emptyDir: vLLM 0.26.0 hashes VLLM_CONFIG_ROOT
        ($HOME/.config/vllm) into its torch.compile cache key, so a HOME path that differed per start
        made the 2026-11-29 warm restart recompile (26.8 s) where a new pod would not.
        """
        del start_name  # every start is a new pod with the same paths
        scratch = pod_scratch()
        shutil.rmtree(scratch, ignore_errors=True)
        env = dict(os.environ)
        for name, value in self.plan["lab"]["env"].items():
            value = value.replace("{shared_cache}", str(SHARED_CACHE_DIR)).replace("{scratch}", str(scratch))
            if value.startswith(str(scratch)):
                Path(value).mkdir(parents=True, exist_ok=True)
            env[name] = value
        env["PYTHONUNBUFFERED"] = "1"
        if self.dry_run_cpu:
            env.update(CPU_ENV)
            env["PYTHONPATH"] = str(REPO_ROOT)
        return env

    def token_id_range(self) -> tuple[int, int]:
        from bench.serving.hf_baseline import tokenizer_id_range

        return tokenizer_id_range(Path(self.model_dir))


def pod_scratch() -> Path:
    """The emptyDir folders of the pod (HOME, TMPDIR): one path, emptied before every start."""
    return WORK_DIR / "scratch" / "pod"


class Phase:
    def __init__(self, name: str, out_dir: Path, budget_s: float, lab: Lab | None) -> None:
        self.name = name
        self.out_dir = out_dir
        self.budget_s = budget_s
        self.lab = lab
        self.began = time.time()
        self.servers: list[VllmServer] = []
        self.other_logs: list[tuple[str, Path]] = []  # (title, path) of non-server commands
        self.requests: dict[str, Any] = {}
        self.result: dict[str, Any] = {
            "phase": name,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "budget_s": budget_s,
            "dry_run_cpu": bool(lab and lab.dry_run_cpu),
            "host": host_facts(),
            "steps": [],
        }
        out_dir.mkdir(parents=True, exist_ok=True)

    def remaining(self) -> float:
        return self.budget_s - (time.time() - self.began)

    def say(self, message: str) -> None:
        print(
            f"[{time.strftime('%H:%M:%S')} +{time.time() - self.began:6.1f}s] {self.name}: {message}",
            flush=True,
        )

    def step(self, description: str) -> None:
        self.result["steps"].append(
            {"at_s": round(time.time() - self.began, 1), "step": description, "load_1m": _load_1m()}
        )
        self.say(description)
        self.save()

    def save(self) -> None:
        self.result["elapsed_s"] = round(time.time() - self.began, 1)
        _write_json(self.out_dir / f"{self.name}.json", self.result)
        if self.requests:
            _write_json(self.out_dir / f"{self.name}-requests.json", self.requests, indent=None)

    def save_logs(self) -> None:
        """Every log of the phase in one file (server logs cut to their head and tail if long)."""
        sources = [(f"{server.name}: {' '.join(server.command)}", server.log_path) for server in self.servers]
        parts = []
        for title, path in sources + self.other_logs:
            text = path.read_text(errors="replace") if path.exists() else "(no log)"
            if len(text) > LOG_BYTES_PER_SERVER:
                half = LOG_BYTES_PER_SERVER // 2
                text = text[:half] + "\n[... cut ...]\n" + text[-half:]
            parts.append(f"===== {title}\n{text}")
        (self.out_dir / f"{self.name}-logs.txt").write_text("\n".join(parts))

    def new_server(self, name: str, args: list[str]) -> VllmServer:
        assert self.lab is not None
        log = WORK_DIR / "logs" / f"{self.name}-{name}.log"
        server = VllmServer(
            name,
            self.lab.server_command(args),
            self.lab.server_env(f"{self.name}-{name}"),
            log,
            port=int(self.lab.plan["lab"]["port"]),
        )
        self.servers.append(server)
        return server

    def start_server(
        self, name: str, args: list[str], *, until: str, timeout_s: float
    ) -> tuple[VllmServer, dict]:
        """Start after the GPU is free; returns the server and its start record (also stored)."""
        if not self.lab or not self.lab.dry_run_cpu:
            self.result.setdefault("gpu_waits", []).append(wait_gpu_free(timeout_s=90))
        server = self.new_server(name, args)
        server.start()
        self.step(f"started {name}: {' '.join(server.command)}")
        record = self.result.setdefault("starts", {})
        try:
            start = server.wait(
                until=until, timeout_s=min(timeout_s, max(30.0, self.remaining() - 20)), on_progress=self.say
            )
        except ServerFailedError as error:
            record[name] = server.start_record.as_json() if server.start_record else {"error": str(error)}
            self.say(str(error))
            self.stop_server(server, grace_s=10)
            raise
        record[name] = start.as_json()
        self.step(f"{name} reached {until} after {start.ready_s} s")
        return server, record[name]

    def stop_server(self, server: VllmServer, grace_s: float = 30) -> None:
        took = server.stop(grace_s=grace_s)
        self.step(f"stopped {server.name} in {took} s")
        self.save_logs()

    def finish(self, status: str) -> None:
        for server in self.servers:
            if server.running:
                server.stop(grace_s=10)
        self.result["status"] = status
        self.save()
        self.save_logs()
        self.say(f"finished: {status} after {time.time() - self.began:.0f} s")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _write_json(path: Path, data: Any, indent: int | None = 1) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(data, indent=indent, default=str))
    temporary.replace(path)


def _load_1m() -> float | None:
    try:
        return round(os.getloadavg()[0], 1)
    except OSError:
        return None


def host_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "cpu": cpu_facts(),
    }
    rows = nvidia_smi("--query-gpu=name,memory.total,driver_version")
    if rows:
        facts.update(gpu=rows[0][0], gpu_memory_total_mib=int(float(rows[0][1])), driver=rows[0][2])
    return facts


def software_versions(python: str) -> dict[str, str]:
    """torch / transformers / vllm versions as the server's interpreter sees them (one subprocess)."""
    code = (
        "import json, importlib.metadata as m\nout = {}\n"
        "for name in ('torch', 'transformers', 'vllm', 'vllm-cpu'):\n"
        "    try: out[name] = m.version(name)\n    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    try:
        output = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout
        return json.loads(output.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as error:
        return {"error": str(error)[:200]}


def check_arguments_with_real_parser(lab: Lab, argument_lists: dict[str, list[str]]) -> dict[str, Any]:
    """Parse each list with the installed vLLM's own `vllm serve` parser (a subprocess: it imports vLLM)."""
    payload = {
        name: [lab.substitutions.get(arg, arg) for arg in args] for name, args in argument_lists.items()
    }
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    )
    if lab.dry_run_cpu:
        env.update(CPU_ENV)
    try:
        completed = subprocess.run(
            [lab.python, "-m", "bench.serving.parser_check"],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO_ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": "the parser check did not finish in 240 s"}
    marker = [line for line in completed.stdout.splitlines() if line.startswith("PARSER_CHECK=")]
    if not marker:
        return {"error": f"no result (exit {completed.returncode}): {completed.stderr[-1500:]}"}
    return json.loads(marker[-1].removeprefix("PARSER_CHECK="))


def _target(lab: Lab) -> loadgen.Target:
    return loadgen.Target("127.0.0.1", int(lab.plan["lab"]["port"]), lab.plan["lab"]["served_model_name"])


def warm_up(phase: Phase, lab: Lab) -> dict[str, Any]:
    """A few short requests; their TTFT also shows any kernel compiled lazily on the first request."""
    phase.say(f"warm-up: {WARMUP}")
    warm = loadgen.run_level(
        _target(lab),
        concurrency=WARMUP["concurrency"],
        num_prompts=WARMUP["num_prompts"],
        input_len=lab.workload["input_len"],
        output_len=WARMUP["output_len"],
        token_id_range=lab.token_id_range(),
        time_cap_s=30,
        request_timeout_s=120,
    )
    if warm["summary"]["completed"] == 0:
        raise ServerFailedError(f"warm-up requests all failed: {warm['summary']['errors']}")
    return warm["summary"]


def run_levels(phase: Phase, lab: Lab, levels: list[int], sampler: GpuSampler) -> None:
    workload = lab.workload
    target = _target(lab)
    token_range = lab.token_id_range()
    summaries = phase.result.setdefault("levels", {})
    phase.result["warmup"] = warm_up(phase, lab)
    for concurrency in levels:
        cap = float(workload["level_time_cap_s"])
        needed = cap + 20  # the cap, then the requests still in flight
        if phase.remaining() < needed:
            phase.result.setdefault("skipped_levels", []).append(concurrency)
            phase.step(
                f"C={concurrency}: skipped, {phase.remaining():.0f} s left, about {needed:.0f} s needed"
            )
            continue
        began = time.time()
        level = loadgen.run_level(
            target,
            concurrency=concurrency,
            num_prompts=int(workload["num_prompts"][str(concurrency)]),
            input_len=workload["input_len"],
            output_len=workload["output_len"],
            token_id_range=token_range,
            time_cap_s=cap,
            seed=concurrency,
            request_timeout_s=cap + 240,
        )
        summary = level["summary"]
        summary["gpu"] = sampler.window(began, time.time())
        summaries[str(concurrency)] = summary
        phase.requests[str(concurrency)] = level["requests"]
        if summary["completed"]:
            phase.step(
                f"C={concurrency}: {summary['completed']} ok, {summary['failed']} failed, "
                f"{summary['output_throughput_tok_s']:.0f} output tok/s, TTFT mean "
                f"{summary['ttft_ms']['mean']:.0f} / p99 {summary['ttft_ms']['p99']:.0f} ms, TPOT mean "
                f"{summary['tpot_ms']['mean']:.1f} ms, {summary['duration_s']:.1f} s"
            )
        else:
            phase.step(f"C={concurrency}: every request failed: {summary['errors']}")


def clear_shared_cache() -> None:
    """Empty the shared cache and forget the starts that filled it."""
    shutil.rmtree(SHARED_CACHE_DIR, ignore_errors=True)
    for marker in ("stack-cold-done", "warm-start-done"):
        (WORK_DIR / marker).unlink(missing_ok=True)


KV_CACHE_FACTS = (
    "available_kv_cache_gib",
    "kv_cache_tokens",
    "max_concurrency",
    "max_concurrency_context_tokens",
    "kv_cache_log_lines",
)


def kv_cache_facts(start: dict[str, Any]) -> dict[str, Any]:
    """What a server start logged about its KV cache (None where it logged nothing)."""
    return {key: start["facts"].get(key) for key in KV_CACHE_FACTS}


def checked_stack_arguments(phase: Phase, lab: Lab) -> list[str]:
    """The stack's lab arguments, recorded in the phase with the installed vLLM parser's verdict;
    ServerFailedError when that parser rejects them."""
    args = lab.plan["lab"]["serve_args"]
    phase.result["serve_args"] = args
    phase.result["parser_check"] = check_arguments_with_real_parser(lab, {"stack": args})
    phase.step(f"real parser: {phase.result['parser_check']}")
    if phase.result["parser_check"].get("stack") != "accepted":
        raise ServerFailedError("the installed vLLM rejects the stack's arguments; see parser_check")
    return args


def phase_stack(phase: Phase, lab: Lab) -> None:
    phase.result["changes_from_render"] = lab.plan["lab"]["changes"]
    args = checked_stack_arguments(phase, lab)
    clear_shared_cache()  # a cold start: as the first pod of a new revision
    phase.step(f"cleared the shared compile cache {SHARED_CACHE_DIR} for a cold start")
    with GpuSampler() as sampler:
        server, cold = phase.start_server(
            "stack-cold", args, until="health", timeout_s=lab.health_timeout_cold_s
        )
        phase.result["cold_start_s"] = cold["ready_s"]
        (WORK_DIR / "stack-cold-done").write_text(str(cold["ready_s"]))
        phase.result["kv_cache"] = kv_cache_facts(cold)
        try:
            # Levels before the warm restart: the defaults phase repeats a restart that found no time.
            run_levels(phase, lab, ordered_levels(lab.workload), sampler)
            phase.result["gpu_peak_while_serving"] = sampler.window(cold["launched_at"], time.time())
        finally:
            phase.stop_server(server)
    warm_restart(phase, lab, args)


def warm_restart(phase: Phase, lab: Lab, args: list[str]) -> None:
    """Second start with the shared compile cache kept and fresh per-pod folders: a new replica."""
    if phase.remaining() < EXPECTED_START_S["health"]:
        phase.step(
            f"warm restart skipped: {phase.remaining():.0f} s left, a start takes up to"
            f" {EXPECTED_START_S['health']:.0f} s"
        )
        return
    try:
        server, warm = phase.start_server(
            "stack-warm", args, until="health", timeout_s=lab.health_timeout_warm_s
        )
    except ServerFailedError as error:
        if "no health within" not in str(error) or phase.remaining() > 30:
            raise
        phase.step("warm restart ran out of phase time (the defaults phase runs it first)")
        return
    phase.result["warm_start_s"] = warm["ready_s"]
    (WORK_DIR / "warm-start-done").write_text(str(warm["ready_s"]))
    phase.stop_server(server)


def folder_inventory(root: Path, depth: int = 3) -> dict[str, dict[str, int]]:
    """Files and bytes under each folder of `root` down to `depth` levels: what a start left there."""
    inventory: dict[str, dict[str, int]] = {}
    if not root.is_dir():
        return inventory
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        parts = path.relative_to(root).parts[:-1][:depth]
        key = "/".join(parts) or "."
        entry = inventory.setdefault(key, {"files": 0, "bytes": 0})
        entry["files"] += 1
        with contextlib.suppress(OSError):
            entry["bytes"] += path.stat().st_size
    return dict(sorted(inventory.items()))


def phase_warmstart(phase: Phase, lab: Lab) -> None:
    """A new replica's start: the stack's arguments on an empty shared cache (cold), then again with
    the shared cache kept and the pod's HOME and TMPDIR emptied (warm), as the serving unit deploys
    it (VLLM_CACHE_ROOT with the JIT caches inside it on the shared volume)."""
    phase.result["env"] = lab.plan["lab"]["env"]
    args = checked_stack_arguments(phase, lab)
    clear_shared_cache()
    phase.step(f"cleared the shared cache {SHARED_CACHE_DIR}: the first pod of a new revision")
    for name, key, timeout_s in (
        ("stack-cold", "cold_start_s", lab.health_timeout_cold_s),
        ("stack-warm", "warm_start_s", lab.health_timeout_warm_s),
    ):
        if phase.remaining() < EXPECTED_START_S["health"]:
            phase.result.setdefault("skipped_starts", []).append(name)
            phase.step(f"{name}: skipped, {phase.remaining():.0f} s left")
            continue
        server, start = phase.start_server(name, args, until="health", timeout_s=timeout_s)
        phase.result[key] = start["ready_s"]
        if name == "stack-cold":
            (WORK_DIR / "stack-cold-done").write_text(str(start["ready_s"]))
        try:
            phase.result.setdefault("first_requests", {})[name] = warm_up(phase, lab)
        finally:
            phase.stop_server(server)
        # What this start wrote: into the shared cache (kept) and into the pod's HOME/TMPDIR (lost).
        phase.result.setdefault("shared_cache_after", {})[name] = folder_inventory(SHARED_CACHE_DIR)
        phase.result.setdefault("pod_folders_after", {})[name] = folder_inventory(pod_scratch())
        phase.save()
    if "warm_start_s" in phase.result:
        (WORK_DIR / "warm-start-done").write_text(str(phase.result["warm_start_s"]))


def ordered_levels(workload: dict[str, Any]) -> list[int]:
    """The workload's concurrency levels, most important first (its `level_order`)."""
    levels = [int(c) for c in workload["concurrency"]]
    preferred = [c for c in workload.get("level_order", []) if c in levels]
    return preferred + [c for c in levels if c not in preferred]


def phase_defaults(phase: Phase, lab: Lab) -> None:
    args = lab.plan["defaults"]["serve_args"]
    phase.result["serve_args"] = args
    probes = {probe["name"]: probe["serve_args"] for probe in lab.plan["probes"]}
    phase.result["parser_check"] = check_arguments_with_real_parser(lab, {"defaults": args, **probes})
    phase.step(f"real parser: {phase.result['parser_check']}")
    if phase.result["parser_check"].get("defaults") != "accepted":
        raise ServerFailedError("the installed vLLM rejects the defaults arguments; see parser_check")
    # The comparison first: on 2026-11-29 a deferred warm restart ran first, took 207 s, and left
    # the defaults server 80 s to start (it needs ~200 s), so no level ran.
    with GpuSampler() as sampler:
        server, start = phase.start_server(
            "defaults", args, until="health", timeout_s=lab.health_timeout_cold_s
        )
        phase.result["start_s"] = start["ready_s"]
        phase.result["kv_cache"] = kv_cache_facts(start)
        try:
            run_levels(phase, lab, ordered_levels(lab.workload), sampler)
        finally:
            phase.stop_server(server)
    # Only after the stack phase's cold start on this host filled the shared cache with the stack's
    # compile; otherwise a "warm" restart would be a cold one.
    if (WORK_DIR / "stack-cold-done").exists() and not (WORK_DIR / "warm-start-done").exists():
        phase.step("the stack phase had no time for its warm restart: running it now, if time allows")
        try:
            warm_restart(phase, lab, lab.plan["lab"]["serve_args"])
        except ServerFailedError as error:
            phase.result["warm_restart_error"] = str(error)[:3000]
    # Calibration points for the capacity planner, cheapest first: the stack's arguments at another
    # utilisation reuse the stack phase's compile cache (utilisation is not part of its key).
    stack_probes = [probe for probe in lab.plan["probes"] if probe["name"].startswith("stack-")]
    run_probes(phase, lab, stack_probes)
    run_capacity(phase, lab, lab.plan["capacity"]["runs"]["defaults"], minimum_s=200)
    run_probes(phase, lab, [probe for probe in lab.plan["probes"] if probe not in stack_probes])


def run_capacity(phase: Phase, lab: Lab, names: list[str], minimum_s: float) -> None:
    """The capacity engineer's runs (bench/capacity/measure_kv_cache.py) in the time left.

    Its observations file lives in the work folder, so runs of an earlier phase stay in it, and is
    copied into the output folder after each call.
    """
    results = phase.result.setdefault("capacity_runs", {})
    if not names:  # the script runs every planned run when given no --only: an empty list means none
        results["not_run"] = "none requested"
        return
    if lab.dry_run_cpu or not CAPACITY_SCRIPT.exists():
        results["not_run"] = "CPU rehearsal" if lab.dry_run_cpu else f"{CAPACITY_SCRIPT} is absent"
        return
    if phase.remaining() < minimum_s:
        results["skipped"] = {"runs": names, "remaining_s": round(phase.remaining())}
        phase.step(f"capacity runs {names}: skipped, {phase.remaining():.0f} s left")
        return
    observations = WORK_DIR / "kv_cache_observations.json"
    per_run = max(60.0, min(540.0, phase.remaining() - 40))
    command = [
        lab.python,
        str(CAPACITY_SCRIPT),
        str(REPO_ROOT / lab.plan["capacity"]["plan_file"]),
        "--out",
        str(observations),
        "--log-dir",
        str(WORK_DIR / "capacity-logs"),
        "--timeout-seconds",
        f"{per_run:.0f}",
    ]
    for name in names:
        command += ["--only", name]
    phase.step(f"capacity runs: {' '.join(command)}")
    status = run_group(
        command,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        timeout_s=max(30.0, phase.remaining() - 15),
        log=WORK_DIR / "logs" / f"{phase.name}-capacity.log",
    )
    phase.other_logs.append(
        (f"capacity runs: {' '.join(command)}", WORK_DIR / "logs" / f"{phase.name}-capacity.log")
    )
    results[",".join(names)] = status
    if observations.exists():
        shutil.copy(observations, phase.out_dir / "kv_cache_observations.json")
    phase.step(f"capacity runs finished: {status}")


def run_probes(phase: Phase, lab: Lab, probes: list[dict[str, Any]]) -> None:
    """Start, wait for the KV-cache lines, stop: the capacity planner's calibration points."""
    results = phase.result.setdefault("kv_probes", {})
    for probe in probes:
        if phase.remaining() < EXPECTED_START_S["kv"]:
            results[probe["name"]] = {"skipped": f"{phase.remaining():.0f} s left"}
            phase.step(f"probe {probe['name']}: skipped for time")
            continue
        try:
            server, start = phase.start_server(
                probe["name"],
                probe["serve_args"],
                until="kv",
                timeout_s=min(lab.health_timeout_cold_s, phase.remaining() - 30),
            )
        except ServerFailedError as error:
            results[probe["name"]] = {"error": str(error)[:2000]}
            continue
        results[probe["name"]] = {
            "serve_args": probe["serve_args"],
            "ready_s": start["ready_s"],
            **kv_cache_facts(start),
            "model_load_gib": start["facts"].get("model_load_gib"),
        }
        phase.stop_server(server, grace_s=5)  # mid-start: nothing to drain


def phase_baseline(phase: Phase, lab: Lab) -> None:
    baseline = lab.baseline
    if not lab.dry_run_cpu:
        phase.result["gpu_free"] = wait_gpu_free(timeout_s=90)
    # Transformers first, then the capacity runs (if any) in what is left: Qwen at 0.90 compiles
    # (~3 min), at 0.60 it reuses the compile cache (~1 min). On 2026-11-29 the reserve was taken
    # with no runs requested and left Transformers 90 s.
    capacity_names = lab.plan["capacity"]["runs"]["baseline"]
    capacity_reserve = 240 if capacity_names and CAPACITY_SCRIPT.exists() and not lab.dry_run_cpu else 0
    budget = max(90.0, phase.remaining() - capacity_reserve - 20)
    out = phase.out_dir / "baseline-transformers.json"
    command = [
        lab.python,
        "-m",
        "bench.serving.hf_baseline",
        "--model-dir",
        lab.model_dir,
        "--out",
        str(out),
        "--batch-sizes",
        ",".join(str(b) for b in baseline["batch_sizes"]),
        "--input-len",
        str(baseline["input_len"]),
        "--output-len",
        str(baseline["output_len"]),
        "--device",
        "cpu" if lab.dry_run_cpu else "cuda",
        "--budget-s",
        f"{budget:.0f}",
    ]
    phase.step(f"Transformers baseline, budget {budget:.0f} s: {' '.join(command)}")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if lab.dry_run_cpu:
        env["PYTHONPATH"] = str(REPO_ROOT)
    status = run_group(
        command, env=env, timeout_s=budget + 60, log=WORK_DIR / "logs" / "baseline-transformers.log"
    )
    phase.other_logs.append(
        (f"Transformers: {' '.join(command)}", WORK_DIR / "logs" / "baseline-transformers.log")
    )
    phase.result["transformers_exit"] = status
    if out.exists():
        phase.result["transformers"] = json.loads(out.read_text())
        out.unlink()  # folded into baseline.json: fewer files to carry back
    phase.step(f"Transformers baseline finished: {status}")
    run_capacity(phase, lab, capacity_names, minimum_s=120)


def run_group(command: list[str], *, env: dict[str, str], timeout_s: float, log: Path) -> str:
    """Run a command in its own process group with a hard timeout; its output streams to ours and a log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    from bench.serving.server import _register, _unregister, kill_group

    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        _register(process.pid)
        deadline = time.time() + timeout_s
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        while process.poll() is None and time.time() < deadline:
            chunk = process.stdout.read()
            if chunk:
                sink.write(chunk)
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            time.sleep(0.2)
        timed_out = process.poll() is None
        kill_group(process.pid, grace_s=10, leader=process)
        with contextlib.suppress(OSError, TypeError):
            rest = process.stdout.read()
            if rest:
                sink.write(rest)
                sys.stdout.write(rest.decode(errors="replace"))
        _unregister(process.pid)
    return f"timed out after {timeout_s:.0f} s" if timed_out else f"exit {process.returncode}"


def phase_selftest(phase: Phase, lab: Lab) -> bool:
    from bench.serving.fake_server import FakeBehaviour, fake_vllm_server
    from bench.serving.vllm_log import kv_cache_ready, parse_log

    checks: dict[str, Any] = {}
    phase.result["checks"] = checks
    checks["versions"] = phase.result.get("software") or software_versions(lab.python)
    phase.step(f"versions: {checks['versions']}")
    model_dir = Path(lab.model_dir)
    checks["model_dir"] = {
        "path": str(model_dir),
        "config": (model_dir / "config.json").exists(),
        "tokenizer": (model_dir / "tokenizer.json").exists(),
    }
    lists = {
        "stack": lab.plan["lab"]["serve_args"],
        "defaults": lab.plan["defaults"]["serve_args"],
        **{probe["name"]: probe["serve_args"] for probe in lab.plan["probes"]},
    }
    checks["parser"] = check_arguments_with_real_parser(lab, lists)
    phase.step(f"real parser: {checks['parser']}")
    with fake_vllm_server(
        FakeBehaviour(first_token_delay_s=0.05, token_interval_s=0.001, stream_interval=4)
    ) as port:
        level = loadgen.run_level(
            loadgen.Target("127.0.0.1", port, "fake"),
            concurrency=4,
            num_prompts=8,
            input_len=16,
            output_len=32,
            token_id_range=(3, 100),
            time_cap_s=20,
            processes=2,
        )
    summary = level["summary"]
    checks["loadgen"] = {
        "completed": summary["completed"],
        "failed": summary["failed"],
        "ttft_mean_ms": summary.get("ttft_ms", {}).get("mean"),
    }
    sample = [
        "(EngineCore pid=1) INFO 11-29 10:00:00 [gpu_worker.py:561] Available KV cache memory: 101.5 GiB",
        "INFO 11-29 10:00:00 [kv_cache_utils.py:2177] GPU KV cache size: 1,662,944 tokens",
        "INFO 11-29 10:00:00 [kv_cache_utils.py:2179] Maximum concurrency for 16,384 tokens per request: "
        "101.50x",
    ]
    checks["log_parser"] = kv_cache_ready(parse_log(sample))
    checks["gpu_memory_mib"] = gpu_memory_mib()
    checks["capacity_script"] = CAPACITY_SCRIPT.exists()
    capacity_plan = REPO_ROOT / lab.plan["capacity"]["plan_file"]
    if capacity_plan.exists():
        planned = {run["name"] for run in json.loads(capacity_plan.read_text())["runs"]}
        wanted = [name for names in lab.plan["capacity"]["runs"].values() for name in names]
        checks["capacity_runs_unknown"] = sorted(set(wanted) - planned)
    checks["qwen_model_dir"] = (Path("/tmp/m/qwen7b") / "config.json").exists()
    for name, module in (("matplotlib", "matplotlib"), ("transformers", "transformers")):
        found = subprocess.run([lab.python, "-c", f"import {module}"], capture_output=True, timeout=120)
        checks[f"import_{name}"] = found.returncode == 0
    ok = (
        all(value == "accepted" for name, value in checks["parser"].items() if name != "snapshot")
        and checks["loadgen"]["completed"] == 8
        and checks["log_parser"]
        and checks["model_dir"]["config"]
        and checks["model_dir"]["tokenizer"]
        and checks["import_transformers"]
    )
    phase.result["ok"] = ok
    phase.step(f"selftest {'PASSED' if ok else 'FAILED'}: {json.dumps(checks, default=str)}")
    return ok


PHASES = {
    "stack": phase_stack,
    "defaults": phase_defaults,
    "baseline": phase_baseline,
    "warmstart": phase_warmstart,
}


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("phase", choices=["selftest", *PHASES])
    cli.add_argument("--out", type=Path, required=True)
    cli.add_argument("--budget-s", type=float, default=500, help="stop starting new steps after this long")
    cli.add_argument("--plan", type=Path, default=PLAN_FILE)
    cli.add_argument(
        "--dry-run-cpu", action="store_true", help="rehearse on the vLLM CPU build with a tiny model"
    )
    args = cli.parse_args()

    plan = json.loads(args.plan.read_text())
    lab = Lab.create(plan, args.dry_run_cpu)
    phase = Phase(args.phase, args.out, args.budget_s, lab)

    def on_signal(signum: int, _frame: Any) -> None:
        phase.say(f"signal {signum}: stopping servers")
        phase.finish(f"interrupted by signal {signum}")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    atexit.register(kill_registered)
    leftovers = kill_registered()
    if leftovers:
        phase.step(f"stopped process groups left by an earlier run: {leftovers}")
    phase.result["software"] = software_versions(lab.python)
    phase.result["plan"] = {
        "stack": plan["stack"],
        "model": plan["model"],
        "tuning_profile": plan["tuning_profile"],
        "stack_vllm_version": plan["stack_vllm_version"],
    }
    phase.say(f"budget {args.budget_s:.0f} s, software {phase.result['software']}")
    try:
        if args.phase == "selftest":
            ok = phase_selftest(phase, lab)
            phase.finish("passed" if ok else "failed")
            return 0 if ok else 1
        PHASES[args.phase](phase, lab)
    except Exception as error:  # report, stop servers, keep the data so far
        phase.result["error"] = f"{type(error).__name__}: {error}"[:4000]
        phase.finish("failed")
        return 1
    phase.finish("completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
