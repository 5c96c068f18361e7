"""bench/tenant_stall/ measures at the limits the prod stack renders."""

from __future__ import annotations

from bench.tenant_stall import check_cost, measure
from components import server_auth
from infra.stack_checks import load_stack


def test_the_check_cost_bench_uses_the_json_value_bound_of_prods_longest_context_model() -> None:
    prod = load_stack("prod")
    longest = max(prod.models, key=lambda m: m.vllm.max_model_len)
    bound = server_auth.max_json_values(prod, longest)
    assert bound == check_cost.MAX_JSON_VALUES
    assert server_auth.max_body_bytes(prod) == check_cost.MAX_BODY_BYTES
    assert measure._limits()[:2] == (server_auth.max_body_bytes(prod), bound)
