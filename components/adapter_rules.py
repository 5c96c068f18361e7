"""Autoscaling signals → Prometheus Adapter rules, HPA metric names and KEDA queries (pure).

One catalogue (`SIGNALS`) says, for every series a model may scale on, which exporter produces
it and how one pod's series combine into the pod's value. Everything that names or queries a
signal is derived from it, so the adapter rule, the name the HPA asks the custom metrics API for
and the KEDA trigger query cannot disagree:

- `adapter_rules(models)`: the Prometheus Adapter's `rules.custom`, one rule per per-pod signal used
  by an HPA-backed model. The adapter fills `<<.Series>>`, `<<.LabelMatchers>>` and `<<.GroupBy>>`
  per request; `adapter_query` does the same substitution (used by the promtool tests and the docs).
- `adapter_external_rules(models)`: its `rules.external`, one rule per router signal (below) used by
  an HPA-backed model; `adapter_external_query` fills it as the adapter does for an External metric.
- `custom_metric_name(series)`: the name the adapter exposes and the HPA asks for.
- `keda_query(series, namespace, deployment)`: the same per-pod query summed over the
  Deployment's pods, because a KEDA trigger's threshold is divided into the total.

Per-pod aggregation (docs/autoscaling.md, "What one pod's value means"):
- vLLM gauges carry one series per engine (`engine` label); a pod's queue is the `sum` over its
  engines, its KV-cache usage the `avg` (a fraction of each engine's cache).
- DCGM exports one series per GPU, attributed to the pod holding it (`namespace`/`pod` labels).
  A tensor-parallel pod holds several GPUs: its tensor-pipe activity is their `avg`, so a 0.5
  target means "this pod's GPUs' tensor pipes are busy half the cycles on average", whatever the
  TP size.
- The router's in-flight requests (`vllm_router_running_requests`, exporter "router") are not a pod's
  series: each router pod's `route-<model>` container counts the requests it has sent to each of
  the model's pods and not finished, and the router PodMonitor labels those series `model=<name>`.
  The model's value is their `sum` over router pods and workers, served as an External metric
  (selector `model=<name>`, `AverageValue` target: Kubernetes divides it by the model's replicas).
- `DCGM_FI_DEV_GPU_UTIL` (and `DCGM_FI_PROF_GR_ENGINE_ACTIVE`) are refused: they read ~100 % with a
  single stream (issue 19), so an autoscaler on them adds a replica per concurrent stream.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from components.leader_worker_set import leader_pods_pattern
from components.scrape import series_gaps
from domain import dcgm_metrics, router_metrics, vllm_metrics
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.labels import MODEL_SERIES_LABEL, ROUTER_NAMESPACE

DCGM_TENSOR_ACTIVE = dcgm_metrics.TENSOR_PIPE_ACTIVE
"""Fraction 0–1 of cycles the tensor (HMMA) pipe is active, per GPU (DCGM's profiling counter, in the
pinned exporter's default counters). It grows with the batch a GPU computes, unlike
DCGM_FI_DEV_GPU_UTIL, which reads full whenever any kernel runs."""

ROUTER_RUNNING_REQUESTS = router_metrics.RUNNING_REQUESTS
"""Requests a model's router (every router pod's `route-<model>`) has sent to the model's pods and
not finished: what the model is serving or has queued, through the router only."""

# The adapter's template placeholders (Go text/template with `<<`/`>>` delimiters).
SERIES = "<<.Series>>"
LABEL_MATCHERS = "<<.LabelMatchers>>"
GROUP_BY = "<<.GroupBy>>"


@dataclass(frozen=True)
class ScalingSignal:
    series: str
    """Prometheus series name as the exporter writes it."""
    exporter: Literal["vllm", "dcgm", "router"]
    per_pod: Literal["sum", "avg"]
    """How the pod's own series (one per vLLM engine, one per GPU) combine into the pod's value; for
    a router signal, how the model's series (one per router pod and worker) combine into the model's."""
    unit: str

    @property
    def custom_metric_name(self) -> str:
        return custom_metric_name(self.series)

    @property
    def external(self) -> bool:
        """True: the series belong to the router's pods, not the model's; the HPA reads an External
        metric for the model (external.metrics.k8s.io), not a Pods metric."""
        return self.exporter == "router"


SIGNALS: dict[str, ScalingSignal] = {
    signal.series: signal
    for signal in (
        ScalingSignal(vllm_metrics.NUM_REQUESTS_WAITING, "vllm", "sum", "requests waiting for a batch slot"),
        ScalingSignal(vllm_metrics.NUM_REQUESTS_RUNNING, "vllm", "sum", "requests in the running batch"),
        ScalingSignal(vllm_metrics.KV_CACHE_USAGE, "vllm", "avg", "fraction 0–1 of KV-cache blocks in use"),
        ScalingSignal(
            DCGM_TENSOR_ACTIVE,
            "dcgm",
            "avg",
            "fraction 0–1 of cycles the tensor pipe is active, mean of the pod's GPUs",
        ),
        ScalingSignal(
            ROUTER_RUNNING_REQUESTS,
            "router",
            "sum",
            "the model's requests in flight through the router, per replica of the model",
        ),
    )
}


def custom_metric_name(series: str) -> str:
    """`vllm:num_requests_waiting` → `vllm_num_requests_waiting`: no ':' in custom metrics API paths."""
    return re.sub(r"[^a-z0-9_]", "_", series.lower())


def per_pod_query_template(signal: ScalingSignal) -> str:
    """The adapter's metricsQuery: one value per pod that `<<.LabelMatchers>>` selects."""
    return f"{signal.per_pod}({SERIES}{{{LABEL_MATCHERS}}}) by ({GROUP_BY})"


def router_series_matchers() -> str:
    """Only the model routers' series: the router namespace, and a `model` label (the front's own
    series have none, and count no requests in flight in 0.1.17's multi-model mode)."""
    return f'namespace="{ROUTER_NAMESPACE}",{MODEL_SERIES_LABEL}!=""'


def adapter_rule(signal: ScalingSignal) -> dict[str, Any]:
    """One `rules.custom` entry of the Prometheus Adapter chart."""
    assert not signal.external, f"{signal.series} is an external rule (adapter_external_rule)"
    return {
        # Only series attributed to a pod: DCGM series of GPUs no pod holds have an empty `pod`.
        "seriesQuery": f'{signal.series}{{namespace!="",pod!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
        "name": {"matches": f"^{re.escape(signal.series)}$", "as": signal.custom_metric_name},
        "metricsQuery": per_pod_query_template(signal),
    }


def adapter_external_rule(signal: ScalingSignal) -> dict[str, Any]:
    """One `rules.external` entry: the model's router series, summed.

    prometheus-adapter (v0.12, pkg/naming/metrics_query.go `BuildExternal`) turns an External metric
    request into `<<.LabelMatchers>>` = the HPA's `metric.selector` as matchers, plus
    `namespace="<the HPA's namespace>"` unless the rule says `resources.namespaced: false`; it
    leaves `<<.GroupBy>>` empty. The HPA lives in the model's namespace and the series in the
    router's, so the rule is not namespaced and names the router namespace itself.
    """
    assert signal.external, f"{signal.series} is a per-pod rule (adapter_rule)"
    return {
        "seriesQuery": f"{signal.series}{{{router_series_matchers()}}}",
        "resources": {"namespaced": False},
        "name": {"matches": f"^{re.escape(signal.series)}$", "as": signal.custom_metric_name},
        "metricsQuery": f'{signal.per_pod}({SERIES}{{namespace="{ROUTER_NAMESPACE}",{LABEL_MATCHERS}}})',
    }


def external_metric_selector(model_name: str) -> dict[str, str]:
    """The HPA's External metric selector: the model's series (`model=<name>`)."""
    return {MODEL_SERIES_LABEL: model_name}


def adapter_external_query(rule: dict[str, Any], *, selector: dict[str, str]) -> str:
    """The query the adapter sends for
    `kubectl get --raw /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>?labelSelector=...`.

    Mirrors prometheus-adapter's BuildExternal for a rule with `namespaced: false`: one `key="value"`
    matcher per selector label, in the order of the parsed label selector (sorted by key), joined by
    commas; no namespace matcher; `<<.GroupBy>>` empty.
    """
    series = rule["seriesQuery"].split("{", 1)[0]
    matchers = ",".join(f'{key}="{value}"' for key, value in sorted(selector.items()))
    query = rule["metricsQuery"].replace(SERIES, series).replace(LABEL_MATCHERS, matchers)
    return query.replace(GROUP_BY, "")


def hpa_signals(models: Iterable[ModelConfig]) -> list[ScalingSignal]:
    """Signals the adapter must serve: those of the models whose HPA reads the custom metrics API."""
    series = {
        metric.metric
        for model in models
        if model.autoscaling.enabled and model.autoscaling.backend == "hpa"
        for metric in model.autoscaling.metrics
    }
    return [SIGNALS[name] for name in sorted(series)]


def adapter_rules(models: Iterable[ModelConfig]) -> list[dict[str, Any]]:
    """`rules.custom`: the per-pod signals (custom.metrics.k8s.io)."""
    return [adapter_rule(signal) for signal in hpa_signals(models) if not signal.external]


def adapter_external_rules(models: Iterable[ModelConfig]) -> list[dict[str, Any]]:
    """`rules.external`: the router signals (external.metrics.k8s.io). Empty unless an HPA-backed model
    scales on one: the chart then registers the external metrics APIService, which KEDA otherwise
    owns (validation keeps the two apart: `_exporter_problem`)."""
    return [adapter_external_rule(signal) for signal in hpa_signals(models) if signal.external]


def adapter_query(rule: dict[str, Any], *, namespace: str, pods: Sequence[str]) -> str:
    """The query the adapter sends for `kubectl get --raw .../namespaces/<ns>/pods/*/<metric>`.

    Mirrors prometheus-adapter's substitution for a namespaced pods request: the series name, the
    label matchers `namespace="<ns>",pod=~"<pod>|<pod>"` and the group-by label `pod`.
    """
    series = rule["seriesQuery"].split("{", 1)[0]
    matchers = f'namespace="{namespace}",pod=~"{"|".join(pods)}"'
    query = rule["metricsQuery"].replace(SERIES, series).replace(LABEL_MATCHERS, matchers)
    return query.replace(GROUP_BY, "pod")


def keda_query(
    signal: ScalingSignal,
    *,
    namespace: str,
    deployment_name: str,
    model_name: str | None = None,
    leaders_only: bool = False,
) -> str:
    """The per-pod query of the adapter rule, summed over the Deployment's pods.

    KEDA divides a trigger's value by its threshold to get replicas (an External metric with an
    AverageValue target), so summing the per-pod values makes the threshold a per-pod average,
    exactly like the HPA's Pods metric. A router signal is the adapter's external query for the
    model (`model_name`): already the model's total.

    leaders_only: the workload is a LeaderWorkerSet, whose replicas are groups. Only a group's
    leader (`<name>-<group>`; its workers are `<name>-<group>-<worker>`) runs the API server and
    the scheduler whose queue and KV gauges the signals read, so the sum is over leaders: a
    threshold per group, as the HPA's Pods metric averages over the LWS's `hpaPodSelector`
    (leaders only).
    """
    if signal.external:
        if model_name is None:
            raise ValueError(f"{signal.series} is per model: pass model_name")
        rule = adapter_external_rule(signal)
        return adapter_external_query(rule, selector=external_metric_selector(model_name))
    pods = leader_pods_pattern(deployment_name) if leaders_only else f"{deployment_name}-.+"
    matchers = f'namespace="{namespace}",pod=~"{pods}"'
    per_pod = per_pod_query_template(signal).replace(SERIES, signal.series).replace(LABEL_MATCHERS, matchers)
    return f"sum({per_pod.replace(GROUP_BY, 'pod')})"


def router_demand_query(model_name: str, window_seconds: int) -> str:
    """1 while the model's router has routed or held a request in the last `window_seconds`, else 0:
    the trigger that wakes a model at zero and keeps it up until it has been idle that long.

    At zero the model has no pods and so no vLLM series; its router does: every held attempt counts
    `vllm_router_request_errors_total` and every routed request `vllm_router_requests_total`. The
    model's demand in the window is their `increase()` (which handles a router container's restart:
    counters start again) plus the value of every series that had no sample `window_seconds` ago (a
    new router pod, or the first held request on a router that never failed before: `increase()`
    needs two samples, so the first scrape would read nothing); clamped to 1, since KEDA would
    otherwise size replicas on it. (A first form, now minus `offset`, read negative for a whole window
    after a restart: tests/test_scale_to_zero_demand.py.)"""
    selector = (
        f'{{__name__=~"{router_metrics.REQUESTS_TOTAL}|{router_metrics.REQUEST_ERRORS_TOTAL}",'
        f'namespace="{ROUTER_NAMESPACE}",{MODEL_SERIES_LABEL}="{model_name}"}}'
    )
    window = f"{window_seconds}s"
    return (
        f"clamp_max((sum(increase({selector}[{window}])) or vector(0))"
        f" + (sum({selector} unless {selector} offset {window}) or vector(0)), 1)"
    )


def to_quantity(value: float) -> str:
    """A target as a Kubernetes quantity: 5 → "5", 0.8 → "800m" (the HPA compares milli-units)."""
    milli = Decimal(str(value)) * 1000
    if milli != milli.to_integral_value():
        raise ValueError(f"{value} has more than three decimals; Kubernetes quantities stop at milli-units")
    milli_int = int(milli)
    return str(milli_int // 1000) if milli_int % 1000 == 0 else f"{milli_int}m"


def autoscaling_metric_problems(config: PlatformConfig) -> list[Problem]:
    """Each autoscaling metric must be a signal the platform serves and the pinned exporters export."""
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        seen: set[str] = set()
        for position, metric in enumerate(model.autoscaling.metrics):
            path: tuple[str | int, ...] = ("models", index, "autoscaling", "metrics", position)
            message = _metric_name_problem(metric.metric)
            if message is None and metric.metric in seen:
                message = "listed twice for this model; keep one entry per metric"
            if message is None and model.autoscaling.enabled:
                message = _exporter_problem(SIGNALS[metric.metric], config, model)
            if message is not None:
                problems.append(Problem((*path, "metric"), metric.metric, message))
            seen.add(metric.metric)
            try:
                to_quantity(metric.target_average_value)
            except ValueError as error:
                problems.append(
                    Problem((*path, "target_average_value"), metric.target_average_value, str(error))
                )
    return problems


def _metric_name_problem(name: str) -> str | None:
    supported = ", ".join(sorted(SIGNALS))
    if name in dcgm_metrics.LOAD_INDEPENDENT_UTILIZATION:
        return (
            f"{name} measures {dcgm_metrics.LOAD_INDEPENDENT_UTILIZATION[name]}, so it reads ~100 % with a "
            "single stream and the autoscaler would add a replica per concurrent request; scale on "
            f"vllm:num_requests_waiting and vllm:kv_cache_usage_perc, or on {DCGM_TENSOR_ACTIVE} (fraction "
            "0–1, grows with the work the GPU does)"
        )
    if name.startswith("vllm:"):
        exported = vllm_metrics.check_metric_name(name)
        if exported is not None:
            return f"{exported} (autoscaling signals: {supported})"
    if name in SIGNALS:
        signal = SIGNALS[name]
        if signal.exporter == "vllm" and vllm_metrics.EXPORTED_METRICS.get(name) != "gauge":
            # The catalogue drifted from the pinned vLLM (a bump of VLLM_VERSION): fail loudly here.
            return f"vLLM's {name} is not a gauge in domain/vllm_metrics.py; the adapter rule sums it as one"
        return None
    close = difflib.get_close_matches(name, list(SIGNALS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else ""
    return f"{hint}not an autoscaling signal this platform serves; use one of {supported}"


def _exporter_problem(signal: ScalingSignal, config: PlatformConfig, model: ModelConfig) -> str | None:
    if not config.monitoring.enabled and signal.exporter != "router":
        return None  # said once, at autoscaling.enabled (autoscaling_pipeline_problems)
    if signal.exporter == "vllm":
        return None  # a server flag that stops vLLM's series is said once, at the flag (signal_checks)
    gap = series_gaps(config, model).get(signal.exporter)
    if gap is not None:
        return f"{signal.series} {gap}"
    if signal.exporter == "router" and model.autoscaling.backend == "hpa" and config.addons.keda.enabled:
        return (
            f"{signal.series} is an External metric: with backend 'hpa' the Prometheus Adapter would "
            "serve external.metrics.k8s.io, which KEDA (addons.keda) serves in this stack; use "
            "backend: keda for this model (the same query as a KEDA trigger) or set addons.keda: false"
        )
    return None
