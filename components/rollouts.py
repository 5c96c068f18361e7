"""Canary rollouts of one model with Argo Rollouts: the Rollout strategy, its analysis, the traffic split.

With `rollout.strategy: canary` the model's pods run under an Argo Rollouts `Rollout` instead of a
Deployment, with the very same pod template (components/model_service.py builds it once). A new
revision, image or set of arguments then goes out as docs/rollouts.md describes:

    setWeight 10 → analysis → setWeight 50 → analysis → 100 % (promoted)
                      │ a failed analysis aborts: all traffic back to the stable pods

- Traffic split: at the AWS Load Balancer Controller's ALB (`trafficRouting.alb`). The model's
  Ingress sends to the root Service `vllm` through the action annotation Argo keeps up to date
  (`alb.ingress.kubernetes.io/actions.vllm`), a forward to two weighted target groups: the Services
  `vllm-stable` and `vllm-canary`, whose selectors Argo pins to the stable and canary ReplicaSets.
  Those three Service names are the contract with anything else that routes to the model (the
  router of issue 18, docs/rollouts.md "One split for every path").
- Analysis: an AnalysisTemplate `vllm-canary` with one Prometheus measurement per check; each
  query compares vLLM's own metrics of the canary pods with those of the stable pods (selected by
  the `rollouts-pod-template-hash` label Argo puts on every pod, which the vLLM PodMonitor copies
  onto the series) and returns the canary's share of what it is allowed: at most 1 passes.
- Scale: the autoscaler scales the Rollout (scale subresource), which then carries no replicas.
  `dynamicStableScale` shrinks the stable side as the canary grows, so the model never runs more
  than one extra pod (`peak_replicas`), which the namespace's GPU quota reserves.

Everything here is a pure function of the typed config; `ModelService` creates the resources.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from components import leader_worker_set
from components.canary_analysis import (
    ANALYSIS_TEMPLATE,
    CANARY_HASH_ARG,
    STABLE_HASH_ARG,
    analysis_metric_problems,
)
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.config.rollout import CanaryConfig
from domain.rollout_pods import peak_pods, peak_replicas, uses_canary

ROLLOUTS_API_VERSION = "argoproj.io/v1alpha1"
ROLLOUT_KIND = "Rollout"
ANALYSIS_TEMPLATE_KIND = "AnalysisTemplate"
ANALYSIS_RUN_KIND = "AnalysisRun"

ROOT_SERVICE = "vllm"
"""Every pod of the model, stable and canary: what the Ingress names and in-cluster clients call."""
STABLE_SERVICE = "vllm-stable"
"""Only the stable ReplicaSet's pods (Argo adds the pod-template-hash to its selector)."""
CANARY_SERVICE = "vllm-canary"
"""Only the canary ReplicaSet's pods; the same as stable when no rollout is in progress."""

POD_TEMPLATE_HASH_LABEL = "rollouts-pod-template-hash"
"""The label Argo Rollouts puts on each ReplicaSet's pods (a Deployment's is `pod-template-hash`)."""

ALB_ACTION_ANNOTATION = f"alb.ingress.kubernetes.io/actions.{ROOT_SERVICE}"
ALB_USE_ANNOTATION_PORT = "use-annotation"
"""The Ingress backend port name that tells the AWS Load Balancer Controller to read the action."""
MANAGED_ALB_ACTIONS_ANNOTATION = "rollouts.argoproj.io/managed-alb-actions"
"""Argo writes this beside the action; neither may be reset by `pulumi up` (ignore_changes)."""


def workload_reference(model: ModelConfig, name: str) -> dict[str, str]:
    """What an HPA or KEDA ScaledObject scales: the Deployment, the Rollout, or for a multi-node model
    the LeaderWorkerSet (each through its scale subresource; an LWS's counts whole groups, and its
    selector, `status.hpaPodSelector`, picks the groups' leaders only)."""
    if model.is_multi_node:
        return {
            "apiVersion": leader_worker_set.LWS_API_VERSION,
            "kind": leader_worker_set.LWS_KIND,
            "name": name,
        }
    if uses_canary(model):
        return {"apiVersion": ROLLOUTS_API_VERSION, "kind": ROLLOUT_KIND, "name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def pod_template_hash_label(model: ModelConfig) -> str:
    """The label that tells one revision's pods apart (topology spread `matchLabelKeys`)."""
    return POD_TEMPLATE_HASH_LABEL if uses_canary(model) else "pod-template-hash"


# --- the Rollout ---------------------------------------------------------------------------------------


def canary_steps(canary: CanaryConfig) -> list[dict[str, Any]]:
    """setWeight, then the analysis, for each weight; Argo promotes to 100 % after the last step."""
    analysis = {
        "templates": [{"templateName": ANALYSIS_TEMPLATE}],
        "args": [
            {"name": CANARY_HASH_ARG, "valueFrom": {"podTemplateHashValue": "Latest"}},
            {"name": STABLE_HASH_ARG, "valueFrom": {"podTemplateHashValue": "Stable"}},
        ],
    }
    steps: list[dict[str, Any]] = []
    for weight in canary.steps:
        steps += [{"setWeight": weight}, {"analysis": analysis}]
    return steps


def canary_strategy(model: ModelConfig, alb_ingress: bool) -> dict[str, Any]:
    canary = model.rollout.canary
    strategy: dict[str, Any] = {
        "canaryService": CANARY_SERVICE,
        "stableService": STABLE_SERVICE,
        "abortScaleDownDelaySeconds": canary.abort_scale_down_delay_seconds,
        "steps": canary_steps(canary),
    }
    if alb_ingress:
        strategy["trafficRouting"] = {
            "alb": {
                "ingress": ROOT_SERVICE,
                "rootService": ROOT_SERVICE,
                "servicePort": model.vllm.port,
            }
        }
        # The stable side shrinks as the canary grows: at most one extra pod's GPUs at any weight
        # (peak_replicas), instead of a second full set at promotion. Only with traffic routing:
        # Argo Rollouts refuses the Rollout otherwise ("Canary dynamicStableScale can only be used
        # with traffic routing", seen by tests/test_deploy_scale_to_zero.py), and a canary split by
        # pod count (a to-zero model, no Ingress) already sizes stable and canary by the weight.
        strategy["dynamicStableScale"] = True
    return strategy


def rollout_spec(model: ModelConfig, workload: Mapping[str, Any], *, alb_ingress: bool) -> dict[str, Any]:
    """The Rollout: the Deployment's selector, template, deadlines and replicas, a canary strategy."""
    spec = {key: value for key, value in workload.items() if key != "strategy"}
    # A canary pod that never becomes ready (the planner's startup budget is in its startupProbe)
    # aborts the rollout instead of leaving it stuck.
    spec["progressDeadlineAbort"] = True
    spec["strategy"] = {"canary": canary_strategy(model, alb_ingress)}
    return spec


def initial_alb_action(model: ModelConfig) -> str:
    """All traffic to the stable Service: what the Ingress carries until Argo first writes weights."""
    return alb_action(model, canary_weight=0)


def group_canary_weight(model: ModelConfig) -> int:
    """A multi-node canary's share of requests: the candidate's weight, 0 without one."""
    candidate = model.rollout.canary.candidate
    return candidate.weight if candidate is not None else 0


def alb_action(model: ModelConfig, *, canary_weight: int) -> str:
    """The ALB forward action: `canary_weight` % to `vllm-canary`, the rest to `vllm-stable`."""
    port = str(model.vllm.port)
    return json.dumps(
        {
            "type": "forward",
            "forwardConfig": {
                "targetGroups": [
                    {"serviceName": CANARY_SERVICE, "servicePort": port, "weight": canary_weight},
                    {"serviceName": STABLE_SERVICE, "servicePort": port, "weight": 100 - canary_weight},
                ]
            },
        },
        separators=(",", ":"),
    )


def describe_steps(canary: CanaryConfig) -> str:
    """`10% → analysis → 50% → analysis → 100%`, as docs/rollouts.md writes the steps."""
    return " → ".join([*(f"{weight}% → analysis" for weight in canary.steps), "100%"])


# --- checks over the config ------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRoom:
    """A GPU node group at its max_size with every model on it at its max replicas: what is left for
    the extra pods of one model's rollout (`group_room`)."""

    group: str
    max_size: int
    gpus_per_node: int
    held: tuple[tuple[str, int, int], ...]
    """(model, max replicas, GPUs per replica) of every model on the group."""
    free_sets: int
    """Pods of the rolling model's size (gpus_per_replica on one node) that still fit."""
    fits: bool
    """False when the models at their max replicas do not fit the group at all (then free_sets is 0;
    replica_bound_problems reports a single model beyond its group)."""

    @property
    def gpus(self) -> int:
        return self.max_size * self.gpus_per_node

    @property
    def held_gpus(self) -> int:
        return sum(replicas * gpus for _, replicas, gpus in self.held)

    def describe(self) -> str:
        """e.g. "node group 'l40s' has 8 GPUs (max_size 2 × 4 per node), and at their max replicas
        its models hold 8 (qwen: 4 × 2)"."""
        held = ", ".join(f"{name}: {replicas} × {gpus}" for name, replicas, gpus in self.held)
        return (
            f"node group '{self.group}' has {self.gpus} GPUs (max_size {self.max_size} × "
            f"{self.gpus_per_node} per node), and at their max replicas its models hold "
            f"{self.held_gpus} ({held})"
        )


def group_room(
    config: PlatformConfig,
    model: ModelConfig,
    *,
    max_size: int | None = None,
    max_replicas: int | None = None,
) -> GroupRoom | None:
    """How many more pods of `model` its GPU group holds while every model on the group runs its max
    replicas (None when the group is unknown: the schema reports that).

    Nodes of the group's smallest instance type (any of its types may be what the group launched),
    at `max_size`; the models' pods packed on them largest first, each on the first node with room
    (first-fit decreasing: for GPU counts that divide each other, as 1, 2, 4 and 8 do, as tight as
    any scheduler can place them). So a shortfall here is one on every placement. `max_size` and
    `max_replicas` (of `model`) replace the stack's values, to find the fix that works.
    """
    group = config.node_groups.gpu.get(model.gpu_group)
    if group is None or not group.gpu_instances:
        return None
    per_node = min(instance.gpus_per_node for instance in group.gpu_instances)
    size = group.max_size if max_size is None else max_size
    held = tuple(
        (
            other.name,
            max_replicas if other is model and max_replicas is not None else other.max_replicas,
            other.gpus_per_replica,
        )
        for other in config.models
        if other.gpu_group == model.gpu_group
    )
    free = [per_node] * size
    for gpus in sorted((gpus for _, replicas, gpus in held for _ in range(replicas)), reverse=True):
        node = next((i for i, left in enumerate(free) if left >= gpus), None)
        if node is None:
            return GroupRoom(model.gpu_group, size, per_node, held, free_sets=0, fits=False)
        free[node] -= gpus
    sets = sum(left // model.gpus_per_replica for left in free)
    return GroupRoom(model.gpu_group, size, per_node, held, free_sets=sets, fits=True)


def _room_fixes(
    config: PlatformConfig, model: ModelConfig, index: int, extra_at: Callable[[int], int]
) -> list[str]:
    """The replica and node-group changes that leave room for the `extra_at(max replicas)` pods a
    rollout adds: lower the model's max replicas (not below its floor; the most that works) or raise
    the group's max_size (the smallest that works)."""
    room = group_room(config, model)
    assert room is not None
    extra = extra_at(model.max_replicas)
    fixes = []
    key = "autoscaling.max_replicas" if model.autoscaling.enabled else "replicas"
    floor = max(1, model.autoscaling.min_replicas) if model.autoscaling.enabled else model.replicas
    fewer = next(
        (
            count
            for count in range(model.max_replicas - 1, floor - 1, -1)
            if (group_room(config, model, max_replicas=count) or room).free_sets >= extra_at(count)
        ),
        None,
    )
    if fewer is not None:
        fixes.append(f"lower models[{index}].{key} to {fewer}")
    # Every node holds at least one pod (none is larger than a node, or no size ever works), so one
    # node per pod is always enough.
    pods = sum(replicas for _, replicas, _ in room.held) + extra
    larger = next(
        (
            size
            for size in range(room.max_size + 1, max(room.max_size, pods) + 1)
            if (group_room(config, model, max_size=size) or room).free_sets >= extra
        ),
        None,
    )
    if larger is not None:
        fixes.append(f"raise node_groups.gpu.{model.gpu_group}.max_size to {larger}")
    return fixes


def _one_of(fixes: list[str]) -> str:
    """'a', 'a or b', 'a, b, or c'."""
    return fixes[0] if len(fixes) == 1 else f"{', '.join(fixes[:-1])}{',' * (len(fixes) > 2)} or {fixes[-1]}"


def _canary_extra_pods(model: ModelConfig, replicas: int) -> int:
    """Pods beyond `replicas` at a canary's peak: its extra pod (if a step adds one) and one draining."""
    return peak_replicas(model, replicas) + 1 - replicas


def rolling_surge_problems(config: PlatformConfig) -> list[Problem]:
    """A rolling update that surges (maxSurge 1: the model may run one replica) needs one free GPU set
    in its group while every model there runs its max replicas. Without it the surge pod stays
    Pending (Insufficient nvidia.com/gpu), maxUnavailable 0 lets no old pod go, and `pulumi up` waits
    out its timeout (issue 40: about 81 minutes on EKS)."""
    from components.probes import rollout_strategy

    problems = []
    for index, model in enumerate(config.models):
        surge = rollout_strategy(model).max_surge
        room = group_room(config, model)
        if model.is_multi_node:
            continue  # a LeaderWorkerSet replaces whole groups in place (components/leader_worker_set.py)
        if uses_canary(model) or surge == 0 or room is None or not room.fits or room.free_sets >= surge:
            continue
        floor = (
            f"autoscaling.min_replicas {model.autoscaling.min_replicas}"
            if model.autoscaling.enabled
            else f"replicas {model.replicas}"
        )
        fixes = [
            "set rollout.replace_in_place: true (maxUnavailable 1 instead of the surge: no GPU beyond the "
            "replicas' own, but a model at one replica is down while its new pod starts)",
            *_room_fixes(config, model, index, lambda _, surge=surge: surge),
        ]
        problems.append(
            Problem(
                ("models", index, "rollout", "replace_in_place"),
                model.rollout.replace_in_place,
                f"a rolling update surges one pod of {model.gpus_per_replica} GPU(s) (maxSurge 1, "
                f"maxUnavailable 0, since the model may run a single replica: {floor}), but "
                f"{room.describe()}: no node has {model.gpus_per_replica} free. At max replicas the "
                "surge pod would stay Pending (Insufficient nvidia.com/gpu) and the update stall until "
                f"`pulumi up` times out. Fix: {'; or '.join(fixes)}",
            )
        )
    return problems


def rollout_problems(config: PlatformConfig) -> list[Problem]:
    """A canary needs the controller, Prometheus, the ALB (or no ingress), analysable metrics, and
    room for its extra pod: in the GPU node group and, for the second revision, on node NVMe."""
    from components.probes import replica_floor
    from domain.architecture import checkpoint_bytes, model_shape

    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        if not uses_canary(model):
            continue
        path: tuple[str | int, ...] = ("models", index, "rollout")
        if not config.addons.argo_rollouts.enabled:
            problems.append(
                Problem(
                    (*path, "strategy"),
                    "canary",
                    "a canary is run by Argo Rollouts, which is off; set addons.argo_rollouts: true, or "
                    "rollout.strategy: rolling",
                )
            )
        if not config.monitoring.enabled:
            problems.append(
                Problem(
                    (*path, "strategy"),
                    "canary",
                    "the canary analysis reads vLLM's metrics from Prometheus, but monitoring.enabled is "
                    "false; set monitoring.enabled: true or rollout.strategy: rolling",
                )
            )
        if config.ingress.enabled and config.ingress.class_name != "alb":
            problems.append(
                Problem(
                    (*path, "strategy"),
                    "canary",
                    f"the canary's traffic split is made by the ALB (Argo Rollouts trafficRouting.alb); "
                    f"ingress.class_name '{config.ingress.class_name}' is not supported; use "
                    "ingress.class_name: "
                    "alb or rollout.strategy: rolling",
                )
            )
        analysis = model.rollout.canary.analysis
        problems += analysis_metric_problems(analysis, (*path, "canary", "analysis"))
        scrape = config.monitoring.scrape_interval_seconds
        if analysis.window_seconds < 2 * scrape:
            problems.append(
                Problem(
                    (*path, "canary", "analysis", "window_seconds"),
                    analysis.window_seconds,
                    "rate() needs at least two samples in the window and Prometheus scrapes every "
                    f"{scrape} s; "
                    f"set window_seconds to at least {2 * scrape} (4 × the scrape interval, {4 * scrape}, is "
                    "steadier)",
                )
            )
        if model.is_multi_node:
            # Its room is counted in groups (domain/multi_node.py), and stable and candidate groups
            # never share a node (each pod holds its node's GPUs), so neither NVMe holds both.
            continue
        pods = peak_pods(model)
        needed = pods * model.gpus_per_replica
        room = group_room(config, model)
        extra = pods - model.max_replicas
        if room is not None and (not room.fits or room.free_sets < extra):
            replicas = model.max_replicas
            # Each part of the count is named, so the sum in the message adds up (issue 24).
            parts = [f"{replicas} replica{'s' if replicas != 1 else ''}"]
            if peak_replicas(model) > replicas:
                parts.append("the canary's extra pod")
            parts.append("one pod started while an old one drains")
            others = [held for held in room.held if held[0] != model.name]
            beside = (
                ", and at their max replicas the group's other models hold "
                + ", ".join(f"{name}: {count} × {gpus}" for name, count, gpus in others)
                if others
                else ""
            )
            # A rolling update of a model that may run one replica surges one pod (maxSurge 1): it
            # needs room too, or its pods replaced in place (rolling_surge_problems).
            surges = replica_floor(model) < 2
            rolling = (
                "rollout.strategy: rolling with rollout.replace_in_place: true (pods replaced in "
                "place need no GPU beyond the replicas' own)"
                if surges and (not room.fits or room.free_sets < 1)
                else "rollout.strategy: rolling"
            )
            fixes = [*_room_fixes(config, model, index, partial(_canary_extra_pods, model)), f"use {rolling}"]
            problems.append(
                Problem(
                    (*path, "strategy"),
                    "canary",
                    f"the canary runs up to {pods} pods at once ({' plus '.join(parts)}) = "
                    f"{pods} × {model.gpus_per_replica} = {needed} GPUs, but node group "
                    f"'{model.gpu_group}' has at most {room.gpus} "
                    f"(max_size × GPUs per node){beside}; no room to surge: {_one_of(fixes)}",
                )
            )
        group = config.node_groups.gpu[model.gpu_group]
        if group.local_nvme.enabled:
            # Old and canary pods may share a node, and the preloader deletes no revision: each
            # node's NVMe holds both revisions' copies until the rollout ends.
            both_gib = 2 * checkpoint_bytes(model_shape(model)) / (1 << 30)
            smallest = min(instance.local_nvme_gib for instance in group.gpu_instances)
            if 0 < smallest < both_gib:
                problems.append(
                    Problem(
                        (*path, "strategy"),
                        "canary",
                        "during a canary a node keeps the old and the new revision on its NVMe "
                        f"({both_gib:.0f} GiB), but the smallest instance type of '{model.gpu_group}' "
                        f"has {smallest} GiB; pick instance types with more local NVMe or use "
                        "rollout.strategy: rolling",
                    )
                )
    problems += _shared_volume_problems(config)
    return problems


def _shared_volume_problems(config: PlatformConfig) -> list[Problem]:
    """The shared volume holds every model's revision, and a canary model's old one beside it."""
    from domain.architecture import checkpoint_bytes, model_shape

    needed = sum(
        (2 if uses_canary(model) else 1) * checkpoint_bytes(model_shape(model)) for model in config.models
    ) / (1 << 30)
    size = config.storage.model_volume_size_gib
    if not any(uses_canary(model) for model in config.models) or needed <= size:
        return []
    return [
        Problem(
            ("storage", "model_volume_size_gib"),
            size,
            f"the model volume holds each model's revision and, for canary models, the old one until the "
            f"rollout ends: {needed:.0f} GiB; raise model_volume_size_gib to at least {math.ceil(needed)}",
        )
    ]
