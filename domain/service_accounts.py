"""Kubernetes service accounts that hold AWS permissions (IRSA), named in one place.

The AWS layer creates an IAM role whose trust policy names exactly one of these accounts; the
Kubernetes components create the ServiceAccount with that name and annotate it with the role from
`ClusterContext.role_arn_for(*ref)`. A name typed differently on either side would leave the pod
without AWS credentials, so both sides import these constants.
"""

from __future__ import annotations

from typing import NamedTuple

from domain.config import ModelConfig
from domain.labels import ROUTER_APP_NAME, ROUTER_NAMESPACE


class ServiceAccountRef(NamedTuple):
    namespace: str
    name: str

    @property
    def key(self) -> str:
        """`namespace/name`: the key of `ClusterContext.service_account_role_arns`."""
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        """The `sub` claim of this account's projected token (what IRSA trust policies match)."""
        return f"system:serviceaccount:{self.namespace}:{self.name}"


MODEL_SERVICE_ACCOUNT_NAME = "vllm"
"""Every model namespace runs its vLLM pods (and the preloader init container) as this account."""

# Names the upstream charts use by default (aws-efs-csi-driver `controller.serviceAccount.name`,
# aws-load-balancer-controller `serviceAccount.name` as set in the AWS install guide,
# cluster-autoscaler `rbac.serviceAccount.name`); the add-on components must set them explicitly.
EFS_CSI_CONTROLLER = ServiceAccountRef("kube-system", "efs-csi-controller-sa")
AWS_LOAD_BALANCER_CONTROLLER = ServiceAccountRef("kube-system", "aws-load-balancer-controller")
CLUSTER_AUTOSCALER = ServiceAccountRef("kube-system", "cluster-autoscaler")
# The EKS managed add-on's controller account (aws-ebs-csi-driver docs, "IAM permissions").
EBS_CSI_CONTROLLER = ServiceAccountRef("kube-system", "ebs-csi-controller-sa")
KARPENTER = ServiceAccountRef("kube-system", "karpenter")
"""Karpenter's controller (chart karpenter, namespace as upstream's getting-started guide installs it)."""
# kube-prometheus-stack's Alertmanager and Grafana: they read their secrets from the store through
# the CSI driver, so with Secrets Manager they need IRSA roles. components/monitoring.py sets these
# names in the chart values (`alertmanager.serviceAccount.name`, `grafana.serviceAccount.name`).
ALERTMANAGER_SERVICE_ACCOUNT_NAME = "kube-prometheus-stack-alertmanager"
GRAFANA_SERVICE_ACCOUNT_NAME = "kube-prometheus-stack-grafana"


# The router pods' account (components/router.py): with a to-zero model and Secrets Manager, its role
# may read the keys the wake gate checks (router/wake_gate.py), through the CSI driver.
ROUTER_SERVICE_ACCOUNT = ServiceAccountRef(ROUTER_NAMESPACE, ROUTER_APP_NAME)


def alertmanager_service_account(monitoring_namespace: str) -> ServiceAccountRef:
    return ServiceAccountRef(monitoring_namespace, ALERTMANAGER_SERVICE_ACCOUNT_NAME)


def grafana_service_account(monitoring_namespace: str) -> ServiceAccountRef:
    return ServiceAccountRef(monitoring_namespace, GRAFANA_SERVICE_ACCOUNT_NAME)


def model_service_account(model: ModelConfig) -> ServiceAccountRef:
    """The account of one model's vLLM pods: `vllm` in the model's own namespace `vllm-<name>`."""
    return ServiceAccountRef(model.namespace, MODEL_SERVICE_ACCOUNT_NAME)
