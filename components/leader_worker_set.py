"""A multi-node replica as a LeaderWorkerSet group (issue 42): the spec, the EFA requests and the NCCL /
libfabric environment of its pods, and the labels that pick out its leaders. Pure functions;
components/model_service.py creates the object (`workload`) beside the model's Service and PDB.

Both templates come from `vllm_pod.pod_template`, the Deployment's own, with the `vllm serve`
arguments of `vllm_arguments.build_server_arguments` for each role (`NodeRole.in_pod`), so what differs
between leader and worker is exactly the role: `--node-rank`, and `--headless` with no API (so no HTTP
probes) on workers.
"""

from __future__ import annotations

import copy
from typing import Any

from domain.catalogue.efa_interfaces import EFA_RESOURCE
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.labels import model_selector_labels
from domain.multi_node import efa_device_rdma, efa_interfaces_per_node

LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"

STABLE_SET = "vllm"
"""The model's LeaderWorkerSet (components/model_service.py SERVER_NAME); with a canary, the stable one."""
CANARY_SET = "vllm-canary"
"""A multi-node canary's LeaderWorkerSet: the candidate's groups (`rollout.canary.candidate`)."""

SET_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
"""Set by LWS on every pod of a set: the set's name (SetNameLabelKey, v0.10.0)."""

WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
"""A hash LWS puts on every pod of one group (and only that group's)."""
ZONE_LABEL = "topology.kubernetes.io/zone"
"""Set by LWS's pod webhook on every pod of a group: 0 on the leader (sigs.k8s.io/lws api/.../v1,
WorkerIndexLabelKey, v0.10.0)."""

RESTART_POLICY = "RecreateGroupAfterStart"
"""A failed member after the group started recreates the whole group: vLLM cannot take a new process
into a formed torch.distributed/NCCL world, so a lone restarted worker would wait forever and the
leader's engine would stay broken. While any member is still Pending (a node being added, a 10–25 GB
image pulling) a restart is not turned into a group recreation (LWS v0.9.0 made this a field), so the
leader's rendezvous timing out while a worker's node is still coming does not restart the group in a
loop; `RecreateGroupOnPodRestart` would."""

STARTUP_POLICY = "LeaderCreated"
"""Workers are created as soon as the leader pod exists. `LeaderReady` would deadlock: the leader's
readiness is vLLM's /health, which answers only once every worker joined the engine."""

SUBDOMAIN_POLICY = "UniquePerReplica"


NCCL_NETWORK = "AWS Libfabric"
"""`NCCL_NET`: NCCL must use the aws-ofi-nccl plugin's network or fail. This is the start-up check that
fails loudly: without it NCCL silently falls back to its socket transport (TCP) when the plugin, the
libfabric EFA provider or the EFA devices are missing; with it NCCL's init fails ("Failed to initialize
any NET plugin" / network not found) and the group never becomes ready. "AWS Libfabric" is the name
every aws-ofi-nccl release answers to ("Libfabric" only from 1.12, aws/aws-ofi-nccl#530)."""


HOST_ADDRESS_ENV = "VLLM_HOST_IP"
"""The address a member gives the others for vLLM's own channels between nodes (the multi-node
executor's message queues, over ZeroMQ): the pod's IP, from the downward API. Without it vLLM guesses
from the default route (`vllm.utils.network_utils.get_ip`) and, where it finds none, offers 0.0.0.0,
which the other members cannot reach."""


def host_address_environment() -> list[dict[str, Any]]:
    """`VLLM_HOST_IP` = the pod's IP, on every member of a group (the kubelet fills it in)."""
    return [{"name": HOST_ADDRESS_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]


def efa_environment(device_rdma: bool) -> list[dict[str, str]]:
    """libfabric and NCCL settings of every member of a multi-node group, sorted by name."""
    settings = {
        # libfabric's EFA provider only: no silent choice of the TCP or shm providers.
        "FI_PROVIDER": "efa",
        # GPUDirect RDMA from the GPU to the EFA device where the type's EFA has RDMA read (p4d and
        # later); on g5/g6/g6e the provider aborts when asked for it (fi_efa(7); issue 50), so it is
        # told not to use it (domain/catalogue/efa_interfaces.yaml `efa_device_rdma`).
        "FI_EFA_USE_DEVICE_RDMA": "1" if device_rdma else "0",
        # Decided (issue 50): no huge pages. The provider maps its bounce buffers on huge pages by
        # default, but a pod that requests no `hugepages-2Mi` has a hugetlb limit of 0 in its cgroup,
        # where touching such a page kills the process (SIGBUS) instead of failing the map; requesting
        # them would need every EFA node, managed or Karpenter, to reserve huge pages at boot and each
        # member to request them. NCCL's transfers go GPU to NIC (above) and do not use those buffers,
        # so their cost is a little more CPU on the provider's own small messages.
        "FI_EFA_USE_HUGE_PAGE": "0",
        "NCCL_NET": NCCL_NETWORK,
    }
    return [{"name": name, "value": value} for name, value in sorted(settings.items())]


def serving_selector_labels(model: ModelConfig) -> dict[str, str]:
    """Labels of the pods that serve the model's API: every pod of a one-node model, only the group
    leaders of a multi-node one (the Service, the router's discovery). Workers run `--headless`."""
    labels = model_selector_labels(model.name)
    return {**labels, WORKER_INDEX_LABEL: "0"} if model.is_multi_node else labels


def leader_pods_pattern(set_name: str) -> str:
    """The names of a set's leaders, `<set>-<group>` (its workers are `<set>-<group>-<worker>`), as a
    regular expression for a PromQL `pod=~` matcher."""
    return f"{set_name}-[0-9]+"


def track_selector_labels(model: ModelConfig, set_name: str) -> dict[str, str]:
    """The leaders of one of a multi-node canary's sets: what `vllm-stable` and `vllm-canary` select."""
    return {**serving_selector_labels(model), SET_NAME_LABEL: set_name}


def _member_template(
    config: PlatformConfig, model: ModelConfig, template: dict[str, Any], *, leader: bool
) -> dict[str, Any]:
    member = copy.deepcopy(template)
    spec = member["spec"]
    # One pod per node: the pod asks for every GPU of the node already; the anti-affinity also keeps
    # two members off one node while the device plugin has not registered GPUs yet.
    spec.pop("topologySpreadConstraints", None)
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": model_selector_labels(model.name)},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        },
        # Every member in the zone of the group's other members (issue 50): EFA does not cross zones,
        # and in mode `existing` (or a pool over several subnets) nothing else kept a group together;
        # the deploy test found all three groups of a stack split. `matchLabelKeys` adds the pod's own
        # group key to the selector (beta, on by default since Kubernetes 1.31), so groups stay free
        # to land in different zones; the first member places itself, the scheduler's rule for a
        # pod that matches its own affinity term.
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": model_selector_labels(model.name)},
                    "matchLabelKeys": [GROUP_KEY_LABEL],
                    "topologyKey": ZONE_LABEL,
                }
            ]
        },
    }
    server = spec["containers"][0]  # the vLLM container (vllm_pod.server_container)
    efa = str(efa_interfaces_per_node(config, model.gpu_group))
    for kind in ("requests", "limits"):
        server["resources"][kind][EFA_RESOURCE] = efa
    server["env"] = [
        *server["env"],
        *host_address_environment(),
        *efa_environment(efa_device_rdma(config, model.gpu_group)),
    ]
    if not leader:
        # --headless: no API server, so nothing answers HTTP. A worker whose engine dies exits (its
        # MultiprocExecutor's monitor), its restart recreates the group (RESTART_POLICY), and the
        # leader's /health liveness fails when a remote rank hangs the engine.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            server.pop(probe, None)
        server.pop("ports", None)
        # The worker outlives the leader's whole drain (issue 50): a group's pods are deleted together
        # (scale-in, update, a member evicted and the group recreated), and a worker that stopped
        # after the leader's preStop sleep alone took a rank from the leader's engine while its streams
        # were still finishing. It sleeps through the leader's sleep and shutdown timeout, then stops.
        from components.probes import EXIT_MARGIN_SECONDS  # probes -> rollouts -> this module

        drain = model.drain
        leader_drain = drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds
        if leader_drain:
            server["lifecycle"] = {"preStop": {"sleep": {"seconds": leader_drain}}}
        # Its own --shutdown-timeout after that, as on every vLLM pod (the policy pack's drain rule).
        spec["terminationGracePeriodSeconds"] = (
            leader_drain + drain.shutdown_timeout_seconds + EXIT_MARGIN_SECONDS
        )
    return member


def leader_worker_set_spec(
    config: PlatformConfig,
    model: ModelConfig,
    leader_template: dict[str, Any],
    worker_template: dict[str, Any],
    replicas: int | None,
) -> dict[str, Any]:
    """The LeaderWorkerSet's spec for `model` from its pod templates (vllm_pod.pod_template with
    the leader's and a worker's NodeRole.in_pod arguments)."""
    spec: dict[str, Any] = {
        "leaderWorkerTemplate": {
            "size": model.nodes_per_replica,
            "restartPolicy": RESTART_POLICY,
            "leaderTemplate": _member_template(config, model, leader_template, leader=True),
            "workerTemplate": _member_template(config, model, worker_template, leader=False),
        },
        "startupPolicy": STARTUP_POLICY,
        # Whole groups, one at a time, in place: a surge group needs nodes_per_replica free GPU nodes,
        # which a GPU group rarely has (the one-node models' surge check, components/rollouts.py, does
        # not apply; docs/multi-node.md says what a single-group model loses during an update).
        "rolloutStrategy": {
            "type": "RollingUpdate",
            "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
        },
        # One headless Service per group, named after its leader (`vllm-0`), which LWS creates and
        # LWS_LEADER_ADDRESS names (`vllm-0.vllm-0.<namespace>`). With `Shared`, LWS names its one
        # headless Service after the set, `vllm`, and creates it only if no Service of that name
        # exists (CreateHeadlessServiceIfNotExists, v0.10.0): the model's own ClusterIP Service `vllm`
        # would stand in its place, and DNS publishes `<pod>.<subdomain>` records only for a headless
        # Service, so the workers' `--master-addr` would not resolve and no group would ever form.
        "networkConfig": {"subdomainPolicy": SUBDOMAIN_POLICY},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return spec
