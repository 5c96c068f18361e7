"""What the tests know of the pinned charts: their templates from the chart cache, their data from
the chart-data directory.

- Templates (rendering chart objects, `helm lint`, RBAC, tolerations, selectors, hooks) come only
  from the verified chart cache (components/helm/cache.py; `vllm-platform charts pull`). Without
  it those tests are skipped, with the reason and the pull command in the run's summary
  (tests/conftest.py counts them). A cache entry that differs from the lock is never skipped over:
  it fails.
- Data (each pinned chart's Chart.yaml, values.yaml, values.schema.json and CRDs as plain YAML,
  no templates) comes from the directory `$VLLM_PLATFORM_CHART_DATA` names; `.ci/run` points it at
  the shared chart data, so CRD schemas and default values are checked in CI with no network.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.helm.cache import PULL_COMMAND, ChartCacheError, check_cache
from components.helm.lock import LockedChart, load_lock
from infra.render import read_yaml_documents

CHART_DATA_ENV = "VLLM_PLATFORM_CHART_DATA"
CHARTS_SKIP_REASON = f"needs the pinned chart templates, not in the chart cache: run `{PULL_COMMAND}`"
CHART_DATA_SKIP_REASON = (
    f"needs the pinned charts' data (CRDs, values): set ${CHART_DATA_ENV} to a chart-data directory "
    "(.ci/run uses ../shared/chart-data)"
)


@functools.cache
def charts_in_cache() -> bool:
    """Whether every locked chart is in the cache; raises ChartCacheError when one differs from the lock."""
    problems = check_cache()
    tampered = [problem for problem in problems if not problem.missing]
    if tampered:
        raise ChartCacheError(tampered)
    return not problems


def require_charts() -> None:
    """Skip the calling test unless the chart cache holds every pinned chart (see the module doc)."""
    if not charts_in_cache():
        pytest.skip(CHARTS_SKIP_REASON)


def chart_data_dir() -> Path | None:
    configured = os.environ.get(CHART_DATA_ENV, "").strip()
    return Path(configured) if configured else None


def require_chart_data() -> Path:
    directory = chart_data_dir()
    if directory is None:
        pytest.skip(CHART_DATA_SKIP_REASON)
    if not directory.is_dir():
        raise FileNotFoundError(f"${CHART_DATA_ENV} is {directory}, which is not a directory")
    return directory


def chart_data(entry: LockedChart) -> Path:
    """The data folder of a locked chart (`<name>-<version>/`); a missing one is an error, not a skip."""
    folder = require_chart_data() / f"{entry.name}-{entry.version}"
    if not (folder / "Chart.yaml").is_file():
        raise FileNotFoundError(
            f"{folder} has no Chart.yaml: the chart data does not hold {entry.label}, which the lock pins"
        )
    return folder


@functools.cache
def data_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """Every CRD the pinned charts install, keyed (group, kind): from the chart data, or, where no
    chart data is set but the chart cache holds the charts (a machine that ran `charts pull`), from
    what the charts install in the prod render (their crds/ files and templates)."""
    documents: list[dict[str, Any]] = []
    if chart_data_dir() is None and charts_in_cache():
        from tests.conftest import rendered

        documents = [
            o for o in rendered("prod").deployed_chart_objects if o["kind"] == "CustomResourceDefinition"
        ]
    else:
        for entry in load_lock().values():
            for path in sorted(chart_data(entry).rglob("crds/*.yaml")):
                documents.extend(read_yaml_documents(path))
    crds: dict[tuple[str, str], dict[str, Any]] = {}
    for document in documents:
        if document.get("kind") == "CustomResourceDefinition":
            crds.setdefault((document["spec"]["group"], document["spec"]["names"]["kind"]), document)
    return crds


def data_values(entry: LockedChart, subchart: str | None = None) -> dict[str, Any]:
    folder = chart_data(entry) if subchart is None else chart_data(entry) / "charts" / subchart
    return yaml.safe_load((folder / "values.yaml").read_text()) or {}


def data_values_schema(entry: LockedChart, subchart: str | None = None) -> dict[str, Any] | None:
    folder = chart_data(entry) if subchart is None else chart_data(entry) / "charts" / subchart
    path = folder / "values.schema.json"
    return yaml.safe_load(path.read_text()) if path.is_file() else None
