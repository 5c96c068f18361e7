"""Replicas larger than one node (issue 42): the checks `validate` runs over a model's parallelism, and
the facts the AWS layer (and, later, Karpenter pools) ask of a GPU group.

A multi-node replica is one LeaderWorkerSet group of `nodes_per_replica` pods, one per node, each
holding every GPU of its node, joined by vLLM's own multi-node launch (components/leader_worker_set.py).
Pure functions over the typed config: no Pulumi, no AWS.
"""

from __future__ import annotations

import dataclasses
import math

from domain.architecture import ModelShape, count_parameters, model_shape
from domain.catalogue.efa_interfaces import efa_instance_types, max_efa_interfaces, supports_device_rdma
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.versions import VLLM_EFA_IMAGE, known_efa_image


def multi_node_models(config: PlatformConfig, gpu_group: str) -> list[ModelConfig]:
    """The models whose replicas span several nodes of `gpu_group`."""
    return [model for model in config.models if model.gpu_group == gpu_group and model.is_multi_node]


def group_needs_efa(config: PlatformConfig, gpu_group: str) -> bool:
    """Whether `gpu_group`'s nodes need EFA interfaces, the EFA device plugin, the self-referencing
    security-group rule, one zone and a cluster placement group: some model's replica spans several
    of its nodes. The hook for every kind of GPU capacity (managed node groups here; Karpenter pools
    call the same function when they exist)."""
    return bool(multi_node_models(config, gpu_group))


def efa_groups(config: PlatformConfig) -> list[str]:
    """GPU groups that need EFA (group_needs_efa), in config order."""
    return [name for name in config.node_groups.gpu if group_needs_efa(config, name)]


def efa_device_rdma(config: PlatformConfig, gpu_group: str) -> bool:
    """Whether every instance type of `gpu_group` has EFA devices with RDMA read: only then may libfabric
    be told to use it (`FI_EFA_USE_DEVICE_RDMA=1`); elsewhere it aborts (issue 50)."""
    return all(supports_device_rdma(name) for name in config.node_groups.gpu[gpu_group].instance_types)


def efa_interfaces_per_node(config: PlatformConfig, gpu_group: str) -> int:
    """EFA interfaces on each node of `gpu_group` (and `vpc.amazonaws.com/efa` each pod requests): the
    most its instance types all take, so every node has them all (0 where the group needs none)."""
    if not group_needs_efa(config, gpu_group):
        return 0
    return min(max_efa_interfaces(name) for name in config.node_groups.gpu[gpu_group].instance_types)


def pipeline_stage_shape(shape: ModelShape, pipeline_parallel_size: int) -> ModelShape:
    """The largest pipeline stage of `shape` as a model of its own, for the per-GPU memory plan.

    vLLM gives each stage ceil(layers / pp) layers or fewer (vllm/distributed/utils.py,
    get_pp_indices). The embedding and LM head live on the first and last stage only; planning every
    stage with both over-counts them on purpose (the plan errs on the side of not fitting). A declared
    parameter count shrinks with the layers.
    """
    if pipeline_parallel_size == 1:
        return shape
    layers = math.ceil(shape.num_hidden_layers / pipeline_parallel_size)
    declared = shape.parameters_declared
    return dataclasses.replace(
        shape,
        num_hidden_layers=layers,
        first_dense_layers=min(shape.first_dense_layers, layers),
        parameters_declared=declared * layers / shape.num_hidden_layers if declared else None,
    )


def expert_shard_shape(shape: ModelShape, data_parallel_size: int) -> ModelShape:
    """One data-parallel rank's share of a MoE model under expert parallelism, as a model of its own,
    for the per-GPU memory plan: vLLM spreads the routed experts over tensor × data ranks, so each
    rank's GPUs hold num_experts / data of them, which the weight plan then splits over the tensor
    ranks as it does every expert (the same bytes per GPU as whole experts per rank). Attention, the
    shared experts and the router stay whole in every rank. A declared parameter count shrinks with
    the experts."""
    if data_parallel_size == 1 or not shape.is_moe:
        return shape
    assert shape.num_experts
    share = dataclasses.replace(
        shape, num_experts=math.ceil(shape.num_experts / data_parallel_size), parameters_declared=None
    )
    declared = shape.parameters_declared
    if declared:
        ratio = (
            count_parameters(share).total
            / count_parameters(dataclasses.replace(shape, parameters_declared=None)).total
        )
        share = dataclasses.replace(share, parameters_declared=declared * ratio)
    return share


def _model_problems(config: PlatformConfig, index: int, model: ModelConfig) -> list[Problem]:
    parallelism = model.parallelism
    at = ("models", index, "parallelism")
    problems: list[Problem] = []
    if not model.is_multi_node:
        if model.rollout.canary.candidate is not None:
            problems.append(
                Problem(
                    ("models", index, "rollout", "canary", "candidate"),
                    model.rollout.canary.candidate.model_dump(exclude_defaults=True),
                    "a candidate is the canary of a multi-node model (a LeaderWorkerSet of its own); a "
                    "one-node model's canary is the model itself: put the new source or vllm settings "
                    "on the model and Argo Rollouts steps it through rollout.canary.steps; remove candidate",
                )
            )
        given = parallelism.tensor_parallel_size
        if given is not None and given != model.gpus_per_replica:
            problems.append(
                Problem(
                    (*at, "tensor_parallel_size"),
                    given,
                    "a one-node replica is tensor parallel over its gpus_per_replica "
                    f"{model.gpus_per_replica} GPUs; remove tensor_parallel_size (or set gpus_per_replica)",
                )
            )
        return problems
    group = config.node_groups.gpu.get(model.gpu_group)
    if group is None or not group.gpu_instances:
        return problems  # reported by the schema (unknown group)
    nodes = parallelism.nodes_per_replica
    group_at = ("node_groups", "gpu", model.gpu_group)
    # One pod per node holding the whole node: a second pod of the group on the same node would share
    # its EFA devices and PCIe, and vLLM's --nnodes counts nodes, not pods.
    partial = [i.name for i in group.gpu_instances if i.gpus_per_node != model.gpus_per_replica]
    if partial:
        counts = sorted({i.gpus_per_node for i in group.gpu_instances})
        problems.append(
            Problem(
                ("models", index, "gpus_per_replica"),
                model.gpus_per_replica,
                "a multi-node replica has one pod per node holding every GPU of it, but "
                f"{', '.join(partial)} of group '{model.gpu_group}' has {'/'.join(map(str, counts))} GPUs "
                "per node; set "
                f"gpus_per_replica to the node's GPU count (one GPU count per group)",
            )
        )
    no_efa = [name for name in group.instance_types if max_efa_interfaces(name) == 0]
    if no_efa:
        same_gpu = [
            name
            for name in efa_instance_types()
            if name.split(".")[0] in {i.name.split(".")[0] for i in group.gpu_instances}
        ]
        hint = f" (with EFA in the same families: {', '.join(same_gpu)})" if same_gpu else ""
        problems.append(
            Problem(
                (*group_at, "instance_types"),
                group.instance_types,
                f"model '{model.name}' spans {nodes} nodes, but {', '.join(no_efa)} has no EFA "
                "(domain/catalogue/efa_interfaces.yaml): NCCL between its nodes would run over TCP at a "
                f"fraction of the bandwidth; use EFA instance types{hint}, or one node per replica",
            )
        )
    problems += _image_problems(index, model)
    if group.max_size < nodes:
        problems.append(
            Problem(
                (*group_at, "max_size"),
                group.max_size,
                f"model '{model.name}' needs {nodes} nodes for one replica (parallelism.nodes_per_replica), "
                f"but the group holds at most {group.max_size}; raise max_size to {nodes} or more",
            )
        )
    tp, pp, dp = model.tensor_parallel_size, model.pipeline_parallel_size, model.data_parallel_size
    if dp > 1 and model.gpus_per_replica % (tp * pp):
        # vLLM 0.32.0 infers each node's data-parallel ranks from --node-rank (its first rank is
        # node_rank × GPUs per node ÷ tensor × pipeline; engine/arg_utils.py) only when a rank's
        # GPUs lie on one node; a rank spanning nodes would get the wrong start rank.
        problems.append(
            Problem(
                at,
                {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp},
                f"each data-parallel rank must lie on one node, whole: tensor {tp} × pipeline {pp} GPUs per "
                f"rank do not divide a node's {model.gpus_per_replica}; use pipeline_parallel_size 1 and "
                f"a tensor_parallel_size that divides {model.gpus_per_replica}, e.g. tensor "
                f"{model.gpus_per_replica} × data {nodes}",
            )
        )
        return problems
    if tp * pp * dp != model.gpus_per_group:
        problems.append(
            Problem(
                at,
                {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, "data_parallel_size": dp},
                f"tensor {tp} × pipeline {pp} × data {dp} = {tp * pp * dp} GPUs, but one replica has "
                f"{model.gpus_per_group} ({nodes} nodes × gpus_per_replica {model.gpus_per_replica}); vLLM "
                f"refuses a world size that does not match the GPUs its --nnodes launch finds. E.g. tensor "
                f"{model.gpus_per_replica} × pipeline {nodes}",
            )
        )
        return problems
    if tp > model.gpus_per_replica and not parallelism.tensor_parallel_across_nodes:
        problems.append(
            Problem(
                (*at, "tensor_parallel_size"),
                tp,
                f"tensor parallelism {tp} is wider than one node ({model.gpus_per_replica} GPUs): every "
                "layer's all-reduce would cross the network. Use tensor_parallel_size "
                f"{model.gpus_per_replica} with pipeline_parallel_size {nodes}, or set "
                "tensor_parallel_across_nodes: true to mean it",
            )
        )
    if tp < model.gpus_per_replica and model.gpus_per_replica % tp:
        problems.append(
            Problem(
                (*at, "tensor_parallel_size"),
                tp,
                f"a tensor-parallel group of {tp} does not tile a node of {model.gpus_per_replica} GPUs; "
                f"choose a divisor of {model.gpus_per_replica}",
            )
        )
    shape = model_shape(model)
    if pp > shape.num_hidden_layers:
        problems.append(
            Problem(
                (*at, "pipeline_parallel_size"),
                pp,
                f"{pp} pipeline stages for {shape.num_hidden_layers} layers: vLLM needs at least one layer "
                "per stage; lower pipeline_parallel_size",
            )
        )
    if parallelism.expert_parallel:
        if not shape.is_moe:
            problems.append(
                Problem(
                    (*at, "expert_parallel"),
                    True,
                    "expert parallelism is for MoE models; this architecture has no num_experts; remove it",
                )
            )
        elif shape.num_experts % (tp * dp):
            problems.append(
                Problem(
                    (*at, "expert_parallel"),
                    True,
                    f"{shape.num_experts} experts do not divide over {tp * dp} expert-parallel ranks "
                    "(tensor × data): vLLM would give some GPUs one expert more than the plan counts; "
                    "choose a tensor_parallel_size that divides num_experts",
                )
            )
    problems += _group_canary_problems(config, index, model)
    return problems


def image_carries_efa(model: ModelConfig) -> bool:
    """Whether the model's serving image is known to carry libfabric's EFA provider and the aws-ofi-nccl
    plugin: a pinned image that does (domain/versions.py `efa`), or one the stack says does."""
    return model.image_carries_efa or known_efa_image(model.serving_image) is not None


def _image_problems(index: int, model: ModelConfig) -> list[Problem]:
    """A multi-node model's members run NCCL with NCCL_NET="AWS Libfabric" (components/leader_worker_set.py):
    on an image without the plugin and libfabric's EFA provider the group stops at NCCL's start (issue 50)."""
    if image_carries_efa(model):
        return []
    return [
        Problem(
            ("models", index, "image"),
            model.image,
            f"model '{model.name}' spans {model.nodes_per_replica} nodes, whose NCCL needs libfabric's EFA "
            "provider and the aws-ofi-nccl plugin in the image, and this image is not known to carry them "
            "(the stock vllm/vllm-openai does not): every group would stop at NCCL's start. Remove image to "
            f"use {VLLM_EFA_IMAGE.reference} (serving-image/README.md), or, for a mirror or build of your "
            "own that carries them, set image_carries_efa: true",
        )
    ]


def model_versions(config: PlatformConfig) -> list[tuple[tuple[str | int, ...], ModelConfig]]:
    """Every version the stack serves, with the key path its settings live under: each model
    (`models[i]`) and each multi-node canary's candidate (`models[i].rollout.canary.candidate`), so
    the validate-time checks of arguments and memory cover what the candidate's pods will run."""
    versions: list[tuple[tuple[str | int, ...], ModelConfig]] = []
    for index, model in enumerate(config.models):
        versions.append((("models", index), model))
        if model.is_multi_node and (candidate := model.canary_candidate()) is not None:
            versions.append((("models", index, "rollout", "canary", "candidate"), candidate))
    return versions


def _group_canary_problems(config: PlatformConfig, index: int, model: ModelConfig) -> list[Problem]:
    """A multi-node canary is a second LeaderWorkerSet stepped by `candidate.weight` (docs/multi-node.md,
    "Canary"): Argo's step settings do not apply, and the group must hold both versions' groups."""
    at = ("models", index, "rollout")
    canary = model.rollout.canary
    candidate = canary.candidate
    problems: list[Problem] = []
    if model.rollout.strategy != "canary":
        if candidate is not None:
            problems.append(
                Problem(
                    (*at, "canary", "candidate"),
                    candidate.model_dump(exclude_defaults=True),
                    "a candidate is served only with rollout.strategy: canary; set it, or remove the "
                    "candidate (strategy rolling replaces the groups one at a time)",
                )
            )
        return problems
    for key in sorted({"steps", "abort_scale_down_delay_seconds"} & canary.model_fields_set):
        problems.append(
            Problem(
                (*at, "canary", key),
                getattr(canary, key),
                "Argo Rollouts cannot drive a LeaderWorkerSet: a multi-node canary is stepped by "
                "rollout.canary.candidate.weight, one `pulumi up` per step, and removed by removing the "
                f"candidate; remove {key}",
            )
        )
    if model.scales_to_zero:
        problems.append(
            Problem(
                (*at, "strategy"),
                "canary",
                "a model that scales to zero has no Ingress of its own, so no ALB weights, and the "
                "candidate's groups would serve every request while the stable ones sleep; use "
                "autoscaling.min_replicas 1 or more, or rollout.strategy: rolling",
            )
        )
    if candidate is None:
        return problems
    if candidate.source in (None, model.source) and model.candidate_vllm() == model.vllm:
        problems.append(
            Problem(
                (*at, "canary", "candidate"),
                candidate.model_dump(exclude_defaults=True),
                "the candidate runs exactly what the stable groups run; give its new source or the vllm "
                "settings that differ, or remove it",
            )
        )
    group = config.node_groups.gpu.get(model.gpu_group)
    if group is not None:
        stable = model.max_replicas
        nodes = (stable + candidate.replicas) * model.nodes_per_replica
        if nodes > group.max_size:
            problems.append(
                Problem(
                    (*at, "canary", "candidate", "replicas"),
                    candidate.replicas,
                    f"during the canary the model runs {stable} stable and {candidate.replicas} candidate "
                    f"group(s) of {model.nodes_per_replica} nodes = {nodes} nodes, but node group "
                    f"'{model.gpu_group}' holds at most {group.max_size}; raise "
                    f"node_groups.gpu.{model.gpu_group}.max_size to {nodes}, or lower the stable replicas",
                )
            )
    return problems


def multi_node_problems(config: PlatformConfig) -> list[Problem]:
    """Validate-time check: a multi-node model's parallelism matches its GPUs, splits its shape, and
    can be placed (EFA, room for one group)."""
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        problems += _model_problems(config, index, model)
    return problems + group_node_lifetime_problems(config)


def group_node_lifetime_problems(config: PlatformConfig) -> list[Problem]:
    """Nodes of a multi-node model's group that go away on their own take a whole group (issue 50):
    spot (one interruption is a cold start of every member, tens of minutes on p5) and Karpenter's
    expiry (forceful: `expireAfter` drains an expired node whatever its pods' do-not-disrupt says, and
    a group's nodes, launched together, expire together). Decided: refused, each naming the fix; a
    team that wants spot for groups can run them on a group of its own outside this stack's checks."""
    problems: list[Problem] = []
    for name, group in config.node_groups.gpu.items():
        grouped = [m.name for m in multi_node_models(config, name)]
        if not grouped:
            continue
        at = ("node_groups", "gpu", name)
        models = ", ".join(repr(m) for m in grouped)
        if group.is_karpenter_pool:
            pool = group.karpenter
            if "spot" in pool.capacity_types:
                problems.append(
                    Problem(
                        (*at, "karpenter", "capacity_types"),
                        pool.capacity_types,
                        f"the pool holds multi-node model(s) {models}: one spot interruption stops a whole "
                        "group and costs a cold start of every member; remove spot",
                    )
                )
            if pool.expire_after_hours is not None:
                problems.append(
                    Problem(
                        (*at, "karpenter", "expire_after_hours"),
                        pool.expire_after_hours,
                        f"the pool holds multi-node model(s) {models}: Karpenter's expiry drains an expired "
                        "node even under do-not-disrupt, and a group's nodes expire together, so every group "
                        "would stop at once; set expire_after_hours: null (Never) and replace nodes by "
                        "rollout (drift still applies once no serving pod holds a node)",
                    )
                )
        elif group.capacity_type == "spot":
            problems.append(
                Problem(
                    (*at, "capacity_type"),
                    group.capacity_type,
                    f"the group holds multi-node model(s) {models}: one spot interruption stops a whole "
                    "group and costs a cold start of every member; use on_demand",
                )
            )
    return problems
