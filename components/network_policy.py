"""NetworkPolicies of one model namespace: deny everything, then allow exactly what serving needs.

Pure builders: `model_network_policies` returns (name, spec) pairs that ModelService turns into
NetworkPolicy objects. Decisions (docs/security.md, "Who reaches a vLLM pod"; docs/serving.md):

- In, on the server port only, from a list of `AllowedPeer`s (one policy each), nothing else:
  the load balancer — with ingress class `alb` (target type `ip`) the ALB's own ENIs connect, from
  the subnets of its scheme (`ClusterContext.load_balancer_source_cidrs`: the stack's public or
  internal load-balancer subnets, or `security.load_balancer_source_cidrs` on an existing
  cluster), which hold no pods or nodes; with another class, the controller's pods — and the
  Prometheus server pods, which scrape `/metrics`. Not the VPC, not kube-system. Every route but
  `/health` and `/metrics` still needs the API key (components/server_auth.py). Kubelet probes come
  from the node itself, which NetworkPolicy implementations admit (the VPC CNI's agent and Calico
  do). With the router on, its pods (namespace `vllm-router`) are one more `AllowedPeer`.
- Out: DNS to kube-dns; HTTPS (443) to public addresses only, for S3, STS (IRSA) and, for hf://
  sources, the Hugging Face hub. NetworkPolicy cannot select S3 by name or prefix list, and S3
  (also through a gateway endpoint) answers on public addresses, so "443 to anything except
  private, shared and link-local ranges and the VPC" reaches S3 while keeping pods from other
  in-cluster or in-VPC HTTPS services and from the instance metadata service (169.254.169.254:
  the node role must not leak to pods). No NFS: the EFS CSI node plugin mounts on the host network,
  so a pod speaking NFS itself could only be bypassing its access point.
- Nothing between the model's own pods: tensor parallelism stays within one pod.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig, RouterConfig
from domain.labels import ROUTER_NAMESPACE, model_selector_labels, router_selector_labels

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
HTTPS_PORT = 443
DNS_PORT = 53
KUBE_DNS_LABELS = {"k8s-app": "kube-dns"}
"""CoreDNS on EKS (and kubeadm clusters) keeps the kube-dns label."""

# Never reachable on 443 from a model pod: RFC 1918 private ranges, RFC 6598 shared space (EKS
# custom pod networking uses 100.64.0.0/10), link-local (instance metadata).
NON_PUBLIC_RANGES = ("10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16")


def namespace_selector(name: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: name}}}


def public_https_excepts(vpc_cidr: str) -> list[str]:
    """The ranges excluded from HTTPS egress, plus the VPC when it lies outside them."""
    ranges = [ipaddress.IPv4Network(cidr) for cidr in NON_PUBLIC_RANGES]
    vpc = ipaddress.IPv4Network(vpc_cidr)
    if not any(vpc.subnet_of(network) for network in ranges):
        ranges.append(vpc)
    return [str(network) for network in sorted(ranges)]


@dataclass(frozen=True)
class AllowedPeer:
    """One caller admitted to the vLLM port: a policy named `allow-<name>` with these `from` entries."""

    name: str
    sources: tuple[dict[str, Any], ...]


def load_balancer_peer(config: PlatformConfig, load_balancer_cidrs: Sequence[str]) -> AllowedPeer | None:
    ingress = config.ingress
    if not ingress.enabled:
        return None
    if ingress.class_name == "alb":
        # Checked at validate time: mode existing must name the subnets (load_balancer_source_problems).
        sources = tuple({"ipBlock": {"cidr": cidr}} for cidr in load_balancer_cidrs)
        return AllowedPeer("load-balancer", sources)
    controller = namespace_selector(config.security.ingress_controller_namespace)
    if config.security.ingress_controller_pod_labels:
        controller["podSelector"] = {"matchLabels": dict(config.security.ingress_controller_pod_labels)}
    return AllowedPeer("ingress-controller", (controller,))


def prometheus_peer(config: PlatformConfig) -> AllowedPeer | None:
    if not config.monitoring.enabled:
        return None
    return AllowedPeer(
        "prometheus",
        (
            {
                **namespace_selector(config.monitoring.namespace),
                "podSelector": {"matchLabels": dict(config.security.prometheus_pod_labels)},
            },
        ),
    )


def router_peer(router: RouterConfig) -> AllowedPeer | None:
    """The router's pods (components/router.py) send each request to one of the model's pods directly."""
    if not router.enabled:
        return None
    return AllowedPeer(
        "router",
        (
            {
                **namespace_selector(ROUTER_NAMESPACE),
                "podSelector": {"matchLabels": router_selector_labels()},
            },
        ),
    )


def serving_peers(config: PlatformConfig, load_balancer_cidrs: Sequence[str]) -> list[AllowedPeer]:
    """Everyone who may open a connection to a vLLM pod; add a caller here and nowhere else."""
    peers = (
        load_balancer_peer(config, load_balancer_cidrs),
        router_peer(config.router),
        prometheus_peer(config),
    )
    return [peer for peer in peers if peer is not None and peer.sources]


def allow_peer_policy(
    peer: AllowedPeer, pods: dict[str, Any], ports: Sequence[dict[str, Any]]
) -> tuple[str, dict[str, Any]]:
    """`allow-<peer>`: the peer's sources may open connections to `pods` on `ports`."""
    return (
        f"allow-{peer.name}",
        {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": list(peer.sources), "ports": list(ports)}],
        },
    )


def allow_dns_policy() -> tuple[str, dict[str, Any]]:
    """`allow-dns`: every pod of the namespace may ask the cluster's DNS (after `default-deny`)."""
    return (
        "allow-dns",
        {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [
                {
                    "to": [
                        {**namespace_selector("kube-system"), "podSelector": {"matchLabels": KUBE_DNS_LABELS}}
                    ],
                    "ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}],
                }
            ],
        },
    )


def model_network_policies(
    config: PlatformConfig, model: ModelConfig, peers: Sequence[AllowedPeer]
) -> list[tuple[str, dict[str, Any]]]:
    """(name, spec) of every NetworkPolicy in the model's namespace; none when they are switched off."""
    if not config.security.network_policies:
        return []
    pods = {"matchLabels": model_selector_labels(model.name)}
    server_port = [{"protocol": "TCP", "port": model.vllm.port}]
    vpc_cidr = config.cluster.vpc_cidr
    policies: list[tuple[str, dict[str, Any]]] = [
        ("default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}),
    ]
    policies += [allow_peer_policy(peer, pods, server_port) for peer in peers]
    policies += [
        allow_dns_policy(),
        (
            "allow-model-storage",
            {
                "podSelector": pods,
                "policyTypes": ["Egress"],
                "egress": [
                    {
                        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": public_https_excepts(vpc_cidr)}}],
                        "ports": [{"protocol": "TCP", "port": HTTPS_PORT}],
                    },
                ],
            },
        ),
    ]
    if model.is_multi_node:
        # The members of a group reach each other on every port: vLLM's rendezvous (--master-port),
        # torch.distributed's and NCCL's bootstrap sockets on ports they choose at run time (issue 42).
        # EFA's own traffic bypasses the kernel and is allowed by the nodes' security group instead.
        policies.append(
            (
                "allow-group-members",
                {
                    "podSelector": pods,
                    "policyTypes": ["Ingress", "Egress"],
                    "ingress": [{"from": [{"podSelector": pods}]}],
                    "egress": [{"to": [{"podSelector": pods}]}],
                },
            )
        )
    return policies
