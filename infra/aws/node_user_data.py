"""User data for GPU nodes (AL2023): turn the instance-store NVMe disks into the local model cache.

EKS managed node groups merge their own nodeadm configuration into launch-template user data, and
accept it only as a MIME multi-part document (EKS user guide, "Customize managed nodes with launch
templates"); our part is one shell script. cloud-init runs it once per instance; the vLLM pods'
preloader then finds `<mount_path>/vllm-models` on every GPU node of the group.
"""

from __future__ import annotations

import base64
import shlex
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText

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


def al2023_user_data(mount_path: str) -> str:
    """MIME multi-part user data (text) for an AL2023 managed node: the NVMe script as one part."""
    document = MIMEMultipart("mixed", boundary=MIME_BOUNDARY)
    document.attach(MIMEText(local_nvme_script(mount_path), "x-shellscript"))
    return document.as_string()


def encode_user_data(text: str) -> str:
    """Launch templates take user data base64-encoded."""
    return base64.b64encode(text.encode()).decode()
