"""What the Kubernetes layer needs to know about the cluster it runs on: the names the AWS layer
passes up to the program, which hands them to the Kubernetes layer (no AWS SDK types, no Pulumi)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar, Union

from domain.config import PlatformConfig

T = TypeVar("T")
Later: TypeAlias = Union[T, Any]  # noqa: UP007 (a generic alias: `T | Any` cannot be subscripted)
"""A value, or one the AWS layer knows only once it deploys (a Pulumi Output, `pulumi.Input[T]`):
the domain names no Pulumi type."""


@dataclass(frozen=True)
class KarpenterMultiNodePlacement:
    """What a multi-node group's managed nodes get from their launch template, for a Karpenter pool's
    EC2NodeClass: one cluster placement group, one subnet (so one zone), and the EFA security group
    (all traffic to and from itself). Karpenter gives a node EFA interfaces itself when its pods
    request `vpc.amazonaws.com/efa` (EKS user guide, "Manage EFA devices")."""

    placement_group: Later[str]
    subnet_id: Later[str]
    efa_security_group_id: Later[str]


@dataclass(frozen=True)
class ClusterContext:
    cluster_name: str
    region: str
    kubernetes_version: str
    efs_file_system_id: Later[str]
    vpc_id: Later[str] | None = None
    load_balancer_source_cidrs: tuple[str, ...] = ()
    """Where the load balancer's ENIs live (the subnets of its scheme): the only addresses allowed to
    reach vLLM pods from outside the cluster's pods (components/network_policy.py)."""
    service_account_role_arns: Mapping[str, Later[str]] = field(default_factory=dict)
    """IAM role (IRSA) per service account, keyed `namespace/name`; absent = no annotation."""
    web_acl_arn: Later[str] | None = None
    """The WAF web ACL of the tenants' rate limits (infra/aws/tenant_limits.py), for the ALB."""
    karpenter_node_role: Later[str] | None = None
    """Mode eks with Karpenter pools: the IAM role (name) of the nodes Karpenter launches
    (infra/aws/karpenter.py), for every EC2NodeClass."""
    karpenter_interruption_queue: Later[str] | None = None
    """The SQS queue (name) of Karpenter's interruption handling, for the controller's settings."""
    karpenter_multi_node: Mapping[str, KarpenterMultiNodePlacement] = field(default_factory=dict)
    """Karpenter pools whose replicas span nodes (domain/multi_node.py group_needs_efa) → where their
    nodes go: the AWS layer's placement group, EFA security group and one subnet."""

    def role_arn_for(self, namespace: str, service_account: str) -> Later[str] | None:
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
