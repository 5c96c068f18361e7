"""How the API-key check reaches the vLLM container (pure builders; the check is in pod_files/).

Decision (docs/security.md, "API key on every route"): vLLM's own `--middleware` hook, not a proxy
sidecar. The check runs in the server process, in front of every route vLLM has or will add, with
no second hop that could buffer SSE streams, no second container to drain in step with vLLM's
`--shutdown-timeout`, no extra image to pin and patch, and no second port for probes and Prometheus.
The upstream image needs nothing added: the module (code, no secret) comes from a ConfigMap on a
read-only mount that PYTHONPATH names, and the key from `VLLM_API_KEY` (the CSI-synced Secret).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

MODULE_FILE = Path(__file__).with_name("pod_files") / "vllm_platform_auth.py"
MODULE_NAME = MODULE_FILE.stem
MIDDLEWARE = f"{MODULE_NAME}.ApiKeyMiddleware"
"""`--middleware` value: vLLM 0.32.0 imports it, then `app.add_middleware` (serve/middleware/register.py)."""
CONFIG_MAP_NAME = "vllm-platform-auth"
VOLUME_NAME = "auth-middleware"
MOUNT_PATH = "/opt/vllm-platform"
CHECKSUM_ANNOTATION = "vllm-platform.dev/auth-middleware-sha256"
"""On the pod template, so a changed check rolls the pods (a ConfigMap edit alone would not)."""


def module_source() -> str:
    return MODULE_FILE.read_text()


def server_arguments() -> list[str]:
    return ["--middleware", MIDDLEWARE]


def config_map_data() -> dict[str, str]:
    return {MODULE_FILE.name: module_source()}


def module_checksum() -> str:
    return hashlib.sha256(module_source().encode()).hexdigest()


def volume() -> dict[str, Any]:
    return {"name": VOLUME_NAME, "configMap": {"name": CONFIG_MAP_NAME, "defaultMode": 0o444}}


def volume_mount() -> dict[str, Any]:
    return {"name": VOLUME_NAME, "mountPath": MOUNT_PATH, "readOnly": True}


def environment() -> list[dict[str, str]]:
    # The upstream vllm/vllm-openai image sets no PYTHONPATH of its own, so nothing is overridden.
    return [{"name": "PYTHONPATH", "value": MOUNT_PATH}]
