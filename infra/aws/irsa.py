"""IAM roles for service accounts (IRSA): one role per Kubernetes service account that needs AWS.

Each role trusts the cluster's OIDC provider for exactly one `system:serviceaccount:<ns>:<name>`
subject and the STS audience. Which accounts get roles, and with which permissions, is decided by
`service_account_role_specs` (pure, from config); this component only creates them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from domain.config import PlatformConfig
from domain.config.platform import MonitoringConfig
from domain.config.tenants import model_key_secrets
from domain.key_files import wake_gate_key_files
from domain.service_accounts import (
    AWS_LOAD_BALANCER_CONTROLLER,
    CLUSTER_AUTOSCALER,
    EBS_CSI_CONTROLLER,
    EFS_CSI_CONTROLLER,
    KARPENTER,
    ROUTER_SERVICE_ACCOUNT,
    ServiceAccountRef,
    alertmanager_service_account,
    grafana_service_account,
    model_service_account,
)
from infra.aws.karpenter import controller_policy as karpenter_controller_policy
from infra.aws.karpenter import runs_karpenter
from infra.aws.policies import (
    AwsLocation,
    PolicyDocument,
    cluster_autoscaler_policy,
    irsa_trust_policy,
    load_balancer_controller_policy,
    model_access_policy,
    to_json,
    with_model_bucket_decrypt,
)

IAM_ROLE_NAME_MAX = 64
EFS_CSI_DRIVER_MANAGED_POLICY = "service-role/AmazonEFSCSIDriverPolicy"
EBS_CSI_DRIVER_MANAGED_POLICY = "service-role/AmazonEBSCSIDriverPolicy"


def iam_role_name(cluster_name: str, account: ServiceAccountRef) -> str:
    """`<cluster>-<namespace>-<name>`, readable in the IAM console; shortened with a hash to IAM's 64."""
    name = f"{cluster_name}-{account.namespace}-{account.name}"
    if len(name) <= IAM_ROLE_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: IAM_ROLE_NAME_MAX - 9]}-{digest}"


@dataclass(frozen=True)
class ServiceAccountRoleSpec:
    service_account: ServiceAccountRef
    managed_policies: tuple[str, ...] = ()
    """AWS managed policies, by the part of the ARN after `policy/`."""
    policy: PolicyDocument | None = None
    """An inline policy, complete except for the model bucket's KMS key (see `decrypts_model_bucket`)."""
    decrypts_model_bucket: bool = False
    """The policy reads the stack's own model bucket, so it also needs kms:Decrypt on its key."""


def service_account_role_specs(config: PlatformConfig, location: AwsLocation) -> list[ServiceAccountRoleSpec]:
    """Every IRSA role the stack creates, from config alone (the bucket key ARN is filled in later)."""
    specs: list[ServiceAccountRoleSpec] = []
    secrets_manager = config.security.secret_store.provider == "aws-secrets-manager"
    for model in config.models:
        # The API keys its pods accept (its own, or its tenants'), and the gated-repo token.
        secrets = [*model_key_secrets(config, model), model.hf_token_secret]
        secret_names = (
            tuple(dict.fromkeys(secret.name for secret in secrets if secret is not None))
            if secrets_manager
            else ()
        )
        adapter_sources = [adapter.source for adapter in (model.lora.adapters if model.lora else [])]
        adapter_prefixes = tuple(
            (source.s3_bucket, source.s3_prefix)
            for source in adapter_sources
            if source.s3_bucket is not None and source.s3_prefix is not None
        )
        reads_own_bucket = config.storage.model_bucket_name in {
            source.s3_bucket for source in (model.source, *adapter_sources) if source.s3_bucket is not None
        }
        policy = model_access_policy(
            location=location,
            s3_bucket=model.source.s3_bucket,
            s3_prefix=model.source.s3_prefix,
            secret_names=secret_names,
            adapter_s3_prefixes=adapter_prefixes,
        )
        # A model with nothing to read in AWS (Hugging Face source, secrets outside AWS) gets no role.
        if policy is not None:
            specs.append(
                ServiceAccountRoleSpec(
                    model_service_account(model), policy=policy, decrypts_model_bucket=reads_own_bucket
                )
            )
    addons = config.addons
    if addons.efs_csi_driver.enabled:
        specs.append(
            ServiceAccountRoleSpec(EFS_CSI_CONTROLLER, managed_policies=(EFS_CSI_DRIVER_MANAGED_POLICY,))
        )
    if addons.ebs_csi_driver.enabled:
        specs.append(
            ServiceAccountRoleSpec(EBS_CSI_CONTROLLER, managed_policies=(EBS_CSI_DRIVER_MANAGED_POLICY,))
        )
    if secrets_manager:
        specs += _monitoring_secret_roles(config.monitoring, location)
        specs += _router_secret_roles(config, location)
    if addons.aws_load_balancer_controller.enabled:
        specs.append(
            ServiceAccountRoleSpec(AWS_LOAD_BALANCER_CONTROLLER, policy=load_balancer_controller_policy())
        )
    if addons.cluster_autoscaler.enabled:
        assert config.cluster.name is not None
        specs.append(
            ServiceAccountRoleSpec(
                CLUSTER_AUTOSCALER, policy=cluster_autoscaler_policy(location, config.cluster.name)
            )
        )
    if runs_karpenter(config):
        assert config.cluster.name is not None
        policy = karpenter_controller_policy(location, config.cluster.name)
        specs.append(ServiceAccountRoleSpec(KARPENTER, policy=policy))
    return specs


def _monitoring_secret_roles(
    monitoring: MonitoringConfig, location: AwsLocation
) -> list[ServiceAccountRoleSpec]:
    """Alertmanager and Grafana read their configuration and credential from Secrets Manager."""
    if not (monitoring.enabled and monitoring.prometheus == "kube-prometheus-stack"):
        return []
    readers = []
    if monitoring.alertmanager and monitoring.alertmanager_config_secret is not None:
        readers.append(
            (alertmanager_service_account(monitoring.namespace), monitoring.alertmanager_config_secret.name)
        )
    if monitoring.grafana and monitoring.grafana_admin_secret is not None:
        readers.append((grafana_service_account(monitoring.namespace), monitoring.grafana_admin_secret))
    specs = []
    for account, secret_name in readers:
        policy = model_access_policy(
            location=location, s3_bucket=None, s3_prefix=None, secret_names=(secret_name,)
        )
        specs.append(ServiceAccountRoleSpec(account, policy=policy))
    return specs


def _router_secret_roles(config: PlatformConfig, location: AwsLocation) -> list[ServiceAccountRoleSpec]:
    """With a to-zero model, the router pods' wake gate checks the keys that model's pods accept
    (domain/key_files.py `wake_gate_key_files`): its account may read exactly those entries."""
    if not config.router.enabled:
        return []
    names = tuple(dict.fromkeys(secret.ref.name for secret in wake_gate_key_files(config)))
    if not names:
        return []
    policy = model_access_policy(location=location, s3_bucket=None, s3_prefix=None, secret_names=names)
    return [ServiceAccountRoleSpec(ROUTER_SERVICE_ACCOUNT, policy=policy)]


@dataclass(frozen=True)
class ServiceAccountRolesArgs:
    cluster_name: str
    location: AwsLocation
    oidc_provider_arn: pulumi.Input[str]
    oidc_issuer_url: pulumi.Input[str]
    model_bucket_kms_key_arn: pulumi.Input[str]
    roles: Sequence[ServiceAccountRoleSpec]


class ServiceAccountRoles(pulumi.ComponentResource):
    role_arns: dict[str, pulumi.Output[str]]
    """Role ARN per service account, keyed `namespace/name`."""

    def __init__(
        self, name: str, args: ServiceAccountRolesArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("vllm-platform:aws:ServiceAccountRoles", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.role_arns = {}
        for spec in args.roles:
            account = spec.service_account
            resource_name = f"{name}-{account.namespace}-{account.name}"
            trust = pulumi.Output.all(args.oidc_provider_arn, args.oidc_issuer_url).apply(
                lambda values, account=account: to_json(irsa_trust_policy(values[0], values[1], *account))
            )
            role = aws.iam.Role(
                resource_name,
                name=iam_role_name(args.cluster_name, account),
                assume_role_policy=trust,
                description=f"IRSA: {account.subject} in {args.cluster_name}",
                opts=child,
            )
            for policy in spec.managed_policies:
                aws.iam.RolePolicyAttachment(
                    f"{resource_name}-{policy.rsplit('/', 1)[-1]}",
                    role=role.name,
                    policy_arn=f"arn:{args.location.partition}:iam::aws:policy/{policy}",
                    opts=child,
                )
            if spec.policy is not None:
                document: pulumi.Input[str]
                if spec.decrypts_model_bucket:
                    document = pulumi.Output.from_input(args.model_bucket_kms_key_arn).apply(
                        lambda key_arn, policy=spec.policy: to_json(
                            with_model_bucket_decrypt(policy, args.location, key_arn)
                        )
                    )
                else:
                    document = to_json(spec.policy)
                aws.iam.RolePolicy(resource_name, role=role.id, policy=document, opts=child)
            self.role_arns[account.key] = role.arn
        self.register_outputs({"role_arns": self.role_arns})
