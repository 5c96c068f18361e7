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

from components.adapter_rules import adapter_external_rules, adapter_rules
from components.canary_analysis import POD_TEMPLATE_HASH_SERIES_LABEL
from components.helm.release import ChartRelease, install_chart, release_namespace
from components.rollouts import POD_TEMPLATE_HASH_LABEL
from components.scheduling import all_gpu_tolerations
from components.scrape import ScrapeSettings, scrape_settings
from components.secrets import csi_volume, uses_csi
from domain.cluster_context import ClusterContext
from domain.config.cluster import GpuNodeGroupConfig
from domain.config.models import ModelConfig
from domain.config.platform import MonitoringConfig, PrometheusAdapterConfig, SecretStoreConfig
from domain.labels import MODEL_LABEL, VLLM_APP_NAME
from domain.service_accounts import ALERTMANAGER_SERVICE_ACCOUNT_NAME, GRAFANA_SERVICE_ACCOUNT_NAME
from domain.versions import KUBE_PROMETHEUS_STACK_CHART, PROMETHEUS_ADAPTER_CHART

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


ALERTMANAGER_CONFIG_SECRET = "alertmanager-config"
"""The Secret the Alertmanager reads (`configSecret`), synced by the CSI driver from the secret store."""
ALERTMANAGER_CONFIG_KEY = "alertmanager.yaml"
"""The key the Prometheus Operator reads the Alertmanager configuration from."""
ALERTMANAGER_PROVIDER_CLASS = "alertmanager-config"
GRAFANA_ADMIN_SECRET = "grafana-admin"
GRAFANA_PROVIDER_CLASS = "grafana-admin"
GRAFANA_ADMIN_KEYS = {"admin-user": "admin-user", "admin-password": "admin-password"}
"""Grafana's admin credential: file (and synced Secret key) -> key in the secret-store entry."""
MONITORING_SECRETS_MOUNT = "/mnt/secrets-store"
GRAFANA_DASHBOARD_LABEL = ("grafana_dashboard", "1")
"""The label the chart's Grafana sidecar watches (`grafana.sidecar.dashboards.label/labelValue`)."""
DEFAULT_SECRET_STORE = SecretStoreConfig()


def kube_prometheus_stack_values(
    monitoring: MonitoringConfig,
    gpu_groups: Mapping[str, GpuNodeGroupConfig],
    cluster_mode: str,
    *,
    secret_store: SecretStoreConfig = DEFAULT_SECRET_STORE,
    default_storage_class: str | None = None,
    context: ClusterContext | None = None,
) -> dict[str, Any]:
    """The chart's values; Prometheus' storage, Alertmanager and Grafana come from their own
    functions below (issue 19), merged here."""
    prometheus_spec: dict[str, Any] = {
        "scrapeInterval": f"{monitoring.scrape_interval_seconds}s",
        # Select every PodMonitor/ServiceMonitor/rule in the cluster, not only the chart's own
        # (the vLLM PodMonitor, DCGM's ServiceMonitor, the PrometheusRule vllm-platform).
        "podMonitorSelectorNilUsesHelmValues": False,
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "probeSelectorNilUsesHelmValues": False,
        "tolerations": [],
        **prometheus_storage_values(monitoring, default_storage_class),
    }
    values: dict[str, Any] = {
        "fullnameOverride": KUBE_PROMETHEUS_STACK_RELEASE,
        "crds": {"enabled": True},
        "prometheus": {"prometheusSpec": prometheus_spec},
        "alertmanager": alertmanager_values(monitoring, secret_store, context),
        "grafana": grafana_values(monitoring, secret_store, context),
        # The chart makes the admission webhook's certificate with hook Jobs, which helm.v4.Chart does
        # not run; without them the operator would wait for a Secret that never exists. Our rules are
        # checked by promtool in the suite instead of by the webhook at apply time (docs/charts.md).
        "prometheusOperator": {
            "tolerations": [],
            "admissionWebhooks": {"enabled": False},
            "tls": {"enabled": False},
        },
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


def prometheus_storage_values(
    monitoring: MonitoringConfig, default_storage_class: str | None
) -> dict[str, Any]:
    """Replicas, retention and volumes: what makes the autoscalers' series survive a restart.

    `default_storage_class`: the class for persistent volumes when monitoring.prometheus_storage_class
    is null (`gp3` with addons.ebs_csi_driver; else None, the cluster's default)."""
    values: dict[str, Any] = {
        "replicas": monitoring.prometheus_replicas,
        "retention": f"{monitoring.retention_days}d",
        # Whichever comes first: old blocks go before the volume fills and Prometheus stops.
        "retentionSize": f"{int(monitoring.prometheus_storage_gib * 0.85 * 1024)}MiB",
    }
    if monitoring.prometheus_replicas > 1:
        # Two replicas on one node die together: keep them on different nodes.
        values["podAntiAffinity"] = "hard"
    size = f"{monitoring.prometheus_storage_gib}Gi"
    if monitoring.prometheus_persistent_volume:
        claim_spec: dict[str, Any] = {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
        }
        storage_class = monitoring.prometheus_storage_class or default_storage_class
        if storage_class:
            claim_spec["storageClassName"] = storage_class
        values["storageSpec"] = {"volumeClaimTemplate": {"spec": claim_spec}}
    else:
        # No StorageClass needed; the limit keeps the data from filling the node's disk.
        values["storageSpec"] = {"emptyDir": {"sizeLimit": size}}
    return values


def _irsa_annotations(context: ClusterContext | None, namespace: str, name: str) -> dict[str, Any]:
    role_arn = context.role_arn_for(namespace, name) if context is not None else None
    return {"eks.amazonaws.com/role-arn": role_arn} if role_arn else {}


def alertmanager_values(
    monitoring: MonitoringConfig,
    secret_store: SecretStoreConfig = DEFAULT_SECRET_STORE,
    context: ClusterContext | None = None,
) -> dict[str, Any]:
    """`alertmanager`: its configuration (receivers) is a Secret from the secret store, never values.

    With a CSI provider the Alertmanager pod mounts the SecretProviderClass, which makes the driver
    sync the Secret `alertmanager-config` that `configSecret` names (the driver syncs only while a
    pod mounts it). The operator runs Alertmanager with an empty configuration until it exists.
    """
    values: dict[str, Any] = {"enabled": monitoring.alertmanager, "alertmanagerSpec": {"tolerations": []}}
    if not monitoring.alertmanager:
        return values
    assert monitoring.alertmanager_config_secret is not None  # MonitoringConfig requires it
    spec = values["alertmanagerSpec"]
    values["serviceAccount"] = {
        "create": True,
        "name": ALERTMANAGER_SERVICE_ACCOUNT_NAME,
        "annotations": _irsa_annotations(context, monitoring.namespace, ALERTMANAGER_SERVICE_ACCOUNT_NAME),
    }
    # The chart would otherwise render its own Secret with a default configuration (literal data).
    spec["useExistingSecret"] = True
    if uses_csi(secret_store):
        spec["configSecret"] = ALERTMANAGER_CONFIG_SECRET
        spec["volumes"] = [csi_volume("alertmanager-config-store", ALERTMANAGER_PROVIDER_CLASS)]
        spec["volumeMounts"] = [
            {"name": "alertmanager-config-store", "readOnly": True, "mountPath": MONITORING_SECRETS_MOUNT}
        ]
    else:
        spec["configSecret"] = monitoring.alertmanager_config_secret.name
    return values


def grafana_values(
    monitoring: MonitoringConfig,
    secret_store: SecretStoreConfig = DEFAULT_SECRET_STORE,
    context: ClusterContext | None = None,
) -> dict[str, Any]:
    """`grafana`: admin credential from the secret store, dashboards from labelled ConfigMaps."""
    values: dict[str, Any] = {"enabled": monitoring.grafana, "tolerations": []}
    if not monitoring.grafana:
        return values
    assert monitoring.grafana_admin_secret is not None  # MonitoringConfig requires it
    label, label_value = GRAFANA_DASHBOARD_LABEL
    csi = uses_csi(secret_store)
    values.update(
        {
            "serviceAccount": {
                "create": True,
                "name": GRAFANA_SERVICE_ACCOUNT_NAME,
                "annotations": _irsa_annotations(context, monitoring.namespace, GRAFANA_SERVICE_ACCOUNT_NAME),
            },
            "admin": {
                "existingSecret": GRAFANA_ADMIN_SECRET if csi else monitoring.grafana_admin_secret,
                "userKey": "admin-user",
                "passwordKey": "admin-password",
            },
            # The chart's `helm test` Pod is a hook, which helm.v4.Chart does not run (docs/charts.md).
            "testFramework": {"enabled": False},
            # Bounded like every workload of the stack (the chart sets none); dashboards and a few
            # operators' queries fit well inside these.
            "resources": {
                "requests": {"cpu": "100m", "memory": "256Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            },
            # The sidecars read ConfigMaps and Secrets: in the monitoring namespace only (where our
            # dashboards and the chart's live), not cluster-wide.
            "rbac": {"namespaced": True},
            # Our three dashboards (components/dashboards.py) come as ConfigMaps with this label.
            "sidecar": {
                "dashboards": {
                    "enabled": True,
                    "label": label,
                    "labelValue": label_value,
                    "searchNamespace": monitoring.namespace,
                },
                "resources": {
                    "requests": {"cpu": "10m", "memory": "64Mi"},
                    "limits": {"cpu": "200m", "memory": "256Mi"},
                },
            },
        }
    )
    if csi:
        values["extraSecretMounts"] = [
            {
                "name": "grafana-admin-store",
                "mountPath": MONITORING_SECRETS_MOUNT,
                "readOnly": True,
                "csi": csi_volume("grafana-admin-store", GRAFANA_PROVIDER_CLASS)["csi"],
            }
        ]
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
                    {
                        "sourceLabels": [_meta_label(POD_TEMPLATE_HASH_LABEL)],
                        "targetLabel": POD_TEMPLATE_HASH_SERIES_LABEL,
                    },
                ],
            }
        ],
    }


def adapter_prometheus_values(url: str) -> dict[str, Any]:
    """The chart builds `--prometheus-url` as `<url>:<port><path>`, so the URL is split."""
    parsed = urlsplit(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    return {"url": f"{parsed.scheme}://{parsed.hostname}", "port": port, "path": parsed.path.rstrip("/")}


def prometheus_adapter_values(
    settings: PrometheusAdapterConfig, monitoring: MonitoringConfig, models: Sequence[ModelConfig]
) -> dict[str, Any]:
    return {
        "replicas": settings.replicas,
        "podDisruptionBudget": {
            "enabled": settings.replicas > 1,
            "maxUnavailable": 1,
            # An adapter pod that never gets ready must not block node drains.
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
        "prometheus": adapter_prometheus_values(prometheus_url(monitoring)),
        "metricsRelistInterval": f"{settings.metrics_relist_interval_seconds}s",
        # Only our rules: the chart's defaults expose every container metric, and no `resource` rules,
        # so metrics-server keeps its APIService. `external` only for a router signal on an HPA model:
        # the chart then registers external.metrics.k8s.io, which validation allows only without KEDA.
        "rules": {
            "default": False,
            "custom": adapter_rules(models),
            "external": adapter_external_rules(models),
        },
        "tolerations": [],
    }


@dataclass(frozen=True)
class MonitoringArgs:
    monitoring: MonitoringConfig
    prometheus_adapter: PrometheusAdapterConfig
    models: Sequence[ModelConfig]
    gpu_groups: Mapping[str, GpuNodeGroupConfig]
    cluster_mode: str
    secret_store: SecretStoreConfig = DEFAULT_SECRET_STORE
    """Where Alertmanager's configuration and Grafana's admin credential come from."""
    default_storage_class: str | None = None
    """Prometheus' volumes when monitoring.prometheus_storage_class is null (gp3 with the EBS driver)."""
    context: ClusterContext | None = None
    """Service-account roles (IRSA) for Alertmanager and Grafana, which read the secret store."""


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
            namespace = release_namespace(
                f"{name}-namespace", monitoring.namespace, pulumi.ResourceOptions(parent=self)
            )
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[namespace] if namespace else [])
        if installs_prometheus:
            self.prometheus_release = install_chart(
                ChartRelease(
                    KUBE_PROMETHEUS_STACK_RELEASE,
                    KUBE_PROMETHEUS_STACK_CHART,
                    monitoring.namespace,
                    kube_prometheus_stack_values(
                        monitoring,
                        args.gpu_groups,
                        args.cluster_mode,
                        secret_store=args.secret_store,
                        default_storage_class=args.default_storage_class,
                        context=args.context,
                    ),
                ),
                in_namespace,
            )
        if installs_adapter:
            self.adapter_release = install_chart(
                ChartRelease(
                    PROMETHEUS_ADAPTER_RELEASE,
                    PROMETHEUS_ADAPTER_CHART,
                    monitoring.namespace,
                    prometheus_adapter_values(args.prometheus_adapter, monitoring, args.models),
                ),
                pulumi.ResourceOptions(
                    parent=self,
                    depends_on=[resource for resource in (namespace, self.prometheus_release) if resource],
                ),
            )
        if scrape.monitor_objects:
            # After the release that creates its CRD (kube-prometheus-stack) and its namespace.
            after = [resource for resource in (namespace, self.prometheus_release) if resource]
            kubernetes.apiextensions.CustomResource(
                f"{name}-vllm-pod-monitor",
                api_version=PROMETHEUS_OPERATOR_API_VERSION,
                kind="PodMonitor",
                metadata={
                    "name": VLLM_POD_MONITOR,
                    "namespace": monitoring.namespace,
                    "labels": scrape.labels,
                },
                spec=vllm_pod_monitor_spec(args.models, scrape),
                opts=pulumi.ResourceOptions(parent=self, depends_on=after),
            )
        self.register_outputs({"prometheus_url": self.prometheus_url})
