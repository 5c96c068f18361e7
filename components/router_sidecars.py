"""The router pod's two sidecars of ours and what they read: the registrar (router/registrar.py), which
registers each model's router with the front and answers /v1/models, and the wake gates
(router/wake_gate.py) of the models that scale to zero, with the keys they check."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from components import router_door, secrets
from components.router_layout import (
    FRONT_POLICY,
    FRONT_PORT,
    MODELS_PORT,
    READINESS_PATH,
    REGISTRAR_CONFIG_DIR,
    REGISTRAR_CONFIG_FILE,
    REGISTRAR_CONTAINER,
    REGISTRAR_SCRIPT,
    ROUTER_KEYS_MOUNT_PATH,
    ROUTER_KEYS_PROVIDER_CLASS,
    ROUTER_KEYS_VOLUME,
    WAKE_GATE_CONFIG_FILE,
    WAKE_GATE_CONTAINER,
    WAKE_GATE_SCRIPT,
    model_router_port,
    router_resources,
    sidecar_liveness,
    wake_gate_port,
)
from components.server_auth import inference_routes, max_body_bytes
from components.vllm_pod import container_security_context
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig, RouterConfig
from domain.config.tenants import tenants_on
from domain.key_files import gated_models, model_key_file, wake_gate_key_files
from domain.versions import VLLM_ROUTER_IMAGE


def wake_gate_callers(config: PlatformConfig, model: ModelConfig) -> list[dict[str, Any]]:
    """Who may wake `model`: exactly whom its pods accept (domain/config/tenants.py `model_key_secrets`),
    each with the key files the gate reads and the served names of `model` it may call."""
    served = config.served_names(model)
    callers: list[dict[str, Any]] = []
    if config.tenants:
        for tenant in tenants_on(config, model):
            callers.append(
                {
                    "name": tenant.name,
                    "files": [
                        secrets.tenant_key_file_name(tenant.name, n)
                        for n in range(len(tenant.api_key_secrets))
                    ],
                    "models": [name for name in served if name in tenant.models],
                    "key_prefix": tenant.prefix,
                }
            )
    else:
        callers.append({"name": "model key", "files": [model_key_file(model).file], "models": served})
    if config.security.operator_key_secret is not None:
        callers.append(
            {"name": "operator", "files": [secrets.OPERATOR_KEY_FILE], "models": served, "every_route": True}
        )
    return callers


def wake_retry_after_seconds(config: PlatformConfig, model: ModelConfig) -> int:
    """`Retry-After` on the 503 past the hold: the model's predicted wake (`vllm-platform plan`), the
    time a replica asked for at the request's start should take to serve."""
    from domain.capacity.plan import plan_model

    return math.ceil(plan_model(model, config, model.gpu_group).wake.expected_seconds)


def wake_gate_config(config: PlatformConfig) -> dict[str, Any]:
    """What router/wake_gate.py reads: one gate per to-zero model, in front of the model's router."""
    return {
        "keys_dir": ROUTER_KEYS_MOUNT_PATH,
        "max_body_bytes": max_body_bytes(config),
        # The pod's own list (its middleware's INFERENCE_ROUTES): the gate refuses the rest as it does.
        "inference_routes": sorted(inference_routes()),
        "upstream_timeout_seconds": config.router.request_timeout_seconds,
        "models": [
            {
                "model": model.name,
                "port": wake_gate_port(index),
                "model_router_url": f"http://127.0.0.1:{model_router_port(index)}",
                "served_names": config.served_names(model),
                "retry_after_seconds": wake_retry_after_seconds(config, model),
                "callers": wake_gate_callers(config, model),
            }
            for index, model in gated_models(config)
        ],
    }


def registrar_config(config: PlatformConfig) -> dict[str, Any]:
    """What router/registrar.py reads: the front router, and each model's router as its worker (a
    to-zero model's through its wake gate)."""
    return {
        "router_url": f"http://127.0.0.1:{FRONT_PORT}",
        "interval_seconds": config.router.registration_interval_seconds,
        "models_port": MODELS_PORT,
        "workers": [
            {
                "url": f"http://127.0.0.1:{model_router_port(index)}",
                "model_id": model.openai_model_name,
                "policy": FRONT_POLICY,
                # The model's LoRA adapters are routed to the same model router (router/registrar.py).
                "served_names": config.served_names(model),
                # Listed by /v1/models while it has no replica, without waking it (router/registrar.py).
                "scale_to_zero": model.scales_to_zero,
                # The front routes a to-zero model to its wake gate, which passes only valid keys on to
                # the hold (router/wake_gate.py, issue 40).
                **(
                    {"front_url": f"http://127.0.0.1:{wake_gate_port(index)}"} if model.scales_to_zero else {}
                ),
            }
            for index, model in enumerate(config.models)
        ],
    }


def registrar_config_checksum(config: PlatformConfig) -> str:
    return hashlib.sha256(json.dumps(registrar_config_map_data(config), sort_keys=True).encode()).hexdigest()


def registrar_config_map_data(config: PlatformConfig) -> dict[str, str]:
    """The ConfigMap both sidecars read (code and keys are elsewhere: no secret here)."""
    data = {
        REGISTRAR_CONFIG_FILE: json.dumps(registrar_config(config), indent=2, sort_keys=True),
        router_door.DOOR_CONFIG_FILE: router_door.door_config(config),
    }
    if gated_models(config):
        data[WAKE_GATE_CONFIG_FILE] = json.dumps(wake_gate_config(config), indent=2, sort_keys=True)
    return data


def registrar_container(router: RouterConfig) -> dict[str, Any]:
    """Registers the model routers with the front and serves `/v1/models` to the load balancer. Its
    readiness is its own server's only (never a model's), so the pod stays in the load balancer
    while any model has no ready pod."""
    return {
        "name": REGISTRAR_CONTAINER,
        "image": VLLM_ROUTER_IMAGE.reference,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "python",
            REGISTRAR_SCRIPT,
            "--config",
            f"{REGISTRAR_CONFIG_DIR}/{REGISTRAR_CONFIG_FILE}",
        ],
        # On 127.0.0.1 behind the door: its readiness runs in the container, as the liveness of the rest.
        "readinessProbe": {
            **router_door.loopback_liveness(MODELS_PORT, READINESS_PATH),
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        # Answers /v1/models while the load balancer deregisters the pod, as the front does.
        "lifecycle": {"preStop": {"sleep": {"seconds": router.drain_seconds}}},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": container_security_context(read_only_root_filesystem=True),
        "volumeMounts": [{"name": "registrar-config", "mountPath": REGISTRAR_CONFIG_DIR, "readOnly": True}],
    }


def wake_gate_container(config: PlatformConfig) -> dict[str, Any]:
    """The to-zero models' wake gates (router/wake_gate.py): the only container that mounts keys. On
    the request path of those models (a localhost hop, streamed), so it gets a router's resources."""
    (first_index, _), *_ = gated_models(config)
    return {
        "name": WAKE_GATE_CONTAINER,
        "image": VLLM_ROUTER_IMAGE.reference,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "python",
            WAKE_GATE_SCRIPT,
            "--config",
            f"{REGISTRAR_CONFIG_DIR}/{WAKE_GATE_CONFIG_FILE}",
        ],
        # Reached from the front on 127.0.0.1 only.
        # Its own answer, never the model's: a model at zero must not take the pod out of service.
        "livenessProbe": sidecar_liveness(wake_gate_port(first_index)),
        "lifecycle": {"preStop": {"sleep": {"seconds": config.router.drain_seconds}}},
        "resources": router_resources(config.router),
        "securityContext": container_security_context(read_only_root_filesystem=True),
        "volumeMounts": [
            {"name": "registrar-config", "mountPath": REGISTRAR_CONFIG_DIR, "readOnly": True},
            {"name": ROUTER_KEYS_VOLUME, "mountPath": ROUTER_KEYS_MOUNT_PATH, "readOnly": True},
        ],
    }


def router_keys_volume(config: PlatformConfig) -> dict[str, Any]:
    """The wake gate's key folder: the CSI driver's mount of SecretProviderClass vllm-router-keys, or
    (`kubernetes-secret`) Secrets of the same names in namespace vllm-router, projected; both are
    updated in place on rotation."""
    store = config.security.secret_store
    if secrets.uses_csi(store):
        return secrets.csi_volume(ROUTER_KEYS_VOLUME, ROUTER_KEYS_PROVIDER_CLASS)
    return secrets.tenant_keys_volume(store, wake_gate_key_files(config)) | {"name": ROUTER_KEYS_VOLUME}


def router_keys_provider_class_spec(config: PlatformConfig) -> dict[str, Any] | None:
    """The SecretProviderClass of the wake gate's keys; None without a to-zero model or without CSI."""
    files = wake_gate_key_files(config)
    store = config.security.secret_store
    if not files or not secrets.uses_csi(store):
        return None
    return secrets.tenant_keys_provider_class_spec(store, files, config.cluster.region)
