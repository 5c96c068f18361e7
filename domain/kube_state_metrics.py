"""The kube-state-metrics series the alert rules and dashboards read, with their labels.

From docs/metrics/workload/{deployment,horizontalpodautoscaler,pod}-metrics.md in
kubernetes/kube-state-metrics at KUBE_STATE_METRICS_SOURCE's tag (the version kube-prometheus-stack
88.x bundles through its kube-state-metrics 8.4.0 subchart; every name below is the same in
v2.15.0, which kube-prometheus-stack 70.0.0 bundled). Only what this stack reads is listed;
tests/test_operations_metric_names.py fails when a rule or dashboard names another kube_* series.
kube-prometheus-stack scrapes kube-state-metrics with honorLabels, so `namespace` is the object's.
"""

from __future__ import annotations

from collections.abc import Mapping

KUBE_STATE_METRICS_SOURCE = {
    "repository": "https://github.com/kubernetes/kube-state-metrics",
    "tag": "v2.20.0",
    "paths": "docs/metrics/workload/*-metrics.md",
    "read_on": "2026-12-01",
}

DEPLOYMENT_AVAILABLE_REPLICAS = "kube_deployment_status_replicas_available"
DEPLOYMENT_SPEC_REPLICAS = "kube_deployment_spec_replicas"
HPA_CURRENT_REPLICAS = "kube_horizontalpodautoscaler_status_current_replicas"
HPA_DESIRED_REPLICAS = "kube_horizontalpodautoscaler_status_desired_replicas"
HPA_MAX_REPLICAS = "kube_horizontalpodautoscaler_spec_max_replicas"
HPA_MIN_REPLICAS = "kube_horizontalpodautoscaler_spec_min_replicas"
HPA_TARGET_METRIC = "kube_horizontalpodautoscaler_spec_target_metric"
HPA_CURRENT_METRIC = "kube_horizontalpodautoscaler_status_target_metric"
POD_PHASE = "kube_pod_status_phase"
INIT_CONTAINER_RESTARTS = "kube_pod_init_container_status_restarts_total"
INIT_CONTAINER_WAITING_REASON = "kube_pod_init_container_status_waiting_reason"
INIT_CONTAINER_LAST_TERMINATED_REASON = "kube_pod_init_container_status_last_terminated_reason"

# Name -> labels (besides the scrape's own job/instance/...).
SERIES_LABELS: Mapping[str, tuple[str, ...]] = {
    DEPLOYMENT_AVAILABLE_REPLICAS: ("namespace", "deployment"),
    DEPLOYMENT_SPEC_REPLICAS: ("namespace", "deployment"),
    HPA_CURRENT_REPLICAS: ("namespace", "horizontalpodautoscaler"),
    HPA_DESIRED_REPLICAS: ("namespace", "horizontalpodautoscaler"),
    HPA_MAX_REPLICAS: ("namespace", "horizontalpodautoscaler"),
    HPA_MIN_REPLICAS: ("namespace", "horizontalpodautoscaler"),
    HPA_TARGET_METRIC: ("namespace", "horizontalpodautoscaler", "metric_name", "metric_target_type"),
    HPA_CURRENT_METRIC: ("namespace", "horizontalpodautoscaler", "metric_name", "metric_target_type"),
    POD_PHASE: ("namespace", "pod", "uid", "phase"),
    INIT_CONTAINER_RESTARTS: ("namespace", "pod", "uid", "container"),
    INIT_CONTAINER_WAITING_REASON: ("namespace", "pod", "uid", "container", "reason"),
    INIT_CONTAINER_LAST_TERMINATED_REASON: ("namespace", "pod", "uid", "container", "reason"),
}
EXPORTED_SERIES: frozenset[str] = frozenset(SERIES_LABELS)
