"""Model storage: the S3 bucket of record for weights and the EFS file system for the shared volume."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws.policies import (
    AwsLocation,
    efs_file_system_policy,
    model_bucket_key_policy,
    tls_only_bucket_policy,
    to_json,
)

NFS_PORT = 2049
# Large weight uploads that die half-way leave invisible, billed parts behind.
ABORT_INCOMPLETE_UPLOADS_AFTER_DAYS = 7
# Versioning guards against an overwritten or deleted revision; old versions go after a month.
NONCURRENT_VERSION_EXPIRATION_DAYS = 30


@dataclass(frozen=True)
class ModelStorageArgs:
    cluster_name: str
    bucket_name: str
    efs_throughput_mode: str
    vpc_id: pulumi.Input[str]
    subnet_ids: Sequence[pulumi.Input[str]]
    """One EFS mount target per subnet (the private node subnets, one per AZ)."""
    node_security_group_id: pulumi.Input[str]
    """The EKS cluster security group, which managed nodes carry: the only NFS clients allowed."""
    location: AwsLocation
    """For the key policy's account and the S3 service name."""
    efs_client_role_arns: Sequence[pulumi.Input[str]] = ()
    """IAM roles that may mount the file system (the node role: the EFS CSI node plugin mounts)."""


class ModelStorage(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    bucket_kms_key_arn: pulumi.Output[str]
    efs_file_system_id: pulumi.Output[str]

    def __init__(self, name: str, args: ModelStorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:aws:ModelStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # SSE-KMS with a key of our own rather than S3-managed keys: fine-tuned weights are often
        # the product, and reading them then takes kms:Decrypt as well as s3:GetObject, which only
        # the model's own IRSA role is granted (and CloudTrail records). The bucket key keeps KMS
        # requests (and their cost and throttling) to a few per object, not one per request.
        key = aws.kms.Key(
            f"{name}-bucket",
            description=f"Model weights bucket {args.bucket_name}",
            policy=to_json(model_bucket_key_policy(args.location)),
            enable_key_rotation=True,
            deletion_window_in_days=30,
            opts=child,
        )
        aws.kms.Alias(
            f"{name}-bucket",
            name=f"alias/{args.cluster_name}-model-weights",
            target_key_id=key.key_id,
            opts=child,
        )
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket=args.bucket_name,
            # Deleting the stack must not delete weights: destroy fails on a non-empty bucket instead.
            force_destroy=False,
            opts=child,
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-bucket", bucket=bucket.id, rule={"object_ownership": "BucketOwnerEnforced"}, opts=child
        )
        public_access_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-bucket",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketVersioning(
            f"{name}-bucket", bucket=bucket.id, versioning_configuration={"status": "Enabled"}, opts=child
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-bucket",
            bucket=bucket.id,
            rules=[
                {
                    "apply_server_side_encryption_by_default": {
                        "sse_algorithm": "aws:kms",
                        "kms_master_key_id": key.arn,
                    },
                    "bucket_key_enabled": True,
                }
            ],
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-bucket",
            bucket=bucket.id,
            rules=[
                {
                    "id": "housekeeping",
                    "status": "Enabled",
                    "filter": {},
                    "abort_incomplete_multipart_upload": {
                        "days_after_initiation": ABORT_INCOMPLETE_UPLOADS_AFTER_DAYS
                    },
                    "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_VERSION_EXPIRATION_DAYS},
                }
            ],
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-bucket",
            bucket=bucket.id,
            policy=bucket.arn.apply(lambda arn: to_json(tls_only_bucket_policy(arn))),
            # S3 evaluates a new policy against the public-access block; put the block in place first.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access_block]),
        )

        file_system = aws.efs.FileSystem(
            f"{name}-efs",
            encrypted=True,
            throughput_mode=args.efs_throughput_mode,
            # Elastic throughput requires General Purpose; Max I/O only adds latency for few large files.
            performance_mode="generalPurpose",
            # No lifecycle to Infrequent Access: every cold node reads the weights, and IA bills per GB read.
            tags={"Name": f"{args.cluster_name}-models"},
            opts=child,
        )
        aws.efs.FileSystemPolicy(
            f"{name}-efs",
            file_system_id=file_system.id,
            policy=pulumi.Output.all(file_system.arn, *args.efs_client_role_arns).apply(
                lambda values: to_json(efs_file_system_policy(values[0], list(values[1:])))
            ),
            opts=child,
        )
        security_group = aws.ec2.SecurityGroup(
            f"{name}-efs",
            vpc_id=args.vpc_id,
            description=f"NFS to the {args.cluster_name} model file system from cluster nodes only",
            tags={"Name": f"{args.cluster_name}-efs"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efs-nfs",
            security_group_id=security_group.id,
            referenced_security_group_id=args.node_security_group_id,
            ip_protocol="tcp",
            from_port=NFS_PORT,
            to_port=NFS_PORT,
            description="NFS from EKS nodes",
            opts=child,
        )
        for index, subnet_id in enumerate(args.subnet_ids):
            aws.efs.MountTarget(
                f"{name}-efs-{index}",
                file_system_id=file_system.id,
                subnet_id=subnet_id,
                security_groups=[security_group.id],
                opts=child,
            )

        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.bucket_kms_key_arn = key.arn
        self.efs_file_system_id = file_system.id
        self.register_outputs(
            {
                "bucket_name": self.bucket_name,
                "bucket_kms_key_arn": self.bucket_kms_key_arn,
                "efs_file_system_id": self.efs_file_system_id,
            }
        )
