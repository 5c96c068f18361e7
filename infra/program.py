"""The Pulumi program: typed config → AWS layer (mode `eks`) → Kubernetes layer.

`pulumi up` runs it through infra/__main__.py; `vllm-platform render` runs the same function
under mocks.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components.helm.cache import ChartCacheError, check_cache
from components.platform import KubernetesPlatform, KubernetesPlatformArgs
from domain.cluster_context import ClusterContext
from domain.config import ConfigError, PlatformConfig
from infra.kubernetes_provider import existing_cluster_provider
from infra.stack_checks import config_warnings, load_from_pulumi


def run_program(stack_file_display: str | None = None, *, check_charts: bool = True) -> dict[str, Any]:
    """Build every resource for the current stack; returns (and exports) the stack outputs.

    `check_charts`: refuse to start while a pinned chart is missing from the chart cache or differs
    from the lock, before any resource is registered (so `pulumi up` changes nothing). The offline
    render checks each release itself (infra/render.py), so it passes False.
    """
    try:
        config = load_from_pulumi(stack_file_display=stack_file_display)
    except ConfigError as error:
        # RunError: Pulumi prints the message alone, without a Python traceback.
        raise pulumi.RunError(str(error)) from None
    if check_charts:
        problems = check_cache()
        if problems:
            raise pulumi.RunError(str(ChartCacheError(problems)))
    for warning in config_warnings(
        config, stack_file=stack_file_display or f"stacks/Pulumi.{pulumi.get_stack()}.yaml"
    ):
        pulumi.log.warn(warning)
    outputs = build_platform(config)
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def build_platform(config: PlatformConfig) -> dict[str, Any]:
    from domain.capacity import plan_platform

    plan = plan_platform(config)
    if config.cluster.mode == "eks":
        from infra.aws import AwsInfrastructure

        aws = AwsInfrastructure("aws", config)
        provider = kubernetes.Provider(
            "kubernetes",
            kubeconfig=aws.kubeconfig,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(depends_on=aws.node_group_resources),
        )
        context = aws.cluster_context
        outputs: dict[str, Any] = {
            "kubeconfig": pulumi.Output.secret(aws.kubeconfig),
            "cluster_name": aws.cluster_name,
            "model_bucket": aws.model_bucket_name,
            "efs_file_system_id": aws.efs_file_system_id,
        }
    else:
        provider = existing_cluster_provider(config)
        context = ClusterContext.for_existing_cluster(config)
        outputs = {
            "cluster_name": config.cluster.name,
            "model_bucket": config.storage.model_bucket_name,
            "efs_file_system_id": config.storage.existing_efs_file_system_id,
        }
    platform = KubernetesPlatform(
        "platform",
        KubernetesPlatformArgs(config=config, plan=plan, context=context),
        opts=pulumi.ResourceOptions(providers=[provider]),
    )
    outputs["model_endpoints"] = platform.model_endpoints
    outputs["router_endpoint"] = platform.router_endpoint
    return outputs
