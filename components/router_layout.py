"""The router pod's layout: its containers' names, ports and paths, and each model's router and wake
gate port. What the router's Deployment (components/router.py), its sidecars' configuration
(components/router_sidecars.py) and its NetworkPolicies agree on."""

from __future__ import annotations

from typing import Any

from components import router_door
from components.guardrails import platform_labels
from domain.config.models import ModelConfig
from domain.config.platform import RouterConfig
from domain.labels import ROUTER_APP_NAME, router_selector_labels

ROUTER_NAME = ROUTER_APP_NAME
"""Name of the Deployment, Service, PDB, Ingress, ServiceAccount and PodMonitor."""
ROUTER_CONTAINER = "router"
REGISTRAR_CONTAINER = "registrar"
ROUTER_PORT = router_door.DOOR_PORT
"""The pod's served port: the door (components/router_door.py); the front is behind it on FRONT_PORT."""
FRONT_PORT = router_door.FRONT_PORT
METRICS_PORT = 29000
MODEL_ROUTER_BASE_PORT = 8100
"""Model i's single-model router listens on 127.0.0.1:8100+i and serves metrics on 29001+i."""
MODELS_PORT = router_door.MODELS_PORT
"""The registrar's `/v1/models` (router/registrar.py ModelsServer), on 127.0.0.1 behind the door: the
front's own answer there is not OpenAI's list and checks no key."""
PORT_NAME = "http"
METRICS_PORT_NAME = "metrics"
READINESS_PATH = "/readiness"
"""vllm-router answers 200 here once it can route (0.1.17); the registrar's models server, once it
listens."""
MODELS_PATH = "/v1/models"
LIVENESS_PATH = "/liveness"
REGISTRAR_CONFIG_DIR = "/etc/vllm-router"
REGISTRAR_CONFIG_FILE = "registrar.json"
REGISTRAR_SCRIPT = "/opt/registrar/registrar.py"
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
POD_READER_ROLE = "vllm-router-pods"
FRONT_POLICY = "round_robin"
"""The front has one worker per model in each pod (that model's router), so its policy never chooses."""
REGISTRAR_CONFIG_CHECKSUM_ANNOTATION = "vllm-platform.dev/registrar-config-sha256"
WAKE_GATE_CONTAINER = "wake-gate"
WAKE_GATE_BASE_PORT = 8200
"""To-zero model i's wake gate listens on :8200+i (router/wake_gate.py); the front routes the model there."""
WAKE_GATE_CONFIG_FILE = "wake-gate.json"
WAKE_GATE_SCRIPT = "/opt/registrar/wake_gate.py"
ROUTER_KEYS_PROVIDER_CLASS = "vllm-router-keys"
ROUTER_KEYS_VOLUME = "router-keys"
ROUTER_KEYS_MOUNT_PATH = "/mnt/router-keys"
"""The wake gate's key folder: the keys the to-zero models' pods accept, one file each."""


def router_labels() -> dict[str, str]:
    return {**router_selector_labels(), **platform_labels()}


def model_router_container_name(model: ModelConfig) -> str:
    return f"route-{model.name}"


def model_router_port(index: int) -> int:
    return MODEL_ROUTER_BASE_PORT + index


def model_router_metrics_port(index: int) -> int:
    return METRICS_PORT + 1 + index


def model_router_metrics_port_name(index: int) -> str:
    return f"metrics-{index}"


def wake_gate_port(index: int) -> int:
    return WAKE_GATE_BASE_PORT + index


def router_resources(router: RouterConfig) -> dict[str, Any]:
    return {
        "requests": {"cpu": f"{router.cpu_request_cores:g}", "memory": f"{router.memory_request_gib:g}Gi"},
        "limits": {"memory": f"{2 * router.memory_request_gib:g}Gi"},
    }


def sidecar_liveness(port: int) -> dict[str, Any]:
    """Every vllm-router and sidecar of the pod listens on 127.0.0.1 only (issue 49: the door is the
    only way in), so its liveness runs inside its container."""
    return router_door.loopback_liveness(port, LIVENESS_PATH)
