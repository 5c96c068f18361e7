"""Where things live on the shared and local volumes. Pure functions, no I/O except `ensure_*`.

<shared-root>/<model-name>/<revision>/             shared copy (EFS), filled from the source
<shared-root>/<model-name>/<revision>.lock         download lock for that revision
<local-root>/<model-name>/<revision>/              node-local copy (NVMe) that vLLM loads
<shared-root>/.vllm-cache/<model>/<gpu>/<vllm>/     vLLM compile cache (VLLM_CACHE_ROOT)
<root>/.lora-adapters/<model>/<adapter>/<revision>/  a LoRA adapter of the model (shared and local)
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from model_cache.errors import SourceNotFound, UsageError

# One path component each: no separators, no leading dot (that namespace is ours: .vllm-cache,
# markers), so a model name or revision can never escape or shadow the layout.
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,199}$")

COMPILE_CACHE_DIR_NAME = ".vllm-cache"
ADAPTERS_DIR_NAME = ".lora-adapters"


def validate_component(value: str, what: str) -> str:
    if not _COMPONENT.match(value) or value in {".", ".."}:
        raise UsageError(
            f"{what} {value!r} must be one path component of letters, digits, '.', '_', '+', '-' "
            "and must not start with '.'"
        )
    return value


def revision_dir(root: Path, model_name: str, revision: str) -> Path:
    return root / validate_component(model_name, "model name") / validate_component(revision, "revision")


def adapter_root(root: Path, model_name: str) -> Path:
    """The root under which `revision_dir(adapter_root(...), adapter, revision)` holds an adapter.

    In the dot namespace, so an adapter can never collide with a model or one of its revisions.
    """
    return root / ADAPTERS_DIR_NAME / validate_component(model_name, "model name")


def ensure_adapter_root(root: Path, model_name: str) -> Path:
    path = adapter_root(root, model_name)
    path.mkdir(parents=True, exist_ok=True, mode=0o775)  # group-writable, as the compile cache
    return path


def lock_path(model_dir: Path) -> Path:
    return model_dir.with_name(model_dir.name + ".lock")


def compile_cache_dir(shared_root: Path, model_name: str, gpu_type: str, vllm_version: str) -> Path:
    """The VLLM_CACHE_ROOT for one model on one GPU type with one vLLM version.

    Compiled graphs are only valid for the same model, GPU and vLLM build; keying the directory on
    all three lets the second replica reuse the first one's compilation and never a wrong one.
    """
    return (
        shared_root
        / COMPILE_CACHE_DIR_NAME
        / validate_component(model_name, "model name")
        / validate_component(gpu_type, "GPU type")
        / validate_component(vllm_version, "vLLM version")
    )


def ensure_compile_cache_dir(shared_root: Path, model_name: str, gpu_type: str, vllm_version: str) -> Path:
    path = compile_cache_dir(shared_root, model_name, gpu_type, vllm_version)
    # Group-writable: vLLM may run under another uid than this init container but shares fsGroup.
    path.mkdir(parents=True, exist_ok=True, mode=0o775)
    return path


def safe_relative_path(relative: str, source_uri: str) -> PurePosixPath:
    """Reject object names that would write outside the revision directory."""
    path = PurePosixPath(relative)
    if not relative or path.is_absolute() or any(part in {"", ".", ".."} for part in relative.split("/")):
        raise SourceNotFound(f"refusing unsafe object name {relative!r} under {source_uri}")
    return path


def require_existing_root(path: Path, flag: str) -> Path:
    if not path.is_dir():
        raise UsageError(f"{flag} {path} is not a directory (is the volume mounted?)")
    return path


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize
