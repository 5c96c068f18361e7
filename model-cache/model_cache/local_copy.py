"""Copy a verified shared revision to node-local NVMe, where vLLM loads it several times faster.

Files are copied in parallel (EFS throughput grows with parallel streams) to `.part` names, fsync'ed
and renamed; files already present with the manifest's size (and sha256 when asked) are kept.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from model_cache.checksums import ExpectedDigests, check_file
from model_cache.download import PART_SUFFIX
from model_cache.errors import DiskFull, IntegrityError
from model_cache.jsonlog import log
from model_cache.layout import free_bytes
from model_cache.manifest import MARKER_NAME, Manifest, ManifestEntry, VerifyMode, fsync_directory

MIB = 1024 * 1024


def _copy_one(source_dir: Path, target_dir: Path, entry: ManifestEntry, verify_mode: VerifyMode) -> int:
    target = target_dir / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + PART_SUFFIX)
    # copyfile uses sendfile(2) on Linux: no user-space buffers, memory stays flat.
    shutil.copyfile(source_dir / entry.path, part)
    descriptor = os.open(part, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    if verify_mode == "sha256":
        problems = check_file(part, entry.size, ExpectedDigests(sha256=entry.sha256)).problems
    else:
        size = part.stat().st_size
        problems = [] if size == entry.size else [f"size {size} != manifest {entry.size}"]
    if problems:
        part.unlink(missing_ok=True)
        raise IntegrityError(f"integrity: local copy of {entry.path} does not match: {'; '.join(problems)}")
    os.rename(part, target)
    return entry.size


def copy_revision(
    shared_dir: Path,
    manifest: Manifest,
    local_dir: Path,
    verify_mode: VerifyMode,
    reusable: set[str],
    concurrency: int,
) -> int:
    """Make `local_dir` hold exactly the manifest's files. Returns bytes copied. No marker."""
    started = time.monotonic()
    local_dir.mkdir(parents=True, exist_ok=True)
    to_copy = []
    for entry in manifest.files:
        target = local_dir / entry.path
        if entry.path in reusable and target.is_file() and target.stat().st_size == entry.size:
            continue
        to_copy.append(entry)
    needed = sum(entry.size for entry in to_copy)
    available = free_bytes(local_dir)
    if needed > available:
        raise DiskFull(f"disk full: {local_dir} needs {needed / MIB:.1f} MiB, {available / MIB:.1f} MiB free")
    copied = 0
    with ThreadPoolExecutor(max(1, min(concurrency, 8)), thread_name_prefix="copy") as pool:
        for size in pool.map(lambda entry: _copy_one(shared_dir, local_dir, entry, verify_mode), to_copy):
            copied += size
    listed = {entry.path for entry in manifest.files}
    for root, _dirs, names in os.walk(local_dir):
        for name in names:
            relative = (Path(root) / name).relative_to(local_dir).as_posix()
            if relative not in listed and name != MARKER_NAME:
                (Path(root) / name).unlink()
                log("removed_unexpected_file", copy="local", path=relative)
    for directory in {(local_dir / entry.path).parent for entry in manifest.files}:
        fsync_directory(directory)
    elapsed = max(time.monotonic() - started, 1e-6)
    log(
        "local_copy_done",
        files_copied=len(to_copy),
        files_kept=len(manifest.files) - len(to_copy),
        bytes_copied=copied,
        mib_per_s=round(copied / MIB / elapsed, 1),
        elapsed_s=round(elapsed, 2),
    )
    return copied
