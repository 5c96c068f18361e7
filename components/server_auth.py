"""How the API-key check reaches the vLLM container (pure builders; the check is in pod_files/).

Decision (docs/security.md, "API key on every route"): vLLM's own `--middleware` hook, not a proxy
sidecar. The check runs in the server process, in front of every route vLLM has or will add, with
no second hop that could buffer SSE streams, no second container to drain in step with vLLM's
`--shutdown-timeout`, no extra image to pin and patch, and no second port for probes and Prometheus.
The upstream image needs nothing added: the module (code, no secret) comes from a ConfigMap on a
read-only mount that PYTHONPATH names, and the key from `VLLM_API_KEY` (the CSI-synced Secret).
"""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path
from typing import Any

from components import secrets
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.config.tenants import in_flight_share, tenant_concurrency, tenants_on

__all__ = ["in_flight_share"]  # where tests and the bench find it beside tenants_document

MODULE_FILE = Path(__file__).with_name("pod_files") / "vllm_platform_auth.py"
MODULE_NAME = MODULE_FILE.stem
MIDDLEWARE = f"{MODULE_NAME}.ApiKeyMiddleware"
"""`--middleware` value: vLLM 0.32.0 imports it, then `app.add_middleware` (serve/middleware/register.py)."""
CONFIG_MAP_NAME = "vllm-platform-auth"
VOLUME_NAME = "auth-middleware"
MOUNT_PATH = "/opt/vllm-platform"
CHECKSUM_ANNOTATION = "vllm-platform.dev/auth-middleware-sha256"
"""On the pod template, so a changed check rolls the pods (a ConfigMap edit alone would not)."""


STATE_DIR = "/dev/shm/vllm-platform"
"""With tenants, `VLLM_PLATFORM_STATE_DIR`: what the pod's API-server processes share (issue 49: the
tenants' in-flight counts, and the secret their cache salts are derived under). On the pod's
`/dev/shm`, a memory emptyDir every vLLM pod mounts (components/model_service.py): a tmpfs of this
pod only, never written to disk, gone with the pod; the middleware ignores counts a dead process
left there."""
TENANTS_FILE = "tenants.json"
"""With tenants, beside the module in the ConfigMap: who may call which served name of this model
(no key). Not in the checksum annotation: the kubelet updates the mounted file in place and the
middleware re-reads it, so a tenant's names change without rolling the pods."""
FORCE_INCLUDE_USAGE = "--enable-force-include-usage"
"""With tenants: vLLM puts `usage` in every answer, streams included (a last chunk with empty
`choices`, as OpenAI's `stream_options.include_usage` gives), so the middleware counts each
tenant's tokens without touching the stream."""


def module_source() -> str:
    return MODULE_FILE.read_text()


def server_arguments(*, tenants: bool = False) -> list[str]:
    return ["--middleware", MIDDLEWARE, *([FORCE_INCLUDE_USAGE] if tenants else [])]


def tenants_document(config: PlatformConfig, model: ModelConfig) -> dict[str, Any]:
    """The middleware's tenants file for `model`'s pods: their served names (vLLM's default first)
    and, for each tenant allowed on one of them, those it may call, its key prefix and its in-flight
    share (`max_in_flight`: sequences over all the pod's API-server processes, from the stack's limit
    or, on a shared model, the default: `tenant_concurrency`); and whether each tenant gets a prefix
    cache of its own (`security.tenants_share_prefix_cache` false)."""
    served = config.served_names(model)
    shares = {row.tenant: row.per_pod for row in tenant_concurrency(config, model)}
    return {
        "served_names": served,
        "isolated_prefix_cache": not config.security.tenants_share_prefix_cache,
        "tenants": {
            tenant.name: {
                "models": [name for name in served if name in tenant.models],
                "key_prefix": tenant.prefix,
                "max_in_flight": shares[tenant.name],
            }
            for tenant in tenants_on(config, model)
        },
    }


def config_map_data(config: PlatformConfig | None = None, model: ModelConfig | None = None) -> dict[str, str]:
    data = {MODULE_FILE.name: module_source()}
    if config is not None and model is not None and config.tenants:
        data[TENANTS_FILE] = json.dumps(tenants_document(config, model), indent=2, sort_keys=True) + "\n"
    return data


def module_checksum() -> str:
    return hashlib.sha256(module_source().encode()).hexdigest()


def volume() -> dict[str, Any]:
    return {"name": VOLUME_NAME, "configMap": {"name": CONFIG_MAP_NAME, "defaultMode": 0o444}}


def volume_mount() -> dict[str, Any]:
    return {"name": VOLUME_NAME, "mountPath": MOUNT_PATH, "readOnly": True}


JSON_VALUES_PER_CONTEXT_TOKEN = 4
"""A chat message costs at most this many values beyond its text (object, role, content, one part)
and carries at least one token, and a token-ID prompt costs one value per token."""
JSON_VALUES_BEYOND_CONTEXT = 16_384
"""Room for tool schemas, `logit_bias` and the other request fields."""


def max_json_values(config: PlatformConfig, model: ModelConfig) -> int:
    """`security.max_request_json_values`, or the bound derived from the model's context."""
    configured = config.security.max_request_json_values
    if configured is not None:
        return configured
    return JSON_VALUES_PER_CONTEXT_TOKEN * model.vllm.max_model_len + JSON_VALUES_BEYOND_CONTEXT


def environment(
    config: PlatformConfig | None = None, model: ModelConfig | None = None
) -> list[dict[str, str]]:
    # The upstream vllm/vllm-openai image sets no PYTHONPATH of its own, so nothing is overridden.
    env = [{"name": "PYTHONPATH", "value": MOUNT_PATH}]
    if config is None:
        return env
    env.append({"name": "VLLM_PLATFORM_MAX_BODY_BYTES", "value": str(max_body_bytes(config))})
    if model is not None:
        env.append({"name": "VLLM_PLATFORM_MAX_JSON_VALUES", "value": str(max_json_values(config, model))})
        # The same `--max-model-len` vLLM gets: no conversation may hold more messages (issue 49).
        env.append({"name": "VLLM_PLATFORM_MAX_MODEL_LEN", "value": str(model.vllm.max_model_len)})
    if config.tenants:
        env += [
            {"name": "VLLM_PLATFORM_TENANTS", "value": f"{MOUNT_PATH}/{TENANTS_FILE}"},
            {"name": "VLLM_PLATFORM_TENANT_MOUNT", "value": secrets.TENANT_KEYS_MOUNT_PATH},
            {"name": "VLLM_PLATFORM_TENANT_LOOP_SHARE", "value": str(config.security.tenant_body_loop_share)},
            {"name": "VLLM_PLATFORM_STATE_DIR", "value": STATE_DIR},
        ]
    if config.security.operator_key_secret is not None:
        env.append(
            {
                "name": "VLLM_PLATFORM_OPERATOR_KEY_FILE",
                "value": f"{secrets.TENANT_KEYS_MOUNT_PATH}/{secrets.OPERATOR_KEY_FILE}",
            }
        )
    return env


def max_body_bytes(config: PlatformConfig) -> int:
    return config.security.max_request_body_mib * 1024 * 1024


def _module_constant(name: str) -> Any:
    """A literal constant of the middleware module, read from its source: importing the module runs
    its start-up key check, which needs a pod's environment."""
    for node in ast.parse(module_source()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                value = node.value
                if (
                    isinstance(value, ast.Call)
                    and isinstance(value.func, ast.Name)
                    and value.func.id == "frozenset"
                ):
                    return frozenset(ast.literal_eval(value.args[0]))
                return ast.literal_eval(value)
    raise KeyError(f"{MODULE_FILE.name} defines no literal {name}")


def inference_routes() -> dict[str, str]:
    """Route -> where vLLM takes its served name from: the POST routes a model or tenant key reaches."""
    return _module_constant("INFERENCE_ROUTES")


def route_policy() -> dict[str, str]:
    """Every route the middleware has decided on -> `open`, `inference`, `models`, `websocket`
    (inference over a WebSocket) or `operator` (docs/security.md, "Routes")."""
    policy = {path: "open" for path in _module_constant("OPEN_PATHS")}
    policy[_module_constant("MODELS_PATH")] = "models"
    policy |= {path: "inference" for path in inference_routes()}
    policy |= {path: "websocket" for path in _module_constant("WEBSOCKET_ROUTES")}
    policy |= {path: "operator" for path in _module_constant("OPERATOR_ROUTES")}
    return policy
