"""Monitoring: kube-prometheus-stack or an existing Prometheus, the vLLM PodMonitor, the adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.monitoring import (
    VLLM_METRICS_PORT_NAME,
    adapter_prometheus_values,
    kube_prometheus_stack_values,
    prometheus_url,
)
from components.scrape import creates_monitor_objects
from domain.labels import MODEL_LABEL
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import model_workloads, rendered
from tests.support.charts import require_charts
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
    assert spec["ruleSelectorNilUsesHelmValues"] is False  # the PrometheusRule vllm-platform


def test_dev_and_staging_keep_prometheus_on_a_size_limited_empty_dir() -> None:
    for stack in ("dev", "staging"):
        spec = release(rendered(stack), "kube-prometheus-stack")["values"]["prometheus"]["prometheusSpec"]
        assert spec["storageSpec"] == {"emptyDir": {"sizeLimit": "10Gi"}}
        assert spec["retentionSize"] == "8704MiB"  # 85 % of the limit: old blocks go first
        assert as_int(spec["replicas"]) == 1


def test_prod_prometheus_survives_a_restart_two_replicas_on_gp3_volumes_on_different_nodes() -> None:
    spec = release(rendered("prod"), "kube-prometheus-stack")["values"]["prometheus"]["prometheusSpec"]
    assert as_int(spec["replicas"]) == 2
    assert spec["podAntiAffinity"] == "hard"
    claim = spec["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "gp3",
    }
    assert spec["retention"] == "30d"
    assert spec["retentionSize"] == f"{int(50 * 0.85 * 1024)}MiB"
    [storage_class] = [o for o in rendered("prod").find("StorageClass") if o["metadata"]["name"] == "gp3"]
    assert storage_class["provisioner"] == "ebs.csi.aws.com"
    assert storage_class["volumeBindingMode"] == "WaitForFirstConsumer"  # the pod's zone
    assert storage_class["allowVolumeExpansion"] is True


def test_prod_runs_alertmanager_with_receivers_from_the_secret_store_never_from_values() -> None:
    values = release(rendered("prod"), "kube-prometheus-stack")["values"]["alertmanager"]
    assert values["enabled"] is True
    spec = values["alertmanagerSpec"]
    assert spec["configSecret"] == "alertmanager-config"
    assert "config" not in values and "route" not in str(values)  # no receivers in the values
    [volume] = spec["volumes"]
    assert volume["csi"]["volumeAttributes"] == {"secretProviderClass": "alertmanager-config"}
    assert [m["name"] for m in spec["volumeMounts"]] == [volume["name"]]  # mounted: the driver syncs
    [provider_class] = [
        o
        for o in rendered("prod").find("SecretProviderClass")
        if o["metadata"]["name"] == "alertmanager-config"
    ]
    assert provider_class["metadata"]["namespace"] == "monitoring"
    assert provider_class["spec"]["secretObjects"] == [
        {
            "secretName": "alertmanager-config",
            "type": "Opaque",
            "data": [{"objectName": "alertmanager.yaml", "key": "alertmanager.yaml"}],
        }
    ]
    assert "vllm-platform/prod/alertmanager" in provider_class["spec"]["parameters"]["objects"]
    annotations = values["serviceAccount"]["annotations"]
    assert annotations["eks.amazonaws.com/role-arn"].endswith("monitoring-kube-prometheus-stack-alertmanager")


def test_prod_grafana_reads_its_admin_credential_from_the_secret_store_and_watches_dashboards() -> None:
    values = release(rendered("prod"), "kube-prometheus-stack")["values"]["grafana"]
    assert values["enabled"] is True
    assert values["admin"] == {
        "existingSecret": "grafana-admin",
        "userKey": "admin-user",
        "passwordKey": "admin-password",
    }
    assert "adminPassword" not in values
    [mount] = values["extraSecretMounts"]
    assert mount["csi"]["volumeAttributes"] == {"secretProviderClass": "grafana-admin"}
    assert values["sidecar"]["dashboards"]["label"] == "grafana_dashboard"
    assert values["sidecar"]["dashboards"]["labelValue"] == "1"
    assert values["rbac"] == {"namespaced": True}  # the sidecars read the monitoring namespace only
    [config_map] = [
        o
        for o in rendered("prod").find("ConfigMap")
        if o["metadata"]["name"] == "vllm-platform-dashboard-autoscaling"
    ]
    assert config_map["metadata"]["namespace"] == "monitoring"
    [provider_class] = [
        o for o in rendered("prod").find("SecretProviderClass") if o["metadata"]["name"] == "grafana-admin"
    ]
    keys = {item["key"] for item in provider_class["spec"]["secretObjects"][0]["data"]}
    assert keys == {"admin-user", "admin-password"}


def test_alertmanager_without_its_configuration_secret_is_rejected(tmp_path: Path) -> None:
    message = config_error(tmp_path, lambda v: v.__setitem__("monitoring", {"alertmanager": True}))
    assert "vllm-platform:monitoring.alertmanager_config_secret = null" in message
    assert "receivers never go in the stack file" in message


def test_the_ebs_csi_driver_is_an_eks_managed_add_on_with_its_own_irsa_role() -> None:
    addons = rendered("prod").aws("aws:eks/addon:Addon")
    [ebs] = [addon for addon in addons if addon.inputs["addonName"] == "aws-ebs-csi-driver"]
    assert ebs.inputs["serviceAccountRoleArn"].endswith("kube-system-ebs-csi-controller-sa")
    roles = rendered("prod").aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
    assert any(r.inputs["policyArn"].endswith("service-role/AmazonEBSCSIDriverPolicy") for r in roles)


def test_prometheus_can_keep_its_data_on_a_persistent_volume() -> None:
    config = load_stack("prod")
    monitoring = config.monitoring.model_copy(
        update={
            "prometheus_persistent_volume": True,
            "prometheus_storage_gib": 50,
            "prometheus_storage_class": "gp3",
        }
    )
    values = kube_prometheus_stack_values(monitoring, config.node_groups.gpu, config.cluster.mode)
    claim = values["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "gp3",
    }


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
    # External rules only for a router signal on an HPA model (tests/test_autoscaling_router.py); no
    # shipped stack has one, so external metrics stay KEDA's.
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


def test_dcgm_exporter_reads_the_gpus_every_five_seconds_with_the_default_counters() -> None:
    require_charts()
    [daemonset] = [
        o
        for o in rendered("prod").deployed_chart_objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "dcgm-exporter"
    ]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["args"][-3:] == [
        "-f",
        "/etc/dcgm-exporter/default-counters.csv",
        "--collect-interval=5000",
    ]


def test_prod_alertmanager_chart_renders_no_secret_of_its_own() -> None:
    require_charts()
    secrets = [
        o
        for o in rendered("prod").deployed_chart_objects
        if o["kind"] == "Secret" and "alertmanager" in o["metadata"]["name"]
    ]
    assert secrets == []
    [alertmanager] = [o for o in rendered("prod").deployed_chart_objects if o["kind"] == "Alertmanager"]
    assert alertmanager["spec"]["configSecret"] == "alertmanager-config"
