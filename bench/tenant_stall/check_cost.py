"""The middleware's body checks against vLLM 0.32.0's own parse of the same body, in one process
(issue 40 item 4: "the body checks cost no more than vLLM's own parse").

For each body of bench/tenant_stall/measure.py (at the prod render's limits): the check as the
middleware runs it (JsonShape fed 64 KiB chunks as uvicorn delivers them, then `parse_json_body` if
nothing was refused), against what vLLM does with it before any engine work (`json.loads`, as
Starlette's `Request.json`, then pydantic's validation of vLLM's `CompletionRequest`). Best of
REPEATS, single thread; `largest_step_seconds` is the check's longest stretch without an `await`
(one chunk, or the final parse), i.e. the longest it holds the event loop at once.

Run in the vLLM venv (it imports vLLM's request model), from the repository root:

    .venv-vllm/bin/python -m bench.tenant_stall.check_cost    # writes check_cost_results.json here
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
CHUNK = 64 * 1024
REPEATS = 3
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_JSON_VALUES = 147_456
"""The prod render's `security.max_request_body_mib` (default) and the JSON value bound of its
longest-context model (`server_auth.max_json_values`: 4 x 32,768 + 16,384; this script runs in the
vLLM venv, without the repository's packages, so tests/test_bench_tenant_stall.py checks the copy)."""


def _middleware() -> Any:
    os.environ["VLLM_API_KEY"] = "bench-only"  # the module's import-time key check
    spec = importlib.util.spec_from_file_location(
        "vllm_platform_auth", REPO_ROOT / "components" / "pod_files" / "vllm_platform_auth.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _check(auth: Any, body: bytes) -> tuple[str, float, float]:
    """(outcome, seconds in all, longest single step) of the middleware's checks."""
    shape = auth.JsonShape(MAX_JSON_VALUES)
    total = longest = 0.0
    for start in range(0, len(body), CHUNK):
        began = time.perf_counter()
        try:
            shape.feed(body[start : start + CHUNK])
        except auth.Refused as refused:
            step = time.perf_counter() - began
            return str(refused.status), total + step, max(longest, step)
        step = time.perf_counter() - began
        total, longest = total + step, max(longest, step)
    began = time.perf_counter()
    try:
        auth.parse_json_body(body)
        outcome = "passed"
    except auth.Refused as refused:
        outcome = str(refused.status)
    step = time.perf_counter() - began
    return outcome, total + step, max(longest, step)


def _vllm_parse(body: bytes) -> tuple[str, float]:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    began = time.perf_counter()
    try:
        CompletionRequest.model_validate(json.loads(body))
        outcome = "valid"
    except Exception as error:  # pydantic, vLLM's own validation errors, RecursionError
        outcome = type(error).__name__
    return outcome, time.perf_counter() - began


def main() -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from bench.tenant_stall.bodies import bodies

    auth = _middleware()
    results = {}
    for name, make in bodies(MAX_BODY_BYTES, MAX_JSON_VALUES).items():
        body = make()
        checks = [_check(auth, body) for _ in range(REPEATS)]
        parses = [_vllm_parse(body) for _ in range(REPEATS)]
        results[name] = {
            "body_bytes": len(body),
            "check": checks[0][0],
            "check_seconds": round(min(c[1] for c in checks), 4),
            "largest_step_seconds": round(min(c[2] for c in checks), 4),
            "vllm_parse": parses[0][0],
            "vllm_parse_seconds": round(min(p[1] for p in parses), 4),
        }
        print(name, json.dumps(results[name]), flush=True)
    out = Path(__file__).with_name("check_cost_results.json")
    out.write_text(
        json.dumps(
            {
                "what": "the middleware's body checks vs vLLM 0.32.0's json.loads + CompletionRequest",
                "machine": f"{os.cpu_count()} CPUs, shared; best of {REPEATS}",
                "generated_by": "bench/tenant_stall/check_cost.py",
                "host_load_1min": round(os.getloadavg()[0], 2),
                "bodies": results,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
