"""Alerts, dashboards and the monitoring stack's secrets: what an operator sees and gets paged by.

PrometheusRule vllm-platform          components/alert_rules.py (with a Prometheus Operator)
ConfigMaps vllm-platform-dashboard-*  components/dashboards.py (with Grafana), label
                                      grafana_dashboard=1 (the chart's sidecar)
SecretProviderClass alertmanager-config / grafana-admin
                                      the Alertmanager configuration and Grafana's admin
                                      credential from the secret store, synced into the Secrets
                                      the chart reads (components/monitoring.py mounts them)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components.alert_rules import PROMETHEUS_RULE_NAME, alert_rule_groups
from components.dashboards import dashboard_config_maps
from components.monitoring import (
    ALERTMANAGER_CONFIG_KEY,
    ALERTMANAGER_CONFIG_SECRET,
    ALERTMANAGER_PROVIDER_CLASS,
    GRAFANA_ADMIN_KEYS,
    GRAFANA_ADMIN_SECRET,
    GRAFANA_DASHBOARD_LABEL,
    GRAFANA_PROVIDER_CLASS,
    PROMETHEUS_OPERATOR_API_VERSION,
)
from components.scrape import scrape_settings
from components.secrets import SPC_API_VERSION, keys_provider_class_spec, uses_csi
from domain.config.models import ModelConfig
from domain.config.platform import MonitoringConfig, SecretStoreConfig
from domain.config.tenants import TenantConfig
from domain.labels import PART_OF


@dataclass(frozen=True)
class OperationsArgs:
    monitoring: MonitoringConfig
    models: Sequence[ModelConfig]
    secret_store: SecretStoreConfig
    dcgm_exporter: bool
    """addons.dcgm_exporter is on: the GPU alerts have series to read."""
    region: str
    tenants: Sequence[TenantConfig]
    """The tenants whose limits the tenant alerts watch."""
    depends_on: Sequence[pulumi.Resource]
    """The kube-prometheus-stack release (CRDs, namespace) and the Secrets Store CSI driver."""


def monitoring_provider_classes(
    monitoring: MonitoringConfig, store: SecretStoreConfig, region: str
) -> dict[str, dict[str, Any]]:
    """SecretProviderClass name -> spec, for Alertmanager and Grafana (CSI providers only)."""
    if not (monitoring.enabled and monitoring.prometheus == "kube-prometheus-stack" and uses_csi(store)):
        return {}
    classes = {}
    if monitoring.alertmanager and monitoring.alertmanager_config_secret is not None:
        ref = monitoring.alertmanager_config_secret
        classes[ALERTMANAGER_PROVIDER_CLASS] = keys_provider_class_spec(
            store,
            ref.name,
            {ALERTMANAGER_CONFIG_KEY: ref.key},
            region,
            sync_to_secret=ALERTMANAGER_CONFIG_SECRET,
        )
    if monitoring.grafana and monitoring.grafana_admin_secret is not None:
        classes[GRAFANA_PROVIDER_CLASS] = keys_provider_class_spec(
            store,
            monitoring.grafana_admin_secret,
            GRAFANA_ADMIN_KEYS,
            region,
            sync_to_secret=GRAFANA_ADMIN_SECRET,
        )
    return classes


def ships_dashboards(monitoring: MonitoringConfig) -> bool:
    return monitoring.enabled and monitoring.prometheus == "kube-prometheus-stack" and monitoring.grafana


class Operations(pulumi.ComponentResource):
    def __init__(self, name: str, args: OperationsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:operations:Operations", name, None, opts)
        monitoring = args.monitoring
        scrape = scrape_settings(monitoring)
        after = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        labels = {"app.kubernetes.io/part-of": PART_OF}
        groups = alert_rule_groups(
            args.models, monitoring.alerts, dcgm_exporter=args.dcgm_exporter, tenants=args.tenants
        )
        if scrape.monitor_objects and groups:
            kubernetes.apiextensions.CustomResource(
                f"{name}-alert-rules",
                api_version=PROMETHEUS_OPERATOR_API_VERSION,
                kind="PrometheusRule",
                metadata={
                    "name": PROMETHEUS_RULE_NAME,
                    "namespace": monitoring.namespace,
                    "labels": scrape.labels,
                },
                spec={"groups": groups},
                opts=after,
            )
        if ships_dashboards(monitoring):
            label, value = GRAFANA_DASHBOARD_LABEL
            for config_map, data in dashboard_config_maps().items():
                kubernetes.core.v1.ConfigMap(
                    f"{name}-{config_map}",
                    metadata={
                        "name": config_map,
                        "namespace": monitoring.namespace,
                        "labels": {**labels, label: value},
                    },
                    data=data,
                    opts=after,
                )
        for provider_class, spec in monitoring_provider_classes(
            monitoring, args.secret_store, args.region
        ).items():
            kubernetes.apiextensions.CustomResource(
                f"{name}-{provider_class}-provider-class",
                api_version=SPC_API_VERSION,
                kind="SecretProviderClass",
                metadata={"name": provider_class, "namespace": monitoring.namespace, "labels": labels},
                spec=spec,
                opts=after,
            )
        self.register_outputs({})
