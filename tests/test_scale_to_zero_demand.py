"""The prod stack's `router_demand` trigger (the KEDA query that wakes a model at zero, issue 35),
evaluated by promtool on the series a model router exports, with the labels the router PodMonitor
gives them, scraped every 15 s.

The live path (first scrape, back to zero) is in tests/e2e/test_scale_to_zero.py. Here are the
cases a test on loopback cannot wait for: a router that restarts after an idle night. Counters start
again from zero; the first form of the query subtracted the value of W seconds ago, so it read
negative until W had passed since the restart, whatever arrived meanwhile: a model at zero was then
not woken and its held requests ended in 503 (found here). The query now counts `increase()` plus the
series that are new in the window, and these cases pass.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

STACK = "prod"
MODEL = "qwen2-5-7b-tp2"
ERRORS = "vllm_router_request_errors_total"
LABELS = (
    f'namespace="vllm-router",model="{MODEL}",route="/v1/chat/completions",error_type="no_available_workers"'
)


def rendered_demand_query() -> str:
    from tests.conftest import rendered

    [scaled_object] = rendered(STACK).find("ScaledObject", namespace=f"vllm-{MODEL}")
    [trigger] = [t for t in scaled_object["spec"]["triggers"] if t["name"] == "router_demand"]
    query: str = trigger["metadata"]["query"]
    return query


def window_seconds(query: str) -> int:
    return int(query.split(" offset ", 1)[1].split("s)", 1)[0])


def demand_at(tmp_path: Path, series: dict[str, str], eval_time: str, expected: float) -> None:
    """promtool's `test rules`: the query, recorded every 15 s over `series`, is `expected` at `eval_time`."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (scripts/setup-test-tools.sh)"
    rules = {"groups": [{"name": "keda", "interval": "15s", "rules": [{"record": "demand", "expr": QUERY}]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {
                        "expr": "demand",
                        "eval_time": eval_time,
                        "exp_samples": [{"labels": "demand", "value": expected}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr


QUERY = rendered_demand_query()
W = window_seconds(QUERY)
SAMPLES_PER_W = W // 15


def pod(name: str) -> str:
    return f'{ERRORS}{{{LABELS},pod="{name}"}}'


def test_the_first_held_request_on_a_fresh_router_wakes_the_model(tmp_path: Path) -> None:
    # No series until the first held request, at minute 60; its first sample already counts 3 attempts.
    demand_at(tmp_path, {pod("a"): "_x240 3 5 5x300"}, "60m", 1)


def test_an_idle_window_after_the_last_attempt_brings_demand_back_to_zero(tmp_path: Path) -> None:
    after = 60 * 60 + 15 + W + 60
    demand_at(tmp_path, {pod("a"): "_x240 3 5 5x300"}, f"{after}s", 0)


def test_a_held_request_on_a_replaced_router_pod_wakes_the_model(tmp_path: Path) -> None:
    # Pod a counted 500 attempts the day before and is replaced at minute 60; pod b holds a request.
    series = {pod("a"): "500x240 stale", pod("b"): "_x242 3 5 5x100"}
    demand_at(tmp_path, series, "60m45s", 1)


def test_a_held_request_after_the_router_container_restarts_wakes_the_model(tmp_path: Path) -> None:
    demand_at(tmp_path, {pod("a"): "500x240 3 5 5x100"}, "60m15s", 1)
