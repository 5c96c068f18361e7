"""The completion marker: written last and atomically, it is the only thing that makes a directory
servable. It carries the manifest (relative path, size, sha256 of every file)."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from model_cache.checksums import ExpectedDigests, check_file

MARKER_NAME = ".model-cache-complete.json"
FORMAT_VERSION = 1
VerifyMode = Literal["sizes", "sha256"]


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str
    source_version: str
    """The source's identity of the content (S3 ETag, HF oid) it was fetched as."""


@dataclass(frozen=True)
class Manifest:
    model_name: str
    revision: str
    source: str
    files: tuple[ManifestEntry, ...]
    completed_at: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(entry.size for entry in self.files)

    def to_json(self) -> str:
        data = asdict(self)
        data["files"] = [asdict(entry) for entry in self.files]
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        data = json.loads(text)
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"unknown marker format {data.get('format_version')!r}")
        files = tuple(ManifestEntry(**entry) for entry in data["files"])
        return cls(
            model_name=data["model_name"],
            revision=data["revision"],
            source=data["source"],
            files=files,
            completed_at=data["completed_at"],
        )


def fsync_directory(path: Path) -> None:
    """Make a rename or unlink in `path` durable (needed on local filesystems; harmless on NFS)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_marker(directory: Path, manifest: Manifest) -> None:
    """temp file + fsync + rename + fsync(dir): readers see no marker or a whole one, never half."""
    stamped = Manifest(
        model_name=manifest.model_name,
        revision=manifest.revision,
        source=manifest.source,
        files=tuple(sorted(manifest.files, key=lambda entry: entry.path)),
        completed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    temporary = directory / f"{MARKER_NAME}.tmp-{os.getpid()}"
    with temporary.open("w") as handle:
        handle.write(stamped.to_json())
        handle.flush()
        os.fsync(handle.fileno())
    os.rename(temporary, directory / MARKER_NAME)
    fsync_directory(directory)


def remove_marker(directory: Path) -> None:
    """Invalidate first, before touching any file, so a crash mid-repair leaves nothing 'complete'."""
    try:
        os.unlink(directory / MARKER_NAME)
    except FileNotFoundError:
        return
    fsync_directory(directory)


def read_marker(directory: Path) -> Manifest | None:
    try:
        return Manifest.from_json((directory / MARKER_NAME).read_text())
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class Verification:
    manifest: Manifest | None
    problems: list[str] = field(default_factory=list)
    good: set[str] = field(default_factory=set)
    """Manifest paths that passed the check, reusable as-is by a repair."""

    @property
    def ok(self) -> bool:
        return self.manifest is not None and not self.problems


def _is_own_file(name: str) -> bool:
    return name == MARKER_NAME or name.startswith(f"{MARKER_NAME}.tmp-")


def verify_directory(directory: Path, mode: VerifyMode, workers: int = 4) -> Verification:
    """Marker present and parseable, every listed file with its size (and sha256), nothing extra.

    Extra files fail too: vLLM loads every *.safetensors it finds, so a stray shard is not harmless.
    """
    manifest = read_marker(directory)
    if manifest is None:
        present = (directory / MARKER_NAME).exists()
        return Verification(None, [f"{'unreadable' if present else 'no'} completion marker in {directory}"])
    result = Verification(manifest)
    listed = {entry.path for entry in manifest.files}
    for root, _dirs, names in os.walk(directory):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if relative not in listed and not _is_own_file(relative):
                result.problems.append(f"unexpected file {relative}")

    def check(entry: ManifestEntry) -> tuple[ManifestEntry, list[str]]:
        path = directory / entry.path
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return entry, [f"{entry.path}: missing"]
        if size != entry.size:
            return entry, [f"{entry.path}: size {size} != manifest {entry.size}"]
        if mode == "sha256":
            outcome = check_file(path, entry.size, ExpectedDigests(sha256=entry.sha256))
            return entry, [f"{entry.path}: {problem}" for problem in outcome.problems]
        return entry, []

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for entry, problems in pool.map(check, manifest.files):
            if problems:
                result.problems.extend(problems)
            else:
                result.good.add(entry.path)
    return result
