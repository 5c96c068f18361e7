"""A model namespace's guardrails: its GPU quota, container defaults, disruption budget and labels
(Pod Security Admission, the platform's own)."""

from __future__ import annotations

from typing import Any

from components import probes
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.labels import MODEL_LABEL, PART_OF, model_selector_labels

POD_SECURITY_LABEL = "pod-security.kubernetes.io"


def resource_quota_spec(model: ModelConfig) -> dict[str, Any]:
    return {"hard": {"requests.nvidia.com/gpu": str(probes.gpu_quota(model))}}


def limit_range_spec() -> dict[str, Any]:
    """Defaults for containers that set nothing (debug pods, injected sidecars).

    No default CPU limit: it would also apply to the vLLM container, which has none on purpose, and
    CFS throttling stalls its tokenizer and scheduler loop. No GPU maximum either: LimitRange
    maxima force every container, the init container too, to declare that resource.
    """
    return {
        "limits": [
            {
                "type": "Container",
                "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
                "default": {"memory": "1Gi"},
            }
        ]
    }


def pod_disruption_budget_spec(model: ModelConfig) -> dict[str, Any]:
    """Keep `min_available` replicas (a multi-node model's: groups) serving through voluntary
    disruptions — when that leaves room to evict one. At or above the fewest replicas the model runs
    with (a single replica, or an autoscaler at its minimum), a minAvailable would block every node
    drain and node-group upgrade, so the budget becomes one pod at a time (maxUnavailable 1)."""
    floor = probes.replica_floor(model)
    if model.is_multi_node:
        # Groups, not pods (issue 50): a PDB counts pods, one pod lost takes its whole group down (LWS
        # recreates it), and a group's headless workers are Ready whatever its leader does, so a
        # minAvailable in pods let a drain take one member of every group. At most (fewest groups -
        # min_available) pods at a time instead: each takes at most one group, and a group being
        # recreated holds its share of the budget (its leader not Ready) until it serves again.
        budget: dict[str, Any] = {"maxUnavailable": max(1, floor - model.min_available)}
    elif model.min_available < floor:
        budget = {"minAvailable": model.min_available}
    else:
        budget = {"maxUnavailable": 1}
    return {
        **budget,
        "selector": {"matchLabels": model_selector_labels(model.name)},
        # A pod stuck loading (not Ready) never counts as available, so without this a node drain
        # would wait forever on the very pod that cannot become ready.
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def platform_labels() -> dict[str, str]:
    return {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/managed-by": "pulumi"}


def pod_security_labels(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    """Pod Security Admission as strict as the pods allow: `restricted`, which they meet (non-root,
    no capabilities, RuntimeDefault seccomp, no privilege escalation) — except that a GPU group with
    local NVMe needs the hostPath volume of the node-local copy, which only `privileged` admits;
    there `restricted` is still audited and warned about, so any other deviation shows."""
    version = f"v{config.cluster.kubernetes_version}"
    enforce = "privileged" if config.node_groups.gpu[model.gpu_group].local_nvme.enabled else "restricted"
    labels = {f"{POD_SECURITY_LABEL}/enforce": enforce, f"{POD_SECURITY_LABEL}/enforce-version": version}
    for mode in ("audit", "warn"):
        labels[f"{POD_SECURITY_LABEL}/{mode}"] = "restricted"
        labels[f"{POD_SECURITY_LABEL}/{mode}-version"] = version
    return labels


def namespace_labels(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    labels = {**platform_labels(), MODEL_LABEL: model.name, **pod_security_labels(config, model)}
    if config.ingress.enabled and config.ingress.class_name == "alb":
        # The AWS Load Balancer Controller adds a readiness gate to pods here: a rollout waits until
        # the new pod is healthy in the ALB target group before stopping the next old one.
        labels["elbv2.k8s.aws/pod-readiness-gate-inject"] = "enabled"
    return labels
