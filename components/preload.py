"""What the preloader (the init container `model-cache preload`, model-cache/) and the vLLM server agree on:
the shared model volume and where weights and compile caches lie on it, and the preloader's arguments."""

from __future__ import annotations

from components import secrets
from domain.config.errors import Problem
from domain.config.models import ModelConfig, ModelSourceConfig
from domain.config.platform import PlatformConfig
from domain.versions import VLLM_VERSION

MODEL_VOLUME_STORAGE_CLASS = "efs-sc"
"""StorageClass of the shared model volume: EFS (RWX), created by the cluster add-ons."""
MODEL_VOLUME_CLAIM = "model-cache"
SHARED_ROOT = "/mnt/models"
LOCAL_ROOT = "/mnt/local-models"
LOCAL_MODELS_DIR = "vllm-models"
"""Directory under a GPU node's NVMe mount (node_groups.gpu.<g>.local_nvme.mount_path) that the
node bootstrap creates for model copies."""
COMPILE_CACHE_DIR = ".vllm-cache"


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
