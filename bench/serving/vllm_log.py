"""Facts from a vLLM server log: KV-cache size, load/compile/capture times (stdlib only).

The formats are vLLM's own log calls (read in both sources, 2026-11-29):
- 0.26.0 v1/core/kv_cache_utils.py logs "GPU KV cache size: %s tokens" and, on its own line,
  "Maximum concurrency for %s tokens per request: %.2fx"; 0.32.0 logs both in one line,
  "%s KV cache size: %s tokens, Maximum concurrency for ...", where %s is GPU, CPU or "GPU + host".
  Token counts carry thousands separators.
- both: v1/worker/gpu_worker.py "Available KV cache memory: %s GiB" (GPU workers only),
  v1/worker/gpu_model_runner.py "Model loading took %s GiB memory and %.6f seconds" and
  "Graph capturing finished in %.0f secs, took %.2f GiB", compilation/monitor.py
  "torch.compile took %.2f s in total", v1/engine/core.py "init engine (profile, create kv cache,
  warmup model) took %.2f s".
- both: v1/executor/multiproc_executor.py "Worker failed with error '%s', please check the stack trace
  above for the root cause" when a worker raised during a collective call (the start failed).
Each line may carry a process prefix such as "(EngineCore pid=12) ".

Start-up timeline: vLLM's own log lines carry "LEVEL MM-DD HH:MM:SS" in the host's local time (no
year, one-second resolution); `milestone_times` turns the first line of each start-up stage into
epoch seconds, given the year and UTC offset of the run (a phase file's `started_at`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

_NUMBER = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

PATTERNS: dict[str, re.Pattern[str]] = {
    "available_kv_cache_gib": re.compile(r"Available KV cache memory: " + _NUMBER + r" GiB"),
    "kv_cache_tokens": re.compile(r"[A-Z]+(?: \+ host)? KV cache size: " + _NUMBER + r" tokens"),
    "max_concurrency": re.compile(
        r"Maximum concurrency for " + _NUMBER + r" tokens per request: " + _NUMBER + r"x"
    ),
    "model_load": re.compile(
        r"Model loading took " + _NUMBER + r" GiB(?: memory)? and " + _NUMBER + r" seconds"
    ),
    "torch_compile_s": re.compile(r"torch\.compile took " + _NUMBER + r" s in total"),
    "graph_capture": re.compile(
        r"Graph capturing finished in " + _NUMBER + r" secs?, took " + _NUMBER + r" GiB"
    ),
    "init_engine_s": re.compile(
        r"init engine \(profile, create kv cache, warmup model\) took " + _NUMBER + r" s"
    ),
    "attention_backend": re.compile(r"Using (\w+) attention backend"),
    "startup_complete": re.compile(r"Application startup complete"),
    # v1/executor/multiproc_executor.py (0.26.0, 0.32.0): the engine core's error when a worker raised.
    "worker_failed": re.compile(r"Worker failed with error '(.+?)'(?:, please|$)"),
    # distributed/device_communicators/flashinfer_all_reduce.py (0.26.0): the fused all-reduce's backend.
    "flashinfer_allreduce_backend": re.compile(
        r"(?:Auto-selected|Using) flashinfer allreduce backend: (\w+)"
    ),
}

KV_CACHE_KEYS = ("available_kv_cache_gib", "kv_cache_tokens", "max_concurrency")
"""The facts the capacity planner is calibrated with (the memory line exists on GPU workers only)."""
KV_READY_KEYS = ("kv_cache_tokens", "max_concurrency")
"""Logged last, once the KV cache is allocated: a start is 'KV-ready' when both appeared."""


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_line(line: str) -> dict[str, Any]:
    """The facts one log line states (usually none)."""
    facts: dict[str, Any] = {}
    for key, pattern in PATTERNS.items():
        match = pattern.search(line)
        if match is None:
            continue
        if key == "kv_cache_tokens":
            facts[key] = int(_number(match[1]))
        elif key == "max_concurrency":
            facts["max_concurrency_context_tokens"] = int(_number(match[1]))
            facts[key] = _number(match[2])
        elif key == "model_load":
            facts["model_load_gib"] = _number(match[1])
            facts["model_load_s"] = _number(match[2])
        elif key == "graph_capture":
            facts["graph_capture_s"] = _number(match[1])
            facts["graph_capture_gib"] = _number(match[2])
        elif key in ("attention_backend", "worker_failed", "flashinfer_allreduce_backend"):
            facts[key] = match[1]
        elif key == "startup_complete":
            facts[key] = True
        else:
            facts[key] = _number(match[1])
    return facts


def parse_log(lines: Iterable[str]) -> dict[str, Any]:
    """Facts of a whole log; the first occurrence of each wins (vLLM logs them once per start)."""
    facts: dict[str, Any] = {}
    kv_lines: list[str] = []
    for line in lines:
        found = parse_line(line)
        if any(key in found for key in KV_CACHE_KEYS):
            kv_lines.append(line.rstrip("\n"))
        for key, value in found.items():
            facts.setdefault(key, value)
    if kv_lines:
        facts["kv_cache_log_lines"] = kv_lines
    return facts


def kv_cache_ready(facts: dict[str, Any]) -> bool:
    return all(key in facts for key in KV_READY_KEYS)


_STAMP = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d) ")

START_MILESTONES: tuple[tuple[str, re.Pattern[str] | None], ...] = (
    ("first_log_line", None),  # the API server has imported vLLM and parsed its arguments
    ("engine_core_started", re.compile(r"Initializing a V1 LLM engine")),
    ("model_loaded", PATTERNS["model_load"]),
    ("torch_compile_done", PATTERNS["torch_compile_s"]),
    ("kv_cache_allocated", PATTERNS["kv_cache_tokens"]),
    ("graphs_captured", PATTERNS["graph_capture"]),
    ("engine_ready", PATTERNS["init_engine_s"]),
)
"""The stages of a vLLM start, in the order a start passes them: the first line matching each."""

_COMPILE_CACHE_KEY = re.compile(r"torch_compile_cache/([0-9a-f]+)/")


def line_time(line: str, *, year: int, utc_offset: timedelta) -> float | None:
    """Epoch seconds of a vLLM log line's own stamp; None for lines without one."""
    match = _STAMP.search(line)
    if match is None:
        return None
    month, day, hour, minute, second = (int(part) for part in match.groups())
    local = datetime(year, month, day, hour, minute, second, tzinfo=timezone(utc_offset))
    return local.timestamp()


def milestone_times(lines: Iterable[str], *, year: int, utc_offset: timedelta) -> dict[str, float]:
    """Epoch seconds at which a start first reached each of START_MILESTONES (those it reached)."""
    times: dict[str, float] = {}
    for line in lines:
        stamp = line_time(line, year=year, utc_offset=utc_offset)
        if stamp is None:
            continue
        for key, pattern in START_MILESTONES:
            if key not in times and (pattern is None or pattern.search(line)):
                times[key] = stamp
    return times


def compile_cache_key(lines: Iterable[str]) -> str | None:
    """The torch.compile cache folder's key a start used (the same key: the compile is reused)."""
    for line in lines:
        match = _COMPILE_CACHE_KEY.search(line)
        if match:
            return match[1]
    return None
