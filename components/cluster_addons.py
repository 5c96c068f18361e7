"""Cluster add-ons the serving unit needs, from pinned upstream charts (versions in domain/versions.py).

    EFS CSI driver (IRSA) + StorageClass efs-sc     the shared model volume (RWX, one access point per PVC)
    Secrets Store CSI driver + AWS provider         API keys / HF tokens mounted and synced to Secrets
    AWS Load Balancer Controller (IRSA)             the model Ingresses → ALB
    metrics-server                                  resource metrics (kubectl top, CPU-based HPAs)
    Cluster Autoscaler (IRSA)                       GPU nodes for the replicas an HPA adds
    KEDA                                            models with `autoscaling.backend: keda`
    Argo Rollouts                                   models with `rollout.strategy: canary`

Which add-on is on by default depends on `cluster.mode` (domain/config/platform.py ADDON_DEFAULTS;
docs/autoscaling.md explains each choice). Values are built by the pure `*_values` functions so
tests read exactly what Helm receives.

Placement: controllers tolerate no taint (they belong on the system nodes, never on a GPU node);
node agents whose volumes vLLM pods mount (the CSI node plugins and the AWS secrets provider)
tolerate exactly the GPU taints, because a vLLM pod on a GPU node cannot start without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components import secrets
from components.helm.release import ChartRelease, install_chart, release_namespace
from components.load_balancer import ALB_SSL_POLICY, ingress_group_name
from components.scheduling import all_gpu_tolerations
from domain.cluster_context import ClusterContext
from domain.config.cluster import GpuNodeGroupConfig
from domain.config.errors import Problem
from domain.config.platform import (
    AddonsConfig,
    AwsLoadBalancerControllerConfig,
    ClusterAutoscalerConfig,
    IngressConfig,
    PlatformConfig,
    SecretsStoreCsiDriverConfig,
    SecretStoreConfig,
)
from domain.labels import PART_OF
from domain.service_accounts import (
    AWS_LOAD_BALANCER_CONTROLLER,
    CLUSTER_AUTOSCALER,
    EFS_CSI_CONTROLLER,
    ServiceAccountRef,
)
from domain.versions import (
    ARGO_ROLLOUTS_CHART,
    AWS_EFS_CSI_DRIVER_CHART,
    AWS_LOAD_BALANCER_CONTROLLER_CHART,
    CLUSTER_AUTOSCALER_CHART,
    CLUSTER_AUTOSCALER_IMAGE_REPOSITORY,
    CLUSTER_AUTOSCALER_IMAGE_TAGS,
    KEDA_CHART,
    METRICS_SERVER_CHART,
    SECRETS_STORE_AWS_PROVIDER_CHART,
    SECRETS_STORE_CSI_DRIVER_CHART,
    VAULT_CSI_PROVIDER_CHART,
)

ADDONS_NAMESPACE = "kube-system"
KEDA_NAMESPACE = "keda"
ARGO_ROLLOUTS_NAMESPACE = "argo-rollouts"
EFS_STORAGE_CLASS = "efs-sc"
"""The model volume's StorageClass (components/model_service.py MODEL_VOLUME_STORAGE_CLASS)."""
EFS_MOUNT_OPTIONS = ("tls", "iam")
EFS_BASE_PATH = "/vllm-platform"
"""Directory on the file system under which each PVC's access point gets its own directory."""
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"

# mode `existing`: these need the IAM roles (and, for the load balancer controller, the VPC id)
# that only mode `eks` creates, so switching them on there is an error rather than a broken pod.
NEEDS_EKS_MODE = {
    "aws_load_balancer_controller": "needs the VPC id and an IRSA role that only mode 'eks' creates",
    "cluster_autoscaler": "needs an IRSA role and node-group discovery tags that only mode 'eks' creates",
    "ebs_csi_driver": "is an EKS managed add-on with an IRSA role, which only mode 'eks' creates",
    "karpenter": "needs an IRSA role, a node role and an interruption queue that only mode 'eks' creates",
}
EBS_STORAGE_CLASS = "gp3"
"""Prometheus' volumes (monitoring.prometheus_persistent_volume) when addons.ebs_csi_driver is on."""
EBS_CSI_PROVISIONER = "ebs.csi.aws.com"


def irsa_service_account(context: ClusterContext, account: ServiceAccountRef) -> dict[str, Any]:
    """`serviceAccount` values: create it with the chart, named as the IAM role's trust policy expects."""
    role_arn = context.role_arn_for(account.namespace, account.name)
    annotations = {IRSA_ANNOTATION: role_arn} if role_arn else {}
    return {"create": True, "name": account.name, "annotations": annotations}


GpuGroups = Mapping[str, GpuNodeGroupConfig]


def node_agent_tolerations(gpu_groups: GpuGroups) -> list[dict[str, str]]:
    """Tolerations of the DaemonSets that must run wherever vLLM pods run (exactly the GPU taints)."""
    return all_gpu_tolerations(gpu_groups.values())


def efs_csi_driver_values(gpu_groups: GpuGroups, context: ClusterContext) -> dict[str, Any]:
    return {
        "controller": {
            "serviceAccount": irsa_service_account(context, EFS_CSI_CONTROLLER),
            "tolerations": [],
        },
        "node": {"tolerations": node_agent_tolerations(gpu_groups)},
        # The chart makes its CSIDriver a Helm hook by default; helm.v4.Chart runs no hooks, and without
        # the CSIDriver (attachRequired: false) the kubelet waits for an attach that never comes.
        "useHelmHooksForCSIDriver": False,
        "storageClasses": [],  # efs-sc is our own object below, with the file system id from the context
    }


def efs_storage_class_parameters(file_system_id: pulumi.Input[str]) -> dict[str, Any]:
    return {
        # Dynamic provisioning: one EFS access point (own directory and POSIX identity) per PVC.
        "provisioningMode": "efs-ap",
        "fileSystemId": file_system_id,
        "directoryPerms": "700",
        "basePath": EFS_BASE_PATH,
    }


def secrets_store_csi_driver_values(
    settings: SecretsStoreCsiDriverConfig, gpu_groups: GpuGroups
) -> dict[str, Any]:
    return {
        # The model namespaces read their API key from a synced Secret (ingress auth, env).
        "syncSecret": {"enabled": True},
        "enableSecretRotation": True,
        "rotationPollInterval": f"{settings.rotation_poll_interval_seconds}s",
        "linux": {
            "tolerations": node_agent_tolerations(gpu_groups),
            # The CRDs come from the chart's crds/ (helm.v4.Chart applies them); the default installs
            # them again with pre-install/pre-upgrade hook Jobs, which helm.v4.Chart would not run.
            "crds": {"enabled": False},
        },
    }


def secrets_store_aws_provider_values(gpu_groups: GpuGroups) -> dict[str, Any]:
    return {
        # The provider reads secrets with the identity of the pod that mounts them (its IRSA role), so
        # it needs no role of its own; the driver itself is the separately pinned release.
        "secrets-store-csi-driver": {"install": False},
        "tolerations": node_agent_tolerations(gpu_groups),
    }


def vault_csi_provider_values(secret_store: SecretStoreConfig, gpu_groups: GpuGroups) -> dict[str, Any]:
    return {
        # Only the CSI provider: Vault itself runs elsewhere (security.secret_store.vault_address), and
        # the provider authenticates with the mounting pod's service account (Vault kubernetes auth).
        # `global.enabled` still renders the server's ServiceAccount and its system:auth-delegator
        # binding with the server off: neither is used by the CSI provider.
        "server": {
            "enabled": False,
            "authDelegator": {"enabled": False},
            "serviceAccount": {"create": False},
        },
        "injector": {"enabled": False},
        "global": {"externalVaultAddr": secret_store.vault_address},
        "csi": {"enabled": True, "pod": {"tolerations": node_agent_tolerations(gpu_groups)}},
    }


def aws_load_balancer_controller_values(
    settings: AwsLoadBalancerControllerConfig, context: ClusterContext, ingress: IngressConfig
) -> dict[str, Any]:
    return {
        "clusterName": context.cluster_name,
        "region": context.region,
        "vpcId": context.vpc_id,
        "replicaCount": settings.replicas,
        "serviceAccount": irsa_service_account(context, AWS_LOAD_BALANCER_CONTROLLER),
        # Only the model Ingresses are ours; leave Services of type LoadBalancer to their owners.
        "enableServiceMutatorWebhook": False,
        # The `alb` class admits only Ingresses in the platform's namespaces and binds them to the
        # stack's one ALB group, scheme and TLS policy: anyone else who can create an Ingress cannot
        # join the shared load balancer or change how it listens (issue 15).
        "ingressClassParams": {
            "create": True,
            "spec": {
                "namespaceSelector": {"matchLabels": {"app.kubernetes.io/part-of": PART_OF}},
                "group": {"name": ingress_group_name(context.cluster_name)},
                "scheme": ingress.scheme,
                "sslPolicy": ALB_SSL_POLICY,
            },
        },
        "tolerations": [],
    }


def metrics_server_values() -> dict[str, Any]:
    return {"tolerations": []}


def cluster_autoscaler_values(settings: ClusterAutoscalerConfig, context: ClusterContext) -> dict[str, Any]:
    return {
        "fullnameOverride": "cluster-autoscaler",
        "cloudProvider": "aws",
        "awsRegion": context.region,
        # EKS managed node groups tag their Auto Scaling groups k8s.io/cluster-autoscaler/enabled and
        # k8s.io/cluster-autoscaler/<cluster>; the autoscaler finds the groups (GPU ones included) by them.
        "autoDiscovery": {"clusterName": context.cluster_name},
        "image": {
            "repository": CLUSTER_AUTOSCALER_IMAGE_REPOSITORY,
            "tag": CLUSTER_AUTOSCALER_IMAGE_TAGS[context.kubernetes_version],
        },
        "rbac": {"serviceAccount": irsa_service_account(context, CLUSTER_AUTOSCALER)},
        "extraArgs": {
            "expander": settings.expander,
            "balance-similar-node-groups": True,
            # vLLM pods use emptyDirs (/dev/shm, scratch): with the default (true) a GPU node running
            # one would never be scaled down.
            "skip-nodes-with-local-storage": False,
            "scale-down-unneeded-time": f"{settings.scale_down_unneeded_minutes}m",
            "max-node-provision-time": f"{settings.max_node_provision_minutes}m",
        },
        "tolerations": [],
    }


def keda_values() -> dict[str, Any]:
    return {"tolerations": []}


ARGO_ROLLOUTS_PROVIDERS = (
    "istio",
    "smi",
    "ambassador",
    "awsLoadBalancerController",
    "awsAppMesh",
    "traefik",
    "apisix",
    "contour",
    "glooPlatform",
    "gatewayAPI",
)
"""The chart's provider RBAC switches (values.yaml `providerRBAC.providers`), all on by default."""


def argo_rollouts_values() -> dict[str, Any]:
    """The controller only (no dashboard), two replicas with leader election and a PDB, and RBAC for
    the one traffic router the canaries use: the AWS Load Balancer Controller's Ingress and
    TargetGroupBindings (components/rollouts.py)."""
    controller_labels = {
        "app.kubernetes.io/name": "argo-rollouts",
        "app.kubernetes.io/instance": "argo-rollouts",
        "app.kubernetes.io/component": "rollouts-controller",
    }
    return {
        "installCRDs": True,
        # Deleting the release must not delete every Rollout with its CRD (and the pods with them).
        "keepCRDs": True,
        "controller": {
            "replicas": 2,
            "pdb": {"enabled": False},
            # A controller: system nodes only, never on GPU nodes (no GPU toleration).
            "tolerations": [],
            # One controller watches a handful of Rollouts: small, and bounded so it cannot starve
            # the system nodes (the chart sets no resources).
            "resources": {
                "requests": {"cpu": "100m", "memory": "256Mi"},
                "limits": {"cpu": "1", "memory": "1Gi"},
            },
        },
        # The chart's context plus a high UID (the image's own is 999, inside hosts' system range).
        "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001},
        "containerSecurityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        # The chart's own PDB cannot set unhealthyPodEvictionPolicy, so a controller pod that never
        # becomes ready would block node drains (policy pdbs-allow-node-drains); ours, in the release.
        "extraObjects": [
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {
                    "name": "argo-rollouts",
                    "namespace": ARGO_ROLLOUTS_NAMESPACE,
                    "labels": controller_labels,
                },
                "spec": {
                    "maxUnavailable": 1,
                    "selector": {"matchLabels": controller_labels},
                    "unhealthyPodEvictionPolicy": "AlwaysAllow",
                },
            }
        ],
        "dashboard": {"enabled": False},
        "providerRBAC": {
            "enabled": True,
            "providers": {name: name == "awsLoadBalancerController" for name in ARGO_ROLLOUTS_PROVIDERS},
        },
    }


@dataclass(frozen=True)
class ClusterAddonsArgs:
    addons: AddonsConfig
    gpu_groups: GpuGroups
    secret_store: SecretStoreConfig
    context: ClusterContext
    ingress: IngressConfig
    """The model Ingresses' scheme, which the load balancer controller's IngressClassParams pin."""


class ClusterAddons(pulumi.ComponentResource):
    """The non-GPU, non-monitoring add-ons; `releases` are what model objects must wait for."""

    releases: list[pulumi.Resource]
    keda_release: pulumi.Resource | None
    storage_class: kubernetes.storage.v1.StorageClass
    ebs_storage_class: kubernetes.storage.v1.StorageClass | None

    def __init__(
        self, name: str, args: ClusterAddonsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("vllm-platform:cluster_addons:ClusterAddons", name, None, opts)
        addons, groups, context = args.addons, args.gpu_groups, args.context
        self.releases = []

        def release(chart_release: ChartRelease, after: pulumi.Resource | None = None) -> pulumi.Resource:
            created = install_chart(
                chart_release, pulumi.ResourceOptions(parent=self, depends_on=[after] if after else [])
            )
            self.releases.append(created)
            return created

        efs_driver = None
        if addons.efs_csi_driver.enabled:
            efs_driver = release(
                ChartRelease(
                    "aws-efs-csi-driver",
                    AWS_EFS_CSI_DRIVER_CHART,
                    ADDONS_NAMESPACE,
                    efs_csi_driver_values(groups, context),
                )
            )
        # The StorageClass exists in both modes: in mode `existing` the cluster's own EFS CSI driver
        # provisions from it, with the file system named in storage.existing_efs_file_system_id.
        self.storage_class = kubernetes.storage.v1.StorageClass(
            f"{name}-efs-storage-class",
            metadata={"name": EFS_STORAGE_CLASS, "labels": {"app.kubernetes.io/part-of": PART_OF}},
            provisioner="efs.csi.aws.com",
            parameters=efs_storage_class_parameters(context.efs_file_system_id),
            # Weights are expensive to fetch again: deleting a claim keeps its access point and data.
            reclaim_policy="Retain",
            volume_binding_mode="Immediate",
            # TLS in transit and IAM authorization: the file system policy (infra/aws/storage.py)
            # refuses every mount without both (issue 15).
            mount_options=list(EFS_MOUNT_OPTIONS),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[efs_driver] if efs_driver else []),
        )
        self.ebs_storage_class = None
        if addons.ebs_csi_driver.enabled:
            # The driver itself is an EKS managed add-on (infra/aws/addons.py); only its class is ours.
            self.ebs_storage_class = kubernetes.storage.v1.StorageClass(
                f"{name}-ebs-storage-class",
                metadata={"name": EBS_STORAGE_CLASS, "labels": {"app.kubernetes.io/part-of": PART_OF}},
                provisioner=EBS_CSI_PROVISIONER,
                parameters={"type": "gp3", "encrypted": "true"},
                # A volume in the zone the Prometheus pod was scheduled to; grown in place when
                # monitoring.prometheus_storage_gib rises.
                volume_binding_mode="WaitForFirstConsumer",
                allow_volume_expansion=True,
                reclaim_policy="Delete",
                opts=pulumi.ResourceOptions(parent=self),
            )
        if addons.secrets_store_csi_driver.enabled:
            driver = release(
                ChartRelease(
                    "secrets-store-csi-driver",
                    SECRETS_STORE_CSI_DRIVER_CHART,
                    ADDONS_NAMESPACE,
                    secrets_store_csi_driver_values(addons.secrets_store_csi_driver, groups),
                )
            )
            if args.secret_store.provider == "aws-secrets-manager":
                release(
                    ChartRelease(
                        "secrets-store-csi-driver-provider-aws",
                        SECRETS_STORE_AWS_PROVIDER_CHART,
                        ADDONS_NAMESPACE,
                        secrets_store_aws_provider_values(groups),
                    ),
                    after=driver,
                )
            elif args.secret_store.provider == "vault":
                release(
                    ChartRelease(
                        "vault-csi-provider",
                        VAULT_CSI_PROVIDER_CHART,
                        ADDONS_NAMESPACE,
                        vault_csi_provider_values(args.secret_store, groups),
                    ),
                    after=driver,
                )
        if addons.aws_load_balancer_controller.enabled:
            release(
                ChartRelease(
                    "aws-load-balancer-controller",
                    AWS_LOAD_BALANCER_CONTROLLER_CHART,
                    ADDONS_NAMESPACE,
                    aws_load_balancer_controller_values(
                        addons.aws_load_balancer_controller, context, args.ingress
                    ),
                )
            )
        if addons.metrics_server.enabled:
            release(
                ChartRelease(
                    "metrics-server", METRICS_SERVER_CHART, ADDONS_NAMESPACE, metrics_server_values()
                )
            )
        if addons.cluster_autoscaler.enabled:
            release(
                ChartRelease(
                    "cluster-autoscaler",
                    CLUSTER_AUTOSCALER_CHART,
                    ADDONS_NAMESPACE,
                    cluster_autoscaler_values(addons.cluster_autoscaler, context),
                )
            )
        self.keda_release = None
        if addons.keda.enabled:
            keda_namespace = release_namespace(
                f"{name}-keda-namespace", KEDA_NAMESPACE, pulumi.ResourceOptions(parent=self)
            )
            self.keda_release = release(
                ChartRelease("keda", KEDA_CHART, KEDA_NAMESPACE, keda_values()), after=keda_namespace
            )
        if addons.argo_rollouts.enabled:
            rollouts_namespace = release_namespace(
                f"{name}-argo-rollouts-namespace",
                ARGO_ROLLOUTS_NAMESPACE,
                pulumi.ResourceOptions(parent=self),
            )
            release(
                ChartRelease(
                    "argo-rollouts", ARGO_ROLLOUTS_CHART, ARGO_ROLLOUTS_NAMESPACE, argo_rollouts_values()
                ),
                after=rollouts_namespace,
            )
        self.register_outputs({})


def addon_mode_problems(config: PlatformConfig) -> list[Problem]:
    """Add-ons switched on in mode `existing` that cannot work there."""
    if config.cluster.mode != "existing":
        return []
    problems = []
    for addon, reason in NEEDS_EKS_MODE.items():
        if getattr(config.addons, addon).enabled:
            problems.append(
                Problem(
                    ("addons", addon, "enabled"),
                    True,
                    f"{reason}; in mode 'existing' install it with the cluster's own tooling and set "
                    f"addons.{addon}: false",
                )
            )
    return problems


def addon_provider_problems(config: PlatformConfig) -> list[Problem]:
    """Mode `eks` (a cluster this stack creates): every add-on the stack's own objects need is on, since
    nothing else will install it there (issue 50: `validate` let such a stack through, and it deployed
    a platform that never serves). Mode `existing` leaves these to the cluster (ADDON_DEFAULTS)."""
    if config.cluster.mode != "eks":
        return []
    needs: list[tuple[str, str]] = []
    groups = [model.name for model in config.models if model.is_multi_node]
    if groups:
        needs.append(
            (
                "leader_worker_set",
                f"model(s) {', '.join(groups)} run as LeaderWorkerSets, an API only the LWS controller "
                "serves: `up` would fail to create them",
            )
        )
    needs.append(
        (
            "efs_csi_driver",
            f"every model's shared volume is a PersistentVolumeClaim of storage class '{EFS_STORAGE_CLASS}' "
            "(EFS): no claim would bind and no vLLM pod would start",
        )
    )
    if secrets.uses_csi(config.security.secret_store):
        needs.append(
            (
                "secrets_store_csi_driver",
                f"the API keys reach the pods through the Secrets Store CSI driver (security.secret_store."
                f"provider '{config.security.secret_store.provider}'): no pod that mounts them would start",
            )
        )
    if config.ingress.enabled and config.ingress.class_name == "alb":
        needs.append(
            (
                "aws_load_balancer_controller",
                "the Ingresses are of class 'alb' (ingress.class_name): no load balancer would ever "
                "serve them",
            )
        )
    return [
        Problem(
            ("addons", name, "enabled"),
            False,
            f"{reason}; in mode 'eks' nothing else installs it: set addons.{name}.enabled: true (or "
            "leave it out for the mode's default)",
        )
        for name, reason in needs
        if not getattr(config.addons, name).enabled
    ]
