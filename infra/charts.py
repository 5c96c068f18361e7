"""`vllm-platform charts`: pull the pinned charts into the chart cache, verify them, digest a chart.

Charts are dependencies (docs/charts.md). `pull` downloads each locked chart with Helm's own client
code (helm-python-sdk: a classic repository's index.yaml and package URL, or an `oci://`
reference), checks the package against the lock's `packageDigest` where one is recorded, writes the
chart as Helm loads it (components/helm/lock.py `write_canonical`) and checks it, and each
subchart, against the lock's `digest`; only a chart that matches replaces its cache entry. With
`--from-git DIR` the same charts are built from local git mirrors of their upstream repositories
(for teams that mirror chart repositories as git), at the locked tag, refusing a tag that no
longer points at the locked commit. Errors name the chart and are one line each; nothing is ever
written into the repository.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

import helm_python

from components.helm.cache import (
    CACHE_ENV,
    PULL_COMMAND,
    cache_problems,
    cached_chart_path,
    chart_cache_dir,
)
from components.helm.lock import (
    LOCK_PATH,
    LockedChart,
    digest_mismatches,
    load_lock,
    tree_digest,
    write_canonical,
)


class PullError(RuntimeError):
    """One chart could not be pulled or verified; the message names it and is one line."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def download_package(entry: LockedChart, scratch: Path) -> Path:
    """The chart's package (.tgz) from its Helm repository or OCI reference, via Helm's client."""
    if entry.repository.startswith("oci://"):
        reference, repo_url = f"{entry.repository.rstrip('/')}/{entry.name}", None
    elif entry.repository:
        reference, repo_url = entry.name, entry.repository
    elif entry.oci:
        reference, repo_url = entry.oci, None
    else:
        raise PullError(f"chart {entry.label}: the lock names no repository or OCI reference to pull from")
    where = repo_url or reference
    try:
        helm_python.pull(reference, repo_url=repo_url, version=entry.version, destination=scratch)
    except helm_python.HelmError as error:
        raise PullError(f"chart {entry.label}: cannot download from {where}: {_first_line(error)}") from None
    packages = sorted(scratch.glob("*.tgz"))
    if len(packages) != 1:
        raise PullError(f"chart {entry.label}: {where} gave {len(packages)} packages, expected one")
    actual = helm_python.digest(packages[0])
    if entry.package_digest and actual != entry.package_digest:
        raise PullError(
            f"chart {entry.label}: package digest mismatch from {where}: "
            f"expected {entry.package_digest}, got {actual}"
        )
    check_bundled_packages(entry, packages[0])
    return packages[0]


def check_bundled_packages(entry: LockedChart, package: Path) -> None:
    """A parent's package carries its dependencies as the packages their own repositories serve
    (`charts/<name>-<version>.tgz`): each must have the digest the lock records for it, if any."""
    with tarfile.open(package, "r:gz") as tar:
        members = {member.name: member for member in tar.getmembers() if member.isfile()}
        for dependency in (d for d in entry.dependencies if d.package_digest):
            member = members.get(f"{entry.name}/charts/{dependency.name}-{dependency.version}.tgz")
            if member is None:
                continue  # bundled unpacked: the chart digest covers it
            data = tar.extractfile(member)
            actual = "sha256:" + hashlib.sha256(data.read() if data else b"").hexdigest()
            if actual != dependency.package_digest:
                raise PullError(
                    f"chart {entry.label} / {dependency.label}: bundled package digest mismatch: "
                    f"expected {dependency.package_digest}, got {actual}"
                )


def find_mirror(mirrors: Path, source: str) -> Path:
    """The git directory mirroring `source` (https://github.com/<owner>/<name>) under `mirrors`.

    Accepted layouts: `<owner>+<name>` (as a bare repository, a checkout, or holding one a level
    down), `<owner>/<name>`, each optionally ending in `.git`.
    """
    owner, _, name = source.rstrip("/").removesuffix(".git").rpartition("/")
    owner = owner.rpartition("/")[2]
    for base in (f"{owner}+{name}", f"{owner}/{name}"):
        for candidate in (mirrors / base, mirrors / f"{base}.git"):
            if not candidate.is_dir():
                continue
            for place in (candidate, candidate / ".git", *sorted(candidate.iterdir())):
                if place.is_dir() and (place / "HEAD").is_file() and (place / "objects").is_dir():
                    return place
    raise PullError(f"no git mirror of {source} under {mirrors} (expected {owner}+{name} or {owner}/{name})")


def _git(git_dir: Path, *args: str) -> bytes:
    completed = subprocess.run(["git", "--git-dir", str(git_dir), *args], capture_output=True, check=False)
    if completed.returncode != 0:
        raise PullError(f"git {' '.join(args)} in {git_dir}: {completed.stderr.decode().strip()[:200]}")
    return completed.stdout


def extract_from_git(entry: LockedChart, mirrors: Path, target: Path) -> None:
    """Write the chart at the entry's `tag:path` into `target` (links refused), after checking that the
    tag still names the locked commit. `path` may name a packaged chart committed in the repository."""
    git_dir = find_mirror(mirrors, entry.source)
    try:
        commit = _git(git_dir, "rev-parse", f"{entry.tag}^{{commit}}").decode().strip()
    except PullError:
        raise PullError(f"chart {entry.label}: tag {entry.tag} is not in {git_dir}") from None
    if commit != entry.commit:
        raise PullError(
            f"chart {entry.label}: tag {entry.tag} in {git_dir} is commit {commit}, "
            f"the lock says {entry.commit}"
        )
    if entry.path.endswith(".tgz"):
        data, mode = _git(git_dir, "show", f"{commit}:{entry.path}"), "r:gz"
    else:
        treeish = commit if entry.path in ("", ".") else f"{commit}:{entry.path.strip('/')}"
        data, mode = _git(git_dir, "archive", "--format=tar", treeish), "r:"
    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:
        for member in tar.getmembers():
            if member.issym() or member.islnk():
                raise PullError(f"chart {entry.label}: {member.name} at {entry.tag}:{entry.path} is a link")
        if mode == "r:":
            tar.extractall(target, filter="data")
            return
        with tempfile.TemporaryDirectory() as unpacked:
            tar.extractall(unpacked, filter="data")
            (top,) = Path(unpacked).iterdir()  # a packaged chart holds one directory, the chart
            shutil.copytree(top, target)


def assemble_from_git(entry: LockedChart, mirrors: Path, scratch: Path) -> Path:
    """The chart and its locked dependencies from git, laid out as Helm loads a chart directory.

    A dependency with its own repository comes from its own source at its own tag, into
    `charts/<name>/`; a packaged copy the parent commits for it (`charts/<name>-*.tgz`) is left out,
    or Helm would load both. Local subcharts ship inside the parent's tree.
    """
    chart = scratch / "git" / entry.name
    extract_from_git(entry, mirrors, chart)
    for dependency in entry.dependencies:
        if dependency.is_local:
            continue
        for packaged in (chart / "charts").glob(f"{dependency.name}-*.tgz"):
            packaged.unlink()
        target = chart / "charts" / dependency.name
        if target.exists():
            shutil.rmtree(target)
        extract_from_git(dependency, mirrors, target)
    return chart


def pull_chart(entry: LockedChart, cache: Path, *, from_git: Path | None = None) -> Path:
    """Pull, verify and store one locked chart; returns its cache directory. Raises PullError."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".pull-") as scratch_name:
        scratch = Path(scratch_name)
        if from_git is not None:
            source = assemble_from_git(entry, from_git, scratch)
        else:
            (scratch / "package").mkdir()
            source = download_package(entry, scratch / "package")
        try:
            canonical = write_canonical(source, scratch / "canonical")
        except helm_python.HelmError as error:
            raise PullError(f"chart {entry.label}: Helm cannot load it: {_first_line(error)}") from None
        for label, expected, actual in digest_mismatches(canonical, entry)[:1]:
            raise PullError(
                f"chart {label}: digest mismatch: expected {expected}, got {actual} (the cache is unchanged)"
            )
        target = cached_chart_path(entry, cache)
        if target.parent.exists():
            shutil.rmtree(target.parent)
        target.parent.mkdir(parents=True)
        canonical.rename(target)
    return target


def pull_charts(
    cache: Path, *, from_git: Path | None = None, names: Iterable[str] = (), lock_path: Path = LOCK_PATH
) -> list[str]:
    """Pull every locked chart (or `names`); prints one line per chart, returns the errors."""
    lock = load_lock(lock_path)
    wanted = list(names) or sorted(lock)
    errors = [f"chart {name}: not in the lock ({lock_path})" for name in wanted if name not in lock]
    for name in (n for n in wanted if n in lock):
        entry = lock[name]
        if not cache_problems(entry, cache):
            print(f"chart {entry.label}: already in the cache, verified ({entry.digest})")
            continue
        try:
            target = pull_chart(entry, cache, from_git=from_git)
        except PullError as error:
            errors.append(str(error))
            print(f"error: {error}", file=sys.stderr)
            continue
        print(f"chart {entry.label}: pulled and verified ({entry.digest}) -> {target}")
    return errors


def command_pull(dest: str | None, from_git: str | None, names: list[str]) -> int:
    cache = Path(dest).resolve() if dest else chart_cache_dir()
    mirrors = Path(from_git).resolve() if from_git else None
    if mirrors is not None and not mirrors.is_dir():
        print(f"error: --from-git {from_git}: not a directory of git mirrors", file=sys.stderr)
        return 2
    errors = pull_charts(cache, from_git=mirrors, names=names)
    if errors:
        print(
            f"{len(errors)} chart(s) not pulled; the cache ({cache}) holds only verified charts",
            file=sys.stderr,
        )
        return 1
    if dest and Path(dest).resolve() != chart_cache_dir():
        print(f"note: set {CACHE_ENV}={cache} for render, preview and up to read this cache")
    return 0


def command_verify(dest: str | None) -> int:
    cache = Path(dest).resolve() if dest else chart_cache_dir()
    lock = load_lock()
    bad = 0
    for name in sorted(lock):
        problems = cache_problems(lock[name], cache)
        bad += bool(problems)
        for problem in problems or []:
            print(f"error: {problem.message()}", file=sys.stderr)
        if not problems:
            print(f"chart {lock[name].label}: verified ({lock[name].digest})")
    if bad:
        print(
            f"{bad} chart(s) missing or not matching the lock; run `{PULL_COMMAND}`",
            file=sys.stderr,
        )
    return 1 if bad else 0


def command_digest(path: str) -> int:
    """The lock digest of a chart directory or package, and of each subchart (for bumping a chart)."""
    source = Path(path)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            canonical = write_canonical(source, Path(scratch))
            print(f"{canonical.name}: {tree_digest(canonical)}")
            subcharts = canonical / "charts"
            for sub in sorted(subcharts.iterdir()) if subcharts.is_dir() else []:
                print(f"  {sub.name}: {tree_digest(sub)}")
            if source.is_file():
                print(f"package: {helm_python.digest(source)}")
    except helm_python.HelmError as error:
        print(f"error: {path}: Helm cannot load it: {_first_line(error)}", file=sys.stderr)
        return 1
    return 0
