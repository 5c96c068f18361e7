"""Default-deny NetworkPolicies per model namespace, with exactly the allows serving needs."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from components.network_policy import NON_PUBLIC_RANGES, public_https_excepts
from domain.labels import model_selector_labels
from infra.render import RenderResult
from tests.test_serving_render import config_of, render_variant


def policies(result: RenderResult, namespace: str) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj["spec"] for obj in result.find("NetworkPolicy", namespace=namespace)}


def namespace_peer(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}


def test_every_model_namespace_denies_all_traffic_by_default(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        deny = policies(stack_render, model.namespace)["default-deny"]
        assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def _subnet_cidrs(result: RenderResult, role_tag: str) -> set[str]:
    return {
        subnet.inputs["cidrBlock"]
        for subnet in result.aws("aws:ec2/subnet:Subnet")
        if subnet.inputs.get("tags", {}).get(role_tag) == "1"
    }


def _ingress_sources(found: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    return {
        name: [source for rule in spec["ingress"] for source in rule["from"]]
        for name, spec in found.items()
        if "ingress" in spec
    }


def test_only_the_load_balancer_subnets_and_prometheus_pods_reach_the_server_port(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    # The subnets the AWS Load Balancer Controller puts an ALB of this scheme in (by their role tag),
    # as the AWS layer rendered them: no pod or node address is in them.
    role = (
        "kubernetes.io/role/elb"
        if config.ingress.scheme == "internet-facing"
        else "kubernetes.io/role/internal-elb"
    )
    load_balancer_cidrs = _subnet_cidrs(stack_render, role)
    node_subnets = {
        s.inputs["cidrBlock"] for s in stack_render.aws("aws:ec2/subnet:Subnet") if "-private-" in s.name
    }
    assert load_balancer_cidrs and node_subnets
    for model in config.models:
        found = policies(stack_render, model.namespace)
        sources = _ingress_sources(found)
        # The router's pods are one more caller when the router is on (tests/test_routing_render.py).
        router = {"allow-router"} if config.router.enabled else set()
        assert set(sources) == {"allow-load-balancer", "allow-prometheus"} | router
        for name in sources:
            assert found[name]["podSelector"] == {"matchLabels": model_selector_labels(model.name)}
            assert [rule["ports"] for rule in found[name]["ingress"]] == [
                [{"protocol": "TCP", "port": model.vllm.port}]
            ]
        blocks = {source["ipBlock"]["cidr"] for source in sources["allow-load-balancer"]}
        assert blocks == load_balancer_cidrs
        for block in blocks:
            assert not any(
                ipaddress.ip_network(block).overlaps(ipaddress.ip_network(n)) for n in node_subnets
            )
            assert block != config.cluster.vpc_cidr
        assert sources["allow-prometheus"] == [
            {
                **namespace_peer(config.monitoring.namespace),
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
            }
        ]
        # Nothing from kube-system (every add-on pod runs there) reaches vLLM.
        assert not any("kube-system" in str(source) for entries in sources.values() for source in entries)


def test_internal_load_balancers_get_subnets_of_their_own(stack_render: RenderResult) -> None:
    internal = _subnet_cidrs(stack_render, "kubernetes.io/role/internal-elb")
    config = config_of(stack_render)
    assert len(internal) == config.cluster.availability_zone_count
    others = {s.inputs["cidrBlock"] for s in stack_render.aws("aws:ec2/subnet:Subnet")} - internal
    for cidr in internal:
        network = ipaddress.ip_network(cidr)
        assert network.prefixlen <= 27  # an ALB needs a /27 at least
        assert network.subnet_of(ipaddress.ip_network(config.cluster.vpc_cidr))
        assert not any(network.overlaps(ipaddress.ip_network(other)) for other in others)


def test_existing_cluster_admits_the_configured_load_balancer_subnets(
    existing_mode_render: RenderResult,
) -> None:
    config = config_of(existing_mode_render)
    found = policies(existing_mode_render, config.models[0].namespace)
    blocks = [s["ipBlock"]["cidr"] for s in _ingress_sources(found)["allow-load-balancer"]]
    assert blocks == config.security.load_balancer_source_cidrs != []


def test_a_non_alb_ingress_admits_only_the_controller_pods(tmp_path: Path) -> None:
    def nginx(values: dict[str, Any]) -> None:
        values["ingress"] = {**values.get("ingress", {}), "class_name": "nginx"}
        values["security"] = {
            "ingress_controller_namespace": "ingress-nginx",
            "ingress_controller_pod_labels": {"app.kubernetes.io/name": "ingress-nginx"},
        }

    found = policies(render_variant(tmp_path, nginx), "vllm-qwen2-5-7b")
    assert _ingress_sources(found)["allow-ingress-controller"] == [
        {
            **namespace_peer("ingress-nginx"),
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "ingress-nginx"}},
        }
    ]
    assert "allow-load-balancer" not in found


def test_egress_is_dns_and_public_https_only_no_nfs(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        found = policies(stack_render, model.namespace)
        egress = {name: spec["egress"] for name, spec in found.items() if "egress" in spec}
        assert set(egress) == {"allow-dns", "allow-model-storage"}
        dns = egress["allow-dns"][0]
        assert dns["to"] == [
            {**namespace_peer("kube-system"), "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
        ]
        assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"]
        assert {p["port"] for p in dns["ports"]} == {53}
        # The EFS CSI node plugin mounts on the host network; a pod never speaks NFS itself.
        (https,) = egress["allow-model-storage"]
        assert https["ports"] == [{"protocol": "TCP", "port": 443}]
        block = https["to"][0]["ipBlock"]
        assert block["cidr"] == "0.0.0.0/0"
        assert set(NON_PUBLIC_RANGES) <= set(block["except"])


def test_https_egress_cannot_reach_the_vpc_or_the_metadata_service() -> None:
    excepts = [ipaddress.IPv4Network(cidr) for cidr in public_https_excepts("10.0.0.0/16")]
    for address in ("169.254.169.254", "10.0.3.7", "172.20.0.10", "192.168.1.1", "100.64.5.5"):
        assert any(ipaddress.IPv4Address(address) in network for network in excepts), address
    for public in ("52.218.0.1", "3.5.0.10"):  # S3 address ranges (us-west-2)
        assert not any(ipaddress.IPv4Address(public) in network for network in excepts), public


def test_a_vpc_outside_the_private_ranges_is_excluded_too() -> None:
    assert "198.18.0.0/16" in public_https_excepts("198.18.0.0/16")
    assert len(public_https_excepts("10.1.0.0/16")) == len(NON_PUBLIC_RANGES)


def test_network_policies_switch_off_removes_them(tmp_path: Path) -> None:
    def off(values: dict[str, Any]) -> None:
        values["security"] = {"network_policies": False}

    assert render_variant(tmp_path, off).find("NetworkPolicy") == []


def test_without_monitoring_prometheus_gets_no_allow(tmp_path: Path) -> None:
    def no_monitoring(values: dict[str, Any]) -> None:
        values["monitoring"] = {"enabled": False}
        values["addons"] = {"prometheus_adapter": False}

    found = policies(render_variant(tmp_path, no_monitoring), "vllm-qwen2-5-7b")
    assert "allow-prometheus" not in found
    assert "default-deny" in found
