"""The vendored Helm charts (charts/) agree with their lock (charts/charts.lock.yaml) and with the
chart pins in infra/versions.py, and the real Helm engine (helm-python-sdk) loads and lints them.

The lock is written by scripts/vendor-chart.py from the upstream git repositories at the release
tags; these tests catch a chart edited in place, a dependency missing or at a version its parent's
Chart.yaml does not allow (Helm's own `dependency list` decides), and a pin bumped without vendoring.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import shutil
from pathlib import Path

import helm_python
import pytest
import yaml

from components.helm.lock import (
    CHARTS_DIR,
    LOCK_PATH,
    LockedChart,
    load_lock,
    tree_digest,
    vendored_chart_dir,
)
from infra import versions

LOCK = load_lock()

# Charts vendored and locked for an issue that does not install them yet; each one still needs a pin.
VENDORED_NOT_INSTALLED: dict[str, str] = {}

# The modules that install charts: every installed pin is one of their globals.
INSTALLING_MODULES = ("components.gpu_addons", "components.monitoring", "components.cluster_addons")


def chart_pins() -> dict[str, versions.ChartPin]:
    pins = [value for name, value in vars(versions).items() if name.endswith("_CHART")]
    assert all(isinstance(pin, versions.ChartPin) for pin in pins)
    return {pin.chart: pin for pin in pins}


def locked_dirs() -> list[tuple[str, LockedChart, Path]]:
    """(id, entry, vendored directory) for every chart and subchart in the lock."""
    out = []
    for entry in LOCK.values():
        parent_dir = vendored_chart_dir(entry.name)
        out.append((entry.name, entry, parent_dir))
        out.extend(
            (f"{entry.name}/{dep.name}", dep, parent_dir / "charts" / dep.name) for dep in entry.dependencies
        )
    return out


LOCKED = locked_dirs()
LOCKED_IDS = [item[0] for item in LOCKED]


def chart_yaml(directory: Path) -> dict:
    return yaml.safe_load((directory / "Chart.yaml").read_text())


@pytest.mark.parametrize(("label", "entry", "directory"), LOCKED, ids=LOCKED_IDS)
def test_every_locked_chart_is_vendored_with_the_locked_name_version_and_app_version(label, entry, directory):
    assert directory.is_dir(), f"{label}: {directory} is missing; run scripts/vendor-chart.py"
    meta = chart_yaml(directory)
    assert (meta["name"], str(meta["version"]), str(meta.get("appVersion") or "")) == (
        entry.name,
        entry.version,
        entry.app_version,
    )


@pytest.mark.parametrize(("label", "entry", "directory"), LOCKED, ids=LOCKED_IDS)
def test_every_locked_chart_records_where_it_came_from(label, entry, directory):
    assert re.fullmatch(r"[0-9a-f]{40}", entry.commit), f"{label}: commit {entry.commit!r}"
    assert entry.source.startswith("https://github.com/"), f"{label}: source {entry.source!r}"
    assert entry.tag and entry.path, label


@pytest.mark.parametrize(("label", "entry", "directory"), LOCKED, ids=LOCKED_IDS)
def test_every_vendored_chart_matches_its_locked_digest(label, entry, directory):
    assert tree_digest(directory) == entry.digest, (
        f"{label}: the files under {directory.relative_to(CHARTS_DIR.parent)} differ from what was vendored; "
        "vendor the chart again with scripts/vendor-chart.py instead of editing it"
    )


@pytest.mark.parametrize("name", sorted(LOCK))
def test_every_dependency_is_vendored_at_a_version_helm_accepts_and_is_locked(name):
    directory = vendored_chart_dir(name)
    declared = {dep["name"] for dep in chart_yaml(directory).get("dependencies") or ()}
    assert declared == {dep.name for dep in LOCK[name].dependencies}
    for sub in [directory, *(directory / "charts" / dep for dep in declared)]:
        # "unpacked": a directory charts/<name>/ whose version satisfies the constraint (Helm's check).
        statuses = {dep["name"]: dep["status"] for dep in helm_python.dependency_list(sub)}
        assert all(status == "unpacked" for status in statuses.values()), (sub, statuses)
    locked_versions = {dep.name: dep.version for dep in LOCK[name].dependencies}
    for dep in declared:
        assert str(chart_yaml(directory / "charts" / dep)["version"]) == locked_versions[dep]


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
    assert set(chart_pins()) - installed == set(VENDORED_NOT_INSTALLED)


def test_nothing_but_locked_charts_is_vendored():
    vendored = {path.name for path in CHARTS_DIR.iterdir() if path.is_dir()}
    assert vendored == set(LOCK)
    assert {path.name for path in CHARTS_DIR.iterdir() if path.is_file()} == {LOCK_PATH.name}


def test_tree_digest_hashes_each_file_path_and_content_in_path_order(tmp_path):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "a.yaml").write_bytes(b"kind: A\n")
    (tmp_path / ".helmignore").write_bytes(b"*.swp\n")
    ignore, template = hashlib.sha256(b"*.swp\n").hexdigest(), hashlib.sha256(b"kind: A\n").hexdigest()
    lines = [f".helmignore\0{ignore}\n", f"templates/a.yaml\0{template}\n"]
    assert tree_digest(tmp_path) == "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(
            lambda d: (d / "values.yaml").write_text((d / "values.yaml").read_text() + "\n"), id="edit"
        ),
        pytest.param(
            lambda d: (d / "templates" / "extra.yaml").write_text("kind: ConfigMap\n"), id="add-file"
        ),
        pytest.param(lambda d: (d / "values.yaml").rename(d / "values.yml"), id="rename"),
        pytest.param(lambda d: (d / "Chart.yaml").unlink(), id="remove"),
    ],
)
def test_a_tampered_copy_of_a_vendored_chart_fails_its_digest(tmp_path, tamper):
    name = min(LOCK, key=lambda n: sum(1 for _ in vendored_chart_dir(n).rglob("*")))
    copy = tmp_path / name
    shutil.copytree(vendored_chart_dir(name), copy)
    assert tree_digest(copy) == LOCK[name].digest
    tamper(copy)
    assert tree_digest(copy) != LOCK[name].digest


@pytest.mark.parametrize("name", sorted(LOCK))
def test_every_vendored_chart_loads_in_helm_with_its_locked_subcharts(name):
    entry = LOCK[name]
    with helm_python.Chart.load(vendored_chart_dir(name)) as chart:
        assert (chart.name, chart.version, chart.metadata.get("appVersion", "")) == (
            name,
            entry.version,
            entry.app_version,
        )
        loaded = sorted((sub["name"], sub["version"]) for sub in chart.dependencies)
        assert loaded == sorted((dep.name, dep.version) for dep in entry.dependencies)


@pytest.mark.parametrize(
    "kube_version", [versions.SUPPORTED_KUBERNETES_VERSIONS[0], versions.SUPPORTED_KUBERNETES_VERSIONS[-1]]
)
@pytest.mark.parametrize("name", sorted(LOCK))
def test_every_vendored_chart_lints_without_errors_on_the_supported_kubernetes_versions(name, kube_version):
    report = helm_python.lint(
        vendored_chart_dir(name), kube_version=f"v{kube_version}.0", with_subcharts=True
    )
    errors = [m for m in report["messages"] if m["severity"] >= 3]
    assert (report["errors"], errors) == ([], [])
    for warning in (m for m in report["messages"] if m["severity"] == 2):
        print(f"{name} (Kubernetes {kube_version}) lint warning: {warning['path']}: {warning['error']}")
