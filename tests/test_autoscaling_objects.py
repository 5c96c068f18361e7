"""The autoscaler each model gets, as the real program renders it: an autoscaling/v2 HPA on the
adapter's Pods metrics, or a KEDA ScaledObject on the same queries (`autoscaling.backend`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components.adapter_rules import SIGNALS, keda_query, to_quantity
from components.autoscaling import create_model_autoscaler, scaling_behavior
from components.monitoring import prometheus_url
from components.rollouts import uses_canary
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import model_workloads, rendered
from tests.test_addons_cluster import as_int, config_error, config_of, release


def _autoscalers(result: RenderResult, kind: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["namespace"]: as_int(obj) for obj in result.find(kind)}


def test_every_autoscaled_model_gets_exactly_the_object_of_its_backend(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    hpas, scaled_objects = (
        _autoscalers(stack_render, "HorizontalPodAutoscaler"),
        _autoscalers(stack_render, "ScaledObject"),
    )
    expected_hpa = {
        m.namespace for m in config.models if m.autoscaling.enabled and m.autoscaling.backend == "hpa"
    }
    expected_keda = {
        m.namespace for m in config.models if m.autoscaling.enabled and m.autoscaling.backend == "keda"
    }
    assert set(hpas) == expected_hpa
    assert set(scaled_objects) == expected_keda
    models = {m.namespace: m for m in config.models}
    for namespace, autoscaler in [*hpas.items(), *scaled_objects.items()]:
        assert autoscaler["metadata"]["name"] == "vllm"
        # The Deployment, or for a canary model the Rollout (its scale subresource).
        canary = uses_canary(models[namespace])
        api, kind = ("argoproj.io/v1alpha1", "Rollout") if canary else ("apps/v1", "Deployment")
        assert autoscaler["spec"]["scaleTargetRef"] == {"apiVersion": api, "kind": kind, "name": "vllm"}


def test_prod_exercises_both_backends() -> None:
    result = rendered("prod")
    assert _autoscalers(result, "HorizontalPodAutoscaler") and _autoscalers(result, "ScaledObject")


def test_hpa_scales_on_pods_metrics_with_the_configured_average_targets_and_bounds(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    hpas = _autoscalers(stack_render, "HorizontalPodAutoscaler")
    for model in config.models:
        if model.namespace not in hpas:
            continue
        spec = hpas[model.namespace]["spec"]
        assert spec["minReplicas"] == model.autoscaling.min_replicas
        assert spec["maxReplicas"] == model.autoscaling.max_replicas
        assert spec["metrics"] == [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": SIGNALS[m.metric].custom_metric_name},
                    "target": {"type": "AverageValue", "averageValue": to_quantity(m.target_average_value)},
                },
            }
            for m in model.autoscaling.metrics
        ]


def test_prod_hpa_holds_queue_5_and_kv_cache_80_percent_and_reads_no_gpu_busy_counter() -> None:
    spec = _autoscalers(rendered("prod"), "HorizontalPodAutoscaler")["vllm-llama-3-1-8b"]["spec"]
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"]["averageValue"] for m in spec["metrics"]}
    assert targets == {"vllm_num_requests_waiting": "5", "vllm_kv_cache_usage_perc": "800m"}


def test_no_autoscaler_of_any_stack_reads_a_counter_that_is_full_at_one_request() -> None:
    for stack in ("dev", "staging", "prod"):
        for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
            for namespace, autoscaler in _autoscalers(rendered(stack), kind).items():
                text = json.dumps(autoscaler["spec"])
                assert "gpu_util" not in text.lower() and "GR_ENGINE_ACTIVE" not in text, (stack, namespace)


def test_keda_falls_back_to_max_replicas_after_three_failed_queries() -> None:
    spec = _autoscalers(rendered("prod"), "ScaledObject")["vllm-qwen2-5-7b-tp2"]["spec"]
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": spec["maxReplicaCount"]}
    assert {trigger["metricType"] for trigger in spec["triggers"]} == {"AverageValue"}  # fallback needs it


def test_hpa_scales_up_at_once_and_down_one_pod_per_five_minutes_after_ten_quiet_minutes() -> None:
    behavior = _autoscalers(rendered("prod"), "HorizontalPodAutoscaler")["vllm-llama-3-1-8b"]["spec"][
        "behavior"
    ]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleUp"]["selectPolicy"] == "Max"
    assert {(p["type"], p["value"], p["periodSeconds"]) for p in behavior["scaleUp"]["policies"]} == {
        ("Pods", 4, 60),
        ("Percent", 100, 60),
    }
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert behavior["scaleDown"]["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


def test_rendered_hpas_ask_for_exactly_the_metrics_the_rendered_adapter_serves(
    stack_render: RenderResult,
) -> None:
    rules = release(stack_render, "prometheus-adapter")["values"]["rules"]
    for kind, api in (("Pods", "custom"), ("External", "external")):
        asked = {
            metric[kind.lower()]["metric"]["name"]
            for hpa in _autoscalers(stack_render, "HorizontalPodAutoscaler").values()
            for metric in hpa["spec"]["metrics"]
            if metric["type"] == kind
        }
        assert asked == {rule["name"]["as"] for rule in rules[api]}, kind


def test_scaled_object_triggers_sum_the_adapter_queries_over_the_deployment() -> None:
    result = rendered("prod")
    config = config_of(result)
    # The model that keeps replicas (the to-zero one adds its demand trigger: tests/test_scale_to_zero.py).
    [model] = [
        m
        for m in config.models
        if m.autoscaling.backend == "keda" and m.autoscaling.enabled and not m.scales_to_zero
    ]
    spec = _autoscalers(result, "ScaledObject")[model.namespace]["spec"]
    assert spec["minReplicaCount"] == model.autoscaling.min_replicas
    assert spec["maxReplicaCount"] == model.autoscaling.max_replicas
    assert spec["pollingInterval"] == model.autoscaling.keda_polling_interval_seconds
    hpa_config = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert hpa_config["name"] == "vllm"
    assert hpa_config["behavior"] == scaling_behavior(model.autoscaling)
    assert [trigger["metadata"] for trigger in spec["triggers"]] == [
        {
            "serverAddress": prometheus_url(config.monitoring),
            "query": keda_query(SIGNALS[m.metric], namespace=model.namespace, deployment_name="vllm"),
            "threshold": {0.8: "0.8", 5: "5", 80: "80"}[m.target_average_value],
        }
        for m in model.autoscaling.metrics
    ]
    assert {trigger["type"] for trigger in spec["triggers"]} == {"prometheus"}
    assert {trigger["metricType"] for trigger in spec["triggers"]} == {"AverageValue"}


def test_autoscaled_deployments_leave_replicas_to_the_autoscaler(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        [deployment] = model_workloads(stack_render, model.namespace)
        # A to-zero model is created at zero replicas and ignores the field afterwards (issue 40).
        sets_replicas = not model.autoscaling.enabled or model.scales_to_zero
        assert ("replicas" in deployment["spec"]) is sets_replicas, model.name


def test_no_autoscaler_for_a_model_with_autoscaling_off() -> None:
    config = load_stack("dev")
    model = config.models[0]
    assert not model.autoscaling.enabled
    assert (
        create_model_autoscaler(
            "x", model, "vllm", model.namespace, config.monitoring, pulumi.ResourceOptions()
        )
        is None
    )


@pytest.mark.parametrize(
    ("edit", "where", "fix"),
    [
        (
            lambda v: v.__setitem__("monitoring", {"enabled": False}),
            "vllm-platform:models[0].autoscaling.enabled = true",
            "set monitoring.enabled: true",
        ),
        (
            lambda v: v.setdefault("addons", {}).__setitem__("prometheus_adapter", False),
            'vllm-platform:models[0].autoscaling.backend = "hpa"',
            "set addons.prometheus_adapter: true",
        ),
    ],
    ids=["monitoring-off", "adapter-off"],
)
def test_autoscaling_without_its_metrics_path_is_rejected(
    tmp_path: Path, edit: Any, where: str, fix: str
) -> None:
    message = config_error(tmp_path, edit, base="prod")
    assert where in message and fix in message
