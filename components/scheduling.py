"""Where GPU workloads may run: one source for node selectors and tolerations, and for how vLLM pods
spread over zones and nodes and whom they preempt (their PriorityClass).

Every GPU workload (vLLM pods, device plugin, GPU feature discovery, NFD worker, DCGM exporter,
image pre-pull) tolerates exactly the taints its GPU group declares — a mismatch silently leaves
GPUs unregistered or pods Pending.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components import rollouts
from components.guardrails import platform_labels
from domain.config.cluster import GpuNodeGroupConfig, TaintConfig
from domain.config.models import ModelConfig
from domain.config.platform import TolerationConfig
from domain.labels import GPU_GROUP_LABEL, model_selector_labels


def toleration_for(taint: TaintConfig) -> dict[str, str]:
    toleration = {"key": taint.key, "effect": taint.effect}
    if taint.value:
        toleration.update(operator="Equal", value=taint.value)
    else:
        toleration["operator"] = "Exists"
    return toleration


def gpu_group_tolerations(group: GpuNodeGroupConfig) -> list[dict[str, str]]:
    """Tolerations for a pod that must run on this one GPU group."""
    return [toleration_for(taint) for taint in group.taints]


def all_gpu_tolerations(groups: Iterable[GpuNodeGroupConfig]) -> list[dict[str, str]]:
    """Tolerations for a DaemonSet that must run on every GPU group (deduplicated, stable order)."""
    seen: list[dict[str, str]] = []
    for group in groups:
        for toleration in gpu_group_tolerations(group):
            if toleration not in seen:
                seen.append(toleration)
    return seen


def tolerations_from_config(tolerations: Iterable[TolerationConfig]) -> list[dict[str, str]]:
    """A config override (`addons.<gpu add-on>.tolerations`) as pod tolerations."""
    result = []
    for toleration in tolerations:
        item = {
            "key": toleration.key,
            "operator": toleration.operator,
            "value": toleration.value,
            "effect": toleration.effect or "",
        }
        result.append({name: value for name, value in item.items() if value})
    return result


def tolerates(toleration: Mapping[str, Any], taint: TaintConfig) -> bool:
    """Kubernetes' matching rule (core/v1 `Toleration.ToleratesTaint`): an empty effect matches every
    effect, an empty key with `Exists` matches every key, `Equal` compares the value."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == taint.value


def untolerated_taints(
    tolerations: Iterable[Mapping[str, Any]], taints: Iterable[TaintConfig]
) -> list[TaintConfig]:
    tolerations = list(tolerations)
    return [taint for taint in taints if not any(tolerates(toleration, taint) for toleration in tolerations)]


def gpu_group_node_selector(group_name: str) -> dict[str, str]:
    return {GPU_GROUP_LABEL: group_name}


def gpu_nodes_affinity(group_names: Iterable[str]) -> dict:
    """Node affinity for DaemonSets that belong on GPU nodes of any group, and nowhere else."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": GPU_GROUP_LABEL, "operator": "In", "values": sorted(group_names)}
                        ]
                    }
                ]
            }
        }
    }


SERVING_PRIORITY_CLASS = "vllm-serving"
SERVING_PRIORITY_VALUE = 1_000_000
"""Above ordinary workloads (0) so a serving pod can preempt batch jobs on GPU nodes; far below
system-node-critical (2000001000), which the GPU device plugin and DCGM exporter keep."""


def topology_spread(topology_key: str, model: ModelConfig) -> dict[str, Any]:
    # ScheduleAnyway: GPU capacity is often in one zone only (capacity blocks, ODCRs, spot pools);
    # DoNotSchedule would leave replicas Pending next to idle GPUs. matchLabelKeys counts only the
    # pods of the same revision, so old pods being replaced do not skew the spread (a Rollout's
    # pods carry rollouts-pod-template-hash instead of pod-template-hash). No nodeTaintsPolicy
    # (the router's needs Honor): the nodeSelector already limits the zones counted to the group's
    # nodes, whose taints the pods tolerate, and ScheduleAnyway only scores, so Honor would change
    # no placement but restart every model's pods on the next `up`.
    return {
        "maxSkew": 1,
        "topologyKey": topology_key,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": model_selector_labels(model.name)},
        "matchLabelKeys": [rollouts.pod_template_hash_label(model)],
    }


def create_serving_priority_class(
    name: str, opts: pulumi.ResourceOptions
) -> kubernetes.scheduling.v1.PriorityClass:
    """The cluster-scoped PriorityClass every vLLM pod uses; created once by the platform."""
    return kubernetes.scheduling.v1.PriorityClass(
        name,
        metadata={"name": SERVING_PRIORITY_CLASS, "labels": platform_labels()},
        value=SERVING_PRIORITY_VALUE,
        global_default=False,
        preemption_policy="PreemptLowerPriority",
        description="vLLM model servers (vllm-platform): ahead of batch work on GPU nodes.",
        opts=opts,
    )
