"""KWOK nodes generated from a stack's own node groups, as EKS would register them.

Each group at its max size: the labels and taints the AWS layer gives the managed node group
(infra/aws/node_groups.py `node_group_specs`, the same function), the labels EKS and the kubelet
add (instance type, zone, capacity type, node group, architecture), and capacity from the
instance catalogue: CPUs, memory and `nvidia.com/gpu` for GPU types (domain/catalogue), and
`vpc.amazonaws.com/efa` on the groups that need EFA (a multi-node model's); general-purpose
system types by AWS's size naming (below). A group with several instance types gets its first.

Zones as the stack's subnets place them (`node_zones`): every group spans the private subnet of
each of the cluster's zones (infra/aws/infrastructure.py gives each node group all of
`Network.private_subnet_ids`, one per zone: infra/aws/network.py), and its Auto Scaling group
balances its own nodes over them. Groups balance independently, so nothing lines their first nodes
up in the first zone: each group here starts in the zone after the previous group's last node. A
small group then lands where zone bugs show, e.g. three zones, two system nodes and a GPU node
alone in the third zone (issue 40). A group that needs EFA (a multi-node model's) has one placement
group and so one zone, the first, as the AWS layer gives it in mode `eks`; in mode `existing` (no
placement group of ours) it is balanced like any other, where a group split across zones shows.
"""

from __future__ import annotations

import re
from typing import Any

from components.leader_worker_set import EFA_RESOURCE
from domain.catalogue.gpu_instances import gpu_instance_types
from domain.config import PlatformConfig
from domain.multi_node import efa_interfaces_per_node, group_needs_efa
from infra.aws.network import subnet_layout
from infra.aws.node_groups import node_group_specs, system_ami_type
from tests.cluster.control_plane import KWOK_NODE_LABEL

# vCPUs per AWS instance size; memory per vCPU per family letter (m: 4 GiB, c: 2 GiB, r: 8 GiB, t: 4).
_SIZE_VCPUS = {"medium": 1, "large": 2, "xlarge": 4}
_FAMILY_GIB_PER_VCPU = {"m": 4, "c": 2, "r": 8, "t": 4}
PODS_PER_NODE = 110


def general_purpose_capacity(instance_type: str) -> tuple[int, int]:
    """(vCPUs, memory GiB) of an m/c/r/t instance type from its name, e.g. m7i.2xlarge → (8, 32)."""
    match = re.fullmatch(r"([mcrt])\d+[a-z-]*\.(\d*)(medium|large|xlarge)", instance_type)
    if not match:
        raise ValueError(
            f"no capacity known for system instance type {instance_type!r} (tests/cluster/nodes.py)"
        )
    family, multiplier, size = match.groups()
    vcpus = _SIZE_VCPUS[size] * (int(multiplier) if multiplier else 1)
    return vcpus, vcpus * _FAMILY_GIB_PER_VCPU[family]


def availability_zones(config: PlatformConfig) -> list[str]:
    """The zones of the stack's node subnets: one private subnet per zone, in the region's first
    `availability_zone_count` zones (infra/aws/network.py `subnet_layout`, `_zone_at`)."""
    layout = subnet_layout(config.cluster.vpc_cidr, config.cluster.availability_zone_count)
    return [f"{config.cluster.region}{letter}" for letter in "abcd"[: len(layout.private_cidrs)]]


def node_zones(config: PlatformConfig, *, size: str = "max_size") -> dict[str, list[str]]:
    """Node group name → the zone of each of its nodes at `size`: balanced over every zone, each
    group starting in the zone after the previous group's last node (see the module's docstring)."""
    zones = availability_zones(config)
    placed: dict[str, list[str]] = {}
    next_zone = 0
    for spec in node_group_specs(config.cluster.name, config.node_groups):
        count = getattr(spec, size)
        efa = spec.name in config.node_groups.gpu and group_needs_efa(config, spec.name)
        if efa and config.cluster.mode == "eks":
            # One cluster placement group, so one zone: the first private subnet's
            # (infra/aws/node_groups.py, docs/multi-node.md "EFA on the nodes"). In mode `existing`
            # the stack makes no placement group, and the cluster's nodes may span zones (issue 50).
            placed[spec.name] = [zones[0]] * count
            continue
        placed[spec.name] = [zones[(next_zone + index) % len(zones)] for index in range(count)]
        next_zone = (next_zone + count) % len(zones)
    return placed


def stack_nodes(config: PlatformConfig, *, size: str = "max_size") -> list[dict[str, Any]]:
    """One Node object per node of every group at `size` (max_size by default)."""
    gpu_types = gpu_instance_types()
    region = config.cluster.region
    zones_of = node_zones(config, size=size)
    nodes = []
    for spec in node_group_specs(config.cluster.name, config.node_groups):
        instance_type = spec.instance_types[0]
        capacity: dict[str, str]
        if instance_type in gpu_types:
            gpu = gpu_types[instance_type]
            capacity = {
                "cpu": str(gpu.vcpus),
                "memory": f"{gpu.memory_gib}Gi",
                "nvidia.com/gpu": str(gpu.gpus_per_node),
            }
        else:
            vcpus, memory_gib = general_purpose_capacity(instance_type)
            capacity = {"cpu": str(vcpus), "memory": f"{memory_gib}Gi"}
        efa = efa_interfaces_per_node(config, spec.name) if spec.name in config.node_groups.gpu else 0
        if efa:
            # What the EFA device plugin registers on the nodes whose launch template has EFA
            # interfaces: the groups that hold a multi-node model (domain/multi_node.py).
            capacity[EFA_RESOURCE] = str(efa)
        capacity |= {"pods": str(PODS_PER_NODE), "ephemeral-storage": f"{spec.disk_size_gib}Gi"}
        architecture = "arm64" if "ARM_64" in system_ami_type([instance_type]) else "amd64"
        for index in range(getattr(spec, size)):
            name = f"{spec.name}-{index}"
            zone = zones_of[spec.name][index]
            labels = {
                **spec.labels,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": architecture,
                "node.kubernetes.io/instance-type": instance_type,
                "topology.kubernetes.io/region": region,
                "topology.kubernetes.io/zone": zone,
                "eks.amazonaws.com/nodegroup": spec.name,
                "eks.amazonaws.com/capacityType": spec.capacity_type,
                KWOK_NODE_LABEL[0]: KWOK_NODE_LABEL[1],
            }
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": labels},
                    "spec": {
                        "taints": [
                            {"key": t.key, **({"value": t.value} if t.value else {}), "effect": t.effect}
                            for t in spec.taints
                        ]
                    },
                    "status": {
                        "capacity": capacity,
                        "allocatable": capacity,
                        "nodeInfo": {"architecture": architecture, "operatingSystem": "linux"},
                    },
                }
            )
    return nodes
