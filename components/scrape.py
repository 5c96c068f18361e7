"""How the stack's workloads and the add-ons' exporters are scraped: what every PodMonitor and
ServiceMonitor shares, computed once from the monitoring config and handed to the components."""

from __future__ import annotations

from dataclasses import dataclass, field

from domain.config.models import ModelConfig
from domain.config.platform import MonitoringConfig, PlatformConfig
from domain.labels import PART_OF


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


def series_gaps(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    """Why the stack, as configured, produces none of an exporter's series for `model`, by exporter
    (`vllm`, `dcgm`, `router`; components/adapter_rules.py `ScalingSignal.exporter`): the words after
    "<series> ", each with its fix. An exporter absent from the result is scraped.

    What produces each: vLLM's `vllm:*` series come from the server's own stat loggers, scraped by the
    PodMonitor `vllm` (or the hand-written job of docs/autoscaling.md without a Prometheus Operator);
    DCGM's from the exporter add-on with pod attribution, scraped by its chart's ServiceMonitor (or the
    hand-written job); a model router's from its `route-<model>` container, whose series get their
    `model` label only from the PodMonitor `vllm-router` (no hand-written job gives it)."""
    from components.vllm_arguments import disables_statistics

    if not config.monitoring.enabled:
        return dict.fromkeys(
            ("vllm", "dcgm", "router"),
            "reaches the autoscaler through Prometheus, but monitoring.enabled is false (nothing is "
            "scraped); set monitoring.enabled: true",
        )
    gaps: dict[str, str] = {}
    flag = disables_statistics(model.vllm.extra_args)
    if flag is not None:
        gaps["vllm"] = (
            f"is never exported: vllm.extra_args has {flag}, with which vLLM keeps no statistics and "
            "exports none of its vllm:* series; remove it"
        )
    if not config.addons.dcgm_exporter.enabled:
        gaps["dcgm"] = (
            "comes from the DCGM exporter, which is off; set addons.dcgm_exporter: true or scale on "
            "vLLM's metrics only"
        )
    if not config.router.enabled:
        gaps["router"] = (
            "comes from the router, which is off; set router.enabled: true or scale on vLLM's metrics "
            "(vllm:num_requests_waiting, vllm:num_requests_running)"
        )
    elif not creates_monitor_objects(config.monitoring):
        gaps["router"] = (
            "needs the router's PodMonitor (it labels each model router's series with `model`), which "
            "is not created with monitoring.existing_prometheus_operator: false; set it to true (a "
            "Prometheus Operator selects the PodMonitor)"
        )
    return gaps
