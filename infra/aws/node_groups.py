"""EKS managed node groups: the system group and one group per `node_groups.gpu` entry.

Each group gets a launch template (encrypted gp3 root volume, IMDSv2 with a hop limit of 1, and for
GPU groups the NVMe user data) and its Auto Scaling group gets the Cluster Autoscaler's discovery
and node-template tags, so a GPU group can scale up from zero nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from domain.catalogue.efa_interfaces import EFA_RESOURCE
from domain.config.cluster import (
    GRAVITON_FAMILY,
    GpuNodeGroupConfig,
    NodeGroupsConfig,
    SystemNodeGroupConfig,
    TaintConfig,
)
from domain.gpu_nodes import BlockDevice, gpu_block_devices, gpu_node_labels, root_device_name
from domain.node_user_data import al2023_user_data, bottlerocket_user_data, encode_user_data
from infra.aws.policies import service_trust_policy, to_json

GPU_RESOURCE = "nvidia.com/gpu"
SYSTEM_GROUP = "system"

EKS_TAINT_EFFECTS = {
    "NoSchedule": "NO_SCHEDULE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
}
EKS_CAPACITY_TYPES = {"on_demand": "ON_DEMAND", "spot": "SPOT"}
NODE_MANAGED_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",  # shell access through Session Manager instead of SSH keys
)
# IMDSv2 only, one hop: processes on the node reach the metadata service, pods (one network hop
# further) do not, so they cannot borrow the node role. Pods get AWS access only through IRSA.
METADATA_OPTIONS = {
    "http_endpoint": "enabled",
    "http_tokens": "required",
    "http_put_response_hop_limit": 1,
    "instance_metadata_tags": "disabled",
}


def eks_taints(taints: Sequence[TaintConfig]) -> list[dict[str, str]]:
    """Taints in the EKS node-group API's spelling (NO_SCHEDULE, not NoSchedule)."""
    return [
        {"key": taint.key, "value": taint.value, "effect": EKS_TAINT_EFFECTS[taint.effect]}
        for taint in taints
    ]


def autoscaler_tags(
    cluster_name: str,
    labels: Mapping[str, str],
    taints: Sequence[TaintConfig] = (),
    gpus_per_node: int = 0,
    efa_per_node: int = 0,
) -> dict[str, str]:
    """Auto Scaling group tags for the Cluster Autoscaler (cluster-autoscaler/cloudprovider/aws/README.md):
    auto-discovery, plus the node template it simulates while the group has no node to look at. With
    no node yet, the autoscaler knows only the resources these tags name: a multi-node group's pods
    also request every EFA interface, so without its tag it refused to scale up from zero
    ("Insufficient vpc.amazonaws.com/efa", issue 50)."""
    prefix = "k8s.io/cluster-autoscaler"
    tags = {f"{prefix}/enabled": "true", f"{prefix}/{cluster_name}": "owned"}
    tags.update({f"{prefix}/node-template/label/{key}": value for key, value in labels.items()})
    tags.update(
        {f"{prefix}/node-template/taint/{taint.key}": f"{taint.value}:{taint.effect}" for taint in taints}
    )
    if gpus_per_node:
        tags[f"{prefix}/node-template/resources/{GPU_RESOURCE}"] = str(gpus_per_node)
    if efa_per_node:
        tags[f"{prefix}/node-template/resources/{EFA_RESOURCE}"] = str(efa_per_node)
    return tags


def system_ami_type(instance_types: Sequence[str]) -> str:
    graviton = [bool(GRAVITON_FAMILY.match(name)) for name in instance_types]
    if any(graviton) and not all(graviton):
        raise ValueError(
            "node_groups.system.instance_types mixes Graviton (arm64) and x86 types; one node group runs one "
            f"AMI architecture: {', '.join(instance_types)}"
        )
    return "AL2023_ARM_64_STANDARD" if all(graviton) else "AL2023_x86_64_STANDARD"


def gpu_user_data(group_name: str, group: GpuNodeGroupConfig, *, efa: bool = False) -> str:
    """The launch-template user data (base64) of a GPU group: on AL2023 the EFA locked-memory script
    (`efa`: the group holds multi-node models), the NVMe script (when local_nvme is on), the containerd
    volume script (with a snapshot) and our NodeConfig; on Bottlerocket its TOML settings (which raises
    locked memory on EFA nodes by itself, domain/node_user_data.py)."""
    if group.ami_type.startswith("BOTTLEROCKET"):
        if group.local_nvme.enabled:
            raise ValueError(
                f"node_groups.gpu.{group_name}.local_nvme.enabled: assembling instance-store NVMe disks is "
                "implemented for AL2023 nodes only; set ami_type: AL2023_x86_64_NVIDIA or "
                "local_nvme.enabled: false"
            )
        return encode_user_data(bottlerocket_user_data(group.image_pull))
    mount_path = group.local_nvme.mount_path if group.local_nvme.enabled else None
    return encode_user_data(al2023_user_data(mount_path, group.image_pull, efa=efa))


@dataclass(frozen=True)
class NodeGroupSpec:
    """One managed node group, fully resolved from config (what the component turns into resources)."""

    name: str
    instance_types: tuple[str, ...]
    capacity_type: str
    ami_type: str
    min_size: int
    desired_size: int
    max_size: int
    disk_size_gib: int
    labels: dict[str, str]
    taints: tuple[TaintConfig, ...] = ()
    user_data: str | None = None
    block_devices: tuple[BlockDevice, ...] = ()
    """EBS volumes of the launch template; empty: the root volume at gp3's baseline."""
    autoscaler_tags: dict[str, str] = field(default_factory=dict)
    efa_interfaces: int = 0
    """Multi-node groups (domain/multi_node.py group_needs_efa): EFA interfaces per node, one per network
    card; the group then also lives in one zone and one cluster placement group. 0: none of that."""


EFA_INTERFACE_TYPE_PRIMARY = "efa"
"""Network card 0 carries the node's primary interface, which must also be an ENA interface ("EFA with
ENA"): EC2 refuses an EFA-only primary interface."""
EFA_INTERFACE_TYPE_SECONDARY = "efa-only"
"""Every further card: EFA-only interfaces, which take no IP address from the node subnet (32 per p5
node otherwise) and carry only EFA traffic, AWS's configuration for P5 (EC2 user guide, "Maximize network
bandwidth on accelerated instances with EFA")."""


def efa_network_interfaces(
    count: int, security_group_ids: Sequence[pulumi.Input[str]]
) -> list[dict[str, object]]:
    """The launch template's network interfaces for `count` EFA interfaces: one per network card,
    card 0 at device index 0, every other card at device index 1 (EC2 user guide, as above). With
    interfaces in the template EKS takes the node's security groups from them, so they carry the
    cluster's and the EFA group's."""
    return [
        {
            "device_index": 0 if card == 0 else 1,
            "network_card_index": card,
            "interface_type": EFA_INTERFACE_TYPE_PRIMARY if card == 0 else EFA_INTERFACE_TYPE_SECONDARY,
            "delete_on_termination": "true",
            "security_groups": list(security_group_ids),
        }
        for card in range(count)
    ]


def node_group_specs(
    cluster_name: str, node_groups: NodeGroupsConfig, efa_interfaces: Mapping[str, int] | None = None
) -> list[NodeGroupSpec]:
    if SYSTEM_GROUP in node_groups.gpu:
        raise ValueError(
            f"node_groups.gpu.{SYSTEM_GROUP}: the name is taken by the system node group; "
            "rename the GPU group"
        )
    system: SystemNodeGroupConfig = node_groups.system
    specs = [
        NodeGroupSpec(
            name=SYSTEM_GROUP,
            instance_types=tuple(system.instance_types),
            capacity_type=EKS_CAPACITY_TYPES[system.capacity_type],
            ami_type=system_ami_type(system.instance_types),
            min_size=system.min_size,
            desired_size=system.desired_size,
            max_size=system.max_size,
            disk_size_gib=system.disk_size_gib,
            labels=dict(system.labels),
            autoscaler_tags=autoscaler_tags(cluster_name, system.labels),
        )
    ]
    for group_name, group in node_groups.gpu.items():
        if group.is_karpenter_pool:
            continue  # a NodePool + EC2NodeClass (components/karpenter.py), not a managed group
        labels = gpu_node_labels(group_name, group)
        specs.append(
            NodeGroupSpec(
                name=group_name,
                instance_types=tuple(group.instance_types),
                capacity_type=EKS_CAPACITY_TYPES[group.capacity_type],
                ami_type=group.ami_type,
                min_size=group.min_size,
                desired_size=group.desired_size,
                max_size=group.max_size,
                disk_size_gib=group.disk_size_gib,
                labels=labels,
                taints=tuple(group.taints),
                user_data=gpu_user_data(group_name, group, efa=(efa_interfaces or {}).get(group_name, 0) > 0),
                block_devices=gpu_block_devices(group),
                # The smallest instance type of the group: the autoscaler must not promise GPUs a
                # node might not have.
                autoscaler_tags=autoscaler_tags(
                    cluster_name,
                    labels,
                    group.taints,
                    group.min_gpus_per_node,
                    (efa_interfaces or {}).get(group_name, 0),
                ),
                efa_interfaces=(efa_interfaces or {}).get(group_name, 0),
            )
        )
    return specs


@dataclass(frozen=True)
class NodeGroupsArgs:
    cluster_name: pulumi.Input[str]
    """The cluster resource's name output, so every group waits for the cluster."""
    plain_cluster_name: str
    kubernetes_version: str
    node_groups: NodeGroupsConfig
    subnet_ids: Sequence[pulumi.Input[str]]
    depends_on: Sequence[pulumi.Resource] = ()
    """What nodes need before they can become Ready: the VPC CNI and kube-proxy add-ons."""
    partition: str = "aws"
    efa_interfaces: Mapping[str, int] = field(default_factory=dict)
    """GPU groups whose replicas span nodes → EFA interfaces per node (domain/multi_node.py)."""
    vpc_id: pulumi.Input[str] | None = None
    """Needed with efa_interfaces: the VPC of the EFA security group."""
    cluster_security_group_id: pulumi.Input[str] | None = None
    """Needed with efa_interfaces: EKS's cluster security group, which the EFA nodes' interfaces must
    carry themselves (a launch template with interfaces replaces the one EKS would attach)."""
    efa_pools: Sequence[str] = ()
    """Karpenter pools whose replicas span nodes: each gets a cluster placement group and the EFA
    security group here; its EC2NodeClass names them (components/karpenter.py)."""


class NodeGroups(pulumi.ComponentResource):
    node_role_arn: pulumi.Output[str]
    groups: dict[str, aws.eks.NodeGroup]

    def __init__(self, name: str, args: NodeGroupsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:aws:NodeGroups", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=to_json(service_trust_policy("ec2.amazonaws.com")),
            description=f"EKS nodes of {args.plain_cluster_name}",
            opts=child,
        )
        attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-{policy}",
                role=role.name,
                policy_arn=f"arn:{args.partition}:iam::aws:policy/{policy}",
                opts=child,
            )
            for policy in NODE_MANAGED_POLICIES
        ]
        # Authentication mode API: nodes join through an access entry, created before any group so
        # EKS uses this one instead of creating (and later deleting) its own.
        access_entry = aws.eks.AccessEntry(
            f"{name}-access-entry",
            cluster_name=args.cluster_name,
            principal_arn=role.arn,
            type="EC2_LINUX",
            opts=child,
        )

        self.groups = {}
        self.efa_security_group: aws.ec2.SecurityGroup | None = None
        self.placement_groups: dict[str, aws.ec2.PlacementGroup] = {}
        specs = node_group_specs(args.plain_cluster_name, args.node_groups, args.efa_interfaces)
        if any(spec.efa_interfaces for spec in specs) or args.efa_pools:
            self.efa_security_group = self._efa_security_group(name, args)
        for spec in specs:
            self.groups[spec.name] = self._group(name, spec, args, role, [access_entry, *attachments])
        for pool in args.efa_pools:
            # As for a managed multi-node group: one cluster placement group (hence one zone; the pool's
            # EC2NodeClass also selects the first private subnet only).
            self.placement_groups[pool] = self._placement_group(name, pool, args.plain_cluster_name)

        self.node_role_arn = role.arn
        self.register_outputs(
            {
                "node_role_arn": self.node_role_arn,
                "node_groups": {group_name: group.arn for group_name, group in self.groups.items()},
            }
        )

    def _placement_group(self, name: str, group_name: str, cluster_name: str) -> aws.ec2.PlacementGroup:
        return aws.ec2.PlacementGroup(
            f"{name}-{group_name}-placement",
            strategy="cluster",
            tags={"Name": f"{cluster_name}-{group_name}"},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _efa_security_group(self, name: str, args: NodeGroupsArgs) -> aws.ec2.SecurityGroup:
        """EFA's requirement: a security group allowing all traffic to and from itself, inbound and
        outbound (EC2 user guide, "Prepare an EFA-enabled security group"); EFA's SRD traffic is not
        TCP/UDP, so narrower rules silently drop it."""
        if args.vpc_id is None or args.cluster_security_group_id is None:
            raise ValueError("EFA node groups need the VPC and the cluster security group (NodeGroupsArgs)")
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(
            f"{name}-efa",
            vpc_id=args.vpc_id,
            description=f"EFA traffic between the multi-node GPU nodes of {args.plain_cluster_name}",
            tags={"Name": f"{args.plain_cluster_name}-efa"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efa-self-ingress",
            security_group_id=group.id,
            referenced_security_group_id=group.id,
            ip_protocol="-1",
            description="all traffic from EFA nodes (EFA)",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-self-egress",
            security_group_id=group.id,
            referenced_security_group_id=group.id,
            ip_protocol="-1",
            description="all traffic to EFA nodes (EFA)",
            opts=child,
        )
        return group

    def _group(
        self,
        name: str,
        spec: NodeGroupSpec,
        args: NodeGroupsArgs,
        role: aws.iam.Role,
        role_ready: Sequence[pulumi.Resource],
    ) -> aws.eks.NodeGroup:
        child = pulumi.ResourceOptions(parent=self)
        devices = spec.block_devices or (BlockDevice(root_device_name(spec.ami_type), spec.disk_size_gib),)
        subnet_ids = list(args.subnet_ids)
        multi_node: dict[str, object] = {}
        if spec.efa_interfaces:
            # A multi-node group: one cluster placement group (the nodes of a replica close together
            # on the network), hence one zone: the first private subnet's.
            placement_group = self._placement_group(name, spec.name, args.plain_cluster_name)
            self.placement_groups[spec.name] = placement_group
            subnet_ids = subnet_ids[:1]
            assert self.efa_security_group is not None
            multi_node = {
                # A placement group's id is its name (EC2 names them; the provider's `id`).
                "placement": {"group_name": placement_group.id},
                "network_interfaces": efa_network_interfaces(
                    spec.efa_interfaces, [args.cluster_security_group_id, self.efa_security_group.id]
                ),
            }
        launch_template = aws.ec2.LaunchTemplate(
            f"{name}-{spec.name}",
            description=f"{args.plain_cluster_name} node group {spec.name}",
            block_device_mappings=[device.mapping() for device in devices],
            metadata_options=METADATA_OPTIONS,
            user_data=spec.user_data,
            **multi_node,
            tag_specifications=[
                {"resource_type": kind, "tags": {"Name": f"{args.plain_cluster_name}-{spec.name}"}}
                for kind in ("instance", "volume")
            ],
            opts=child,
        )
        group = aws.eks.NodeGroup(
            f"{name}-{spec.name}",
            cluster_name=args.cluster_name,
            version=args.kubernetes_version,
            node_role_arn=role.arn,
            subnet_ids=subnet_ids,
            instance_types=list(spec.instance_types),
            capacity_type=spec.capacity_type,
            ami_type=spec.ami_type,
            scaling_config={
                "min_size": spec.min_size,
                "desired_size": spec.desired_size,
                "max_size": spec.max_size,
            },
            update_config={"max_unavailable": 1},
            labels=spec.labels,
            taints=eks_taints(spec.taints),
            launch_template={"id": launch_template.id, "version": launch_template.latest_version.apply(str)},
            tags={"Name": f"{args.plain_cluster_name}-{spec.name}"},
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[*role_ready, *args.depends_on],
                # The Cluster Autoscaler owns the desired size once the group exists; without this
                # every `pulumi up` would reset it (desired_size is the size at creation only).
                ignore_changes=["scalingConfig.desiredSize"],
            ),
        )
        # EKS does not copy node-group tags to the Auto Scaling group, which is where the Cluster
        # Autoscaler reads them; tag the group directly. Named by tag key so a changed label set
        # adds or removes exactly the tags that changed.
        auto_scaling_group = group.resources.apply(_auto_scaling_group_name)
        for key, value in spec.autoscaler_tags.items():
            aws.autoscaling.Tag(
                f"{name}-{spec.name}-{key}",
                autoscaling_group_name=auto_scaling_group,
                tag={"key": key, "value": value, "propagate_at_launch": False},
                opts=child,
            )
        return group


def _auto_scaling_group_name(resources: Sequence[aws.eks.outputs.NodeGroupResource]) -> str:
    # A managed node group has exactly one Auto Scaling group.
    return resources[0].autoscaling_groups[0].name
