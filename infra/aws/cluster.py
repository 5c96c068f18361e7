"""The EKS control plane: IAM role, secrets-encryption KMS key, cluster, OIDC provider, admin access.

Access is managed only through EKS access entries (authentication mode API, no aws-auth
ConfigMap): every principal with cluster access is a resource in this stack and shows in preview.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from domain.config.cluster import ClusterConfig
from infra.aws.policies import (
    STS_AUDIENCE,
    AwsLocation,
    eks_secrets_key_policy,
    secrets_encryption_key_policy,
    service_trust_policy,
    to_json,
)

# SHA-1 of the root CA ("Starfield Services Root Certificate Authority - G2") behind every
# oidc.eks.<region>.amazonaws.com issuer. IAM no longer checks thumbprints for issuers whose
# certificate chains to a trusted root CA (IAM user guide, "Create an OIDC identity provider"),
# but the API still stores one; a constant keeps preview free of a TLS look-up.
EKS_OIDC_ROOT_CA_THUMBPRINT = "9e99a48a9960b14926bb7f3b02e22da2b0ab7280"
CLUSTER_ADMIN_ACCESS_POLICY = "AmazonEKSClusterAdminPolicy"
CONTROL_PLANE_LOG_RETENTION_DAYS = 90
"""EKS creates its log group with no expiry; creating it first, with a retention, caps the cost."""
SECRETS_KEY_DELETION_WINDOW_DAYS = 30  # the maximum: a deleted key makes every Secret unreadable


def kubeconfig(cluster_name: str, region: str, endpoint: str, certificate_authority_data: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (the AWS CLI of whoever runs Pulumi)."""
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": [
                "eks",
                "get-token",
                "--cluster-name",
                cluster_name,
                "--region",
                region,
                "--output",
                "json",
            ],
            "interactiveMode": "Never",
        }
    }
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": endpoint, "certificate-authority-data": certificate_authority_data},
            }
        ],
        "users": [{"name": cluster_name, "user": user}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "current-context": cluster_name,
    }
    return json.dumps(document, indent=2)


def admin_principals(configured: Sequence[str], deployer_arn: str | None) -> list[str]:
    """`cluster.admin_principal_arns` plus the identity running Pulumi (which the Kubernetes provider
    authenticates as), each once: EKS refuses a second access entry for the same principal."""
    principals = list(dict.fromkeys(configured))
    if deployer_arn and deployer_arn not in principals:
        principals.append(deployer_arn)
    return principals


def principal_resource_name(principal_arn: str) -> str:
    """A stable resource-name fragment for a principal: account and role/user name, not a list index
    (an index would move every entry when the list changes, and EKS allows one entry per principal)."""
    match = re.match(r"^arn:[^:]+:(iam|sts)::(\d{12}):(.+)$", principal_arn)
    if not match:
        raise ValueError(f"not an IAM principal ARN: {principal_arn!r}")
    account, resource = match[2], match[3]
    return f"{account}-{resource.replace('/', '-')}"


@dataclass(frozen=True)
class EksClusterArgs:
    cluster: ClusterConfig
    subnet_ids: Sequence[pulumi.Input[str]]
    admin_principal_arns: Sequence[str]
    """Every principal to make cluster-admin (see `admin_principals`)."""
    partition: str = "aws"
    location: AwsLocation | None = None
    """Account and region for the Secrets key's explicit policy."""


class EksCluster(pulumi.ComponentResource):
    cluster: aws.eks.Cluster
    name_output: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    certificate_authority_data: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    """The security group EKS creates and attaches to the control plane and to managed nodes."""
    oidc_issuer_url: pulumi.Output[str]
    oidc_provider_arn: pulumi.Output[str]
    secrets_key_arn: pulumi.Output[str]
    admin_access: list[pulumi.Resource]
    """Access entries and policy associations of the admins; the Kubernetes provider waits for them."""

    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:aws:EksCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        config = args.cluster
        cluster_name = config.name
        assert cluster_name is not None, "resolve_stack_defaults fills cluster.name"

        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=to_json(service_trust_policy("eks.amazonaws.com")),
            description=f"EKS control plane of {cluster_name}",
            opts=child,
        )
        role_policy = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-policy",
            role=role.name,
            policy_arn=f"arn:{args.partition}:iam::aws:policy/AmazonEKSClusterPolicy",
            opts=child,
        )

        # Envelope encryption of Secrets with a key of our own: etcd backups and snapshots then hold
        # only ciphertext, and disabling the key is a kill switch for every Secret.
        secrets_key = aws.kms.Key(
            f"{name}-secrets",
            description=f"EKS Secrets envelope encryption for {cluster_name}",
            policy=to_json(eks_secrets_key_policy(args.location)) if args.location else None,
            enable_key_rotation=True,
            deletion_window_in_days=SECRETS_KEY_DELETION_WINDOW_DAYS,
            opts=child,
        )
        aws.kms.Alias(
            f"{name}-secrets",
            name=f"alias/{cluster_name}-eks-secrets",
            target_key_id=secrets_key.key_id,
            opts=child,
        )
        key_policy = aws.iam.RolePolicy(
            f"{name}-secrets-key",
            role=role.id,
            policy=secrets_key.arn.apply(lambda arn: to_json(secrets_encryption_key_policy(arn))),
            opts=child,
        )

        depends_on: list[pulumi.Resource] = [role_policy, key_policy]
        if config.control_plane_logging:
            depends_on.append(
                aws.cloudwatch.LogGroup(
                    f"{name}-control-plane-logs",
                    name=f"/aws/eks/{cluster_name}/cluster",
                    retention_in_days=CONTROL_PLANE_LOG_RETENTION_DAYS,
                    opts=child,
                )
            )

        vpc_config: dict[str, object] = {
            "subnet_ids": list(args.subnet_ids),
            "endpoint_private_access": True,
            "endpoint_public_access": config.endpoint_public_access,
        }
        if config.endpoint_public_access:
            vpc_config["public_access_cidrs"] = list(config.public_access_cidrs)
        self.cluster = aws.eks.Cluster(
            f"{name}-cluster",
            name=cluster_name,
            version=config.kubernetes_version,
            role_arn=role.arn,
            vpc_config=vpc_config,
            enabled_cluster_log_types=list(config.control_plane_logging),
            encryption_config={"provider": {"key_arn": secrets_key.arn}, "resources": ["secrets"]},
            access_config={
                "authentication_mode": "API",
                # The deployer gets an explicit access entry below (visible, and removable) instead.
                "bootstrap_cluster_creator_admin_permissions": False,
            },
            # vpc-cni, kube-proxy and CoreDNS come as EKS managed add-ons (infra/aws/addons.py), not
            # as unmanaged copies nobody upgrades.
            bootstrap_self_managed_addons=False,
            # At the end of standard support EKS upgrades the control plane rather than moving it to
            # extended support, which costs six times as much per hour.
            upgrade_policy={"support_type": "STANDARD"},
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on),
        )

        self.oidc_issuer_url = self.cluster.identities.apply(lambda identities: identities[0].oidcs[0].issuer)
        oidc_provider = aws.iam.OpenIdConnectProvider(
            f"{name}-oidc",
            url=self.oidc_issuer_url,
            client_id_lists=[STS_AUDIENCE],
            thumbprint_lists=[EKS_OIDC_ROOT_CA_THUMBPRINT],
            opts=child,
        )

        self.admin_access = []
        policy_arn = f"arn:{args.partition}:eks::aws:cluster-access-policy/{CLUSTER_ADMIN_ACCESS_POLICY}"
        for principal in args.admin_principal_arns:
            entry_name = f"{name}-admin-{principal_resource_name(principal)}"
            entry = aws.eks.AccessEntry(
                entry_name,
                cluster_name=self.cluster.name,
                principal_arn=principal,
                type="STANDARD",
                opts=child,
            )
            association = aws.eks.AccessPolicyAssociation(
                entry_name,
                cluster_name=self.cluster.name,
                principal_arn=principal,
                policy_arn=policy_arn,
                access_scope={"type": "cluster"},
                opts=pulumi.ResourceOptions(parent=self, depends_on=[entry]),
            )
            self.admin_access += [entry, association]

        self.name_output = self.cluster.name
        self.endpoint = self.cluster.endpoint
        self.certificate_authority_data = self.cluster.certificate_authority.apply(
            lambda authority: authority.data
        )
        self.security_group_id = self.cluster.vpc_config.apply(lambda vpc: vpc.cluster_security_group_id)
        self.oidc_provider_arn = oidc_provider.arn
        self.secrets_key_arn = secrets_key.arn
        self.register_outputs(
            {
                "cluster_name": self.name_output,
                "endpoint": self.endpoint,
                "oidc_provider_arn": self.oidc_provider_arn,
                "security_group_id": self.security_group_id,
            }
        )
