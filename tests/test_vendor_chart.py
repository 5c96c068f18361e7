"""scripts/vendor-chart.py against real git repositories made here: it copies the chart at the tag,
locks tag, commit, path and digest, refuses a dependency Helm would not accept, and leaves a
parent's packaged dependencies out of its copy."""

from __future__ import annotations

import importlib.util
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from components.helm.lock import load_lock, tree_digest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vendor-chart.py"


def vendor_chart():
    spec = importlib.util.spec_from_file_location("vendor_chart", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def write_chart(directory: Path, name: str, version: str, dependencies: list[dict] | None = None) -> None:
    (directory / "templates").mkdir(parents=True)
    meta = {"apiVersion": "v2", "name": name, "version": version, "appVersion": f"v{version}"}
    if dependencies:
        meta["dependencies"] = dependencies
    (directory / "Chart.yaml").write_text(yaml.safe_dump(meta))
    (directory / "values.yaml").write_text("replicas: 1\n")
    (directory / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-" + name + "\n"
    )


@pytest.fixture
def upstream(tmp_path: Path) -> Path:
    """A bare mirror holding a parent chart (with a committed .tgz of its dependency) and the
    dependency at two versions, each release tagged."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    write_chart(work / "charts" / "sub", "sub", "1.2.0")
    dep = {"name": "sub", "version": "~1.2.0", "repository": "https://example.invalid/charts"}
    write_chart(work / "charts" / "app", "app", "3.0.0", [dep])
    (work / "charts" / "app" / "charts").mkdir()
    with tarfile.open(work / "charts" / "app" / "charts" / "sub-1.2.0.tgz", "w:gz") as tar:
        tar.add(work / "charts" / "sub", arcname="sub")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "release")
    git(work, "tag", "app-3.0.0")
    git(work, "tag", "sub-1.2.0")
    sub_meta = work / "charts" / "sub" / "Chart.yaml"
    sub_meta.write_text(sub_meta.read_text().replace("1.2.0", "2.0.0"))
    git(work, "commit", "-qam", "sub 2")
    git(work, "tag", "sub-2.0.0")
    mirror = tmp_path / "owner+repo" / "repo"
    git(tmp_path, "clone", "-q", "--mirror", str(work), str(mirror))
    return mirror


def test_vendoring_a_chart_and_its_dependency_locks_both_with_their_provenance(upstream, tmp_path):
    charts = tmp_path / "charts"
    main = vendor_chart()
    common = ["--mirror", str(upstream), "--charts-dir", str(charts)]
    assert (
        main(
            [
                *common,
                "--tag",
                "app-3.0.0",
                "--path",
                "charts/app",
                "--name",
                "app",
                "--repository",
                "https://example.invalid/charts",
            ]
        )
        == 0
    )
    assert not (charts / "app" / "charts" / "sub-1.2.0.tgz").exists()
    assert (
        main([*common, "--tag", "sub-1.2.0", "--path", "charts/sub", "--name", "sub", "--parent", "app"]) == 0
    )

    entry = load_lock(charts / "charts.lock.yaml")["app"]
    commit = git(upstream, "rev-parse", "app-3.0.0").strip()
    assert (entry.version, entry.app_version, entry.tag, entry.commit, entry.path, entry.source) == (
        "3.0.0",
        "v3.0.0",
        "app-3.0.0",
        commit,
        "charts/app",
        "https://github.com/owner/repo",
    )
    assert entry.digest == tree_digest(charts / "app")
    (sub,) = entry.dependencies
    assert (sub.name, sub.version, sub.tag, sub.repository) == (
        "sub",
        "1.2.0",
        "sub-1.2.0",
        "https://example.invalid/charts",
    )
    assert sub.digest == tree_digest(charts / "app" / "charts" / "sub")
    assert (charts / "app" / "templates" / "cm.yaml").read_text().endswith("-app\n")


def test_a_dependency_from_a_packaged_chart_in_the_parent_repository_is_unpacked(upstream, tmp_path):
    charts = tmp_path / "charts"
    main = vendor_chart()
    common = ["--mirror", str(upstream), "--charts-dir", str(charts)]
    main(
        [*common, "--tag", "app-3.0.0", "--path", "charts/app", "--name", "app", "--repository", "https://x"]
    )
    assert (
        main(
            [
                *common,
                "--tag",
                "app-3.0.0",
                "--path",
                "charts/app/charts/sub-1.2.0.tgz",
                "--name",
                "sub",
                "--parent",
                "app",
            ]
        )
        == 0
    )
    assert (
        yaml.safe_load((charts / "app" / "charts" / "sub" / "Chart.yaml").read_text())["version"] == "1.2.0"
    )


def test_a_dependency_outside_the_parent_constraint_is_refused_and_not_left_behind(upstream, tmp_path):
    charts = tmp_path / "charts"
    main = vendor_chart()
    common = ["--mirror", str(upstream), "--charts-dir", str(charts)]
    main(
        [*common, "--tag", "app-3.0.0", "--path", "charts/app", "--name", "app", "--repository", "https://x"]
    )
    with pytest.raises(SystemExit, match="wrong version"):
        main([*common, "--tag", "sub-2.0.0", "--path", "charts/sub", "--name", "sub", "--parent", "app"])
    assert not (charts / "app" / "charts" / "sub").exists()
    assert load_lock(charts / "charts.lock.yaml")["app"].dependencies == ()


def test_a_chart_whose_chart_yaml_names_another_chart_is_refused(upstream, tmp_path):
    with pytest.raises(SystemExit, match=r"Chart\.yaml name is 'app'"):
        vendor_chart()(
            [
                "--mirror",
                str(upstream),
                "--charts-dir",
                str(tmp_path / "charts"),
                "--tag",
                "app-3.0.0",
                "--path",
                "charts/app",
                "--name",
                "other",
                "--repository",
                "https://x",
            ]
        )
