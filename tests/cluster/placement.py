"""Where pods landed: read back from the real API server after the scheduler placed them."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tests.cluster.control_plane import Cluster

GPU_DAEMONSETS = (
    "nvidia-device-plugin",
    "nvidia-device-plugin-gpu-feature-discovery",
    "dcgm-exporter",
    "vllm-image-prepull",
)
"""The DaemonSets that must run on every GPU node and only there (ARCHITECTURE.md)."""
VLLM_SELECTOR = "app.kubernetes.io/name=vllm,app.kubernetes.io/part-of=vllm-platform"


def node_groups_by_node(cluster: Cluster) -> dict[str, str]:
    """Node name → its node group (the label EKS puts on managed nodes; tests/cluster/nodes.py)."""
    return {
        node["metadata"]["name"]: node["metadata"]["labels"]["eks.amazonaws.com/nodegroup"]
        for node in cluster.get("nodes")
    }


def vllm_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        pod
        for pod in cluster.get_selected("pods", VLLM_SELECTOR)
        if not pod["metadata"].get("deletionTimestamp")
    ]


def pods_by_owner(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """Owner name (DaemonSet, ReplicaSet, Job …) → its pods."""
    owned: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in cluster.get("pods"):
        for owner in pod["metadata"].get("ownerReferences", []):
            owned[owner["name"]].append(pod)
    return owned


def pending_pods(cluster: Cluster) -> dict[str, str]:
    """Pods not Running (nor Succeeded), with the scheduler's reason where it gave one."""
    pending = {}
    for pod in cluster.get("pods"):
        phase = pod.get("status", {}).get("phase")
        if phase in ("Running", "Succeeded"):
            continue
        reason = next(
            (
                c.get("message", "")
                for c in pod.get("status", {}).get("conditions", [])
                if c["type"] == "PodScheduled"
            ),
            "",
        )
        pending[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = f"{phase}: {reason}"
    return pending
