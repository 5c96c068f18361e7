"""One served model: its namespace and everything in it, from the typed config and the capacity plan.

    Namespace vllm-<model> (labels, GPU ResourceQuota, LimitRange, default-deny NetworkPolicies)
    ├── ServiceAccount vllm (IRSA role from the AWS layer)
    ├── SecretProviderClass vllm-api-key (→ synced Secret vllm-api-key), or with tenants
    │   vllm-tenant-keys (their keys as files); vllm-hf-token (gated HF repos)
    ├── ConfigMap vllm-platform-auth: the API-key middleware vLLM loads (components/server_auth.py)
    ├── PersistentVolumeClaim model-cache (RWX, EFS): weights per revision + vLLM compile cache
    ├── Deployment vllm: init container `model-cache preload` → vLLM server
    │   (or, with rollout.strategy canary, Rollout vllm with the same pod template, Services
    │   vllm-stable and vllm-canary, AnalysisTemplate vllm-canary: components/rollouts.py)
    ├── Service vllm, PodDisruptionBudget vllm, Ingress vllm (when ingress is on)
    └── HPA or KEDA ScaledObject vllm (components/autoscaling.py) when autoscaling is on

The manifests are built by pure functions below (and in vllm_arguments, probes, secrets,
network_policy); `ModelService` only turns them into resources. docs/serving.md explains each choice.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components import karpenter, leader_worker_set, load_balancer, probes, rollouts, secrets, server_auth
from components.autoscaling import (
    autoscaler_owns_replicas,
    create_model_autoscaler,
    replicas_at_creation,
)
from components.monitoring import prometheus_url
from components.network_policy import model_network_policies, serving_peers
from components.scheduling import gpu_group_node_selector, gpu_group_tolerations
from components.vllm_arguments import (
    SERVE_COMMAND,
    NodeRole,
    build_server_arguments,
    format_number,
    lora_environment,
    serves_render_endpoints,
    tensor_parallel_environment,
)
from domain.capacity import ModelPlan
from domain.cluster_context import ClusterContext
from domain.config.errors import Problem
from domain.config.models import ModelConfig, ModelSourceConfig
from domain.config.platform import PlatformConfig
from domain.labels import GPU_GROUP_LABEL, MODEL_LABEL, PART_OF, model_labels, model_selector_labels
from domain.service_accounts import model_service_account
from domain.versions import VLLM_VERSION

SERVER_NAME = "vllm"
"""Name of the Deployment, Service, PodDisruptionBudget and Ingress in every model namespace."""
SERVER_CONTAINER = "vllm"
PRELOAD_CONTAINER = "model-cache"

MODEL_VOLUME_STORAGE_CLASS = "efs-sc"
"""StorageClass of the shared model volume: EFS (RWX), created by the cluster add-ons."""
MODEL_VOLUME_CLAIM = "model-cache"
SHARED_ROOT = "/mnt/models"
LOCAL_ROOT = "/mnt/local-models"
LOCAL_MODELS_DIR = "vllm-models"
"""Directory under a GPU node's NVMe mount (node_groups.gpu.<g>.local_nvme.mount_path) that the
node bootstrap creates for model copies."""
COMPILE_CACHE_DIR = ".vllm-cache"
HOME_DIR = "/home/vllm"
TMP_DIR = "/tmp"
RUN_AS_UID = 10001
"""Non-root and above the host's system and login ranges (no clash with a host account's files)."""
RUN_AS_USER = "vllm"

IRSA_SKIP_CONTAINERS_ANNOTATION = "eks.amazonaws.com/skip-containers"

KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"
"""vLLM 0.32.0's uvicorn keep-alive (envs.py, default 5 s)."""
KEEP_ALIVE_MARGIN_SECONDS = 15
"""The server must keep idle connections open longer than the load balancer does, or the ALB reuses
a connection vLLM is closing and answers 502 (AWS: "HTTP 502: target connection error")."""

POD_SECURITY_LABEL = "pod-security.kubernetes.io"

SERVING_PRIORITY_CLASS = "vllm-serving"
SERVING_PRIORITY_VALUE = 1_000_000
"""Above ordinary workloads (0) so a serving pod can preempt batch jobs on GPU nodes; far below
system-node-critical (2000001000), which the GPU device plugin and DCGM exporter keep."""

ALB_SSL_POLICY = load_balancer.ALB_SSL_POLICY


def gib(value: float) -> str:
    return f"{format_number(float(value))}Gi"


def cores(value: float) -> str:
    return format_number(float(value))


# --- paths the preloader and the server agree on --------------------------------------------------


def compile_cache_dir(model: ModelConfig, gpu_type: str) -> str:
    """VLLM_CACHE_ROOT: `<shared-root>/.vllm-cache/<model>/<gpu-type>/<vllm-version>` (model-cache layout)."""
    return f"{SHARED_ROOT}/{COMPILE_CACHE_DIR}/{model.name}/{gpu_type}/{VLLM_VERSION}"


def jit_cache_environment(model: ModelConfig, gpu_type: str) -> list[dict[str, str]]:
    """FlashInfer's and Triton's JIT kernel caches beside the compile cache on the shared volume.

    Measured on the lab H200 (vLLM 0.26.0, 2026-11-29 lab runs: bench/serving/results/RESULTS.md "What
    limits start time" at commit e4331ca): every start, cold or warm, sat 100-130 s silent after CUDA-
    graph capture, in the kernel warm-up that runs the sampler, where FlashInfer (vLLM's top-k/top-p
    sampler) JIT-compiles into $HOME/.cache/flashinfer; HOME is a fresh emptyDir in every pod. Both caches
    key entries by their own version and the GPU architecture, and write under file locks (FlashInfer) or
    by atomic rename (Triton), which hold on NFS (EFS). vLLM points Triton at its compile-cache folder
    once torch.compile runs; TRITON_CACHE_DIR covers eager models and what compiles before that.
    XDG_CACHE_HOME stays in HOME: outlines keeps an SQLite cache there, unsafe on shared NFS.
    """
    root = compile_cache_dir(model, gpu_type)
    return [
        {"name": "FLASHINFER_WORKSPACE_BASE", "value": f"{root}/jit/flashinfer"},
        {"name": "TRITON_CACHE_DIR", "value": f"{root}/jit/triton"},
        *bytecode_cache_environment(model, gpu_type),
    ]


def bytecode_cache_environment(model: ModelConfig, gpu_type: str) -> list[dict[str, str]]:
    """PYTHONPYCACHEPREFIX: Python's bytecode beside the other caches, written once, read by every pod.

    The upstream image carries no .pyc files (vllm-project/vllm#55422, open: "Fresh containers compile
    thousands of Python files during startup") and the root filesystem is read-only, so every process
    of every pod (the CLI, each API server, the engine core) compiled vLLM, torch and transformers from
    source. Measured on the lab H200 (vLLM 0.26.0, bench/startup/RESULTS.md, 2026-12-01-b): before the
    engine starts, 57.2 s (49.1-65.2) without bytecode against 25.5 s (23.2-33.7) with it read from
    the cache folder; `python -X importtime` of the server's modules 32.8 s against 12.3 s. Python
    writes each file by atomic rename and checks it against its source's size and mtime at every import,
    so concurrent pods are safe and a changed image only recompiles; the folder is keyed by vLLM version
    like the rest of VLLM_CACHE_ROOT. Read from the lab's local disk; on EFS each file costs a round
    trip more (not measured).
    """
    return [{"name": "PYTHONPYCACHEPREFIX", "value": f"{compile_cache_dir(model, gpu_type)}/pycache"}]


def served_model_path(model: ModelConfig, local_nvme: bool) -> str:
    """What `model-cache preload` prints as its last line: the node-local copy when there is NVMe."""
    return f"{LOCAL_ROOT if local_nvme else SHARED_ROOT}/{model.name}/{model.source.revision}"


def preload_source(source: ModelSourceConfig) -> str:
    """`--source` for the preloader, which reads `<source>/<revision>/` from S3 (a model's or an
    adapter's source).

    `source.s3_uri` names the revision's own prefix (`s3://bucket/<model>/<revision>/`), so the
    preloader gets its parent; `preload_source_problems` rejects an s3_uri not ending in the revision.
    Hugging Face sources are passed as `hf://org/repo`.
    """
    if source.s3_uri is None:
        return source.uri
    prefix = (source.s3_prefix or "").rstrip("/")
    parent, _, last = prefix.rpartition("/")
    assert last == source.revision, "checked at validate time (preload_source_problems)"
    return f"s3://{source.s3_bucket}/{parent}/" if parent else f"s3://{source.s3_bucket}/"


def preload_source_problems(config: PlatformConfig) -> list[Problem]:
    """The preloader reads `<prefix>/<revision>/`: an s3_uri must end with the revision."""
    problems = []
    for index, model in enumerate(config.models):
        sources: list[tuple[tuple[str | int, ...], ModelSourceConfig]] = [
            (("models", index, "source"), model.source)
        ]
        sources += [
            (("models", index, "lora", "adapters", number, "source"), adapter.source)
            for number, adapter in enumerate(model.lora.adapters if model.lora else [])
        ]
        for at, source in sources:
            if source.s3_uri is None:
                continue
            last = (source.s3_prefix or "").rstrip("/").rpartition("/")[2]
            if last == source.revision:
                continue
            problems.append(
                Problem(
                    (*at, "s3_uri"),
                    source.s3_uri,
                    f"must end with the revision '{source.revision}' "
                    "(s3://<bucket>/<model prefix>/<revision>/): the preloader reads exactly "
                    "<model prefix>/<revision>/ and keys its caches on the revision",
                )
            )
    return problems


def preload_arguments(model: ModelConfig, gpu_type: str, local_nvme: bool) -> list[str]:
    """`model-cache preload ...` (model-cache/model_cache/cli.py)."""
    arguments = [
        "preload",
        "--model-name",
        model.name,
        "--source",
        preload_source(model.source),
        "--revision",
        model.source.revision,
        "--shared-root",
        SHARED_ROOT,
    ]
    if local_nvme:
        arguments += ["--local-root", LOCAL_ROOT]
    arguments += ["--compile-cache-gpu-type", gpu_type, "--compile-cache-vllm-version", VLLM_VERSION]
    if model.needs_hf_token:
        arguments += ["--hf-token-file", secrets.HF_TOKEN_PATH]
    for adapter in model.lora.adapters if model.lora else []:
        # Beside the model on both volumes (vllm_arguments.adapter_path), same lock, marker and
        # checksums; the server container starts only after every one is complete.
        arguments += [
            "--adapter",
            adapter.name,
            preload_source(adapter.source),
            adapter.source.revision,
            str(adapter.rank),
        ]
    return arguments


# --- the pod ----------------------------------------------------------------------------------------


def pod_security_context() -> dict[str, Any]:
    """Both containers as RUN_AS_UID instead of the images' default root (docs/serving.md, "Security
    context", has the measurement). Everything they write is an emptyDir (0777), the EFS access
    point (which maps every caller to its own POSIX user) or the NVMe dir (1777, node bootstrap).
    No fsGroup: on a volume of model weights it means a recursive chown at every start."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_UID,
        "runAsGroup": RUN_AS_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(read_only_root_filesystem: bool) -> dict[str, Any]:
    """No privilege escalation, no capabilities, the runtime's seccomp profile, read-only root; the
    user repeated per container so the container alone shows (and scanners see) that it is not root."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_UID,
        "runAsGroup": RUN_AS_UID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": read_only_root_filesystem,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def user_environment(home: str) -> list[dict[str, str]]:
    """RUN_AS_UID has no passwd entry in the images: `getpass.getuser()` (PyTorch Inductor's cache dir,
    at `import vllm`) raises KeyError unless USER is set, and `~` must point at a writable HOME."""
    return [
        {"name": "HOME", "value": home},
        {"name": "USER", "value": RUN_AS_USER},
        {"name": "LOGNAME", "value": RUN_AS_USER},
    ]


def _volumes(config: PlatformConfig, model: ModelConfig) -> list[dict[str, Any]]:
    group = config.node_groups.gpu[model.gpu_group]
    resources = model.resources
    volumes: list[dict[str, Any]] = [
        # NCCL and the engine's IPC need far more than the runtime's 64 MiB /dev/shm — on every pod,
        # also with one GPU (vLLM's engine core and API server exchange tensors through it).
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": gib(resources.shm_size_gib)}},
        {"name": "models", "persistentVolumeClaim": {"claimName": MODEL_VOLUME_CLAIM}},
        {"name": "home", "emptyDir": {"sizeLimit": gib(resources.scratch_size_gib)}},
        {"name": "tmp", "emptyDir": {"sizeLimit": gib(resources.scratch_size_gib)}},
    ]
    if group.local_nvme.enabled:
        # Type Directory, not DirectoryOrCreate: without the NVMe mount the pod must not start and
        # fill the node's root disk with a copy of the weights.
        volumes.append(
            {
                "name": "local-models",
                "hostPath": {
                    "path": f"{group.local_nvme.mount_path.rstrip('/')}/{LOCAL_MODELS_DIR}",
                    "type": "Directory",
                },
            }
        )
    volumes.append(server_auth.volume())
    store = config.security.secret_store
    # The key folder: the tenants' keys and the operator key. None when neither exists (no operator key,
    # and no tenant may call the model, a validate warning: its pods then answer 401).
    if tenant_keys := secrets.tenant_key_files(config, model):
        volumes.append(secrets.tenant_keys_volume(store, tenant_keys))
    if not config.tenants and (api_key := secrets.api_key_volume(store)) is not None:
        volumes.append(api_key)
    volumes += [v for v in (secrets.hf_token_volume(store, model),) if v]
    return volumes


def preload_container(config: PlatformConfig, model: ModelConfig, gpu_type: str) -> dict[str, Any]:
    local_nvme = config.node_groups.gpu[model.gpu_group].local_nvme.enabled
    resources = model.resources
    mounts = [{"name": "models", "mountPath": SHARED_ROOT}, {"name": "tmp", "mountPath": TMP_DIR}]
    if local_nvme:
        mounts.append({"name": "local-models", "mountPath": LOCAL_ROOT})
    if model.needs_hf_token:
        mounts.append(
            {"name": secrets.HF_TOKEN_VOLUME, "mountPath": secrets.SECRETS_MOUNT_PATH, "readOnly": True}
        )
    return {
        "name": PRELOAD_CONTAINER,
        "image": config.storage.preloader_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["model-cache"],
        "args": preload_arguments(model, gpu_type, local_nvme),
        "env": [*user_environment(TMP_DIR), {"name": "TMPDIR", "value": TMP_DIR}],
        "resources": {
            "requests": {
                "cpu": cores(resources.preload_cpu_request_cores),
                "memory": gib(resources.preload_memory_request_gib),
            },
            "limits": {"memory": gib(resources.preload_memory_limit_gib)},
        },
        "securityContext": container_security_context(read_only_root_filesystem=True),
        "volumeMounts": mounts,
    }


def keep_alive_environment(config: PlatformConfig) -> list[dict[str, str]]:
    if not config.ingress.enabled:
        return []
    seconds = config.ingress.idle_timeout_seconds + KEEP_ALIVE_MARGIN_SECONDS
    return [{"name": KEEP_ALIVE_ENV, "value": str(seconds)}]


def server_container(
    config: PlatformConfig, model: ModelConfig, plan: ModelPlan, node_role: NodeRole | None = None
) -> dict[str, Any]:
    local_nvme = config.node_groups.gpu[model.gpu_group].local_nvme.enabled
    resources = model.resources
    gpus = str(model.gpus_per_replica)
    limits = {"memory": gib(resources.memory_limit_gib), "nvidia.com/gpu": gpus}
    if resources.cpu_limit_cores is not None:
        limits["cpu"] = cores(resources.cpu_limit_cores)
    # With tenants, their keys are files the middleware re-reads (a rotated key needs no restart);
    # VLLM_API_KEY would also switch vLLM's own single-key check on, which refuses every tenant key.
    own_key = [] if config.tenants else [secrets.api_key_env(config.security.secret_store, model)]
    env = [
        *own_key,
        # Weights come only from the preloaded copy: no hub look-ups (egress is closed anyway).
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "TRANSFORMERS_OFFLINE", "value": "1"},
        {"name": "VLLM_CACHE_ROOT", "value": compile_cache_dir(model, plan.gpu_model)},
        # JIT kernels too, or every new replica spends ~2 minutes recompiling them.
        *jit_cache_environment(model, plan.gpu_model),
        # Everything else vLLM and CUDA cache goes under HOME or TMPDIR.
        *user_environment(HOME_DIR),
        {"name": "TMPDIR", "value": TMP_DIR},
        {"name": "VLLM_NO_USAGE_STATS", "value": "1"},
        {"name": "DO_NOT_TRACK", "value": "1"},
        *server_auth.environment(config, model),
        *keep_alive_environment(config),
        # Tensor parallelism (gpus_per_replica > 1): vllm.nccl_env and the FlashInfer all-reduce backend.
        *tensor_parallel_environment(model),
        # lora.runtime_loading: /v1/load_lora_adapter, behind the key like every route (docs/lora.md).
        *lora_environment(model),
    ]
    mounts = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        # Read-write: the compile cache lives here; the weights are read from here without NVMe.
        {"name": "models", "mountPath": SHARED_ROOT},
        {"name": "home", "mountPath": HOME_DIR},
        {"name": "tmp", "mountPath": TMP_DIR},
        server_auth.volume_mount(),
    ]
    if local_nvme:
        mounts.append({"name": "local-models", "mountPath": LOCAL_ROOT, "readOnly": True})
    if secrets.tenant_key_files(config, model):
        mounts.append(secrets.tenant_keys_volume_mount())
    if not config.tenants and secrets.uses_csi(config.security.secret_store):
        mounts.append(
            {"name": secrets.API_KEY_VOLUME, "mountPath": secrets.SECRETS_MOUNT_PATH, "readOnly": True}
        )
    container: dict[str, Any] = {
        "name": SERVER_CONTAINER,
        "image": model.serving_image,
        "imagePullPolicy": "IfNotPresent",
        "command": list(SERVE_COMMAND),
        "args": build_server_arguments(
            model,
            served_model_path(model, local_nvme),
            render_endpoints=serves_render_endpoints(config, model),
            adapter_root=LOCAL_ROOT if local_nvme else SHARED_ROOT,
            tenants=bool(config.tenants),
            node_role=(
                dataclasses.replace(node_role, join_timeout_seconds=plan.group_join_timeout_seconds)
                if node_role is not None
                else None
            ),
        ),
        "ports": [{"name": probes.PORT_NAME, "containerPort": model.vllm.port, "protocol": "TCP"}],
        "env": env,
        "resources": {
            # One pod per GPU set: request = limit = tensor-parallel size (extended resources
            # cannot be overcommitted anyway; writing both keeps the intent visible).
            "requests": {
                "cpu": cores(resources.cpu_request_cores),
                "memory": gib(resources.memory_request_gib),
                "nvidia.com/gpu": gpus,
            },
            "limits": limits,
        },
        "startupProbe": probes.startup_probe(
            plan.startup_budget_seconds, model.startup.probe_period_seconds, model.probes.timeout_seconds
        ),
        "readinessProbe": probes.readiness_probe(model),
        "livenessProbe": probes.liveness_probe(model),
        "securityContext": container_security_context(model.read_only_root_filesystem),
        "volumeMounts": mounts,
    }
    lifecycle = probes.pre_stop_hook(model.drain)
    if lifecycle is not None:
        container["lifecycle"] = lifecycle
    return container


def _spread(topology_key: str, model: ModelConfig) -> dict[str, Any]:
    # ScheduleAnyway: GPU capacity is often in one zone only (capacity blocks, ODCRs, spot pools);
    # DoNotSchedule would leave replicas Pending next to idle GPUs. matchLabelKeys counts only the
    # pods of the same revision, so old pods being replaced do not skew the spread (a Rollout's
    # pods carry rollouts-pod-template-hash instead of pod-template-hash). No nodeTaintsPolicy
    # (the router's needs Honor): the nodeSelector already limits the zones counted to the group's
    # nodes, whose taints the pods tolerate, and ScheduleAnyway only scores, so Honor would change
    # no placement but restart every model's pods on the next `up`.
    return {
        "maxSkew": 1,
        "topologyKey": topology_key,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": model_selector_labels(model.name)},
        "matchLabelKeys": [rollouts.pod_template_hash_label(model)],
    }


def pod_template(
    config: PlatformConfig,
    model: ModelConfig,
    plan: ModelPlan,
    service_account: str,
    node_role: NodeRole | None = None,
) -> dict[str, Any]:
    group = config.node_groups.gpu[model.gpu_group]
    return {
        "metadata": {
            "labels": {**model_labels(model.name), GPU_GROUP_LABEL: model.gpu_group},
            "annotations": {
                "kubectl.kubernetes.io/default-container": SERVER_CONTAINER,
                server_auth.CHECKSUM_ANNOTATION: server_auth.module_checksum(),
                # IRSA credentials only for the preloader, which reads S3: the server
                # container needs none (EKS pod identity webhook).
                IRSA_SKIP_CONTAINERS_ANNOTATION: SERVER_CONTAINER,
                # On a Karpenter pool: no consolidation or drift ever evicts a serving pod
                # (components/karpenter.py, docs/autoscaling.md "Karpenter GPU pools").
                **karpenter.serving_pod_annotations(group),
            },
        },
        "spec": {
            "serviceAccountName": service_account,
            # The pods never call the Kubernetes API; IRSA and the CSI driver get their own tokens.
            "automountServiceAccountToken": False,
            # A Service named `vllm` would inject VLLM_PORT=tcp://... which vLLM parses as its own
            # integer setting and crashes on; the pods need no service environment variables.
            "enableServiceLinks": False,
            "priorityClassName": SERVING_PRIORITY_CLASS,
            "terminationGracePeriodSeconds": probes.termination_grace_period_seconds(model.drain),
            "nodeSelector": gpu_group_node_selector(model.gpu_group),
            "tolerations": gpu_group_tolerations(group),
            "topologySpreadConstraints": [
                _spread("topology.kubernetes.io/zone", model),
                _spread("kubernetes.io/hostname", model),
            ],
            "securityContext": pod_security_context(),
            "initContainers": [preload_container(config, model, plan.gpu_model)],
            "containers": [server_container(config, model, plan, node_role)],
            "volumes": _volumes(config, model),
        },
    }


def deployment_spec(
    config: PlatformConfig, model: ModelConfig, plan: ModelPlan, service_account: str
) -> dict[str, Any]:
    """The Deployment's spec; a canary model's Rollout takes it whole but for the strategy."""
    spec: dict[str, Any] = {
        "selector": {"matchLabels": model_selector_labels(model.name)},
        "strategy": probes.rollout_strategy(model).as_spec(),
        "progressDeadlineSeconds": probes.progress_deadline_seconds(plan.startup_budget_seconds),
        "revisionHistoryLimit": 5,
        "template": pod_template(config, model, plan, service_account),
    }
    # With an HPA or KEDA, the autoscaler owns spec.replicas: setting it on every `up` would reset
    # the replica count (production-stack renders it under KEDA; we do not). A to-zero model sets it
    # at creation only (replicas_at_creation; ModelService ignores it afterwards).
    if not autoscaler_owns_replicas(model):
        spec["replicas"] = model.replicas
    elif (initial := replicas_at_creation(model)) is not None:
        spec["replicas"] = initial
    return spec


def uses_alb_traffic_split(config: PlatformConfig, model: ModelConfig) -> bool:
    """A canary's weights are applied at the ALB when the model has its own ALB Ingress (without one,
    behind the router only, the split is by pod count: docs/rollouts.md)."""
    alb = config.ingress.class_name == "alb"
    return rollouts.uses_canary(model) and serves_own_hostname(config, model) and alb


def uses_group_canary(model: ModelConfig) -> bool:
    """A multi-node canary: a second LeaderWorkerSet, its weight set by the stack (docs/multi-node.md)."""
    return model.is_multi_node and rollouts.uses_canary(model)


def canary_leader_worker_set_spec(
    config: PlatformConfig, model: ModelConfig, candidate_plan: ModelPlan, service_account: str
) -> dict[str, Any] | None:
    """The candidate's LeaderWorkerSet `vllm-canary` (its own source and engine settings, its own
    replicas, never autoscaled), or None when no candidate is given."""
    candidate = model.canary_candidate()
    if candidate is None:
        return None
    assert model.rollout.canary.candidate is not None
    return leader_worker_set.leader_worker_set_spec(
        config,
        candidate,
        pod_template(config, candidate, candidate_plan, service_account, NodeRole.in_pod(leader=True)),
        pod_template(config, candidate, candidate_plan, service_account, NodeRole.in_pod(leader=False)),
        model.rollout.canary.candidate.replicas,
    )


def track_service_spec(model: ModelConfig, track: str) -> dict[str, Any]:
    """`vllm-stable` or `vllm-canary`: a Rollout's (Argo pins the selector) or, for a multi-node canary,
    the leaders of one LeaderWorkerSet (the ALB's two weighted target groups)."""
    spec = service_spec(model)
    if uses_group_canary(model):
        set_name = (
            leader_worker_set.CANARY_SET if track == rollouts.CANARY_SERVICE else leader_worker_set.STABLE_SET
        )
        spec["selector"] = leader_worker_set.track_selector_labels(model, set_name)
    return spec


def workload(
    config: PlatformConfig, model: ModelConfig, plan: ModelPlan, service_account: str
) -> tuple[str, str, dict[str, Any]]:
    """(apiVersion, kind, spec) of what runs the pods: the one place that picks Deployment, Rollout or,
    for a model whose replica spans nodes, LeaderWorkerSet (components/leader_worker_set.py)."""
    if model.is_multi_node:
        return (
            leader_worker_set.LWS_API_VERSION,
            leader_worker_set.LWS_KIND,
            leader_worker_set.leader_worker_set_spec(
                config,
                model,
                pod_template(config, model, plan, service_account, NodeRole.in_pod(leader=True)),
                pod_template(config, model, plan, service_account, NodeRole.in_pod(leader=False)),
                replicas_at_creation(model) if autoscaler_owns_replicas(model) else model.replicas,
            ),
        )
    spec = deployment_spec(config, model, plan, service_account)
    if rollouts.uses_canary(model):
        return (
            rollouts.ROLLOUTS_API_VERSION,
            rollouts.ROLLOUT_KIND,
            rollouts.rollout_spec(model, spec, alb_ingress=uses_alb_traffic_split(config, model)),
        )
    return "apps/v1", "Deployment", spec


# --- around the pod -------------------------------------------------------------------------------


def resource_quota_spec(model: ModelConfig) -> dict[str, Any]:
    return {"hard": {"requests.nvidia.com/gpu": str(probes.gpu_quota(model))}}


def limit_range_spec() -> dict[str, Any]:
    """Defaults for containers that set nothing (debug pods, injected sidecars).

    No default CPU limit: it would also apply to the vLLM container, which has none on purpose, and
    CFS throttling stalls its tokenizer and scheduler loop. No GPU maximum either: LimitRange
    maxima force every container, the init container too, to declare that resource.
    """
    return {
        "limits": [
            {
                "type": "Container",
                "defaultRequest": {"cpu": "100m", "memory": "256Mi"},
                "default": {"memory": "1Gi"},
            }
        ]
    }


def service_spec(model: ModelConfig) -> dict[str, Any]:
    return {
        "type": "ClusterIP",
        # A multi-node model's endpoints are its group leaders only (its workers run --headless).
        "selector": leader_worker_set.serving_selector_labels(model),
        "ports": [
            {
                "name": probes.PORT_NAME,
                "port": model.vllm.port,
                "targetPort": probes.PORT_NAME,
                "protocol": "TCP",
            }
        ],
    }


def pod_disruption_budget_spec(model: ModelConfig) -> dict[str, Any]:
    """Keep `min_available` replicas (a multi-node model's: groups) serving through voluntary
    disruptions — when that leaves room to evict one. At or above the fewest replicas the model runs
    with (a single replica, or an autoscaler at its minimum), a minAvailable would block every node
    drain and node-group upgrade, so the budget becomes one pod at a time (maxUnavailable 1)."""
    floor = probes.replica_floor(model)
    if model.is_multi_node:
        # Groups, not pods (issue 50): a PDB counts pods, one pod lost takes its whole group down (LWS
        # recreates it), and a group's headless workers are Ready whatever its leader does, so a
        # minAvailable in pods let a drain take one member of every group. At most (fewest groups -
        # min_available) pods at a time instead: each takes at most one group, and a group being
        # recreated holds its share of the budget (its leader not Ready) until it serves again.
        budget: dict[str, Any] = {"maxUnavailable": max(1, floor - model.min_available)}
    elif model.min_available < floor:
        budget = {"minAvailable": model.min_available}
    else:
        budget = {"maxUnavailable": 1}
    return {
        **budget,
        "selector": {"matchLabels": model_selector_labels(model.name)},
        # A pod stuck loading (not Ready) never counts as available, so without this a node drain
        # would wait forever on the very pod that cannot become ready.
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def ingress_group_name(config: PlatformConfig) -> str:
    return load_balancer.ingress_group_name(config.cluster.name)


def ingress_annotations(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    annotations = load_balancer_annotations(
        config, probes.HEALTH_PATH, probes.load_balancer_deregistration_delay_seconds(model.drain)
    )
    if uses_group_canary(model) and uses_alb_traffic_split(config, model):
        # The stack sets a multi-node canary's weights: the candidate's, or all to the stable groups.
        weight = rollouts.group_canary_weight(model)
        annotations[rollouts.ALB_ACTION_ANNOTATION] = rollouts.alb_action(model, canary_weight=weight)
    elif uses_alb_traffic_split(config, model):
        # Argo Rollouts rewrites this action with the canary's weights; until it first does, all
        # traffic goes to the stable pods.
        annotations[rollouts.ALB_ACTION_ANNOTATION] = rollouts.initial_alb_action(model)
    return annotations


def load_balancer_annotations(
    config: PlatformConfig, healthcheck_path: str, deregistration_delay_seconds: int
) -> dict[str, str]:
    """The ingress controller's settings for a long-streaming OpenAI backend (models and the router)."""
    ingress = config.ingress
    idle = ingress.idle_timeout_seconds
    if ingress.class_name == "nginx":
        # Same long-stream guarantee on ingress-nginx: no proxy read timeout mid-stream, no buffering.
        return {
            "nginx.ingress.kubernetes.io/proxy-read-timeout": str(idle),
            "nginx.ingress.kubernetes.io/proxy-send-timeout": str(idle),
            "nginx.ingress.kubernetes.io/proxy-buffering": "off",
        }
    if ingress.class_name != "alb":
        return {}
    prefix = "alb.ingress.kubernetes.io"
    annotations = {
        f"{prefix}/scheme": ingress.scheme,
        f"{prefix}/target-type": "ip",
        f"{prefix}/group.name": ingress_group_name(config),
        f"{prefix}/listen-ports": json.dumps([{"HTTPS": 443}]),
        f"{prefix}/ssl-policy": ALB_SSL_POLICY,
        f"{prefix}/backend-protocol": "HTTP",
        f"{prefix}/healthcheck-path": healthcheck_path,
        f"{prefix}/success-codes": "200",
        # SSE streams may sit idle while a request waits in vLLM's queue: never cut them sooner.
        f"{prefix}/load-balancer-attributes": f"idle_timeout.timeout_seconds={idle}",
        f"{prefix}/target-group-attributes": (
            f"deregistration_delay.timeout_seconds={deregistration_delay_seconds}"
        ),
    }
    if ingress.certificate_arn:
        annotations[f"{prefix}/certificate-arn"] = ingress.certificate_arn
    if ingress.inbound_cidrs:
        annotations[f"{prefix}/inbound-cidrs"] = ",".join(ingress.inbound_cidrs)
    if ingress.wafv2_acl_arn:
        annotations[f"{prefix}/wafv2-acl-arn"] = ingress.wafv2_acl_arn
    return annotations


def web_acl_annotation(config: PlatformConfig, web_acl_arn: pulumi.Input[str] | None) -> dict[str, Any]:
    """The tenants' web ACL (infra/aws/tenant_limits.py) on the ALB: every Ingress of the group
    names the same one (validate refuses it beside ingress.wafv2_acl_arn)."""
    if web_acl_arn is None or config.ingress.class_name != "alb":
        return {}
    return {"alb.ingress.kubernetes.io/wafv2-acl-arn": web_acl_arn}


PUBLIC_API_PATH = "/v1"


def ingress_spec(config: PlatformConfig, model: ModelConfig) -> dict[str, Any]:
    assert model.ingress_host is not None  # checked at validate time (ingress_host_problems)
    # With a canary, the ALB forwards through the weighted action Argo keeps on the root Service.
    split = uses_alb_traffic_split(config, model)
    port = {"name": rollouts.ALB_USE_ANNOTATION_PORT if split else probes.PORT_NAME}
    backend = {"service": {"name": SERVER_NAME, "port": port}}
    return {
        "ingressClassName": config.ingress.class_name,
        # Hosts only: the ALB terminates TLS with the ACM certificate (named, or found by host).
        "tls": [{"hosts": [model.ingress_host]}],
        # Only the OpenAI API: vLLM's API key guards /v1 but not /metrics, /tokenize or its admin
        # routes (verified on 0.32.0), so those must never be reachable from outside the cluster.
        "rules": [
            {
                "host": model.ingress_host,
                "http": {"paths": [{"path": PUBLIC_API_PATH, "pathType": "Prefix", "backend": backend}]},
            }
        ],
    }


def platform_labels() -> dict[str, str]:
    return {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/managed-by": "pulumi"}


def pod_security_labels(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    """Pod Security Admission as strict as the pods allow: `restricted`, which they meet (non-root,
    no capabilities, RuntimeDefault seccomp, no privilege escalation) — except that a GPU group with
    local NVMe needs the hostPath volume of the node-local copy, which only `privileged` admits;
    there `restricted` is still audited and warned about, so any other deviation shows."""
    version = f"v{config.cluster.kubernetes_version}"
    enforce = "privileged" if config.node_groups.gpu[model.gpu_group].local_nvme.enabled else "restricted"
    labels = {f"{POD_SECURITY_LABEL}/enforce": enforce, f"{POD_SECURITY_LABEL}/enforce-version": version}
    for mode in ("audit", "warn"):
        labels[f"{POD_SECURITY_LABEL}/{mode}"] = "restricted"
        labels[f"{POD_SECURITY_LABEL}/{mode}-version"] = version
    return labels


def namespace_labels(config: PlatformConfig, model: ModelConfig) -> dict[str, str]:
    labels = {**platform_labels(), MODEL_LABEL: model.name, **pod_security_labels(config, model)}
    if config.ingress.enabled and config.ingress.class_name == "alb":
        # The AWS Load Balancer Controller adds a readiness gate to pods here: a rollout waits until
        # the new pod is healthy in the ALB target group before stopping the next old one.
        labels["elbv2.k8s.aws/pod-readiness-gate-inject"] = "enabled"
    return labels


def in_cluster_url(model: ModelConfig) -> str:
    return f"http://{SERVER_NAME}.{model.namespace}.svc.cluster.local:{model.vllm.port}"


def serves_own_hostname(config: PlatformConfig, model: ModelConfig) -> bool:
    """A model gets its own Ingress unless the router's unified endpoint replaces them
    (router.per_model_hostnames: false), or it scales to zero: the load balancer would answer a
    request for it 503 at once while it has no pod; only the router holds requests while it wakes."""
    own = config.ingress.enabled and (not config.router.enabled or config.router.per_model_hostnames)
    return own and not model.scales_to_zero


def ingress_url(config: PlatformConfig, model: ModelConfig) -> str | None:
    if not serves_own_hostname(config, model) or model.ingress_host is None:
        return None
    return f"https://{model.ingress_host}"


# --- the component ----------------------------------------------------------------------------------


def create_serving_priority_class(
    name: str, opts: pulumi.ResourceOptions
) -> kubernetes.scheduling.v1.PriorityClass:
    """The cluster-scoped PriorityClass every vLLM pod uses; created once by the platform."""
    return kubernetes.scheduling.v1.PriorityClass(
        name,
        metadata={"name": SERVING_PRIORITY_CLASS, "labels": platform_labels()},
        value=SERVING_PRIORITY_VALUE,
        global_default=False,
        preemption_policy="PreemptLowerPriority",
        description="vLLM model servers (vllm-platform): ahead of batch work on GPU nodes.",
        opts=opts,
    )


@dataclass(frozen=True)
class ModelServiceArgs:
    config: PlatformConfig
    model: ModelConfig
    plan: ModelPlan
    """The model's capacity plan: startup budget and GPU model."""
    context: ClusterContext
    depends_on: Sequence[pulumi.Resource] = ()
    """What the objects need first: the PriorityClass, and the add-ons whose CRDs and webhooks they
    use (Secrets Store CSI driver for SecretProviderClass, AWS Load Balancer Controller)."""
    candidate_plan: ModelPlan | None = None
    """The plan of a multi-node canary's candidate (PlatformPlan.candidates), when there is one."""


class ModelService(pulumi.ComponentResource):
    """Everything one model needs to serve, in its own namespace `vllm-<model>`."""

    namespace: str
    deployment: pulumi.CustomResource
    """The workload running the pods: a Deployment, or an Argo Rollouts Rollout for a canary model."""
    autoscaler: pulumi.Resource | None
    deployment_name: str
    in_cluster_url: str
    ingress_url: str | None

    def __init__(self, name: str, args: ModelServiceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:model_service:ModelService", name, None, opts)
        config, model, plan = args.config, args.model, args.plan
        namespace = model.namespace
        labels = model_labels(model.name)

        def meta(object_name: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
            return {"name": object_name, "namespace": namespace, "labels": {**labels, **(extra_labels or {})}}

        namespace_resource = kubernetes.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": namespace, "labels": namespace_labels(config, model)},
            opts=pulumi.ResourceOptions(parent=self),
        )
        inside = pulumi.ResourceOptions(parent=self, depends_on=[namespace_resource])
        after_addons = pulumi.ResourceOptions(parent=self, depends_on=[namespace_resource, *args.depends_on])

        kubernetes.core.v1.ResourceQuota(
            f"{name}-gpu-quota", metadata=meta("gpu-quota"), spec=resource_quota_spec(model), opts=inside
        )
        kubernetes.core.v1.LimitRange(
            f"{name}-limit-range", metadata=meta("container-defaults"), spec=limit_range_spec(), opts=inside
        )
        peers = serving_peers(config, args.context.load_balancer_source_cidrs)
        for policy_name, policy_spec in model_network_policies(config, model, peers):
            kubernetes.networking.v1.NetworkPolicy(
                f"{name}-netpol-{policy_name}", metadata=meta(policy_name), spec=policy_spec, opts=inside
            )

        account = model_service_account(model)
        role_arn = args.context.role_arn_for(account.namespace, account.name)
        account_meta = meta(account.name)
        if role_arn is not None:
            account_meta["annotations"] = {"eks.amazonaws.com/role-arn": role_arn}
        kubernetes.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=account_meta,
            automount_service_account_token=False,
            opts=inside,
        )

        store = config.security.secret_store
        region = config.cluster.region
        # (resource name suffix, SecretProviderClass name, spec): what the pods' CSI volumes mount.
        provider_class_specs: list[tuple[str, str, dict]] = []
        if secrets.uses_csi(store):
            if tenant_keys := secrets.tenant_key_files(config, model):
                spec = secrets.tenant_keys_provider_class_spec(store, tenant_keys, region)
                provider_class_specs.append(("tenant-keys", secrets.TENANT_KEYS_PROVIDER_CLASS, spec))
            if not config.tenants:
                spec = secrets.secret_provider_class_spec(
                    store, secrets.api_key_file(model), region, sync_to_secret=secrets.API_KEY_SECRET_NAME
                )
                provider_class_specs.append(("api-key", secrets.API_KEY_PROVIDER_CLASS, spec))
            if (token := secrets.hf_token_file(model)) is not None:
                spec = secrets.secret_provider_class_spec(store, token, region, sync_to_secret=None)
                provider_class_specs.append(("hf-token", secrets.HF_TOKEN_PROVIDER_CLASS, spec))
        provider_classes: list[pulumi.Resource] = [
            kubernetes.apiextensions.CustomResource(
                f"{name}-{suffix}-provider",
                api_version=secrets.SPC_API_VERSION,
                kind="SecretProviderClass",
                metadata=meta(class_name),
                spec=spec,
                opts=after_addons,
            )
            for suffix, class_name, spec in provider_class_specs
        ]

        auth_module = kubernetes.core.v1.ConfigMap(
            f"{name}-auth-middleware",
            metadata=meta(server_auth.CONFIG_MAP_NAME),
            data=server_auth.config_map_data(config, model),
            opts=inside,
        )

        claim = kubernetes.core.v1.PersistentVolumeClaim(
            f"{name}-model-volume",
            metadata=meta(MODEL_VOLUME_CLAIM),
            spec={
                "accessModes": ["ReadWriteMany"],
                "storageClassName": MODEL_VOLUME_STORAGE_CLASS,
                "resources": {"requests": {"storage": gib(config.storage.model_volume_size_gib)}},
            },
            opts=after_addons,
        )

        # How long `pulumi up` waits for the rollout before reporting it failed.
        rollout_timeout = probes.rollout_timeout_seconds(model, plan.startup_budget_seconds)
        workload_meta = {
            **meta(SERVER_NAME),
            "annotations": {"pulumi.com/timeoutSeconds": str(rollout_timeout)},
        }
        workload_opts = pulumi.ResourceOptions(
            parent=self,
            depends_on=[namespace_resource, claim, auth_module, *provider_classes, *args.depends_on],
            # Set at creation only: afterwards the count is KEDA's (replicas_at_creation).
            ignore_changes=["spec.replicas"] if replicas_at_creation(model) is not None else None,
        )
        api_version, kind, workload_spec = workload(config, model, plan, account.name)
        deployment: pulumi.CustomResource
        if kind == "Deployment":
            deployment = kubernetes.apps.v1.Deployment(
                f"{name}-deployment", metadata=workload_meta, spec=workload_spec, opts=workload_opts
            )
        elif kind == leader_worker_set.LWS_KIND:
            deployment = kubernetes.apiextensions.CustomResource(
                f"{name}-leader-worker-set",
                api_version=api_version,
                kind=kind,
                metadata=workload_meta,
                spec=workload_spec,
                opts=workload_opts,
            )
        else:
            # The analysis its steps run, against the Prometheus the PodMonitor feeds.
            kubernetes.apiextensions.CustomResource(
                f"{name}-canary-analysis",
                api_version=rollouts.ROLLOUTS_API_VERSION,
                kind=rollouts.ANALYSIS_TEMPLATE_KIND,
                metadata=meta(rollouts.ANALYSIS_TEMPLATE),
                spec=rollouts.analysis_template_spec(
                    model.rollout.canary.analysis, namespace, prometheus_url(config.monitoring)
                ),
                opts=after_addons,
            )
            deployment = kubernetes.apiextensions.CustomResource(
                f"{name}-rollout",
                api_version=api_version,
                kind=kind,
                metadata=workload_meta,
                spec=workload_spec,
                opts=workload_opts,
            )
        if uses_group_canary(model):
            self._group_canary(name, args, meta, workload_opts.depends_on, account.name, after_addons)
        kubernetes.core.v1.Service(
            f"{name}-service", metadata=meta(SERVER_NAME), spec=service_spec(model), opts=inside
        )
        if rollouts.uses_canary(model):
            # Argo pins a Rollout's selectors to the stable and canary ReplicaSets: `pulumi up` must not
            # undo it. A multi-node canary's are the stack's own (one LeaderWorkerSet each).
            argo_owned = None if uses_group_canary(model) else ["spec.selector"]
            for service_name in (rollouts.STABLE_SERVICE, rollouts.CANARY_SERVICE):
                kubernetes.core.v1.Service(
                    f"{name}-service-{service_name}",
                    metadata=meta(service_name),
                    spec=track_service_spec(model, service_name),
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[namespace_resource], ignore_changes=argo_owned
                    ),
                )
        kubernetes.policy.v1.PodDisruptionBudget(
            f"{name}-pdb", metadata=meta(SERVER_NAME), spec=pod_disruption_budget_spec(model), opts=inside
        )
        if serves_own_hostname(config, model):
            managed = (
                [
                    f'metadata.annotations["{rollouts.ALB_ACTION_ANNOTATION}"]',
                    f'metadata.annotations["{rollouts.MANAGED_ALB_ACTIONS_ANNOTATION}"]',
                ]
                if uses_alb_traffic_split(config, model) and not uses_group_canary(model)
                else []
            )
            kubernetes.networking.v1.Ingress(
                f"{name}-ingress",
                metadata={
                    **meta(SERVER_NAME),
                    "annotations": {
                        **ingress_annotations(config, model),
                        **web_acl_annotation(config, args.context.web_acl_arn),
                    },
                },
                spec=ingress_spec(config, model),
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[namespace_resource, *args.depends_on], ignore_changes=managed
                ),
            )

        # The HPA or KEDA ScaledObject that owns the Deployment's replicas (none when autoscaling is off).
        self.autoscaler = create_model_autoscaler(
            f"{name}-autoscaler",
            model,
            SERVER_NAME,
            namespace,
            config.monitoring,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[deployment, *args.depends_on]),
        )

        self.namespace = namespace
        self.deployment_name = SERVER_NAME
        self.in_cluster_url = in_cluster_url(model)
        self.ingress_url = ingress_url(config, model)
        self.deployment = deployment
        self.register_outputs(
            {
                "namespace": self.namespace,
                "in_cluster_url": self.in_cluster_url,
                "ingress_url": self.ingress_url,
            }
        )

    def _group_canary(
        self,
        name: str,
        args: ModelServiceArgs,
        meta: Callable[[str], dict[str, Any]],
        depends_on: Any,
        service_account: str,
        after_addons: pulumi.ResourceOptions,
    ) -> None:
        """A multi-node canary's candidate: its LeaderWorkerSet `vllm-canary` and, while it gets traffic,
        the AnalysisRun that judges this weight (docs/multi-node.md, "Canary")."""
        config, model = args.config, args.model
        if args.candidate_plan is None:
            return
        spec = canary_leader_worker_set_spec(config, model, args.candidate_plan, service_account)
        candidate = model.canary_candidate()
        if spec is None or candidate is None:
            return
        timeout = probes.rollout_timeout_seconds(candidate, args.candidate_plan.startup_budget_seconds)
        kubernetes.apiextensions.CustomResource(
            f"{name}-canary-leader-worker-set",
            api_version=leader_worker_set.LWS_API_VERSION,
            kind=leader_worker_set.LWS_KIND,
            metadata={
                **meta(leader_worker_set.CANARY_SET),
                "annotations": {"pulumi.com/timeoutSeconds": str(timeout)},
            },
            spec=spec,
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on),
        )
        if rollouts.group_canary_weight(model) == 0:
            return  # started, serving nothing: nothing to judge yet
        kubernetes.apiextensions.CustomResource(
            f"{name}-canary-analysis-run",
            api_version=rollouts.ROLLOUTS_API_VERSION,
            kind=rollouts.ANALYSIS_RUN_KIND,
            metadata=meta(rollouts.group_analysis_run_name(model)),
            spec=rollouts.group_analysis_run_spec(
                model.rollout.canary.analysis, model.namespace, prometheus_url(config.monitoring)
            ),
            opts=after_addons,
        )
