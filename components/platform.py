"""The whole Kubernetes layer: cluster add-ons, monitoring, and one ModelService per model."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as kubernetes

from components.cluster_addons import ClusterAddons, ClusterAddonsArgs
from components.cluster_context import ClusterContext
from components.gpu_addons import GpuAddons, GpuAddonsArgs
from components.monitoring import Monitoring, MonitoringArgs
from infra.capacity import PlatformPlan
from infra.config import PlatformConfig


@dataclass(frozen=True)
class KubernetesPlatformArgs:
    config: PlatformConfig
    plan: PlatformPlan
    context: ClusterContext


class KubernetesPlatform(pulumi.ComponentResource):
    model_endpoints: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: KubernetesPlatformArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:platform:KubernetesPlatform", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        monitoring = Monitoring(f"{name}-monitoring", MonitoringArgs(config=args.config), opts=child)
        cluster_addons = ClusterAddons(f"{name}-cluster-addons",
                                       ClusterAddonsArgs(config=args.config, context=args.context), opts=child)
        gpu_addons = GpuAddons(f"{name}-gpu-addons",
                               GpuAddonsArgs(config=args.config, monitoring_crds=monitoring.prometheus_release),
                               opts=child)
        # What model objects need first: the efs-sc StorageClass, the CSI drivers, the load balancer
        # controller's webhooks, KEDA's CRDs, the adapter's custom metrics API, registered GPUs.
        self.addons_ready: list[pulumi.Resource] = [
            cluster_addons.storage_class, *cluster_addons.releases, *gpu_addons.releases,
            *([monitoring.adapter_release] if monitoring.adapter_release else []),
        ]
        endpoints: dict[str, str] = {}
        for model in args.config.models:
            kubernetes.core.v1.Namespace(
                f"{name}-{model.name}-namespace",
                metadata=kubernetes.meta.v1.ObjectMetaArgs(name=model.namespace),
                opts=child,
            )
            endpoints[model.name] = f"http://vllm.{model.namespace}.svc.cluster.local:{model.vllm.port}"
        self.model_endpoints = pulumi.Output.from_input(endpoints)
        self.register_outputs({"model_endpoints": self.model_endpoints})
