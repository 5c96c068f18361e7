"""The canary analysis' PromQL, run by promtool on series captured from the real vLLM 0.32.0 server.

Each measurement of the AnalysisTemplate passes when its query returns at most 1 (`successCondition:
result[0] <= 1`). Here each query becomes an alerting rule `<query> > 1`, with Argo's `{{args.*}}`
filled with a stable and a canary ReplicaSet hash as Argo fills them, and `promtool test rules`
decides on synthetic traffic whether it fires, i.e. whether that measurement would fail.

The input series are not invented: every series name and label set comes from
tests/data/vllm_0.32.0_metrics.txt, the `/metrics` of the real server (captured by
tests/support/capture_vllm_metrics.py; tests/e2e/test_canary_metrics.py re-checks it against a live
server), plus the target labels the vLLM PodMonitor adds (namespace, pod, container, job, instance,
model, rollouts_pod_template_hash). Only the values are synthetic. A query on a metric the server
does not export finds no series and would wave every canary through: that must fail here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.canary_analysis import (
    CANARY_HASH_ARG,
    GROUP_TRACKS,
    ROLLOUT_TRACKS,
    STABLE_HASH_ARG,
    Tracks,
    analysis_checks,
)
from domain.config.models import ModelConfig
from domain.config.rollout import CanaryAnalysisConfig
from infra.stack_checks import load_stack

METRICS_FIXTURE = Path(__file__).resolve().parent / "data" / "vllm_0.32.0_metrics.txt"
RULES_FILE = "canary-analysis-rules.yml"
TEST_FILE = "canary-analysis-test.yml"
STABLE_HASH = "5d8f7c9b6"
CANARY_HASH = "7b9c4d2f1"
MINUTES = 15
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} \S+$")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>[^"]*)"')


def captured_series() -> dict[str, list[dict[str, str]]]:
    """Series name → the label sets the real server exported it with."""
    series: dict[str, list[dict[str, str]]] = defaultdict(list)
    for line in METRICS_FIXTURE.read_text().splitlines():
        if match := _SAMPLE.match(line):
            series[match["name"]].append(dict(_LABEL.findall(match["labels"])))
    return series


CAPTURED = captured_series()


def prod_model() -> ModelConfig:
    model = load_stack("prod").models[0]
    assert model.rollout.strategy == "canary"
    return model


def alerting_rules(
    analysis: CanaryAnalysisConfig, namespace: str, tracks: Tracks = ROLLOUT_TRACKS
) -> dict[str, Any]:
    rules = []
    for check in analysis_checks(analysis, namespace, tracks):
        expr = check.query.replace(f"{{{{args.{CANARY_HASH_ARG}}}}}", CANARY_HASH).replace(
            f"{{{{args.{STABLE_HASH_ARG}}}}}", STABLE_HASH
        )
        rules.append({"alert": f"canary_{check.name.replace('-', '_')}_fails", "expr": f"({expr}) > 1"})
    return {"groups": [{"name": "canary-analysis", "rules": rules}]}


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


class Traffic:
    """One pod's series over MINUTES minutes, with the names and labels the real server exports."""

    def __init__(self, namespace: str, pod_hash: str, model_name: str, pod: str | None = None) -> None:
        self.target = {
            "namespace": namespace,
            "pod": pod or f"vllm-{pod_hash}-x1y2z",
            "container": "vllm",
            "job": f"{namespace}/vllm",
            "instance": "10.0.1.17:8000",
            "model": model_name,
            "rollouts_pod_template_hash": pod_hash,
        }
        self.series: list[dict[str, str]] = []

    def _add(self, name: str, labels: dict[str, str], values: str) -> None:
        assert name in CAPTURED, f"{name} is not in the captured /metrics of vLLM 0.32.0"
        self.series.append({"series": name + _labels({**labels, **self.target}), "values": values})

    def finished(self, per_minute: int, errors_per_minute: int = 0) -> Traffic:
        """vllm:request_success_total: `per_minute` finished requests, some with finished_reason=error."""
        for labels in CAPTURED["vllm:request_success_total"]:
            reason = labels["finished_reason"]
            rate = {"length": per_minute - errors_per_minute, "error": errors_per_minute}.get(reason, 0)
            self._add("vllm:request_success_total", labels, f"0+{rate}x{MINUTES}")
        return self

    def http(self, per_minute: int, errors_per_minute: int = 0) -> Traffic:
        """http_requests_total: the captured label set, with status 2xx and (the same labels) 5xx."""
        [labels] = CAPTURED["http_requests_total"]
        assert labels["status"] == "2xx" and labels["handler"].startswith("/v1/")
        self._add("http_requests_total", labels, f"0+{per_minute - errors_per_minute}x{MINUTES}")
        self._add("http_requests_total", {**labels, "status": "5xx"}, f"0+{errors_per_minute}x{MINUTES}")
        return self

    def histogram(self, metric: str, per_minute: int, bucket_above: float) -> Traffic:
        """Every observation in the first bucket whose bound is above `bucket_above` seconds."""
        buckets = CAPTURED[f"{metric}_bucket"]
        assert buckets, f"{metric} has no buckets in the captured /metrics"
        for labels in buckets:
            bound = float(labels["le"])
            self._add(f"{metric}_bucket", labels, f"0+{per_minute if bound > bucket_above else 0}x{MINUTES}")
        return self

    def waiting(self, metric: str, requests: int) -> Traffic:
        for labels in CAPTURED[metric]:
            self._add(metric, labels, f"{requests}x{MINUTES}")
        return self


def traffic(
    pod_hash: str,
    model: ModelConfig,
    *,
    requests: int = 60,
    errors: int = 0,
    http_errors: int = 0,
    ttft_above: float = 0.1,
    tpot_above: float = 0.02,
    waiting: int = 1,
    pod_name: str | None = None,
) -> list[dict[str, str]]:
    analysis = model.rollout.canary.analysis
    pod = Traffic(model.namespace, pod_hash, model.name, pod_name)
    pod.finished(requests, errors).http(requests, http_errors)
    pod.histogram(analysis.ttft_p95.metric, requests, ttft_above)
    pod.histogram(analysis.tpot_p95.metric, requests, tpot_above)
    pod.waiting(analysis.queue_depth.metric, waiting)
    return pod.series


ALERTS = ("error_rate", "http_error_rate", "ttft_p95", "tpot_p95", "queue_depth")
# (scenario, canary traffic changes, checks that must fail). The stable pod serves 60 requests a
# minute, no errors, TTFT in (0.1, 0.25] s, TPOT in (0.02, 0.04] s, one request waiting.
SCENARIOS: list[tuple[str, dict[str, Any], set[str]]] = [
    ("a canary like the stable pods passes", {}, set()),
    ("10 % engine errors fail the error rate", {"errors": 6}, {"error_rate"}),
    ("20 % 5xx answers fail the HTTP error rate", {"http_errors": 12}, {"http_error_rate"}),
    ("TTFT in (1, 2.5] s fails the TTFT p95", {"ttft_above": 1.0}, {"ttft_p95"}),
    ("TPOT in (0.1, 0.25] s fails the TPOT p95", {"tpot_above": 0.1}, {"tpot_p95"}),
    ("20 waiting requests fail the queue depth", {"waiting": 20}, {"queue_depth"}),
    ("a slower TTFT still under its 0.5 s floor passes", {"ttft_above": 0.25}, set()),
    ("a canary without traffic is not failed", {"requests": 0, "waiting": 0}, set()),
]


def promtool_test(
    model: ModelConfig,
    stable: dict[str, Any],
    scenarios=SCENARIOS,
    pods: tuple[str | None, str | None] = (None, None),
) -> dict[str, Any]:
    """`pods`: the stable and the canary pod's names (default: a Rollout's ReplicaSet pod names)."""
    tests = []
    for _, canary, failing in scenarios:
        tests.append(
            {
                "interval": "1m",
                "input_series": [
                    *traffic(STABLE_HASH, model, **stable, pod_name=pods[0]),
                    *traffic(CANARY_HASH, model, **canary, pod_name=pods[1]),
                ],
                "alert_rule_test": [
                    {
                        "eval_time": f"{MINUTES - 1}m",
                        "alertname": f"canary_{alert}_fails",
                        "exp_alerts": [{"exp_labels": {}}] if alert in failing else [],
                    }
                    for alert in ALERTS
                ],
            }
        )
    return {"rule_files": [RULES_FILE], "evaluation_interval": "1m", "tests": tests}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("promtool")
    assert executable, "promtool is missing: apt-get install prometheus (scripts/setup-test-tools.sh)"
    return subprocess.run([executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def run_scenarios(
    tmp_path: Path,
    model: ModelConfig,
    stable: dict[str, Any] | None = None,
    scenarios=SCENARIOS,
    tracks: Tracks = ROLLOUT_TRACKS,
    pods: tuple[str | None, str | None] = (None, None),
) -> subprocess.CompletedProcess[str]:
    analysis = model.rollout.canary.analysis
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(alerting_rules(analysis, model.namespace, tracks)))
    (tmp_path / TEST_FILE).write_text(yaml.safe_dump(promtool_test(model, stable or {}, scenarios, pods)))
    return promtool("test", "rules", TEST_FILE, cwd=tmp_path)


def test_every_analysis_query_passes_promtool_check_rules(tmp_path: Path) -> None:
    model = prod_model()
    (tmp_path / RULES_FILE).write_text(
        yaml.safe_dump(alerting_rules(model.rollout.canary.analysis, model.namespace))
    )
    result = promtool("check", "rules", RULES_FILE, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_each_check_fails_exactly_the_canary_that_is_worse_in_its_metric(tmp_path: Path) -> None:
    result = run_scenarios(tmp_path, prod_model())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_group_canary_is_judged_on_the_candidates_leaders_against_the_stable_leaders(
    tmp_path: Path,
) -> None:
    """A multi-node canary (docs/multi-node.md, "Canary"): the same checks, the candidate's set
    `vllm-canary` against the stable set `vllm`, told apart by the leaders' pod names. Were the stable
    side's `vllm-[0-9]+` to match `vllm-canary-0` too, a 10 % error canary would be averaged into its
    own baseline and pass: the scenarios would fail."""
    result = run_scenarios(tmp_path, prod_model(), tracks=GROUP_TRACKS, pods=("vllm-0", "vllm-canary-0"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_canary_is_judged_against_the_stable_pods_not_an_absolute_number(tmp_path: Path) -> None:
    # Both sides slow and erroring alike (a load spike, a bad upstream): the canary is not at fault.
    both = {"errors": 6, "http_errors": 12, "ttft_above": 1.0, "tpot_above": 0.1, "waiting": 20}
    result = run_scenarios(tmp_path, prod_model(), stable=both, scenarios=[("alike", both, set())])
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_scenario_expecting_the_wrong_verdict_fails(tmp_path: Path) -> None:
    """The verdicts are really compared: claiming a slow canary passes must fail promtool."""
    result = run_scenarios(tmp_path, prod_model(), scenarios=[("wrong", {"ttft_above": 1.0}, set())])
    assert result.returncode != 0
    assert "canary_ttft_p95_fails" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("check", "not_exported"),
    [("tpot_p95", "vllm:time_per_output_token_seconds"), ("ttft_p95", "vllm:time_to_first_token")],
)
def test_a_query_on_a_metric_vllm_does_not_export_fails(
    tmp_path: Path, check: str, not_exported: str
) -> None:
    """Config validation refuses these names (tests/bad-stacks); were one to get through, its query
    finds no series, reads as 0, and the slow canary its scenario sends would pass: promtool fails."""
    assert not_exported not in CAPTURED and f"{not_exported}_bucket" not in CAPTURED
    model = prod_model()
    analysis = model.rollout.canary.analysis
    wrong = analysis.model_copy(
        update={check: getattr(analysis, check).model_copy(update={"metric": not_exported})}
    )
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(alerting_rules(wrong, model.namespace)))
    slow = {"ttft_p95": {"ttft_above": 1.0}, "tpot_p95": {"tpot_above": 0.1}}[check]
    (tmp_path / TEST_FILE).write_text(yaml.safe_dump(promtool_test(model, {}, [("slow", slow, {check})])))
    result = promtool("test", "rules", TEST_FILE, cwd=tmp_path)
    assert result.returncode != 0
    assert f"canary_{check}_fails" in result.stdout + result.stderr
