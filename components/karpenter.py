"""Karpenter GPU pools (issue 41): one NodePool and one EC2NodeClass per GPU group with
`provisioner: karpenter`, and in mode eks Karpenter's controller from its pinned chart.

    NodePool <group>        which instances (the group's types, capacity types), the group's taints
                            and labels, a GPU limit, node lifetime, and disruption that never evicts
                            a serving pod
    EC2NodeClass <group>    how they launch: the EKS-optimised AMI by alias (Karpenter picks the
                            NVIDIA variant for GPU types), subnets and security group by the
                            `karpenter.sh/discovery` tag, the NVMe + image-pull user data and root
                            volume the managed groups use, capacity reservations, a placement group

Serving pods are protected by the `karpenter.sh/do-not-disrupt` annotation on their pod template
(`serving_pod_annotations`), not by a NodePool budget of zero: the annotation protects exactly the
nodes that hold a serving pod, while empty nodes are still consolidated and drifted or expired nodes
without serving pods are still replaced. With no `terminationGracePeriod` on the pool (validate
refuses one), Karpenter never deletes such a pod for drift or expiry either (upstream
website/content/en/v1.14/concepts/disruption.md, "Pod-Level Controls" and "TerminationGracePeriod").

EFA: nothing here. Karpenter's AWS provider attaches EFA interfaces to an instance when the pods it
launches for request `vpc.amazonaws.com/efa` (upstream concepts/nodeclasses.md), so a multi-node
replica's pods asking for EFA devices is what gives its nodes EFA interfaces.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components.helm.release import ChartRelease, install_chart
from domain.cluster_context import ClusterContext, KarpenterMultiNodePlacement
from domain.config.cluster import GpuNodeGroupConfig
from domain.config.platform import KarpenterConfig
from domain.gpu_nodes import gpu_block_devices, gpu_node_labels
from domain.labels import PART_OF
from domain.node_user_data import al2023_user_data, bottlerocket_user_data
from domain.service_accounts import KARPENTER
from domain.versions import KARPENTER_CHART

NODE_POOL_API_VERSION = "karpenter.sh/v1"
NODE_CLASS_API_VERSION = "karpenter.k8s.aws/v1"
NODE_CLASS_GROUP = "karpenter.k8s.aws"
NODE_CLASS_KIND = "EC2NodeClass"
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
CAPACITY_TYPE_LABEL = "karpenter.sh/capacity-type"
NODE_POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_RESOURCE = "nvidia.com/gpu"
KARPENTER_NAMESPACE = KARPENTER.namespace
AMI_ALIAS_FAMILY = {"AL2023_x86_64_NVIDIA": "al2023", "BOTTLEROCKET_x86_64_NVIDIA": "bottlerocket"}

GpuGroups = Mapping[str, GpuNodeGroupConfig]


def serving_pod_annotations(group: GpuNodeGroupConfig) -> dict[str, str]:
    """Pods of a model on a Karpenter pool: Karpenter never disrupts their node voluntarily."""
    return {DO_NOT_DISRUPT_ANNOTATION: "true"} if group.is_karpenter_pool else {}


def karpenter_pools(gpu_groups: GpuGroups) -> dict[str, GpuNodeGroupConfig]:
    return {name: group for name, group in sorted(gpu_groups.items()) if group.is_karpenter_pool}


def node_class_reference(group_name: str, group: GpuNodeGroupConfig) -> dict[str, str]:
    """The pool's own EC2NodeClass, or (mode existing) the cluster's node class named in config."""
    ref = group.karpenter.node_class
    if ref is not None:
        return {"group": ref.group, "kind": ref.kind, "name": ref.name}
    return {"group": NODE_CLASS_GROUP, "kind": NODE_CLASS_KIND, "name": group_name}


def _duration(seconds: int) -> str:
    return f"{seconds}s"


def node_pool(group_name: str, group: GpuNodeGroupConfig) -> dict[str, Any]:
    """The NodePool of one GPU group (karpenter.sh/v1)."""
    pool = group.karpenter
    expire = f"{pool.expire_after_hours}h" if pool.expire_after_hours is not None else "Never"
    template_spec: dict[str, Any] = {
        "nodeClassRef": node_class_reference(group_name, group),
        "requirements": [
            {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": list(group.instance_types)},
            {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": list(pool.capacity_types)},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
        ],
        "taints": [
            {"key": taint.key, **({"value": taint.value} if taint.value else {}), "effect": taint.effect}
            for taint in group.taints
        ],
        "expireAfter": expire,
    }
    if pool.termination_grace_period_minutes is not None:
        template_spec["terminationGracePeriod"] = f"{pool.termination_grace_period_minutes}m"
    return {
        "apiVersion": NODE_POOL_API_VERSION,
        "kind": "NodePool",
        "metadata": {"name": group_name, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "spec": {
            "template": {"metadata": {"labels": gpu_node_labels(group_name, group)}, "spec": template_spec},
            # GPUs, not nodes: the unit the capacity plan and the models' replicas count in.
            "limits": {GPU_RESOURCE: str(group.pool_gpu_limit)},
            "disruption": {
                "consolidationPolicy": pool.consolidation_policy,
                "consolidateAfter": _duration(pool.consolidate_after_seconds),
                "budgets": [{"nodes": pool.disruption_budget_nodes}],
            },
        },
    }


def node_user_data(group: GpuNodeGroupConfig, *, efa: bool = False) -> str:
    """The managed groups' user data, as plain text: on AL2023 Karpenter merges its own NodeConfig
    into this MIME document (concepts/nodeclasses.md, "AL2023 userData"), on Bottlerocket its TOML.
    `efa`: the pool holds multi-node models, whose members need unlimited locked memory (issue 50)."""
    if group.ami_type.startswith("BOTTLEROCKET"):
        return bottlerocket_user_data(group.image_pull)
    mount_path = group.local_nvme.mount_path if group.local_nvme.enabled else None
    return al2023_user_data(mount_path, group.image_pull, efa=efa)


def ec2_node_class(
    group_name: str,
    group: GpuNodeGroupConfig,
    cluster_name: str,
    node_role: pulumi.Input[str],
    multi_node: KarpenterMultiNodePlacement | None = None,
) -> dict[str, Any]:
    """The EC2NodeClass of one GPU group (karpenter.k8s.aws/v1). `multi_node`: the pool holds replicas
    that span nodes, whose nodes go where a managed multi-node group's go (one subnet, hence one zone;
    the EFA security group besides the discovered ones; the AWS layer's cluster placement group unless
    the pool names its own). Their EFA interfaces Karpenter adds itself for pods that request
    `vpc.amazonaws.com/efa`, which every member of a group does (components/leader_worker_set.py)."""
    pool = group.karpenter
    discovery = [{"tags": {"karpenter.sh/discovery": cluster_name}}]
    devices = []
    for index, device in enumerate(gpu_block_devices(group)):
        ebs: dict[str, Any] = {
            "volumeSize": f"{device.size_gib}Gi",
            "volumeType": "gp3",
            "encrypted": True,
            "deleteOnTermination": True,
        }
        if device.throughput:
            ebs.update(throughput=device.throughput, iops=device.iops)
        if device.snapshot_id:
            ebs["snapshotID"] = device.snapshot_id
        # The first is the root (Bottlerocket: its data volume), as on the managed groups.
        devices.append({"deviceName": device.device_name, "ebs": ebs, "rootVolume": index == 0})
    spec: dict[str, Any] = {
        "role": node_role,
        "amiSelectorTerms": [{"alias": f"{AMI_ALIAS_FAMILY[group.ami_type]}@{pool.ami_version}"}],
        "subnetSelectorTerms": discovery,
        "securityGroupSelectorTerms": discovery,
        "blockDeviceMappings": devices,
        # IMDSv2 only, one hop, as on the managed groups (infra/aws/node_groups.py METADATA_OPTIONS).
        "metadataOptions": {
            "httpEndpoint": "enabled",
            "httpProtocolIPv6": "disabled",
            "httpPutResponseHopLimit": 1,
            "httpTokens": "required",
        },
        "userData": node_user_data(group, efa=multi_node is not None),
        "tags": {"Name": f"{cluster_name}-{group_name}", "vllm-platform/gpu-group": group_name},
    }
    if pool.capacity_reservation_ids:
        spec["capacityReservationSelectorTerms"] = [{"id": cr} for cr in pool.capacity_reservation_ids]
    if multi_node is not None:
        spec["subnetSelectorTerms"] = [{"id": multi_node.subnet_id}]
        spec["securityGroupSelectorTerms"] = [*discovery, {"id": multi_node.efa_security_group_id}]
        spec["placementGroupSelector"] = {"name": multi_node.placement_group}
    if pool.placement_group:
        spec["placementGroupSelector"] = {"name": pool.placement_group}
    return {
        "apiVersion": NODE_CLASS_API_VERSION,
        "kind": NODE_CLASS_KIND,
        "metadata": {"name": group_name, "labels": {"app.kubernetes.io/part-of": PART_OF}},
        "spec": spec,
    }


def karpenter_values(settings: KarpenterConfig, context: ClusterContext) -> dict[str, Any]:
    role_arn = context.role_arn_for(*KARPENTER)
    return {
        "fullnameOverride": "karpenter",
        "replicas": settings.replicas,
        "serviceAccount": {
            "create": True,
            "name": KARPENTER.name,
            "annotations": {"eks.amazonaws.com/role-arn": role_arn} if role_arn else {},
        },
        "settings": {
            "clusterName": context.cluster_name,
            "interruptionQueue": context.karpenter_interruption_queue or "",
            # Capacity reservations and Capacity Blocks (`reserved`): on by default in 1.14; said here.
            "featureGates": {"reservedCapacity": True},
        },
        # A controller: system nodes only, never a GPU node (nor a node it manages: the chart's affinity).
        "tolerations": [],
        # The chart always renders its PDB (maxUnavailable 1) and cannot set unhealthyPodEvictionPolicy,
        # so one controller pod that never became ready would block every drain of its node (policy
        # pdbs-allow-node-drains). Karpenter runs leader-elected with a standby, so the PDB is made
        # non-blocking: the chart spreads the replicas over nodes, so a drain still takes one at a time;
        # two drains at once leave no provisioning for the minute a new pod takes, and nothing serving.
        "podDisruptionBudget": {"name": "karpenter", "maxUnavailable": settings.replicas},
        # Upstream's recommendation for the controller (getting-started: 1 CPU, 1 GiB), bounded.
        "controller": {
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
        },
    }


@dataclass(frozen=True)
class KarpenterPoolsArgs:
    gpu_groups: GpuGroups
    settings: KarpenterConfig
    context: ClusterContext
    install_controller: bool
    """Mode eks with addons.karpenter on: the chart (its crds/ bring NodePool, NodeClaim and
    EC2NodeClass) and an EC2NodeClass per pool. Mode existing: the NodePools only."""


class KarpenterPools(pulumi.ComponentResource):
    release: pulumi.Resource | None
    node_pools: dict[str, pulumi.Resource]

    def __init__(
        self, name: str, args: KarpenterPoolsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("vllm-platform:karpenter:KarpenterPools", name, None, opts)
        pools = karpenter_pools(args.gpu_groups)
        self.release = None
        after: Sequence[pulumi.Resource] = ()
        if args.install_controller and pools:
            self.release = install_chart(
                ChartRelease(
                    "karpenter",
                    KARPENTER_CHART,
                    KARPENTER_NAMESPACE,
                    karpenter_values(args.settings, args.context),
                ),
                pulumi.ResourceOptions(parent=self),
            )
            after = [self.release]
        self.node_pools = {}
        for group_name, group in pools.items():
            depends: list[pulumi.Resource] = list(after)
            if group.karpenter.node_class is None:
                if args.context.karpenter_node_role is None:
                    raise ValueError(
                        f"node_groups.gpu.{group_name}: a Karpenter pool in mode eks needs the "
                        "node role of infra/aws/karpenter.py (addons.karpenter on)"
                    )
                node_class = ec2_node_class(
                    group_name,
                    group,
                    args.context.cluster_name,
                    args.context.karpenter_node_role,
                    args.context.karpenter_multi_node.get(group_name),
                )
                depends.append(_custom_object(f"{name}-{group_name}-node-class", node_class, self, after))
            self.node_pools[group_name] = _custom_object(
                f"{name}-{group_name}-node-pool", node_pool(group_name, group), self, depends
            )
        self.register_outputs({})


def _custom_object(
    resource_name: str, obj: dict[str, Any], parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource]
) -> pulumi.Resource:
    return kubernetes.apiextensions.CustomResource(
        resource_name,
        api_version=obj["apiVersion"],
        kind=obj["kind"],
        metadata=obj["metadata"],
        spec=obj["spec"],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on)),
    )
