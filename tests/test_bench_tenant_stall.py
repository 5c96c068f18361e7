"""bench/tenant_stall/ measures at the limits the prod stack renders, with bodies that reach the check
each was made for."""

from __future__ import annotations

import json

import pytest

from bench.tenant_stall import bodies, check_cost, measure
from components import server_auth
from infra.stack_checks import load_stack
from tests.support.auth_module import load_auth_module


def test_the_check_cost_bench_uses_the_json_value_bound_of_prods_longest_context_model() -> None:
    prod = load_stack("prod")
    longest = max(prod.models, key=lambda m: m.vllm.max_model_len)
    bound = server_auth.max_json_values(prod, longest)
    assert bound == check_cost.MAX_JSON_VALUES
    assert server_auth.max_body_bytes(prod) == check_cost.MAX_BODY_BYTES
    assert longest.vllm.max_model_len == check_cost.MAX_MODEL_LEN
    max_bytes, max_values, _, max_model_len = measure._limits()
    assert (max_bytes, max_values, max_model_len) == (
        server_auth.max_body_bytes(prod),
        bound,
        longest.vllm.max_model_len,
    )


def _scan(auth: object, body: bytes) -> str:
    """What the middleware's scan says of a body, fed in uvicorn's 64 KiB chunks."""
    shape = auth.JsonShape(check_cost.MAX_JSON_VALUES)  # type: ignore[attr-defined]
    try:
        for start in range(0, len(body), 64 * 1024):
            shape.feed(body[start : start + 64 * 1024])
    except auth.Refused as refused:  # type: ignore[attr-defined]
        return str(refused.status)
    return "passed"


def test_issue_49s_bodies_reach_the_check_each_was_made_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "bench-only")
    auth = load_auth_module(monkeypatch, "vllm_platform_auth_bench")
    every = bodies.bodies(check_cost.MAX_BODY_BYTES, check_cost.MAX_JSON_VALUES, check_cost.MAX_MODEL_LEN)
    built = {name: body.make() for name, body in every.items() if body.connections == 1}
    assert all(len(body) <= check_cost.MAX_BODY_BYTES for body in built.values())
    # The probe's 16 MiB of 4,299-digit integers: refused by the scan (digits), before any parse.
    assert _scan(auth, built["huge_integers_forbidden_model"]) == "400"
    # The largest integers the scan admits, as many as the value count admits, naming a name the
    # flooding tenant may not use: parsed, then 403.
    widest = built["integers_64_digits_forbidden_model"]
    assert _scan(auth, widest) == "passed"
    assert json.loads(widest)["model"] == bodies.FORBIDDEN_NAME
    assert json.loads(widest)["prompt"][0] == int("9" * auth.MAX_JSON_NUMBER_DIGITS)
    # The probe's chat is past the message bound; the next one is exactly at it; the content parts
    # fill the value count in one message.
    chats = {name: json.loads(built[name]) for name in built if every[name].path == bodies.CHAT}
    assert all(_scan(auth, built[name]) == "passed" for name in chats)
    counts = {name: auth.chat_items(bodies.CHAT, chat) for name, chat in chats.items()}
    assert counts["chat_37k_messages"][0] == bodies.CHAT_MESSAGES_PROBED > check_cost.MAX_MODEL_LEN
    assert counts["chat_messages_at_context_bound"][0] == check_cost.MAX_MODEL_LEN
    parts = counts["chat_content_parts_under_value_limit"]
    assert parts[0] == 1 and parts[1] > check_cost.MAX_JSON_VALUES // 3 - 100
    # The worst bodies again, on parallel connections.
    parallel = {name: body for name, body in every.items() if body.connections > 1}
    assert {body.connections for body in parallel.values()} == {bodies.PARALLEL_CONNECTIONS}
    for name, body in parallel.items():
        single = every[name.removesuffix(f"_{bodies.PARALLEL_CONNECTIONS}_connections")]
        assert (body.make, body.path) == (single.make, single.path)
    assert len(parallel) == 3
