"""How a model is reached: its Services (and a canary's stable and canary Services), its Ingress and
the load balancer's annotations and ALB weights, and the URLs the stack reports."""

from __future__ import annotations

import json
from typing import Any

import pulumi

from components import leader_worker_set, load_balancer, probes, rollouts
from components.vllm_pod import SERVER_NAME
from domain.config.models import ModelConfig
from domain.config.platform import IngressConfig, PlatformConfig
from domain.rollout_pods import uses_group_canary

ALB_SSL_POLICY = load_balancer.ALB_SSL_POLICY


def uses_alb_traffic_split(config: PlatformConfig, model: ModelConfig) -> bool:
    """A canary's weights are applied at the ALB when the model has its own ALB Ingress (without one,
    behind the router only, the split is by pod count: docs/rollouts.md)."""
    alb = config.ingress.class_name == "alb"
    return rollouts.uses_canary(model) and serves_own_hostname(config, model) and alb


def track_service_spec(model: ModelConfig, track: str) -> dict[str, Any]:
    """`vllm-stable` or `vllm-canary`: a Rollout's (Argo pins the selector) or, for a multi-node canary,
    the leaders of one LeaderWorkerSet (the ALB's two weighted target groups)."""
    spec = service_spec(model)
    if uses_group_canary(model):
        set_name = (
            leader_worker_set.CANARY_SET if track == rollouts.CANARY_SERVICE else leader_worker_set.STABLE_SET
        )
        spec["selector"] = leader_worker_set.track_selector_labels(model, set_name)
    return spec


def service_spec(model: ModelConfig) -> dict[str, Any]:
    return {
        "type": "ClusterIP",
        # A multi-node model's endpoints are its group leaders only (its workers run --headless).
        "selector": leader_worker_set.serving_selector_labels(model),
        "ports": [
            {
                "name": probes.PORT_NAME,
                "port": model.vllm.port,
                "targetPort": probes.PORT_NAME,
                "protocol": "TCP",
            }
        ],
    }


def ingress_group_name(config: PlatformConfig) -> str:
    return load_balancer.ingress_group_name(config.cluster.name)


def ingress_annotations(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    annotations = load_balancer_annotations(
        config, probes.HEALTH_PATH, probes.load_balancer_deregistration_delay_seconds(model.drain)
    )
    if uses_group_canary(model) and uses_alb_traffic_split(config, model):
        # The stack sets a multi-node canary's weights: the candidate's, or all to the stable groups.
        weight = rollouts.group_canary_weight(model)
        annotations[rollouts.ALB_ACTION_ANNOTATION] = rollouts.alb_action(model, canary_weight=weight)
    elif uses_alb_traffic_split(config, model):
        # Argo Rollouts rewrites this action with the canary's weights; until it first does, all
        # traffic goes to the stable pods.
        annotations[rollouts.ALB_ACTION_ANNOTATION] = rollouts.initial_alb_action(model)
    return annotations


def load_balancer_annotations(
    config: PlatformConfig, healthcheck_path: str, deregistration_delay_seconds: int
) -> dict[str, str]:
    """The ingress controller's settings for a long-streaming OpenAI backend (models and the router)."""
    ingress = config.ingress
    idle = ingress.idle_timeout_seconds
    if ingress.class_name == "nginx":
        # Same long-stream guarantee on ingress-nginx: no proxy read timeout mid-stream, no buffering.
        return {
            "nginx.ingress.kubernetes.io/proxy-read-timeout": str(idle),
            "nginx.ingress.kubernetes.io/proxy-send-timeout": str(idle),
            "nginx.ingress.kubernetes.io/proxy-buffering": "off",
        }
    if ingress.class_name != "alb":
        return {}
    prefix = "alb.ingress.kubernetes.io"
    annotations = {
        f"{prefix}/scheme": ingress.scheme,
        f"{prefix}/target-type": "ip",
        f"{prefix}/group.name": ingress_group_name(config),
        f"{prefix}/listen-ports": json.dumps([{"HTTPS": 443}]),
        f"{prefix}/ssl-policy": ALB_SSL_POLICY,
        f"{prefix}/backend-protocol": "HTTP",
        f"{prefix}/healthcheck-path": healthcheck_path,
        f"{prefix}/success-codes": "200",
        # SSE streams may sit idle while a request waits in vLLM's queue: never cut them sooner.
        f"{prefix}/load-balancer-attributes": f"idle_timeout.timeout_seconds={idle}",
        f"{prefix}/target-group-attributes": (
            f"deregistration_delay.timeout_seconds={deregistration_delay_seconds}"
        ),
    }
    if ingress.certificate_arn:
        annotations[f"{prefix}/certificate-arn"] = ingress.certificate_arn
    if ingress.inbound_cidrs:
        annotations[f"{prefix}/inbound-cidrs"] = ",".join(ingress.inbound_cidrs)
    if ingress.wafv2_acl_arn:
        annotations[f"{prefix}/wafv2-acl-arn"] = ingress.wafv2_acl_arn
    return annotations


def web_acl_annotation(ingress: IngressConfig, web_acl_arn: pulumi.Input[str] | None) -> dict[str, Any]:
    """The tenants' web ACL (infra/aws/tenant_limits.py) on the ALB: every Ingress of the group
    names the same one (validate refuses it beside ingress.wafv2_acl_arn)."""
    if web_acl_arn is None or ingress.class_name != "alb":
        return {}
    return {"alb.ingress.kubernetes.io/wafv2-acl-arn": web_acl_arn}


PUBLIC_API_PATH = "/v1"


def ingress_spec(config: PlatformConfig, model: ModelConfig) -> dict[str, Any]:
    assert model.ingress_host is not None  # checked at validate time (ingress_host_problems)
    # With a canary, the ALB forwards through the weighted action Argo keeps on the root Service.
    split = uses_alb_traffic_split(config, model)
    port = {"name": rollouts.ALB_USE_ANNOTATION_PORT if split else probes.PORT_NAME}
    backend = {"service": {"name": SERVER_NAME, "port": port}}
    return {
        "ingressClassName": config.ingress.class_name,
        # Hosts only: the ALB terminates TLS with the ACM certificate (named, or found by host).
        "tls": [{"hosts": [model.ingress_host]}],
        # Only the OpenAI API: vLLM's API key guards /v1 but not /metrics, /tokenize or its admin
        # routes (verified on 0.32.0), so those must never be reachable from outside the cluster.
        "rules": [
            {
                "host": model.ingress_host,
                "http": {"paths": [{"path": PUBLIC_API_PATH, "pathType": "Prefix", "backend": backend}]},
            }
        ],
    }


def in_cluster_url(model: ModelConfig) -> str:
    return f"http://{SERVER_NAME}.{model.namespace}.svc.cluster.local:{model.vllm.port}"


def serves_own_hostname(config: PlatformConfig, model: ModelConfig) -> bool:
    """A model gets its own Ingress unless the router's unified endpoint replaces them
    (router.per_model_hostnames: false), or it scales to zero: the load balancer would answer a
    request for it 503 at once while it has no pod; only the router holds requests while it wakes."""
    own = config.ingress.enabled and (not config.router.enabled or config.router.per_model_hostnames)
    return own and not model.scales_to_zero


def ingress_url(config: PlatformConfig, model: ModelConfig) -> str | None:
    if not serves_own_hostname(config, model) or model.ingress_host is None:
        return None
    return f"https://{model.ingress_host}"
