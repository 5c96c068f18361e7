"""A vLLM 0.26.0 server's start, part by part, from its own log lines as bench/serving/lab.py stamps them.

lab.py writes every line the server prints as `<epoch seconds> <line>`, plus `LAB-START` (the process
is started) and `LAB-HEALTHY <s>` (/health answered). vLLM's own timestamps have one-second resolution;
the stamps are what the phases below are measured with. Each phase ends at the first line that marks
it done (the engine-core process's lines for the engine's phases):

| phase | from | to (the first line with) |
| --- | --- | --- |
| imports | process started | `non-default args` (the CLI's first log line: `vllm serve` and its imports) |
| model_config | that | `Resolved architecture` (config, tokenizer config, the model-class inspection) |
| processes | that | `Initializing a V1 LLM engine` (API-server and engine-core processes spawn, import) |
| engine_setup | that | `Loading model from scratch` (distributed init, the worker) |
| weights | that | `Model loading took` (build the model, read the weights) |
| torch_compile | that | `torch.compile took` (Dynamo, Inductor or the compile cache) |
| kv_cache | that | `GPU KV cache size` (memory profiling, KV allocation) |
| cuda_graphs | that | `Graph capturing finished` |
| jit_warmup | that | `init engine (profile, create kv cache, warmup model) took` (kernel JIT and warm-up) |
| api_ready | that | /health answered |

`before_engine` is imports + model_config + processes. Also read: vLLM's own `Loading weights took X
seconds` (the read alone, for GB/s), `torch.compile took X s`, whether the compile cache was loaded
(`Directly load the compiled graph`) and the compile-cache folder (`Using cache directory: ...`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

PHASES = (
    ("imports", "non-default args"),
    ("model_config", "Resolved architecture"),
    ("processes", "Initializing a V1 LLM engine"),
    ("engine_setup", "Loading model from scratch"),
    ("weights", "Model loading took"),
    ("torch_compile", "torch.compile took"),
    ("kv_cache", "GPU KV cache size"),
    ("cuda_graphs", "Graph capturing finished"),
    ("jit_warmup", "init engine (profile, create kv cache, warmup model) took"),
)
BEFORE_ENGINE = ("imports", "model_config", "processes")
ENGINE_INIT = ("engine_setup", "weights", "torch_compile", "kv_cache", "cuda_graphs", "jit_warmup")

STAMP = re.compile(r"^(\d{9,}\.\d+) (.*)$")
LOAD_READ = re.compile(r"Loading weights took ([\d.]+) seconds")
COMPILE = re.compile(r"torch\.compile took ([\d.]+) s in total")
INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
CACHE_DIR = re.compile(r"Using cache directory: (\S+) for vLLM's torch\.compile")


def stamped_lines(text: str) -> list[tuple[float, str]]:
    lines = []
    for raw in text.splitlines():
        match = STAMP.match(raw)
        if match:
            lines.append((float(match.group(1)), match.group(2)))
    return lines


def parse(text: str) -> dict[str, Any]:
    """Phase durations (s) and the facts above, from one stamped server log."""
    lines = stamped_lines(text)
    start = next((t for t, line in lines if line.startswith("LAB-START")), None)
    healthy = next((t for t, line in lines if line.startswith("LAB-HEALTHY")), None)
    if start is None:
        raise ValueError("no LAB-START line: not a log written by bench/serving/lab.py")
    marks: dict[str, float] = {}
    for name, needle in PHASES:
        engine_side = name in ENGINE_INIT or name == "processes"
        for stamp, line in lines:
            after = stamp >= marks.get(_previous(name), start)
            if needle in line and (not engine_side or "EngineCore" in line) and after:
                marks[name] = stamp
                break
    phases: dict[str, float | None] = {}
    last = start
    for name, _ in PHASES:
        if name in marks:
            phases[name] = round(marks[name] - last, 2)
            last = marks[name]
        else:
            phases[name] = None
    phases["api_ready"] = round(healthy - last, 2) if healthy is not None else None
    result: dict[str, Any] = {
        "phases": phases,
        "before_engine_s": _sum(phases, BEFORE_ENGINE),
        "engine_init_s": _sum(phases, ENGINE_INIT),
        "start_to_health_s": round(healthy - start, 2) if healthy is not None else None,
    }
    joined = "\n".join(line for _, line in lines)
    for key, pattern in (("weights_read_s", LOAD_READ), ("compile_s", COMPILE), ("vllm_init_engine_s", INIT)):
        match = pattern.search(joined)
        result[key] = float(match.group(1)) if match else None
    folder = CACHE_DIR.search(joined)
    result["compile_cache_dir"] = folder.group(1) if folder else None
    result["compile_cache_loaded"] = "Directly load the compiled graph" in joined
    return result


def _previous(name: str) -> str:
    names = [phase for phase, _ in PHASES]
    index = names.index(name)
    return names[index - 1] if index else "start"


def _sum(phases: dict[str, float | None], names: tuple[str, ...]) -> float | None:
    values = [phases[name] for name in names]
    return None if any(value is None for value in values) else round(sum(values), 2)  # type: ignore[misc]


def parse_file(path: Path) -> dict[str, Any]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as handle:
        return parse(handle.read())
