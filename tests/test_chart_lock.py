"""The chart lock (components/helm/charts.lock.yaml) agrees with the chart pins in domain/versions.py,
the charts are not in the repository, and the cached charts agree with the lock and load and lint
in Helm's own engine (helm-python-sdk).

The lock and pin checks need nothing but the repository. The checks of the charts themselves need
the pinned charts in the verified chart cache (`vllm-platform charts pull`); without it they are
skipped with that reason (tests/support/charts.py), and the chart data (`$VLLM_PLATFORM_CHART_DATA`)
is checked against the lock instead.
"""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import helm_python
import pytest
import yaml

from components.helm.cache import cached_chart_path
from components.helm.lock import LOCK_PATH, LockedChart, load_lock
from domain import versions
from infra import cli
from tests.support.charts import chart_data, require_charts

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK = load_lock()

# Charts pinned and locked for an issue that does not install them yet; each one still needs a pin.
PINNED_NOT_INSTALLED: dict[str, str] = {
    "karpenter-crd": "the CRDs alone, for a cluster whose Karpenter runs outside the stack: the deploy test "
    "applies them for the real karpenter-kwok (tests/test_deploy_karpenter.py); in mode eks the karpenter "
    "chart's own crds/ install them",
}

# The modules that install charts: every installed pin is one of their globals.
INSTALLING_MODULES = (
    "components.gpu_addons",
    "components.monitoring",
    "components.cluster_addons",
    "components.karpenter",
    "components.multi_node_addons",
)

# Our own charts, for the tests of Helm's engine and of `charts pull`; nothing upstream.
OWN_TEST_CHARTS = REPO_ROOT / "tests" / "data" / "charts"


def chart_pins() -> dict[str, versions.ChartPin]:
    pins = [value for name, value in vars(versions).items() if name.endswith("_CHART")]
    assert all(isinstance(pin, versions.ChartPin) for pin in pins)
    return {pin.chart: pin for pin in pins}


def all_entries() -> list[tuple[str, LockedChart, LockedChart]]:
    """(id, entry, its top-level chart) for every chart and subchart in the lock."""
    out = []
    for entry in LOCK.values():
        out.append((entry.name, entry, entry))
        out.extend((f"{entry.name}/{dep.name}", dep, entry) for dep in entry.dependencies)
    return out


ENTRIES = all_entries()
ENTRY_IDS = [item[0] for item in ENTRIES]


def test_no_upstream_chart_is_tracked_in_the_repository():
    """A chart (a Chart.yaml beside templates/) may only be one of our own test charts."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = {Path(p) for p in tracked.split("\0") if p}
    charts = {
        path.parent
        for path in paths
        if path.name == "Chart.yaml"
        and any(p.parts[: len(path.parent.parts) + 1] == (*path.parent.parts, "templates") for p in paths)
    }
    outside = sorted(str(c) for c in charts if not (REPO_ROOT / c).is_relative_to(OWN_TEST_CHARTS))
    assert not outside, f"upstream charts belong in the chart cache, not the repository: {outside}"
    assert charts, "the check must see our own test charts under tests/data/charts"


@pytest.mark.parametrize(("label", "entry", "parent"), ENTRIES, ids=ENTRY_IDS)
def test_every_locked_chart_records_where_it_came_from_and_its_digest(label, entry, parent):
    assert re.fullmatch(r"[0-9a-f]{40}", entry.commit), f"{label}: commit {entry.commit!r}"
    assert entry.source.startswith("https://github.com/"), f"{label}: source {entry.source!r}"
    assert entry.tag and entry.path and entry.version, label
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", entry.digest), f"{label}: digest {entry.digest!r}"
    assert not entry.package_digest or re.fullmatch(r"sha256:[0-9a-f]{64}", entry.package_digest), label
    assert not entry.oci or entry.oci.startswith("oci://"), label
    if entry is parent:
        assert entry.repository.startswith(("https://", "oci://")), f"{label}: no repository to pull from"


def test_every_chart_pin_has_a_lock_entry_at_exactly_its_version_and_repository():
    assert {chart: (pin.version, pin.repository) for chart, pin in chart_pins().items()} == {
        name: (entry.version, entry.repository) for name, entry in LOCK.items()
    }


def test_every_pinned_chart_is_installed_by_a_component_except_the_named_ones():
    installed = set()
    for module in INSTALLING_MODULES:
        installed |= {
            value.chart
            for value in vars(importlib.import_module(module)).values()
            if isinstance(value, versions.ChartPin)
        }
    assert set(chart_pins()) - installed == set(PINNED_NOT_INSTALLED)


@pytest.mark.parametrize(("label", "entry", "parent"), ENTRIES, ids=ENTRY_IDS)
def test_the_chart_data_is_of_the_locked_chart_versions(label, entry, parent):
    folder = chart_data(parent) if entry is parent else chart_data(parent) / "charts" / entry.name
    meta = yaml.safe_load((folder / "Chart.yaml").read_text())
    assert (meta["name"], str(meta["version"]), str(meta.get("appVersion") or "")) == (
        entry.name,
        entry.version,
        entry.app_version,
    ), f"{label}: the chart data is of another release than the lock pins"


@pytest.mark.parametrize(("label", "entry", "parent"), ENTRIES, ids=ENTRY_IDS)
def test_every_cached_chart_has_the_locked_name_version_and_app_version(label, entry, parent):
    require_charts()
    directory = cached_chart_path(parent)
    if entry is not parent:
        directory = directory / "charts" / entry.name
    meta = yaml.safe_load((directory / "Chart.yaml").read_text())
    assert (meta["name"], str(meta["version"]), str(meta.get("appVersion") or "")) == (
        entry.name,
        entry.version,
        entry.app_version,
    )


@pytest.mark.parametrize("name", sorted(LOCK))
def test_every_cached_chart_loads_in_helm_with_its_locked_subcharts_at_versions_helm_accepts(name):
    require_charts()
    entry, directory = LOCK[name], cached_chart_path(LOCK[name])
    with helm_python.Chart.load(directory) as chart:
        assert (chart.name, chart.version, chart.metadata.get("appVersion", "")) == (
            name,
            entry.version,
            entry.app_version,
        )
        declared = {dep["name"] for dep in chart.metadata.get("dependencies") or ()}
        loaded = sorted((sub["name"], sub["version"]) for sub in chart.dependencies)
    assert declared == {dep.name for dep in entry.dependencies}
    assert loaded == sorted((dep.name, dep.version) for dep in entry.dependencies)
    # "unpacked": a directory charts/<name>/ whose version satisfies the constraint (Helm's check).
    statuses = {dep["name"]: dep["status"] for dep in helm_python.dependency_list(directory)}
    assert all(status == "unpacked" for status in statuses.values()), statuses


@pytest.mark.parametrize(
    "kube_version", [versions.SUPPORTED_KUBERNETES_VERSIONS[0], versions.SUPPORTED_KUBERNETES_VERSIONS[-1]]
)
@pytest.mark.parametrize("name", sorted(LOCK))
def test_every_cached_chart_lints_without_errors_on_the_supported_kubernetes_versions(name, kube_version):
    require_charts()
    report = helm_python.lint(
        cached_chart_path(LOCK[name]), kube_version=f"v{kube_version}.0", with_subcharts=True
    )
    errors = [m for m in report["messages"] if m["severity"] >= 3]
    assert (report["errors"], errors) == ([], [])
    for warning in (m for m in report["messages"] if m["severity"] == 2):
        print(f"{name} (Kubernetes {kube_version}) lint warning: {warning['path']}: {warning['error']}")


def _lock_without(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(LOCK_PATH.read_text())
    change(data["charts"])
    path = tmp_path / "charts.lock.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_validate_refuses_a_lock_entry_without_a_digest(tmp_path, monkeypatch, capsys):
    def drop_digest(charts):
        next(c for c in charts if c["name"] == "keda").pop("digest")

    monkeypatch.setattr("components.helm.lock.LOCK_PATH", _lock_without(tmp_path, drop_digest))
    assert cli.main(["validate", "dev"]) == cli.EXIT_INVALID_CONFIG
    err = capsys.readouterr().err
    assert "invalid chart lock (1 problem)" in err
    assert "charts[keda].digest = (missing)" in err and "vllm-platform charts digest" in err


def test_validate_refuses_a_chart_pin_without_a_lock_entry(tmp_path, monkeypatch, capsys):
    def drop_entry(charts):
        charts[:] = [c for c in charts if c["name"] != "metrics-server"]

    monkeypatch.setattr("components.helm.lock.LOCK_PATH", _lock_without(tmp_path, drop_entry))
    assert cli.main(["render", "dev", "--allow-missing-charts"]) == cli.EXIT_INVALID_CONFIG
    err = capsys.readouterr().err
    assert "charts[metrics-server] = (missing)" in err
    assert f"domain/versions.py pins metrics-server {versions.METRICS_SERVER_CHART.version}" in err
