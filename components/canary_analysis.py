"""How a canary is judged: the measurements of its analysis (errors, latency quantiles, queue per pod,
each the canary's against the stable pods' with an allowance), as an Argo Rollouts AnalysisTemplate for
a Rollout's steps or an AnalysisRun for a group canary's weight (docs/rollouts.md, "The analysis")."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from components import leader_worker_set
from domain import vllm_metrics
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.rollout import CanaryAnalysisConfig

ANALYSIS_TEMPLATE = "vllm-canary"
POD_TEMPLATE_HASH_SERIES_LABEL = "rollouts_pod_template_hash"
"""The same label on the Prometheus series (the vLLM PodMonitor copies it, components/monitoring.py)."""
CANARY_HASH_ARG = "canary-hash"
STABLE_HASH_ARG = "stable-hash"
HTTP_REQUESTS_METRIC = "http_requests_total"
"""The API server's own request counter on vLLM's /metrics (prometheus-fastapi-instrumentator),
labelled handler, method and status (`2xx` .. `5xx`): 5xx answers that never reach the engine (a
broken chat template, a crashed tokenizer) show only here."""
SMALLEST_ALLOWANCE = 1e-9
"""Denominator floor of a check whose floor is 0: 0/0 must read as a pass, any error as a failure."""

_CHECK_TYPES: dict[str, str] = {
    "error_rate": "counter",
    "ttft_p95": "histogram",
    "tpot_p95": "histogram",
    "queue_depth": "gauge",
}


@dataclass(frozen=True)
class AnalysisCheck:
    """One measurement of the analysis: the canary's value over what it is allowed (≤ 1 passes)."""

    name: str
    metric: str
    """The vLLM family it reads (for the checks against the pinned vLLM's metrics)."""
    query: str
    """PromQL with Argo's `{{args.canary-hash}}` / `{{args.stable-hash}}` placeholders."""
    meaning: str


@dataclass(frozen=True)
class Tracks:
    """The label matchers that tell the canary's series from the stable ones'."""

    canary: str
    stable: str


ROLLOUT_TRACKS = Tracks(
    canary=f'{POD_TEMPLATE_HASH_SERIES_LABEL}="{{{{args.{CANARY_HASH_ARG}}}}}"',
    stable=f'{POD_TEMPLATE_HASH_SERIES_LABEL}="{{{{args.{STABLE_HASH_ARG}}}}}"',
)
"""A Rollout's: the pod-template hashes Argo passes to each analysis step (`canary_steps`)."""


GROUP_TRACKS = Tracks(
    canary=f'pod=~"{leader_worker_set.leader_pods_pattern(leader_worker_set.CANARY_SET)}"',
    stable=f'pod=~"{leader_worker_set.leader_pods_pattern(leader_worker_set.STABLE_SET)}"',
)
"""A multi-node canary's: the leaders of the candidate's LeaderWorkerSet against the stable one's (only
a leader runs the API server and scheduler whose series the checks read)."""


def _selector(namespace: str, track: str, extra: str = "") -> str:
    matchers = [f'namespace="{namespace}"', track]
    if extra:
        matchers.append(extra)
    return "{" + ",".join(matchers) + "}"


def _number(value: float) -> str:
    return format(value, "g")


def _share_of_allowance(canary: str, stable: str, ratio: float, floor: float) -> str:
    """canary / max(ratio × stable, floor): above 1 exactly when the canary exceeds both the
    multiple of the stable value and the floor. A side without samples in the window (no traffic:
    an empty vector, or NaN from a histogram with no observations) counts as 0."""
    return (
        f"(({canary}) >= 0 or vector(0))"
        f" / clamp_min({_number(ratio)} * (({stable}) >= 0 or vector(0)),"
        f" {_number(max(floor, SMALLEST_ALLOWANCE))})"
    )


def _error_fraction(metric: str, namespace: str, track: str, window: str, error: str, scope: str) -> str:
    selected = _selector(namespace, track, scope)
    errors = _selector(namespace, track, ",".join(filter(None, [scope, error])))
    return f"sum(rate({metric}{errors}[{window}])) / sum(rate({metric}{selected}[{window}]))"


def _quantile(metric: str, quantile: float, namespace: str, track: str, window: str) -> str:
    return (
        f"histogram_quantile({_number(quantile)}, sum by (le) "
        f"(rate({metric}_bucket{_selector(namespace, track)}[{window}])))"
    )


def _queue_per_pod(metric: str, namespace: str, track: str, window: str) -> str:
    # One series per engine; a pod's queue is the sum over its engines (as the autoscaler reads it).
    return f"avg(sum by (pod) (avg_over_time({metric}{_selector(namespace, track)}[{window}])))"


def analysis_checks(
    analysis: CanaryAnalysisConfig, namespace: str, tracks: Tracks = ROLLOUT_TRACKS
) -> list[AnalysisCheck]:
    """The measurements of one model's canary analysis, in the order the AnalysisRun lists them."""
    window = f"{analysis.window_seconds}s"
    errors, ttft, tpot, queue = (
        analysis.error_rate,
        analysis.ttft_p95,
        analysis.tpot_p95,
        analysis.queue_depth,
    )

    engine_error = ('finished_reason="error"', "")
    http_error = ('status="5xx"', 'handler=~"/v1/.*"')
    checks = []
    for name, metric, (error, scope), meaning in (
        (
            "error-rate",
            errors.metric,
            engine_error,
            "share of the canary's finished requests with finished_reason=error",
        ),
        (
            "http-error-rate",
            HTTP_REQUESTS_METRIC,
            http_error,
            "share of the canary's /v1 answers that were 5xx",
        ),
    ):
        canary = _error_fraction(metric, namespace, tracks.canary, window, error, scope)
        stable = _error_fraction(metric, namespace, tracks.stable, window, error, scope)
        checks.append(
            AnalysisCheck(
                name,
                metric,
                _share_of_allowance(canary, stable, errors.max_ratio_to_stable, errors.max_error_fraction),
                meaning,
            )
        )
    for name, latency in (("ttft-p95", ttft), ("tpot-p95", tpot)):
        canary = _quantile(latency.metric, latency.quantile, namespace, tracks.canary, window)
        stable = _quantile(latency.metric, latency.quantile, namespace, tracks.stable, window)
        checks.append(
            AnalysisCheck(
                name,
                latency.metric,
                _share_of_allowance(canary, stable, latency.max_ratio_to_stable, latency.floor_seconds),
                f"the canary's p{latency.quantile * 100:g} of {latency.metric}",
            )
        )
    canary = _queue_per_pod(queue.metric, namespace, tracks.canary, window)
    stable = _queue_per_pod(queue.metric, namespace, tracks.stable, window)
    checks.append(
        AnalysisCheck(
            "queue-depth",
            queue.metric,
            _share_of_allowance(canary, stable, queue.max_ratio_to_stable, queue.floor_requests),
            f"requests waiting per canary pod ({queue.metric})",
        )
    )
    return checks


def analysis_template_spec(
    analysis: CanaryAnalysisConfig, namespace: str, prometheus_url: str
) -> dict[str, Any]:
    """The AnalysisTemplate every analysis step of the model's Rollout runs."""
    return {
        "args": [{"name": CANARY_HASH_ARG}, {"name": STABLE_HASH_ARG}],
        "metrics": _analysis_metrics(analysis, namespace, prometheus_url, ROLLOUT_TRACKS),
    }


def group_analysis_run_spec(
    analysis: CanaryAnalysisConfig, namespace: str, prometheus_url: str
) -> dict[str, Any]:
    """The AnalysisRun that judges one step of a multi-node canary: the same measurements as a
    Rollout's, the candidate's leaders against the stable ones'. Argo Rollouts' controller runs an
    AnalysisRun on its own; nothing acts on its verdict but the next `pulumi up` (docs/multi-node.md)."""
    return {"metrics": _analysis_metrics(analysis, namespace, prometheus_url, GROUP_TRACKS)}


def group_analysis_run_name(model: ModelConfig) -> str:
    """`vllm-canary-<weight>-<digest>`: a new name, so a new run, for each candidate and weight (an
    AnalysisRun runs once; a later `up` of the same step keeps it)."""
    candidate = model.rollout.canary.candidate
    assert candidate is not None
    digest = hashlib.sha256(
        json.dumps(
            [candidate.model_dump(mode="json"), model.rollout.canary.analysis.model_dump(mode="json")],
            sort_keys=True,
        ).encode()
    ).hexdigest()[:8]
    return f"{ANALYSIS_TEMPLATE}-{candidate.weight}-{digest}"


def _analysis_metrics(
    analysis: CanaryAnalysisConfig, namespace: str, prometheus_url: str, tracks: Tracks
) -> list[dict[str, Any]]:
    return [
        {
            "name": check.name,
            "interval": f"{analysis.interval_seconds}s",
            "count": analysis.measurements,
            # Allowance shares: at most 1 passes (components/rollouts.py `_share_of_allowance`).
            "successCondition": "result[0] <= 1",
            "failureLimit": analysis.failure_limit,
            # Prometheus unreachable is not a verdict on the canary: a few misses are retried,
            # more than that end the analysis in Error, which aborts like a failure.
            "consecutiveErrorLimit": 4,
            "provider": {"prometheus": {"address": prometheus_url, "query": check.query}},
        }
        for check in analysis_checks(analysis, namespace, tracks)
    ]


def analysis_metric_problems(analysis: CanaryAnalysisConfig, at: tuple[str | int, ...]) -> list[Problem]:
    """Every check must read a family the pinned vLLM exports, of the type its query needs."""
    problems = []
    for check, kind in _CHECK_TYPES.items():
        metric = getattr(analysis, check).metric
        path = (*at, check, "metric")
        message = vllm_metrics.check_metric_name(metric)
        if message is not None:
            problems.append(
                Problem(path, metric, f"{message} (domain/vllm_metrics.py lists what it exports)")
            )
            continue
        exported = vllm_metrics.EXPORTED_METRICS.get(metric)
        if exported != kind:
            same_kind = sorted(name for name, found in vllm_metrics.EXPORTED_METRICS.items() if found == kind)
            problems.append(
                Problem(
                    path,
                    metric,
                    f"{check} needs a {kind} and {metric} is "
                    f"{'a ' + exported if exported else 'a sample series'}; "
                    f"use one of {', '.join(same_kind[:4])}{' ...' if len(same_kind) > 4 else ''}",
                )
            )
    return problems
