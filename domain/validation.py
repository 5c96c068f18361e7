"""Checks beyond the schema, run by `validate`, `render` and `pulumi preview` alike.

Each check is a pure function from the typed config to problems (stack-file key path, value,
message with the fix), so one run reports everything that is wrong at once.
"""

from __future__ import annotations

from domain.config.errors import Problem
from domain.config.platform import PlatformConfig


def ingress_host_problems(config: PlatformConfig) -> list[Problem]:
    """With ingress on, every model needs a hostname: models share one load balancer by host (a
    model that scales to zero has none: to_zero_hostname_problems)."""
    if not config.ingress.enabled or (config.router.enabled and not config.router.per_model_hostnames):
        return []
    return [
        Problem(
            ("models", index, "ingress_host"),
            None,
            "ingress is on but this model has no hostname: set ingress.domain (models get "
            "<name>.<domain>) or models[].ingress_host, or set ingress.enabled: false",
        )
        for index, model in enumerate(config.models)
        if model.ingress_host is None and not model.scales_to_zero
    ]


def load_balancer_source_problems(config: PlatformConfig) -> list[Problem]:
    """Mode `existing` with an ALB: the NetworkPolicies need the ALB's subnets, which only the user knows.
    Mode `eks` computes them from the subnets it creates, so a value there would be ignored."""
    cidrs = config.security.load_balancer_source_cidrs
    at = ("security", "load_balancer_source_cidrs")
    if config.cluster.mode == "eks" and cidrs:
        return [
            Problem(
                at,
                cidrs,
                "mode 'eks' admits exactly the load-balancer subnets it creates; remove this "
                "key (it is for mode 'existing')",
            )
        ]
    needs = (
        config.cluster.mode == "existing"
        and config.ingress.enabled
        and config.ingress.class_name == "alb"
        and config.security.network_policies
    )
    role = "elb" if config.ingress.scheme == "internet-facing" else "internal-elb"
    if needs and not cidrs:
        return [
            Problem(
                at,
                cidrs,
                (
                    "mode 'existing' with an 'alb' ingress needs the CIDRs of the subnets the ALB's "
                    "ENIs live in "
                    f"(tagged kubernetes.io/role/{role}), "
                    "e.g. ['10.0.200.0/24', '10.0.201.0/24']: only they may reach vLLM's port. Not "
                    "the VPC CIDR, "
                    "which holds every pod and node"
                ),
            )
        ]
    problems = []
    for index, cidr in enumerate(cidrs):
        if cidr == config.cluster.vpc_cidr or cidr.endswith("/0"):
            problems.append(
                Problem(
                    (*at, index),
                    cidr,
                    (
                        "admits every address in the VPC (or anywhere), not only the load balancer: "
                        "name the ALB's own "
                        "subnets"
                    ),
                )
            )
    return problems


def replica_bound_problems(config: PlatformConfig) -> list[Problem]:
    """No more replicas than the GPU group can ever hold: max_size nodes × the replicas one node fits.
    (The quota, the HPA and the PDB are sized from these numbers; 40 on a 2-GPU group is a typo.)"""
    problems = []
    for index, model in enumerate(config.models):
        group = config.node_groups.gpu.get(model.gpu_group)
        if group is None or not group.gpu_instances:
            continue  # reported by the schema (unknown group)
        per_node = max(instance.gpus_per_node for instance in group.gpu_instances) // model.gpus_per_replica
        # A multi-node replica takes nodes_per_replica whole nodes (domain/multi_node.py, which also
        # reports a group too small for one replica).
        most = group.max_size * per_node // model.nodes_per_replica
        if most == 0 and model.is_multi_node:
            continue
        counts: list[tuple[tuple[str | int, ...], int]] = [(("replicas",), model.replicas)]
        if model.autoscaling.enabled:
            counts = [
                (("autoscaling", "min_replicas"), model.autoscaling.min_replicas),
                (("autoscaling", "max_replicas"), model.autoscaling.max_replicas),
            ]
        for key, value in counts:
            if value > most:
                problems.append(
                    Problem(
                        ("models", index, *key),
                        value,
                        (
                            f"GPU group '{model.gpu_group}' holds at most {most} replicas of "
                            f"{model.gpus_per_replica} GPU(s) "
                            f"(node_groups.gpu.{model.gpu_group}.max_size {group.max_size} × "
                            f"{per_node} per node): lower "
                            f"it to {most} or fewer, or raise the group's max_size"
                        ),
                    )
                )
    return problems


def to_zero_hostname_problems(config: PlatformConfig) -> list[Problem]:
    """A model that scales to zero has no hostname of its own: the load balancer would answer it 503 at
    once while no pod exists, so its Ingress is not rendered (components/model_service.py
    `serves_own_hostname`) and only the router, which holds requests while it wakes, reaches it."""
    problems = []
    for index, model in enumerate(config.models):
        if model.scales_to_zero and model.ingress_host is not None:
            endpoint = f"https://{config.router.host}" if config.router.host else "the router's endpoint"
            problems.append(
                Problem(
                    ("models", index, "ingress_host"),
                    model.ingress_host,
                    "this model scales to zero (autoscaling.min_replicas 0), so it gets no Ingress of its "
                    "own and nothing would serve this host; remove ingress_host and call it through "
                    f'{endpoint} with "model": "{model.openai_model_name}" (the router holds requests '
                    "while it wakes), or set min_replicas: 1 to keep a hostname",
                )
            )
    return problems
