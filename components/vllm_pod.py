"""The one place a vLLM pod template is built, from a model and its plan (and, in a group, its node's
role): the preloading init container, the server container, security contexts, volumes. Every
workload shape takes it whole (components/workloads.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from components import karpenter, probes, secrets, server_auth
from components.preload import (
    LOCAL_MODELS_DIR,
    LOCAL_ROOT,
    MODEL_VOLUME_CLAIM,
    SHARED_ROOT,
    compile_cache_dir,
    jit_cache_environment,
    preload_arguments,
    served_model_path,
)
from components.scheduling import (
    SERVING_PRIORITY_CLASS,
    gpu_group_node_selector,
    gpu_group_tolerations,
    topology_spread,
)
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
from domain.config.models import ModelConfig
from domain.config.platform import IngressConfig, PlatformConfig
from domain.labels import GPU_GROUP_LABEL, model_labels

SERVER_NAME = "vllm"
"""Name of the Deployment, Service, PodDisruptionBudget and Ingress in every model namespace."""
SERVER_CONTAINER = "vllm"
PRELOAD_CONTAINER = "model-cache"
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


def gib(value: float) -> str:
    return f"{format_number(float(value))}Gi"


def cores(value: float) -> str:
    return format_number(float(value))


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


def keep_alive_environment(ingress: IngressConfig) -> list[dict[str, str]]:
    if not ingress.enabled:
        return []
    seconds = ingress.idle_timeout_seconds + KEEP_ALIVE_MARGIN_SECONDS
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
        *keep_alive_environment(config.ingress),
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
                topology_spread("topology.kubernetes.io/zone", model),
                topology_spread("kubernetes.io/hostname", model),
            ],
            "securityContext": pod_security_context(),
            "initContainers": [preload_container(config, model, plan.gpu_model)],
            "containers": [server_container(config, model, plan, node_role)],
            "volumes": _volumes(config, model),
        },
    }
