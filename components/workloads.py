"""What runs a model's pods, one short builder per shape over the one pod template
(components/vllm_pod.py): a Deployment, an Argo Rollouts Rollout (a canary), a LeaderWorkerSet of
groups (a replica wider than a node), and a group canary's second LeaderWorkerSet. `workload` is the
one place that picks the shape; adding a shape is adding a builder here."""

from __future__ import annotations

from typing import Any

from components import leader_worker_set, probes, rollouts
from components.autoscaling import autoscaler_owns_replicas, replicas_at_creation
from components.exposure import uses_alb_traffic_split
from components.vllm_arguments import NodeRole
from components.vllm_pod import pod_template
from domain.capacity import ModelPlan
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.labels import model_selector_labels


def deployment_spec(
    config: PlatformConfig, model: ModelConfig, plan: ModelPlan, service_account: str
) -> dict[str, Any]:
    """The Deployment's spec; a canary model's Rollout takes it whole but for the strategy."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": model_selector_labels(model.name)},
        "strategy": probes.rollout_strategy(model).as_spec(),
        "progressDeadlineSeconds": probes.progress_deadline_seconds(plan.startup_budget_seconds),
        "revisionHistoryLimit": 5,
        "template": pod_template(config, model, plan, service_account),
    }
    # With an HPA or KEDA, the autoscaler owns spec.replicas: setting it on every `up` would reset
    # the replica count (production-stack renders it under KEDA; we do not). A to-zero model sets it
    # at creation only (replicas_at_creation; ModelService ignores it afterwards).
    if not autoscaler_owns_replicas(model):
        spec["replicas"] = model.replicas
    elif (initial := replicas_at_creation(model)) is not None:
        spec["replicas"] = initial
    return spec


def canary_leader_worker_set_spec(
    config: PlatformConfig, model: ModelConfig, candidate_plan: ModelPlan, service_account: str
) -> dict[str, Any] | None:
    """The candidate's LeaderWorkerSet `vllm-canary` (its own source and engine settings, its own
    replicas, never autoscaled), or None when no candidate is given."""
    candidate = model.canary_candidate()
    if candidate is None:
        return None
    assert model.rollout.canary.candidate is not None
    return leader_worker_set.leader_worker_set_spec(
        config,
        candidate,
        pod_template(config, candidate, candidate_plan, service_account, NodeRole.in_pod(leader=True)),
        pod_template(config, candidate, candidate_plan, service_account, NodeRole.in_pod(leader=False)),
        model.rollout.canary.candidate.replicas,
    )


def workload(
    config: PlatformConfig, model: ModelConfig, plan: ModelPlan, service_account: str
) -> tuple[str, str, dict[str, Any]]:
    """(apiVersion, kind, spec) of what runs the pods: the one place that picks Deployment, Rollout or,
    for a model whose replica spans nodes, LeaderWorkerSet (components/leader_worker_set.py)."""
    if model.is_multi_node:
        return (
            leader_worker_set.LWS_API_VERSION,
            leader_worker_set.LWS_KIND,
            leader_worker_set.leader_worker_set_spec(
                config,
                model,
                pod_template(config, model, plan, service_account, NodeRole.in_pod(leader=True)),
                pod_template(config, model, plan, service_account, NodeRole.in_pod(leader=False)),
                replicas_at_creation(model) if autoscaler_owns_replicas(model) else model.replicas,
            ),
        )
    spec = deployment_spec(config, model, plan, service_account)
    if rollouts.uses_canary(model):
        return (
            rollouts.ROLLOUTS_API_VERSION,
            rollouts.ROLLOUT_KIND,
            rollouts.rollout_spec(model, spec, alb_ingress=uses_alb_traffic_split(config, model)),
        )
    return "apps/v1", "Deployment", spec
