"""The chart cache: where pulled, verified charts live, and the check every reader goes through.

`vllm-platform charts pull` (infra/charts.py) writes each locked chart, as Helm loads it
(components/helm/lock.py `write_canonical`), to `<cache>/<name>-<version>/<name>/`. The cache is
outside the repository: `$VLLM_PLATFORM_CHART_CACHE`, else `$XDG_CACHE_HOME/vllm-platform/charts`,
else `~/.cache/vllm-platform/charts`. Nothing reads a chart from it without `cache_problems` (for
all charts, `check_cache`), which recomputes the chart's and each subchart's digest and compares
them with the lock, so a tampered, partial or stale entry is refused (ChartCacheError) with the
chart, both digests and the pull command.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from components.helm.lock import LockedChart, digest_mismatches, load_lock

CACHE_ENV = "VLLM_PLATFORM_CHART_CACHE"
PULL_COMMAND = "vllm-platform charts pull"


def chart_cache_dir() -> Path:
    """The chart cache: $VLLM_PLATFORM_CHART_CACHE, else the user's cache directory."""
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "vllm-platform" / "charts"


def cached_chart_path(entry: LockedChart, cache: Path | None = None) -> Path:
    """Where the chart of a lock entry lives in the cache (verified or not)."""
    return (cache or chart_cache_dir()) / f"{entry.name}-{entry.version}" / entry.name


@dataclass(frozen=True)
class CacheProblem:
    """Why a locked chart cannot be read from the cache."""

    chart: str
    """`name version` of the chart, or of `parent version / subchart` for a subchart."""
    path: Path
    expected: str = ""
    actual: str = ""

    @property
    def missing(self) -> bool:
        return not self.actual

    def message(self) -> str:
        if self.missing:
            return f"chart {self.chart}: not in the chart cache ({self.path})"
        return (
            f"chart {self.chart}: digest mismatch in the chart cache ({self.path}): "
            f"expected {self.expected}, got {self.actual}"
        )


class ChartCacheError(RuntimeError):
    """Charts the lock pins are missing from the cache or differ from the lock."""

    def __init__(self, problems: list[CacheProblem]) -> None:
        self.problems = problems
        lines = [problem.message() for problem in problems]
        tampered = [p for p in problems if not p.missing]
        fix = f"run `{PULL_COMMAND}` to download and verify the pinned charts"
        if tampered:
            fix += " (it replaces an entry whose digest differs; never edit the cache by hand)"
        super().__init__(
            "\n".join([*lines, fix, f"(chart cache: {chart_cache_dir()}; ${CACHE_ENV} moves it)"])
        )


def cache_problems(entry: LockedChart, cache: Path | None = None) -> list[CacheProblem]:
    """What is wrong with a locked chart's cache entry ([] when it matches the lock)."""
    path = cached_chart_path(entry, cache)
    if not (path / "Chart.yaml").is_file():
        return [CacheProblem(chart=entry.label, path=path)]
    return [
        CacheProblem(chart=label, path=path, expected=expected, actual=actual)
        for label, expected, actual in digest_mismatches(path, entry)
    ]


def lock_entry_for_path(chart_path: str | Path) -> LockedChart:
    """The lock entry of a cache path (what `helm.v4.Chart` gets as `chart`)."""
    path = Path(chart_path)
    lock = load_lock()
    entry = lock.get(path.name)
    if entry is None or path.parent.name != f"{entry.name}-{entry.version}":
        raise KeyError(f"{chart_path} is not a locked chart's cache path")
    return entry


def check_cache(names: list[str] | None = None, cache: Path | None = None) -> list[CacheProblem]:
    """Problems of every locked chart (or of `names`) in the cache."""
    lock = load_lock()
    return [problem for name in names or sorted(lock) for problem in cache_problems(lock[name], cache)]
