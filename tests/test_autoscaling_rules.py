"""Adapter rules, HPA metric names and KEDA queries all come from one signal catalogue (pure tests).

The vLLM series the rules read must be ones the pinned vLLM exports (domain/vllm_metrics.py, proven
against the real server by tests/e2e); a wrong or renamed metric in config fails at validate time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from components.adapter_rules import (
    DCGM_TENSOR_ACTIVE,
    GROUP_BY,
    LABEL_MATCHERS,
    SERIES,
    SIGNALS,
    adapter_external_rules,
    adapter_query,
    adapter_rules,
    custom_metric_name,
    keda_query,
    to_quantity,
)
from components.autoscaling import hpa_spec
from components.rollouts import workload_reference
from domain import vllm_metrics
from infra.stack_checks import load_stack
from tests.conftest import STACKS
from tests.test_addons_cluster import config_error, load_variant

MODELS = "models"


def _autoscale(metrics: list[dict[str, Any]], **settings: Any):
    def edit(values: dict[str, Any]) -> None:
        values[MODELS][0]["autoscaling"] = {
            "enabled": True,
            "max_replicas": 2,
            "metrics": metrics,
            **settings,
        }
        # Room for a rolling update's surge pod beside two replicas (validate refuses a group that
        # has none: issue 40).
        values["node_groups"]["gpu"]["l40s"]["max_size"] = 3

    return edit


def _exposed_names(rules: list[dict[str, Any]]) -> set[str]:
    return {rule["name"]["as"] for rule in rules}


@pytest.mark.parametrize("stack", STACKS)
def test_hpa_asks_for_exactly_the_metric_names_the_adapter_exposes(stack: str) -> None:
    config = load_stack(stack)
    metrics = [
        metric
        for model in config.models
        if model.autoscaling.enabled and model.autoscaling.backend == "hpa"
        for metric in hpa_spec(model.autoscaling, workload_reference(model, "vllm"), model_name=model.name)[
            "metrics"
        ]
    ]
    asked = {metric["pods"]["metric"]["name"] for metric in metrics if metric["type"] == "Pods"}
    assert asked == _exposed_names(adapter_rules(config.models))
    external = {metric["external"]["metric"]["name"] for metric in metrics if metric["type"] == "External"}
    assert external == _exposed_names(adapter_external_rules(config.models))


def test_stacks_without_hpa_models_serve_no_custom_metrics() -> None:
    assert adapter_rules(load_stack("dev").models) == []


def test_prod_serves_queue_depth_and_kv_cache_but_no_gpu_signal_by_default() -> None:
    rules = adapter_rules(load_stack("prod").models)
    assert _exposed_names(rules) == {"vllm_num_requests_waiting", "vllm_kv_cache_usage_perc"}


PER_POD = [signal for signal in SIGNALS.values() if not signal.external]


@pytest.mark.parametrize("signal", PER_POD, ids=[signal.series for signal in PER_POD])
def test_each_rule_matches_its_series_and_fills_every_adapter_placeholder(signal: Any) -> None:
    [rule] = [
        r for r in adapter_rules(_models_using(signal.series)) if r["name"]["as"] == signal.custom_metric_name
    ]
    assert re.fullmatch(rule["name"]["matches"], signal.series)
    assert rule["seriesQuery"].startswith(signal.series + "{")
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    for placeholder in (SERIES, LABEL_MATCHERS, GROUP_BY):
        assert placeholder in rule["metricsQuery"]
    query = adapter_query(rule, namespace="vllm-m", pods=["vllm-a", "vllm-b"])
    assert query == f'{signal.per_pod}({signal.series}{{namespace="vllm-m",pod=~"vllm-a|vllm-b"}}) by (pod)'


def _models_using(series: str):
    config = load_stack("prod")
    model = config.models[0]
    autoscaling = model.autoscaling.model_copy(
        update={"metrics": [m.model_copy(update={"metric": series}) for m in model.autoscaling.metrics[:1]]}
    )
    return [model.model_copy(update={"autoscaling": autoscaling})]


@pytest.mark.parametrize(
    "signal", [s for s in SIGNALS.values() if s.exporter == "vllm"], ids=lambda s: s.series
)
def test_vllm_series_the_adapter_reads_are_gauges_the_pinned_vllm_exports(signal: Any) -> None:
    # domain/vllm_metrics.py is checked against a real vLLM server of the pinned version (tests/e2e).
    assert vllm_metrics.is_exported(signal.series)
    assert vllm_metrics.EXPORTED_METRICS[signal.series] == "gauge"


def test_kv_cache_signal_is_the_name_the_pinned_vllm_exports() -> None:
    assert "vllm:kv_cache_usage_perc" in SIGNALS
    assert "vllm:gpu_cache_usage_perc" not in SIGNALS
    assert SIGNALS["vllm:kv_cache_usage_perc"].per_pod == "avg"


def test_per_pod_aggregation_sums_queues_and_averages_fractions_and_gpus() -> None:
    assert SIGNALS["vllm:num_requests_waiting"].per_pod == "sum"
    assert SIGNALS[DCGM_TENSOR_ACTIVE].per_pod == "avg"


def test_custom_metric_names_have_no_characters_the_api_path_rejects() -> None:
    for series in SIGNALS:
        assert re.fullmatch(r"[a-z0-9_]+", custom_metric_name(series)), series


def test_keda_query_sums_the_per_pod_query_over_the_deployments_pods() -> None:
    query = keda_query(SIGNALS[DCGM_TENSOR_ACTIVE], namespace="vllm-m", deployment_name="vllm")
    assert query == 'sum(avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{namespace="vllm-m",pod=~"vllm-.+"}) by (pod))'


@pytest.mark.parametrize(
    ("value", "quantity"),
    [(5, "5"), (0.8, "800m"), (80, "80"), (0.85, "850m"), (1.5, "1500m"), (0.001, "1m")],
)
def test_targets_become_kubernetes_quantities(value: float, quantity: str) -> None:
    assert to_quantity(value) == quantity


def test_a_target_finer_than_a_milli_unit_is_not_a_quantity() -> None:
    with pytest.raises(ValueError, match="three decimals"):
        to_quantity(0.0005)


# --- validate-time errors ----------------------------------------


def test_renamed_kv_cache_metric_is_rejected_with_the_new_name(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        _autoscale(
            [
                {"metric": "vllm:num_requests_waiting", "target_average_value": 5},
                {"metric": "vllm:gpu_cache_usage_perc", "target_average_value": 0.8},
            ]
        ),
    )
    assert 'vllm-platform:models[0].autoscaling.metrics[1].metric = "vllm:gpu_cache_usage_perc"' in message
    assert "renamed to vllm:kv_cache_usage_perc" in message
    assert "vLLM 0.32.0" in message


def test_unknown_metric_is_rejected_with_the_signals_that_work(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, _autoscale([{"metric": "DCGM_FI_PROF_PIPE_TENSOR_ACTIV", "target_average_value": 0.5}])
    )
    assert "vllm-platform:models[0].autoscaling.metrics[0].metric" in message
    assert "did you mean DCGM_FI_PROF_PIPE_TENSOR_ACTIVE?" in message
    assert "vllm:num_requests_waiting" in message


def test_exported_vllm_metric_that_is_not_a_signal_is_rejected(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, _autoscale([{"metric": "vllm:num_preemptions_total", "target_average_value": 1}])
    )
    assert "not an autoscaling signal this platform serves" in message


def test_vllm_metric_name_without_prefix_gets_the_exported_name(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, _autoscale([{"metric": "num_requests_waiting", "target_average_value": 5}])
    )
    assert "did you mean vllm:num_requests_waiting?" in message


def test_a_metric_listed_twice_is_rejected(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        _autoscale(
            [
                {"metric": "vllm:num_requests_waiting", "target_average_value": 5},
                {"metric": "vllm:num_requests_waiting", "target_average_value": 9},
            ]
        ),
    )
    assert "vllm-platform:models[0].autoscaling.metrics[1].metric" in message
    assert "listed twice" in message


def test_a_target_finer_than_a_milli_unit_is_rejected(tmp_path: Path) -> None:
    message = config_error(
        tmp_path, _autoscale([{"metric": "vllm:kv_cache_usage_perc", "target_average_value": 0.8005}])
    )
    assert "vllm-platform:models[0].autoscaling.metrics[0].target_average_value = 0.8005" in message


@pytest.mark.parametrize("series", ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"])
def test_a_gpu_busy_counter_that_reads_full_at_one_request_is_refused(tmp_path: Path, series: str) -> None:
    message = config_error(tmp_path, _autoscale([{"metric": series, "target_average_value": 80}]))
    assert f'vllm-platform:models[0].autoscaling.metrics[0].metric = "{series}"' in message
    assert "reads ~100 % with a single stream" in message
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" in message


def test_gpu_signal_without_the_dcgm_exporter_is_rejected(tmp_path: Path) -> None:
    def edit(values: dict[str, Any]) -> None:
        _autoscale([{"metric": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "target_average_value": 0.5}])(values)
        values["addons"] = {"dcgm_exporter": False}

    message = config_error(tmp_path, edit)
    assert "vllm-platform:models[0].autoscaling.metrics[0].metric" in message
    assert "set addons.dcgm_exporter: true" in message


def test_a_correct_metric_list_validates(tmp_path: Path) -> None:
    config = load_variant(
        tmp_path, _autoscale([{"metric": "vllm:num_requests_running", "target_average_value": 48}])
    )
    assert [m.metric for m in config.models[0].autoscaling.metrics] == ["vllm:num_requests_running"]
