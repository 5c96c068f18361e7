"""The real Karpenter on the fixture's control plane (issue 41): Karpenter's KWOK provider
(`sigs.k8s.io/karpenter/kwok` v1.14.1, built by tools/build.sh as `karpenter-kwok`) run as a process
beside the API server, the scheduler and the controllers, as the rollouts controller and KEDA's
operator are.

What it needs, and where each comes from:
- the CRDs of NodePool and NodeClaim (and the rest of the release's): the pinned `karpenter-crd`
  chart, rendered with Helm's own engine from the chart cache;
- its node class, KWOKNodeClass: the CRD from the same Go module the program was built from (Go's
  module cache, which `go build` filled and checked against tools/karpenter-kwok/go.sum), and one
  object `default` whose status says Ready (the provider has no controller that sets it; Karpenter's
  NodePool readiness waits for it: pkg/controllers/nodepool/readiness);
- an instance-types file of ours (`instance_types`): the stack's pool types with CPUs, memory,
  `nvidia.com/gpu` from domain/catalogue and `vpc.amazonaws.com/efa` from upstream's table, offered
  in the stack's zones in each capacity type the pool allows. The KWOK provider reads it from
  `INSTANCE_TYPES_FILE_PATH` (kwok/options/options.go) in its own format
  (kwok/cloudprovider/instance_types.json).

The nodes it creates carry `kwok.x-k8s.io/node: fake`, the label the fixture's KWOK manages
(tests/cluster/control_plane.py KWOK_NODE_LABEL), so KWOK makes them Ready and runs their pods.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from components.helm.cache import cached_chart_path
from components.helm.engine import render_chart
from components.helm.lock import load_lock
from domain.catalogue.gpu_instances import lookup_instance_type
from domain.config import PlatformConfig
from domain.versions import DEFAULT_KUBERNETES_VERSION, GO_TOOLS
from tests.cluster import tools
from tests.cluster.control_plane import Cluster, ClusterError
from tests.cluster.nodes import PODS_PER_NODE, availability_zones

KWOK_NODE_CLASS = {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}
EFA_INTERFACES = {
    "g5.8xlarge": 1,
    "g5.12xlarge": 1,
    "g5.16xlarge": 1,
    "g5.24xlarge": 1,
    "g5.48xlarge": 1,
    "g6.8xlarge": 1,
    "g6.12xlarge": 1,
    "g6.16xlarge": 1,
    "g6.24xlarge": 1,
    "g6.48xlarge": 1,
    "g6e.8xlarge": 1,
    "g6e.12xlarge": 1,
    "g6e.16xlarge": 1,
    "g6e.24xlarge": 2,
    "g6e.48xlarge": 4,
    "p4d.24xlarge": 4,
    "p4de.24xlarge": 4,
    "p5.4xlarge": 1,
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
    "p5en.48xlarge": 16,
}
"""`vpc.amazonaws.com/efa` per instance type, as Karpenter's AWS provider reports it
(aws/karpenter-provider-aws release-v1.14.1, website/content/en/v1.14/reference/instance-types.md)."""
ON_DEMAND_PRICE_PER_GPU_HOUR = 1.0
SPOT_SHARE = 0.4
"""Relative prices only (spot cheaper than on-demand, as on EC2), so Karpenter's choice between
capacity types is exercised; not EC2's prices."""


def karpenter_pools(config: PlatformConfig) -> dict[str, Any]:
    return {name: group for name, group in config.node_groups.gpu.items() if group.is_karpenter_pool}


def instance_types(config: PlatformConfig) -> list[dict[str, Any]]:
    """The KWOK provider's instance-types file for the stack's Karpenter pools."""
    zones = availability_zones(config)
    entries: dict[str, dict[str, Any]] = {}
    for group in karpenter_pools(config).values():
        for name in group.instance_types:
            instance = lookup_instance_type(name)
            assert instance is not None, name
            resources = {
                "cpu": str(instance.vcpus),
                "memory": f"{instance.memory_gib}Gi",
                "pods": str(PODS_PER_NODE),
                "nvidia.com/gpu": str(instance.gpus_per_node),
            }
            if EFA_INTERFACES.get(name):
                resources["vpc.amazonaws.com/efa"] = str(EFA_INTERFACES[name])
            entry = entries.setdefault(
                name,
                {
                    "name": name,
                    "architecture": "amd64",
                    "operatingSystems": ["linux"],
                    "resources": resources,
                    "offerings": [],
                },
            )
            on_demand = ON_DEMAND_PRICE_PER_GPU_HOUR * instance.gpus_per_node
            for capacity_type in group.karpenter.capacity_types:
                if capacity_type == "reserved":
                    continue  # a reservation's offering needs its id and count: not simulated here
                price = on_demand * (SPOT_SHARE if capacity_type == "spot" else 1.0)
                for zone in zones:
                    offering = {
                        "Price": price,
                        "Available": True,
                        "Requirements": [
                            {
                                "key": "karpenter.sh/capacity-type",
                                "operator": "In",
                                "values": [capacity_type],
                            },
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]},
                        ],
                    }
                    if offering not in entry["offerings"]:
                        entry["offerings"].append(offering)
    return list(entries.values())


def karpenter_crds() -> list[dict[str, Any]]:
    """The CRDs of the pinned karpenter-crd chart, rendered by Helm's engine from the chart cache."""
    entry = load_lock()["karpenter-crd"]
    objects = render_chart(
        cached_chart_path(entry),
        release="karpenter-crd",
        namespace="kube-system",
        values={},
        kubernetes_version=DEFAULT_KUBERNETES_VERSION,
    )
    return [item.object for item in objects if item.kind == "CustomResourceDefinition"]


def kwok_node_class_crd_path() -> Path | None:
    """KWOKNodeClass's CRD in Go's module cache, at the version tools/karpenter-kwok pins."""
    [pin] = [pin for pin in GO_TOOLS if pin.wrapper == "karpenter-kwok"]
    try:
        cache = subprocess.run(
            ["go", "env", "GOMODCACHE"], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        cache = os.environ.get("GOMODCACHE", str(Path.home() / "go" / "pkg" / "mod"))
    path = (
        Path(cache)
        / f"{pin.module}@{pin.version}"
        / "kwok"
        / "apis"  # kwok/charts/crds holds a symbolic link, which Go module zips leave out
        / "crds"
        / ("karpenter.kwok.sh_kwoknodeclasses.yaml")
    )
    return path if path.is_file() else None


def missing_reason() -> str | None:
    reason = tools.missing_reason(["karpenter-kwok"])
    if reason:
        return reason
    if kwok_node_class_crd_path() is None:
        return "the KWOKNodeClass CRD is not in Go's module cache (run `bash tools/build.sh`)"
    return None


def install_karpenter_api(cluster: Cluster) -> None:
    """The CRDs, and the Ready KWOKNodeClass every pool of the test stack points at."""
    crd_path = kwok_node_class_crd_path()
    assert crd_path is not None
    crds = [*karpenter_crds(), yaml.safe_load(crd_path.read_text())]
    cluster.apply_objects(crds)
    cluster.wait_established([crd["metadata"]["name"] for crd in crds])
    cluster.apply_objects(
        [
            {
                "apiVersion": "karpenter.kwok.sh/v1alpha1",
                "kind": KWOK_NODE_CLASS["kind"],
                "metadata": {"name": KWOK_NODE_CLASS["name"]},
                "spec": {},
            }
        ]
    )
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": "2026-12-05T00:00:00Z",
        "observedGeneration": 1,
    }
    cluster.kubectl(
        "patch",
        "kwoknodeclass",
        KWOK_NODE_CLASS["name"],
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"conditions": [condition]}}),
    )


def start_karpenter_kwok(cluster: Cluster, config: PlatformConfig) -> None:
    """The KWOK provider as a process: the admin kubeconfig, no leader election, ports of its own."""
    binary = tools.program("karpenter-kwok")
    if binary is None:
        raise ClusterError(tools.missing_reason(["karpenter-kwok"]) or "karpenter-kwok")
    types_file = cluster.workdir / "karpenter-instance-types.json"
    types_file.write_text(json.dumps(instance_types(config), indent=2))
    cluster.netns.start(
        [str(binary)],
        log=cluster.workdir / "logs" / "karpenter-kwok.log",
        env={
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "INSTANCE_TYPES_FILE_PATH": str(types_file),
            "DISABLE_LEADER_ELECTION": "true",
            "METRICS_PORT": "18180",
            "HEALTH_PROBE_PORT": "18181",
            "LOG_LEVEL": "debug",
            # Short batches: a wake's pending pod is one pod.
            "BATCH_MAX_DURATION": "2s",
            "BATCH_IDLE_DURATION": "1s",
        },
    )
