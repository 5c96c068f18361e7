"""The middleware's body checks against vLLM 0.32.0's own parse of the same body, in one process
(issue 40 item 4: "the body checks cost no more than vLLM's own parse").

For each body of bench/tenant_stall/measure.py (at the prod render's limits): the check as the
middleware runs it (JsonShape fed 64 KiB chunks as uvicorn delivers them, then `parse_json_body` if
nothing was refused), against what vLLM does with it before any engine work (`json.loads`, as
Starlette's `Request.json`, then pydantic's validation of vLLM's `CompletionRequest`; for a chat its
`ChatCompletionRequest`, then `parse_chat_messages` and the chat template of the tiny test model,
issue 49, with that work's seconds per message and content part). Best of REPEATS, single thread,
in CPU time of the thread (`time.thread_time`, as the pacer charges; since issue 49: the runs before
timed the wall clock, the same on a quiet machine, inflated on a busy one);
`largest_step_seconds` is the check's longest stretch without an `await` (one chunk, or the final
parse), i.e. the longest it holds the event loop at once.

Run in the vLLM venv (it imports vLLM's request model), from the repository root:

    .venv-vllm/bin/python -m bench.tenant_stall.check_cost    # writes check_cost_results.json here
    .venv-vllm/bin/python -m bench.tenant_stall.check_cost --bodies chat_37k_messages \
        --out bench/tenant_stall/check_cost_issue49_results.json    # some bodies
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
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
MAX_MODEL_LEN = 32_768
"""That model's context: the middleware's bound on a conversation's messages (checked the same way)."""


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
        began = time.thread_time()
        try:
            shape.feed(body[start : start + CHUNK])
        except auth.Refused as refused:
            step = time.thread_time() - began
            return str(refused.status), total + step, max(longest, step)
        step = time.thread_time() - began
        total, longest = total + step, max(longest, step)
    began = time.thread_time()
    try:
        auth.parse_json_body(body)
        outcome = "passed"
    except auth.Refused as refused:
        outcome = str(refused.status)
    step = time.thread_time() - began
    return outcome, total + step, max(longest, step)


def _vllm_parse(body: bytes) -> tuple[str, float]:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    began = time.thread_time()
    try:
        CompletionRequest.model_validate(json.loads(body))
        outcome = "valid"
    except Exception as error:  # pydantic, vLLM's own validation errors, RecursionError
        outcome = type(error).__name__
    return outcome, time.thread_time() - began


def _vllm_chat(body: bytes, model_config: Any, tokenizer: Any) -> tuple[str, float, float]:
    """(outcome, seconds of `json.loads`, seconds of the work after it) of vLLM 0.32.0's handling of a
    chat before the engine: its request model, `parse_chat_messages`, then the chat template (in
    vLLM's renderer thread, which holds the GIL for the template's Python as the loop would)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import safe_apply_chat_template

    began = time.thread_time()
    payload = json.loads(body)
    parsed = time.thread_time()
    try:
        request = ChatCompletionRequest.model_validate(payload)
        conversation, _, _ = parse_chat_messages(request.messages, model_config, "string")
        safe_apply_chat_template(model_config, tokenizer, conversation, tokenize=False)
        outcome = "rendered"
    except Exception as error:  # pydantic, vLLM's own validation errors
        outcome = type(error).__name__
    return outcome, parsed - began, time.thread_time() - parsed


def _tiny_model(work: Path) -> tuple[Any, Any]:
    """vLLM's model config and tokenizer of the tiny test model (its chat template: one line per message)."""
    from vllm.config import ModelConfig
    from vllm.tokenizers import get_tokenizer

    from tests.support.tiny_model import build_tiny_llama

    model_dir = build_tiny_llama(work / "tiny-llama")
    # As measure.py serves it (the context plays no part in the parse and the template).
    return ModelConfig(model=str(model_dir), max_model_len=512), get_tokenizer(str(model_dir))


def main() -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from bench.tenant_stall.bodies import CHAT, bodies

    every = bodies(MAX_BODY_BYTES, MAX_JSON_VALUES, MAX_MODEL_LEN)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bodies", nargs="*", default=[n for n, b in every.items() if b.connections == 1])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("check_cost_results.json"))
    args = parser.parse_args()
    auth = _middleware()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="check-cost-") as work:
        chat_model = _tiny_model(Path(work)) if any(every[n].path == CHAT for n in args.bodies) else None
        for name in args.bodies:
            body = every[name].make()
            checks = [_check(auth, body) for _ in range(REPEATS)]
            result: dict[str, Any] = {
                "body_bytes": len(body),
                "check": checks[0][0],
                "check_seconds": round(min(c[1] for c in checks), 4),
                "largest_step_seconds": round(min(c[2] for c in checks), 4),
            }
            if chat_model is not None and every[name].path == CHAT:
                chats = [_vllm_chat(body, *chat_model) for _ in range(REPEATS)]
                beyond = min(c[2] for c in chats)
                messages, items = auth.chat_items(CHAT, json.loads(body))
                result |= {
                    "vllm_chat": chats[0][0],
                    "vllm_parse_seconds": round(min(c[1] for c in chats), 4),
                    "vllm_beyond_parse_seconds": round(beyond, 4),
                    "messages": messages,
                    "messages_and_content_parts": items,
                    "vllm_beyond_parse_seconds_per_item": round(beyond / items, 9),
                }
            else:
                parses = [_vllm_parse(body) for _ in range(REPEATS)]
                result |= {
                    "vllm_parse": parses[0][0],
                    "vllm_parse_seconds": round(min(p[1] for p in parses), 4),
                }
            results[name] = result
            print(name, json.dumps(result), flush=True)
    args.out.write_text(
        json.dumps(
            {
                "what": "the middleware's body checks vs vLLM 0.32.0's json.loads + CompletionRequest (chats:"
                " ChatCompletionRequest, parse_chat_messages and the tiny model's chat template)",
                "date": time.strftime("%Y-%m-%d"),
                "machine": f"{os.cpu_count()} CPUs, shared; best of {REPEATS}, CPU time of the thread",
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
