"""The chart lock: which upstream release each pinned chart is, and the digest it must have.

Charts are dependencies, not our source (docs/charts.md): the repository holds only this lock,
`components/helm/charts.lock.yaml`. Per chart the stack installs, and per subchart, it records the
name, version and appVersion, the Helm repository users would `helm repo add` (and the OCI
reference where the chart is also published there), the upstream git repository, tag, commit and
path of the release, the repository's own package digest where it could be read (`package_digest`,
the sha256 of the `.tgz` that the repository's index.yaml lists), and `digest`: the digest of the
chart *as Helm loads it* (`chart_digest`), so a pulled package and a checkout of the release tag
give the same digest. `vllm-platform charts pull` fills the chart cache and checks both;
components/helm/cache.py checks the cache before anything reads it.

This module is pure: it reads files and computes digests, nothing else.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

LOCK_PATH = Path(__file__).with_name("charts.lock.yaml")


@dataclass(frozen=True)
class LockedChart:
    """One lock entry: a pinned chart (or subchart) and the upstream release it is.

    `repository` is the Helm repository URL (for a subchart: the one its parent's Chart.yaml names;
    empty for a local subchart that ships inside its parent); `oci` the `oci://` reference where
    the chart is also published as an OCI artifact. `source` is the upstream git repository,
    `path` the chart's directory inside it at `tag`/`commit`. `digest` is `chart_digest` of the
    chart (for a parent, its subcharts included); `package_digest` the chart repository's digest of
    its package, or "" where it could not be read (docs/charts.md says which and why).
    """

    name: str
    version: str
    app_version: str
    repository: str
    source: str
    tag: str
    commit: str
    path: str
    digest: str
    oci: str = ""
    package_digest: str = ""
    dependencies: tuple[LockedChart, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LockedChart:
        return cls(
            name=str(data["name"]),
            version=str(data["version"]),
            app_version=str(data.get("appVersion") or ""),
            repository=str(data.get("repository") or ""),
            source=str(data["source"]),
            tag=str(data["tag"]),
            commit=str(data["commit"]),
            path=str(data["path"]),
            digest=str(data.get("digest") or ""),
            oci=str(data.get("oci") or ""),
            package_digest=str(data.get("packageDigest") or ""),
            dependencies=tuple(cls.from_dict(d) for d in data.get("dependencies") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "appVersion": self.app_version,
            "repository": self.repository,
        }
        if self.oci:
            data["oci"] = self.oci
        data |= {
            "source": self.source,
            "tag": self.tag,
            "commit": self.commit,
            "path": self.path,
            "digest": self.digest,
        }
        if self.package_digest:
            data["packageDigest"] = self.package_digest
        if self.dependencies:
            data["dependencies"] = [d.to_dict() for d in self.dependencies]
        return data

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def is_local(self) -> bool:
        """A subchart shipped inside its parent's source tree (no repository of its own)."""
        return self.repository == "" or self.repository.startswith("file://")


def load_lock(path: Path | None = None) -> dict[str, LockedChart]:
    """The lock file's entries by chart name."""
    data = yaml.safe_load((path or LOCK_PATH).read_text()) or {}
    entries = (LockedChart.from_dict(item) for item in data.get("charts") or ())
    return {entry.name: entry for entry in entries}


def tree_digest(directory: Path) -> str:
    """`sha256:<hex>` over every file under `directory`, nothing ignored (dotfiles included).

    Files are taken in order of their POSIX path relative to `directory`; each contributes the
    line `<path>\\0<sha256 of its bytes in hex>\\n`. Empty directories and file modes do not count.
    """
    outer = hashlib.sha256()
    files = sorted(
        (p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.relative_to(directory).as_posix()
    )
    for file in files:
        content = hashlib.sha256(file.read_bytes()).hexdigest()
        outer.update(f"{file.relative_to(directory).as_posix()}\0{content}\n".encode())
    return f"sha256:{outer.hexdigest()}"


def write_canonical(source: Path, destination: Path) -> Path:
    """Write the chart at `source` (a directory or a `.tgz`) as Helm loads it, into `destination`.

    Helm's loader applies the chart's `.helmignore` and reads packaged subcharts; Helm's own writer
    (`save_dir`) then writes the loaded chart back. Subcharts, which it writes as `charts/*.tgz`,
    are expanded the same way into `charts/<name>/`, recursively, so every subchart has a directory
    and a digest of its own. The result is the same whether `source` is the repository's package or
    a checkout of the release tag with its dependencies: that is what makes the digest portable.
    Returns the chart's directory, `destination/<chart name>`.
    """
    destination.mkdir(parents=True, exist_ok=True)
    with helm_python.Chart.load(source) as chart:
        written = Path(chart.save_dir(destination))
    subcharts = written / "charts"
    for archive in sorted(subcharts.glob("*.tgz")) if subcharts.is_dir() else []:
        with tempfile.TemporaryDirectory() as scratch:
            expanded = write_canonical(archive, Path(scratch))
            archive.unlink()
            shutil.move(str(expanded), subcharts / expanded.name)
    return written


def chart_digest(source: Path) -> str:
    """The digest of a chart as Helm loads it: `tree_digest` of its canonical form (write_canonical)."""
    with tempfile.TemporaryDirectory() as scratch:
        return tree_digest(write_canonical(source, Path(scratch)))


def canonical_digests(chart_dir: Path, entry: LockedChart) -> Iterator[tuple[LockedChart, str]]:
    """(lock entry, actual digest) for a canonical chart directory and each of its locked subcharts."""
    yield entry, tree_digest(chart_dir)
    for dependency in entry.dependencies:
        sub = chart_dir / "charts" / dependency.name
        yield dependency, tree_digest(sub) if sub.is_dir() else "(missing)"


def digest_mismatches(chart_dir: Path, entry: LockedChart) -> list[tuple[str, str, str]]:
    """(chart label, locked digest, actual digest) for the chart and each locked subchart of a
    canonical chart directory whose digest differs from the lock ([] when all match)."""
    return [
        (entry.label if locked is entry else f"{entry.label} / {locked.label}", locked.digest, actual)
        for locked, actual in canonical_digests(chart_dir, entry)
        if actual != locked.digest
    ]


DIGEST_PATTERN = re.compile(r"sha256:[0-9a-f]{64}")


def lock_problems(pins: dict[str, tuple[str, str]], path: Path | None = None) -> list[tuple[str, str, str]]:
    """(key, value, fix) for what makes the lock unusable: a pinned chart (`pins`: name → (version,
    repository), from domain/versions.py) without a lock entry at that version and repository, or a
    lock entry (or subchart) without a well-formed digest."""
    lock = load_lock(path)
    problems = []
    for name, (version, repository) in sorted(pins.items()):
        entry = lock.get(name)
        if entry is None:
            problems.append(
                (
                    f"charts[{name}]",
                    "(missing)",
                    f"domain/versions.py pins {name} {version}, which "
                    "the lock does not list: add its entry (docs/charts.md, 'Bumping a chart')",
                )
            )
        elif (entry.version, entry.repository) != (version, repository):
            problems.append(
                (
                    f"charts[{name}].version",
                    f"{entry.version} from {entry.repository}",
                    f"domain/versions.py pins {version} from {repository}: make pin and lock agree "
                    "(docs/charts.md, 'Bumping a chart')",
                )
            )
    for entry in lock.values():
        for item, key in [
            (entry, f"charts[{entry.name}]"),
            *((d, f"charts[{entry.name}].dependencies[{d.name}]") for d in entry.dependencies),
        ]:
            if not DIGEST_PATTERN.fullmatch(item.digest):
                problems.append(
                    (
                        f"{key}.digest",
                        item.digest or "(missing)",
                        "every chart needs the digest of the chart as Helm loads it: run `vllm-platform "
                        "charts digest <chart dir or .tgz>` on the released chart and record it",
                    )
                )
    return problems
