"""Default-deny NetworkPolicies per model namespace, with exactly the allows serving needs."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from components.labels import model_selector_labels
from components.network_policy import NON_PUBLIC_RANGES, public_https_excepts
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


def test_only_the_ingress_controller_and_prometheus_reach_the_server_port(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        found = policies(stack_render, model.namespace)
        port = [{"protocol": "TCP", "port": model.vllm.port}]
        pods = {"matchLabels": model_selector_labels(model.name)}
        ingress_rules = [(name, rule) for name, spec in found.items() for rule in spec.get("ingress", [])]
        # The router's pods also reach vLLM when the router is on (tests/test_routing_render.py checks that peer).
        expected = {"allow-ingress-controller", "allow-prometheus"} | ({"allow-router"} if config.router.enabled else set())
        assert {name for name, _ in ingress_rules} == expected
        for _, rule in ingress_rules:
            assert rule["ports"] == port
        controller = found["allow-ingress-controller"]
        assert controller["podSelector"] == pods
        assert controller["ingress"][0]["from"] == [
            namespace_peer(config.security.ingress_controller_namespace),
            # ALB target type ip: the load balancer's ENIs in the VPC connect to the pod directly.
            {"ipBlock": {"cidr": config.cluster.vpc_cidr}},
        ]
        assert found["allow-prometheus"]["ingress"][0]["from"] == [
            namespace_peer(config.monitoring.namespace)
        ]


def test_egress_is_dns_nfs_to_the_vpc_and_public_https_only(stack_render: RenderResult) -> None:
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
        nfs, https = egress["allow-model-storage"]
        assert nfs == {
            "to": [{"ipBlock": {"cidr": config.cluster.vpc_cidr}}],
            "ports": [{"protocol": "TCP", "port": 2049}],
        }
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
