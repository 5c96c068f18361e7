"""IAM and resource policy documents, as plain dicts (json.dumps them for the resources).

Pure functions, so every statement is covered by a plain test and shows up verbatim in the
offline render — no `get_policy_document` invokes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PolicyDocument = dict[str, Any]
_VERSION = "2012-10-17"
STS_AUDIENCE = "sts.amazonaws.com"

LOAD_BALANCER_CONTROLLER_POLICY_FILE = Path(__file__).with_name(
    "aws_load_balancer_controller_iam_policy.json"
)
LOAD_BALANCER_CONTROLLER_POLICY_SOURCE = "https://raw.githubusercontent.com/kubernetes-sigs/aws-load-balancer-controller/v2.13.0/docs/install/iam_policy.json"
"""Where aws_load_balancer_controller_iam_policy.json comes from (transcribed 2026-11-29 in an
environment without access to GitHub: diff it against this URL before the first deployment). It
must match the controller release the add-on chart installs: re-fetch it whenever that pin moves."""


def document(*statements: dict[str, Any]) -> PolicyDocument:
    return {"Version": _VERSION, "Statement": list(statements)}


def to_json(policy: PolicyDocument) -> str:
    """Compact JSON: IAM counts every character against its policy size limits."""
    return json.dumps(policy, separators=(",", ":"), sort_keys=False)


def service_trust_policy(service: str) -> PolicyDocument:
    """Trust policy letting an AWS service principal (eks.amazonaws.com, ec2.amazonaws.com) assume a role."""
    return document({"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"})


def oidc_issuer_host(issuer_url: str) -> str:
    """The issuer as IAM condition keys spell it: without the scheme."""
    return issuer_url.removeprefix("https://")


def irsa_trust_policy(
    oidc_provider_arn: str, issuer_url: str, namespace: str, service_account: str
) -> PolicyDocument:
    """Only this one service account, with tokens minted for STS, may assume the role (IRSA)."""
    host = oidc_issuer_host(issuer_url)
    return document(
        {
            "Effect": "Allow",
            "Principal": {"Federated": oidc_provider_arn},
            "Action": "sts:AssumeRoleWithWebIdentity",
            "Condition": {
                "StringEquals": {
                    f"{host}:sub": f"system:serviceaccount:{namespace}:{service_account}",
                    f"{host}:aud": STS_AUDIENCE,
                }
            },
        }
    )


@dataclass(frozen=True)
class AwsLocation:
    """Partition, region and account: what ARNs of regional resources are built from."""

    partition: str
    region: str
    account_id: str


def secret_arn_pattern(location: AwsLocation, secret_name: str) -> str:
    # Secrets Manager appends a '-' and six random characters to every secret's ARN.
    prefix = f"arn:{location.partition}:secretsmanager:{location.region}:{location.account_id}"
    return f"{prefix}:secret:{secret_name}-??????"


def model_access_policy(
    *,
    location: AwsLocation,
    s3_bucket: str | None,
    s3_prefix: str | None,
    secret_names: tuple[str, ...] = (),
    adapter_s3_prefixes: tuple[tuple[str, str], ...] = (),
) -> PolicyDocument | None:
    """Read-only access of one model's pods: its S3 prefix, its LoRA adapters' prefixes (bucket,
    prefix), its own secrets; None when nothing applies.

    Each prefix ends with '/' (ModelSourceConfig.s3_prefix), so `prefix*` cannot reach a sibling
    revision such as `.../rev1-old/`.
    """
    statements: list[dict[str, Any]] = []
    if s3_bucket is not None:
        if not s3_prefix or not s3_prefix.endswith("/"):
            raise ValueError(f"s3_prefix must be a non-empty prefix ending in '/', not {s3_prefix!r}")
        bucket_arn = f"arn:{location.partition}:s3:::{s3_bucket}"
        statements += [
            {
                "Sid": "ListModelPrefix",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
                "Condition": {"StringLike": {"s3:prefix": [s3_prefix, f"{s3_prefix}*"]}},
            },
            {
                "Sid": "ReadModelObjects",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": f"{bucket_arn}/{s3_prefix}*",
            },
        ]
    adapter_buckets: dict[str, list[str]] = {}
    for bucket, prefix in adapter_s3_prefixes:
        if not prefix.endswith("/"):
            raise ValueError(f"adapter prefix must end in '/', not {prefix!r}")
        adapter_buckets.setdefault(bucket, []).append(prefix)
    for number, (bucket, prefixes) in enumerate(sorted(adapter_buckets.items())):
        # One statement per bucket: a ListBucket condition holds for the bucket it names.
        statements.append(
            {
                "Sid": f"ListAdapterPrefixes{number}",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:{location.partition}:s3:::{bucket}",
                "Condition": {
                    "StringLike": {"s3:prefix": [p for prefix in prefixes for p in (prefix, f"{prefix}*")]}
                },
            }
        )
    if adapter_s3_prefixes:
        statements.append(
            {
                "Sid": "ReadAdapterObjects",
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": [
                    f"arn:{location.partition}:s3:::{bucket}/{prefix}*"
                    for bucket, prefix in adapter_s3_prefixes
                ],
            }
        )
    if secret_names:
        statements.append(
            {
                "Sid": "ReadModelSecrets",
                "Effect": "Allow",
                "Action": ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"],
                "Resource": [secret_arn_pattern(location, name) for name in secret_names],
            }
        )
    return document(*statements) if statements else None


def with_model_bucket_decrypt(policy: PolicyDocument, location: AwsLocation, key_arn: str) -> PolicyDocument:
    """A model policy plus kms:Decrypt on the stack's model-bucket key (SSE-KMS objects need both)."""
    decrypt = {
        "Sid": "DecryptModelObjects",
        "Effect": "Allow",
        "Action": "kms:Decrypt",
        "Resource": key_arn,
        # The key opens only objects read through S3, not arbitrary ciphertext.
        "Condition": {"StringEquals": {"kms:ViaService": f"s3.{location.region}.amazonaws.com"}},
    }
    return {**policy, "Statement": [*policy["Statement"], decrypt]}


def cluster_autoscaler_policy(location: AwsLocation, cluster_name: str) -> PolicyDocument:
    """Cluster Autoscaler (upstream cluster-autoscaler/cloudprovider/aws/README.md, "IAM Policy"):
    reads everywhere, but changes only the Auto Scaling groups tagged as this cluster's."""
    return document(
        {
            "Sid": "ScaleThisClustersGroups",
            "Effect": "Allow",
            "Action": ["autoscaling:SetDesiredCapacity", "autoscaling:TerminateInstanceInAutoScalingGroup"],
            "Resource": "*",
            "Condition": {
                "StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}
            },
        },
        {
            "Sid": "DescribeScalingState",
            "Effect": "Allow",
            # None of these support resource-level permissions.
            "Action": [
                "autoscaling:DescribeAutoScalingGroups",
                "autoscaling:DescribeAutoScalingInstances",
                "autoscaling:DescribeLaunchConfigurations",
                "autoscaling:DescribeScalingActivities",
                "autoscaling:DescribeTags",
                "ec2:DescribeImages",
                "ec2:DescribeInstanceTypes",
                "ec2:DescribeLaunchTemplateVersions",
                "ec2:GetInstanceTypesFromInstanceRequirements",
            ],
            "Resource": "*",
        },
        {
            "Sid": "DescribeThisClustersNodegroups",
            "Effect": "Allow",
            # Labels and taints of managed node groups, for scale-from-zero templates.
            "Action": "eks:DescribeNodegroup",
            "Resource": (
                f"arn:{location.partition}:eks:{location.region}:{location.account_id}:nodegroup/{cluster_name}/*"
            ),
        },
    )


def secrets_encryption_key_policy(key_arn: str) -> PolicyDocument:
    """What the EKS cluster role needs on its envelope-encryption key (EKS user guide, "Encrypt
    Kubernetes secrets with KMS"); the key policy itself stays the account default."""
    return document(
        {
            "Effect": "Allow",
            "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
            "Resource": key_arn,
        }
    )


def tls_only_bucket_policy(bucket_arn: str) -> PolicyDocument:
    """Refuse every request to the bucket or its objects that does not arrive over TLS."""
    return document(
        {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }
    )


def efs_file_system_policy(file_system_arn: str, client_role_arns: list[str]) -> PolicyDocument:
    """Mounts over TLS only, by the named IAM roles (the nodes, whose EFS CSI node plugin mounts with
    `mountOptions: [tls, iam]`) and through a mount target; no ClientRootAccess for anyone, so root
    on a client is squashed and only the per-PVC access points' POSIX identities write (issue 15)."""
    return document(
        {
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": "*",
            "Resource": file_system_arn,
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        },
        {
            "Sid": "MountAndWriteByClusterNodesThroughMountTargets",
            "Effect": "Allow",
            "Principal": {"AWS": sorted(client_role_arns)},
            "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"],
            "Resource": file_system_arn,
            "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}},
        },
    )


def _key_administration(location: AwsLocation) -> dict[str, Any]:
    # Without this the key can become unmanageable (AWS KMS: "Allows access for the AWS account"):
    # IAM policies in the account decide who administers it, as with the default policy, but written
    # out so the key's whole policy is in the preview diff.
    return {
        "Sid": "AccountAdministersTheKey",
        "Effect": "Allow",
        "Principal": {"AWS": f"arn:{location.partition}:iam::{location.account_id}:root"},
        "Action": "kms:*",
        "Resource": "*",
    }


CRYPTOGRAPHIC_ACTIONS = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey*", "kms:ReEncrypt*"]


def model_bucket_key_policy(location: AwsLocation) -> PolicyDocument:
    """The model bucket's key encrypts and decrypts only on behalf of S3 (for the objects of the
    bucket), never for a direct kms:Decrypt call, whoever makes it."""
    return document(
        _key_administration(location),
        {
            "Sid": "OnlyThroughS3",
            "Effect": "Deny",
            "Principal": {"AWS": "*"},
            "Action": CRYPTOGRAPHIC_ACTIONS,
            "Resource": "*",
            "Condition": {"StringNotEquals": {"kms:ViaService": f"s3.{location.region}.amazonaws.com"}},
        },
    )


def eks_secrets_key_policy(location: AwsLocation) -> PolicyDocument:
    """The EKS Secrets key: administered by the account; used by the cluster role (its role policy,
    secrets_encryption_key_policy) through the EKS control plane."""
    return document(_key_administration(location))


def flow_log_delivery_policy(log_group_arn: str) -> PolicyDocument:
    """What the VPC flow-log service needs to write into its one log group (AWS VPC user guide)."""
    return document(
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
            "Resource": [log_group_arn, f"{log_group_arn}:*"],
        }
    )


def load_balancer_controller_policy() -> PolicyDocument:
    """The AWS Load Balancer Controller's own IAM policy, as published with the controller."""
    return json.loads(LOAD_BALANCER_CONTROLLER_POLICY_FILE.read_text())
