"""User data for GPU nodes: the instance-store NVMe model cache, and how the node pulls images.

EKS managed node groups merge their own node configuration into launch-template user data. AL2023
takes a MIME multi-part document (EKS user guide, "Customize managed nodes with launch
templates"): our shell scripts (NVMe cache; the containerd volume from a snapshot) run once per
instance before nodeadm starts containerd, and our `NodeConfig` part (nodeadm's schema,
node.eks.aws/v1alpha1) is merged with EKS's. Bottlerocket takes TOML settings, also merged.

Image pulls (docs/aws.md, "The vLLM image on a new node"): SOCI parallel pull/unpack (nodeadm's
`FastImagePull` feature gate; Bottlerocket's soci snapshotter in parallel-pull-unpack mode),
kubelet parallel pulls, and containerd's per-image download concurrency.
"""

from __future__ import annotations

import base64
import shlex
from email.encoders import encode_7or8bit
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import yaml

from domain.config.cluster import ImagePullConfig

MODEL_CACHE_DIRECTORY = "vllm-models"
"""Directory under `local_nvme.mount_path` that holds the node-local copy of model weights."""
RAID_DEVICE = "/dev/md/vllm-nvme"
# Fixed so the rendered launch template (and so the preview diff) is the same on every run.
MIME_BOUNDARY = "==vllm-platform-user-data=="

_SCRIPT = """\
#!/bin/bash
# vllm-platform: assemble the instance-store NVMe disks into one XFS volume for the model cache.
set -euo pipefail
MOUNT_PATH={mount_path}
CACHE_DIR={cache_dir}
ARRAY={raid_device}

if mountpoint -q "$MOUNT_PATH"; then
  echo "vllm-platform: $MOUNT_PATH is already mounted"
  exit 0
fi

# Instance-store disks report this model; the EBS root volume reports "Amazon Elastic Block Store".
mapfile -t DISKS < <(lsblk --nodeps --noheadings --paths --output NAME,MODEL \\
  | awk '/Amazon EC2 NVMe Instance Storage/ {{print $1}}')

mkdir -p "$MOUNT_PATH"
if [ "${{#DISKS[@]}}" -eq 0 ]; then
  echo "vllm-platform: no instance-store NVMe disks; the model cache stays on the root volume"
else
  if [ "${{#DISKS[@]}}" -eq 1 ]; then
    DEVICE="${{DISKS[0]}}"
  else
    # RAID0: the cache is a copy of the shared volume, so striping for read speed loses nothing.
    command -v mdadm >/dev/null || dnf install -y mdadm
    mdadm --create "$ARRAY" --level=0 --raid-devices="${{#DISKS[@]}}" --run "${{DISKS[@]}}"
    mdadm --detail --scan >> /etc/mdadm.conf
    DEVICE="$ARRAY"
  fi
  # -K: skip the discard pass; new instance-store disks are already trimmed (minutes saved on p5).
  mkfs.xfs -f -K "$DEVICE"
  mount -o defaults,noatime "$DEVICE" "$MOUNT_PATH"
  # nofail: after a stop/start the disks come back empty; boot must not hang on them.
  echo "UUID=$(blkid -s UUID -o value "$DEVICE") $MOUNT_PATH xfs defaults,noatime,nofail 0 2" >> /etc/fstab
fi

mkdir -p "$CACHE_DIR"
# Pods of several models (different namespaces, one UID) share the node: sticky and writable like /tmp.
chmod 1777 "$CACHE_DIR"
echo "vllm-platform: model cache ready at $CACHE_DIR"
"""


def local_nvme_script(mount_path: str) -> str:
    """The shell script that RAIDs (when several), formats and mounts the instance-store disks."""
    if not mount_path.startswith("/") or mount_path.rstrip("/") == "":
        raise ValueError(f"mount_path must be an absolute path below /, not {mount_path!r}")
    mount_path = mount_path.rstrip("/")
    return _SCRIPT.format(
        mount_path=shlex.quote(mount_path),
        cache_dir=shlex.quote(f"{mount_path}/{MODEL_CACHE_DIRECTORY}"),
        raid_device=shlex.quote(RAID_DEVICE),
    )


CONTAINERD_ROOT = "/var/lib/containerd"
IMAGE_VOLUME_DEVICE = "/dev/xvdb"
"""AL2023 with `image_snapshot_id`: the extra EBS volume made from the snapshot (AL2023's udev rules
link the NVMe device to the name the launch template gives it)."""

_CONTAINERD_VOLUME_SCRIPT = """\
#!/bin/bash
# vllm-platform: containerd's image store from the EBS snapshot that already holds the vLLM image.
# Runs before nodeadm starts containerd, so containerd finds the image and does not pull it.
set -euo pipefail
DEVICE={device}
ROOT={root}
for _ in $(seq 1 60); do [ -e "$DEVICE" ] && break; sleep 1; done
if [ ! -e "$DEVICE" ]; then
  echo "vllm-platform: $DEVICE did not appear; containerd keeps the root volume and pulls" >&2
  exit 0
fi
mkdir -p "$ROOT"
mount -o defaults,noatime "$DEVICE" "$ROOT"
FSTYPE=$(blkid -s TYPE -o value "$DEVICE")
echo "UUID=$(blkid -s UUID -o value "$DEVICE") $ROOT $FSTYPE defaults,noatime,nofail 0 2" >> /etc/fstab
echo "vllm-platform: containerd image store from the snapshot at $ROOT"
"""


def containerd_volume_script() -> str:
    """The script that mounts the snapshot's volume as containerd's root before containerd starts."""
    return _CONTAINERD_VOLUME_SCRIPT.format(
        device=shlex.quote(IMAGE_VOLUME_DEVICE), root=shlex.quote(CONTAINERD_ROOT)
    )


EFA_MEMLOCK_DROP_IN = "/etc/systemd/system/containerd.service.d/20-vllm-platform-efa-memlock.conf"
"""AL2023 EFA nodes: containerd's own locked-memory limit raised to unlimited (issue 50), which runc hands
to every container whose runtime spec names no RLIMIT_MEMLOCK; nodeadm's base runtime spec names only
RLIMIT_NOFILE (amazon-eks-ami nodeadm/internal/containerd/base-runtime-spec.json, 2026-07)."""

_EFA_MEMLOCK_SCRIPT = """\
#!/bin/bash
# vllm-platform: unlimited locked memory for the containers of an EFA node (issue 50). libfabric's EFA
# provider registers its buffers with the device and needs it; a group's members run as non-root with
# every capability dropped, so they cannot raise the limit themselves (CAP_IPC_LOCK would not help a
# non-root process). runc sets only the rlimits the runtime spec names, and nodeadm's base spec names
# RLIMIT_NOFILE alone: a container inherits containerd's own RLIMIT_MEMLOCK, which this raises.
set -euo pipefail
mkdir -p "$(dirname {drop_in})"
cat > {drop_in} <<'UNIT'
[Service]
LimitMEMLOCK=infinity
UNIT
systemctl daemon-reload
# User data runs before nodeadm starts containerd; should containerd already run, restart it so the
# kubelet's containers get the new limit.
if systemctl is-active --quiet containerd; then systemctl restart containerd; fi
echo "vllm-platform: containerd (and its containers) run with unlimited locked memory"
"""


def efa_memlock_script() -> str:
    """The script that gives containerd, and so every container on the node, unlimited locked memory."""
    return _EFA_MEMLOCK_SCRIPT.format(drop_in=shlex.quote(EFA_MEMLOCK_DROP_IN))


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the containerd TOML) as YAML literal blocks, as a person writes them."""


_BlockDumper.add_representer(
    str,
    lambda dumper, text: dumper.represent_scalar(
        "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None
    ),
)


def nodeadm_config(image_pull: ImagePullConfig) -> dict[str, Any]:
    """Our part of the node's `NodeConfig` (nodeadm merges it with the one EKS adds)."""
    spec: dict[str, Any] = {}
    if image_pull.fast_image_pull:
        # SOCI snapshotter in parallel pull/unpack mode (nodeadm internal/containerd, FastImagePull).
        spec["featureGates"] = {"FastImagePull": True}
    if image_pull.parallel_image_pulls > 1:
        spec["kubelet"] = {
            "config": {"serializeImagePulls": False, "maxParallelImagePulls": image_pull.parallel_image_pulls}
        }
    # The v2 config schema: nodeadm merges it as is on containerd 1.7 and runs `containerd config
    # migrate` on containerd 2 (a v3 key would be refused on 1.7).
    spec["containerd"] = {
        "config": '[plugins."io.containerd.grpc.v1.cri"]\n'
        f"max_concurrent_downloads = {image_pull.max_concurrent_downloads}\n"
    }
    return {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": spec}


def al2023_user_data(
    mount_path: str | None, image_pull: ImagePullConfig | None = None, *, efa: bool = False
) -> str:
    """MIME multi-part user data (text) for an AL2023 managed node: the NVMe script (when `mount_path`),
    the EFA locked-memory script (`efa`: the group holds multi-node models), the containerd volume script
    (with a snapshot), then our NodeConfig. The NodeConfig never sets `containerd.baseRuntimeSpec`:
    nodeadm replaces the default spec's rlimits list with ours and round-trips numbers through float64,
    where RLIM_INFINITY (2^64-1) cannot survive (nodeadm internal/util/merge.go), so memlock is raised on
    containerd itself instead."""
    document = MIMEMultipart("mixed", boundary=MIME_BOUNDARY)
    if mount_path is not None:
        document.attach(MIMEText(local_nvme_script(mount_path), "x-shellscript"))
    if efa:
        document.attach(MIMEText(efa_memlock_script(), "x-shellscript"))
    if image_pull is not None:
        if image_pull.image_snapshot_id:
            document.attach(MIMEText(containerd_volume_script(), "x-shellscript"))
        node_config = yaml.dump(nodeadm_config(image_pull), Dumper=_BlockDumper, sort_keys=False)
        # application/node.eks.aws: the part nodeadm reads (nodeadm/doc/examples.md); plain text.
        document.attach(MIMEApplication(node_config, "node.eks.aws", _encoder=encode_7or8bit))
    return document.as_string()


def bottlerocket_user_data(image_pull: ImagePullConfig) -> str:
    """TOML settings for a Bottlerocket node (EKS merges its own): containerd's download concurrency
    and, with `fast_image_pull`, the soci snapshotter in parallel-pull-unpack mode (bottlerocket.dev,
    settings.container-runtime and settings.container-runtime-plugins, 1.44 and later).

    Nothing for EFA's locked memory, on purpose: where an EFA device is attached Bottlerocket makes the
    containers' RLIMIT_MEMLOCK unlimited itself, unless `settings.oci-defaults.resource-limits.
    max-locked-memory` is set (bottlerocket-core-kit, schnauzer's oci_defaults helper,
    `generate_oci_resource_limits`, since PR #141 of 2024-09), so these settings never set that key."""
    lines = [
        "[settings.container-runtime]",
        f"max-concurrent-downloads = {image_pull.max_concurrent_downloads}",
    ]
    if image_pull.fast_image_pull:
        lines += [
            'snapshotter = "soci"',
            "",
            "[settings.container-runtime-plugins.soci-snapshotter]",
            'pull-mode = "parallel-pull-unpack"',
        ]
    return "\n".join(lines) + "\n"


def encode_user_data(text: str) -> str:
    """Launch templates take user data base64-encoded."""
    return base64.b64encode(text.encode()).decode()
