"""The multi-node pre-flight (issue 50): a Job a user runs on their own cluster, before a group spends
hours of GPU time failing to start, that checks on the group's own nodes what only those nodes can
show: `ulimit -l`, libfabric's EFA provider and devices (`fi_info -p efa`), the network NCCL loaded,
and an all-reduce across the nodes with its bus bandwidth against a floor from the instance type.

Pure builders; `vllm-platform preflight <stack> --model <name>` (infra/cli.py) prints them as YAML for
`kubectl apply -f -`. The script the pods run is pod_files/vllm_platform_preflight.py, shipped in a
ConfigMap as the API-key middleware is.

The pods are the model's group worker pods (components/leader_worker_set.py, the same builders the
LeaderWorkerSet uses): its image, GPU and EFA requests, CPU and memory, node selector and tolerations,
non-root security context, /dev/shm, and the libfabric/NCCL environment. What differs, and why:
- its own namespace, `vllm-preflight-<model>` (PodSecurity `restricted`), so that the model's
  ResourceQuota, NetworkPolicies and running pods are neither in its way nor touched, and one
  `kubectl delete namespace` removes it all;
- an Indexed Job (one pod per node, `JOB_COMPLETION_INDEX` the node's rank) behind a headless
  Service, so the leader is `preflight-0.preflight` in DNS, as LWS names a group's leader; no retries
  (`backoffLimit: 0`): a failed check is the answer, not something to run again;
- no priority class (a pre-flight never preempts a serving pod), no model volume, no preloader, no
  API key: it reads no weights;
- the group's zone rule (every pod in the zone of the others) and one pod per node, on the Job's own
  pods.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from components import vllm_pod, workloads
from components.leader_worker_set import ZONE_LABEL
from domain.capacity.plan import plan_platform
from domain.catalogue.efa_interfaces import EFA_RESOURCE, efa_bandwidth_gbps
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.labels import PART_OF

GPU_RESOURCE = "nvidia.com/gpu"
SCRIPT_FILE = Path(__file__).with_name("pod_files") / "vllm_platform_preflight.py"
NAME = "preflight"
"""The Job, its headless Service, ConfigMap and NetworkPolicy."""
SCRIPT_MOUNT = "/opt/vllm-platform-preflight"
PORT = 29500
"""torchrun's default rendezvous port on the leader."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
"""Set by the Job controller on every pod of a Job (Kubernetes 1.27+)."""
KEPT_VOLUMES = ("dshm", "home", "tmp")
"""The member's emptyDirs: NCCL's shared memory, and the writable home and /tmp of a read-only root."""
KEPT_ENVIRONMENT_PREFIXES = ("FI_", "NCCL_", "LD_LIBRARY_PATH", "VLLM_HOST_IP")
KEPT_ENVIRONMENT = ("HOME", "USER", "LOGNAME", "TMPDIR")
DEFAULT_BANDWIDTH_FRACTION = 0.5
"""The floor, as a share of the per-node EFA bandwidth AWS publishes for the instance type
(domain/catalogue/efa_interfaces.yaml `efa_bandwidth_gbps`): NCCL over a working EFA path reaches most
of the line rate across nodes, while its socket fallback over the ENA interface reaches a few
percent, so half tells the two apart with room on both sides. It is not a performance target."""
DEFAULT_RENDEZVOUS_SECONDS = 1800
"""How long the pods wait for each other: on cold nodes each pulls a 10-25 GB image at its own pace."""


class PreflightError(ValueError):
    """A pre-flight that cannot be rendered for this model, with what to do instead."""


def minimum_bus_bandwidth_gbps(config: PlatformConfig, model: ModelConfig) -> float | None:
    """Half of the slowest EFA bandwidth among the group's instance types; None if one is unknown."""
    rates = [efa_bandwidth_gbps(t) for t in config.node_groups.gpu[model.gpu_group].instance_types]
    if any(rate is None for rate in rates):
        return None
    return DEFAULT_BANDWIDTH_FRACTION * min(rate for rate in rates if rate is not None)


def preflight_namespace(model: ModelConfig) -> str:
    return f"vllm-preflight-{model.name}"


def _labels(model: ModelConfig) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/name": "vllm-preflight",
        "app.kubernetes.io/instance": model.name,
    }


def _worker_template(config: PlatformConfig, model: ModelConfig) -> dict[str, Any]:
    plan = plan_platform(config).models[model.name]
    _, _, spec = workloads.workload(config, model, plan, vllm_pod.SERVER_NAME)
    return spec["leaderWorkerTemplate"]["workerTemplate"]


def _environment(container: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        entry
        for entry in container["env"]
        if entry["name"].startswith(KEPT_ENVIRONMENT_PREFIXES) or entry["name"] in KEPT_ENVIRONMENT
    ]


def preflight_arguments(
    model: ModelConfig, resources: dict[str, Any], minimum_gbps: float, rendezvous_seconds: int
) -> list[str]:
    """The pod's arguments to the script (`node` mode; the script's own parser reads them): one
    process per GPU the member asks for, the EFA checks where it asks for EFA devices."""
    limits = resources["limits"]
    arguments = [
        "node",
        f"--nodes={model.nodes_per_replica}",
        f"--processes-per-node={int(limits[GPU_RESOURCE])}",
        f"--leader-address={NAME}-0.{NAME}",
        f"--port={PORT}",
        "--backend=nccl",
        "--device=cuda",
        f"--min-bus-bandwidth-gbps={minimum_gbps:g}",
        f"--rendezvous-seconds={rendezvous_seconds}",
    ]
    efa = int(limits.get(EFA_RESOURCE, 0))
    if efa:
        arguments += ["--require-efa", f"--efa-devices={efa}"]
    return arguments


def preflight_objects(
    config: PlatformConfig,
    model: ModelConfig,
    *,
    min_bus_bandwidth_gbps: float | None = None,
    rendezvous_seconds: int = DEFAULT_RENDEZVOUS_SECONDS,
) -> list[dict[str, Any]]:
    """Namespace, ConfigMap (the script), headless Service, NetworkPolicy and the Indexed Job."""
    if not model.is_multi_node:
        raise PreflightError(
            f"model '{model.name}' runs on one node (parallelism.nodes_per_replica: 1): the pre-flight "
            "checks what a group needs between nodes; run `vllm-platform smoke` against it instead"
        )
    minimum = min_bus_bandwidth_gbps
    if minimum is None:
        minimum = minimum_bus_bandwidth_gbps(config, model)
    if minimum is None:
        types = config.node_groups.gpu[model.gpu_group].instance_types
        raise PreflightError(
            f"no published EFA bandwidth for every instance type of group '{model.gpu_group}' "
            f"({', '.join(types)}) "
            "in domain/catalogue/efa_interfaces.yaml: pass --min-bus-bandwidth-gbps (e.g. half the "
            "type's EFA bandwidth in Gbit/s)"
        )
    namespace = preflight_namespace(model)
    labels = _labels(model)
    selector = {JOB_NAME_LABEL: NAME}
    member = copy.deepcopy(_worker_template(config, model))
    member_spec = member["spec"]
    server = member_spec["containers"][0]
    container = {
        "name": NAME,
        "image": server["image"],
        "imagePullPolicy": server.get("imagePullPolicy", "IfNotPresent"),
        "command": ["python3", f"{SCRIPT_MOUNT}/{SCRIPT_FILE.name}"],
        "args": preflight_arguments(model, server["resources"], minimum, rendezvous_seconds),
        "env": _environment(server),
        "resources": server["resources"],
        "securityContext": server["securityContext"],
        "volumeMounts": [
            *(m for m in server["volumeMounts"] if m["name"] in KEPT_VOLUMES),
            {"name": "script", "mountPath": SCRIPT_MOUNT, "readOnly": True},
        ],
        "ports": [{"name": "rendezvous", "containerPort": PORT}],
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": NAME,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": member_spec["securityContext"],
        "nodeSelector": member_spec.get("nodeSelector", {}),
        "tolerations": member_spec.get("tolerations", []),
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": dict(selector)},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            },
            # EFA does not cross zones: every pod in the zone of the others (the first places itself).
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": dict(selector)}, "topologyKey": ZONE_LABEL}
                ]
            },
        },
        "containers": [container],
        "volumes": [
            *(v for v in member_spec["volumes"] if v["name"] in KEPT_VOLUMES),
            {"name": "script", "configMap": {"name": NAME, "defaultMode": 0o444}},
        ],
    }
    nodes = model.nodes_per_replica

    def metadata() -> dict[str, Any]:
        return {"namespace": namespace, "labels": dict(labels)}

    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": namespace,
                "labels": {
                    **labels,
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": f"v{config.cluster.kubernetes_version}",
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": NAME, **metadata()},
            "data": {SCRIPT_FILE.name: SCRIPT_FILE.read_text()},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, **metadata()},
            "spec": {
                "clusterIP": "None",
                # The leader's name resolves before it is Ready (it never is: it has no probe).
                "publishNotReadyAddresses": True,
                "selector": dict(selector),
                "ports": [{"name": "rendezvous", "port": PORT, "targetPort": PORT}],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": NAME, **metadata()},
            "spec": {
                "podSelector": {"matchLabels": dict(selector)},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": dict(selector)}}]}],
                "egress": [
                    {"to": [{"podSelector": {"matchLabels": dict(selector)}}]},
                    {
                        "to": [
                            {
                                "namespaceSelector": {
                                    "matchLabels": {"kubernetes.io/metadata.name": "kube-system"}
                                },
                                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
                            }
                        ],
                        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                    },
                ],
            },
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": NAME, **metadata()},
            "spec": {
                "completionMode": "Indexed",
                "completions": nodes,
                "parallelism": nodes,
                "backoffLimit": 0,
                # Waiting for every node and the image, then the checks; never left running.
                "activeDeadlineSeconds": rendezvous_seconds + 900,
                "template": {
                    "metadata": {
                        "labels": _labels(model),
                        "annotations": {"kubectl.kubernetes.io/default-container": NAME},
                    },
                    "spec": pod_spec,
                },
            },
        },
    ]
