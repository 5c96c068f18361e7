"""The captured /metrics the canary analysis tests run on (tests/data/vllm_0.32.0_metrics.txt) against
the live vLLM 0.32.0 server of this session: same families, same label names, same bucket bounds and
finished reasons, so the promtool tests (tests/test_rollouts_promtool.py) exercise the series a real
server exports. Re-capture with `python -m tests.support.capture_vllm_metrics` when this fails
after a vLLM upgrade."""

from __future__ import annotations

import httpx
import pytest

from components.canary_analysis import HTTP_REQUESTS_METRIC, analysis_checks
from infra.stack_checks import load_stack
from tests.support.vllm_server import RunningVllmServer
from tests.test_rollouts_promtool import _LABEL, _SAMPLE, CAPTURED

pytestmark = pytest.mark.e2e


def series_of(text: str) -> dict[str, list[dict[str, str]]]:
    found: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if match := _SAMPLE.match(line):
            found.setdefault(match["name"], []).append(dict(_LABEL.findall(match["labels"])))
    return found


@pytest.fixture(scope="module")
def live(served_one_request: RunningVllmServer) -> dict[str, list[dict[str, str]]]:
    response = httpx.get(f"{served_one_request.base_url}/metrics", timeout=10)
    assert response.status_code == 200
    return series_of(response.text)


def analysed_series() -> set[str]:
    analysis = load_stack("prod").models[0].rollout.canary.analysis
    names = {HTTP_REQUESTS_METRIC}
    for check in analysis_checks(analysis, "vllm-x"):
        names.add(f"{check.metric}_bucket" if check.name.endswith("p95") else check.metric)
    return names


def test_the_capture_has_the_same_vllm_series_as_the_live_server(live: dict) -> None:
    def vllm(series: dict) -> set[str]:
        return {name for name in series if name.startswith("vllm:")}

    assert vllm(CAPTURED) == vllm(live)


@pytest.mark.parametrize("name", sorted(analysed_series()))
def test_every_series_the_analysis_reads_has_the_captured_labels(live: dict, name: str) -> None:
    assert name in live, f"the live server does not export {name}"
    assert {tuple(sorted(labels)) for labels in live[name]} == {
        tuple(sorted(labels)) for labels in CAPTURED[name]
    }


def test_histogram_buckets_and_finished_reasons_are_the_captured_ones(live: dict) -> None:
    for name in analysed_series():
        if name.endswith("_bucket"):
            assert [labels["le"] for labels in live[name]] == [labels["le"] for labels in CAPTURED[name]]
    reasons = "vllm:request_success_total"
    assert (
        {labels["finished_reason"] for labels in live[reasons]}
        == {labels["finished_reason"] for labels in CAPTURED[reasons]}
        >= {"error", "stop", "length"}
    )
