"""`models[].autoscaling`: what each model scales on (the HPA's or KEDA's metrics) and within which
bounds, including scale to zero."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from domain.config.base import INT32_MAX, StrictModel
from domain.config.errors import ConfigProblem


class AutoscalingMetricConfig(StrictModel):
    """One autoscaling signal: a metric and the per-replica average the HPA holds it at."""

    metric: str
    """Prometheus series: vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (per pod) or vllm_router_running_requests (the model's requests in
    flight through the router; needs router.enabled) — the catalogue in components/adapter_rules.py,
    docs/autoscaling.md. DCGM_FI_DEV_GPU_UTIL is refused: it reads full at one request."""
    target_average_value: Annotated[float, Field(gt=0)]
    """Per-replica average the autoscaler holds the metric at, in the metric's unit (requests, fraction
    0–1 of the KV cache, fraction 0–1 of tensor-pipe cycles); at most three decimals (a Kubernetes
    quantity)."""


def _default_autoscaling_metrics() -> list[AutoscalingMetricConfig]:
    return [
        AutoscalingMetricConfig(metric="vllm:num_requests_waiting", target_average_value=5),
        AutoscalingMetricConfig(metric="vllm:kv_cache_usage_perc", target_average_value=0.8),
    ]


class AutoscalingConfig(StrictModel):
    """Replicas driven by vLLM's queue and KV-cache usage, optionally DCGM's tensor-pipe activity
    (docs/autoscaling.md)."""

    enabled: bool = False
    """Off: the Deployment runs `replicas` pods. On: an autoscaler owns the replica count."""
    backend: Literal["hpa", "keda"] = "keda"
    """`keda` (default): a KEDA ScaledObject with Prometheus triggers (needs addons.keda, on by default
    in mode eks); the only backend that scales to zero. `hpa`: autoscaling/v2 HPA on Pods metrics from
    the Prometheus Adapter, which its maintainers propose to deprecate
    (kubernetes-sigs/prometheus-adapter#701); still supported."""
    min_replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] = 1
    """Fewest replicas the autoscaler keeps. 0 (opt-in, backend keda, router.enabled): the model
    scales to zero after `idle_seconds_before_zero` without requests, and the router holds the
    requests that wake it (docs/autoscaling.md, "Scale to zero")."""
    idle_seconds_before_zero: Annotated[int, Field(ge=60, le=86400)] = 900
    """min_replicas 0: seconds without a request through the router (and nothing queued or running in
    vLLM) before the last replica goes. 15 minutes: a wake costs about a minute of waiting on a warm
    node, so only a model idle for much longer than that should give its GPUs back. At least twice
    monitoring.scrape_interval_seconds: the wake trigger's increase() needs two samples in the window."""
    wake_hold_seconds: Annotated[int, Field(ge=30, le=3600)] | None = None
    """min_replicas 0: how long the router holds a request for the model while it wakes, before it
    answers 503. null = the predicted wake time (`vllm-platform plan`) × startup.safety_factor; a
    value below the predicted wake is refused."""
    max_replicas: Annotated[int, Field(ge=1, le=INT32_MAX)] = 2
    """Most replicas; sizes the namespace's GPU quota."""
    metrics: Annotated[list[AutoscalingMetricConfig], Field(min_length=1)] = Field(
        default_factory=_default_autoscaling_metrics
    )
    """Signals; the autoscaler follows whichever asks for the most replicas. Default: queue depth 5,
    KV cache 0.8 (vLLM's own signals lead: they grow with the load users put on a replica)."""
    scale_up_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """Scale up on the first reading above target: a new replica takes minutes to load the model."""
    scale_up_pods_per_period: Annotated[int, Field(ge=1)] = 4
    """Scale-up: most pods added per period."""
    scale_up_percent_per_period: Annotated[int, Field(ge=1, le=1000)] = 100
    """Per `scale_up_period_seconds`, add up to the larger of this many pods and this percentage."""
    scale_up_period_seconds: Annotated[int, Field(ge=15, le=1800)] = 60
    """Scale-up policy period."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 600
    """Scale down only to the highest recommendation of the last 10 minutes (bursty traffic)."""
    scale_down_pods_per_period: Annotated[int, Field(ge=1)] = 1
    """Scale-down: most pods removed per period (slow on purpose: a GPU pod takes minutes to come back)."""
    scale_down_period_seconds: Annotated[int, Field(ge=15, le=1800)] = 300
    """Remove at most `scale_down_pods_per_period` pods per this period."""
    keda_polling_interval_seconds: Annotated[int, Field(ge=5, le=300)] = 15
    """`backend: keda`: how often KEDA queries Prometheus."""
    keda_fallback_replicas: Annotated[int, Field(ge=1)] | None = None
    """`backend: keda`: replicas KEDA sets while its Prometheus query fails (its `fallback`); null =
    max_replicas: while the autoscaler is blind, capacity matters more than cost. (An HPA keeps its
    current count when its metrics fail.)"""
    keda_fallback_failure_threshold: Annotated[int, Field(ge=1, le=60)] = 3
    """`backend: keda`: failed queries in a row before the fallback applies."""

    @model_validator(mode="after")
    def _bounds_ordered(self) -> AutoscalingConfig:
        if self.keda_fallback_replicas is not None and not (
            self.min_replicas <= self.keda_fallback_replicas <= self.max_replicas
        ):
            raise ConfigProblem(
                f"keda_fallback_replicas {self.keda_fallback_replicas} is outside min_replicas "
                f"{self.min_replicas} .. max_replicas {self.max_replicas}; choose a count in that range "
                "or null (max_replicas)",
                at=("keda_fallback_replicas",),
            )
        if self.min_replicas == 0 and self.backend != "keda":
            raise ConfigProblem(
                f"min_replicas 0 needs backend 'keda' (backend is '{self.backend}'): an HPA cannot "
                "scale to zero on the adapter's metrics, and a model at zero has none; set backend: keda "
                "(with addons.keda: true) or min_replicas: 1",
                at=("min_replicas",),
            )
        if self.min_replicas > self.max_replicas:
            raise ConfigProblem(
                f"min_replicas {self.min_replicas} is larger than max_replicas {self.max_replicas}; "
                "raise max_replicas or lower min_replicas",
                at=("min_replicas",),
            )
        return self
