"""The guarded fill of one revision directory, used for both the shared and the local copy:

valid marker?  -> reuse
else lock      -> re-check, remove any stale marker, fill, check the lock is still ours, marker
else wait      -> report progress until the holder finishes, fails, or goes stale (take over)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from model_cache.jsonlog import log
from model_cache.layout import lock_path
from model_cache.lock import LockState, RevisionLock, wait_for_lock_change
from model_cache.manifest import (
    MARKER_NAME,
    Manifest,
    Verification,
    VerifyMode,
    read_marker,
    remove_marker,
    verify_directory,
    write_marker,
)

Fill = Callable[[RevisionLock, Verification | None], Manifest]


@dataclass(frozen=True)
class LockSettings:
    ttl_seconds: float = 60.0
    wait_timeout_seconds: float = 3600.0
    progress_interval_seconds: float = 5.0


@dataclass(frozen=True)
class Completion:
    manifest: Manifest
    filled_here: bool


def bytes_on_disk(directory: Path) -> int:
    """Allocated bytes under `directory` (st_blocks, so sparse .part files count what is written)."""
    total = 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def _read_marker_bytes(directory: Path) -> bytes | None:
    try:
        return (directory / MARKER_NAME).read_bytes()
    except FileNotFoundError:
        return None


def ensure_complete(
    directory: Path, verify_mode: VerifyMode, lock_settings: LockSettings, fill: Fill, label: str
) -> Completion:
    deadline = time.monotonic() + lock_settings.wait_timeout_seconds
    lock = RevisionLock(lock_path(directory), lock_settings.ttl_seconds)
    checked: tuple[bytes, Verification] | None = None

    def current_verification() -> Verification | None:
        nonlocal checked
        raw = _read_marker_bytes(directory)
        if raw is None:
            return None
        # The same marker bytes were already verified: do not hash the whole model twice.
        if checked is None or checked[0] != raw:
            checked = (raw, verify_directory(directory, verify_mode))
        return checked[1]

    while True:
        verification = current_verification()
        if verification is not None and verification.ok:
            assert verification.manifest is not None
            log("revision_valid", copy=label, dir=str(directory), verify=verify_mode)
            return Completion(verification.manifest, filled_here=False)
        if lock.try_acquire():
            try:
                verification = current_verification()
                if verification is not None and verification.ok:
                    assert verification.manifest is not None
                    return Completion(verification.manifest, filled_here=False)
                if verification is not None:
                    log("revision_invalid", level="warning", copy=label, problems=verification.problems[:20])
                directory.mkdir(parents=True, exist_ok=True)
                remove_marker(directory)
                manifest = fill(lock, verification)
                lock.ensure_held()
                write_marker(directory, manifest)
                log("marker_written", copy=label, dir=str(directory), files=len(manifest.files))
                return Completion(read_marker(directory) or manifest, filled_here=True)
            finally:
                lock.release()

        def report(state: LockState | None, unchanged_seconds: float) -> None:
            log(
                "lock_wait",
                copy=label,
                lock=str(lock.path),
                owner=state.owner if state else None,
                owner_bytes_done=state.bytes_done if state else None,
                owner_bytes_total=state.bytes_total if state else None,
                bytes_on_disk=bytes_on_disk(directory),
                heartbeat_unchanged_s=round(unchanged_seconds, 1),
            )

        outcome = wait_for_lock_change(
            lock.path,
            lock_settings.ttl_seconds,
            deadline,
            report,
            lock_settings.progress_interval_seconds,
        )
        log("lock_wait_over", copy=label, outcome=outcome)
