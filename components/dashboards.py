"""Grafana dashboards as sidecar ConfigMaps (pure builders; the Operations component creates them).

    vllm-serving        per model: load (running/waiting), KV cache, TTFT/ITL/E2E/queue-time
                        percentiles, token throughput, finish reasons, preemptions, LoRA
                        adapters running and waiting, HTTP status
    dcgm-gpus           per GPU: temperature, power, clocks, tensor-pipe activity, utilisation,
                        memory, XID errors, remapped rows
    tenants             per tenant: requests by status and model, tokens, requests in flight
    autoscaling         per model: replicas (current/desired/max), each signal the autoscaler
                        reads per pod against its target, Pending replicas

Written here rather than vendored: the upstream dashboards (vLLM's examples/observability
dashboards, NVIDIA's grafana/dcgm-exporter-dashboard.json) cannot be committed from this
workspace's copies; docs/operations.md names them with tag and sha256, and
`scripts/check-dashboard-metrics.py` checks any Grafana JSON (theirs included) against the pinned
exporters. Every expression here uses catalogue constants, and tests/test_dashboards.py parses each
one (promtool and a PromQL parser) and checks every metric against the catalogues.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from components.adapter_rules import SIGNALS, router_series_matchers
from components.vllm_pod import SERVER_NAME
from domain import dcgm_metrics, kube_state_metrics, tenant_metrics, vllm_metrics

DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
"""kube-prometheus-stack's provisioned Prometheus datasource (`grafana.sidecar.datasources.uid`)."""
RATE = "$__rate_interval"
MODEL_NAMESPACES = 'namespace=~"$namespace"'
GPU_SELECTOR = 'Hostname=~"$Hostname"'


@dataclass(frozen=True)
class Panel:
    title: str
    exprs: tuple[tuple[str, str], ...]
    """(PromQL, legend) per series."""
    unit: str = "short"
    description: str = ""


def _panel(panel: Panel, index: int) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {
                "refId": chr(ord("A") + position),
                "datasource": DATASOURCE,
                "expr": expr,
                "legendFormat": legend,
            }
            for position, (expr, legend) in enumerate(panel.exprs)
        ],
    }


def _variable(name: str, metric: str, label: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": f"label_values({metric}, {label})", "refId": f"{name}-values"},
        "definition": f"label_values({metric}, {label})",
        "includeAll": True,
        "multi": True,
        "allValue": ".+",
        "refresh": 2,
        "current": {"selected": True, "text": "All", "value": "$__all"},
    }


def _dashboard(uid: str, title: str, panels: list[Panel], variables: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "tags": ["vllm-platform"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": variables},
        "panels": [_panel(panel, index) for index, panel in enumerate(panels)],
    }


def _p(quantile: float, histogram: str) -> str:
    return (
        f"histogram_quantile({quantile}, sum by (model, le) "
        f"(rate({histogram}_bucket{{{MODEL_NAMESPACES}}}[{RATE}])))"
    )


def _latency_panel(title: str, histogram: str) -> Panel:
    return Panel(
        title,
        (
            (_p(0.5, histogram), "p50 {{model}}"),
            (_p(0.95, histogram), "p95 {{model}}"),
            (_p(0.99, histogram), "p99 {{model}}"),
        ),
        unit="s",
    )


def vllm_serving_dashboard() -> dict[str, Any]:
    m = vllm_metrics
    panels = [
        Panel(
            "Requests running and waiting, per pod",
            (
                (f"sum by (pod) ({m.NUM_REQUESTS_RUNNING}{{{MODEL_NAMESPACES}}})", "running {{pod}}"),
                (f"sum by (pod) ({m.NUM_REQUESTS_WAITING}{{{MODEL_NAMESPACES}}})", "waiting {{pod}}"),
            ),
            description="What the autoscaler's queue signal reads (vllm:num_requests_waiting).",
        ),
        Panel(
            "KV-cache usage, per pod",
            ((f"avg by (pod) ({m.KV_CACHE_USAGE}{{{MODEL_NAMESPACES}}})", "{{pod}}"),),
            unit="percentunit",
        ),
        _latency_panel("Time to first token", m.TIME_TO_FIRST_TOKEN_SECONDS),
        _latency_panel("Inter-token latency (time per output token)", m.INTER_TOKEN_LATENCY_SECONDS),
        _latency_panel("End-to-end request latency", m.E2E_REQUEST_LATENCY_SECONDS),
        _latency_panel("Time in queue", m.REQUEST_QUEUE_TIME_SECONDS),
        Panel(
            "Token throughput",
            (
                (
                    f"sum by (model) (rate({m.PROMPT_TOKENS}{{{MODEL_NAMESPACES}}}[{RATE}]))",
                    "prompt {{model}}",
                ),
                (
                    f"sum by (model) (rate({m.GENERATION_TOKENS}{{{MODEL_NAMESPACES}}}[{RATE}]))",
                    "generated {{model}}",
                ),
            ),
            unit="short",
        ),
        Panel(
            "Finished requests by reason",
            (
                (
                    f"sum by (model, finished_reason) "
                    f"(rate({m.REQUEST_SUCCESS}{{{MODEL_NAMESPACES}}}[{RATE}]))",
                    "{{model}} {{finished_reason}}",
                ),
            ),
            unit="reqps",
        ),
        Panel(
            "Preemptions",
            ((f"sum by (model) (rate({m.NUM_PREEMPTIONS}{{{MODEL_NAMESPACES}}}[{RATE}]))", "{{model}}"),),
            unit="short",
            description="Non-zero: the KV cache is full and requests are recomputed.",
        ),
        Panel(
            "LoRA adapters in the batch and in the queue",
            (
                (
                    f"count by (running_lora_adapters) "
                    f"(topk by (pod) (1, {m.LORA_REQUESTS_INFO}{{{MODEL_NAMESPACES}}}))",
                    "running: {{running_lora_adapters}}",
                ),
                (
                    f"count by (waiting_lora_adapters) "
                    f"(topk by (pod) (1, {m.LORA_REQUESTS_INFO}{{{MODEL_NAMESPACES}}}))",
                    "waiting: {{waiting_lora_adapters}}",
                ),
            ),
            description=(
                "Pods per set of adapters (comma-separated) running in their batch and waiting for a "
                "GPU slot, from each pod's newest vllm:lora_requests_info series (its value is the time "
                "of the update). Only models with lora export it; adapter requests also count in every "
                "other panel under the base model's name (docs/lora.md)."
            ),
        ),
        Panel(
            "API responses by status",
            (
                (
                    f"sum by (namespace, status) "
                    f'(rate(http_requests_total{{{MODEL_NAMESPACES},handler=~"/v1/.*"}}[{RATE}]))',
                    "{{namespace}} {{status}}",
                ),
            ),
            unit="reqps",
        ),
    ]
    return _dashboard(
        "vllm-platform-serving",
        "vLLM serving",
        panels,
        [_variable("namespace", m.NUM_REQUESTS_WAITING, "namespace")],
    )


def dcgm_gpus_dashboard() -> dict[str, Any]:
    d = dcgm_metrics
    gpu = "{{Hostname}} gpu {{gpu}}"

    def per_gpu(metric: str) -> tuple[tuple[str, str], ...]:
        return ((f"{metric}{{{GPU_SELECTOR}}}", gpu),)

    panels = [
        Panel("GPU temperature", per_gpu(d.GPU_TEMPERATURE), unit="celsius"),
        Panel("Power draw", per_gpu("DCGM_FI_DEV_POWER_USAGE"), unit="watt"),
        Panel("SM clock", ((f"DCGM_FI_DEV_SM_CLOCK{{{GPU_SELECTOR}}} * 1000000", gpu),), unit="hertz"),
        Panel(
            "Tensor pipe active, per pod",
            (
                (
                    f'avg by (namespace, pod) ({d.TENSOR_PIPE_ACTIVE}{{{GPU_SELECTOR},pod!=""}})',
                    "{{namespace}}/{{pod}}",
                ),
            ),
            unit="percentunit",
            description="Grows with the batch the GPU computes; the GPU signal autoscaling may use.",
        ),
        Panel(
            "GPU utilisation (time any kernel runs)",
            per_gpu(d.GPU_UTILIZATION),
            unit="percent",
            description="Reads ~100 % with a single vLLM stream: not a load signal (issue 19).",
        ),
        Panel("Frame buffer used", per_gpu("DCGM_FI_DEV_FB_USED"), unit="decmbytes"),
        Panel(
            "Last XID error",
            per_gpu(d.XID_ERRORS),
            description="The last XID code the driver reported; 0 = none.",
        ),
        Panel(
            "Remapped rows",
            (
                (f"{d.UNCORRECTABLE_REMAPPED_ROWS}{{{GPU_SELECTOR}}}", "uncorrectable " + gpu),
                (f"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{GPU_SELECTOR}}}", "correctable " + gpu),
                (f"{d.ROW_REMAP_FAILURE}{{{GPU_SELECTOR}}}", "remap failed " + gpu),
            ),
        ),
    ]
    return _dashboard(
        "vllm-platform-gpus", "GPUs (DCGM)", panels, [_variable("Hostname", d.GPU_TEMPERATURE, "Hostname")]
    )


def autoscaling_dashboard() -> dict[str, Any]:
    k = kube_state_metrics
    hpa = f'{MODEL_NAMESPACES},horizontalpodautoscaler="{SERVER_NAME}"'
    panels = [
        Panel(
            "Replicas: current, desired, max",
            (
                (f"max by (namespace) ({k.HPA_CURRENT_REPLICAS}{{{hpa}}})", "current {{namespace}}"),
                (f"max by (namespace) ({k.HPA_DESIRED_REPLICAS}{{{hpa}}})", "desired {{namespace}}"),
                (f"max by (namespace) ({k.HPA_MAX_REPLICAS}{{{hpa}}})", "max {{namespace}}"),
                (f"max by (namespace) ({k.HPA_MIN_REPLICAS}{{{hpa}}})", "min {{namespace}}"),
            ),
        ),
        Panel(
            "Ready replicas",
            (
                (
                    f"max by (namespace) "
                    f'({k.DEPLOYMENT_AVAILABLE_REPLICAS}{{{MODEL_NAMESPACES},deployment="{SERVER_NAME}"}})',
                    "available {{namespace}}",
                ),
                (
                    f'sum by (namespace) ({k.POD_PHASE}{{{MODEL_NAMESPACES},phase="Pending"}})',
                    "Pending {{namespace}}",
                ),
            ),
            description="Pending replicas wait for a GPU node (Cluster Autoscaler).",
        ),
        Panel(
            "What the HPA reads: average per pod, and its target",
            (
                (
                    f"max by (namespace, metric_name) "
                    f'({k.HPA_CURRENT_METRIC}{{{hpa},metric_target_type="average"}})',
                    "current {{namespace}} {{metric_name}}",
                ),
                (
                    f"max by (namespace, metric_name) "
                    f'({k.HPA_TARGET_METRIC}{{{hpa},metric_target_type="average"}})',
                    "target {{namespace}} {{metric_name}}",
                ),
            ),
            description="kube-state-metrics' copy of the HPA status (KEDA's HPA is named vllm too).",
        ),
    ]
    for signal in SIGNALS.values():
        if signal.external:
            # The router's series are per model (label `model`), in the router's namespace.
            panels.append(
                Panel(
                    f"{signal.series} per model ({signal.per_pod} over the router pods)",
                    (
                        (
                            f"{signal.per_pod} by (model) ({signal.series}{{{router_series_matchers()}}})",
                            "{{model}}",
                        ),
                    ),
                    description=f"Unit: {signal.unit} (the HPA divides this total by the replicas). The "
                    "adapter's external rule (components/adapter_rules.py).",
                )
            )
            continue
        selector = f'{MODEL_NAMESPACES},pod!=""'
        panels.append(
            Panel(
                f"{signal.series} per pod ({signal.per_pod} of the pod's series)",
                (
                    (
                        f"{signal.per_pod} by (namespace, pod) ({signal.series}{{{selector}}})",
                        "{{namespace}}/{{pod}}",
                    ),
                ),
                description=f"Unit: {signal.unit}. The adapter rule's per-pod value "
                "(components/adapter_rules.py).",
            )
        )
    return _dashboard(
        "vllm-platform-autoscaling",
        "vLLM autoscaling",
        panels,
        [_variable("namespace", k.HPA_CURRENT_REPLICAS, "namespace")],
    )


TENANTS = 'tenant=~"$tenant"'


def tenants_dashboard() -> dict[str, Any]:
    """Per tenant (issue 26): what each team sends and gets, from the middleware's series. Empty in
    a stack without tenants."""
    t = tenant_metrics
    panels = [
        Panel(
            "Requests per tenant, by status",
            (
                (
                    f"sum by (tenant, code) (rate({t.TENANT_REQUESTS}{{{TENANTS}}}[{RATE}]))",
                    "{{tenant}} {{code}}",
                ),
            ),
            unit="reqps",
            description="Requests that reached vLLM; 429s from the WAF's rate rules never do "
            "(CloudWatch: tenant-<name>-rate BlockedRequests).",
        ),
        Panel(
            "Tokens per tenant",
            (
                (
                    f'sum by (tenant) (rate({t.TENANT_TOKENS}{{{TENANTS},kind="prompt"}}[{RATE}]))',
                    "prompt {{tenant}}",
                ),
                (
                    f'sum by (tenant) (rate({t.TENANT_TOKENS}{{{TENANTS},kind="completion"}}[{RATE}]))',
                    "completion {{tenant}}",
                ),
            ),
            unit="short",
        ),
        Panel(
            "Requests in flight per tenant",
            ((f"sum by (tenant) ({t.TENANT_REQUESTS_IN_FLIGHT}{{{TENANTS}}})", "{{tenant}}"),),
            description="Against tenants[].max_concurrent_requests (alert TenantOverConcurrencyLimit).",
        ),
        Panel(
            "Requests per tenant and model",
            (
                (
                    f"sum by (tenant, model) (rate({t.TENANT_REQUESTS}{{{TENANTS}}}[{RATE}]))",
                    "{{tenant}} {{model}}",
                ),
            ),
            unit="reqps",
        ),
    ]
    return _dashboard(
        "vllm-platform-tenants", "vLLM tenants", panels, [_variable("tenant", t.TENANT_REQUESTS, "tenant")]
    )


DASHBOARDS = {
    "vllm-serving": vllm_serving_dashboard,
    "dcgm-gpus": dcgm_gpus_dashboard,
    "autoscaling": autoscaling_dashboard,
    "tenants": tenants_dashboard,
}


def dashboard_config_maps() -> dict[str, dict[str, str]]:
    """ConfigMap name -> data (`<slug>.json`), for the Grafana sidecar."""
    return {
        f"vllm-platform-dashboard-{slug}": {f"{slug}.json": json.dumps(build(), indent=1, sort_keys=True)}
        for slug, build in DASHBOARDS.items()
    }


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every query of a Grafana dashboard JSON, ours or upstream's: panel
    targets (rows' nested panels included) and `label_values(metric, label)` variables."""

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    for panel in panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]
    for variable in dashboard.get("templating", {}).get("list", []):
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        expression = (
            _variable_expression(text) if variable.get("type") == "query" and isinstance(text, str) else None
        )
        if expression:
            yield f"variable {variable.get('name')!r}", expression


def _variable_expression(query: str) -> str | None:
    """`label_values(m{...}, label)` -> `m{...}`; `query_result(expr)` -> expr; None for queries
    that name no series (`label_values(label)`, `label_names()`)."""
    query = query.strip()
    if query.startswith("label_values(") and query.endswith(")"):
        inner = query[len("label_values(") : -1]
        return inner.rsplit(",", 1)[0].strip() if "," in inner else None
    if query.startswith("query_result(") and query.endswith(")"):
        return query[len("query_result(") : -1].strip()
    if query.startswith(("label_names(", "metrics(")):
        return None
    return query
