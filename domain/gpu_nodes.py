"""What a GPU node is, whoever launches it: its labels and its EBS volumes. The AWS layer's managed
node groups (infra/aws/node_groups.py) and the Kubernetes layer's Karpenter EC2NodeClasses
(components/karpenter.py) both build their nodes from these, so a pool's node and a group's node
are the same node."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from domain.config.cluster import GpuNodeGroupConfig
from domain.labels import GPU_GROUP_LABEL, GPU_MODEL_LABEL
from domain.node_user_data import IMAGE_VOLUME_DEVICE

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
# Cluster Autoscaler's AWS provider recognises GPU nodes by this label: without it, a node that is up
# but whose device plugin has not registered GPUs yet looks unneeded, and pending GPU pods can make it
# add a second node (cluster-autoscaler FAQ, "GPU nodes").
GPU_ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
"""The NVIDIA device plugin's and DCGM exporter's charts schedule onto nodes with this label; set at
node creation so they need not wait for GPU feature discovery."""


def gpu_node_labels(group_name: str, group: GpuNodeGroupConfig) -> dict[str, str]:
    """Config labels plus the platform's own; the platform's win, since selectors depend on them."""
    return {
        **group.labels,
        GPU_GROUP_LABEL: group_name,
        GPU_PRESENT_LABEL: "true",
        GPU_MODEL_LABEL: group.gpu_model.name,
        GPU_ACCELERATOR_LABEL: f"nvidia-{group.gpu_model.name.lower()}",
    }


def root_device_name(ami_type: str) -> str:
    # Bottlerocket keeps the OS on a small /dev/xvda and images/containers on the data volume /dev/xvdb.
    return "/dev/xvdb" if ami_type.startswith("BOTTLEROCKET") else "/dev/xvda"


def gpu_block_devices(group: GpuNodeGroupConfig) -> tuple[BlockDevice, ...]:
    """The GPU node's EBS volumes: the root (Bottlerocket: its data volume) at the configured gp3
    throughput, and with `image_snapshot_id` the image volume made from that snapshot: Bottlerocket's
    data volume itself, or on AL2023 a second volume that becomes containerd's root."""
    pull = group.image_pull
    fast = {"throughput": pull.root_volume_throughput_mibps, "iops": pull.root_volume_iops}
    root = BlockDevice(root_device_name(group.ami_type), group.disk_size_gib, **fast)
    if pull.image_snapshot_id is None:
        return (root,)
    if group.ami_type.startswith("BOTTLEROCKET"):
        return (dataclasses.replace(root, snapshot_id=pull.image_snapshot_id),)
    # containerd's images move to the snapshot's volume; it gets the root's size and speed.
    image = BlockDevice(IMAGE_VOLUME_DEVICE, group.disk_size_gib, **fast, snapshot_id=pull.image_snapshot_id)
    return (root, image)


@dataclass(frozen=True)
class BlockDevice:
    device_name: str
    size_gib: int
    throughput: int | None = None
    iops: int | None = None
    snapshot_id: str | None = None

    def mapping(self) -> dict[str, object]:
        ebs: dict[str, object] = {
            "volume_size": self.size_gib,
            "volume_type": "gp3",
            "encrypted": "true",
            "delete_on_termination": "true",
        }
        if self.throughput:
            ebs.update(throughput=self.throughput, iops=self.iops)
        if self.snapshot_id:
            ebs["snapshot_id"] = self.snapshot_id
        return {"device_name": self.device_name, "ebs": ebs}
