"""Kubernetes service accounts that hold AWS permissions (IRSA), named in one place.

The AWS layer creates an IAM role whose trust policy names exactly one of these accounts; the
Kubernetes components create the ServiceAccount with that name and annotate it with the role from
`ClusterContext.role_arn_for(*ref)`. A name typed differently on either side would leave the pod
without AWS credentials, so both sides import these constants.
"""

from __future__ import annotations

from typing import NamedTuple

from infra.config import ModelConfig


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


def model_service_account(model: ModelConfig) -> ServiceAccountRef:
    """The account of one model's vLLM pods: `vllm` in the model's own namespace `vllm-<name>`."""
    return ServiceAccountRef(model.namespace, MODEL_SERVICE_ACCOUNT_NAME)
