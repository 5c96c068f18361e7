"""Per-model rollout settings: replace pods in place (`rolling`) or ship a canary (docs/rollouts.md).

A canary sends a share of the model's traffic to the new pods, step by step; after each step an
analysis compares vLLM's own metrics of the canary pods with the stable ones in Prometheus, and a
failed analysis aborts the rollout (the stable pods take all traffic again). Argo Rollouts does the
work (components/rollouts.py); this module is only the typed settings and their own checks.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from domain.config.base import StrictModel, reject_retired_keys
from domain.config.errors import ConfigProblem
from domain.config.source import ModelSourceConfig


class ErrorRateCheckConfig(StrictModel):
    """Share of the canary's finished requests that ended in an error (vLLM's finished_reason)."""

    metric: str = "vllm:request_success_total"
    """Counter of finished requests labelled `finished_reason` (stop, length, abort, error, ...)."""
    max_error_fraction: Annotated[float, Field(ge=0, le=1)] = 0.01
    """Fail above this fraction of the canary's finished requests ending with `finished_reason="error"`."""
    max_ratio_to_stable: Annotated[float, Field(ge=1, le=100)] = 2
    """...and only when it is also above this multiple of the stable pods' error fraction (a backend
    problem both see is not the canary's fault)."""


class LatencyCheckConfig(StrictModel):
    """The canary's p95 of a vLLM latency histogram against the stable pods' p95."""

    metric: str
    """A histogram the pinned vLLM exports (domain/vllm_metrics.py), e.g. vllm:time_to_first_token_seconds."""
    quantile: Annotated[float, Field(gt=0, lt=1)] = 0.95
    """Which quantile is compared (0.95: p95)."""
    max_ratio_to_stable: Annotated[float, Field(ge=1, le=100)] = 1.25
    """Fail when the canary's quantile is above this multiple of the stable pods' ..."""
    floor_seconds: Annotated[float, Field(ge=0)]
    """... and above this many seconds (an idle stable side, or noise at very low latencies, never
    fails a canary on its own)."""


class QueueDepthCheckConfig(StrictModel):
    """Requests waiting in the canary pods' vLLM queue, per pod, against the stable pods'."""

    metric: str = "vllm:num_requests_waiting"
    """Gauge of requests waiting for a batch slot, per engine."""
    max_ratio_to_stable: Annotated[float, Field(ge=1, le=100)] = 1.5
    """Fail when the canary's average per pod is above this multiple of the stable pods' ..."""
    floor_requests: Annotated[float, Field(ge=0)] = 5
    """... and above this many waiting requests per pod."""


def _default_ttft() -> LatencyCheckConfig:
    return LatencyCheckConfig(metric="vllm:time_to_first_token_seconds", floor_seconds=0.5)


def _default_tpot() -> LatencyCheckConfig:
    return LatencyCheckConfig(metric="vllm:request_time_per_output_token_seconds", floor_seconds=0.05)


class CanaryAnalysisConfig(StrictModel):
    """How the canary is judged after each traffic step (an Argo Rollouts AnalysisTemplate)."""

    window_seconds: Annotated[int, Field(ge=30, le=3600)] = 300
    """How far back each measurement looks (PromQL range): the analysis window."""
    interval_seconds: Annotated[int, Field(ge=15, le=3600)] = 60
    """Time between two measurements."""
    measurements: Annotated[int, Field(ge=1, le=100)] = 5
    """Measurements per analysis step; a step's analysis lasts interval × measurements."""
    failure_limit: Annotated[int, Field(ge=0, le=100)] = 1
    """Failed measurements of one check tolerated before the analysis fails and the rollout aborts."""
    error_rate: ErrorRateCheckConfig = ErrorRateCheckConfig()
    """Request error rate."""
    ttft_p95: LatencyCheckConfig = Field(default_factory=_default_ttft)
    """Time to first token (default: p95 of vllm:time_to_first_token_seconds, 1.25× stable, floor 0.5 s)."""
    tpot_p95: LatencyCheckConfig = Field(default_factory=_default_tpot)
    """Time per output token (default: p95 of vllm:request_time_per_output_token_seconds, 1.25× stable,
    floor 0.05 s)."""
    queue_depth: QueueDepthCheckConfig = QueueDepthCheckConfig()
    """Queue depth."""


class CanaryCandidateConfig(StrictModel):
    """A multi-node model's canary (docs/multi-node.md, "Canary"): the version under test, run by a
    LeaderWorkerSet `vllm-canary` of its own beside the stable groups, and sent `weight` % of the
    model's requests by the ALB. Each weight is one `pulumi up`; an Argo Rollouts AnalysisRun judges
    it with the same checks as a one-node canary. Promote: weight 100, then the candidate's values
    into the model itself, then remove the candidate; abort: remove it."""

    source: ModelSourceConfig | None = None
    """Where the candidate's revision lives; null: the model's own `source`."""
    vllm: dict[str, Any] = {}
    """`models[].vllm` keys whose values differ for the candidate (e.g. extra_args, max_num_seqs),
    merged over the model's own and checked like them."""
    replicas: Annotated[int, Field(ge=1, le=16)] = 1
    """Groups running the candidate, each of nodes_per_replica nodes of the model's GPU group, beside
    the stable groups (`validate` checks the group has room for both)."""
    weight: Annotated[int, Field(ge=0, le=100)] = 10
    """Percent of the model's requests the ALB sends to the candidate's leaders. 0: its groups start
    (a large model loads for minutes) but serve nothing; 100: all traffic, the step before promotion."""


class CanaryConfig(StrictModel):
    """Traffic steps of a canary rollout; an analysis runs after each step."""

    @model_validator(mode="before")
    @classmethod
    def _no_max_surge(cls, data: Any) -> Any:
        why = (
            "it was never applied. The canary's pods follow its traffic weight (ceil(weight x "
            "replicas), Argo Rollouts' dynamicStableScale) and the stable side shrinks as it grows, so "
            "the model runs at most one extra pod, which the namespace's GPU quota reserves "
            "(docs/rollouts.md); remove the key"
        )
        reject_retired_keys(data, {"max_surge": why})
        return data

    steps: Annotated[list[int], Field(min_length=1, max_length=10)] = [10, 50]
    """Canary traffic weights in percent, increasing, each below 100; after the last one the canary
    is promoted to 100 %. Default 10 % → analysis → 50 % → analysis → 100 %. One-node models only
    (a multi-node canary is stepped by `candidate.weight`)."""
    analysis: CanaryAnalysisConfig = CanaryAnalysisConfig()
    """What each analysis compares and for how long."""
    abort_scale_down_delay_seconds: Annotated[int, Field(ge=0, le=86400)] = 600
    """After an abort, how long the failed canary pods stay (not serving) for `kubectl logs`."""
    candidate: CanaryCandidateConfig | None = None
    """Multi-node models only: the version under test, in groups of its own (Argo Rollouts cannot
    drive a LeaderWorkerSet). A one-node model needs none: change the model itself and Argo steps
    `steps`. Null: no canary in progress, every request to the stable groups."""

    @field_validator("steps")
    @classmethod
    def _weights_increase_below_100(cls, steps: list[int]) -> list[int]:
        for index, weight in enumerate(steps):
            if not 0 < weight < 100:
                raise ValueError(
                    f"step {index} is {weight} %: each weight is a share of traffic above 0 and below 100 "
                    "(the canary gets 100 % when it is promoted after the last step), e.g. [10, 50]"
                )
            if index and weight <= steps[index - 1]:
                raise ValueError(
                    f"weights must increase: step {index} ({weight} %) is not above step {index - 1} "
                    f"({steps[index - 1]} %); e.g. [10, 50]"
                )
        return steps


class RolloutConfig(StrictModel):
    """How a new revision, image or set of arguments replaces the running pods (docs/rollouts.md)."""

    strategy: Literal["rolling", "canary"] = "rolling"
    """`rolling`: a Deployment replaces pods one at a time (docs/serving.md). `canary`: an Argo
    Rollouts Rollout shifts traffic step by step, checked against vLLM's metrics (needs
    addons.argo_rollouts, monitoring and the ALB ingress); for a multi-node model, the
    `canary.candidate`'s own groups at the weight the stack gives (docs/multi-node.md)."""
    replace_in_place: bool = False
    """`rolling` only: replace pods in place (maxSurge 0, maxUnavailable 1) even when the model may
    run a single replica. A rollout then needs no GPU beyond the replicas' own, but a model at one
    replica is down while its new pod starts. Default false: a model that may run one replica
    (`replicas` 1, or `autoscaling.min_replicas` 0 or 1) surges one pod (maxSurge 1), which needs
    a free GPU set in its group while every model there runs its max replicas (`validate` checks)."""
    canary: CanaryConfig = CanaryConfig()
    """Steps and analysis of `strategy: canary` (ignored for `rolling`)."""

    @model_validator(mode="after")
    def _in_place_is_rolling(self) -> RolloutConfig:
        if self.replace_in_place and self.strategy == "canary":
            raise ConfigProblem(
                "a canary's pods follow its traffic weight (Argo Rollouts), not a surge setting; "
                "remove replace_in_place, or use strategy: rolling",
                at=("replace_in_place",),
            )
        return self
