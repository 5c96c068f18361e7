"""What the charts themselves create, rendered by Helm's own engine (components/helm/engine.py),
checked across components: checks that were impossible while a release was only its values.

- nothing we install depends on a Helm hook (helm.v4.Chart does not run hooks);
- every GPU DaemonSet tolerates every GPU group's taints and runs on GPU nodes only; every node
  agent whose volumes vLLM pods mount runs on GPU nodes too;
- the Prometheus the chart creates selects our PodMonitor and the DCGM exporter's ServiceMonitor;
- the adapter registers `custom.metrics.k8s.io` and serves every metric an HPA of ours reads;
- each component's RBAC grants what its pinned image needs (the autoscaler's volumeattachments);
- every custom resource, ours and the charts', validates against the CRD schema of the chart that
  installs it (a real JSON-schema validator over the CRD's openAPIV3Schema).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
import pytest

from components.helm.engine import ChartObject, chart_crds
from components.helm.lock import CHARTS_DIR, load_lock
from components.scheduling import untolerated_taints
from infra.render import RenderResult
from tests.conftest import STACKS, TEST_STACKS_DIR, rendered
from tests.test_addons_cluster import config_of

ALL_STACKS = [*STACKS, "existing"]


def _render(stack: str) -> RenderResult:
    return rendered(stack, TEST_STACKS_DIR / "Pulumi.existing.yaml" if stack == "existing" else None)


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


@pytest.mark.parametrize("stack", ["staging", "prod"])  # dev's models have fixed replicas
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


# --- custom resources against the CRDs of the pinned charts ----------------------------------------


@functools.cache
def _vendored_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Every CRD the vendored charts define, keyed (group, kind): their crds/ files, plus the CRDs
    rendered from templates in the prod stack (KEDA, the load balancer controller ship them there)."""
    found = [crd for name in load_lock() for crd in chart_crds(CHARTS_DIR / name)]
    found += [item.object for item in _objects(_render("prod"), kind="CustomResourceDefinition")]
    crds: dict[tuple[str, str], dict[str, Any]] = {}
    for crd in found:
        crds.setdefault((crd["spec"]["group"], crd["spec"]["names"]["kind"]), crd)
    return crds


def _schema_for(obj: Mapping[str, Any]) -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    crd = _vendored_crds().get((group, obj["kind"]))
    assert crd is not None, f"no vendored chart defines {obj['kind']}.{group}"
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert entry.get("served", True), f"{obj['kind']}.{group}/{version} is not served by the pinned chart"
    return entry["schema"]["openAPIV3Schema"]


def _custom_resources(result: RenderResult) -> list[dict[str, Any]]:
    builtin = (
        "v1",
        "apps/",
        "batch/",
        "policy/",
        "rbac.",
        "networking.k8s.io/",
        "storage.k8s.io/",
        "scheduling.k8s.io/",
        "autoscaling/",
        "apiextensions.k8s.io/",
        "apiregistration.k8s.io/",
        "admissionregistration.k8s.io/",
        "coordination.k8s.io/",
        "node.k8s.io/",
        "discovery.k8s.io/",
    )
    return [obj for obj in result.all_kubernetes_objects if not obj["apiVersion"].startswith(builtin)]


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_every_custom_resource_validates_against_its_pinned_crd_schema(stack: str) -> None:
    resources = _custom_resources(_render(stack))
    assert resources
    problems = []
    for obj in resources:
        schema = _schema_for(obj)
        validator = jsonschema.Draft7Validator(schema)
        for error in validator.iter_errors(obj):
            where = ".".join(str(part) for part in error.absolute_path)
            problems.append(f"{obj['kind']} {obj['metadata'].get('name')}: {where}: {error.message}")
    assert not problems, "\n".join(problems)


def test_the_crd_check_catches_a_misspelt_field() -> None:
    (pod_monitor,) = [m for m in _render("prod").find("PodMonitor") if m["metadata"]["name"] == "vllm"]
    broken = {**pod_monitor, "spec": {**pod_monitor["spec"], "podMetricsEndpoints": [{"port": 8000}]}}
    errors = list(jsonschema.Draft7Validator(_schema_for(broken)).iter_errors(broken))
    assert errors, "a numeric port name must fail the PodMonitor schema"


def test_the_vendored_crds_were_found() -> None:
    kinds = {kind for _, kind in _vendored_crds()}
    assert {
        "PodMonitor",
        "ServiceMonitor",
        "Prometheus",
        "ScaledObject",
        "SecretProviderClass",
    } <= kinds
