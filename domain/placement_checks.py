"""Whether the pods fit their nodes: a vLLM pod's requests against a node's allocatable CPU and memory
(after the kubelet's reservations), and a Karpenter pool's limits against its models."""

from __future__ import annotations

import math
import re

from domain.catalogue.gpu_instances import lookup_instance_type
from domain.config.errors import Problem
from domain.config.platform import PlatformConfig

KUBELET_MAX_PODS = 250
"""The most pods an EKS node's kubelet may be configured for (the AMI's max-pods at most): its memory
reservation below is sized for it, so the allocatable is never over-estimated."""


EVICTION_HARD_MEMORY_MIB = 100
"""The kubelet's `evictionHard: memory.available: 100Mi` (the EKS AMIs' default)."""


def kubelet_reserved_millicores(vcpus: int) -> int:
    """CPU the EKS AMIs' kubelet reserves (kubeReserved, amazon-eks-ami's bootstrap formula): 6 % of the
    first core, 1 % of the second, 0.5 % of the next two, 0.25 % of every core above four."""
    steps = ((1, 60), (1, 10), (2, 5), (max(0, vcpus - 4), 2.5))
    reserved, left = 0.0, vcpus
    for cores, per_core in steps:
        taken = min(left, cores)
        reserved += taken * per_core
        left -= taken
    return math.ceil(reserved)


def allocatable(vcpus: int, memory_gib: float) -> tuple[float, float]:
    """(cores, GiB) a node of this size offers pods: capacity less the kubelet's reservation
    (kubeReserved: 255 MiB + 11 MiB per pod at KUBELET_MAX_PODS; evictionHard 100 MiB). DaemonSets are
    not subtracted here: what the stack's own put on GPU nodes is small next to a vLLM pod."""
    reserved_mib = 255 + 11 * KUBELET_MAX_PODS + EVICTION_HARD_MEMORY_MIB
    return vcpus - kubelet_reserved_millicores(vcpus) / 1000, memory_gib - reserved_mib / 1024


def pod_request_problems(config: PlatformConfig) -> list[Problem]:
    """Every model's pod requests (the vLLM container, or the preloader's while it runs first) against
    the allocatable of every instance type its group may launch (issue 50): a request no node of the
    group can hold leaves the pod Pending forever on that type, one-node models and group members alike."""
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        group = config.node_groups.gpu.get(model.gpu_group)
        if group is None:
            continue  # named by another check
        resources = model.resources
        cpu = max(resources.cpu_request_cores, resources.preload_cpu_request_cores)
        memory = max(resources.memory_request_gib, resources.preload_memory_request_gib)
        for instance_type in sorted(set(group.instance_types)):
            found = lookup_instance_type(instance_type)
            if found is None:
                continue  # named by another check
            cores, gib = allocatable(found.vcpus, found.memory_gib)
            for key, wanted, offered, unit, size in (
                ("cpu_request_cores", cpu, cores, "cores", f"{found.vcpus} vCPUs"),
                ("memory_request_gib", memory, gib, "GiB", f"{found.memory_gib} GiB"),
            ):
                if wanted > offered:
                    problems.append(
                        Problem(
                            ("models", index, "resources", key),
                            getattr(resources, key),
                            f"a pod of this model asks for {wanted:g} {unit}, more than a {instance_type} "
                            f"node of group '{model.gpu_group}' offers pods ({offered:.1f} {unit} of its "
                            f"{size}, after the kubelet's reservation); lower it below {offered:.1f} or "
                            "remove that instance type from the group",
                        )
                    )
    return problems


def karpenter_pool_problems(config: PlatformConfig) -> list[Problem]:
    """GPU groups with `provisioner: karpenter` (components/karpenter.py): the pool's GPU limit holds
    one replica of every model placed on it, nothing in its disruption settings can evict a serving
    pod, and it has a node class and a controller to act on it."""
    problems: list[Problem] = []
    for name, group in config.node_groups.gpu.items():
        if not group.is_karpenter_pool:
            continue
        at = ("node_groups", "gpu", name, "karpenter")
        models = [(index, model) for index, model in enumerate(config.models) if model.gpu_group == name]
        for index, model in models:
            # A multi-node replica is a whole group: every pod of it must fit under the limit, or the
            # last member stays Pending ("exceeds limits for nodepool") while `up` reports success.
            if group.pool_gpu_limit < model.gpus_per_group:
                whole = f"{model.gpus_per_group} GPUs" + (
                    f", a group of {model.nodes_per_replica} pods" if model.is_multi_node else ""
                )
                problems.append(
                    Problem(
                        (*at, "max_gpus"),
                        group.pool_gpu_limit,
                        f"the pool's limit of {group.pool_gpu_limit} GPU(s) is below one replica of model "
                        f"'{model.name}' ({whole}, models[{index}]): Karpenter would never launch every "
                        f"node of it; raise max_gpus (or max_size) to at least {model.gpus_per_group}",
                    )
                )
        version = group.karpenter.ami_version
        bottlerocket = group.ami_type.startswith("BOTTLEROCKET")
        if version != "latest" and bool(re.fullmatch(r"v\d+\.\d+\.\d+", version)) != bottlerocket:
            # Karpenter's alias is <family>@<version>: a version of the other family's format names no
            # AMI, and no node of the pool would ever launch (issue 50).
            family, example = ("Bottlerocket", "v1.26.0") if bottlerocket else ("AL2023", "v20240625")
            problems.append(
                Problem(
                    (*at, "ami_version"),
                    version,
                    f"this group's ami_type {group.ami_type} takes {family} releases (format {example}); "
                    f"'{version}' is the other family's format and names no AMI: use a release of {family} "
                    "or latest",
                )
            )
        # Several models on one pool: one replica of each at once (issue 50 found them checked one by one).
        together = sum(model.gpus_per_group for _, model in models)
        if (
            len(models) > 1
            and group.pool_gpu_limit >= max(m.gpus_per_group for _, m in models)
            and (group.pool_gpu_limit < together)
        ):
            problems.append(
                Problem(
                    (*at, "max_gpus"),
                    group.pool_gpu_limit,
                    f"the pool's limit of {group.pool_gpu_limit} GPU(s) holds no replica of every model "
                    f"placed on it at once ({', '.join(repr(m.name) for _, m in models)}: {together} "
                    f"GPUs): raise max_gpus (or max_size) to at least {together}",
                )
            )
        if models and group.karpenter.termination_grace_period_minutes is not None:
            problems.append(
                Problem(
                    (*at, "termination_grace_period_minutes"),
                    group.karpenter.termination_grace_period_minutes,
                    "with a terminationGracePeriod Karpenter deletes pods that carry "
                    "karpenter.sh/do-not-disrupt when it drifts or expires their node (upstream "
                    "concepts/disruption.md), which would evict serving pods of "
                    f"{', '.join(repr(m.name) for _, m in models)}; remove it (null): an expired or drifted "
                    "node is then replaced once its serving pods have gone by rollout or scale-in",
                )
            )
        if config.cluster.mode == "existing" and group.karpenter.node_class is None:
            problems.append(
                Problem(
                    (*at, "node_class"),
                    None,
                    "mode 'existing' creates no EC2NodeClass: name the node class the cluster's Karpenter "
                    "already has (node_class: {name: <its name>}), or use provisioner: managed",
                )
            )
        if config.cluster.mode == "eks" and group.karpenter.node_class is not None:
            problems.append(
                Problem(
                    (*at, "node_class"),
                    group.karpenter.node_class.name,
                    "mode 'eks' creates the pool's own EC2NodeClass (subnets, security groups, node role "
                    "of this stack); remove node_class",
                )
            )
        if config.cluster.mode == "eks" and not config.addons.karpenter.enabled:
            problems.append(
                Problem(
                    ("addons", "karpenter", "enabled"),
                    False,
                    f"GPU group '{name}' is a Karpenter pool, and without Karpenter's controller no node "
                    "would ever be launched for it; switch addons.karpenter on, or use provisioner: managed",
                )
            )
    return problems
