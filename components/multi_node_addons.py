"""The add-ons multi-node replicas need (issue 42): the LeaderWorkerSet controller and the EFA device
plugin, pinned upstream charts with values built from the config. Installed only when a model's replica
spans nodes (domain/multi_node.py), so stacks without one render exactly as before; the controller's
chart also not where `addons.leader_worker_set` is off (a cluster that runs its own controller).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from components.helm.release import ChartRelease, install_chart, release_namespace
from components.scheduling import all_gpu_tolerations
from domain.config.platform import PlatformConfig
from domain.labels import GPU_GROUP_LABEL
from domain.multi_node import efa_groups
from domain.versions import AWS_EFA_DEVICE_PLUGIN_CHART, LWS_CHART, LWS_CONTROLLER_IMAGE

LWS_NAMESPACE = "lws-system"
"""Where the LeaderWorkerSet controller runs (upstream's install manifests use the same)."""
LWS_RELEASE = "lws"
EFA_DEVICE_PLUGIN_NAMESPACE = "kube-system"
EFA_DEVICE_PLUGIN_RELEASE = "aws-efa-k8s-device-plugin"

EFA_DEVICE_PLUGIN_IMAGE_ACCOUNT = "602401143452"
"""The account of the chart's default image (EKS's add-on images, `<account>.dkr.ecr.<region>`), which
serves every commercial region; the chart hard-codes us-west-2, the stack's region is used instead so
nodes pull from their own region."""


def uses_multi_node(config: PlatformConfig) -> bool:
    return any(model.is_multi_node for model in config.models)


def lws_controller_values() -> dict[str, Any]:
    """The controller on system nodes, its image pinned (the chart tree's default tag is `main` with
    pull policy Always), its webhook certificate managed by the controller itself (no cert-manager)."""
    return {
        "image": {
            "manager": {
                "repository": LWS_CONTROLLER_IMAGE.repository,
                "tag": LWS_CONTROLLER_IMAGE.tag,
                "pullPolicy": "IfNotPresent",
            }
        },
        "enableCertManager": False,
        "enablePrometheus": False,
        "enableDisaggregatedSet": False,
        # A controller: system nodes only, never on GPU nodes (no GPU toleration).
        "tolerations": [],
    }


def efa_device_plugin_values(config: PlatformConfig) -> dict[str, Any]:
    """The plugin on the nodes of the GPU groups that need EFA, and nowhere else: the chart's node
    affinity (`supportedInstanceLabels`) matched on the stack's GPU-group label instead of its list of
    instance types, and the groups' taints tolerated."""
    groups = efa_groups(config)
    gpu = config.node_groups.gpu
    return {
        "image": {
            "repository": f"{EFA_DEVICE_PLUGIN_IMAGE_ACCOUNT}.dkr.ecr.{config.cluster.region}.amazonaws.com"
            "/eks/aws-efa-k8s-device-plugin",
        },
        "supportedInstanceLabels": {"keys": [GPU_GROUP_LABEL], "values": groups},
        "tolerations": all_gpu_tolerations(gpu[name] for name in groups),
    }


@dataclass(frozen=True)
class MultiNodeAddonsArgs:
    config: PlatformConfig


class MultiNodeAddons(pulumi.ComponentResource):
    """LeaderWorkerSet controller and EFA device plugin; `releases` are what the models wait for."""

    releases: list[pulumi.Resource]

    def __init__(
        self, name: str, args: MultiNodeAddonsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("vllm-platform:multi_node:MultiNodeAddons", name, None, opts)
        self.releases = []
        config = args.config
        if uses_multi_node(config) and config.addons.leader_worker_set.enabled:
            namespace = release_namespace(
                f"{name}-lws-namespace", LWS_NAMESPACE, pulumi.ResourceOptions(parent=self)
            )
            self.releases.append(
                install_chart(
                    ChartRelease(LWS_RELEASE, LWS_CHART, LWS_NAMESPACE, lws_controller_values()),
                    pulumi.ResourceOptions(parent=self, depends_on=[namespace]),
                )
            )
        if efa_groups(config):
            self.releases.append(
                install_chart(
                    ChartRelease(
                        EFA_DEVICE_PLUGIN_RELEASE,
                        AWS_EFA_DEVICE_PLUGIN_CHART,
                        EFA_DEVICE_PLUGIN_NAMESPACE,
                        efa_device_plugin_values(config),
                    ),
                    pulumi.ResourceOptions(parent=self),
                )
            )
        self.register_outputs({})
