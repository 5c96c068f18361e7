"""What the Kubernetes layer needs to know about the cluster it runs on (no AWS SDK types)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi

from infra.config import PlatformConfig


@dataclass(frozen=True)
class KarpenterMultiNodePlacement:
    """What a multi-node group's managed nodes get from their launch template, for a Karpenter pool's
    EC2NodeClass: one cluster placement group, one subnet (so one zone), and the EFA security group
    (all traffic to and from itself). Karpenter gives a node EFA interfaces itself when its pods
    request `vpc.amazonaws.com/efa` (EKS user guide, "Manage EFA devices")."""

    placement_group: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    efa_security_group_id: pulumi.Input[str]


@dataclass(frozen=True)
class ClusterContext:
    cluster_name: str
    region: str
    kubernetes_version: str
    efs_file_system_id: pulumi.Input[str]
    vpc_id: pulumi.Input[str] | None = None
    load_balancer_source_cidrs: tuple[str, ...] = ()
    """Where the load balancer's ENIs live (the subnets of its scheme): the only addresses allowed to
    reach vLLM pods from outside the cluster's pods (components/network_policy.py)."""
    service_account_role_arns: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    """IAM role (IRSA) per service account, keyed `namespace/name`; absent = no annotation."""
    web_acl_arn: pulumi.Input[str] | None = None
    """The WAF web ACL of the tenants' rate limits (infra/aws/tenant_limits.py), for the ALB."""
    karpenter_node_role: pulumi.Input[str] | None = None
    """Mode eks with Karpenter pools: the IAM role (name) of the nodes Karpenter launches
    (infra/aws/karpenter.py), for every EC2NodeClass."""
    karpenter_interruption_queue: pulumi.Input[str] | None = None
    """The SQS queue (name) of Karpenter's interruption handling, for the controller's settings."""
    karpenter_multi_node: Mapping[str, KarpenterMultiNodePlacement] = field(default_factory=dict)
    """Karpenter pools whose replicas span nodes (infra/multi_node.py group_needs_efa) → where their
    nodes go: the AWS layer's placement group, EFA security group and one subnet."""

    def role_arn_for(self, namespace: str, service_account: str) -> pulumi.Input[str] | None:
        return self.service_account_role_arns.get(f"{namespace}/{service_account}")

    @classmethod
    def for_existing_cluster(cls, config: PlatformConfig) -> ClusterContext:
        assert config.cluster.name is not None and config.storage.existing_efs_file_system_id is not None
        return cls(
            cluster_name=config.cluster.name,
            region=config.cluster.region,
            kubernetes_version=config.cluster.kubernetes_version,
            efs_file_system_id=config.storage.existing_efs_file_system_id,
            load_balancer_source_cidrs=tuple(config.security.load_balancer_source_cidrs),
        )
