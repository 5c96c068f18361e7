"""The LLM-aware router: one OpenAI endpoint for every model, routed by model name and prefix.

    Namespace vllm-router (default-deny NetworkPolicies with explicit allows)
    ├── ServiceAccount vllm-router; in every model namespace a Role + RoleBinding to watch its pods
    │   (nothing else, nowhere else)
    ├── ConfigMap vllm-router-registrar (each model's router, registered with the front)
    ├── Deployment vllm-router (≥ 2 pods over zones), each pod:
    │     door          nginx on :8000, the pod's only served port: forwards the OpenAI routes it
    │                   lists, in canonical form, and nothing else (components/router_door.py)
    │     router        front `vllm-router --enable-igw` on 127.0.0.1:8001: routes by the request's `model`
    │     route-<model> one single-model `vllm-router` per model (its policy over its ready pods,
    │                   found by upstream's Kubernetes discovery), 127.0.0.1:8100+i
    │     registrar     registers each route-<model> with the front (router/registrar.py) and answers
    │                   /v1/models on 127.0.0.1:8090 in OpenAI's shape, asking each model with the
    │                   client's key
    │     wake-gate     (with a to-zero model) one port per such model, 127.0.0.1:8200+i, routed to by
    │                   the front
    │                   instead of route-<model>: only a request with a key the model accepts, naming
    │                   one of its served names, goes on to the router's hold (router/wake_gate.py);
    │                   the keys come from the secret store through the CSI driver (SecretProviderClass
    │                   vllm-router-keys), mounted into this container only
    ├── Service vllm-router, PodDisruptionBudget vllm-router, Ingress vllm-router (host router.host:
    │   /v1 to the door, which sends /v1/models to the registrar and the inference routes to the front)
    └── PodMonitor vllm-router (in the monitoring namespace): the router's own metrics

The router is vLLM's (PyPI/GitHub vllm-router, pinned in domain/versions.py); docs/routing.md says
why it, how a request travels, and how the canary split and the router agree. Pure builders below;
`Router` only turns them into resources.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components import probes, router_door, secrets
from components.exposure import PUBLIC_API_PATH, load_balancer_annotations, web_acl_annotation
from components.guardrails import platform_labels
from components.leader_worker_set import serving_selector_labels
from components.monitoring import PROMETHEUS_OPERATOR_API_VERSION
from components.network_policy import (
    HTTPS_PORT,
    allow_dns_policy,
    allow_peer_policy,
    load_balancer_peer,
    namespace_selector,
    prometheus_peer,
)
from components.router_layout import (
    FRONT_POLICY,
    FRONT_PORT,
    METRICS_PORT,
    METRICS_PORT_NAME,
    POD_READER_ROLE,
    PORT_NAME,
    READINESS_PATH,
    REGISTRAR_CONFIG_CHECKSUM_ANNOTATION,
    REGISTRAR_CONFIG_DIR,
    REGISTRAR_CONTAINER,
    ROUTER_CONTAINER,
    ROUTER_KEYS_PROVIDER_CLASS,
    ROUTER_NAME,
    ROUTER_PORT,
    SERVICE_ACCOUNT_MOUNT,
    WAKE_GATE_CONTAINER,
    model_router_container_name,
    model_router_metrics_port,
    model_router_metrics_port_name,
    model_router_port,
    router_labels,
    router_resources,
    sidecar_liveness,
)
from components.router_sidecars import (
    registrar_config_checksum,
    registrar_config_map_data,
    registrar_container,
    router_keys_provider_class_spec,
    router_keys_volume,
    wake_gate_container,
)
from components.scrape import ScrapeSettings
from components.server_auth import max_body_bytes
from components.vllm_pod import (
    IRSA_SKIP_CONTAINERS_ANNOTATION,
    container_security_context,
    pod_security_context,
)
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.key_files import gated_models
from domain.labels import (
    MODEL_SERIES_LABEL,
    PART_OF,
    ROUTER_NAMESPACE,
    model_selector_labels,
    router_selector_labels,
)
from domain.versions import VLLM_ROUTER_IMAGE


def model_policy(config: PlatformConfig, model: ModelConfig) -> str:
    policy = config.routing_policy(model)
    assert policy is not None, "the router is off"
    return policy


def _common_arguments(config: PlatformConfig, retries: list[str] | None = None) -> list[str]:
    router = config.router
    return [
        "--health-check-endpoint",
        probes.HEALTH_PATH,
        "--health-check-interval-secs",
        str(router.health_check_interval_seconds),
        "--health-failure-threshold",
        str(router.health_failure_threshold),
        *(retries or ["--retry-max-retries", str(router.max_retries)]),
        "--request-timeout-secs",
        str(router.request_timeout_seconds),
        # The stack's body limit, as the door's and the pods' (vllm-router's default: 512 MiB).
        "--max-payload-size",
        str(max_body_bytes(config)),
        "--log-level",
        "info",
    ]


def router_arguments(config: PlatformConfig) -> list[str]:
    """The front `vllm-router`: multi-model mode, one worker per model (that model's router), on
    loopback behind the door, with the stack's body limit (vllm-router's default is 512 MiB, in a
    container limited to 1 GiB: issue 49)."""
    return [
        "--enable-igw",
        "--host",
        "127.0.0.1",
        "--port",
        str(FRONT_PORT),
        "--policy",
        FRONT_POLICY,
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(METRICS_PORT),
        *_common_arguments(config),
    ]


def model_router_arguments(config: PlatformConfig, model: ModelConfig, index: int) -> list[str]:
    """One model's `vllm-router`: single-model mode with the model's policy over its ready pods,
    found by upstream's Kubernetes discovery (pods with the model's labels in its namespace)."""
    # A multi-node model's leaders only: its workers run --headless and serve no API (issue 42).
    selector = [f"{key}={value}" for key, value in serving_selector_labels(model).items()]
    return [
        "--service-discovery",
        "--selector",
        *selector,
        "--service-discovery-namespace",
        model.namespace,
        "--service-discovery-port",
        str(model.vllm.port),
        "--host",
        "127.0.0.1",
        "--port",
        str(model_router_port(index)),
        "--policy",
        model_policy(config, model),
        "--prometheus-host",
        "0.0.0.0",
        "--prometheus-port",
        str(model_router_metrics_port(index)),
        *_common_arguments(config, hold_arguments(config, model) if model.scales_to_zero else None),
    ]


def hold_arguments(config: PlatformConfig, model: ModelConfig) -> list[str]:
    """A to-zero model's router holds a request while the model wakes: vllm-router 0.1.17 retries its
    own `No available workers` 503 with its backoff, so enough attempts on a short, jitter-free
    backoff hold the request for the model's wake hold, and the retry after the pod is Ready reaches it
    within the longest backoff (domain/capacity/wake.py). Each held attempt counts
    `vllm_router_request_errors_total{error_type="no_available_workers"}`: the signal that wakes the
    model (components/autoscaling.py `router_demand_query`). Only requests the model's wake gate let
    through get here (router/wake_gate.py: a key the model accepts, a served name of it)."""
    from domain.capacity.plan import plan_model
    from domain.capacity.wake import (
        HOLD_BACKOFF_MULTIPLIER,
        HOLD_INITIAL_BACKOFF_MS,
        HOLD_MAX_BACKOFF_MS,
        hold_attempts,
    )

    hold = plan_model(model, config, model.gpu_group).wake.hold_seconds
    return [
        "--retry-max-retries",
        str(hold_attempts(hold)),
        "--retry-initial-backoff-ms",
        str(HOLD_INITIAL_BACKOFF_MS),
        "--retry-max-backoff-ms",
        str(HOLD_MAX_BACKOFF_MS),
        "--retry-backoff-multiplier",
        str(HOLD_BACKOFF_MULTIPLIER),
        "--retry-jitter-factor",
        "0",
    ]


def router_problems(config: PlatformConfig) -> list[Problem]:
    """The router needs a hostname behind the ingress and one served name per model."""
    router = config.router
    if not router.enabled:
        return []
    problems: list[Problem] = []
    if config.ingress.enabled and router.host is None:
        problems.append(
            Problem(
                ("router", "host"),
                None,
                "the router's unified endpoint needs a hostname: set router.host or "
                "ingress.domain (it becomes api.<domain>), or set ingress.enabled: false",
            )
        )
    seen: dict[str, int] = {}
    for index, model in enumerate(config.models):
        name = model.openai_model_name
        if name in seen:
            problems.append(
                Problem(
                    ("models", index, "served_model_name"),
                    name,
                    f"models[{seen[name]}] serves the same name; the router sends a request "
                    "to the model its `model` names, so served names must be unique",
                )
            )
        seen.setdefault(name, index)
        if router.host is not None and model.ingress_host == router.host and config.ingress.enabled:
            problems.append(
                Problem(
                    ("models", index, "ingress_host"),
                    model.ingress_host,
                    "is the router's hostname (router.host); give the model another host",
                )
            )
    return problems


def router_container(config: PlatformConfig) -> dict[str, Any]:
    """The front, behind the door: routes by model name to that model's router. Its readiness is the
    door's (`/readiness`, forwarded here), so the pod is ready when both are."""
    return {
        "name": ROUTER_CONTAINER,
        "image": VLLM_ROUTER_IMAGE.reference,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm-router"],
        "args": router_arguments(config),
        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}],
        "livenessProbe": sidecar_liveness(FRONT_PORT),
        # The load balancer deregisters the pod (readiness, then the deregistration delay) before the
        # router stops accepting connections; SIGTERM then lets in-flight streams finish.
        "lifecycle": {"preStop": {"sleep": {"seconds": config.router.drain_seconds}}},
        "resources": router_resources(config.router),
        "securityContext": container_security_context(read_only_root_filesystem=True),
    }


def model_router_container(config: PlatformConfig, model: ModelConfig, index: int) -> dict[str, Any]:
    """One model's router. Liveness only: a model with no ready pod must not take the pod (and with
    it every other model) out of the load balancer; the front ejects that model's router instead."""
    args = model_router_arguments(config, model, index)
    return {
        "name": model_router_container_name(model),
        "image": VLLM_ROUTER_IMAGE.reference,
        "imagePullPolicy": "IfNotPresent",
        "command": ["vllm-router"],
        "args": args,
        "ports": [
            {
                "name": model_router_metrics_port_name(index),
                "containerPort": model_router_metrics_port(index),
                "protocol": "TCP",
            }
        ],
        "livenessProbe": sidecar_liveness(model_router_port(index)),
        # Stays up while the front drains, so streams in flight keep their backend.
        "lifecycle": {"preStop": {"sleep": {"seconds": config.router.drain_seconds}}},
        "resources": router_resources(config.router),
        "securityContext": container_security_context(read_only_root_filesystem=True),
        # Upstream's discovery reads the model's pods with this token (Role vllm-router-pods).
        "volumeMounts": [{"name": "api-token", "mountPath": SERVICE_ACCOUNT_MOUNT, "readOnly": True}],
    }


def _spread(topology_key: str, when_unsatisfiable: str) -> dict[str, Any]:
    return {
        "maxSkew": 1,
        "topologyKey": topology_key,
        "whenUnsatisfiable": when_unsatisfiable,
        "labelSelector": {"matchLabels": router_selector_labels()},
        "matchLabelKeys": ["pod-template-hash"],
        # Count only the zones of nodes the router may run on. By default (Ignore) a zone that holds
        # only GPU nodes, whose taint the router does not tolerate, is a domain with zero router pods
        # forever, so under DoNotSchedule no other zone may get a second pod: with one GPU node alone
        # in a third zone, a third router replica stayed Pending (issue 40).
        "nodeTaintsPolicy": "Honor",
    }


def deployment_spec(config: PlatformConfig) -> dict[str, Any]:
    router = config.router
    gated = bool(gated_models(config))
    return {
        "replicas": router.replicas,
        "selector": {"matchLabels": router_selector_labels()},
        # A new pod must be ready (its registrar has registered the workers) before an old one goes.
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "revisionHistoryLimit": 5,
        "template": {
            "metadata": {
                "labels": router_labels(),
                "annotations": {
                    "kubectl.kubernetes.io/default-container": ROUTER_CONTAINER,
                    # The sidecars read their config once, at start: a changed config rolls the pods.
                    REGISTRAR_CONFIG_CHECKSUM_ANNOTATION: registrar_config_checksum(config),
                    # The service account's IAM role (to-zero models' keys) is the CSI driver's, which
                    # requests its own token: no container gets AWS credentials (EKS pod identity webhook).
                    **({IRSA_SKIP_CONTAINERS_ANNOTATION: ",".join(container_names(config))} if gated else {}),
                },
            },
            "spec": {
                "serviceAccountName": ROUTER_NAME,
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": router.drain_seconds + router.request_timeout_seconds,
                # Router pods run on the system nodes (no GPU taint tolerated); one per zone first.
                "topologySpreadConstraints": [
                    _spread("topology.kubernetes.io/zone", "DoNotSchedule"),
                    _spread("kubernetes.io/hostname", "ScheduleAnyway"),
                ],
                "securityContext": pod_security_context(),
                "containers": [
                    router_door.door_container(config.router, REGISTRAR_CONFIG_DIR, "registrar-config"),
                    router_container(config),
                    *(model_router_container(config, model, i) for i, model in enumerate(config.models)),
                    registrar_container(config.router),
                    *([wake_gate_container(config)] if gated else []),
                ],
                "volumes": [
                    {"name": "registrar-config", "configMap": {"name": f"{ROUTER_NAME}-registrar"}},
                    router_door.door_tmp_volume(config.security),
                    *([router_keys_volume(config)] if gated else []),
                    {
                        "name": "api-token",
                        "projected": {
                            "sources": [
                                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                                {
                                    "configMap": {
                                        "name": "kube-root-ca.crt",
                                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                    }
                                },
                            ]
                        },
                    },
                ],
            },
        },
    }


def container_names(config: PlatformConfig) -> list[str]:
    return [
        router_door.DOOR_CONTAINER,
        ROUTER_CONTAINER,
        *(model_router_container_name(model) for model in config.models),
        REGISTRAR_CONTAINER,
        *([WAKE_GATE_CONTAINER] if gated_models(config) else []),
    ]


def service_spec() -> dict[str, Any]:
    return {
        "type": "ClusterIP",
        "selector": router_selector_labels(),
        "ports": [{"name": PORT_NAME, "port": ROUTER_PORT, "targetPort": PORT_NAME, "protocol": "TCP"}],
    }


def pod_disruption_budget_spec() -> dict[str, Any]:
    return {
        "maxUnavailable": 1,
        "selector": {"matchLabels": router_selector_labels()},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def ingress_spec(config: PlatformConfig) -> dict[str, Any]:
    assert config.router.host is not None  # checked at validate time (router_problems)
    door = {"service": {"name": ROUTER_NAME, "port": {"name": PORT_NAME}}}
    return {
        "ingressClassName": config.ingress.class_name,
        "tls": [{"hosts": [config.router.host]}],
        # Only the OpenAI API, to the door, which forwards the routes it lists and nothing else: the
        # routers' worker APIs stay inside the pod whatever path the load balancer passes (issue 49).
        "rules": [
            {
                "host": config.router.host,
                "http": {"paths": [{"path": PUBLIC_API_PATH, "pathType": "Prefix", "backend": door}]},
            }
        ],
    }


def network_policies(
    config: PlatformConfig, load_balancer_cidrs: Sequence[str] = ()
) -> list[tuple[str, dict[str, Any]]]:
    """Load balancer → router (the front, and the registrar's /v1/models) → each model's vLLM pods;
    Prometheus → metrics; the API for discovery.

    The load balancer is admitted as it is to the vLLM pods (components/network_policy.py): an ALB
    (target type `ip`) from the addresses of its own subnets (`load_balancer_cidrs`, the cluster
    context's), never the whole VPC, so nodes and pods with VPC addresses cannot reach the router's
    unauthenticated worker API; another ingress controller from its namespace.
    """
    if not config.security.network_policies:
        return []
    pods = {"matchLabels": router_selector_labels()}
    policies: list[tuple[str, dict[str, Any]]] = [
        ("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ]
    peer = load_balancer_peer(config, load_balancer_cidrs)
    # No peer (ingress off) or no subnets: no policy at all, since an empty `from` would admit everyone.
    if peer is not None and peer.sources:
        # The door only: every router and sidecar behind it listens on 127.0.0.1 (issue 49).
        policies.append(allow_peer_policy(peer, pods, [{"protocol": "TCP", "port": ROUTER_PORT}]))
    scrapers = prometheus_peer(config)
    if scrapers is not None:
        # The Prometheus pods the vLLM pods admit (security.prometheus_pod_labels), to the front's and
        # every model router's metrics port.
        metrics_ports = (METRICS_PORT, *(model_router_metrics_port(i) for i in range(len(config.models))))
        ports = [{"protocol": "TCP", "port": port} for port in metrics_ports]
        policies.append(allow_peer_policy(scrapers, pods, ports))
    policies += [
        allow_dns_policy(),
        (
            "allow-models",
            {
                "podSelector": pods,
                "policyTypes": ["Egress"],
                "egress": [
                    {
                        "to": [
                            {
                                **namespace_selector(model.namespace),
                                "podSelector": {"matchLabels": model_selector_labels(model.name)},
                            }
                        ],
                        "ports": [{"protocol": "TCP", "port": model.vllm.port}],
                    }
                    for model in config.models
                ],
            },
        ),
        # The model routers watch their model's pods: the EKS API endpoint's ENIs are in the VPC.
        (
            "allow-kubernetes-api",
            {
                "podSelector": pods,
                "policyTypes": ["Egress"],
                "egress": [
                    {
                        "to": [{"ipBlock": {"cidr": config.cluster.vpc_cidr}}],
                        "ports": [{"protocol": "TCP", "port": HTTPS_PORT}],
                    }
                ],
            },
        ),
    ]
    return policies


def pod_monitor_spec(config: PlatformConfig, scrape: ScrapeSettings) -> dict[str, Any]:
    """The front's metrics (requests, retries, per-model-router health) and each model router's
    (per vLLM pod: running requests, health, circuit breaker, cache-aware decisions)."""
    front = {"port": METRICS_PORT_NAME, "path": "/metrics", "interval": f"{scrape.interval_seconds}s"}
    return {
        "namespaceSelector": {"matchNames": [ROUTER_NAMESPACE]},
        "selector": {"matchLabels": router_selector_labels()},
        "podMetricsEndpoints": [
            front,
            *(
                {
                    **front,
                    "port": model_router_metrics_port_name(index),
                    # Every series of a model's router names its model (the label vLLM's series carry
                    # too): the router autoscaling signal selects the model by it
                    # (components/adapter_rules.py).
                    "relabelings": [
                        {"targetLabel": MODEL_SERIES_LABEL, "replacement": model.name, "action": "replace"}
                    ],
                }
                for index, model in enumerate(config.models)
            ),
        ],
    }


def pod_reader_rules() -> list[dict[str, Any]]:
    """What vllm-router's Kubernetes discovery needs: watch the pods of the model's namespace."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def in_cluster_url() -> str:
    return f"http://{ROUTER_NAME}.{ROUTER_NAMESPACE}.svc.cluster.local:{ROUTER_PORT}"


def ingress_url(config: PlatformConfig) -> str | None:
    if not config.ingress.enabled or config.router.host is None:
        return None
    return f"https://{config.router.host}"


@dataclass(frozen=True)
class RouterArgs:
    config: PlatformConfig
    scrape: ScrapeSettings
    """How the router's metrics are scraped (components/scrape.py)."""
    model_namespaces: Sequence[pulumi.Resource] = ()
    """The model namespaces' resources: the pod-reader Roles live in them."""
    load_balancer_cidrs: Sequence[str] = ()
    """The load balancer's subnets (ClusterContext.load_balancer_source_cidrs): the only addresses
    admitted to the router's port with an ALB."""
    web_acl_arn: pulumi.Input[str] | None = None
    """The tenants' WAF web ACL (ClusterContext.web_acl_arn), named by the router's Ingress too."""
    service_account_role_arn: pulumi.Input[str] | None = None
    """The IAM role of the router's service account (IRSA, ClusterContext.role_arn_for): with a to-zero
    model and Secrets Manager, it may read the keys the wake gate checks, nothing else."""
    depends_on: Sequence[pulumi.Resource] = ()
    """Add-ons first: the load balancer controller's webhooks, the monitoring CRDs."""


class Router(pulumi.ComponentResource):
    """vLLM's router in namespace `vllm-router`, in front of every model."""

    in_cluster_url: str
    ingress_url: str | None

    def __init__(self, name: str, args: RouterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:routing:Router", name, None, opts)
        config = args.config
        labels = router_labels()

        def meta(object_name: str, namespace: str = ROUTER_NAMESPACE) -> dict[str, Any]:
            return {"name": object_name, "namespace": namespace, "labels": labels}

        namespace = kubernetes.core.v1.Namespace(
            f"{name}-namespace",
            metadata={
                "name": ROUTER_NAMESPACE,
                "labels": {**platform_labels(), "app.kubernetes.io/part-of": PART_OF},
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        inside = pulumi.ResourceOptions(parent=self, depends_on=[namespace])
        after_addons = pulumi.ResourceOptions(parent=self, depends_on=[namespace, *args.depends_on])

        for policy_name, policy_spec in network_policies(config, args.load_balancer_cidrs):
            kubernetes.networking.v1.NetworkPolicy(
                f"{name}-netpol-{policy_name}", metadata=meta(policy_name), spec=policy_spec, opts=inside
            )
        account_meta = meta(ROUTER_NAME)
        if args.service_account_role_arn is not None:
            account_meta["annotations"] = {"eks.amazonaws.com/role-arn": args.service_account_role_arn}
        account = kubernetes.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=account_meta,
            automount_service_account_token=False,
            opts=inside,
        )
        pod_needs: list[pulumi.Resource] = []
        if (keys_spec := router_keys_provider_class_spec(config)) is not None:
            pod_needs.append(
                kubernetes.apiextensions.CustomResource(
                    f"{name}-keys-provider",
                    api_version=secrets.SPC_API_VERSION,
                    kind="SecretProviderClass",
                    metadata=meta(ROUTER_KEYS_PROVIDER_CLASS),
                    spec=keys_spec,
                    opts=after_addons,
                )
            )
        in_models = pulumi.ResourceOptions(parent=self, depends_on=[account, *args.model_namespaces])
        for model in config.models:
            kubernetes.rbac.v1.Role(
                f"{name}-{model.name}-pod-reader",
                metadata=meta(POD_READER_ROLE, model.namespace),
                rules=pod_reader_rules(),
                opts=in_models,
            )
            kubernetes.rbac.v1.RoleBinding(
                f"{name}-{model.name}-pod-reader-binding",
                metadata=meta(POD_READER_ROLE, model.namespace),
                role_ref={
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": POD_READER_ROLE,
                },
                subjects=[{"kind": "ServiceAccount", "name": ROUTER_NAME, "namespace": ROUTER_NAMESPACE}],
                opts=in_models,
            )
        registrar = kubernetes.core.v1.ConfigMap(
            f"{name}-registrar-config",
            metadata=meta(f"{ROUTER_NAME}-registrar"),
            data=registrar_config_map_data(config),
            opts=inside,
        )
        kubernetes.apps.v1.Deployment(
            f"{name}-deployment",
            metadata=meta(ROUTER_NAME),
            spec=deployment_spec(config),
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[namespace, account, registrar, *pod_needs, *args.depends_on]
            ),
        )
        kubernetes.core.v1.Service(
            f"{name}-service", metadata=meta(ROUTER_NAME), spec=service_spec(), opts=inside
        )
        kubernetes.policy.v1.PodDisruptionBudget(
            f"{name}-pdb", metadata=meta(ROUTER_NAME), spec=pod_disruption_budget_spec(), opts=inside
        )
        if config.ingress.enabled:
            kubernetes.networking.v1.Ingress(
                f"{name}-ingress",
                metadata={
                    **meta(ROUTER_NAME),
                    "annotations": {
                        **load_balancer_annotations(
                            config,
                            READINESS_PATH,
                            config.router.drain_seconds + config.router.request_timeout_seconds,
                        ),
                        **web_acl_annotation(config.ingress, args.web_acl_arn),
                    },
                },
                spec=ingress_spec(config),
                opts=after_addons,
            )
        if args.scrape.monitor_objects:
            kubernetes.apiextensions.CustomResource(
                f"{name}-pod-monitor",
                api_version=PROMETHEUS_OPERATOR_API_VERSION,
                kind="PodMonitor",
                metadata={
                    "name": ROUTER_NAME,
                    "namespace": config.monitoring.namespace,
                    "labels": args.scrape.labels,
                },
                spec=pod_monitor_spec(config, args.scrape),
                opts=after_addons,
            )
        self.in_cluster_url = in_cluster_url()
        self.ingress_url = ingress_url(config)
        self.register_outputs({"in_cluster_url": self.in_cluster_url, "ingress_url": self.ingress_url})
