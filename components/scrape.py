"""How the stack's workloads and the add-ons' exporters are scraped: what every PodMonitor and
ServiceMonitor shares, computed once from the monitoring config and handed to the components."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.labels import PART_OF
from infra.config.platform import MonitoringConfig


@dataclass(frozen=True)
class ScrapeSettings:
    monitor_objects: bool
    """PodMonitor/ServiceMonitors are rendered (a Prometheus Operator runs: ours, or an existing one)."""
    interval_seconds: int
    labels: dict[str, str] = field(default_factory=dict)
    """Labels on every monitor object (an existing Prometheus' selectors may need them)."""


def creates_monitor_objects(monitoring: MonitoringConfig) -> bool:
    return monitoring.enabled and (
        monitoring.prometheus == "kube-prometheus-stack" or monitoring.existing_prometheus_operator
    )


def monitor_labels(monitoring: MonitoringConfig) -> dict[str, str]:
    return {"app.kubernetes.io/part-of": PART_OF, **monitoring.monitor_labels}


def scrape_settings(monitoring: MonitoringConfig) -> ScrapeSettings:
    return ScrapeSettings(
        monitor_objects=creates_monitor_objects(monitoring),
        interval_seconds=monitoring.scrape_interval_seconds,
        labels=monitor_labels(monitoring),
    )
