"""What runs on every GPU node besides vLLM: device plugin (+ feature discovery), DCGM exporter, pre-pull.

    NVIDIA device plugin (pinned chart)   registers `nvidia.com/gpu`; with GPU feature discovery and
                                          the chart's node-feature-discovery subchart (`nfd`)
    DCGM exporter (pinned chart)          per-GPU metrics attributed to the pod holding the GPU
    DaemonSet vllm-image-prepull          pulls the pinned vLLM image before a replica needs it

All of them run on the GPU node groups only (node affinity on the group label) and tolerate exactly
the GPU groups' taints — the chart defaults do not: the device plugin's NFD worker tolerates only
`nvidia.com/gpu=present`, which leaves nodes tainted `nvidia.com/gpu=true` with no GPU labels.
Their controllers (NFD master and garbage collector) tolerate nothing and stay on system nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components.helm.release import ChartRelease, install_chart
from components.scheduling import (
    all_gpu_tolerations,
    gpu_nodes_affinity,
    tolerations_from_config,
    untolerated_taints,
)
from components.scrape import ScrapeSettings
from domain.config.cluster import GpuNodeGroupConfig
from domain.config.errors import Problem
from domain.config.platform import (
    DcgmExporterConfig,
    GpuAddonConfig,
    ImagePrepullConfig,
    NvidiaDevicePluginConfig,
    PlatformConfig,
)
from domain.labels import PART_OF
from domain.versions import DCGM_EXPORTER_CHART, NVIDIA_DEVICE_PLUGIN_CHART, PAUSE_IMAGE, VLLM_IMAGE

GPU_ADDONS_NAMESPACE = "kube-system"
DEVICE_PLUGIN_RELEASE = "nvidia-device-plugin"
DCGM_EXPORTER_RELEASE = "dcgm-exporter"
IMAGE_PREPULL_NAME = "vllm-image-prepull"
KUBELET_POD_RESOURCES = "/var/lib/kubelet/pod-resources"
"""The kubelet's pod-resources socket directory: how DCGM learns which pod holds which GPU."""
# Bottlerocket's NVIDIA variants run the device plugin as part of the OS; a second one would fight it.
AMI_TYPES_WITH_BUILTIN_DEVICE_PLUGIN = frozenset({"BOTTLEROCKET_x86_64_NVIDIA"})


GpuGroups = Mapping[str, GpuNodeGroupConfig]


def gpu_addon_tolerations(gpu_groups: GpuGroups, addon: GpuAddonConfig) -> list[dict[str, str]]:
    """Exactly the GPU groups' taints, unless the add-on's config overrides them."""
    if addon.tolerations is not None:
        return tolerations_from_config(addon.tolerations)
    return all_gpu_tolerations(gpu_groups.values())


def device_plugin_groups(gpu_groups: GpuGroups) -> list[str]:
    """GPU groups that need the chart's device plugin (not those whose OS ships one)."""
    return sorted(
        name
        for name, group in gpu_groups.items()
        if group.ami_type not in AMI_TYPES_WITH_BUILTIN_DEVICE_PLUGIN
    )


def device_plugin_values(gpu_groups: GpuGroups, settings: NvidiaDevicePluginConfig) -> dict[str, Any]:
    tolerations = gpu_addon_tolerations(gpu_groups, settings)
    affinity = gpu_nodes_affinity(device_plugin_groups(gpu_groups))
    discovery = settings.gpu_feature_discovery
    return {
        # Replaces the chart's default (every node with an NVIDIA PCI device or NFD's GPU label).
        "affinity": affinity,
        "tolerations": tolerations,
        "priorityClassName": "system-node-critical",
        "gfd": {"enabled": discovery},
        "nfd": {
            "enabled": discovery,
            "worker": {"tolerations": tolerations, "affinity": affinity},
            "master": {"tolerations": []},
            "gc": {"tolerations": []},
            # A post-delete hook Job that strips NFD's node labels on uninstall: helm.v4.Chart runs no
            # hooks, and the labels are harmless once the device plugin is gone.
            "postDeleteCleanup": False,
        },
    }


DCGM_DEFAULT_COUNTERS = "/etc/dcgm-exporter/default-counters.csv"
"""The counters file in the exporter image that the chart passes by default (domain/dcgm_metrics.py)."""


def dcgm_exporter_arguments(settings: DcgmExporterConfig) -> list[str]:
    """The chart's default counters, read every `collect_interval_seconds` instead of every 30 s."""
    # One `--flag=value` string: the chart writes each argument unquoted, so a bare 5000 would
    # become a YAML integer in the container's args.
    return ["-f", DCGM_DEFAULT_COUNTERS, f"--collect-interval={settings.collect_interval_seconds * 1000}"]


def dcgm_exporter_values(
    gpu_groups: GpuGroups, settings: DcgmExporterConfig, scrape: ScrapeSettings
) -> dict[str, Any]:
    return {
        "arguments": dcgm_exporter_arguments(settings),
        "affinity": gpu_nodes_affinity(gpu_groups),
        "tolerations": gpu_addon_tolerations(gpu_groups, settings),
        "priorityClassName": "system-node-critical",
        # Mounted so the exporter maps each GPU to the pod holding it (the chart sets
        # DCGM_EXPORTER_KUBERNETES=true): series get that pod's `namespace`, `pod` and `container`.
        "kubeletPath": KUBELET_POD_RESOURCES,
        "serviceMonitor": {
            "enabled": scrape.monitor_objects,
            "interval": f"{scrape.interval_seconds}s",
            # Keep the exporter's `namespace`/`pod` (the GPU's pod) instead of overwriting them with
            # the exporter pod's own target labels — the adapter maps exactly these to pods.
            "honorLabels": True,
            "additionalLabels": scrape.labels,
        },
    }


def image_prepull_labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/name": IMAGE_PREPULL_NAME,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
    }


_RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65534,
    "capabilities": {"drop": ["ALL"]},
}


def image_prepull_daemonset_spec(
    gpu_groups: GpuGroups,
    settings: ImagePrepullConfig,
    serving_images: Sequence[str] = (VLLM_IMAGE.reference,),
) -> dict[str, Any]:
    """Init containers that only pull the serving images and exit; a pause container holds the pod.

    `serving_images`: every model's (platform.serving_images), each pulled on every GPU node. The EFA
    image of multi-node models is built FROM the pinned vLLM image (serving-image/), so where a stack
    uses both a node pulls the installer's layer more, not a second image. No GPU request, and
    NVIDIA_VISIBLE_DEVICES=void: the vLLM image sets it to `all`, which on a node whose default runtime
    is NVIDIA's would hand this pod every GPU.
    """
    selector = {"app.kubernetes.io/name": IMAGE_PREPULL_NAME}
    pulls = [
        {
            # The first keeps the name it always had, so a stack of one image renders as before.
            "name": "pull-vllm" if index == 0 else f"pull-vllm-{index}",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/bin/sh", "-c", "exit 0"],
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
            "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi"},
                "limits": {"cpu": "100m", "memory": "64Mi"},
            },
            "securityContext": _RESTRICTED,
        }
        for index, image in enumerate(serving_images)
    ]
    return {
        "selector": {"matchLabels": selector},
        # When the vLLM pin changes every node pulls the new image at once: nothing here serves traffic.
        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
        "template": {
            "metadata": {"labels": image_prepull_labels()},
            "spec": {
                "affinity": gpu_nodes_affinity(gpu_groups),
                "tolerations": gpu_addon_tolerations(gpu_groups, settings),
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 5,
                "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": pulls,
                "containers": [
                    {
                        "name": "pause",
                        "image": PAUSE_IMAGE.reference,
                        "imagePullPolicy": "IfNotPresent",
                        "resources": {
                            "requests": {"cpu": "1m", "memory": "8Mi"},
                            "limits": {"cpu": "10m", "memory": "16Mi"},
                        },
                        "securityContext": _RESTRICTED,
                    }
                ],
            },
        },
    }


@dataclass(frozen=True)
class GpuAddonsArgs:
    gpu_groups: GpuGroups
    device_plugin: NvidiaDevicePluginConfig
    dcgm_exporter: DcgmExporterConfig
    image_prepull: ImagePrepullConfig
    scrape: ScrapeSettings
    monitoring_crds: pulumi.Resource | None = None
    """The release that installs the ServiceMonitor CRD (kube-prometheus-stack), if this stack has one."""
    serving_images: tuple[str, ...] = (VLLM_IMAGE.reference,)
    """The vLLM images the stack's models run (domain/config/platform.py serving_images): pre-pulled."""


class GpuAddons(pulumi.ComponentResource):
    releases: list[pulumi.Resource]

    def __init__(self, name: str, args: GpuAddonsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:gpu_addons:GpuAddons", name, None, opts)
        groups = args.gpu_groups
        self.releases = []
        if args.device_plugin.enabled and device_plugin_groups(groups):
            self.releases.append(
                install_chart(
                    ChartRelease(
                        DEVICE_PLUGIN_RELEASE,
                        NVIDIA_DEVICE_PLUGIN_CHART,
                        GPU_ADDONS_NAMESPACE,
                        device_plugin_values(groups, args.device_plugin),
                    ),
                    pulumi.ResourceOptions(parent=self),
                )
            )
        if args.dcgm_exporter.enabled:
            self.releases.append(
                install_chart(
                    ChartRelease(
                        DCGM_EXPORTER_RELEASE,
                        DCGM_EXPORTER_CHART,
                        GPU_ADDONS_NAMESPACE,
                        dcgm_exporter_values(groups, args.dcgm_exporter, args.scrape),
                    ),
                    pulumi.ResourceOptions(
                        parent=self, depends_on=[args.monitoring_crds] if args.monitoring_crds else []
                    ),
                )
            )
        if args.image_prepull.enabled:
            kubernetes.apps.v1.DaemonSet(
                f"{name}-image-prepull",
                metadata={
                    "name": IMAGE_PREPULL_NAME,
                    "namespace": GPU_ADDONS_NAMESPACE,
                    "labels": image_prepull_labels(),
                },
                spec=image_prepull_daemonset_spec(groups, args.image_prepull, args.serving_images),
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({})


GPU_ADDONS_WITH_TOLERATIONS = ("nvidia_device_plugin", "dcgm_exporter", "image_prepull")


def gpu_toleration_problems(config: PlatformConfig) -> list[Problem]:
    """Every GPU taint must be tolerated by every GPU add-on that is on (overrides can forget one)."""
    problems = []
    for addon_name in GPU_ADDONS_WITH_TOLERATIONS:
        addon: GpuAddonConfig = getattr(config.addons, addon_name)
        if not addon.enabled:
            continue
        tolerations = gpu_addon_tolerations(config.node_groups.gpu, addon)
        # The chart's device plugin stays off the groups whose OS ships one.
        plugin = addon_name == "nvidia_device_plugin"
        groups = device_plugin_groups(config.node_groups.gpu) if plugin else list(config.node_groups.gpu)
        for group_name in sorted(groups):
            group = config.node_groups.gpu[group_name]
            for taint in untolerated_taints(tolerations, group.taints):
                index = group.taints.index(taint)
                problems.append(
                    Problem(
                        ("node_groups", "gpu", group_name, "taints", index),
                        str(taint),
                        f"addons.{addon_name}.tolerations does not tolerate this taint, "
                        f"so {addon_name} would "
                        f"not run on group '{group_name}' ({_consequence(addon_name)}); add "
                        f"{{key: {taint.key}, operator: {'Equal' if taint.value else 'Exists'}"
                        f"{', value: ' + taint.value if taint.value else ''}, "
                        f"effect: {taint.effect}}} to it, "
                        f"or remove the override to tolerate exactly the GPU taints",
                    )
                )
    return problems


def _consequence(addon_name: str) -> str:
    return {
        "nvidia_device_plugin": "its GPUs would never be registered and vLLM pods would stay Pending",
        "dcgm_exporter": "its GPUs would have no utilisation metrics to scale on",
        "image_prepull": "new replicas there would wait for the full vLLM image pull",
    }[addon_name]


def gpu_registration_problems(config: PlatformConfig) -> list[Problem]:
    """Mode `eks`: GPU groups whose OS has no device plugin need the chart's."""
    if config.cluster.mode != "eks" or config.addons.nvidia_device_plugin.enabled:
        return []
    groups = device_plugin_groups(config.node_groups.gpu)
    if not groups:
        return []
    return [
        Problem(
            ("addons", "nvidia_device_plugin", "enabled"),
            False,
            f"GPU group(s) {', '.join(groups)} run an AMI without a built-in device plugin, so their GPUs "
            "would never be registered; set addons.nvidia_device_plugin: true (or use ami_type "
            "BOTTLEROCKET_x86_64_NVIDIA)",
        )
    ]
