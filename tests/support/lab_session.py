"""Synthetic lab sessions for the report tests: raw folders as bench/serving/lab.py writes them.

`LabSession` writes the client's result files (the keys `vllm bench serve --save-result` writes, with
lab.py's `--metadata`), session.json (jobs, runs, seed_base, host) and, on request, gzipped server logs
whose memory lines are vLLM 0.26.0's, copied from bench/startup/raw/2026-12-01-b/profile-s1-server.log.gz
(each line stamped with an epoch time by the lab).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HOST = {"cpus": 16, "gpu": "NVIDIA H200, 143771 MiB, 580.159.04", "python": "3.12.3", "vllm": "0.26.0"}
OUTPUT_LEN = 256


def client_result(
    config: str, seed: int, level: int, throughput: float, p99_ttft_ms: float, **extra: Any
) -> dict:
    prompts = max(8, 4 * level)
    return {
        "backend": "vllm",
        "endpoint_type": "vllm",
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": prompts,
        "max_concurrency": level,
        "completed": prompts,
        "failed": 0,
        "total_input_tokens": 512 * prompts,
        "total_output_tokens": OUTPUT_LEN * prompts,
        "output_throughput": throughput,
        "p99_ttft_ms": p99_ttft_ms,
        "mean_ttft_ms": extra.pop("mean_ttft_ms", p99_ttft_ms / 3),
        "mean_tpot_ms": extra.pop("mean_tpot_ms", 20.0),
        "lab_config": config,
        "lab_seed": str(seed),
        **{key: str(value) for key, value in extra.items()},  # --metadata values are strings
    }


@dataclass
class LabSession:
    raw: Path
    seed_base: int = 1000
    host: dict[str, Any] = field(default_factory=lambda: dict(HOST))
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.raw.mkdir(parents=True, exist_ok=True)

    def server(self, config: str, load: str = "dummy", case: str = "same-host") -> str:
        """A fresh server of `config`: its label, `<config>-s<k>`."""
        count = 1 + sum(1 for job in self.jobs.values() if job["config"] == config)
        label = f"{config}-s{count}"
        self.jobs[f"s{len(self.jobs) + 1:02d}"] = {
            "label": label,
            "config": config,
            "case": case,
            "load": load,
            "log": f"{label}-server.log",
            "levels": {},
        }
        return label

    def run(
        self,
        label: str,
        level: int,
        throughput: float,
        p99_ttft_ms: float,
        adapters: int | None = None,
        cpu_busy_pct: float = 9.0,
        gpu_util_pct: float = 90.0,
        **result_keys: Any,
    ) -> int:
        """One client run on `label` with the next seed; returns the seed."""
        seed = self.seed_base + len(self.runs)
        config = label.rsplit("-s", 1)[0]
        suffix = "" if adapters is None else f"-a{adapters}"
        file = f"{label}-c{level}{suffix}.json"
        metadata = {} if adapters is None else {"lab_adapters": adapters}
        result = client_result(config, seed, level, throughput, p99_ttft_ms, **metadata, **result_keys)
        (self.raw / file).write_text(json.dumps(result))
        host = {"mean_cpu_busy_pct": cpu_busy_pct, "mean_gpu_util_pct": gpu_util_pct, "samples": 10}
        run = {"label": label, "level": level, "seed": seed, "prompts": result["num_prompts"], "attempt": 0,
               "ok": True, "host": host, "file": file}  # fmt: skip
        if adapters is not None:
            run["adapters"] = adapters
        self.runs.append(run)
        job = next(job for job in self.jobs.values() if job["label"] == label)
        key = str(level) if adapters is None else f"{level}-a{adapters}"
        job["levels"][key] = {"file": file, "seed": seed, "ok": True, "host": host}
        return seed

    def save(self, with_seed_base: bool = True) -> Path:
        data: dict[str, Any] = {"jobs": self.jobs, "runs": self.runs, "host": self.host}
        if with_seed_base:
            data["seed_base"] = self.seed_base
        (self.raw / "session.json").write_text(json.dumps(data, indent=1))
        return self.raw


def memory_log_lines(
    weights_gib: float, kv_cache_gib: float, kv_tokens: int, with_memory_word: bool = False
) -> str:
    """vLLM 0.26.0's start-up memory lines as the lab stamps them (its own wording; `with_memory_word`:
    the "... GiB memory and N seconds" form other releases log)."""
    memory = " memory" if with_memory_word else ""
    return (
        "1796159217.890 LAB-START /opt/torch/.venv/bin/python3 -m vllm.entrypoints.cli.main serve "
        "/tmp/m/llama8b\n"
        "1796159317.134 (EngineCore pid=1097) INFO 12-01 21:08:37 [model_runner.py:305] "
        f"Model loading took {weights_gib} GiB{memory} and 15.001469 seconds\n"
        "1796159346.480 (EngineCore pid=1097) INFO 12-01 21:09:06 [gpu_worker.py:560] "
        f"Available KV cache memory: {kv_cache_gib} GiB\n"
        "1796159346.481 (EngineCore pid=1097) INFO 12-01 21:09:06 [kv_cache_utils.py:2177] "
        f"GPU KV cache size: {kv_tokens:,} tokens\n"
        "1796159462.621 (EngineCore pid=1097) INFO 12-01 21:11:02 [core.py:340] init engine (profile, "
        "create kv cache, warmup model) took 145.47 s (compilation: 25.70 s)\n"
    )


def write_server_log(logs: Path, label: str, text: str) -> Path:
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"{label}-server.log.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return path
