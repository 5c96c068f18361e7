"""Label conventions shared by the workloads, their selectors and the monitoring that finds them."""

from __future__ import annotations

PART_OF = "vllm-platform"
GPU_GROUP_LABEL = "vllm-platform/gpu-group"
GPU_MODEL_LABEL = "vllm-platform/gpu-model"
MODEL_LABEL = "vllm-platform/model"
MODEL_SERIES_LABEL = "model"
"""The Prometheus label naming a model on its series: the vLLM PodMonitor's (from MODEL_LABEL) and the
router PodMonitor's, on each model router's endpoint (components/monitoring.py, components/router.py)."""
VLLM_APP_NAME = "vllm"


def model_selector_labels(model_name: str) -> dict[str, str]:
    """Labels that select one model's vLLM pods (Deployment selector, Service, PDB, PodMonitor)."""
    return {"app.kubernetes.io/name": VLLM_APP_NAME, "app.kubernetes.io/instance": model_name}


def model_labels(model_name: str) -> dict[str, str]:
    return {
        **model_selector_labels(model_name),
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": "pulumi",
        MODEL_LABEL: model_name,
    }


ROUTER_NAMESPACE = "vllm-router"
"""Namespace of the LLM-aware router (components/router.py) that every model's vLLM pods admit."""
ROUTER_APP_NAME = "vllm-router"


def router_selector_labels() -> dict[str, str]:
    """Labels that select the router's pods (Deployment, Service, PDB, PodMonitor, model NetworkPolicies)."""
    return {"app.kubernetes.io/name": ROUTER_APP_NAME, "app.kubernetes.io/instance": "router"}
