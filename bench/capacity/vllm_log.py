"""Reads the memory numbers vLLM logs at startup (standard library only: runs on the GPU host).

The line formats are vLLM 0.26.0's (v1/worker/gpu_worker.py, gpu_model_runner.py,
v1/core/kv_cache_utils.py, utils/mem_utils.py), unchanged in 0.32.0; the INFO lines are always
logged, the DEBUG ones only with VLLM_LOGGING_LEVEL=DEBUG. A line may carry a process prefix
such as "(EngineCore_DP0 pid=123) " and, on a terminal, ANSI colours; both are ignored.
"""

from __future__ import annotations

import re
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

# name → (pattern, converter of the captured groups); every pattern is searched within one line.
_PATTERNS: dict[str, re.Pattern[str]] = {
    # GPUModelRunner.load_model: "Model loading took 14.99 GiB memory and 3.123456 seconds"
    "weights_gib": re.compile(rf"Model loading took {_NUMBER} GiB"),
    # Worker.determine_available_memory: "Available KV cache memory: 108.48 GiB"
    "available_kv_cache_gib": re.compile(rf"Available KV cache memory: {_NUMBER} GiB"),
    # get_kv_cache_configs: "GPU KV cache size: 1,777,200 tokens"
    "kv_cache_tokens": re.compile(rf"GPU KV cache size: {_NUMBER} tokens"),
    # get_kv_cache_configs: "Maximum concurrency for 8,192 tokens per request: 216.94x"
    "max_concurrency": re.compile(rf"Maximum concurrency for {_NUMBER} tokens per request: {_NUMBER}x"),
    # GPUModelRunner.profile_cudagraph_memory: "Profiling CUDA graph memory: PIECEWISE=51 (largest=512), ..."
    "cudagraph_profile": re.compile(r"Profiling CUDA graph memory: (.+)$"),
    # INFO after profiling: "... The current --gpu-memory-utilization=0.9000 is equivalent to
    # --gpu-memory-utilization=0.8950 without CUDA graph memory profiling. ..."
    "cudagraph_utilization": re.compile(
        rf"current --gpu-memory-utilization={_NUMBER} is equivalent to --gpu-memory-utilization={_NUMBER}"
    ),
    # DEBUG: repr(MemorySnapshot) "worker init memory snapshot: torch_peak=0.0GiB, free_memory=139.2GiB,
    # total_memory=139.81GiB, ..."
    "init_snapshot": re.compile(
        rf"worker init memory snapshot: .*free_memory={_NUMBER}GiB, total_memory={_NUMBER}GiB"
    ),
    # DEBUG: "worker requested memory: 125.83GiB"
    "requested_gib": re.compile(rf"worker requested memory: {_NUMBER}\s*GiB"),
    # DEBUG: repr(MemoryProfilingResult) "Memory profiling takes 5.12 seconds. Total non KV cache memory:
    # 16.9GiB; torch peak memory increase: 1.2GiB; non-torch forward increase memory: 0.3GiB; weights
    # memory: 14.99GiB."
    "profile": re.compile(
        rf"Total non KV cache memory: {_NUMBER}GiB; torch peak memory increase: {_NUMBER}GiB; "
        rf"non-torch forward increase memory: {_NUMBER}GiB; weights memory: {_NUMBER}GiB"
    ),
    # DEBUG: "Estimated PIECEWISE CUDA graph memory: 98.00 MiB first-capture + (51-1) × 6.00 MiB per-graph"
    "cudagraph_estimate": re.compile(
        rf"Estimated (\w+) CUDA graph memory: {_NUMBER} MiB first-capture "
        rf"\+ \({_NUMBER}-1\) × {_NUMBER} MiB per-graph"
    ),
}


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def strip_decorations(line: str) -> str:
    return _ANSI.sub("", line).rstrip("\n")


def parse_vllm_log_line(line: str, record: dict[str, Any]) -> None:
    """Adds what `line` says to `record` (a dict the caller keeps across the whole log)."""
    text = strip_decorations(line)
    for name, pattern in _PATTERNS.items():
        match = pattern.search(text)
        if match is None:
            continue
        groups = match.groups()
        if name == "max_concurrency":
            record["max_concurrency_tokens"] = int(_number(groups[0]))
            record["max_concurrency"] = _number(groups[1])
        elif name == "kv_cache_tokens":
            record[name] = int(_number(groups[0]))
        elif name == "cudagraph_profile":
            record[name] = groups[0].strip()
        elif name == "cudagraph_utilization":
            record["cudagraph_utilization"] = {
                "configured": _number(groups[0]),
                "equivalent_without_graphs": _number(groups[1]),
            }
        elif name == "init_snapshot":
            record["init_free_gib"] = _number(groups[0])
            record["cuda_total_gib"] = _number(groups[1])
        elif name == "profile":
            record["profile_gib"] = {
                "non_kv_cache": _number(groups[0]),
                "torch_peak_increase": _number(groups[1]),
                "non_torch_increase": _number(groups[2]),
                "weights": _number(groups[3]),
            }
        elif name == "cudagraph_estimate":
            estimates = record.setdefault("cudagraph_estimate_mib", {})
            estimates[groups[0]] = {
                "first_capture": _number(groups[1]),
                "graphs": int(_number(groups[2])),
                "per_graph": _number(groups[3]),
            }
        else:
            record[name] = _number(groups[0])


def parse_vllm_log(lines: list[str] | str) -> dict[str, Any]:
    """Every number above found in a whole log (later lines win, as vLLM logs each once)."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    record: dict[str, Any] = {}
    for line in lines:
        parse_vllm_log_line(line, record)
    return record


def kv_cache_reported(record: dict[str, Any]) -> bool:
    """vLLM has sized its KV cache: both lines of get_kv_cache_configs were logged."""
    return "kv_cache_tokens" in record and "max_concurrency" in record
