"""Edits of a stack file's `config` mapping that several tests make the same way."""

from __future__ import annotations

from typing import Any

EXISTING_EFS_FILE_SYSTEM_ID = "fs-0abc1234def567890"
"""A well-formed EFS id for mode `existing` (storage.existing_efs_file_system_id); never dialled."""


def on_an_existing_cluster(
    config: dict[str, Any], *, name: str, context: str, ingress_cidrs: list[str]
) -> None:
    """Move a stack file's `config` onto a cluster it does not create (`cluster.mode: existing`, in
    us-west-2 over two zones, reached by kubeconfig `context`): what mode `existing` requires besides,
    the EFS file system behind the model volume and the ALB subnets' CIDRs (`ingress_cidrs`)."""
    config.pop("aws:region", None)
    config["vllm-platform:cluster"] = {
        "mode": "existing",
        "name": name,
        "region": "us-west-2",
        "availability_zone_count": 2,
        "kubeconfig_context": context,
    }
    config["vllm-platform:storage"] = {"existing_efs_file_system_id": EXISTING_EFS_FILE_SYSTEM_ID}
    config["vllm-platform:security"] = {"load_balancer_source_cidrs": list(ingress_cidrs)}
