"""The policy pack (policy/): each rule on hand-built resources, the pack as the Pulumi engine talks
to it (gRPC), and every rule over every stack's real render.

The pack is never constructed in this process (its constructor serves forever): rules are plain
functions, and the served pack runs as a subprocess the engine's way, `python policy/__main__.py`.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from domain.labels import GPU_GROUP_LABEL
from infra.render import RenderResult
from policy import pulumi_adapter
from policy import vllm_policies as rules
from policy.vllm_policies import PolicySettings, Resource
from tests.conftest import EXAMPLE_STACKS, REPO_ROOT, STACKS, TEST_STACKS_DIR, rendered

SETTINGS = PolicySettings()
DEPLOYMENT_TYPE = "kubernetes:apps/v1:Deployment"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def kube(kind: str, name: str, namespace: str | None = "vllm-m", **fields: Any) -> Resource:
    api = {
        "Deployment": "apps/v1",
        "HorizontalPodAutoscaler": "autoscaling/v2",
        "ScaledObject": "keda.sh/v1alpha1",
        "PodDisruptionBudget": "policy/v1",
        "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
    }.get(kind, "v1")
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    group, _, version = api.rpartition("/")
    token = f"kubernetes:{group.split('.')[0] or 'core'}/{version}:{kind}"
    return Resource(
        token,
        f"{namespace}-{name}",
        {"apiVersion": api, "kind": kind, "metadata": metadata, **fields},
        urn=f"urn:pulumi:test::vllm-platform::{token}::{namespace}-{name}",
    )


def vllm_container(**changes: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "vllm",
        "image": "vllm/vllm-openai:v0.32.0",
        "args": ["/models/qwen", "--port", "8000", "--shutdown-timeout", "120"],
        "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "4"}, "limits": {"nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "startupProbe": {
            "httpGet": {"path": "/health", "port": 8000},
            "failureThreshold": 90,
            "periodSeconds": 10,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": 15}}},
    }
    container.update(changes)
    return container


def vllm_pod_spec(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [vllm_container()],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}],
        "nodeSelector": {GPU_GROUP_LABEL: "l40s"},
        "tolerations": [GPU_TOLERATION],
        "terminationGracePeriodSeconds": 150,
    }
    spec.update(changes)
    return spec


def vllm_deployment(name: str = "vllm", *, replicas: int | None = None, **pod_changes: Any) -> Resource:
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    spec: dict[str, Any] = {
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": vllm_pod_spec(**pod_changes)},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return kube("Deployment", name, spec=spec)


def vllm_leader_worker_set(
    name: str = "vllm", *, replicas: int = 1, size: int = 2, worker: dict[str, Any] | None = None
) -> Resource:
    """A multi-node model's LeaderWorkerSet as the stack renders it: the leader with the probes, the
    worker the same server `--headless` without them."""
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": name}
    headless = vllm_container(args=[*vllm_container()["args"], "--headless"])
    del headless["startupProbe"]
    return kube(
        "LeaderWorkerSet",
        name,
        spec={
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": {"metadata": {"labels": labels}, "spec": vllm_pod_spec()},
                "workerTemplate": {
                    "metadata": {"labels": labels},
                    "spec": worker if worker is not None else vllm_pod_spec(containers=[headless]),
                },
            },
        },
    )


def with_container(**changes: Any) -> Resource:
    return vllm_deployment(containers=[vllm_container(**changes)])


def node_group(name: str, labels: dict[str, str], taints: list[dict[str, str]]) -> Resource:
    return Resource(
        rules.EKS_NODE_GROUP_TYPE, name, {"nodeGroupName": name, "labels": labels, "taints": taints}
    )


def hpa(target: str, min_replicas: int = 1) -> Resource:
    return kube(
        "HorizontalPodAutoscaler",
        target,
        spec={
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": min_replicas,
            "maxReplicas": 4,
            "metrics": [],
        },
    )


def pdb(**spec: Any) -> Resource:
    selector = {"matchLabels": {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/instance": "vllm"}}
    return kube("PodDisruptionBudget", "vllm", spec={"selector": selector, **spec})


def messages(check: Any, resource: Resource, settings: PolicySettings = SETTINGS) -> list[str]:
    return check(resource, settings)


def stack_messages(check: Any, resources: list[Resource]) -> list[str]:
    return [str(v) for v in check(resources, SETTINGS)]


# --- the reference pod passes every rule -------------------------------------------------------------


def test_a_well_formed_vllm_deployment_passes_every_rule() -> None:
    resources = [
        vllm_deployment(),
        hpa("vllm", min_replicas=2),
        pdb(maxUnavailable=1, unhealthyPodEvictionPolicy="AlwaysAllow"),
        node_group(
            "l40s",
            {GPU_GROUP_LABEL: "l40s"},
            [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}],
        ),
    ]
    assert rules.run_rules(resources) == []


# --- GPU placement ------------------------------------------------------------------------------------


def test_gpu_pod_without_gpu_toleration_is_reported() -> None:
    found = messages(rules.check_gpu_pods_target_gpu_nodes, vllm_deployment(tolerations=[]))
    assert len(found) == 1
    assert "does not tolerate the GPU taint 'nvidia.com/gpu'" in found[0]


def test_gpu_pod_without_node_selector_or_affinity_is_reported() -> None:
    found = messages(rules.check_gpu_pods_target_gpu_nodes, vllm_deployment(nodeSelector={}))
    assert found and "no nodeSelector or required node affinity" in found[0]


def test_gpu_pod_placed_by_required_node_affinity_and_wildcard_toleration_passes() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": GPU_GROUP_LABEL, "operator": "In", "values": ["l40s"]}]}
                ]
            }
        }
    }
    deployment = vllm_deployment(nodeSelector={}, affinity=affinity, tolerations=[{"operator": "Exists"}])
    assert messages(rules.check_gpu_pods_target_gpu_nodes, deployment) == []


def test_gpu_toleration_for_another_effect_does_not_count() -> None:
    toleration = {**GPU_TOLERATION, "effect": "NoExecute"}
    assert messages(rules.check_gpu_pods_target_gpu_nodes, vllm_deployment(tolerations=[toleration]))


def test_gpu_taint_keys_come_from_policy_config() -> None:
    settings = pulumi_adapter.settings_from_config({"gpuTaintKeys": ["example.com/accelerator"]})
    found = messages(rules.check_gpu_pods_target_gpu_nodes, vllm_deployment(), settings)
    assert found == [
        "requests nvidia.com/gpu but does not tolerate the GPU taint 'example.com/accelerator' "
        "(effect NoSchedule); add the toleration of its GPU group's taint or the pod stays Pending"
    ]
    assert pulumi_adapter.settings_from_config({}) == PolicySettings()


def test_pods_without_gpus_need_no_gpu_placement() -> None:
    cpu_only = vllm_container(resources={"requests": {"cpu": "1"}}, image="busybox:1.37")
    assert (
        messages(
            rules.check_gpu_pods_target_gpu_nodes,
            vllm_deployment(containers=[cpu_only], nodeSelector={}, tolerations=[]),
        )
        == []
    )


GPU_GROUPS = [
    node_group(
        "l40s",
        {GPU_GROUP_LABEL: "l40s"},
        [
            {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"},
            {"key": "spot", "value": "", "effect": "PREFER_NO_SCHEDULE"},
        ],
    ),
    node_group(
        "h200",
        {GPU_GROUP_LABEL: "h200"},
        [{"key": "nvidia.com/gpu", "value": "h200", "effect": "NO_SCHEDULE"}],
    ),
]


def test_gpu_pod_tolerating_its_node_groups_hard_taints_passes() -> None:
    assert (
        stack_messages(rules.check_gpu_pods_tolerate_node_group_taints, [*GPU_GROUPS, vllm_deployment()])
        == []
    )


def test_gpu_pod_with_a_toleration_value_its_node_group_does_not_use_is_reported() -> None:
    deployment = vllm_deployment(nodeSelector={GPU_GROUP_LABEL: "h200"})
    found = stack_messages(rules.check_gpu_pods_tolerate_node_group_taints, [*GPU_GROUPS, deployment])
    assert found == [
        "Deployment vllm-m/vllm: does not tolerate taint nvidia.com/gpu=h200:NoSchedule of node group h200; "
        "add the toleration from components/scheduling.py (gpu_group_tolerations) or the pod stays Pending"
    ]


def test_gpu_pod_selecting_no_node_group_of_the_stack_is_reported() -> None:
    deployment = vllm_deployment(nodeSelector={GPU_GROUP_LABEL: "a100"})
    found = stack_messages(rules.check_gpu_pods_tolerate_node_group_taints, [*GPU_GROUPS, deployment])
    assert len(found) == 1 and "matches no node group of the stack (l40s, h200)" in found[0]


def test_node_group_taints_are_not_checked_without_node_groups_in_the_stack() -> None:
    # Mode `existing`: the cluster's node groups are not resources of the stack.
    assert (
        stack_messages(rules.check_gpu_pods_tolerate_node_group_taints, [vllm_deployment(tolerations=[])])
        == []
    )


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (
            {"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"},
            ("k", "v", "NoSchedule"),
            True,
        ),
        ({"key": "k", "value": "v"}, ("k", "v", "NoExecute"), True),  # empty effect matches all effects
        ({"key": "k", "value": "other"}, ("k", "v", "NoSchedule"), False),
        ({"key": "k", "operator": "Exists"}, ("k", "anything", "NoSchedule"), True),
        ({"operator": "Exists"}, ("any", "v", "NoExecute"), True),
        ({"key": "other", "operator": "Exists"}, ("k", "v", "NoSchedule"), False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, ("k", "v", "NoSchedule"), False),
    ],
)
def test_tolerations_match_taints_as_kubernetes_does(toleration: dict, taint: tuple, expected: bool) -> None:
    assert rules.tolerates(toleration, *taint) is expected


# --- GPU request = limit --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resources",
    [
        {"limits": {"nvidia.com/gpu": "1"}},
        {"requests": {"nvidia.com/gpu": "1"}},
        {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}},
    ],
    ids=["limit-only", "request-only", "request-below-limit"],
)
def test_gpu_request_differing_from_limit_is_reported(resources: dict) -> None:
    found = messages(rules.check_gpu_request_equals_limit, with_container(resources=resources))
    assert len(found) == 1 and "container 'vllm' has nvidia.com/gpu request" in found[0]


def test_gpu_request_equal_to_limit_passes_also_as_the_engines_floats() -> None:
    # The engine hands the pack every number as a float.
    resources = {"requests": {"nvidia.com/gpu": 2.0}, "limits": {"nvidia.com/gpu": "2"}}
    assert messages(rules.check_gpu_request_equals_limit, with_container(resources=resources)) == []


# --- vLLM pod: /dev/shm, startupProbe, drain time ----------------------------------------------------


def test_vllm_pod_without_shm_is_reported_also_at_tensor_parallel_one() -> None:
    found = messages(rules.check_vllm_pods_start_and_drain_safely, with_container(volumeMounts=[]))
    assert len(found) == 1 and "no memory-backed /dev/shm" in found[0]


def test_vllm_pod_with_disk_backed_shm_is_reported() -> None:
    deployment = vllm_deployment(volumes=[{"name": "dshm", "emptyDir": {}}])
    assert (
        "no memory-backed /dev/shm" in messages(rules.check_vllm_pods_start_and_drain_safely, deployment)[0]
    )


def test_vllm_pod_without_startup_probe_is_reported() -> None:
    container = vllm_container()
    del container["startupProbe"]
    found = messages(rules.check_vllm_pods_start_and_drain_safely, vllm_deployment(containers=[container]))
    assert len(found) == 1 and "no startupProbe" in found[0]


@pytest.mark.parametrize(
    "grace", [135, 100, None], ids=["equal-to-sum", "below-sum", "kubernetes-default-30"]
)
def test_grace_period_not_longer_than_pre_stop_plus_shutdown_timeout_is_reported(grace: int | None) -> None:
    deployment = vllm_deployment(terminationGracePeriodSeconds=grace)
    if grace is None:
        del deployment.props["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    found = messages(rules.check_vllm_pods_start_and_drain_safely, deployment)
    assert len(found) == 1
    assert (
        f"terminationGracePeriodSeconds {grace or 30} is not longer than the preStop sleep (15s)" in found[0]
    )
    assert "set it above 135" in found[0]


def test_exec_pre_stop_sleep_and_inline_shutdown_timeout_are_read() -> None:
    container = vllm_container(
        args=["/models/qwen", "--shutdown-timeout=200"],
        lifecycle={"preStop": {"exec": {"command": ["/bin/sh", "-c", "sleep 20"]}}},
    )
    found = messages(rules.check_vllm_pods_start_and_drain_safely, vllm_deployment(containers=[container]))
    assert found and "preStop sleep (20s) plus --shutdown-timeout (200s); set it above 220" in found[0]


def test_vllm_pod_without_shutdown_timeout_is_reported() -> None:
    found = messages(rules.check_vllm_pods_start_and_drain_safely, with_container(args=["/models/qwen"]))
    assert found == [
        "vLLM container 'vllm' does not pass --shutdown-timeout; set it so in-flight (streaming) "
        "requests finish on rollouts and scale-in"
    ]


@pytest.mark.parametrize(
    "container",
    [
        {"name": "a", "image": "registry.example.com:5000/vllm/vllm-openai:v0.32.0"},
        {"name": "b", "image": "example.com/custom:1.0", "command": ["vllm", "serve", "/models/x"]},
        {
            "name": "c",
            "image": "example.com/custom:1.0",
            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        },
    ],
)
def test_vllm_servers_are_recognised_by_image_or_command(container: dict) -> None:
    assert rules.is_vllm_container(container)


def test_other_containers_are_not_held_to_the_vllm_pod_rules() -> None:
    sidecar = {"name": "exporter", "image": "example.com/exporter:1.2.3"}
    deployment = vllm_deployment(containers=[sidecar], volumes=[], terminationGracePeriodSeconds=5)
    assert messages(rules.check_vllm_pods_start_and_drain_safely, deployment) == []


# --- autoscalers own replicas -------------------------------------------------------------------------


def test_deployment_setting_replicas_under_an_hpa_is_reported() -> None:
    found = stack_messages(
        rules.check_autoscaled_workloads_omit_replicas, [vllm_deployment(replicas=2), hpa("vllm")]
    )
    assert len(found) == 1
    assert found[0].startswith(
        "Deployment vllm-m/vllm: sets spec.replicas although HorizontalPodAutoscaler vllm-m/vllm"
    )


def test_deployment_setting_replicas_under_a_keda_scaled_object_is_reported() -> None:
    scaled = kube("ScaledObject", "vllm", spec={"scaleTargetRef": {"name": "vllm"}, "triggers": []})
    found = stack_messages(
        rules.check_autoscaled_workloads_omit_replicas, [vllm_deployment(replicas=1), scaled]
    )
    assert len(found) == 1 and "ScaledObject vllm-m/vllm owns its replica count" in found[0]


def test_replicas_set_at_creation_only_under_a_scaled_object_pass() -> None:
    # A to-zero model is created at 0 and ignores the field afterwards (issue 40): no `up` resets it.
    scaled = kube("ScaledObject", "vllm", spec={"scaleTargetRef": {"name": "vllm"}, "triggers": []})
    created_at_zero = vllm_deployment(replicas=0)
    ignored = Resource(
        created_at_zero.type, created_at_zero.name, created_at_zero.props, "", ("spec.replicas",)
    )
    check = rules.check_autoscaled_workloads_omit_replicas
    assert stack_messages(check, [ignored, scaled]) == []
    assert stack_messages(check, [created_at_zero, scaled])


def test_deployment_without_replicas_under_an_hpa_passes() -> None:
    assert (
        stack_messages(rules.check_autoscaled_workloads_omit_replicas, [vllm_deployment(), hpa("vllm")]) == []
    )


def test_fixed_replicas_without_an_autoscaler_pass() -> None:
    assert stack_messages(rules.check_autoscaled_workloads_omit_replicas, [vllm_deployment(replicas=3)]) == []


def test_hpa_targeting_a_deployment_the_stack_lacks_is_reported() -> None:
    found = stack_messages(rules.check_autoscaled_workloads_omit_replicas, [vllm_deployment(), hpa("vlm")])
    assert found == [
        "HorizontalPodAutoscaler vllm-m/vlm: scales Deployment vllm-m/vlm, which the stack does not "
        "define; fix scaleTargetRef"
    ]


def _live(deployment: Resource, pulumi_owns_replicas: bool) -> Resource:
    """A deployed object as stack policies see it: the API server filled spec.replicas."""
    props = copy.deepcopy(dict(deployment.props))
    props["spec"]["replicas"] = 3
    pulumi_fields: dict[str, Any] = {"f:spec": {"f:template": {}}}
    if pulumi_owns_replicas:
        pulumi_fields["f:spec"]["f:replicas"] = {}
    props["metadata"]["managedFields"] = [
        {"manager": "pulumi-kubernetes-6f3c1a", "operation": "Apply", "fieldsV1": pulumi_fields},
        {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "subresource": "scale",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
        },
    ]
    return Resource(deployment.type, deployment.name, props, deployment.urn)


def test_live_deployment_is_judged_by_what_pulumi_applied_not_by_server_defaults() -> None:
    check = rules.check_autoscaled_workloads_omit_replicas
    assert stack_messages(check, [_live(vllm_deployment(), pulumi_owns_replicas=False), hpa("vllm")]) == []
    assert stack_messages(check, [_live(vllm_deployment(), pulumi_owns_replicas=True), hpa("vllm")])


# --- pinned images and charts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:latest",
        "vllm/vllm-openai",
        "registry:5000/vllm-openai",
        "vllm/vllm-openai:nightly",
        "",
    ],
)
def test_unpinned_images_are_reported(image: str) -> None:
    found = messages(rules.check_images_pinned, with_container(image=image))
    assert found == [
        f"container 'vllm' image '{image}' is not pinned to a version; use a versioned tag or a "
        "digest (pins live in domain/versions.py)"
    ]


@pytest.mark.parametrize(
    "image",
    ["vllm/vllm-openai:v0.32.0", "registry:5000/model-cache:0.1.0", "vllm/vllm-openai@sha256:" + "a" * 64],
)
def test_versioned_or_digest_images_pass(image: str) -> None:
    assert messages(rules.check_images_pinned, with_container(image=image)) == []


def test_init_container_images_are_checked_too() -> None:
    deployment = vllm_deployment(
        initContainers=[{"name": "preload", "image": "ghcr.io/x/model-cache:latest"}]
    )
    assert messages(rules.check_images_pinned, deployment) == [
        "container 'preload' image 'ghcr.io/x/model-cache:latest' is not pinned to a version; use a "
        "versioned tag or a digest (pins live in domain/versions.py)"
    ]


@pytest.mark.parametrize(
    ("version", "pinned"),
    [
        ("0.17.1", True),
        ("v1.2.3", True),
        ("", False),
        ("^0.17", False),
        ("~1.2", False),
        (">=1.0", False),
        ("1.x", False),
    ],
)
def test_helm_releases_pin_an_exact_chart_version(version: str, pinned: bool) -> None:
    release = Resource(rules.HELM_RELEASE_TYPE, "dcgm", {"chart": "dcgm-exporter", "version": version})
    assert (messages(rules.check_helm_charts_pinned, release) == []) is pinned


@pytest.mark.parametrize(
    ("inputs", "cached"),
    [
        ({"chart": "/home/u/.cache/vllm-platform/charts/dcgm-exporter-4.8.2/dcgm-exporter"}, True),
        ({"chart": "/ci/chart-cache/dcgm-exporter-4.8.2/dcgm-exporter/"}, True),
        ({"chart": "charts/dcgm-exporter"}, False),
        ({"chart": "/tmp/dcgm-exporter/dcgm-exporter"}, False),
        (
            {"chart": "dcgm-exporter", "repositoryOpts": {"repo": "https://nvidia.github.io/dcgm-exporter"}},
            False,
        ),
        ({"chart": "oci://registry.example.com/charts/dcgm-exporter"}, False),
        ({"chart": "nvidia/dcgm-exporter"}, False),
    ],
)
def test_helm_v4_charts_come_from_the_verified_chart_cache(inputs: dict, cached: bool) -> None:
    chart = Resource(rules.HELM_CHART_TYPE, "dcgm-exporter", inputs)
    assert (messages(rules.check_helm_charts_pinned, chart) == []) is cached


@pytest.mark.parametrize(
    ("reference", "parsed"),
    [
        ("vllm/vllm-openai:v0.32.0", ("vllm/vllm-openai", "v0.32.0", None)),
        ("registry:5000/team/image", ("registry:5000/team/image", None, None)),
        ("registry:5000/team/image:1.0@sha256:ab", ("registry:5000/team/image", "1.0", "sha256:ab")),
    ],
)
def test_image_references_split_into_repository_tag_and_digest(reference: str, parsed: tuple) -> None:
    assert rules.parse_image(reference) == parsed


# --- PodDisruptionBudgets do not block drains ----------------------------------------------------------


def test_pdb_allowing_one_eviction_and_evicting_unhealthy_pods_passes() -> None:
    resources = [vllm_deployment(replicas=2), pdb(minAvailable=1, unhealthyPodEvictionPolicy="AlwaysAllow")]
    assert stack_messages(rules.check_pdbs_allow_node_drains, resources) == []


@pytest.mark.parametrize(
    ("replicas", "spec"),
    [
        (1, {"minAvailable": 1}),
        (2, {"minAvailable": 2}),
        (3, {"minAvailable": "100%"}),
        (2, {"maxUnavailable": 0}),
        (2, {"maxUnavailable": "0%"}),
    ],
)
def test_pdb_allowing_no_eviction_is_reported(replicas: int, spec: dict) -> None:
    resources = [vllm_deployment(replicas=replicas), pdb(**spec, unhealthyPodEvictionPolicy="AlwaysAllow")]
    found = stack_messages(rules.check_pdbs_allow_node_drains, resources)
    assert len(found) == 1 and f"allows no disruption at {replicas} replica(s)" in found[0]


def test_pdb_is_judged_at_the_autoscalers_minimum() -> None:
    spec = {"minAvailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    assert (
        stack_messages(rules.check_pdbs_allow_node_drains, [vllm_deployment(), hpa("vllm", 2), pdb(**spec)])
        == []
    )
    assert stack_messages(
        rules.check_pdbs_allow_node_drains, [vllm_deployment(), hpa("vllm", 1), pdb(**spec)]
    )


def test_protecting_pdb_without_always_allow_is_reported() -> None:
    found = stack_messages(
        rules.check_pdbs_allow_node_drains, [vllm_deployment(replicas=3), pdb(maxUnavailable=1.0)]
    )
    assert len(found) == 1 and "unhealthyPodEvictionPolicy is not AlwaysAllow" in found[0]


def test_pdb_that_protects_nothing_needs_no_eviction_policy() -> None:
    assert (
        stack_messages(rules.check_pdbs_allow_node_drains, [vllm_deployment(replicas=1), pdb(minAvailable=0)])
        == []
    )


def test_pdb_selecting_no_workload_is_reported() -> None:
    orphan = kube(
        "PodDisruptionBudget",
        "orphan",
        spec={"selector": {"matchLabels": {"app": "nothing"}}, "maxUnavailable": 1},
    )
    found = stack_messages(rules.check_pdbs_allow_node_drains, [vllm_deployment(replicas=2), orphan])
    assert found == [
        "PodDisruptionBudget vllm-m/orphan: its selector matches no workload of the stack; fix spec.selector"
    ]


# --- no secrets in literals ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["VLLM_API_KEY", "HF_TOKEN", "DB_PASSWORD", "CLIENT_SECRET", "OPENAI_APIKEY"]
)
def test_secret_named_env_with_a_literal_value_is_reported(name: str) -> None:
    found = messages(rules.check_no_secret_literals, with_container(env=[{"name": name, "value": "abc123"}]))
    assert len(found) == 1 and f"sets env {name} to a literal value" in found[0]


def test_credential_shaped_literal_is_reported_whatever_its_name() -> None:
    env = [{"name": "EXTRA", "value": "hf_" + "a" * 34}]
    assert messages(rules.check_no_secret_literals, with_container(env=env))


@pytest.mark.parametrize(
    "env",
    [
        {"name": "VLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "vllm-api-key", "key": "value"}}},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/hf/token"},
        {"name": "API_KEY_SECRET_NAME", "value": "vllm-platform/dev/qwen/api-key"},
        {"name": "KEYSPACE", "value": "models"},
    ],
)
def test_secret_references_and_innocent_names_pass(env: dict) -> None:
    assert messages(rules.check_no_secret_literals, with_container(env=[env])) == []


@pytest.mark.parametrize(
    "data",
    [
        {"api-key": "abc"},
        {"config.yaml": "server:\n  password: hunter2hunter2\n"},
        {"settings": "token = 'sk-" + "x" * 24 + "'"},
    ],
)
def test_configmap_holding_a_credential_is_reported(data: dict) -> None:
    found = messages(rules.check_no_secret_literals, kube("ConfigMap", "settings", data=data))
    assert len(found) == 1 and "looks like a credential" in found[0]


def test_configmap_pointing_at_credential_files_passes() -> None:
    data = {
        "prometheus.yaml": "bearer_token_file: /var/run/secrets/kubernetes.io/serviceaccount/token\n"
        "api_key: ${API_KEY}\n",
        "tokenizer": "auto",
    }
    assert messages(rules.check_no_secret_literals, kube("ConfigMap", "settings", data=data)) == []


def test_secret_object_with_literal_data_is_reported() -> None:
    secret = kube("Secret", "api-key", stringData={"value": "abc"})
    assert messages(rules.check_no_secret_literals, secret)


# --- the pack's wiring ------------------------------------------------------------------------------------


def test_every_rule_becomes_one_mandatory_policy_of_its_scope() -> None:
    from pulumi_policy import EnforcementLevel, ResourceValidationPolicy, StackValidationPolicy

    policies = pulumi_adapter.build_policies()
    assert [p.name for p in policies] == [rule.name for rule in rules.RULES]
    assert len({p.name for p in policies}) == len(policies)
    for policy, rule in zip(policies, rules.RULES, strict=True):
        assert re.fullmatch(r"[a-z0-9-]{1,100}", policy.name)
        assert policy.enforcement_level is EnforcementLevel.MANDATORY
        expected = ResourceValidationPolicy if rule.scope == "resource" else StackValidationPolicy
        assert isinstance(policy, expected)


@pytest.fixture(scope="module")
def served_pack() -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack as `pulumi preview --policy-pack policy` runs it: its __main__.py serving gRPC."""
    process = subprocess.Popen(
        [sys.executable, "-u", "policy/__main__.py"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    port_line: list[str] = []
    reader = threading.Thread(target=lambda: port_line.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout=60)
    try:
        assert port_line and port_line[0].strip().isdigit(), (
            f"the pack did not print its port: {port_line} {process.poll()} "
            f"{process.stderr.read() if process.poll() is not None else ''}"
        )
        with grpc.insecure_channel(f"127.0.0.1:{port_line[0].strip()}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _struct(props: Any) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(dict(props))
    return struct


def _options(resource: Resource) -> analyzer_pb2.AnalyzerResourceOptions:
    """The resource options the engine sends with it (the rules read ignore_changes)."""
    return analyzer_pb2.AnalyzerResourceOptions(ignoreChanges=list(resource.ignore_changes))


def _analyze(
    stub: analyzer_pb2_grpc.AnalyzerStub, resources: list[Resource]
) -> list[analyzer_pb2.AnalyzeDiagnostic]:
    """What the engine asks during a preview: each resource's inputs, then the whole stack."""
    diagnostics: list[analyzer_pb2.AnalyzeDiagnostic] = []
    for resource in resources:
        request = analyzer_pb2.AnalyzeRequest(
            type=resource.type,
            properties=_struct(resource.props),
            urn=resource.urn,
            name=resource.name,
            options=_options(resource),
        )
        diagnostics.extend(stub.Analyze(request, timeout=60).diagnostics)
    stack = analyzer_pb2.AnalyzeStackRequest(
        resources=[
            analyzer_pb2.AnalyzerResource(
                type=r.type, properties=_struct(r.props), urn=r.urn, name=r.name, options=_options(r)
            )
            for r in resources
        ]
    )
    diagnostics.extend(stub.AnalyzeStack(stack, timeout=60).diagnostics)
    return diagnostics


def test_served_pack_announces_every_rule(served_pack: analyzer_pb2_grpc.AnalyzerStub) -> None:
    info = served_pack.GetAnalyzerInfo(empty_pb2.Empty(), timeout=60)
    assert info.name == "vllm-platform"
    assert [p.name for p in info.policies] == [rule.name for rule in rules.RULES]
    assert {p.enforcementLevel for p in info.policies} == {analyzer_pb2.MANDATORY}


def test_served_pack_reports_resource_and_stack_violations(
    served_pack: analyzer_pb2_grpc.AnalyzerStub,
) -> None:
    broken = vllm_deployment(replicas=2, tolerations=[], volumes=[])
    diagnostics = _analyze(served_pack, [broken, hpa("vllm")])
    by_policy = {d.policyName: d for d in diagnostics}
    assert set(by_policy) == {
        "gpu-pods-target-gpu-nodes",
        "vllm-pods-start-and-drain-safely",
        "autoscaled-workloads-omit-replicas",
    }
    assert by_policy["autoscaled-workloads-omit-replicas"].urn == broken.urn
    assert all(d.enforcementLevel == analyzer_pb2.MANDATORY for d in diagnostics)
    # The engine shows the policy's description, then the violation.
    description, violation = by_policy["gpu-pods-target-gpu-nodes"].message.split("\n", 1)
    assert description == rules.RULES[0].description
    assert violation.startswith("Deployment vllm-m/vllm: requests nvidia.com/gpu")


def test_served_pack_passes_a_well_formed_deployment(served_pack: analyzer_pb2_grpc.AnalyzerStub) -> None:
    # Numbers arrive as floats here (replicas 2.0, GPUs 1.0): the rules must read them the same.
    resources = [vllm_deployment(replicas=2), pdb(maxUnavailable=1, unhealthyPodEvictionPolicy="AlwaysAllow")]
    assert list(_analyze(served_pack, resources)) == []


# --- every rule over every stack's real render ---------------------------------------------------------

RENDERED_STACKS = {
    **dict.fromkeys((*STACKS, *EXAMPLE_STACKS)),
    "existing": TEST_STACKS_DIR / "Pulumi.existing.yaml",
}


def resources_of(result: RenderResult) -> list[Resource]:
    """The render's records as the rules see them, the charts' objects included: one code path with
    the pack."""
    records = [r for r in result.resources if r.custom] + result.chart_resources
    return [Resource(r.type, r.name, r.inputs, r.urn, r.ignore_changes) for r in records]


@pytest.mark.parametrize("stack", RENDERED_STACKS)
def test_every_rule_passes_on_the_rendered_stack(stack: str) -> None:
    resources = resources_of(rendered(stack, RENDERED_STACKS[stack]))
    assert resources
    violations = [f"[{rule}] {violation}" for rule, violation in rules.run_rules(resources)]
    assert violations == []


@pytest.mark.parametrize("stack", RENDERED_STACKS)
def test_the_rules_see_what_they_check_in_the_rendered_stack(stack: str) -> None:
    """Guards against vacuous passes: the rules recognise the stack's GPU pods, vLLM servers and PDBs."""
    resources = resources_of(rendered(stack, RENDERED_STACKS[stack]))
    specs = [spec for r in resources if r.is_kubernetes_object for _, spec in rules.pod_specs(r)]
    gpu_specs = [spec for spec in specs if rules.requests_gpus(spec)]
    assert gpu_specs, "every stack serves at least one model on GPUs"
    assert all(any(rules.is_vllm_container(c) for c in spec["containers"]) for spec in gpu_specs)
    assert any(r.kind == "PodDisruptionBudget" for r in resources)
    if stack != "existing":
        groups = rules.node_groups(resources)
        assert any(taint[0] == "nvidia.com/gpu" for group in groups for taint in group.taints)
        for spec in gpu_specs:
            selected = [g.name for g in groups if rules.selects_node_labels(spec, g.labels)]
            assert len(selected) == 1, selected


@pytest.mark.parametrize("stack", RENDERED_STACKS)
def test_served_pack_passes_the_rendered_stack(
    stack: str, served_pack: analyzer_pb2_grpc.AnalyzerStub
) -> None:
    resources = resources_of(rendered(stack, RENDERED_STACKS[stack]))
    diagnostics = [f"[{d.policyName}] {d.message}" for d in _analyze(served_pack, resources)]
    assert diagnostics == []


def test_a_leader_worker_sets_templates_are_both_checked_and_a_headless_worker_needs_no_probe() -> None:
    """A multi-node model (issue 42): the leader and the worker are pods of their own; the worker
    (`--headless`, no API) passes without probes, a template that misses what a GPU pod needs is
    reported, named."""
    assert rules.run_rules([vllm_leader_worker_set()]) == []
    untolerated = vllm_leader_worker_set(worker=vllm_pod_spec(tolerations=[]))
    (message,) = rules.check_gpu_pods_target_gpu_nodes(untolerated, SETTINGS)
    assert message.startswith("worker template: ") and "does not tolerate the GPU taint" in message
    unprobed = vllm_pod_spec(containers=[vllm_container(startupProbe=None)])
    lws = vllm_leader_worker_set()
    lws.props["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"] = unprobed
    (message,) = rules.check_vllm_pods_start_and_drain_safely(lws, SETTINGS)
    assert message.startswith("leader template: ") and "has no startupProbe" in message


def test_a_pdb_over_a_leader_worker_set_counts_every_pod_of_its_groups() -> None:
    # One group of two pods: minAvailable 1 still lets one member go (the group restarts).
    spec = {"minAvailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    assert stack_messages(rules.check_pdbs_allow_node_drains, [vllm_leader_worker_set(), pdb(**spec)]) == []
    spec = {"minAvailable": 2, "unhealthyPodEvictionPolicy": "AlwaysAllow"}
    (message,) = stack_messages(rules.check_pdbs_allow_node_drains, [vllm_leader_worker_set(), pdb(**spec)])
    assert "allows no disruption at 2 replica(s)" in message


def test_rules_use_the_stacks_gpu_group_label() -> None:
    # The pack cannot import components/ (its own venv); its message must name the real label.
    assert GPU_GROUP_LABEL == "vllm-platform/gpu-group"
    assert (
        GPU_GROUP_LABEL
        in rules.check_gpu_pods_target_gpu_nodes(vllm_deployment(nodeSelector={}), SETTINGS)[0]
    )


def test_pack_files_are_where_the_pulumi_cli_looks() -> None:
    pack = REPO_ROOT / "policy"
    assert (pack / "PulumiPolicy.yaml").is_file() and (pack / "__main__.py").is_file()
    requirements = (pack / "requirements.txt").read_text()
    assert "pulumi-policy==1.21.0" in requirements
    assert Path(rules.__file__).parent == pack


def test_only_the_reviewed_chart_webhook_certificate_may_carry_secret_data() -> None:
    def secret(namespace: str, name: str, type_: str) -> Resource:
        return kube("Secret", name, namespace, type=type_, data={"tls.key": "LS0t"})

    assert (
        messages(
            rules.check_no_secret_literals,
            secret("kube-system", "aws-load-balancer-tls", "kubernetes.io/tls"),
        )
        == []
    )
    assert messages(rules.check_no_secret_literals, secret("kube-system", "aws-load-balancer-tls", "Opaque"))
    assert messages(
        rules.check_no_secret_literals, secret("vllm-m", "aws-load-balancer-tls", "kubernetes.io/tls")
    )
