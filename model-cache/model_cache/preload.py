"""`model-cache preload`: source -> shared revision dir -> local revision dir; returns what vLLM loads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from model_cache.completion import LockSettings, ensure_complete
from model_cache.download import DownloadSettings, RevisionDownloader
from model_cache.errors import IntegrityError, UsageError
from model_cache.hf_source import HuggingFaceSource, read_token
from model_cache.jsonlog import log
from model_cache.layout import (
    ensure_adapter_root,
    ensure_compile_cache_dir,
    require_existing_root,
    revision_dir,
)
from model_cache.local_copy import copy_revision
from model_cache.lock import RevisionLock
from model_cache.manifest import Manifest, Verification, VerifyMode, verify_directory
from model_cache.remote import Source
from model_cache.s3_source import S3Source


@dataclass(frozen=True)
class AdapterSpec:
    """A LoRA adapter preloaded beside the model, with the rank the stack declared for it."""

    name: str
    source: str
    revision: str
    rank: int


@dataclass(frozen=True)
class PreloadOptions:
    model_name: str
    source: str
    revision: str
    shared_root: Path
    local_root: Path | None = None
    compile_cache_gpu_type: str | None = None
    compile_cache_vllm_version: str | None = None
    hf_token_file: Path | None = None
    endpoint_url: str | None = None
    verify: VerifyMode = "sizes"
    read_timeout_seconds: float = 60.0
    download: DownloadSettings = field(default_factory=DownloadSettings)
    lock: LockSettings = field(default_factory=LockSettings)
    adapters: tuple[AdapterSpec, ...] = ()


def open_source(options: PreloadOptions) -> Source:
    if options.source.startswith("s3://"):
        return S3Source(
            options.source,
            options.revision,
            endpoint_url=options.endpoint_url,
            concurrency=options.download.concurrency,
            read_timeout_seconds=options.read_timeout_seconds,
            max_attempts=options.download.max_attempts,
        )
    if options.source.startswith("hf://"):
        return HuggingFaceSource(
            options.source,
            options.revision,
            token=read_token(options.hf_token_file),
            read_timeout_seconds=options.read_timeout_seconds,
            endpoint=options.endpoint_url,
        )
    raise UsageError(f"--source {options.source!r} must start with s3:// or hf://")


def _trusted_entries(verification: Verification | None) -> dict:
    if verification is None or verification.manifest is None:
        return {}
    return {entry.path: entry for entry in verification.manifest.files if entry.path in verification.good}


ADAPTER_CONFIG = "adapter_config.json"


def check_adapter_rank(directory: Path, adapter: AdapterSpec) -> None:
    """The adapter's own config (PEFT's adapter_config.json, `r`) must match the declared rank: the
    stack sizes vLLM's `--max-lora-rank` and the GPU reservation from the declared one."""
    config_file = directory / ADAPTER_CONFIG
    try:
        declared = json.loads(config_file.read_text()).get("r")
    except (OSError, ValueError) as error:
        raise IntegrityError(
            f"integrity: adapter {adapter.name}: no readable {ADAPTER_CONFIG}: {error}"
        ) from None
    if declared != adapter.rank:
        raise IntegrityError(
            f"integrity: adapter {adapter.name} has rank r={declared} in {ADAPTER_CONFIG}, but the stack "
            f"declares rank {adapter.rank}; correct the rank in the stack file"
        )


def preload_adapters(options: PreloadOptions) -> list[Path]:
    """Each adapter like a model revision of its own (same lock, marker, checksums and resume) under
    `.lora-adapters/<model>/` on both volumes; returns the directories vLLM loads them from."""
    served = []
    for adapter in options.adapters:
        adapter_options = replace(
            options,
            model_name=adapter.name,
            source=adapter.source,
            revision=adapter.revision,
            shared_root=ensure_adapter_root(options.shared_root, options.model_name),
            local_root=ensure_adapter_root(options.local_root, options.model_name)
            if options.local_root
            else None,
            compile_cache_gpu_type=None,
            compile_cache_vllm_version=None,
            adapters=(),
        )
        directory = preload_revision(adapter_options)
        check_adapter_rank(directory, adapter)
        log("adapter_ready", adapter=adapter.name, revision=adapter.revision, dir=str(directory))
        served.append(directory)
    return served


def preload(options: PreloadOptions) -> Path:
    """The model's revision, then its adapters; returns the directory vLLM loads the model from."""
    model_dir = preload_revision(options)
    preload_adapters(options)
    return model_dir


def preload_revision(options: PreloadOptions) -> Path:
    shared_root = require_existing_root(options.shared_root, "--shared-root")
    shared_dir = revision_dir(shared_root, options.model_name, options.revision)
    local_dir = None
    if options.local_root is not None:
        local_dir = revision_dir(
            require_existing_root(options.local_root, "--local-root"), options.model_name, options.revision
        )

    if (options.compile_cache_gpu_type is None) != (options.compile_cache_vllm_version is None):
        raise UsageError("--compile-cache-gpu-type and --compile-cache-vllm-version go together")
    if options.compile_cache_gpu_type and options.compile_cache_vllm_version:
        cache_dir = ensure_compile_cache_dir(
            shared_root,
            options.model_name,
            options.compile_cache_gpu_type,
            options.compile_cache_vllm_version,
        )
        log("compile_cache_dir", dir=str(cache_dir))

    # A node that already holds this revision serves it without touching EFS or the source.
    if local_dir is not None:
        local_check = verify_directory(local_dir, options.verify)
        if local_check.ok:
            log("revision_valid", copy="local", dir=str(local_dir), verify=options.verify)
            return local_dir

    def fill_shared(lock: RevisionLock, previous: Verification | None) -> Manifest:
        source = open_source(options)
        files = source.list_files()
        log("source_listed", source=source.uri, files=len(files), bytes=sum(f.size for f in files))
        downloader = RevisionDownloader(source, shared_dir, options.download)
        report = downloader.run(files, _trusted_entries(previous), lock.lost, lock.report_progress)
        log(
            "download_done",
            source=source.uri,
            bytes_downloaded=report.bytes_downloaded,
            bytes_resumed=report.bytes_resumed,
            bytes_reused=report.bytes_reused,
            files_downloaded=report.files_downloaded,
            files_reused=report.files_reused,
            files_refetched_after_check=report.files_refetched_after_check,
            seconds=round(report.seconds, 2),
            mib_per_s=round(report.bytes_downloaded / 1048576 / max(report.seconds, 1e-6), 1),
        )
        return Manifest(options.model_name, options.revision, source.uri, tuple(report.entries))

    shared = ensure_complete(shared_dir, options.verify, options.lock, fill_shared, label="shared")
    if local_dir is None:
        return shared_dir

    def fill_local(lock: RevisionLock, previous: Verification | None) -> Manifest:
        # Only files the old local marker vouched for *with the same content* as the shared copy.
        shared_entries = set(shared.manifest.files)
        reusable = (
            {e.path for e in previous.manifest.files if e.path in previous.good and e in shared_entries}
            if previous is not None and previous.manifest is not None
            else set()
        )
        copy_revision(
            shared_dir, shared.manifest, local_dir, options.verify, reusable, options.download.concurrency
        )
        return shared.manifest

    ensure_complete(local_dir, options.verify, options.lock, fill_local, label="local")
    return local_dir
