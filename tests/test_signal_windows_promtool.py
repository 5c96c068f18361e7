"""Why a range must hold two scrapes (issue 40), shown by promtool on the wake trigger's own query.

Requests flow the whole time: the model router's counter grows at every scrape, every 120 s. With the
idle window at 180 s (below 2 x 120 s, refused by `validate`: infra/signal_checks.py) there are
instants when the window holds one sample, `increase()` reads nothing and the demand reads 0, so KEDA
would take the last replica while requests arrive; at 240 s (the least `validate` accepts) the demand
reads 1 at every instant.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from components.adapter_rules import router_demand_query
from infra.signal_checks import shortest_range

MODEL = "qwen2-5-7b-tp2"
SCRAPE_SECONDS = 120
SERIES = (
    f'vllm_router_requests_total{{namespace="vllm-router",model="{MODEL}",route="/v1/chat/completions",'
    'pod="router-a"}'
)
# One more routed request at every scrape for an hour (the router was serving before the test starts).
FLOWING = "100+1x30"
# Every 10 s over two scrape periods in the middle of the hour: each phase of the window against the
# scrapes.
INSTANTS = [f"{1800 + offset}s" for offset in range(0, 2 * SCRAPE_SECONDS, 10)]


def reads(tmp_path: Path, query: str, instant: str, value: int) -> bool:
    """Whether promtool evaluates `query` over the series to `value` at `instant`."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (scripts/setup-test-tools.sh)"
    test = {
        "rule_files": [],
        "evaluation_interval": f"{SCRAPE_SECONDS}s",
        "tests": [
            {
                "interval": f"{SCRAPE_SECONDS}s",
                "input_series": [{"series": SERIES, "values": FLOWING}],
                "promql_expr_test": [
                    {"expr": query, "eval_time": instant, "exp_samples": [{"labels": "{}", "value": value}]}
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run(
        [promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    return run.returncode == 0


def demand_readings(tmp_path: Path, window_seconds: int) -> dict[str, int]:
    """The demand query (0 or 1) at each instant, as promtool evaluates it over the series."""
    query = router_demand_query(MODEL, window_seconds)
    readings = {}
    for instant in INSTANTS:
        [value] = [value for value in (0, 1) if reads(tmp_path, query, instant, value)]
        readings[instant] = value
    return readings


@pytest.mark.parametrize(
    ("window_seconds", "always_awake"), [(180, False), (shortest_range(SCRAPE_SECONDS), True)]
)
def test_demand_reads_requests_at_every_instant_only_with_two_scrapes_in_the_window(
    tmp_path: Path, window_seconds: int, always_awake: bool
) -> None:
    readings = demand_readings(tmp_path, window_seconds)
    zeros = sorted(instant for instant, value in readings.items() if value == 0)
    if always_awake:
        assert zeros == []
    else:
        assert zeros, "a 180 s window over 120 s scrapes must read 0 at some instant"
