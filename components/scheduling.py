"""Where GPU workloads may run: one source for node selectors and tolerations.

Every GPU workload (vLLM pods, device plugin, GPU feature discovery, NFD worker, DCGM exporter,
image pre-pull) tolerates exactly the taints its GPU group declares — a mismatch silently leaves
GPUs unregistered or pods Pending.
"""

from __future__ import annotations

from collections.abc import Iterable

from components.labels import GPU_GROUP_LABEL
from infra.config.cluster import GpuNodeGroupConfig, TaintConfig


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


def gpu_group_node_selector(group_name: str) -> dict[str, str]:
    return {GPU_GROUP_LABEL: group_name}


def gpu_nodes_affinity(group_names: Iterable[str]) -> dict:
    """Node affinity for DaemonSets that belong on GPU nodes of any group, and nowhere else."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": GPU_GROUP_LABEL, "operator": "In", "values": sorted(group_names)}]}
                ]
            }
        }
    }
