"""`vllm-platform charts pull` and the chart cache, end to end with Helm's own client and engine.

Nothing here reaches past loopback: a classic chart repository (index.yaml plus packages, made by
Helm's own `package` and `repo index`) is served from a temporary folder on 127.0.0.1, and a git
mirror is a repository made in a temporary folder. The chart is our own test chart
(tests/data/charts/pull-probe: a local subchart, and a folder its .helmignore leaves out).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import helm_python
import pytest
import yaml

from components.helm.cache import ChartCacheError, cache_problems, cached_chart_path
from components.helm.lock import LockedChart, canonical_digests, chart_digest, load_lock, write_canonical
from infra import cli
from infra.charts import find_mirror, pull_charts
from infra.render import render_stack, write_render

PROBE = Path(__file__).parent / "data" / "charts" / "pull-probe"
SOURCE = "https://github.com/example-owner/probe-charts"


def probe_entry(repository: str = "", **changes: str) -> LockedChart:
    """The lock entry `charts pull` needs for the probe chart, digests computed by Helm's loader."""
    entry = _bare_entry()
    with tempfile.TemporaryDirectory() as scratch:
        with_digests = dict(canonical_digests(write_canonical(PROBE, Path(scratch)), entry))
    sub = replace(entry.dependencies[0], digest=with_digests[entry.dependencies[0]])
    fields = {"repository": repository, "digest": with_digests[entry], "dependencies": (sub,), **changes}
    return replace(entry, **fields)


def _bare_entry() -> LockedChart:
    sub = LockedChart(
        name="probe-sub", version="0.1.0", app_version="", repository="", source=SOURCE,
        tag="pull-probe-1.2.3", commit="0" * 40, path="charts/pull-probe/charts/probe-sub", digest="",
    )  # fmt: skip
    return LockedChart(
        name="pull-probe", version="1.2.3", app_version="9.9", repository="", source=SOURCE,
        tag="pull-probe-1.2.3", commit="0" * 40, path="charts/pull-probe", digest="", dependencies=(sub,),
    )  # fmt: skip


def write_lock(path: Path, *entries: LockedChart) -> Path:
    path.write_text(yaml.safe_dump({"charts": [entry.to_dict() for entry in entries]}, sort_keys=False))
    return path


@pytest.fixture
def chart_repository(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A classic Helm repository on loopback holding the probe chart's package: (URL, package)."""
    served = tmp_path / "repo"
    served.mkdir()
    package = Path(helm_python.package(PROBE, destination=served))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    helm_python.repo_index_generate(served, base_url=url)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield url, package
    finally:
        server.shutdown()
        server.server_close()


def test_a_package_and_the_chart_directory_have_the_same_digest_and_ignored_files_do_not_count(tmp_path):
    package = helm_python.package(PROBE, destination=tmp_path)
    assert chart_digest(Path(package)) == chart_digest(PROBE)
    canonical = write_canonical(PROBE, tmp_path / "canonical")
    assert not (canonical / "ci").exists(), ".helmignore'd files are not part of the chart Helm loads"
    assert (canonical / "charts" / "probe-sub" / "Chart.yaml").is_file(), "subcharts are expanded"
    changed = tmp_path / "changed"
    shutil.copytree(PROBE, changed)
    (changed / "ci" / "test-values.yaml").write_text("other: 1\n")
    assert chart_digest(changed) == chart_digest(PROBE)
    (changed / "values.yaml").write_text("replicas: 2\n")
    assert chart_digest(changed) != chart_digest(PROBE)


def test_pull_downloads_with_helms_client_verifies_and_fills_the_cache(chart_repository, tmp_path):
    url, package = chart_repository
    entry = probe_entry(url, package_digest=helm_python.digest(package))
    lock = write_lock(tmp_path / "lock.yaml", entry)
    cache = tmp_path / "cache"
    assert pull_charts(cache, lock_path=lock) == []
    assert cache_problems(entry, cache) == []
    with helm_python.Chart.load(cached_chart_path(entry, cache)) as chart:
        assert chart.render({}, name="r", namespace="n")["pull-probe/templates/configmap.yaml"]


def test_pull_refuses_a_chart_whose_digest_differs_and_leaves_the_cache_as_it_was(
    chart_repository, tmp_path, capsys
):
    url, _ = chart_repository
    wrong = "sha256:" + "1" * 64
    lock = write_lock(tmp_path / "lock.yaml", probe_entry(url, digest=wrong))
    cache = tmp_path / "cache"
    (errors,) = [pull_charts(cache, lock_path=lock)]
    assert len(errors) == 1
    assert "chart pull-probe 1.2.3: digest mismatch: expected " + wrong in errors[0]
    assert "got sha256:" in errors[0]
    assert not cached_chart_path(probe_entry(url), cache).exists()
    assert "Traceback" not in capsys.readouterr().err


def test_pull_refuses_a_package_whose_repository_digest_differs(chart_repository, tmp_path):
    url, _ = chart_repository
    lock = write_lock(tmp_path / "lock.yaml", probe_entry(url, package_digest="sha256:" + "2" * 64))
    (error,) = pull_charts(tmp_path / "cache", lock_path=lock)
    assert error.startswith("chart pull-probe 1.2.3: package digest mismatch from ")


def test_pull_without_network_gives_one_clear_error_per_chart(tmp_path, capsys):
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    other = replace(probe_entry(closed), name="second-probe")
    lock = write_lock(tmp_path / "lock.yaml", probe_entry(closed), other)
    errors = pull_charts(tmp_path / "cache", lock_path=lock)
    assert [e.split(":")[0] for e in errors] == ["chart pull-probe 1.2.3", "chart second-probe 1.2.3"]
    assert all(f"cannot download from {closed}" in e and "\n" not in e for e in errors)
    assert "Traceback" not in capsys.readouterr().err


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=True, text=True).stdout.strip()


def make_mirror(mirrors: Path) -> str:
    """A git repository laid out as the upstream one: the chart under charts/pull-probe, tagged."""
    work = mirrors / "example-owner+probe-charts"
    shutil.copytree(PROBE, work / "charts" / "pull-probe")
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "chart")
    _git(work, "tag", "pull-probe-1.2.3")
    return _git(work, "rev-parse", "HEAD")


def test_pull_from_git_builds_the_same_chart_at_the_locked_tag(tmp_path):
    commit = make_mirror(tmp_path / "mirrors")
    entry = probe_entry("https://charts.example.com", commit=commit)
    lock = write_lock(tmp_path / "lock.yaml", entry)
    cache = tmp_path / "cache"
    assert pull_charts(cache, from_git=tmp_path / "mirrors", lock_path=lock) == []
    assert cache_problems(entry, cache) == []
    assert find_mirror(tmp_path / "mirrors", SOURCE).name == ".git"


def test_pull_from_git_refuses_a_tag_that_moved_off_the_locked_commit(tmp_path):
    make_mirror(tmp_path / "mirrors")
    lock = write_lock(tmp_path / "lock.yaml", probe_entry("https://charts.example.com", commit="f" * 40))
    (error,) = pull_charts(tmp_path / "cache", from_git=tmp_path / "mirrors", lock_path=lock)
    assert "tag pull-probe-1.2.3" in error and f"the lock says {'f' * 40}" in error


def test_pull_from_git_without_a_mirror_names_the_source(tmp_path):
    (tmp_path / "mirrors").mkdir()
    lock = write_lock(tmp_path / "lock.yaml", probe_entry("https://charts.example.com"))
    (error,) = pull_charts(tmp_path / "cache", from_git=tmp_path / "mirrors", lock_path=lock)
    assert error.startswith(f"no git mirror of {SOURCE} under ")


# --- consumers read the verified cache only ---------------------------------------------------------


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("VLLM_PLATFORM_CHART_CACHE", str(cache))
    return cache


@pytest.fixture
def tampered_cache(tmp_path, monkeypatch) -> Path:
    """A cache whose every entry is there but is not the locked chart (edited by hand, say)."""
    cache = tmp_path / "tampered-cache"
    for entry in load_lock().values():
        target = cached_chart_path(entry, cache)
        target.mkdir(parents=True)
        (target / "Chart.yaml").write_text(f"apiVersion: v2\nname: {entry.name}\nversion: {entry.version}\n")
    monkeypatch.setenv("VLLM_PLATFORM_CHART_CACHE", str(cache))
    return cache


def test_render_without_the_charts_refuses_unless_told_and_names_the_pull_command(empty_cache, capsys):
    assert cli.main(["render", "dev", "--out", str(empty_cache.parent / "out")]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "not in the chart cache" in err and "run `vllm-platform charts pull`" in err


def test_render_told_to_writes_our_objects_and_every_releases_values_and_lists_what_it_left_out(
    empty_cache, capsys
):
    out = empty_cache.parent / "out"
    assert cli.main(["render", "dev", "--out", str(out), "--allow-missing-charts"]) == 0
    printed = capsys.readouterr().out
    result = render_stack("dev", allow_missing_charts=True)
    assert result.kubernetes_objects and not result.chart_objects
    assert result.unexpanded_releases == sorted(r["name"] for r in result.helm_releases)
    assert f"not expanded ({len(result.helm_releases)} of {len(result.helm_releases)} releases" in printed
    written = [yaml.safe_load(p.read_text()) for p in sorted((out / "helm").glob("*.yaml"))]
    assert len(written) == len(result.helm_releases)
    assert all(w["expanded"] is False and w["values"] is not None and w["chartDigest"] for w in written)
    assert not (out / "charts").exists()
    assert any((out / "kubernetes").rglob("deployment-vllm.yaml"))


def test_render_refuses_a_tampered_cache_entry_even_when_charts_may_be_missing(tampered_cache):
    with pytest.raises(ChartCacheError) as raised:
        render_stack("dev", allow_missing_charts=True)
    adapter = load_lock()["prometheus-adapter"]  # installed by every stack
    assert f"chart prometheus-adapter {adapter.version}: digest mismatch" in str(raised.value)
    assert f"expected {adapter.digest}, got sha256:" in str(raised.value)
    (keda,) = cache_problems(load_lock()["keda"])
    assert not keda.missing and keda.expected == load_lock()["keda"].digest


def test_pulumi_up_and_preview_refuse_before_registering_anything_when_a_chart_is_missing(empty_cache):
    from infra.render import _render_in_context, read_stack_file, stack_file_for

    raw = read_stack_file(stack_file_for("dev"))
    with pytest.raises(Exception, match="not in the chart cache") as raised:
        import contextvars

        contextvars.Context().run(_render_in_context, "dev", "stacks/Pulumi.dev.yaml", raw, True)
    assert "vllm-platform charts pull" in str(raised.value)


def test_the_written_release_names_the_chart_by_name_version_and_digest_not_by_path(empty_cache):
    result = render_stack("dev", allow_missing_charts=True)
    out = empty_cache.parent / "out-release"
    write_render(result, out)
    lock = load_lock()
    for path in (out / "helm").glob("*.yaml"):
        release = yaml.safe_load(path.read_text())
        assert lock[release["chart"]].digest == release["chartDigest"]
        assert lock[release["chart"]].version == release["chartVersion"]
