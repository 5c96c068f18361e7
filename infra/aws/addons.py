"""EKS managed add-ons: vpc-cni and kube-proxy before the nodes, CoreDNS after them.

Nodes become Ready only with a CNI, so vpc-cni and kube-proxy must exist before any node group;
CoreDNS needs nodes to run on (EKS waits for it to become ACTIVE), so it comes after them. One
component serves both phases. Versions are EKS's default for the cluster's Kubernetes version,
looked up at preview: bumping `cluster.kubernetes_version` moves the add-ons with the control plane.
(No eks-pod-identity-agent: pods get AWS access through IRSA.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

VPC_CNI = "vpc-cni"
KUBE_PROXY = "kube-proxy"
COREDNS = "coredns"
EBS_CSI_DRIVER = "aws-ebs-csi-driver"


@dataclass(frozen=True)
class AddonSpec:
    name: str
    configuration: dict[str, Any] = field(default_factory=dict)
    service_account_role_arn: pulumi.Input[str] | None = None
    """IRSA role of the add-on's controller (EKS annotates its service account)."""


def vpc_cni_configuration(network_policies: bool) -> dict[str, Any]:
    # The VPC CNI enforces NetworkPolicy only with its network-policy agent switched on; without
    # it the per-model default-deny policies would be accepted by the API server and do nothing.
    return {"enableNetworkPolicy": "true"} if network_policies else {}


def addons_before_nodes(network_policies: bool) -> list[AddonSpec]:
    return [AddonSpec(VPC_CNI, vpc_cni_configuration(network_policies)), AddonSpec(KUBE_PROXY)]


def addons_after_nodes(ebs_csi_role_arn: pulumi.Input[str] | None = None) -> list[AddonSpec]:
    """CoreDNS, and with `addons.ebs_csi_driver` the EBS CSI driver (its controller needs nodes too)."""
    specs = [AddonSpec(COREDNS)]
    if ebs_csi_role_arn is not None:
        specs.append(AddonSpec(EBS_CSI_DRIVER, service_account_role_arn=ebs_csi_role_arn))
    return specs


@dataclass(frozen=True)
class ManagedAddonsArgs:
    cluster_name: pulumi.Input[str]
    kubernetes_version: str
    addons: Sequence[AddonSpec]
    provider: aws.Provider
    """For the add-on version look-up (invokes do not inherit the parent's provider)."""
    depends_on: Sequence[pulumi.Resource] = ()


class ManagedAddons(pulumi.ComponentResource):
    addons: list[aws.eks.Addon]

    def __init__(
        self, name: str, args: ManagedAddonsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("vllm-platform:aws:ManagedAddons", name, None, opts)
        self.addons = []
        for spec in args.addons:
            version = aws.eks.get_addon_version_output(
                addon_name=spec.name,
                kubernetes_version=args.kubernetes_version,
                most_recent=False,  # EKS's default for this Kubernetes version, not the newest build
                opts=pulumi.InvokeOutputOptions(provider=args.provider, parent=self),
            ).version
            self.addons.append(
                aws.eks.Addon(
                    f"{name}-{spec.name}",
                    cluster_name=args.cluster_name,
                    addon_name=spec.name,
                    addon_version=version,
                    configuration_values=json.dumps(spec.configuration) if spec.configuration else None,
                    service_account_role_arn=spec.service_account_role_arn,
                    # This stack is the source of truth for add-on settings.
                    resolve_conflicts_on_create="OVERWRITE",
                    resolve_conflicts_on_update="OVERWRITE",
                    opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
                )
            )
        self.register_outputs({"addons": [addon.addon_name for addon in self.addons]})
