"""Monitoring: kube-prometheus-stack or an existing Prometheus, the vLLM PodMonitor, the adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.labels import MODEL_LABEL
from components.monitoring import (
    VLLM_METRICS_PORT_NAME,
    adapter_prometheus_values,
    kube_prometheus_stack_values,
    prometheus_url,
)
from components.scrape import creates_monitor_objects
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import model_workloads, rendered
from tests.test_addons_cluster import (
    as_int,
    config_error,
    config_of,
    load_variant,
    release,
    release_names,
    render_variant,
)

EXISTING_URL = "http://prometheus-operated.observability.svc:9090"


def _use_existing_prometheus(values: dict[str, Any]) -> None:
    values["monitoring"] = {
        "prometheus": "existing",
        "existing_prometheus_url": EXISTING_URL,
        "monitor_labels": {"release": "prometheus"},
    }


@pytest.fixture(scope="module")
def existing_prometheus_render(tmp_path_factory: pytest.TempPathFactory) -> RenderResult:
    return render_variant(
        tmp_path_factory.mktemp("existing-prometheus"), _use_existing_prometheus, base="prod"
    )


def test_prometheus_selects_every_pod_and_service_monitor_in_the_cluster(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    kps = release(stack_render, "kube-prometheus-stack")
    assert kps["namespace"] == config.monitoring.namespace
    spec = kps["values"]["prometheus"]["prometheusSpec"]
    assert spec["podMonitorSelectorNilUsesHelmValues"] is False
    assert spec["serviceMonitorSelectorNilUsesHelmValues"] is False
    assert spec["scrapeInterval"] == f"{config.monitoring.scrape_interval_seconds}s"
    assert spec["retention"] == f"{config.monitoring.retention_days}d"
    # No StorageClass on EKS without the EBS CSI driver: an emptyDir with a limit, retention below it.
    assert spec["storageSpec"] == {"emptyDir": {"sizeLimit": "10Gi"}}
    assert spec["retentionSize"] == "8704MiB"


def test_prometheus_can_keep_its_data_on_a_persistent_volume() -> None:
    config = load_stack("prod")
    monitoring = config.monitoring.model_copy(update={"prometheus_persistent_volume": True,
                                                      "prometheus_storage_gib": 50,
                                                      "prometheus_storage_class": "gp3"})
    values = kube_prometheus_stack_values(monitoring, config.node_groups.gpu, config.cluster.mode)
    claim = values["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "50Gi"}},
                     "storageClassName": "gp3"}


def test_eks_does_not_scrape_control_plane_components_it_hides(stack_render: RenderResult) -> None:
    values = release(stack_render, "kube-prometheus-stack")["values"]
    for component in ("kubeControllerManager", "kubeScheduler", "kubeEtcd", "kubeProxy"):
        assert values[component] == {"enabled": False}


def test_grafana_is_off_unless_an_admin_secret_is_named(tmp_path: Path) -> None:
    assert release(rendered("dev"), "kube-prometheus-stack")["values"]["grafana"]["enabled"] is False
    message = config_error(tmp_path, lambda v: v.__setitem__("monitoring", {"grafana": True}))
    assert "vllm-platform:monitoring.grafana_admin_secret = null" in message
    assert "default password is public" in message


def test_vllm_pod_monitor_scrapes_every_model_pod_on_its_http_port(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    [monitor] = stack_render.find("PodMonitor", "vllm", config.monitoring.namespace)
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": sorted(m.namespace for m in config.models)}
    [endpoint] = spec["podMetricsEndpoints"]
    assert endpoint["port"] == VLLM_METRICS_PORT_NAME and endpoint["path"] == "/metrics"
    for model in config.models:
        [deployment] = model_workloads(stack_render, model.namespace)
        template = deployment["spec"]["template"]
        assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
        assert template["metadata"]["labels"][MODEL_LABEL] == model.name  # relabelled to `model`
        [server] = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
        assert {"name": VLLM_METRICS_PORT_NAME, "containerPort": model.vllm.port} in [
            {key: port[key] for key in ("name", "containerPort")} for port in as_int(server["ports"])
        ]


def test_adapter_reads_the_prometheus_the_stack_installs(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    values = release(stack_render, "prometheus-adapter")["values"]
    assert values["prometheus"] == {
        "url": f"http://kube-prometheus-stack-prometheus.{config.monitoring.namespace}.svc",
        "port": 9090,
        "path": "",
    }
    assert values["rules"]["default"] is False
    assert values["rules"]["external"] == [], "external metrics stay KEDA's"
    assert "resource" not in values["rules"], "resource metrics stay metrics-server's"
    assert values["replicas"] == 2 and values["podDisruptionBudget"]["enabled"] is True


def test_existing_prometheus_is_used_instead_of_installing_one(
    existing_prometheus_render: RenderResult,
) -> None:
    result = existing_prometheus_render
    assert "kube-prometheus-stack" not in release_names(result)
    adapter = release(result, "prometheus-adapter")["values"]
    assert adapter["prometheus"] == {
        "url": "http://prometheus-operated.observability.svc",
        "port": 9090,
        "path": "",
    }
    for scaled_object in result.find("ScaledObject"):
        assert {t["metadata"]["serverAddress"] for t in scaled_object["spec"]["triggers"]} == {EXISTING_URL}
    [monitor] = result.find("PodMonitor", "vllm")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    dcgm_monitor = release(result, "dcgm-exporter")["values"]["serviceMonitor"]
    assert dcgm_monitor["enabled"] is True and dcgm_monitor["additionalLabels"]["release"] == "prometheus"


def test_existing_prometheus_without_the_operator_gets_no_monitor_objects(tmp_path: Path) -> None:
    def no_operator(values: dict[str, Any]) -> None:
        _use_existing_prometheus(values)
        values["monitoring"]["existing_prometheus_operator"] = False

    result = render_variant(tmp_path, no_operator)
    assert result.find("PodMonitor") == []
    assert release(result, "dcgm-exporter")["values"]["serviceMonitor"]["enabled"] is False
    assert not creates_monitor_objects(load_variant(tmp_path / "config", no_operator).monitoring)


def test_existing_prometheus_needs_its_url(tmp_path: Path) -> None:
    message = config_error(tmp_path, lambda v: v.__setitem__("monitoring", {"prometheus": "existing"}))
    assert "vllm-platform:monitoring.existing_prometheus_url" in message


def test_existing_prometheus_url_must_be_an_http_url(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        lambda v: v.__setitem__(
            "monitoring", {"prometheus": "existing", "existing_prometheus_url": "prometheus:9090"}
        ),
    )
    assert 'vllm-platform:monitoring.existing_prometheus_url = "prometheus:9090"' in message
    assert "http(s) URL" in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://prometheus-operated.monitoring.svc:9090",
            ("http://prometheus-operated.monitoring.svc", 9090, ""),
        ),
        ("https://prom.example.com/prometheus", ("https://prom.example.com", 443, "/prometheus")),
        ("http://thanos-query.thanos.svc", ("http://thanos-query.thanos.svc", 80, "")),
    ],
)
def test_adapter_url_is_split_the_way_the_chart_joins_it(url: str, expected: tuple[str, int, str]) -> None:
    values = adapter_prometheus_values(url)
    assert (values["url"], values["port"], values["path"]) == expected
    assert f"{values['url']}:{values['port']}{values['path']}".startswith(expected[0])


def test_prometheus_url_follows_the_monitoring_namespace() -> None:
    monitoring = load_stack("prod").monitoring.model_copy(update={"namespace": "observability"})
    assert prometheus_url(monitoring) == "http://kube-prometheus-stack-prometheus.observability.svc:9090"
