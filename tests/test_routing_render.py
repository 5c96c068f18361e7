"""The router as the prod stack renders it (components/router.py): every part of issue 18's item 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from domain.labels import ROUTER_NAMESPACE, model_selector_labels, router_selector_labels
from domain.versions import VLLM_ROUTER_IMAGE, VLLM_ROUTER_VERSION
from infra.render import RenderResult
from tests.conftest import rendered
from tests.test_serving_render import config_of, container, render_variant
from tests.test_serving_render import pod_spec as model_pod_spec


@pytest.fixture(scope="module")
def prod() -> RenderResult:
    return rendered("prod")


def only(result: RenderResult, kind: str, namespace: str = ROUTER_NAMESPACE) -> dict[str, Any]:
    (found,) = result.find(kind, namespace=namespace)
    return found


def pod_spec(result: RenderResult) -> dict[str, Any]:
    return only(result, "Deployment")["spec"]["template"]["spec"]


def test_router_runs_at_least_two_pinned_pods_spread_over_zones(prod: RenderResult) -> None:
    deployment = only(prod, "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    spec = pod_spec(prod)
    assert {c["image"] for c in spec["containers"]} == {VLLM_ROUTER_IMAGE.reference}
    assert VLLM_ROUTER_IMAGE.tag.startswith(f"{VLLM_ROUTER_VERSION}-")
    zone = [c for c in spec["topologySpreadConstraints"] if c["topologyKey"] == "topology.kubernetes.io/zone"]
    assert zone == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": router_selector_labels()},
            "matchLabelKeys": ["pod-template-hash"],
            # A zone of GPU nodes only (whose taint the router does not tolerate) is no domain of the
            # spread; counted, it would leave a replica Pending (issue 40, tests/test_deploy_capacity.py).
            "nodeTaintsPolicy": "Honor",
        }
    ]
    # No GPU node: the router tolerates no taint and asks for no GPU.
    assert "tolerations" not in spec
    assert all("nvidia.com/gpu" not in c["resources"].get("limits", {}) for c in spec["containers"])


def test_router_pdb_lets_one_pod_go_at_a_time(prod: RenderResult) -> None:
    assert only(prod, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": router_selector_labels()},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def test_front_routes_by_model_name_and_each_model_has_its_own_router(prod: RenderResult) -> None:
    config = config_of(prod)
    containers = {c["name"]: c for c in pod_spec(prod)["containers"]}
    front = containers["router"]
    assert front["args"][0] == "--enable-igw"
    # Behind the door (components/router_door.py): on loopback, its metrics the only port it declares.
    assert front["args"][front["args"].index("--host") + 1 :][:3] == ["127.0.0.1", "--port", "8001"]
    assert {p["name"]: p["containerPort"] for p in front["ports"]} == {"metrics": 29000}
    for index, model in enumerate(config.models):
        args = containers[f"route-{model.name}"]["args"]
        # Upstream's Kubernetes discovery over exactly this model's pods, with the model's policy.
        assert args[: args.index("--service-discovery-namespace")] == [
            "--service-discovery",
            "--selector",
            *(f"{k}={v}" for k, v in model_selector_labels(model.name).items()),
        ]
        assert args[args.index("--service-discovery-namespace") + 1] == model.namespace
        assert args[args.index("--service-discovery-port") + 1] == str(model.vllm.port)
        assert args[args.index("--port") + 1] == str(8100 + index)
        assert args[args.index("--host") + 1] == "127.0.0.1"  # reached by the front and registrar only
        assert args[args.index("--policy") + 1] == (model.router_policy or config.router.default_policy)
    # The registrar registers each model's router with the front, under the model's served names
    # (its own, then its LoRA adapters': none in prod).
    registrar = json.loads(only(prod, "ConfigMap")["data"]["registrar.json"])
    assert registrar["router_url"] == "http://127.0.0.1:8001"
    assert registrar["workers"] == [
        {
            "url": f"http://127.0.0.1:{8100 + i}",
            "model_id": m.openai_model_name,
            "policy": "round_robin",
            "served_names": [m.openai_model_name],
            "scale_to_zero": m.scales_to_zero,
            # A to-zero model is routed through its wake gate (router/wake_gate.py, issue 40).
            **({"front_url": f"http://127.0.0.1:{8200 + i}"} if m.scales_to_zero else {}),
        }
        for i, m in enumerate(config.models)
    ]


def test_only_the_model_routers_get_an_api_token(prod: RenderResult) -> None:
    spec = pod_spec(prod)
    assert spec["automountServiceAccountToken"] is False
    with_token = {
        c["name"]
        for c in spec["containers"]
        if any(m["name"] == "api-token" for m in c.get("volumeMounts", []))
    }
    assert with_token == {f"route-{m.name}" for m in config_of(prod).models}


def test_router_rbac_watches_pods_in_model_namespaces_only(prod: RenderResult) -> None:
    config = config_of(prod)
    account = {"kind": "ServiceAccount", "name": "vllm-router", "namespace": ROUTER_NAMESPACE}
    bindings = [
        b
        for kind in ("RoleBinding", "ClusterRoleBinding")
        for b in prod.find(kind)
        if account in b.get("subjects", [])
    ]
    # Only namespaced bindings, one per model namespace, each to the pod-reader Role there.
    assert sorted((b["kind"], b["metadata"]["namespace"]) for b in bindings) == sorted(
        ("RoleBinding", m.namespace) for m in config.models
    )
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "vllm-router-pods",
        }
        (role,) = [
            r
            for r in prod.find("Role", namespace=binding["metadata"]["namespace"])
            if r["metadata"]["name"] == "vllm-router-pods"
        ]
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
        ]


def test_unified_endpoint_is_a_tls_ingress_for_the_openai_api_only(prod: RenderResult) -> None:
    ingress = only(prod, "Ingress")
    host = "api.llm.example.com"
    assert ingress["spec"]["tls"] == [{"hosts": [host]}]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == host
    # /v1 to the door, which forwards /v1/models to the registrar and the inference routes to the
    # front (components/router_door.py); nothing else.
    assert [
        (p["path"], p["pathType"], p["backend"]["service"]["name"], p["backend"]["service"]["port"]["name"])
        for p in rule["http"]["paths"]
    ] == [("/v1", "Prefix", "vllm-router", "http")]
    annotations = ingress["metadata"]["annotations"]
    assert annotations["alb.ingress.kubernetes.io/listen-ports"] == '[{"HTTPS": 443}]'
    assert (
        annotations["alb.ingress.kubernetes.io/load-balancer-attributes"]
        == "idle_timeout.timeout_seconds=3600"
    )
    # One load balancer with the models' hostnames, which stay (router.per_model_hostnames), except
    # for a model that scales to zero (only the router holds its requests).
    groups = {
        i["metadata"]["annotations"]["alb.ingress.kubernetes.io/group.name"] for i in prod.find("Ingress")
    }
    own = [m for m in config_of(prod).models if not m.scales_to_zero]
    assert len(groups) == 1 and len(prod.find("Ingress")) == len(own) + 1


def test_the_door_is_the_pods_only_served_port(prod: RenderResult) -> None:
    """The load balancer reaches the door (nginx, components/router_door.py) on the Service's one
    port; the registrar's models server listens on 127.0.0.1 where the ConfigMap says, behind it,
    and every container but the door is probed from inside itself."""
    containers = {c["name"]: c for c in pod_spec(prod)["containers"]}
    door, registrar = containers["door"], containers["registrar"]
    assert door["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert door["command"][0] == "nginx" and "door.conf" in door["command"][door["command"].index("-c") + 1]
    assert "ports" not in registrar
    assert json.loads(only(prod, "ConfigMap")["data"]["registrar.json"])["models_port"] == 8090
    assert "127.0.0.1:8090/readiness" in registrar["readinessProbe"]["exec"]["command"][-1]
    # The door's readiness is the front's (it forwards /readiness there): the pod is ready when both are.
    assert door["readinessProbe"]["httpGet"] == {"port": "http", "path": "/readiness"}
    # A model router still has no readiness probe: a model without ready pods keeps the pod (and
    # every other model) in the load balancer.
    probed = {name for name, c in containers.items() if "readinessProbe" in c}
    assert probed == {"door", "registrar"}
    # Nothing but the door is probed over the pod's network: the rest listen on loopback.
    for name, spec in containers.items():
        for probe in ("livenessProbe", "readinessProbe"):
            if name != "door" and probe in spec:
                assert "exec" in spec[probe], (name, probe)
    assert only(prod, "Service")["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]


def test_network_path_is_load_balancer_to_router_to_each_models_pods(prod: RenderResult) -> None:
    config = config_of(prod)
    policies = {
        p["metadata"]["name"]: p["spec"] for p in prod.find("NetworkPolicy", namespace=ROUTER_NAMESPACE)
    }
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    (entry,) = policies["allow-load-balancer"]["ingress"]
    # The door only (the front and the registrar's models list are behind it), from the same sources.
    assert entry["ports"] == [{"protocol": "TCP", "port": 8000}]
    # The ALB's own subnets, exactly as the vLLM pods admit it; never the whole VPC (nodes and every
    # pod have VPC addresses, and the router's worker API has no authentication).
    model = config.models[0]
    (model_admit,) = [
        p["spec"]
        for p in prod.find("NetworkPolicy", namespace=model.namespace)
        if p["metadata"]["name"] == "allow-load-balancer"
    ]
    (model_entry,) = model_admit["ingress"]
    assert entry["from"] == model_entry["from"] and entry["from"]
    assert all(set(source) == {"ipBlock"} for source in entry["from"])
    assert {"ipBlock": {"cidr": config.cluster.vpc_cidr}} not in entry["from"]
    assert policies["allow-models"]["egress"] == [
        {
            "to": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": m.namespace}},
                    "podSelector": {"matchLabels": model_selector_labels(m.name)},
                }
            ],
            "ports": [{"protocol": "TCP", "port": m.vllm.port}],
        }
        for m in config.models
    ]
    # And each model namespace admits exactly the router's pods on vLLM's port.
    for model in config.models:
        (admit,) = [
            p["spec"]
            for p in prod.find("NetworkPolicy", namespace=model.namespace)
            if p["metadata"]["name"] == "allow-router"
        ]
        assert admit["ingress"] == [
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": ROUTER_NAMESPACE}
                        },
                        "podSelector": {"matchLabels": router_selector_labels()},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": model.vllm.port}],
            }
        ]


def test_models_routed_by_prefix_serve_vllms_render_endpoints(prod: RenderResult, tmp_path: Path) -> None:
    """vllm-router's cache_aware policy tokenizes through /v1/*/render, which vLLM 0.32.0 serves
    only with --enable-scale-out: on for cache_aware models, off for the other policies."""
    config = config_of(prod)
    for model in config.models:
        args = container(model_pod_spec(prod, model.name))["args"]
        assert ("--enable-scale-out" in args) is (config.routing_policy(model) == "cache_aware"), model.name

    def round_robin(values: dict[str, Any]) -> None:
        values["router"] = {**values.get("router", {}), "default_policy": "round_robin"}

    variant = render_variant(tmp_path, round_robin)
    for model in config_of(variant).models:
        assert "--enable-scale-out" not in container(model_pod_spec(variant, model.name))["args"], model.name


def test_the_render_switch_is_the_platforms_not_extra_args() -> None:
    from components.vllm_arguments import reserved_flag_problems

    (problem,) = reserved_flag_problems(["--enable-scale-out"], ("models", 0, "vllm", "extra_args"))
    assert "cache_aware" in problem.message


def test_router_metrics_are_scraped(prod: RenderResult) -> None:
    (monitor,) = [m for m in prod.find("PodMonitor") if m["metadata"]["name"] == "vllm-router"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [ROUTER_NAMESPACE]}
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    models = config_of(prod).models
    assert [e["port"] for e in endpoints] == ["metrics", *(f"metrics-{i}" for i in range(len(models)))]
    # Every series of model i's router is labelled with its model (the router autoscaling signal's
    # selector); the front's are not (it serves every model).
    assert "relabelings" not in endpoints[0]
    for endpoint, model in zip(endpoints[1:], models, strict=True):
        assert endpoint["relabelings"] == [
            {"targetLabel": "model", "replacement": model.name, "action": "replace"}
        ]
    # The container port the endpoint names is model i's router's.
    containers = {c["name"]: c for c in pod_spec(prod)["containers"]}
    for index, model in enumerate(models):
        assert [p["name"] for p in containers[f"route-{model.name}"]["ports"]] == [f"metrics-{index}"]
    # Prometheus' own pods (as for the vLLM pods), not all of its namespace, may reach the front's
    # and every model router's metrics port.
    (admit,) = [
        p["spec"]["ingress"][0]
        for p in prod.find("NetworkPolicy", namespace=ROUTER_NAMESPACE)
        if p["metadata"]["name"] == "allow-prometheus"
    ]
    assert admit["ports"] == [
        {"protocol": "TCP", "port": port["containerPort"]}
        for container in pod_spec(prod)["containers"]
        for port in container.get("ports", [])
        if port["name"].startswith("metrics")
    ]
    config = config_of(prod)
    monitoring = {"kubernetes.io/metadata.name": config.monitoring.namespace}
    assert admit["from"] == [
        {
            "namespaceSelector": {"matchLabels": monitoring},
            "podSelector": {"matchLabels": dict(config.security.prometheus_pod_labels)},
        }
    ]


def test_unified_endpoint_is_a_stack_output(prod: RenderResult) -> None:
    assert prod.outputs["router_endpoint"] == {
        "in_cluster": "http://vllm-router.vllm-router.svc.cluster.local:8000",
        "ingress": "https://api.llm.example.com",
    }


def test_staging_without_the_router_renders_none_of_it() -> None:
    staging = rendered("staging")
    assert not staging.find("Deployment", namespace=ROUTER_NAMESPACE)
    assert staging.outputs["router_endpoint"] is None
    for model in config_of(staging).models:
        names = [p["metadata"]["name"] for p in staging.find("NetworkPolicy", namespace=model.namespace)]
        assert "allow-router" not in names
