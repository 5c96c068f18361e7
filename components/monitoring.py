"""Prometheus (kube-prometheus-stack, or an existing one), the vLLM scrape and the Prometheus Adapter.

    kube-prometheus-stack (pinned)      Prometheus + operator (CRDs), node-exporter, kube-state-metrics
    PodMonitor vllm                     every model's vLLM pods, port `http`, /metrics — one object for
                                        all models (namespaces listed), labelled `model`
    Prometheus Adapter (pinned)         custom metrics API: rules from components/adapter_rules.py

DCGM's ServiceMonitor comes with its chart (components/gpu_addons.py). docs/autoscaling.md shows
how to query each step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as kubernetes

from components.adapter_rules import adapter_rules
from components.helm.release import ChartRelease, install_chart, release_namespace
from components.labels import MODEL_LABEL, VLLM_APP_NAME
from components.rollouts import POD_TEMPLATE_HASH_LABEL, POD_TEMPLATE_HASH_SERIES_LABEL
from components.scheduling import all_gpu_tolerations
from components.scrape import ScrapeSettings, scrape_settings
from infra.config.cluster import GpuNodeGroupConfig
from infra.config.models import ModelConfig
from infra.config.platform import MonitoringConfig, PrometheusAdapterConfig
from infra.versions import KUBE_PROMETHEUS_STACK_CHART, PROMETHEUS_ADAPTER_CHART

KUBE_PROMETHEUS_STACK_RELEASE = "kube-prometheus-stack"
PROMETHEUS_ADAPTER_RELEASE = "prometheus-adapter"
PROMETHEUS_OPERATOR_API_VERSION = "monitoring.coreos.com/v1"
VLLM_POD_MONITOR = "vllm"
VLLM_METRICS_PORT_NAME = "http"
"""The vLLM container's port name (components/model_service.py); /metrics is served on it."""


def prometheus_url(monitoring: MonitoringConfig) -> str:
    """Base URL of the Prometheus HTTP API that the adapter and KEDA query."""
    if monitoring.prometheus == "existing":
        assert monitoring.existing_prometheus_url is not None  # PlatformConfig requires it
        return monitoring.existing_prometheus_url
    # The chart names its Service <fullnameOverride>-prometheus (fullnameOverride pinned below).
    return f"http://{KUBE_PROMETHEUS_STACK_RELEASE}-prometheus.{monitoring.namespace}.svc:9090"


def kube_prometheus_stack_values(monitoring: MonitoringConfig, gpu_groups: Mapping[str, GpuNodeGroupConfig],
                                 cluster_mode: str) -> dict[str, Any]:
    prometheus_spec: dict[str, Any] = {
        "scrapeInterval": f"{monitoring.scrape_interval_seconds}s",
        "retention": f"{monitoring.retention_days}d",
        # Whichever comes first: old blocks go before the volume fills and Prometheus stops.
        "retentionSize": f"{int(monitoring.prometheus_storage_gib * 0.85 * 1024)}MiB",
        # Select every PodMonitor/ServiceMonitor/rule in the cluster, not only the chart's own
        # (the vLLM PodMonitor, DCGM's ServiceMonitor).
        "podMonitorSelectorNilUsesHelmValues": False,
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "probeSelectorNilUsesHelmValues": False,
        "tolerations": [],
    }
    size = f"{monitoring.prometheus_storage_gib}Gi"
    if monitoring.prometheus_persistent_volume:
        claim_spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"],
                                      "resources": {"requests": {"storage": size}}}
        if monitoring.prometheus_storage_class:
            claim_spec["storageClassName"] = monitoring.prometheus_storage_class
        prometheus_spec["storageSpec"] = {"volumeClaimTemplate": {"spec": claim_spec}}
    else:
        # No StorageClass needed (EKS provisions EBS volumes only with the EBS CSI driver); the
        # limit keeps the data from filling the node's disk.
        prometheus_spec["storageSpec"] = {"emptyDir": {"sizeLimit": size}}
    grafana: dict[str, Any] = {"enabled": monitoring.grafana, "tolerations": []}
    if monitoring.grafana:
        grafana["admin"] = {"existingSecret": monitoring.grafana_admin_secret,
                            "userKey": "admin-user", "passwordKey": "admin-password"}
    values: dict[str, Any] = {
        "fullnameOverride": KUBE_PROMETHEUS_STACK_RELEASE,
        "crds": {"enabled": True},
        "prometheus": {"prometheusSpec": prometheus_spec},
        "alertmanager": {"enabled": monitoring.alertmanager, "alertmanagerSpec": {"tolerations": []}},
        "grafana": grafana,
        # The chart makes the admission webhook's certificate with hook Jobs, which helm.v4.Chart does
        # not run; without them the operator would wait for a Secret that never exists. Our rules are
        # checked by promtool in the suite instead of by the webhook at apply time (docs/charts.md).
        "prometheusOperator": {"tolerations": [], "admissionWebhooks": {"enabled": False},
                               "tls": {"enabled": False}},
        "kube-state-metrics": {"tolerations": []},
        # A node agent: GPU nodes' memory, disk and network are what an operator looks at first.
        "prometheus-node-exporter": {"tolerations": all_gpu_tolerations(gpu_groups.values())},
    }
    if cluster_mode == "eks":
        # EKS runs the control plane and does not expose these to in-cluster scrapes; kube-proxy
        # serves metrics on 127.0.0.1 only. Left on, they are targets that are always down.
        for component in ("kubeControllerManager", "kubeScheduler", "kubeEtcd", "kubeProxy"):
            values[component] = {"enabled": False}
    return values


def _meta_label(label: str) -> str:
    """Prometheus' service-discovery name of a pod label (`vllm-platform/model` → ..._vllm_platform_model)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def vllm_pod_monitor_spec(models: Sequence[ModelConfig], scrape: ScrapeSettings) -> dict[str, Any]:
    """One PodMonitor for every model's vLLM pods (they share labels and port name)."""
    return {
        "namespaceSelector": {"matchNames": sorted(model.namespace for model in models)},
        "selector": {"matchLabels": {"app.kubernetes.io/name": VLLM_APP_NAME}},
        "podMetricsEndpoints": [
            {
                "port": VLLM_METRICS_PORT_NAME,
                "path": "/metrics",
                "interval": f"{scrape.interval_seconds}s",
                # `namespace` and `pod` come with every target (the adapter maps them to resources);
                # `model` makes dashboards readable; a canary's analysis tells the stable pods from
                # the canary ones by the ReplicaSet hash Argo Rollouts labels them with.
                "relabelings": [
                    {"sourceLabels": [_meta_label(MODEL_LABEL)], "targetLabel": "model"},
                    {"sourceLabels": [_meta_label(POD_TEMPLATE_HASH_LABEL)],
                     "targetLabel": POD_TEMPLATE_HASH_SERIES_LABEL},
                ],
            }
        ],
    }


def adapter_prometheus_values(url: str) -> dict[str, Any]:
    """The chart builds `--prometheus-url` as `<url>:<port><path>`, so the URL is split."""
    parsed = urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return {"url": f"{parsed.scheme}://{parsed.hostname}", "port": port, "path": parsed.path.rstrip("/")}


def prometheus_adapter_values(settings: PrometheusAdapterConfig, monitoring: MonitoringConfig,
                              models: Sequence[ModelConfig]) -> dict[str, Any]:
    return {
        "replicas": settings.replicas,
        "podDisruptionBudget": {"enabled": settings.replicas > 1, "maxUnavailable": 1,
                                # An adapter pod that never gets ready must not block node drains.
                                "unhealthyPodEvictionPolicy": "AlwaysAllow"},
        "prometheus": adapter_prometheus_values(prometheus_url(monitoring)),
        "metricsRelistInterval": f"{settings.metrics_relist_interval_seconds}s",
        # Only our rules: the chart's defaults expose every container metric, and no `resource` or
        # `external` rules, so metrics-server and KEDA keep their APIServices.
        "rules": {"default": False, "custom": adapter_rules(models), "external": []},
        "tolerations": [],
    }


@dataclass(frozen=True)
class MonitoringArgs:
    monitoring: MonitoringConfig
    prometheus_adapter: PrometheusAdapterConfig
    models: Sequence[ModelConfig]
    gpu_groups: Mapping[str, GpuNodeGroupConfig]
    cluster_mode: str


class Monitoring(pulumi.ComponentResource):
    """`prometheus_release` installs the monitoring CRDs; `adapter_release` serves custom metrics."""

    prometheus_release: pulumi.Resource | None
    adapter_release: pulumi.Resource | None
    prometheus_url: str

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:monitoring:Monitoring", name, None, opts)
        monitoring = args.monitoring
        scrape = scrape_settings(monitoring)
        self.prometheus_url = prometheus_url(monitoring)
        self.prometheus_release = None
        self.adapter_release = None
        installs_prometheus = monitoring.enabled and monitoring.prometheus == "kube-prometheus-stack"
        installs_adapter = monitoring.enabled and args.prometheus_adapter.enabled
        namespace = None
        if installs_prometheus or installs_adapter:
            namespace = release_namespace(f"{name}-namespace", monitoring.namespace,
                                          pulumi.ResourceOptions(parent=self))
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[namespace] if namespace else [])
        if installs_prometheus:
            self.prometheus_release = install_chart(
                ChartRelease(KUBE_PROMETHEUS_STACK_RELEASE, KUBE_PROMETHEUS_STACK_CHART, monitoring.namespace,
                             kube_prometheus_stack_values(monitoring, args.gpu_groups, args.cluster_mode)),
                in_namespace,
            )
        if installs_adapter:
            self.adapter_release = install_chart(
                ChartRelease(PROMETHEUS_ADAPTER_RELEASE, PROMETHEUS_ADAPTER_CHART, monitoring.namespace,
                             prometheus_adapter_values(args.prometheus_adapter, monitoring, args.models)),
                pulumi.ResourceOptions(parent=self, depends_on=[
                    resource for resource in (namespace, self.prometheus_release) if resource]),
            )
        if scrape.monitor_objects:
            # After the release that creates its CRD (kube-prometheus-stack) and its namespace.
            after = [resource for resource in (namespace, self.prometheus_release) if resource]
            kubernetes.apiextensions.CustomResource(
                f"{name}-vllm-pod-monitor",
                api_version=PROMETHEUS_OPERATOR_API_VERSION,
                kind="PodMonitor",
                metadata={"name": VLLM_POD_MONITOR, "namespace": monitoring.namespace,
                          "labels": scrape.labels},
                spec=vllm_pod_monitor_spec(args.models, scrape),
                opts=pulumi.ResourceOptions(parent=self, depends_on=after),
            )
        self.register_outputs({"prometheus_url": self.prometheus_url})
