"""How many pods a model runs during a rollout: what the namespace's GPU quota, the canary's room
check and the probes' surge all count (the Kubernetes layer's rollouts and probes read it here)."""

from __future__ import annotations

import math

from domain.config.models import ModelConfig


def uses_canary(model: ModelConfig) -> bool:
    return model.rollout.strategy == "canary"


def pods_at_weight(weight: int, replicas: int) -> tuple[int, int]:
    """(stable, canary) pods at `weight` % with dynamicStableScale, as Argo Rollouts sizes them:
    canary ceil(weight × replicas), stable ceil((100 - weight) × replicas) (rollout/replicaset.go)."""
    canary = math.ceil(weight * replicas / 100)
    stable = math.ceil((100 - weight) * replicas / 100)
    return stable, canary


def peak_replicas(model: ModelConfig, replicas: int | None = None) -> int:
    """The most pods the model runs during a rollout at its most replicas (or at `replicas`):
    stable + canary."""
    replicas = model.max_replicas if replicas is None else replicas
    if not uses_canary(model):
        return replicas
    if model.is_multi_node:  # groups: the stable ones and the candidate's, side by side
        candidate = model.rollout.canary.candidate
        return replicas + (candidate.replicas if candidate is not None else 0)
    return max(sum(pods_at_weight(weight, replicas)) for weight in model.rollout.canary.steps)


def peak_pods(model: ModelConfig) -> int:
    """The most pods holding GPUs at once: `peak_replicas` plus one pod started while an old one
    drains (a pod keeps its GPUs until it has finished terminating). The namespace's GPU quota
    and the canary's room check both count this many."""
    return peak_replicas(model) + 1


def uses_group_canary(model: ModelConfig) -> bool:
    """A multi-node canary: a second LeaderWorkerSet, its weight set by the stack (docs/multi-node.md)."""
    return model.is_multi_node and uses_canary(model)
