"""Serving and start-up measurements on the lab GPU host, one vLLM server at a time.

    PYTHONPATH=/tmp/site python3 bench/serving/lab.py --out DIR --deadline EPOCH_S [--jobs s01,s02,...]
    python3 bench/serving/lab.py --print-preparation   # adapters, rank, real weights: what lab.sh makes

Runs the session of lab_plan.json ("session": jobs in priority order). A job starts one `vllm serve`
(the plan's base arguments, the configuration's, the job's weight loader) with the environment the
prod stack renders for its 8B model ("stack_env", kept equal to the render by
tests/test_bench_serving_lab.py), its caches in the job's cache folder, a fresh HOME and TMPDIR as a
new pod gets, and stamps every line the server prints with the wall clock (for bench/startup's
phases). It waits for /health, measures the job's concurrency levels with vLLM's own benchmark client
(`vllm.benchmarks.serve`, exactly what `vllm bench serve` runs, called in this process so its imports
are paid once) and stops the server before the next job starts.

Every client run draws its own prompts: `--seed` is the session's base seed plus a run counter, printed
and recorded in the result file (`lab_seed`) and session.json. A run with a failed request is moved to
DIR/discarded/ and run again with the next seed (at most twice). The host's load average, CPU busy share
and GPU use are sampled during every run.

Jobs that would not finish before the deadline are skipped (their estimate is in the plan); later,
smaller jobs still run. Other job types: `concurrent` (several servers started at the same moment on
one cache, then stopped), `imports` (`python -X importtime` of the server's modules, with and without
bytecode) and `wake` (a model at zero replicas gets its first request: one streamed completion sent as
the server is spawned and retried every 0.25 s until it is accepted, as the router holds and retries
it; time to /health, to the first and the last streamed token; `burst` more streams at the same moment).
`--session NAME` runs the plan's list NAME instead of "session" (e.g. "wake_session").

The configuration named `tuned` has no arguments of its own: they are chosen from the ablation results
already in DIR by the rule in lab_plan.json ("tuned_rule").

Only the Python standard library and vLLM (on the GPU host) are needed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

PLAN = Path(__file__).resolve().parent / "lab_plan.json"
LAB = Path(os.environ.get("LAB_DIR", "/tmp/lab"))
SITE = os.environ.get("LAB_SITE", "/tmp/site")
REPO = Path(os.environ.get("LAB_REPO", os.getcwd()))
LAB_API_KEY = "lab-key-not-a-secret"
MAX_RERUNS = 2


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


def gpu_name() -> str:
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def model_folder_facts(model_dir: Path) -> dict[str, int]:
    """The model's output ids (config.json `vocab_size`) and how many of them the folder's tokenizer
    knows (tokenizer.json's vocabulary and added tokens below `vocab_size`). A server whose random
    weights emit ids its tokenizer lacks spends ~9x as long detokenising them (bench/serving/
    detokenize.py), so session.json records it; bench/serving/mkmodel.py's folder knows every id."""
    config, tokenizer = model_dir / "config.json", model_dir / "tokenizer.json"
    if not (config.exists() and tokenizer.exists()):
        return {}
    vocab_size = json.loads(config.read_text())["vocab_size"]
    data = json.loads(tokenizer.read_text())
    ids = set(data["model"]["vocab"].values()) | {token["id"] for token in data.get("added_tokens", [])}
    return {"model_vocab": vocab_size, "tokenizer_knows": len({i for i in ids if 0 <= i < vocab_size})}


def gpu_processes() -> list[str]:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
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


# --- the server's environment: what the prod stack renders, with the pod's paths mapped into the lab ---


def server_environment(
    plan: dict[str, Any], *, pod_dir: Path, cache_dir: Path, bytecode: str, api_key: bool,
    base: dict[str, str] | None = None,
) -> dict[str, str]:  # fmt: skip
    """The vLLM container's environment from the prod render (`stack_env`), mapped onto lab paths.

    The shared-volume cache root becomes `cache_dir`, HOME and TMPDIR fresh folders of this "pod",
    PYTHONPATH the auth module's folder (as the ConfigMap mount) plus the lab's vLLM install. The
    host's own variables (PATH, CUDA) stay unless the render sets the same name.

    `bytecode` emulates the image: "none" is the upstream image (no .pyc files) on the stack's
    read-only root filesystem without PYTHONPYCACHEPREFIX (the render before issue 24), where every
    process compiles every module from source; "shared" points PYTHONPYCACHEPREFIX at
    `<cache_dir>/pycache`, as the render now does (bytecode kept on the shared volume); "host" leaves
    the lab install's own bytecode in use.
    """
    paths = plan["stack_paths"]
    env = dict(os.environ if base is None else base)
    for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE", "VLLM_API_KEY", "OPENAI_API_KEY"):
        env.pop(name, None)
    for name, value in plan["stack_env"].items():
        if value.startswith(paths["cache_root"]):
            value = str(cache_dir) + value[len(paths["cache_root"]) :]
        elif name == "HOME":
            value = str(pod_dir / "home")
        elif name == "TMPDIR":
            value = str(pod_dir / "tmp")
        elif name == "PYTHONPATH":
            value = f"{REPO / paths['auth_module_dir']}:{SITE}"
        env[name] = value
    (pod_dir / "home").mkdir(parents=True, exist_ok=True)
    (pod_dir / "tmp").mkdir(parents=True, exist_ok=True)
    if bytecode == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["PYTHONPYCACHEPREFIX"] = str(pod_dir / "no-bytecode")  # empty: nothing is read from it
    elif bytecode == "shared":
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir / "pycache")
    elif bytecode != "host":
        raise ValueError(f"bytecode must be none, shared or host, not {bytecode!r}")
    if api_key:
        env["VLLM_API_KEY"] = LAB_API_KEY
    env["PYTHONUNBUFFERED"] = "1"  # lines reach the stamping pipe when printed
    return env


def tenant_files(plan: dict[str, Any], pod_dir: Path) -> tuple[dict[str, str], str]:
    """The prod pod's tenant mode in the lab: the tenants file the 8B model's ConfigMap renders
    (`stack_tenants`) and one key file per tenant (`<tenant>.key0`, the tenant's prefix first), as
    the Secrets Store CSI driver mounts them. Returns the middleware's environment and the key the
    client sends: the first tenant allowed on the served name."""
    # Without the tenants' in-flight shares (issue 34): prod spreads them over at least two replicas,
    # while this one lab server takes the whole load (256 streams of one tenant's key would be mostly
    # 429s); the middleware's code path is otherwise the prod pod's.
    document = {
        **plan["stack_tenants"],
        "tenants": {
            name: {key: value for key, value in entry.items() if key != "max_in_flight"}
            for name, entry in plan["stack_tenants"]["tenants"].items()
        },
    }
    auth, keys = pod_dir / "auth", pod_dir / "tenant-keys"
    auth.mkdir(parents=True, exist_ok=True)
    keys.mkdir(parents=True, exist_ok=True)
    (auth / "tenants.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    client_key = ""
    for tenant, entry in sorted(document["tenants"].items()):
        key = f"{entry['key_prefix']}{LAB_API_KEY}-{tenant}"
        (keys / f"{tenant}.key0").write_text(key + "\n")
        if not client_key and plan["served_model_name"] in entry["models"]:
            client_key = key
    if not client_key:
        raise ValueError(f"stack_tenants allows no tenant on {plan['served_model_name']}")
    env = {
        "VLLM_PLATFORM_TENANTS": str(auth / "tenants.json"),
        "VLLM_PLATFORM_TENANT_MOUNT": str(keys),
        # As the pod's /dev/shm: its API-server processes share one cache-salt secret (issue 49).
        "VLLM_PLATFORM_STATE_DIR": str(pod_dir / "shm"),
    }
    return env, client_key


def lora_names(args: list[str]) -> list[str]:
    """The adapter names a configuration registers (`--lora-modules name=path ...`), in order."""
    if "--lora-modules" not in args:
        return []
    names = []
    for token in args[args.index("--lora-modules") + 1 :]:
        if token.startswith("--"):
            break
        names.append(token.split("=", 1)[0])
    return names


def server_argv(plan: dict[str, Any], job: dict[str, Any], args: list[str], port: int) -> list[str]:
    load = job.get("load", "dummy")
    model_dir = plan["model_dir"] if load == "dummy" else plan["real_model_dir"]
    load_args = {
        "dummy": ["--load-format", "dummy"],
        "default": [],
        "fastsafetensors": ["--load-format", "fastsafetensors"],
    }[load]
    args = list(args)
    if "gpu_util" in job:
        if "--gpu-memory-utilization" in args:
            index = args.index("--gpu-memory-utilization")
            del args[index : index + 2]
        args += ["--gpu-memory-utilization", str(job["gpu_util"])]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
            "--served-model-name", plan["served_model_name"], "--host", "127.0.0.1", "--port", str(port),
            *plan["base_args"], *load_args, *args]  # fmt: skip


class Server:
    """One `vllm serve` in its own process group; every output line stamped `<epoch s> ` into `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.handle = log.open("wb")
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.handle.write(f"{self.started_wall:.3f} LAB-START {' '.join(argv)}\n".encode())
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self._reader = threading.Thread(target=self._stamp, daemon=True)
        self._reader.start()

    def _stamp(self) -> None:
        assert self.process.stdout is not None
        for raw in iter(self.process.stdout.readline, b""):
            self.handle.write(f"{time.time():.3f} ".encode() + raw)
            self.handle.flush()

    def healthy(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_healthy(self, url: str, timeout_s: float, interval_s: float = 0.5) -> float:
        deadline = self.started + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name}: vLLM exited with {self.process.returncode} (log {self.log})"
                )
            if self.healthy(url):
                seconds = time.monotonic() - self.started
                self.handle.write(f"{time.time():.3f} LAB-HEALTHY {seconds:.1f}\n".encode())
                return seconds
            time.sleep(interval_s)
        raise RuntimeError(f"{self.name}: no /health within {timeout_s} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # API-server and engine-core children
        self._reader.join(timeout=10)
        self.handle.write(f"{time.time():.3f} LAB-STOPPED\n".encode())
        self.handle.close()


def host_preparation(plan: dict[str, Any], session: str = "session") -> tuple[int, int, bool]:
    """What lab.sh prepares on the host before the session (stage 00): how many LoRA adapters the
    plan's configurations name and their largest `--max-lora-rank` (bench/lora/make_adapters.py), and
    whether a job of the plan's list `session` loads real weights (the 16 GB checkpoint, mkckpt.py)."""
    count = rank = 0
    for config in plan["configs"].values():
        args = config.get("args") or []
        if lora_names(args):
            count = max(count, len(lora_names(args)))
            rank = max(rank, int(args[args.index("--max-lora-rank") + 1]))
    real = any(job.get("load", "dummy") != "dummy" for job in plan[session])
    return count, rank, real


def result_name(label: str, concurrency: int, adapters: list[str] | None = None) -> str:
    """`<label>-c<C>.json`, or `<label>-c<C>-a<N>.json` for a run with N LoRA adapters in use."""
    suffix = "" if adapters is None else f"-a{len(adapters)}"
    return f"{label}-c{concurrency}{suffix}.json"


def bench_args(
    plan: dict[str, Any], label: str, concurrency: int, out: Path, load: dict[str, Any], seed: int,
    prompts: int, api_key: bool | str, adapters: list[str] | None = None,
) -> argparse.Namespace:  # fmt: skip
    """vLLM's client arguments for one run. `api_key`: False, True (the lab's VLLM_API_KEY) or the key
    to send (a tenant's); `adapters`: the LoRA adapter names the requests go to in turn (round-robin),
    [] for a LoRA server's base model, None for a server without LoRA."""
    from vllm.benchmarks.serve import add_cli_args

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # older layout
        from vllm.utils import FlexibleArgumentParser
    workload = plan["workload"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = [
        "--backend", "vllm", "--base-url", f"http://127.0.0.1:{plan['port']}",
        "--model", plan["served_model_name"], "--tokenizer", plan["model_dir"],
        "--dataset-name", "random", "--random-input-len", str(workload["input_len"]),
        "--random-output-len", str(workload["output_len"]), "--ignore-eos",
        "--temperature", str(workload["temperature"]),
        "--max-concurrency", str(concurrency), "--num-prompts", str(prompts), "--seed", str(seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--result-dir", str(out),
        "--result-filename", result_name(label, concurrency, adapters),
        "--metadata", f"lab_config={label.rsplit('-s', 1)[0]}", f"lab_seed={seed}",
        f"load1_before={load['loadavg'][0]:.2f}",
        *([] if adapters is None else [f"lab_adapters={len(adapters)}"]),
    ]  # fmt: skip
    if adapters:  # each request names the next adapter; vLLM routes it to the base plus that adapter
        argv += ["--lora-modules", *adapters, "--lora-assignment", "round-robin"]
    if api_key:  # vLLM's client sends OPENAI_API_KEY as a bearer token on every request
        key = LAB_API_KEY if api_key is True else str(api_key)
        os.environ["OPENAI_API_KEY"] = key
        argv += ["--header", f"Authorization=Bearer {key}"]
    else:
        os.environ.pop("OPENAI_API_KEY", None)
    return parser.parse_args(argv)


def prompts_for(plan: dict[str, Any], concurrency: int) -> int:
    workload = plan["workload"]
    fixed = workload.get("prompts", {}).get(str(concurrency))
    return fixed or max(workload["min_prompts"], workload["prompts_per_concurrency"] * concurrency)


class Session:
    """The raw folder's session.json, the seed counter and the deadline."""

    def __init__(self, out: Path, plan: dict[str, Any], deadline: float, seed_base: int) -> None:
        self.out, self.plan, self.deadline = out, plan, deadline
        self.file = out / "session.json"
        self.data: dict[str, Any] = (
            json.loads(self.file.read_text()) if self.file.exists() else {"jobs": {}, "runs": []}
        )
        self.data.setdefault("seed_base", seed_base)
        self.seed_base = self.data["seed_base"]

    def next_seed(self) -> int:
        return self.seed_base + len(self.data["runs"])

    def save(self) -> None:
        self.file.write_text(json.dumps(self.data, indent=1))

    def left(self) -> float:
        return self.deadline - time.time()


BenchFn = Callable[[argparse.Namespace], dict[str, Any]]


def measure_level(
    session: Session,
    bench: BenchFn,
    label: str,
    level: int,
    api_key: bool | str,
    args_for: Callable[..., argparse.Namespace] | None = None,
    adapters: list[str] | None = None,
) -> dict[str, Any]:
    """One client run at `level` (fresh seed); a run with a failed request is discarded and re-run.
    `adapters`: a LoRA server's run with these adapters in use ([]: its base model only)."""
    out, plan = session.out, session.plan
    what = "" if adapters is None else f" a={len(adapters)}"
    for attempt in range(MAX_RERUNS + 1):
        seed = session.next_seed()
        prompts = prompts_for(plan, level)
        with HostSampler() as sampler:
            make = args_for or bench_args
            extra = {} if adapters is None else {"adapters": adapters}
            result = bench(make(plan, label, level, out, sampler.before, seed, prompts, api_key, **extra))
        host = sampler.summary()
        file = out / result_name(label, level, adapters)
        ok = result.get("failed", 1) == 0 and result.get("completed") == prompts
        run = {"label": label, "level": level, "seed": seed, "prompts": prompts, "attempt": attempt,
               "ok": ok, "host": host, "file": file.name}  # fmt: skip
        if adapters is not None:
            run["adapters"] = len(adapters)
        session.data["runs"].append(run)
        say(
            f"{label} c={level}{what} seed={seed}: {result.get('output_throughput', 0):.0f} output tok/s, "
            "TTFT mean "
            f"{result.get('mean_ttft_ms', 0):.0f} p99 {result.get('p99_ttft_ms', 0):.0f} ms, TPOT mean "
            f"{result.get('mean_tpot_ms', 0):.1f} ms, {result.get('completed')}/{prompts} done, "
            f"{result.get('failed')} failed, CPU busy {host['mean_cpu_busy_pct']} %"
        )
        if ok:
            session.save()
            return run
        discarded = out / "discarded"
        discarded.mkdir(exist_ok=True)
        kept = f"{file.stem}-seed{seed}.json"
        if file.exists():
            file.rename(discarded / kept)
        run["file"] = f"discarded/{kept}"
        say(f"{label} c={level}{what}: {result.get('failed')} failed requests, run discarded")
        session.save()
    return run


def prepare_cache(session: Session, job: dict[str, Any]) -> Path:
    caches = LAB / "caches"
    cache = caches / job["cache"]
    source = job.get("copy_cache_from")
    if source and not cache.exists():
        began = time.monotonic()
        shutil.copytree(caches / source, cache, symlinks=True)
        seconds = time.monotonic() - began
        size = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())
        session.data["jobs"][job["id"]]["cache_copy"] = {
            "from": source,
            "bytes": size,
            "seconds": round(seconds, 1),
        }
        say(f"{job['id']}: copied cache {source} -> {job['cache']} ({size / 1e6:.0f} MB in {seconds:.1f} s)")
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def evict_page_cache(directory: Path) -> int:
    """Drop the checkpoint's pages from the page cache (POSIX_FADV_DONTNEED), so a load reads the disk."""
    evicted = 0
    for path in sorted(directory.glob("*.safetensors")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            evicted += path.stat().st_size
        finally:
            os.close(fd)
    return evicted


def config_args(session: Session, name: str) -> list[str]:
    if name == "tuned":
        return tuned_args(session.out, session.plan)[0]
    return list(session.plan["configs"][name]["args"])


def start_record(
    session: Session, job: dict[str, Any], label: str, server: Server, cache: Path
) -> dict[str, Any]:
    return {
        "label": label, "config": job["config"], "case": job.get("case"), "cache": job["cache"],
        "bytecode": job.get("bytecode", "none"),
        "load": job.get("load", "dummy"), "argv": server.argv[2:], "log": server.log.name,
        "started_wall": server.started_wall,
    }  # fmt: skip


def start_server(session: Session, job: dict[str, Any]) -> tuple[Server, dict[str, Any], bool | str]:
    """One pod's start for a `server` or `wake` job: its cache folder, the checkpoint's pages dropped,
    the pod folder (HOME, TMPDIR) emptied, the stack's environment. Returns the server, the job's
    record and the API key its clients send (False, True for the lab's key, or a tenant's key)."""
    plan, out = session.plan, session.out
    config = plan["configs"][job["config"]]
    api_key: bool | str = bool(config.get("api_key"))
    record = session.data["jobs"].setdefault(job["id"], {})
    cache = prepare_cache(session, job)
    real = Path(plan["real_model_dir"]) / "model.safetensors.index.json"
    if job.get("load", "dummy") != "dummy" and not real.exists():
        record["load_fallback"] = f"{real} missing: dummy weights"
        job = {**job, "load": "dummy"}
    if job.get("load", "dummy") != "dummy":
        record["evicted_bytes"] = evict_page_cache(Path(plan["real_model_dir"]))
    wait_gpu_free()
    count = 1 + sum(
        1 for j in session.data["jobs"].values() if j.get("config") == job["config"] and "label" in j
    )
    label = f"{job['config']}-s{count}"
    # One path for every pod, emptied before each start: a pod's HOME is always /home/vllm (a fresh
    # emptyDir), and vLLM 0.26.0 hashes HOME-derived paths into its compile-cache key, so a folder per
    # server (the 2026-12-01-b session) made every lab start recompile where a pod would not.
    pod = LAB / "pod"
    shutil.rmtree(pod, ignore_errors=True)
    env = server_environment(
        plan, pod_dir=pod, cache_dir=cache, bytecode=job.get("bytecode", "none"), api_key=api_key is True
    )
    if config.get("tenants"):  # the prod pod's tenant mode: tenants file, key files, a tenant's key
        tenant_env, api_key = tenant_files(plan, pod)
        env.update(tenant_env)
    args = config_args(session, job["config"])
    argv = server_argv(plan, job, args, plan["port"])
    what = f"{job.get('case')}, cache {job['cache']}, bytecode {job.get('bytecode', 'none')}"
    say(f"{job['id']} {label}: starting ({what}, load {job.get('load', 'dummy')})")
    was_empty = not any(cache.iterdir())
    server = Server(label, argv, out / f"{label}-server.log", env)
    record.update(start_record(session, job, label, server, cache))
    record["cache_was_empty"] = was_empty
    session.save()
    return server, record, api_key


def run_server_job(session: Session, job: dict[str, Any], bench: BenchFn) -> None:
    plan = session.plan
    config = plan["configs"][job["config"]]
    server, record, api_key = start_server(session, job)
    label = server.name
    adapters = lora_names(config_args(session, job["config"]))
    try:
        record["start_to_health_s"] = round(
            server.wait_healthy(f"http://127.0.0.1:{plan['port']}/health", plan["start_timeout_s"]), 1
        )
        say(f"{job['id']} {label}: healthy after {record['start_to_health_s']} s")
        session.save()
        record["levels"] = {}
        # A LoRA configuration runs each level once per entry of `lora_in_use`: the first N adapters.
        in_use: list[int | None] = list(config.get("lora_in_use", [None]))
        for level in job.get("levels", []):
            for count in in_use:
                key = str(level) if count is None else f"{level}-a{count}"
                if session.left() < plan["estimates_s"]["level"][str(level)]:
                    say(f"{label} c={level} ({key}): skipped, {session.left():.0f} s left")
                    continue
                names = None if count is None else adapters[:count]
                run = measure_level(session, bench, label, level, api_key, adapters=names)
                record["levels"][key] = {
                    "file": run["file"],
                    "seed": run["seed"],
                    "ok": run["ok"],
                    "host": run["host"],
                }
                session.save()
    except Exception as error:  # recorded; the session goes on with the next job
        record["error"] = str(error)
        say(f"{job['id']} {label}: FAILED {error}")
    finally:
        server.stop()
        record["stopped_wall"] = time.time()
        session.save()
        time.sleep(3)  # the engine's memory is back before the next start checks free memory


def run_concurrent_job(session: Session, job: dict[str, Any]) -> None:
    """`count` servers started at the same moment on one cache folder, each on its own port."""
    plan, out = session.plan, session.out
    config = plan["configs"][job["config"]]
    record = session.data["jobs"].setdefault(job["id"], {})
    cache = prepare_cache(session, job)
    wait_gpu_free()
    servers = []
    record.update({"config": job["config"], "case": job.get("case"), "cache": job["cache"],
                   "cache_was_empty": not any(cache.iterdir()), "bytecode": job.get("bytecode", "none"),
                   "load": job.get("load", "dummy"), "servers": []})  # fmt: skip
    say(f"{job['id']}: starting {job['count']} servers at once on cache {job['cache']}")
    for index in range(job["count"]):
        port = plan["port"] + 1 + index
        label = f"{job['id']}-{index + 1}"
        env = server_environment(
            plan,
            pod_dir=LAB / "pods" / label,  # servers side by side need their own (paths differ)
            cache_dir=cache,
            bytecode=job.get("bytecode", "none"),
            api_key=bool(config.get("api_key")),
        )
        server = Server(
            label,
            server_argv(plan, job, config_args(session, job["config"]), port),
            out / f"{label}-server.log",
            env,
        )
        servers.append((server, port))
    try:
        results: dict[str, Any] = {}

        def wait(server: Server, port: int) -> None:
            try:
                results[server.name] = round(
                    server.wait_healthy(f"http://127.0.0.1:{port}/health", plan["start_timeout_s"]), 1
                )
            except Exception as error:
                results[server.name] = f"error: {error}"

        threads = [threading.Thread(target=wait, args=pair) for pair in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for server, port in servers:
            record["servers"].append(
                {
                    "label": server.name,
                    "port": port,
                    "log": server.log.name,
                    "started_wall": server.started_wall,
                    "start_to_health_s": results.get(server.name),
                    "argv": server.argv[2:],
                }
            )
            say(f"{job['id']} {server.name}: {results.get(server.name)}")
    finally:
        for server, _ in servers:
            server.stop()
        record["stopped_wall"] = time.time()
        session.save()


def run_imports_job(session: Session, job: dict[str, Any]) -> None:
    """`python -X importtime` of what `vllm serve` imports: as the read-only image (no bytecode), and
    with the bytecode earlier servers wrote to the cache folder (PYTHONPYCACHEPREFIX, "shared")."""
    record = session.data["jobs"].setdefault(job["id"], {"type": "imports", "runs": {}})
    modules = "import vllm.entrypoints.cli.main, vllm.entrypoints.openai.api_server, vllm.v1.engine.core"
    prefix = LAB / "caches" / job.get("cache", "main") / "pycache"  # written by earlier "shared" servers
    for mode in ("none", "read"):
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        if mode == "none":
            env.update({"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(LAB / "pycache-empty")})
        else:
            env["PYTHONPYCACHEPREFIX"] = str(prefix)
        target = session.out / f"importtime-{mode}.txt"
        began = time.monotonic()
        with target.open("w") as handle:
            command = [sys.executable, "-X", "importtime", "-c", modules]
            code = subprocess.run(
                command, env=env, stdout=subprocess.DEVNULL, stderr=handle, timeout=300
            ).returncode
        seconds = round(time.monotonic() - began, 2)
        record["runs"][mode] = {"wall_s": seconds, "rc": code, "file": target.name}
        say(f"{job['id']}: importtime bytecode={mode}: {seconds} s (rc {code})")
        session.save()


def stream_completion(
    base_url: str, body: dict[str, Any], headers: dict[str, str], t0: float, timeout_s: float,
    retry_s: float = 0.25,
) -> dict[str, Any]:  # fmt: skip
    """One streamed `/v1/completions`, first sent at monotonic `t0`; a refused or reset connection or a
    5xx answer is sent again `retry_s` later (the router holds a request while its model wakes and
    retries). Seconds from t0 to the accepting answer, the first and the last streamed token."""
    host, port = base_url.split("//", 1)[1].split(":")
    payload = json.dumps(body).encode()
    result: dict[str, Any] = {"attempts": 0}
    while time.monotonic() - t0 < timeout_s:
        result["attempts"] += 1
        connection = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        try:
            connection.request("POST", "/v1/completions", body=payload, headers=headers)
            response = connection.getresponse()
        except OSError:  # refused (nothing listening yet), reset, timed out
            connection.close()
            time.sleep(retry_s)
            continue
        result["status"] = response.status
        if response.status != 200:
            result["last_error"] = response.read()[:300].decode(errors="replace")
            connection.close()
            if response.status >= 500:
                time.sleep(retry_s)
                continue
            return result
        result["accepted_s"] = round(time.monotonic() - t0, 3)
        pieces = 0
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                result["completion_tokens"] = chunk["usage"].get("completion_tokens")
            if any(choice.get("text") for choice in chunk.get("choices") or []):
                now = round(time.monotonic() - t0, 3)
                result.setdefault("first_token_s", now)
                result["last_token_s"] = now
                pieces += 1
        result["chunks"] = pieces
        connection.close()
        return result
    result["error"] = f"no answer within {timeout_s} s"
    return result


def run_wake_job(session: Session, job: dict[str, Any]) -> None:
    """A model at zero replicas gets its first request: the pod starts (t0 = the server is spawned) and
    at t0 one streamed completion is sent (small prompt, `max_tokens` 16), retried every 0.25 s until
    the server takes it, with `burst` more streams at the same moment; /health is polled beside it.
    Records seconds from t0 to /health, to each stream's first and last token, and the host's load."""
    plan = session.plan
    wake = plan.get("wake_request", {})
    load_before = {"loadavg": list(os.getloadavg()), **gpu_sample(), "gpu_processes": gpu_processes()}
    server, record, api_key = start_server(session, job)
    t0 = server.started
    base_url = f"http://127.0.0.1:{plan['port']}"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {LAB_API_KEY if api_key is True else api_key}"
    streams: list[dict[str, Any]] = [{} for _ in range(1 + job.get("burst", 0))]

    def send(index: int) -> None:
        body = {"model": plan["served_model_name"], "prompt": f"{wake.get('prompt', 'Hello')} ({index})",
                "max_tokens": wake.get("max_tokens", 16), "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        try:
            streams[index] = stream_completion(base_url, body, headers, t0, plan["start_timeout_s"])
        except Exception as error:  # recorded beside the others
            streams[index] = {"error": str(error)}

    clients = [threading.Thread(target=send, args=(index,), daemon=True) for index in range(len(streams))]
    for client in clients:
        client.start()
    record.update({"type": "wake", "load_before": load_before, "burst": job.get("burst", 0)})
    try:
        with HostSampler() as sampler:
            health = server.wait_healthy(f"{base_url}/health", plan["start_timeout_s"], interval_s=0.25)
            record["start_to_health_s"] = round(health, 2)
            for client in clients:
                client.join(timeout=max(1.0, plan["start_timeout_s"] - (time.monotonic() - t0)))
        record["host"] = sampler.summary()
        record["first_request"] = streams[0]
        if len(streams) > 1:
            firsts = sorted(s["first_token_s"] for s in streams[1:] if "first_token_s" in s)
            lasts = sorted(s["last_token_s"] for s in streams[1:] if "last_token_s" in s)
            record["burst_streams"] = {
                "sent": len(streams) - 1, "served": len(firsts),
                "first_token_s": [firsts[0], firsts[len(firsts) // 2], firsts[-1]] if firsts else None,
                "last_token_s": [lasts[0], lasts[len(lasts) // 2], lasts[-1]] if lasts else None,
                "streams": streams[1:],
            }  # fmt: skip
        first = streams[0]
        say(
            f"{job['id']} {server.name}: /health {record['start_to_health_s']} s, first token "
            f"{first.get('first_token_s')} s, last {first.get('last_token_s')} s "
            f"({first.get('completion_tokens')} tokens, {first.get('attempts')} attempts), "
            f"load1 {load_before['loadavg'][0]:.2f}"
        )
    except Exception as error:  # recorded; the session goes on with the next job
        record["error"] = str(error)
        say(f"{job['id']} {server.name}: FAILED {error}")
    finally:
        server.stop()
        record["stopped_wall"] = time.time()
        session.save()
        time.sleep(3)


def main(argv: list[str] | None = None, bench: BenchFn | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--deadline", type=float, help="epoch seconds: start nothing that would end later")
    parser.add_argument(
        "--jobs", default="", help="comma-separated job ids (default: the plan's whole session)"
    )
    parser.add_argument("--seed-base", type=int, default=int(time.time()) % 1_000_000 * 1000)
    parser.add_argument("--plan", type=Path, default=PLAN)
    parser.add_argument("--session", default="session", help="the plan's list of jobs to run")
    parser.add_argument(
        "--print-preparation",
        action="store_true",
        help="print host_preparation's adapter count, rank and real-weights flag (0/1), then exit",
    )
    options = parser.parse_args(argv)
    plan = json.loads(options.plan.read_text())
    if options.print_preparation:
        count, rank, real = host_preparation(plan, options.session)
        print(count, rank, int(real))
        return 0
    if options.out is None or options.deadline is None:
        parser.error("--out and --deadline are required to run a session")
    out: Path = options.out
    out.mkdir(parents=True, exist_ok=True)
    session = Session(out, plan, options.deadline, options.seed_base)
    session.data.setdefault(
        "host", {"cpus": os.cpu_count(), "gpu": gpu_name(), "python": sys.version.split()[0]}
    )
    session.data.setdefault("model_folder", model_folder_facts(Path(plan["model_dir"])))
    if bench is None:
        from vllm import __version__ as vllm_version
        from vllm.benchmarks.serve import main as bench

        session.data["host"]["vllm"] = vllm_version
    say(f"seed base {session.seed_base}; deadline in {session.left():.0f} s")
    wanted = [name for name in options.jobs.split(",") if name]
    jobs = [job for job in plan[options.session] if not wanted or job["id"] in wanted]
    status = 0
    for job in jobs:
        done = session.data["jobs"].get(job["id"], {})
        if "stopped_wall" in done or done.get("runs"):
            continue
        need = job["estimate_s"]
        if need > session.left():
            say(f"{job['id']}: skipped, needs ~{need} s, {session.left():.0f} s left")
            session.data["jobs"].setdefault(job["id"], {})["skipped"] = (
                f"needs ~{need} s, {session.left():.0f} s left"
            )
            session.save()
            continue
        session.data["jobs"].get(job["id"], {}).pop("skipped", None)
        kind = job.get("type", "server")
        try:
            if kind == "server":
                run_server_job(session, job, bench)
            elif kind == "concurrent":
                run_concurrent_job(session, job)
            elif kind == "imports":
                run_imports_job(session, job)
            elif kind == "wake":
                run_wake_job(session, job)
            else:
                raise ValueError(f"unknown job type {kind}")
        except Exception as error:
            session.data["jobs"].setdefault(job["id"], {})["error"] = str(error)
            say(f"{job['id']}: FAILED {error}")
            status = 1
        session.save()
    say(f"session done, {session.left():.0f} s before the deadline")
    return status


if __name__ == "__main__":
    sys.exit(main())
