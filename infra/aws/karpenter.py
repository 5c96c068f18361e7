"""What Karpenter's controller needs from AWS (issue 41), for the GPU groups with
`provisioner: karpenter`: the node role its nodes run as (with an EKS access entry), the controller's
IAM policy (its IRSA role is one of infra/aws/irsa.py's), the SQS interruption queue with the
EventBridge rules that feed it, and the `karpenter.sh/discovery` tags by which every EC2NodeClass
finds the stack's private subnets and the cluster security group.

Everything follows upstream's getting-started CloudFormation of the pinned release
(aws/karpenter-provider-aws, branch release-v1.14.1,
website/content/en/v1.14/getting-started/getting-started-with-karpenter/cloudformation.yaml), with
names derived from the cluster so the controller's policy can name each ARN instead of `*`. Tested
under Pulumi mocks (tests/test_karpenter_aws.py), like the rest of the AWS layer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from domain.config import PlatformConfig
from infra.aws.node_groups import NODE_MANAGED_POLICIES
from infra.aws.policies import AwsLocation, PolicyDocument, document, service_trust_policy, to_json

DISCOVERY_TAG = "karpenter.sh/discovery"
"""Tag on the private subnets and the cluster security group; the EC2NodeClass selects by it."""
IAM_ROLE_NAME_MAX = 64
QUEUE_MESSAGE_RETENTION_SECONDS = 300
"""Upstream's value: an interruption notice older than five minutes is past acting on."""
INTERRUPTION_EVENTS = {
    "scheduled-change": ("aws.health", "AWS Health Event"),
    "spot-interruption": ("aws.ec2", "EC2 Spot Instance Interruption Warning"),
    "rebalance": ("aws.ec2", "EC2 Instance Rebalance Recommendation"),
    "instance-state-change": ("aws.ec2", "EC2 Instance State-change Notification"),
    "reservation-interruption": ("aws.ec2", "EC2 Capacity Reservation Instance Interruption Warning"),
}
"""EventBridge rule per event kind the controller handles (upstream's five rules, same patterns)."""


def karpenter_pools(config: PlatformConfig) -> list[str]:
    return sorted(name for name, group in config.node_groups.gpu.items() if group.is_karpenter_pool)


def runs_karpenter(config: PlatformConfig) -> bool:
    """Mode eks with the add-on on and at least one pool: only then is anything of Karpenter created."""
    return (
        config.cluster.mode == "eks"
        and bool(config.addons.karpenter.enabled)
        and bool(karpenter_pools(config))
    )


def karpenter_node_role_name(cluster_name: str) -> str:
    """`<cluster>-karpenter-node`, fixed so the controller's iam:PassRole can name it (upstream:
    KarpenterNodeRole-<cluster>); shortened with a hash to IAM's 64 characters."""
    name = f"{cluster_name}-karpenter-node"
    if len(name) <= IAM_ROLE_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: IAM_ROLE_NAME_MAX - 9]}-{digest}"


def interruption_queue_name(cluster_name: str) -> str:
    """Upstream names the queue after the cluster (cluster names here are at most 40 characters,
    within SQS's 80)."""
    return cluster_name


def controller_policy(location: AwsLocation, cluster_name: str) -> PolicyDocument:
    """The controller's permissions: upstream's six policies of release v1.14.1 in one document,
    every launch, tag and delete scoped to this cluster's tags, PassRole to this stack's node role."""
    arn = f"arn:{location.partition}"
    ec2 = f"{arn}:ec2:{location.region}"
    owned = {f"aws:ResourceTag/kubernetes.io/cluster/{cluster_name}": "owned"}
    requested = {
        f"aws:RequestTag/kubernetes.io/cluster/{cluster_name}": "owned",
        "aws:RequestTag/eks:eks-cluster-name": cluster_name,
    }
    tagged_kinds = (
        "fleet",
        "instance",
        "volume",
        "network-interface",
        "launch-template",
        "spot-instances-request",
    )
    profiles = f"{arn}:iam::{location.account_id}:instance-profile/*"
    region_tag = {"aws:RequestTag/topology.kubernetes.io/region": location.region}
    cluster_arn = f"{arn}:eks:{location.region}:{location.account_id}:cluster/{cluster_name}"
    return document(
        {
            "Sid": "AllowScopedEC2InstanceAccessActions",
            "Effect": "Allow",
            "Resource": [
                f"{ec2}::image/*",
                f"{ec2}::snapshot/*",
                f"{ec2}:*:security-group/*",
                f"{ec2}:*:subnet/*",
                f"{ec2}:*:capacity-reservation/*",
                f"{ec2}:*:placement-group/*",
            ],
            "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
        },
        {
            "Sid": "AllowScopedEC2LaunchTemplateAccessActions",
            "Effect": "Allow",
            "Resource": f"{ec2}:*:launch-template/*",
            "Action": ["ec2:RunInstances", "ec2:CreateFleet"],
            "Condition": {
                "StringEquals": owned,
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowScopedEC2InstanceActionsWithTags",
            "Effect": "Allow",
            "Resource": [f"{ec2}:*:{kind}/*" for kind in tagged_kinds],
            "Action": ["ec2:RunInstances", "ec2:CreateFleet", "ec2:CreateLaunchTemplate"],
            "Condition": {
                "StringEquals": requested,
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowScopedResourceCreationTagging",
            "Effect": "Allow",
            "Resource": [f"{ec2}:*:{kind}/*" for kind in tagged_kinds],
            "Action": "ec2:CreateTags",
            "Condition": {
                "StringEquals": {
                    **requested,
                    "ec2:CreateAction": ["RunInstances", "CreateFleet", "CreateLaunchTemplate"],
                },
                "StringLike": {"aws:RequestTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowScopedResourceTagging",
            "Effect": "Allow",
            "Resource": f"{ec2}:*:instance/*",
            "Action": "ec2:CreateTags",
            "Condition": {
                "StringEquals": owned,
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
                "StringEqualsIfExists": {"aws:RequestTag/eks:eks-cluster-name": cluster_name},
                "ForAllValues:StringEquals": {
                    "aws:TagKeys": ["eks:eks-cluster-name", "karpenter.sh/nodeclaim", "Name"]
                },
            },
        },
        {
            "Sid": "AllowScopedDeletion",
            "Effect": "Allow",
            "Resource": [f"{ec2}:*:instance/*", f"{ec2}:*:launch-template/*"],
            "Action": ["ec2:TerminateInstances", "ec2:DeleteLaunchTemplate"],
            "Condition": {
                "StringEquals": owned,
                "StringLike": {"aws:ResourceTag/karpenter.sh/nodepool": "*"},
            },
        },
        {
            "Sid": "AllowPassingInstanceRole",
            "Effect": "Allow",
            "Resource": f"{arn}:iam::{location.account_id}:role/{karpenter_node_role_name(cluster_name)}",
            "Action": "iam:PassRole",
            "Condition": {
                "StringEquals": {"iam:PassedToService": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}
            },
        },
        {
            "Sid": "AllowScopedInstanceProfileCreationActions",
            "Effect": "Allow",
            "Resource": profiles,
            "Action": ["iam:CreateInstanceProfile"],
            "Condition": {
                "StringEquals": {**requested, **region_tag},
                "StringLike": {"aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        },
        {
            "Sid": "AllowScopedInstanceProfileTagActions",
            "Effect": "Allow",
            "Resource": profiles,
            "Action": ["iam:TagInstanceProfile"],
            "Condition": {
                "StringEquals": {
                    **owned,
                    "aws:ResourceTag/topology.kubernetes.io/region": location.region,
                    **requested,
                    **region_tag,
                },
                "StringLike": {
                    "aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*",
                    "aws:RequestTag/karpenter.k8s.aws/ec2nodeclass": "*",
                },
            },
        },
        {
            "Sid": "AllowScopedInstanceProfileActions",
            "Effect": "Allow",
            "Resource": profiles,
            "Action": [
                "iam:AddRoleToInstanceProfile",
                "iam:RemoveRoleFromInstanceProfile",
                "iam:DeleteInstanceProfile",
            ],
            "Condition": {
                "StringEquals": {**owned, "aws:ResourceTag/topology.kubernetes.io/region": location.region},
                "StringLike": {"aws:ResourceTag/karpenter.k8s.aws/ec2nodeclass": "*"},
            },
        },
        {
            "Sid": "AllowAPIServerEndpointDiscovery",
            "Effect": "Allow",
            "Resource": cluster_arn,
            "Action": "eks:DescribeCluster",
        },
        {
            "Sid": "AllowInterruptionQueueActions",
            "Effect": "Allow",
            "Resource": (
                f"{arn}:sqs:{location.region}:{location.account_id}:{interruption_queue_name(cluster_name)}"
            ),
            "Action": ["sqs:DeleteMessage", "sqs:GetQueueUrl", "sqs:ReceiveMessage"],
        },
        {
            "Sid": "AllowRegionalReadActions",
            "Effect": "Allow",
            "Resource": "*",
            "Action": [
                "ec2:DescribeCapacityReservations",
                "ec2:DescribeImages",
                "ec2:DescribeInstances",
                "ec2:DescribeInstanceStatus",
                "ec2:DescribeInstanceTypeOfferings",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeLaunchTemplates",
                "ec2:DescribePlacementGroups",
                "ec2:DescribeSecurityGroups",
                "ec2:DescribeSpotPriceHistory",
                "ec2:DescribeSubnets",
            ],
            "Condition": {"StringEquals": {"aws:RequestedRegion": location.region}},
        },
        {
            "Sid": "AllowSSMReadActions",
            "Effect": "Allow",
            "Resource": f"{arn}:ssm:{location.region}::parameter/aws/service/*",
            "Action": "ssm:GetParameter",
        },
        # Neither supports resource-level permissions (upstream grants them on `*` too).
        {
            "Sid": "AllowPricingReadActions",
            "Effect": "Allow",
            "Resource": "*",
            "Action": "pricing:GetProducts",
        },
        {
            "Sid": "AllowUnscopedInstanceProfileListAction",
            "Effect": "Allow",
            "Resource": "*",
            "Action": "iam:ListInstanceProfiles",
        },
        {
            "Sid": "AllowInstanceProfileReadActions",
            "Effect": "Allow",
            "Resource": profiles,
            "Action": "iam:GetInstanceProfile",
        },
    )


def interruption_queue_policy(queue_arn: str) -> PolicyDocument:
    """EventBridge (and SQS itself) may send; nothing reaches the queue over plain HTTP."""
    return document(
        {
            "Sid": "EventBridgeSends",
            "Effect": "Allow",
            "Principal": {"Service": ["events.amazonaws.com", "sqs.amazonaws.com"]},
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
        },
        {
            "Sid": "DenyHTTP",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "sqs:*",
            "Resource": queue_arn,
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        },
    )


@dataclass(frozen=True)
class KarpenterAwsArgs:
    cluster_name: pulumi.Input[str]
    """The cluster resource's name output (the access entry waits for the cluster)."""
    plain_cluster_name: str
    private_subnet_ids: Sequence[pulumi.Input[str]]
    cluster_security_group_id: pulumi.Input[str]
    partition: str = "aws"


class KarpenterAws(pulumi.ComponentResource):
    node_role_name: pulumi.Output[str]
    node_role_arn: pulumi.Output[str]
    queue_name: pulumi.Output[str]

    def __init__(self, name: str, args: KarpenterAwsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:aws:KarpenterAws", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster = args.plain_cluster_name

        role = aws.iam.Role(
            f"{name}-node-role",
            name=karpenter_node_role_name(cluster),
            assume_role_policy=to_json(service_trust_policy("ec2.amazonaws.com")),
            description=f"Nodes Karpenter launches for {cluster}",
            opts=child,
        )
        for policy in NODE_MANAGED_POLICIES:
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy}",
                role=role.name,
                policy_arn=f"arn:{args.partition}:iam::aws:policy/{policy}",
                opts=child,
            )
        # Nodes join through an access entry (authentication mode API), as the managed groups' do.
        aws.eks.AccessEntry(
            f"{name}-node-access-entry",
            cluster_name=args.cluster_name,
            principal_arn=role.arn,
            type="EC2_LINUX",
            opts=child,
        )

        queue = aws.sqs.Queue(
            f"{name}-interruption-queue",
            name=interruption_queue_name(cluster),
            message_retention_seconds=QUEUE_MESSAGE_RETENTION_SECONDS,
            sqs_managed_sse_enabled=True,
            opts=child,
        )
        aws.sqs.QueuePolicy(
            f"{name}-interruption-queue-policy",
            queue_url=queue.url,
            policy=queue.arn.apply(lambda queue_arn: to_json(interruption_queue_policy(queue_arn))),
            opts=child,
        )
        for kind, (source, detail_type) in INTERRUPTION_EVENTS.items():
            rule = aws.cloudwatch.EventRule(
                f"{name}-{kind}",
                description=f"Karpenter interruption handling for {cluster}: {detail_type}",
                event_pattern=to_json({"source": [source], "detail-type": [detail_type]}),
                opts=child,
            )
            aws.cloudwatch.EventTarget(
                f"{name}-{kind}",
                rule=rule.name,
                target_id="KarpenterInterruptionQueueTarget",
                arn=queue.arn,
                opts=child,
            )

        for index, subnet_id in enumerate(args.private_subnet_ids):
            aws.ec2.Tag(
                f"{name}-subnet-{index}", resource_id=subnet_id, key=DISCOVERY_TAG, value=cluster, opts=child
            )
        aws.ec2.Tag(
            f"{name}-security-group",
            resource_id=args.cluster_security_group_id,
            key=DISCOVERY_TAG,
            value=cluster,
            opts=child,
        )

        self.node_role_name = role.name
        self.node_role_arn = role.arn
        self.queue_name = queue.name
        self.register_outputs({"node_role_name": self.node_role_name, "queue_name": self.queue_name})
