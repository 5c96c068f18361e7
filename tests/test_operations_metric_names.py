"""Every series an alert rule, an autoscaling signal or a dashboard reads is one the pinned exporters
export: vLLM 0.32.0 (domain/vllm_metrics.py, proven against a real server by tests/e2e), the DCGM
exporter's default counters (domain/dcgm_metrics.py) and kube-state-metrics (domain/kube_state_metrics.py).
Names are read from each expression by a real PromQL parser (promql-parser), so a renamed metric
anywhere fails here."""

from __future__ import annotations

from typing import Any

import pytest

from components.adapter_rules import SIGNALS, keda_query
from components.alert_rules import alert_rule_groups
from components.dashboards import DASHBOARDS, dashboard_expressions
from domain.config import PlatformConfig
from infra.stack_checks import load_stack
from tests.conftest import STACKS
from tests.support.promql_names import exported_by, series_names, unknown_series


def _groups(config: PlatformConfig) -> list[dict[str, Any]]:
    return alert_rule_groups(
        config.models,
        config.monitoring.alerts,
        dcgm_exporter=bool(config.addons.dcgm_exporter.enabled),
        tenants=config.tenants,
    )


def _alert_expressions() -> list[tuple[str, str]]:
    return [
        (f"{stack} {rule['alert']}", rule["expr"])
        for stack in STACKS
        for group in _groups(load_stack(stack))
        for rule in group["rules"]
    ]


def _dashboard_expressions() -> list[tuple[str, str]]:
    return [
        (f"{slug} {where}", expr)
        for slug, build in DASHBOARDS.items()
        for where, expr in dashboard_expressions(build())
    ]


def test_every_alert_reads_only_series_the_pinned_exporters_export() -> None:
    unknown = {where: unknown_series(expr) for where, expr in _alert_expressions() if unknown_series(expr)}
    assert unknown == {}


def test_every_dashboard_query_reads_only_series_the_pinned_exporters_export() -> None:
    expressions = _dashboard_expressions()
    assert len(expressions) > 40
    unknown = {where: unknown_series(expr) for where, expr in expressions if unknown_series(expr)}
    assert unknown == {}


def test_alerts_and_dashboards_read_every_exporter() -> None:
    exporters = {
        exported_by(name)
        for _, expr in [*_alert_expressions(), *_dashboard_expressions()]
        for name in series_names(expr)
    }
    assert exporters == {"vllm", "dcgm-exporter", "kube-state-metrics", "vllm-router", "vllm-platform-auth"}


def test_every_autoscaling_signal_is_exported() -> None:
    for signal in SIGNALS.values():
        query = keda_query(signal, namespace="vllm-m", deployment_name="vllm", model_name="m")
        assert series_names(query) == {signal.series}
        exporter = {"vllm": "vllm", "dcgm": "dcgm-exporter", "router": "vllm-router"}[signal.exporter]
        assert exported_by(signal.series) == exporter


@pytest.mark.parametrize(
    ("expr", "renamed"),
    [
        ("avg(vllm:gpu_cache_usage_perc)", "vllm:gpu_cache_usage_perc"),  # renamed in vLLM's V1 metrics
        (
            "histogram_quantile(0.9, rate(vllm:time_per_output_token_seconds_bucket[5m]))",
            "vllm:time_per_output_token_seconds_bucket",
        ),
        ("DCGM_FI_PROF_SM_ACTIVE > 0.5", "DCGM_FI_PROF_SM_ACTIVE"),  # commented out in default-counters.csv
        (
            'kube_hpa_status_current_replicas{namespace="x"}',
            "kube_hpa_status_current_replicas",
        ),  # pre-2.0 KSM
        ('{__name__="vllm:num_requests_swapped"}', "vllm:num_requests_swapped"),
        (
            "rate(vllm:num_requests_waiting[$__rate_interval]) * on(pod) group_left vllm:cache_usage",
            "vllm:cache_usage",
        ),
    ],
)
def test_a_renamed_or_missing_metric_is_caught(expr: str, renamed: str) -> None:
    assert renamed in unknown_series(expr)
