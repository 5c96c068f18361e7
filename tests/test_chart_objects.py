"""What the charts themselves create, rendered by Helm's own engine (components/helm/engine.py),
checked across components: checks that were impossible while a release was only its values.

- nothing we install depends on a Helm hook (helm.v4.Chart does not run hooks);
- every GPU DaemonSet tolerates every GPU group's taints and runs on GPU nodes only; every node
  agent whose volumes vLLM pods mount runs on GPU nodes too;
- the Prometheus the chart creates selects our PodMonitor and the DCGM exporter's ServiceMonitor;
- the adapter registers `custom.metrics.k8s.io` and serves every metric an HPA of ours reads;
- each component's RBAC grants what its pinned image needs (the autoscaler's volumeattachments).

Every test here needs the chart templates, so the pinned charts in the chart cache
(`vllm-platform charts pull`); without them each is skipped with that reason. The custom resources'
CRD schemas need only the charts' data: tests/test_custom_resources.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from components.helm.engine import ChartObject
from components.scheduling import untolerated_taints
from infra.render import RenderResult
from tests.conftest import EXAMPLE_STACKS, STACKS, TEST_STACKS_DIR, rendered
from tests.support.charts import require_charts
from tests.test_addons_cluster import config_of

ALL_STACKS = [*STACKS, *EXAMPLE_STACKS, "existing"]
# `existing` is of tests/stacks/; the shipped `multinode` adds the LWS controller and the EFA device plugin.
TEST_STACK_FILES = {"existing": "Pulumi.existing.yaml"}


def _render(stack: str) -> RenderResult:
    require_charts()
    return rendered(stack, TEST_STACKS_DIR / TEST_STACK_FILES[stack] if stack in TEST_STACK_FILES else None)


def _objects(result: RenderResult, release: str | None = None, kind: str | None = None) -> list[ChartObject]:
    return [
        item
        for item in result.chart_objects
        if (release is None or item.release == release) and (kind is None or item.kind == kind)
    ]


def _pod_spec(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def _required_gpu_groups(pod_spec: Mapping[str, Any]) -> set[str] | None:
    """The GPU groups a pod is confined to by required node affinity on our group label, if any."""
    terms = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    groups: set[str] = set()
    for term in terms:
        for expression in term.get("matchExpressions") or []:
            if expression["key"] == "vllm-platform/gpu-group" and expression["operator"] == "In":
                groups.update(expression["values"])
    return groups or None


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_no_chart_object_is_a_helm_hook_that_helm_v4_chart_would_drop(stack: str) -> None:
    hooks = [
        f"{item.release}: {item.kind} {item.name} ({item.template})"
        for item in _render(stack).chart_objects
        if item.is_hook
    ]
    assert not hooks, "helm.v4.Chart does not run Helm hooks; turn these off through values: " + "; ".join(
        hooks
    )


GPU_DAEMONSET_RELEASES = ("nvidia-device-plugin", "dcgm-exporter")
# DaemonSets whose volumes (CSI mounts, secrets) or metrics every vLLM pod's node needs.
NODE_AGENTS = {
    ("aws-efs-csi-driver", "efs-csi-node"),
    ("secrets-store-csi-driver", "secrets-store-csi-driver"),
    ("secrets-store-csi-driver-provider-aws", "secrets-store-csi-driver-provider-aws"),
    ("kube-prometheus-stack", "kube-prometheus-stack-prometheus-node-exporter"),
}


def test_every_gpu_daemonset_tolerates_every_gpu_taint_and_runs_on_gpu_nodes_only(
    stack_render: RenderResult,
) -> None:
    require_charts()
    config = config_of(stack_render)
    groups = config.node_groups.gpu
    daemonsets = [
        item for release in GPU_DAEMONSET_RELEASES for item in _objects(stack_render, release, "DaemonSet")
    ]
    names = {item.name for item in daemonsets}
    # The device plugin, GPU feature discovery and NFD's worker, DCGM's exporter: all of them seen.
    assert {
        "nvidia-device-plugin",
        "dcgm-exporter",
        "nvidia-device-plugin-node-feature-discovery-worker",
        "nvidia-device-plugin-gpu-feature-discovery",
    } <= names
    for item in daemonsets:
        spec = _pod_spec(item.object)
        targets = _required_gpu_groups(spec)
        assert targets and targets <= set(groups), f"{item.name} must be confined to GPU groups: {targets}"
        for group_name in targets:
            missing = untolerated_taints(spec.get("tolerations") or [], groups[group_name].taints)
            assert not missing, f"{item.name} does not tolerate {missing} of GPU group {group_name}"


def test_node_agents_that_vllm_pods_need_run_on_gpu_nodes_too(stack_render: RenderResult) -> None:
    require_charts()
    groups = config_of(stack_render).node_groups.gpu
    found = {(item.release, item.name): item for item in _objects(stack_render, kind="DaemonSet")}
    present = [key for key in NODE_AGENTS if key[0] in {r["name"] for r in stack_render.helm_releases}]
    assert present
    for key in present:
        spec = _pod_spec(found[key].object)
        for group_name, group in groups.items():
            missing = untolerated_taints(spec.get("tolerations") or [], group.taints)
            assert not missing, f"{key[1]} would not run on GPU group {group_name}: {missing}"


def _selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics; an empty selector selects everything, a null one nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if (operator == "In" and labels.get(key) not in values) or (
            operator == "NotIn" and labels.get(key) in values
        ):
            return False
        if (operator == "Exists" and key not in labels) or (operator == "DoesNotExist" and key in labels):
            return False
    return True


@pytest.mark.parametrize("stack", STACKS)
def test_the_charts_prometheus_selects_our_pod_monitor_and_the_dcgm_service_monitor(stack: str) -> None:
    result = _render(stack)
    (prometheus,) = [item.object for item in _objects(result, "kube-prometheus-stack", "Prometheus")]
    spec = prometheus["spec"]
    monitors = [("PodMonitor", obj) for obj in result.find("PodMonitor")]
    monitors += [
        ("ServiceMonitor", item.object) for item in _objects(result, "dcgm-exporter", "ServiceMonitor")
    ]
    assert {kind for kind, _ in monitors} == {"PodMonitor", "ServiceMonitor"}
    for kind, monitor in monitors:
        field = "podMonitor" if kind == "PodMonitor" else "serviceMonitor"
        labels = monitor["metadata"].get("labels") or {}
        # An empty namespace selector is every namespace; the monitors live in ours.
        assert _selects(spec.get(f"{field}NamespaceSelector"), {}), f"{field}NamespaceSelector"
        assert _selects(spec.get(f"{field}Selector"), labels), (
            f"Prometheus does not select {kind} {monitor['metadata']['name']} (labels {labels})"
        )


# dev's models have fixed replicas, staging's scale on KEDA (the default backend): prod has HPAs.
@pytest.mark.parametrize("stack", ["prod"])
def test_the_adapter_serves_every_pod_metric_our_hpas_read(stack: str) -> None:
    import yaml

    result = _render(stack)
    (api_service,) = [
        item.object
        for item in _objects(result, "prometheus-adapter", "APIService")
        if item.object["spec"]["group"] == "custom.metrics.k8s.io"
    ]
    service = api_service["spec"]["service"]
    assert [
        item
        for item in _objects(result, "prometheus-adapter", "Service")
        if item.name == service["name"] and item.namespace == service["namespace"]
    ]
    (config_map,) = [item.object for item in _objects(result, "prometheus-adapter", "ConfigMap")]
    served = {rule["name"]["as"] for rule in yaml.safe_load(config_map["data"]["config.yaml"])["rules"]}
    wanted = {
        metric["pods"]["metric"]["name"]
        for hpa in result.find("HorizontalPodAutoscaler")
        for metric in hpa["spec"]["metrics"]
        if metric["type"] == "Pods"
    }
    assert wanted, "the test needs a stack with an HPA on a pod metric"
    assert wanted <= served, f"the adapter does not serve {wanted - served}"


def _granted(roles: Iterable[Mapping[str, Any]], group: str, resource: str, verb: str) -> bool:
    for role in roles:
        for rule in role.get("rules") or []:
            if rule.get("resourceNames"):
                continue
            if (
                (group in rule.get("apiGroups", []) or "*" in rule.get("apiGroups", []))
                and (resource in rule.get("resources", []) or "*" in rule.get("resources", []))
                and (verb in rule.get("verbs", []) or "*" in rule.get("verbs", []))
            ):
                return True
    return False


# What each pinned image reads or writes, from its own source at the pinned release (the chart's RBAC
# has lagged before: autoscaler chart 9.43.2 lacked volumeattachments, which the 1.32+ scheduler
# framework lists: kubernetes/autoscaler#7663, #8678).
REQUIRED_PERMISSIONS: dict[str, list[tuple[str, str, str]]] = {
    "cluster-autoscaler": [
        ("storage.k8s.io", "volumeattachments", "list"),
        ("storage.k8s.io", "volumeattachments", "watch"),
        ("storage.k8s.io", "csinodes", "watch"),
        ("storage.k8s.io", "csidrivers", "watch"),
        ("storage.k8s.io", "csistoragecapacities", "watch"),
        ("", "nodes", "update"),
        ("", "pods/eviction", "create"),
        ("policy", "poddisruptionbudgets", "watch"),
        ("resource.k8s.io", "resourceslices", "watch"),
        ("coordination.k8s.io", "leases", "create"),
    ],
    # It maps each series' `namespace`/`pod` labels to objects (custom metrics API, pods resource).
    "prometheus-adapter": [("", "pods", "list"), ("", "namespaces", "get")],
}


@pytest.mark.parametrize("release", ["cluster-autoscaler", "prometheus-adapter"])
def test_each_components_rbac_grants_what_its_pinned_image_needs(release: str) -> None:
    result = _render("prod")
    roles = [item.object for item in _objects(result, release) if item.kind in ("ClusterRole", "Role")]
    assert roles
    missing = [need for need in REQUIRED_PERMISSIONS[release] if not _granted(roles, *need)]
    assert not missing, f"{release}'s chart RBAC lacks {missing}"


def test_the_rbac_check_catches_the_autoscaler_chart_that_lacked_volumeattachments() -> None:
    (role,) = [item.object for item in _objects(_render("prod"), "cluster-autoscaler", "ClusterRole")]
    stripped = {
        **role,
        "rules": [
            {**rule, "resources": [r for r in rule["resources"] if r != "volumeattachments"]}
            for rule in role["rules"]
        ],
    }
    assert not _granted([stripped], "storage.k8s.io", "volumeattachments", "list")
