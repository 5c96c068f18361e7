"""GPU add-ons: device plugin (+ GFD/NFD), DCGM exporter, image pre-pull — and where everything may run.

The placement test reads every rendered workload and every Helm release's values: what runs on GPU
nodes tolerates every GPU taint of the config (and nothing broader), node agents whose volumes vLLM
mounts do too, and nothing else tolerates any of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.gpu_addons import (
    IMAGE_PREPULL_NAME,
    KUBELET_POD_RESOURCES,
    device_plugin_groups,
    device_plugin_values,
)
from components.scheduling import tolerates, toleration_for
from domain.config import PlatformConfig
from domain.labels import GPU_GROUP_LABEL
from domain.versions import PAUSE_IMAGE, VLLM_IMAGE
from infra.render import RenderResult
from tests.conftest import STACKS, TEST_STACKS_DIR, rendered
from tests.test_addons_cluster import as_int, config_error, config_of, load_variant, release, render_variant

GPU, NODE_AGENT, CONTROLLER = "runs on GPU nodes", "node agent", "controller"

# Every `tolerations` list in the values we give each chart, and what the pods behind it are.
# A chart whose values grow a new tolerations list fails the test until it is classified here.
RELEASE_TOLERATIONS: dict[str, dict[tuple[str, ...], str]] = {
    "nvidia-device-plugin": {
        ("tolerations",): GPU,  # device plugin and GPU feature discovery
        ("nfd", "worker", "tolerations"): GPU,
        ("nfd", "master", "tolerations"): CONTROLLER,
        ("nfd", "gc", "tolerations"): CONTROLLER,
    },
    "dcgm-exporter": {("tolerations",): GPU},
    "kube-prometheus-stack": {
        ("prometheus", "prometheusSpec", "tolerations"): CONTROLLER,
        ("alertmanager", "alertmanagerSpec", "tolerations"): CONTROLLER,
        ("grafana", "tolerations"): CONTROLLER,
        ("prometheusOperator", "tolerations"): CONTROLLER,
        ("kube-state-metrics", "tolerations"): CONTROLLER,
        ("prometheus-node-exporter", "tolerations"): NODE_AGENT,
    },
    "prometheus-adapter": {("tolerations",): CONTROLLER},
    "keda": {("tolerations",): CONTROLLER},
    "argo-rollouts": {("controller", "tolerations"): CONTROLLER},
    "aws-efs-csi-driver": {("controller", "tolerations"): CONTROLLER, ("node", "tolerations"): NODE_AGENT},
    "secrets-store-csi-driver": {("linux", "tolerations"): NODE_AGENT},
    "secrets-store-csi-driver-provider-aws": {("tolerations",): NODE_AGENT},
    "vault-csi-provider": {("csi", "pod", "tolerations"): NODE_AGENT},
    "aws-load-balancer-controller": {("tolerations",): CONTROLLER},
    "metrics-server": {("tolerations",): CONTROLLER},
    "cluster-autoscaler": {("tolerations",): CONTROLLER},
    "karpenter": {("tolerations",): CONTROLLER},
}


def _extra_taints(values: dict[str, Any]) -> None:
    """Taints beyond the default: a second taint with NoExecute, and a key-only taint (operator Exists)."""
    groups = values["node_groups"]["gpu"]
    groups["l40s"]["taints"] = [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"},
        {"key": "dedicated", "value": "inference", "effect": "NoExecute"},
    ]
    groups["h200"]["taints"] = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]


@pytest.fixture(scope="module")
def extra_taints_render(tmp_path_factory: pytest.TempPathFactory) -> RenderResult:
    return render_variant(tmp_path_factory.mktemp("taints"), _extra_taints, base="prod")


PLACEMENT_RENDERS = [*STACKS, "existing", "prod-with-extra-taints"]


@pytest.fixture(params=PLACEMENT_RENDERS)
def placement_render(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> RenderResult:
    if request.param == "existing":
        return rendered("existing", TEST_STACKS_DIR / "Pulumi.existing.yaml")
    if request.param == "prod-with-extra-taints":
        return request.getfixturevalue("extra_taints_render")
    return rendered(request.param)


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    kind, spec = obj["kind"], obj.get("spec", {})
    if kind in ("Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "Rollout"):
        return [spec["template"]["spec"]]
    if kind == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    if kind == "Pod":
        return [spec]
    return []


def _target_gpu_groups(pod_spec: dict[str, Any]) -> set[str]:
    groups = set()
    if GPU_GROUP_LABEL in (pod_spec.get("nodeSelector") or {}):
        groups.add(pod_spec["nodeSelector"][GPU_GROUP_LABEL])
    groups |= _affinity_groups(pod_spec.get("affinity") or {})
    return groups


def _affinity_groups(affinity: dict[str, Any]) -> set[str]:
    required = (affinity.get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    groups = set()
    for term in required.get("nodeSelectorTerms", []):
        for expression in term.get("matchExpressions", []):
            if expression["key"] == GPU_GROUP_LABEL and expression["operator"] == "In":
                groups |= set(expression["values"])
    return groups


def _assert_tolerates_exactly_gpu_taints(
    where: str, tolerations: list[dict[str, Any]], config: PlatformConfig, groups: set[str]
) -> None:
    every_taint = [taint for group in config.node_groups.gpu.values() for taint in group.taints]
    for group_name in groups:
        for taint in config.node_groups.gpu[group_name].taints:
            assert any(tolerates(t, taint) for t in tolerations), (
                f"{where} does not tolerate {taint} of {group_name}"
            )
    allowed = [toleration_for(taint) for taint in every_taint]
    for toleration in tolerations:
        assert toleration in allowed, f"{where}: {toleration} is not exactly a configured GPU taint"


def _assert_tolerates_no_gpu_taint(
    where: str, tolerations: list[dict[str, Any]], config: PlatformConfig
) -> None:
    for group_name, group in config.node_groups.gpu.items():
        for taint in group.taints:
            assert not any(tolerates(t, taint) for t in tolerations), (
                f"{where} tolerates {taint} of {group_name}"
            )


def _tolerations_paths(
    values: Any, path: tuple[str, ...] = ()
) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    found = {}
    if isinstance(values, dict):
        for key, item in values.items():
            if key == "tolerations":
                found[(*path, key)] = item
            else:
                found.update(_tolerations_paths(item, (*path, key)))
    return found


def _at(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        values = values.get(key, {})
    return values


def test_gpu_workloads_tolerate_every_gpu_taint_and_nothing_else_does(placement_render: RenderResult) -> None:
    config = config_of(placement_render)
    gpu_workloads = []
    for obj in placement_render.kubernetes_objects:
        for pod_spec in _pod_specs(obj):
            where = f"{obj['kind']} {obj['metadata'].get('namespace')}/{obj['metadata']['name']}"
            tolerations = pod_spec.get("tolerations") or []
            groups = _target_gpu_groups(pod_spec)
            if groups:
                gpu_workloads.append(obj["metadata"]["name"])
                _assert_tolerates_exactly_gpu_taints(where, tolerations, config, groups)
            else:
                _assert_tolerates_no_gpu_taint(where, tolerations, config)
    # The vLLM Deployments and the pre-pull DaemonSet were among them.
    assert gpu_workloads.count("vllm") == len(config.models)
    assert IMAGE_PREPULL_NAME in gpu_workloads

    all_groups = set(config.node_groups.gpu)
    for helm_release in placement_render.helm_releases:
        name = helm_release["name"]
        assert name in RELEASE_TOLERATIONS, f"classify the tolerations of release {name} in this test"
        values = helm_release["values"]
        found = _tolerations_paths(values)
        assert set(found) == set(RELEASE_TOLERATIONS[name]), (
            f"{name}: set every workload's tolerations explicitly"
        )
        for path, role in RELEASE_TOLERATIONS[name].items():
            where = f"release {name} values {'.'.join(path)}"
            if role == CONTROLLER:
                _assert_tolerates_no_gpu_taint(where, found[path], config)
                continue
            _assert_tolerates_exactly_gpu_taints(where, found[path], config, all_groups)
            if role == GPU:
                groups = _affinity_groups(_at(values, (*path[:-1], "affinity")))
                assert groups and groups <= all_groups, f"{where}: must run on GPU groups only"


def test_nfd_worker_tolerates_the_configured_taint_not_the_upstream_present_default() -> None:
    values = release(rendered("dev"), "nvidia-device-plugin")["values"]
    expected = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    assert values["nfd"]["worker"]["tolerations"] == expected
    assert values["tolerations"] == expected


def test_device_plugin_with_feature_discovery_runs_on_every_gpu_group(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    values = release(stack_render, "nvidia-device-plugin")["values"]
    assert _affinity_groups(values["affinity"]) == set(config.node_groups.gpu)
    assert values["gfd"] == {"enabled": True}
    assert values["nfd"]["enabled"] is True
    assert _affinity_groups(values["nfd"]["worker"]["affinity"]) == set(config.node_groups.gpu)


def test_feature_discovery_can_be_left_to_an_existing_nfd(tmp_path: Path) -> None:
    def off(values: dict[str, Any]) -> None:
        values["addons"] = {"nvidia_device_plugin": {"gpu_feature_discovery": False}}

    config = load_variant(tmp_path, off)
    values = device_plugin_values(config.node_groups.gpu, config.addons.nvidia_device_plugin)
    assert values["gfd"] == {"enabled": False}
    assert values["nfd"]["enabled"] is False


def test_bottlerocket_groups_keep_their_builtin_device_plugin(tmp_path: Path) -> None:
    def bottlerocket_h200(values: dict[str, Any]) -> None:
        values["node_groups"]["gpu"]["h200"]["ami_type"] = "BOTTLEROCKET_x86_64_NVIDIA"
        values["node_groups"]["gpu"]["h200"]["local_nvme"] = {"enabled": False}  # AL2023 only (issue 34)

    config = load_variant(tmp_path, bottlerocket_h200, base="prod")
    assert device_plugin_groups(config.node_groups.gpu) == ["l40s"]
    values = device_plugin_values(config.node_groups.gpu, config.addons.nvidia_device_plugin)
    assert _affinity_groups(values["affinity"]) == {"l40s"}


def test_eks_stack_without_any_device_plugin_is_rejected(tmp_path: Path) -> None:
    message = config_error(tmp_path, lambda v: v.__setitem__("addons", {"nvidia_device_plugin": False}))
    assert "vllm-platform:addons.nvidia_device_plugin.enabled = false" in message
    assert "GPUs would never be registered" in message


def test_dcgm_exporter_labels_gpu_series_with_the_pod_that_holds_the_gpu(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    values = release(stack_render, "dcgm-exporter")["values"]
    assert values["kubeletPath"] == KUBELET_POD_RESOURCES
    monitor = values["serviceMonitor"]
    assert monitor["enabled"] is True
    # Without honorLabels Prometheus renames the GPU's pod/namespace to exported_pod/exported_namespace.
    assert monitor["honorLabels"] is True
    assert monitor["interval"] == f"{config.monitoring.scrape_interval_seconds}s"
    assert _affinity_groups(values["affinity"]) == set(config.node_groups.gpu)


def test_image_prepull_pulls_the_pinned_vllm_image_on_gpu_nodes_without_gpus(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    [daemonset] = stack_render.find("DaemonSet", IMAGE_PREPULL_NAME, "kube-system")
    spec = as_int(daemonset["spec"]["template"]["spec"])
    [init] = spec["initContainers"]
    [main] = spec["containers"]
    assert init["image"] == VLLM_IMAGE.reference
    assert init["imagePullPolicy"] == "IfNotPresent"
    assert init["command"] == ["/bin/sh", "-c", "exit 0"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in init["env"]
    assert main["image"] == PAUSE_IMAGE.reference
    for container in (init, main):
        for section in ("requests", "limits"):
            assert not any("nvidia.com" in resource for resource in container["resources"].get(section, {}))
        assert container["securityContext"]["runAsNonRoot"] is True
    assert _target_gpu_groups(spec) == set(config.node_groups.gpu)


def test_image_prepull_can_be_switched_off(tmp_path: Path) -> None:
    result = render_variant(tmp_path, lambda v: v.__setitem__("addons", {"image_prepull": False}))
    assert result.find("DaemonSet", IMAGE_PREPULL_NAME) == []


def test_toleration_override_that_misses_a_gpu_taint_is_rejected(tmp_path: Path) -> None:
    def present_only(values: dict[str, Any]) -> None:
        # The upstream NFD default, copied into config: it leaves `nvidia.com/gpu=true` nodes unregistered.
        values["addons"] = {
            "nvidia_device_plugin": {
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
                ]
            }
        }

    message = config_error(tmp_path, present_only)
    assert 'vllm-platform:node_groups.gpu.l40s.taints[0] = "nvidia.com/gpu=true:NoSchedule"' in message
    assert "addons.nvidia_device_plugin.tolerations does not tolerate this taint" in message
    assert "{key: nvidia.com/gpu, operator: Equal, value: true, effect: NoSchedule}" in message


def test_toleration_override_that_covers_the_taints_replaces_the_derived_ones(tmp_path: Path) -> None:
    def key_only(values: dict[str, Any]) -> None:
        values["addons"] = {
            "dcgm_exporter": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
        }

    result = render_variant(tmp_path, key_only)
    assert release(result, "dcgm-exporter")["values"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists"}
    ]


def test_toleration_with_exists_and_a_value_is_rejected(tmp_path: Path) -> None:
    def bad(values: dict[str, Any]) -> None:
        values["addons"] = {
            "image_prepull": {"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}
        }

    message = config_error(tmp_path, bad)
    assert "vllm-platform:addons.image_prepull.tolerations[0].value" in message


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (
            {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"},
            ("k", "v", "NoSchedule"),
            True,
        ),
        (
            {"key": "k", "operator": "Equal", "value": "present", "effect": "NoSchedule"},
            ("k", "v", "NoSchedule"),
            False,
        ),
        ({"key": "k", "operator": "Exists"}, ("k", "v", "NoExecute"), True),
        ({"operator": "Exists"}, ("any", "", "NoSchedule"), True),
        ({"operator": "Exists", "effect": "NoExecute"}, ("any", "", "NoSchedule"), False),
        ({"key": "other", "operator": "Exists"}, ("k", "", "NoSchedule"), False),
        ({"key": "k", "value": "v"}, ("k", "v", "PreferNoSchedule"), True),
    ],
)
def test_toleration_matching_follows_kubernetes(
    toleration: dict[str, str], taint: tuple[str, str, str], expected: bool
) -> None:
    from domain.config.cluster import TaintConfig

    key, value, effect = taint
    assert tolerates(toleration, TaintConfig(key=key, value=value, effect=effect)) is expected


def test_device_plugin_override_need_not_cover_groups_with_their_own_plugin(tmp_path: Path) -> None:
    def bottlerocket_h200_with_own_taint(values: dict[str, Any]) -> None:
        h200 = values["node_groups"]["gpu"]["h200"]
        h200["ami_type"] = "BOTTLEROCKET_x86_64_NVIDIA"
        h200["local_nvme"] = {"enabled": False}  # local NVMe is AL2023 only (issue 34)
        h200["taints"] = [{"key": "dedicated", "value": "h200", "effect": "NoSchedule"}]
        values["addons"] = {
            "keda": True,
            "argo_rollouts": True,
            "nvidia_device_plugin": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
            },
        }

    config = load_variant(tmp_path, bottlerocket_h200_with_own_taint, base="prod")
    assert device_plugin_groups(config.node_groups.gpu) == ["l40s"]
