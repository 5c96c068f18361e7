"""NetworkPolicies of one model namespace: deny everything, then allow exactly what serving needs.

Pure builders: `model_network_policies` returns (name, spec) pairs that ModelService turns into
NetworkPolicy objects. Decisions (docs/serving.md, "Network policy"):

- In: the ingress controller's namespace and Prometheus's namespace, on the server port only (vLLM
  serves /metrics on the API port). With the AWS Load Balancer Controller in target-type `ip` mode
  the ALB's own ENIs connect to the pod, from addresses in the VPC, not from a pod in the
  controller's namespace: so with ingress class `alb` the VPC CIDR is also allowed on that port.
  The ALB cannot be named more narrowly in a NetworkPolicy; `/v1` still needs the API key.
- Out: DNS to kube-dns; NFS (2049) to the VPC for EFS; HTTPS (443) to public addresses only, for S3,
  STS (IRSA) and, for hf:// sources, the Hugging Face hub. NetworkPolicy cannot select S3 by name
  or prefix list, and S3 (also through a gateway endpoint) answers on public addresses, so
  "443 to anything except private, shared and link-local ranges and the VPC" reaches S3 while
  keeping pods from other in-cluster or in-VPC HTTPS services and from the instance metadata
  service (169.254.169.254: the node role must not leak to pods).
- In also from the router's pods (namespace `vllm-router`) on the server port, when the router is on.
- Nothing between the model's own pods: tensor parallelism stays within one pod.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from components.labels import ROUTER_NAMESPACE, model_selector_labels, router_selector_labels
from infra.config.models import ModelConfig
from infra.config.platform import PlatformConfig

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
NFS_PORT = 2049
HTTPS_PORT = 443
DNS_PORT = 53
KUBE_DNS_LABELS = {"k8s-app": "kube-dns"}
"""CoreDNS on EKS (and kubeadm clusters) keeps the kube-dns label."""

# Never reachable on 443 from a model pod: RFC 1918 private ranges, RFC 6598 shared space (EKS
# custom pod networking uses 100.64.0.0/10), link-local (instance metadata).
NON_PUBLIC_RANGES = ("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16")


def _namespace(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def public_https_excepts(vpc_cidr: str) -> list[str]:
    """The ranges excluded from HTTPS egress, plus the VPC when it lies outside them."""
    ranges = [ipaddress.IPv4Network(cidr) for cidr in NON_PUBLIC_RANGES]
    vpc = ipaddress.IPv4Network(vpc_cidr)
    if not any(vpc.subnet_of(network) for network in ranges):
        ranges.append(vpc)
    return [str(network) for network in sorted(ranges)]


def model_network_policies(config: PlatformConfig, model: ModelConfig) -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) of every NetworkPolicy in the model's namespace; none when they are switched off."""
    if not config.security.network_policies:
        return []
    pods = {"matchLabels": model_selector_labels(model.name)}
    server_port = [{"protocol": "TCP", "port": model.vllm.port}]
    vpc_cidr = config.cluster.vpc_cidr

    callers: list[dict[str, Any]] = [_namespace(config.security.ingress_controller_namespace)]
    if config.ingress.enabled and config.ingress.class_name == "alb":
        callers.append({"ipBlock": {"cidr": vpc_cidr}})
    policies: list[tuple[str, dict[str, Any]]] = [
        ("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
        ("allow-ingress-controller", {
            "podSelector": pods, "policyTypes": ["Ingress"],
            "ingress": [{"from": callers, "ports": server_port}],
        }),
    ]
    if config.router.enabled:
        # The router (components/router.py) sends each request to one of the model's pods directly.
        policies.append(("allow-router", {
            "podSelector": pods, "policyTypes": ["Ingress"],
            "ingress": [{"from": [{**_namespace(ROUTER_NAMESPACE),
                                   "podSelector": {"matchLabels": router_selector_labels()}}],
                         "ports": server_port}],
        }))
    if config.monitoring.enabled:
        policies.append(("allow-prometheus", {
            "podSelector": pods, "policyTypes": ["Ingress"],
            "ingress": [{"from": [_namespace(config.monitoring.namespace)], "ports": server_port}],
        }))
    policies += [
        ("allow-dns", {
            "podSelector": {}, "policyTypes": ["Egress"],
            "egress": [{
                "to": [{**_namespace("kube-system"), "podSelector": {"matchLabels": KUBE_DNS_LABELS}}],
                "ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}],
            }],
        }),
        ("allow-model-storage", {
            "podSelector": pods, "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"ipBlock": {"cidr": vpc_cidr}}], "ports": [{"protocol": "TCP", "port": NFS_PORT}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": public_https_excepts(vpc_cidr)}}],
                 "ports": [{"protocol": "TCP", "port": HTTPS_PORT}]},
            ],
        }),
    ]
    return policies
