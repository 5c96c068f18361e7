"""The alert rules (one PrometheusRule `vllm-platform`), generated from the typed config (pure).

    group vllm-platform.<model>     per model, thresholds from `models[].slo`: latency (TTFT, ITL),
                                    errors, queue, KV cache, preemptions, no ready replica,
                                    autoscaler at its maximum, preloader failing
    group vllm-platform.tenants     per tenant with limits: near its rate limit, over its concurrency
                                    limit (the middleware's usage series, domain/tenant_metrics.py)
    group vllm-platform.gpus        GPU health from DCGM (XID errors, temperature, row remapping);
                                    only with addons.dcgm_exporter

Every metric name comes from a catalogue that is checked against the real exporter:
domain/vllm_metrics.py (a real vLLM 0.32.0 server), domain/dcgm_metrics.py (the pinned exporter's
default counters), domain/kube_state_metrics.py (kube-state-metrics' docs at its pinned version).
tests/test_alert_rules.py runs `promtool test rules` for every alert on series labelled
like the real exporters' (tests/data/vllm-metrics/), and docs/operations.md has a runbook line per
alert (ALERT_RUNBOOKS below is that list; a test keeps the two in step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.vllm_pod import PRELOAD_CONTAINER, SERVER_NAME
from domain import dcgm_metrics, kube_state_metrics, tenant_metrics, vllm_metrics
from domain.config.models import ModelConfig
from domain.config.platform import AlertsConfig
from domain.config.tenants import TenantConfig

PROMETHEUS_RULE_NAME = "vllm-platform"
RATE_WINDOW = "5m"
HTTP_REQUESTS = "http_requests_total"
"""vLLM's API server counts requests per handler and status class (prometheus-fastapi-instrumentator,
`status="2xx"`, `"4xx"`, `"5xx"`); captured in tests/data/vllm-metrics/exposition.txt."""
API_HANDLERS = "/v1/.*"
PRELOADER_FAILURE_REASONS = "CrashLoopBackOff|Error|ErrImagePull|ImagePullBackOff|CreateContainerConfigError"

RUNBOOK_DOC = "docs/operations.md"
ALERT_RUNBOOKS = (
    "VllmTimeToFirstTokenHigh",
    "VllmInterTokenLatencyHigh",
    "VllmRequestErrorsHigh",
    "VllmRequestsQueued",
    "VllmKvCacheNearlyFull",
    "VllmPreempting",
    "ModelNoReadyReplica",
    "AutoscalerAtMaximum",
    "ModelPreloaderFailing",
    "GpuXidError",
    "GpuTemperatureHigh",
    "GpuRowRemapFailure",
    "GpuUncorrectableRowsRemapped",
    "TenantNearRateLimit",
    "TenantOverConcurrencyLimit",
)
RATE_LIMIT_ALERT_SHARE = 0.9
"""A tenant sending this share of its per-key rate limit for 10 minutes is being (or about to be)
answered 429 by the WAF: the team needs a higher limit or a slower client."""


def _alert(
    name: str,
    expr: str,
    *,
    minutes: int,
    severity: str,
    summary: str,
    description: str,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "alert": name,
        "expr": expr,
        "labels": {"severity": severity, **(labels or {})},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{RUNBOOK_DOC}#{name.lower()}",
        },
    }
    if minutes:
        rule["for"] = f"{minutes}m"
    return rule


def _p95(histogram: str, namespace: str) -> str:
    return (
        f"histogram_quantile(0.95, sum by (namespace, model, le) "
        f'(rate({histogram}_bucket{{namespace="{namespace}"}}[{RATE_WINDOW}])))'
    )


def _no_ready_replica(model: ModelConfig) -> str:
    """No available replica; for a model that scales to zero, only while one is wanted (its autoscaler
    asks for a replica), since at zero none is by design."""
    deployment = f'{{namespace="{model.namespace}",deployment="{SERVER_NAME}"}}'
    none_ready = f"max by (namespace) ({kube_state_metrics.DEPLOYMENT_AVAILABLE_REPLICAS}{deployment}) < 1"
    if not model.scales_to_zero:
        return none_ready
    wanted = f"max by (namespace) ({kube_state_metrics.DEPLOYMENT_SPEC_REPLICAS}{deployment}) >= 1"
    return f"({none_ready}) and ({wanted})"


def model_alert_rules(model: ModelConfig, alerts: AlertsConfig) -> list[dict[str, Any]]:
    """The alerts of one model, on its namespace's series; thresholds from `model.slo`."""
    slo, ns = model.slo, model.namespace
    model_labels = {"model": model.name, "namespace": ns}
    waiting = f'sum by (namespace) ({vllm_metrics.NUM_REQUESTS_WAITING}{{namespace="{ns}"}})'
    queue_window = f"{slo.queue_minutes}m"
    rules = [
        _alert(
            "VllmTimeToFirstTokenHigh",
            f"{_p95(vllm_metrics.TIME_TO_FIRST_TOKEN_SECONDS, ns)} > {slo.time_to_first_token_p95_seconds}",
            minutes=slo.latency_for_minutes,
            severity="warning",
            summary=f"{model.name}: p95 time to first token above {slo.time_to_first_token_p95_seconds} s",
            description="p95 TTFT is {{ $value | humanizeDuration }} (objective "
            f"{slo.time_to_first_token_p95_seconds} s, models[].slo).",
        ),
        _alert(
            "VllmInterTokenLatencyHigh",
            f"{_p95(vllm_metrics.INTER_TOKEN_LATENCY_SECONDS, ns)} > {slo.inter_token_latency_p95_seconds}",
            minutes=slo.latency_for_minutes,
            severity="warning",
            summary=f"{model.name}: p95 time per output token above {slo.inter_token_latency_p95_seconds} s",
            description="p95 inter-token latency is {{ $value | humanizeDuration }} (objective "
            f"{slo.inter_token_latency_p95_seconds} s).",
        ),
        _alert(
            "VllmRequestErrorsHigh",
            f'sum by (namespace) (rate({HTTP_REQUESTS}{{namespace="{ns}",handler=~"{API_HANDLERS}",'
            f'status="5xx"}}[{RATE_WINDOW}])) / sum by (namespace) (rate({HTTP_REQUESTS}'
            f'{{namespace="{ns}",handler=~"{API_HANDLERS}"}}[{RATE_WINDOW}])) > {slo.error_ratio}',
            minutes=5,
            severity="critical",
            summary=f"{model.name}: more than {slo.error_ratio:.0%} of API requests fail (5xx)",
            description="{{ $value | humanizePercentage }} of /v1 requests answered 5xx over 5 minutes.",
        ),
        _alert(
            "VllmRequestsQueued",
            # Never empty for the whole window and not shrinking: demand exceeds the replicas.
            f"min_over_time(({waiting})[{queue_window}:30s]) > 0 "
            f"and deriv(({waiting})[{queue_window}:30s]) >= 0",
            minutes=0,
            severity="warning",
            summary=f"{model.name}: requests have waited for a batch slot for {slo.queue_minutes} minutes",
            description="{{ $value }} requests waiting and the queue is not shrinking; check the "
            "autoscaler (AutoscalerAtMaximum) and Pending replicas.",
        ),
        _alert(
            "VllmKvCacheNearlyFull",
            f'max by (namespace, pod) ({vllm_metrics.KV_CACHE_USAGE}{{namespace="{ns}"}}) '
            f"> {slo.kv_cache_usage_ratio}",
            minutes=5,
            severity="warning",
            summary=f"{model.name}: a replica's KV cache is above {slo.kv_cache_usage_ratio:.0%}",
            description="{{ $labels.pod }} KV cache at {{ $value | humanizePercentage }}; new "
            "requests will preempt running ones.",
        ),
        _alert(
            "VllmPreempting",
            f'sum by (namespace) (rate({vllm_metrics.NUM_PREEMPTIONS}{{namespace="{ns}"}}'
            f"[{RATE_WINDOW}])) > 0",
            minutes=10,
            severity="warning",
            summary=f"{model.name}: vLLM is preempting requests (KV cache exhausted)",
            description="{{ $value | humanize }} preemptions/s for 10 minutes: preempted requests are "
            "recomputed, so latency climbs.",
        ),
        _alert(
            "ModelNoReadyReplica",
            _no_ready_replica(model),
            minutes=alerts.no_ready_replica_minutes,
            severity="critical",
            summary=f"{model.name}: no replica is ready; the model serves nothing",
            description=f"Deployment {ns}/{SERVER_NAME} has no available replica.",
        ),
        _alert(
            "ModelPreloaderFailing",
            f'(max by (namespace, pod) ({kube_state_metrics.INIT_CONTAINER_WAITING_REASON}{{namespace="{ns}",'
            f'container="{PRELOAD_CONTAINER}",reason=~"{PRELOADER_FAILURE_REASONS}"}}) == 1) or (max by '
            f'(namespace, pod) (increase({kube_state_metrics.INIT_CONTAINER_RESTARTS}{{namespace="{ns}",'
            f'container="{PRELOAD_CONTAINER}"}}[15m])) > 0)',
            minutes=0,
            severity="warning",
            summary=f"{model.name}: the model preloader is failing in {{{{ $labels.pod }}}}",
            description=f"Init container {PRELOAD_CONTAINER} restarted or is waiting on an error; "
            f"`kubectl -n {ns} logs {{{{ $labels.pod }}}} -c {PRELOAD_CONTAINER}`.",
        ),
    ]
    if model.autoscaling.enabled:
        hpa = f'{{namespace="{ns}",horizontalpodautoscaler="{SERVER_NAME}"}}'
        rules.append(
            _alert(
                "AutoscalerAtMaximum",
                f"max by (namespace) ({kube_state_metrics.HPA_CURRENT_REPLICAS}{hpa}) >= "
                f"max by (namespace) ({kube_state_metrics.HPA_MAX_REPLICAS}{hpa})",
                minutes=alerts.autoscaler_at_max_minutes,
                severity="warning",
                summary=f"{model.name}: the autoscaler has been at max_replicas "
                f"({model.autoscaling.max_replicas}) for {alerts.autoscaler_at_max_minutes} minutes",
                description="Load may exceed what max_replicas can serve; raise models[].autoscaling."
                "max_replicas (and the GPU group's max_size) if the latency alerts fire too.",
            )
        )
    for rule in rules:
        rule["labels"].update(model_labels)
    return rules


def gpu_alert_rules(alerts: AlertsConfig) -> list[dict[str, Any]]:
    """GPU health from the DCGM exporter's default counters, per GPU."""
    per_gpu = "Hostname, gpu, UUID, modelName"
    return [
        _alert(
            "GpuXidError",
            f"max by ({per_gpu}) ({dcgm_metrics.XID_ERRORS}) > 0",
            minutes=0,
            severity="critical",
            summary="GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported XID {{ $value }}",
            description="The driver reported an XID error (the value is the last XID code); 48, 63, "
            "64, 79 and 94/95 mean the GPU needs a reset or the node a replacement.",
        ),
        _alert(
            "GpuTemperatureHigh",
            f"max by ({per_gpu}) ({dcgm_metrics.GPU_TEMPERATURE}) > {alerts.gpu_temperature_celsius}",
            minutes=5,
            severity="warning",
            summary="GPU {{ $labels.gpu }} on {{ $labels.Hostname }} at {{ $value }} °C",
            description=f"Above {alerts.gpu_temperature_celsius} °C for 5 minutes "
            "(monitoring.alerts.gpu_temperature_celsius): the GPU will throttle its clocks.",
        ),
        _alert(
            "GpuRowRemapFailure",
            f"max by ({per_gpu}) ({dcgm_metrics.ROW_REMAP_FAILURE}) > 0",
            minutes=0,
            severity="critical",
            summary="GPU {{ $labels.gpu }} on {{ $labels.Hostname }} failed to remap a memory row",
            description="The GPU has memory errors it cannot repair: drain the node and replace it.",
        ),
        _alert(
            "GpuUncorrectableRowsRemapped",
            f"max by ({per_gpu}) (increase({dcgm_metrics.UNCORRECTABLE_REMAPPED_ROWS}[1h])) > 0",
            minutes=0,
            severity="warning",
            summary="GPU {{ $labels.gpu }} on {{ $labels.Hostname }} remapped rows for uncorrectable errors",
            description="Uncorrectable ECC errors were repaired by row remapping; the repair applies "
            "after a GPU reset: drain the node and reboot it.",
        ),
    ]


def tenant_alert_rules(tenants: Sequence[TenantConfig]) -> list[dict[str, Any]]:
    """Per tenant with a limit: its usage against it (the tenant's name is the label, never a key)."""
    rules = []
    for tenant in tenants:
        selector = f'{{tenant="{tenant.name}"}}'
        if tenant.requests_per_minute is not None:
            threshold = tenant.requests_per_minute * RATE_LIMIT_ALERT_SHARE
            rules.append(
                _alert(
                    "TenantNearRateLimit",
                    f"sum by (tenant) (rate({tenant_metrics.TENANT_REQUESTS}{selector}[{RATE_WINDOW}])) * 60 "
                    f"> {threshold:g}",
                    minutes=10,
                    severity="warning",
                    summary=f"tenant {tenant.name}: above {RATE_LIMIT_ALERT_SHARE:.0%} of its "
                    f"{tenant.requests_per_minute} requests per minute",
                    description="{{ $value | humanize }} requests per minute reach vLLM; the WAF answers 429 "
                    "beyond the limit per key (CloudWatch metric tenant-"
                    + tenant.name
                    + "-rate, BlockedRequests).",
                    labels={"tenant": tenant.name},
                )
            )
        if tenant.max_concurrent_requests is not None:
            rules.append(
                _alert(
                    "TenantOverConcurrencyLimit",
                    f"sum by (tenant) ({tenant_metrics.TENANT_REQUESTS_IN_FLIGHT}{selector}) "
                    f"> {tenant.max_concurrent_requests}",
                    minutes=5,
                    severity="warning",
                    summary=f"tenant {tenant.name}: more than {tenant.max_concurrent_requests} requests "
                    "in flight",
                    description="{{ $value }} requests of this tenant are being answered at once over all "
                    "pods (tenants[].max_concurrent_requests).",
                    labels={"tenant": tenant.name},
                )
            )
    return rules


def alert_rule_groups(
    models: Sequence[ModelConfig],
    alerts: AlertsConfig,
    *,
    dcgm_exporter: bool,
    tenants: Sequence[TenantConfig] = (),
) -> list[dict[str, Any]]:
    """`spec.groups` of the PrometheusRule; empty when monitoring.alerts.enabled is false. GPU alerts
    only with the DCGM exporter (addons.dcgm_exporter)."""
    if not alerts.enabled:
        return []
    groups = [
        {"name": f"vllm-platform.{model.name}", "rules": model_alert_rules(model, alerts)} for model in models
    ]
    if tenant_rules := tenant_alert_rules(tenants):
        groups.append({"name": "vllm-platform.tenants", "rules": tenant_rules})
    if dcgm_exporter:
        groups.append({"name": "vllm-platform.gpus", "rules": gpu_alert_rules(alerts)})
    return groups
