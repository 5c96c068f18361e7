"""The chart lock: which upstream release each vendored chart under charts/ came from.

`charts/charts.lock.yaml` records, per chart the stack installs, the chart's name, version and
appVersion, the Helm repository users would `helm repo add`, the upstream git repository, tag,
commit and path the files were taken from, and a digest of the vendored directory; each subchart
(unpacked under `charts/<chart>/charts/<dependency>/`) has the same provenance fields.
`scripts/vendor-chart.py` writes it; tests/test_chart_lock.py checks it against the files and the
pins in infra/versions.py. This module is pure: it reads files and computes digests, nothing else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHARTS_DIR = REPO_ROOT / "charts"
LOCK_PATH = CHARTS_DIR / "charts.lock.yaml"


@dataclass(frozen=True)
class LockedChart:
    """One lock entry: a vendored chart (or subchart) and the upstream release it is a copy of.

    `repository` is the Helm repository URL (for a subchart: the one its parent's Chart.yaml names;
    empty for a local subchart that ships inside its parent). `source` is the upstream git
    repository, `path` the chart's directory inside it at `tag`/`commit`, and `digest` is
    `tree_digest` of the vendored directory (for a parent, its subcharts included).
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
            digest=str(data["digest"]),
            dependencies=tuple(cls.from_dict(d) for d in data.get("dependencies") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "appVersion": self.app_version,
            "repository": self.repository,
            "source": self.source,
            "tag": self.tag,
            "commit": self.commit,
            "path": self.path,
            "digest": self.digest,
        }
        if self.dependencies:
            data["dependencies"] = [d.to_dict() for d in self.dependencies]
        return data


def load_lock(path: Path = LOCK_PATH) -> dict[str, LockedChart]:
    """The lock file's entries by chart name."""
    data = yaml.safe_load(path.read_text()) or {}
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


def vendored_chart_dir(name: str, charts_dir: Path = CHARTS_DIR) -> Path:
    """Where the chart `name` is vendored: charts/<name>/ (its subcharts in charts/<name>/charts/)."""
    return charts_dir / name
