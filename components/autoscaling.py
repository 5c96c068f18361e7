"""One autoscaler per model: an `autoscaling/v2` HPA or a KEDA ScaledObject (`autoscaling.backend`).

The model's ModelService calls `create_model_autoscaler` for its vLLM Deployment. Both backends
scale on the same signals (components/adapter_rules.py) with the same bounds and the same
behaviour: fast scale-up (a replica needs minutes to load the model, so react at once), slow
scale-down (traffic is bursty; a removed replica costs a cold start to get back).

When an autoscaler owns a Deployment (`autoscaler_owns_replicas(model)`), no `pulumi up` may set
`spec.replicas`: it would reset the count the autoscaler chose. The Deployment leaves it unset,
except a model that scales to zero, which is created at 0 (`replicas_at_creation`) and ignores the
field on every later `up`. With `rollout.strategy: canary` the pods belong to an Argo Rollouts
Rollout instead, and the autoscaler scales that (its scale subresource;
`components.rollouts.workload_reference`), under the same rules.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components import leader_worker_set
from components.adapter_rules import (
    SIGNALS,
    external_metric_selector,
    keda_query,
    router_demand_query,
    to_quantity,
)
from components.monitoring import prometheus_url
from components.rollouts import workload_reference
from domain.config.autoscaling import AutoscalingConfig
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import MonitoringConfig, PlatformConfig
from domain.labels import model_labels

KEDA_API_VERSION = "keda.sh/v1alpha1"


def autoscaler_owns_replicas(model: ModelConfig) -> bool:
    """True when no `pulumi up` may set the Deployment's or Rollout's `spec.replicas` (an HPA or KEDA
    sets it): unset, or set at creation only (`replicas_at_creation`)."""
    return model.autoscaling.enabled


def replicas_at_creation(model: ModelConfig) -> int | None:
    """The `spec.replicas` an autoscaled workload is created with; None: left unset.

    Unset, the API server defaults it to 1, which the autoscaler then moves to its minimum. For a
    model that scales to zero that one replica is for nothing: on EKS it boots a GPU node, and the
    first `pulumi up` waits for the pod to be ready, before KEDA takes it back to zero (issue 40).
    Such a model is created at 0, and the workload ignores `spec.replicas` on every later `up`
    (ModelService's `ignore_changes`): Pulumi's provider then sends the field only while its own
    field manager still owns it, at the live value, and drops it once KEDA has scaled the workload
    through /scale, so no `up` resets KEDA's count (tests/test_deploy_pulumi.py runs both)."""
    if autoscaler_owns_replicas(model) and model.scales_to_zero:
        return 0
    return None


def create_model_autoscaler(
    name: str,
    model: ModelConfig,
    deployment_name: str,
    namespace: str,
    monitoring: MonitoringConfig,
    opts: pulumi.ResourceOptions,
) -> pulumi.Resource | None:
    """Create the autoscaler of one model's vLLM Deployment; None when `autoscaling.enabled` is false.

    name: Pulumi name prefix (e.g. `<model service>-autoscaler`); the child is `<name>-hpa` or
        `<name>-scaledobject`.
    model: the model's config; `model.autoscaling` picks the backend, bounds, metrics and behaviour.
    deployment_name / namespace: the Deployment to scale. Its pods carry
        `domain.labels.model_selector_labels` and serve /metrics on the container port named
        `http`, which the cluster-wide vLLM PodMonitor (components/monitoring.py) scrapes.
    monitoring: `config.monitoring`; KEDA triggers query the Prometheus it names.
    opts: the caller's child options, e.g. `ResourceOptions(parent=self, depends_on=[deployment,
        *add-on releases])`. The HPA reads the custom metrics API of the Prometheus Adapter release
        and a ScaledObject needs KEDA's CRDs: `KubernetesPlatform` passes those releases to the
        ModelService (`ModelServiceArgs.depends_on`), which should put them in `depends_on` here.

    The Kubernetes object is named `deployment_name` in `namespace` (so is the HPA KEDA generates);
    it scales the Deployment of that name, or the Rollout of that name for a canary model.
    """
    if not model.autoscaling.enabled:
        return None
    metadata = {"name": deployment_name, "namespace": namespace, "labels": model_labels(model.name)}
    if model.autoscaling.backend == "hpa":
        return kubernetes.autoscaling.v2.HorizontalPodAutoscaler(
            f"{name}-hpa",
            metadata=metadata,
            spec=hpa_spec(
                model.autoscaling, workload_reference(model, deployment_name), model_name=model.name
            ),
            opts=opts,
        )
    return kubernetes.apiextensions.CustomResource(
        f"{name}-scaledobject",
        api_version=KEDA_API_VERSION,
        kind="ScaledObject",
        metadata=metadata,
        spec=scaled_object_spec(
            model.autoscaling,
            workload_reference(model, deployment_name),
            namespace,
            prometheus_url(monitoring),
            model_name=model.name,
        ),
        opts=opts,
    )


def scaling_behavior(autoscaling: AutoscalingConfig) -> dict[str, Any]:
    """HPA behaviour: the larger of N pods or P % per period up at once, one pod per period down."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": autoscaling.scale_up_stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [
                {
                    "type": "Pods",
                    "value": autoscaling.scale_up_pods_per_period,
                    "periodSeconds": autoscaling.scale_up_period_seconds,
                },
                {
                    "type": "Percent",
                    "value": autoscaling.scale_up_percent_per_period,
                    "periodSeconds": autoscaling.scale_up_period_seconds,
                },
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": autoscaling.scale_down_stabilization_seconds,
            "selectPolicy": "Max",
            "policies": [
                {
                    "type": "Pods",
                    "value": autoscaling.scale_down_pods_per_period,
                    "periodSeconds": autoscaling.scale_down_period_seconds,
                },
            ],
        },
    }


def hpa_spec(
    autoscaling: AutoscalingConfig, scale_target: dict[str, str], *, model_name: str | None = None
) -> dict[str, Any]:
    """Pods metrics from the custom metrics API (Prometheus Adapter), AverageValue targets; a router
    signal as an External metric for the model (selector `model=<model_name>`), AverageValue too, so
    the HPA divides the model's total by its replicas and holds the per-replica value at the target.

    scale_target: the workload's apiVersion, kind and name (`workload_reference`)."""
    return {
        "scaleTargetRef": dict(scale_target),
        "minReplicas": autoscaling.min_replicas,
        "maxReplicas": autoscaling.max_replicas,
        "metrics": [
            hpa_metric(metric.metric, metric.target_average_value, model_name)
            for metric in autoscaling.metrics
        ],
        "behavior": scaling_behavior(autoscaling),
    }


def hpa_metric(series: str, target_average_value: float, model_name: str | None) -> dict[str, Any]:
    signal = SIGNALS[series]
    target = {"type": "AverageValue", "averageValue": to_quantity(target_average_value)}
    if not signal.external:
        return {"type": "Pods", "pods": {"metric": {"name": signal.custom_metric_name}, "target": target}}
    if model_name is None:
        raise ValueError(f"{series} is per model: pass model_name")
    return {
        "type": "External",
        "external": {
            "metric": {
                "name": signal.custom_metric_name,
                "selector": {"matchLabels": external_metric_selector(model_name)},
            },
            "target": target,
        },
    }


def scaled_object_spec(
    autoscaling: AutoscalingConfig,
    scale_target: dict[str, str],
    namespace: str,
    prometheus_url: str,
    *,
    model_name: str | None = None,
) -> dict[str, Any]:
    """KEDA ScaledObject: Prometheus triggers on the adapter's per-pod queries, summed per workload
    (a Deployment's and a Rollout's pods are both named `<name>-<hash>-<suffix>`); a router signal's
    trigger sums the model's router series (`model_name`)."""
    deployment_name = scale_target["name"]
    return {
        "scaleTargetRef": dict(scale_target),
        "minReplicaCount": autoscaling.min_replicas,
        "maxReplicaCount": autoscaling.max_replicas,
        "pollingInterval": autoscaling.keda_polling_interval_seconds,
        # When Prometheus cannot answer, hold a known replica count instead of the last one KEDA
        # computed (needs AverageValue triggers, which these are).
        "fallback": {
            "failureThreshold": autoscaling.keda_fallback_failure_threshold,
            "replicas": keda_fallback_replicas(autoscaling),
        },
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "name": deployment_name,
                "behavior": scaling_behavior(autoscaling),
            },
        },
        **(_to_zero(autoscaling) if autoscaling.min_replicas == 0 else {}),
        "triggers": (
            [router_demand_trigger(autoscaling, prometheus_url, model_name)]
            if autoscaling.min_replicas == 0
            else []
        )
        + [
            {
                "type": "prometheus",
                "name": SIGNALS[metric.metric].custom_metric_name,
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": prometheus_url,
                    "query": keda_query(
                        SIGNALS[metric.metric],
                        namespace=namespace,
                        deployment_name=deployment_name,
                        model_name=model_name,
                        leaders_only=scale_target["kind"] == leader_worker_set.LWS_KIND,
                    ),
                    # KEDA parses the threshold as a float, not as a Kubernetes quantity.
                    "threshold": _plain_number(metric.target_average_value),
                },
            }
            for metric in autoscaling.metrics
        ],
    }


ROUTER_DEMAND_TRIGGER = "router_demand"


def _to_zero(autoscaling: AutoscalingConfig) -> dict[str, Any]:
    # The idle window is in the demand trigger's query; KEDA's own cooldown (the time since the last
    # active trigger before 1 -> 0) then only needs to outlast one poll.
    return {"cooldownPeriod": autoscaling.keda_polling_interval_seconds}


def router_demand_trigger(
    autoscaling: AutoscalingConfig, prometheus_url: str, model_name: str | None
) -> dict[str, Any]:
    """The trigger that wakes a model at zero (min_replicas 0): active while the model's router has
    held or routed a request in the last `idle_seconds_before_zero`. Its value is 0 or 1 with
    threshold 1, so it asks for at most one replica; the other triggers size the model once it serves."""
    if model_name is None:
        raise ValueError("a to-zero model's demand trigger is per model: pass model_name")
    return {
        "type": "prometheus",
        "name": ROUTER_DEMAND_TRIGGER,
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": prometheus_url,
            "query": router_demand_query(model_name, autoscaling.idle_seconds_before_zero),
            "threshold": "1",
            "activationThreshold": "0",
        },
    }


def keda_fallback_replicas(autoscaling: AutoscalingConfig) -> int:
    """`keda_fallback_replicas`, or max_replicas: while blind, capacity before cost."""
    if autoscaling.keda_fallback_replicas is not None:
        return autoscaling.keda_fallback_replicas
    return autoscaling.max_replicas


def _plain_number(value: float) -> str:
    return format(Decimal(str(value)).normalize(), "f")


def autoscaling_pipeline_problems(config: PlatformConfig) -> list[Problem]:
    """An autoscaled model needs the metrics path its backend reads: Prometheus, and for `hpa` the adapter."""
    problems = []
    for index, model in enumerate(config.models):
        if not model.autoscaling.enabled:
            continue
        path = ("models", index, "autoscaling")
        if not config.monitoring.enabled:
            problems.append(
                Problem(
                    (*path, "enabled"),
                    True,
                    "autoscaling reads vLLM and DCGM metrics from Prometheus, "
                    "but monitoring.enabled is false; "
                    "set monitoring.enabled: true or autoscaling.enabled: false",
                )
            )
        elif model.autoscaling.backend == "hpa" and not config.addons.prometheus_adapter.enabled:
            problems.append(
                Problem(
                    (*path, "backend"),
                    "hpa",
                    "backend 'hpa' reads its metrics from the Prometheus Adapter, which is off; set "
                    "addons.prometheus_adapter: true, or use backend 'keda' (with addons.keda: true)",
                )
            )
    return problems
