"""The whole Kubernetes layer: cluster add-ons, monitoring, and one ModelService per model."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from components.cluster_addons import EBS_STORAGE_CLASS, ClusterAddons, ClusterAddonsArgs
from components.gpu_addons import GpuAddons, GpuAddonsArgs
from components.karpenter import KarpenterPools, KarpenterPoolsArgs
from components.model_service import ModelService, ModelServiceArgs
from components.monitoring import Monitoring, MonitoringArgs
from components.multi_node_addons import MultiNodeAddons, MultiNodeAddonsArgs
from components.operations import Operations, OperationsArgs
from components.router import Router, RouterArgs
from components.scheduling import create_serving_priority_class
from components.scrape import scrape_settings
from domain.capacity import PlatformPlan
from domain.cluster_context import ClusterContext
from domain.config import PlatformConfig
from domain.service_accounts import ROUTER_SERVICE_ACCOUNT


@dataclass(frozen=True)
class KubernetesPlatformArgs:
    config: PlatformConfig
    plan: PlatformPlan
    context: ClusterContext


class KubernetesPlatform(pulumi.ComponentResource):
    model_endpoints: pulumi.Output[dict[str, dict[str, str]]]
    """Per model: `in_cluster` URL (Service) and, with ingress on, the public `ingress` URL."""
    router_endpoint: pulumi.Output[dict[str, str] | None]
    """The unified endpoint (router.enabled): `in_cluster` URL and, with ingress on, `ingress`."""

    def __init__(
        self, name: str, args: KubernetesPlatformArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("vllm-platform:platform:KubernetesPlatform", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        priority_class = create_serving_priority_class(f"{name}-serving-priority", opts=child)
        config = args.config
        gpu_groups = config.node_groups.gpu
        monitoring = Monitoring(
            f"{name}-monitoring",
            MonitoringArgs(
                monitoring=config.monitoring,
                prometheus_adapter=config.addons.prometheus_adapter,
                models=config.models,
                gpu_groups=gpu_groups,
                cluster_mode=config.cluster.mode,
                secret_store=config.security.secret_store,
                default_storage_class=EBS_STORAGE_CLASS if config.addons.ebs_csi_driver.enabled else None,
                context=args.context,
            ),
            opts=child,
        )
        cluster_addons = ClusterAddons(
            f"{name}-cluster-addons",
            ClusterAddonsArgs(
                addons=config.addons,
                gpu_groups=gpu_groups,
                secret_store=config.security.secret_store,
                context=args.context,
                ingress=config.ingress,
            ),
            opts=child,
        )
        # Alerts, dashboards and the monitoring stack's secrets (docs/operations.md).
        Operations(
            f"{name}-operations",
            OperationsArgs(
                monitoring=config.monitoring,
                models=config.models,
                secret_store=config.security.secret_store,
                dcgm_exporter=bool(config.addons.dcgm_exporter.enabled),
                region=args.context.region,
                tenants=config.tenants,
                depends_on=[*filter(None, [monitoring.prometheus_release]), *cluster_addons.releases],
            ),
            opts=child,
        )
        gpu_addons = GpuAddons(
            f"{name}-gpu-addons",
            GpuAddonsArgs(
                gpu_groups=gpu_groups,
                device_plugin=config.addons.nvidia_device_plugin,
                dcgm_exporter=config.addons.dcgm_exporter,
                image_prepull=config.addons.image_prepull,
                scrape=scrape_settings(config.monitoring),
                monitoring_crds=monitoring.prometheus_release,
                serving_images=config.serving_images(),
            ),
            opts=child,
        )
        # GPU groups with `provisioner: karpenter`: NodePools (and in mode eks their EC2NodeClasses and
        # Karpenter's controller); a model's pods on a pool wait for its NodePool.
        karpenter = KarpenterPools(
            f"{name}-karpenter",
            KarpenterPoolsArgs(
                gpu_groups=gpu_groups,
                settings=config.addons.karpenter,
                context=args.context,
                install_controller=config.cluster.mode == "eks" and bool(config.addons.karpenter.enabled),
            ),
            opts=child,
        )
        # LeaderWorkerSet controller and EFA device plugin, only for models whose replicas span nodes.
        multi_node_addons = MultiNodeAddons(
            f"{name}-multi-node", MultiNodeAddonsArgs(config=config), opts=child
        )
        # What model objects need first: the efs-sc StorageClass, the CSI drivers, the load balancer
        # controller's webhooks, KEDA's CRDs, the adapter's custom metrics API, registered GPUs, the
        # Karpenter pools.
        self.addons_ready: list[pulumi.Resource] = [
            cluster_addons.storage_class,
            *cluster_addons.releases,
            *gpu_addons.releases,
            *multi_node_addons.releases,
            *([monitoring.adapter_release] if monitoring.adapter_release else []),
            *([karpenter.release] if karpenter.release else []),
            *karpenter.node_pools.values(),
        ]
        endpoints: dict[str, dict[str, str]] = {}
        model_namespaces: list[pulumi.Resource] = []
        for model in args.config.models:
            service = ModelService(
                f"{name}-{model.name}",
                ModelServiceArgs(
                    config=args.config,
                    model=model,
                    plan=args.plan.models[model.name],
                    candidate_plan=args.plan.candidates.get(model.name),
                    context=args.context,
                    depends_on=[priority_class, *self.addons_ready],
                ),
                opts=child,
            )
            model_namespaces.append(service)
            endpoints[model.name] = {"in_cluster": service.in_cluster_url}
            if service.ingress_url is not None:
                endpoints[model.name]["ingress"] = service.ingress_url
        self.model_endpoints = pulumi.Output.from_input(endpoints)
        # One OpenAI endpoint for every model (docs/routing.md); null when router.enabled is false.
        router_endpoint: dict[str, str] | None = None
        if args.config.router.enabled:
            router = Router(
                f"{name}-router",
                RouterArgs(
                    config=args.config,
                    scrape=scrape_settings(config.monitoring),
                    model_namespaces=model_namespaces,
                    load_balancer_cidrs=args.context.load_balancer_source_cidrs,
                    web_acl_arn=args.context.web_acl_arn,
                    service_account_role_arn=args.context.role_arn_for(*ROUTER_SERVICE_ACCOUNT),
                    depends_on=[
                        *self.addons_ready,
                        *([monitoring.prometheus_release] if monitoring.prometheus_release else []),
                    ],
                ),
                opts=child,
            )
            router_endpoint = {"in_cluster": router.in_cluster_url}
            if router.ingress_url is not None:
                router_endpoint["ingress"] = router.ingress_url
        self.router_endpoint = pulumi.Output.from_input(router_endpoint)
        self.register_outputs(
            {"model_endpoints": self.model_endpoints, "router_endpoint": self.router_endpoint}
        )
