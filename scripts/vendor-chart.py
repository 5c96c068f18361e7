#!/usr/bin/env python3
"""Vendor one Helm chart (or one subchart) from its upstream git repository and lock it.

Charts are taken from the upstream *git* repository at the chart's release tag, never from a chart
repository (those cannot be reached from CI). With a bare mirror of the upstream repository:

    scripts/vendor-chart.py --mirror /path/to/repo.git --tag v0.20.0 \\
        --path deployments/helm/nvidia-device-plugin --name nvidia-device-plugin \\
        --repository https://nvidia.github.io/k8s-device-plugin
    scripts/vendor-chart.py --mirror /path/to/nfd.git --tag v0.19.0 \\
        --path deployment/helm/node-feature-discovery --name node-feature-discovery \\
        --parent nvidia-device-plugin

A chart goes to charts/<name>/ exactly as the tag has it; a subchart (`--parent`) to
charts/<parent>/charts/<name>/, and its version must satisfy the parent's Chart.yaml constraint.
Packaged dependencies a parent commits (charts/*.tgz) are left out, because each dependency is
vendored unpacked from its own repository instead (Helm would load both). Local subcharts that
ship inside the parent (`repository` empty or `file://`) are locked with the parent. Vendoring a
parent again replaces its directory, so vendor its other dependencies again afterwards; the
script lists the ones missing. The lock entry (charts/charts.lock.yaml) records tag, commit, path
and the digest of the vendored directory; the parent's digest is refreshed after each subchart.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from components.helm.lock import LockedChart, tree_digest  # noqa: E402

LOCK_HEADER = """\
# Every Helm chart the stack installs, vendored under charts/<name>/ (subcharts unpacked under
# charts/<name>/charts/<dependency>/), taken from the upstream git repository at the release tag.
# Written by scripts/vendor-chart.py; checked by tests/test_chart_lock.py against the files and
# the *_CHART pins in infra/versions.py. Do not edit by hand.
#
# To vendor or bump a chart: bring a bare mirror of `source` (e.g. `git clone --mirror`), then
#   scripts/vendor-chart.py --mirror <mirror> --tag <tag> --path <path> --name <name> --repository <helm repo>
# and, for each dependency in its Chart.yaml that is not local (the version its Chart.lock pins),
#   scripts/vendor-chart.py --mirror <dep mirror> --tag <dep tag> --path <dep path> --name <dep> \\
#       --parent <name>
# then update the chart's pin in infra/versions.py and read the values diff against our *_values code.
# digest: sha256 over the vendored directory's files sorted by relative POSIX path, each adding
# "<path>\\0<sha256(content)>\\n" (components/helm/lock.py: tree_digest; nothing ignored).
"""


def git(mirror: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True).stdout


def extract(mirror: Path, tag: str, path: str, target: Path) -> None:
    """Write the chart at `tag:path` into `target`, links refused.

    `path` is the chart's directory, or a packaged chart (`.tgz`) committed in the repository: some
    parents commit their dependency as the archive the chart repository serves, whose Chart.yaml
    carries the released version where the dependency's own source tree has a placeholder.
    """
    if path.endswith(".tgz"):
        data, mode = git(mirror, "show", f"{tag}:{path}"), "r:gz"
    else:
        treeish = tag if path in ("", ".") else f"{tag}:{path.strip('/')}"
        data, mode = git(mirror, "archive", "--format=tar", treeish), "r:"
    with tarfile.open(fileobj=io.BytesIO(data), mode=mode) as tar:
        for member in tar.getmembers():
            if member.issym() or member.islnk():
                raise SystemExit(f"{path}@{tag}: {member.name} is a link; vendor it by hand and say why")
        if not path.endswith(".tgz"):
            tar.extractall(target, filter="data")
            return
        with tempfile.TemporaryDirectory() as unpacked:
            tar.extractall(unpacked, filter="data")
            (top,) = Path(unpacked).iterdir()  # a packaged chart holds one directory, the chart
            shutil.copytree(top, target)


def source_url(mirror: Path) -> str:
    """https://github.com/<owner>/<name> from a mirror path like .../<owner>+<name>/repo."""
    for part in reversed(mirror.resolve().parts):
        if "+" in part:
            owner, name = part.split("+", 1)
            return f"https://github.com/{owner}/{name.removesuffix('.git')}"
    raise SystemExit(f"cannot tell the upstream repository from {mirror}; pass --source")


def read_lock(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return list((yaml.safe_load(path.read_text()) or {}).get("charts") or [])


def write_lock(path: Path, charts: list[dict[str, Any]]) -> None:
    charts = sorted(charts, key=lambda c: c["name"])
    path.write_text(LOCK_HEADER + yaml.safe_dump({"charts": charts}, sort_keys=False, width=120))


def chart_meta(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "Chart.yaml").read_text())


def is_local(dependency: dict[str, Any]) -> bool:
    repository = str(dependency.get("repository") or "")
    return repository == "" or repository.startswith("file://")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mirror", type=Path, required=True, help="bare git mirror of the upstream repository"
    )
    parser.add_argument("--tag", required=True, help="the chart's release tag")
    parser.add_argument(
        "--path", required=True, help="the chart's directory inside the repository ('.' = root)"
    )
    parser.add_argument("--name", required=True, help="the chart's name (its Chart.yaml name)")
    parser.add_argument("--parent", help="vendor as a dependency of this already vendored chart")
    parser.add_argument(
        "--repository", help="the Helm repository users add (default: the parent's Chart.yaml)"
    )
    parser.add_argument("--source", help="upstream git URL (default: from the mirror path owner+name)")
    parser.add_argument("--charts-dir", type=Path, default=REPO_ROOT / "charts")
    args = parser.parse_args(argv)

    charts_dir: Path = args.charts_dir
    lock_path = charts_dir / "charts.lock.yaml"
    commit = git(args.mirror, "rev-parse", f"{args.tag}^{{commit}}").decode().strip()
    source = args.source or source_url(args.mirror)

    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / args.name
        extract(args.mirror, args.tag, args.path, staged)
        meta = chart_meta(staged)
        if meta.get("name") != args.name:
            raise SystemExit(
                f"{args.path}@{args.tag}: Chart.yaml name is {meta.get('name')!r}, not {args.name!r}"
            )
        packaged = (
            sorted(p for p in (staged / "charts").glob("*.tgz")) if (staged / "charts").is_dir() else []
        )
        if args.parent is None:
            for archive in packaged:
                left_out = archive.relative_to(staged)
                print(f"left out {left_out}: vendor that dependency unpacked (--path may name the .tgz)")
                archive.unlink()

        entries = read_lock(lock_path)
        if args.parent is None:
            target = charts_dir / args.name
            repository = args.repository
            if not repository:
                raise SystemExit("--repository (the Helm repository users add) is required for a chart")
        else:
            parent_dir = charts_dir / args.parent
            parent_meta = chart_meta(parent_dir)
            wanted = [d for d in parent_meta.get("dependencies") or () if d["name"] == args.name]
            if not wanted:
                raise SystemExit(f"{args.parent}'s Chart.yaml has no dependency named {args.name}")
            repository = args.repository or str(wanted[0].get("repository") or "")
            target = parent_dir / "charts" / args.name
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(staged, target)
        if args.parent is not None:
            # Helm's own check (`helm dependency list`): "unpacked" = present as a directory, named
            # as Chart.yaml says, at a version satisfying the constraint.
            status = dependency_status(charts_dir / args.parent, args.name)
            if status != "unpacked":
                shutil.rmtree(target)
                raise SystemExit(
                    f"{args.name} {meta['version']} as a dependency of {args.parent}: Helm says {status!r}"
                )

    entry = LockedChart(
        name=args.name,
        version=str(meta["version"]),
        app_version=str(meta.get("appVersion") or ""),
        repository=repository,
        source=source,
        tag=args.tag,
        commit=commit,
        path=args.path,
        digest=tree_digest(target),
    ).to_dict()

    if args.parent is None:
        local = []
        for dependency in meta.get("dependencies") or ():
            sub = target / "charts" / dependency["name"]
            if is_local(dependency) and sub.is_dir():
                sub_meta = chart_meta(sub)
                local.append(
                    LockedChart(
                        name=dependency["name"],
                        version=str(sub_meta["version"]),
                        app_version=str(sub_meta.get("appVersion") or ""),
                        repository="",
                        source=source,
                        tag=args.tag,
                        commit=commit,
                        path=f"{args.path.rstrip('/')}/charts/{dependency['name']}",
                        digest=tree_digest(sub),
                    ).to_dict()
                )
        if local:
            entry["dependencies"] = local
        entries = [e for e in entries if e["name"] != args.name] + [entry]
        missing = [d["name"] for d in meta.get("dependencies") or () if not is_local(d)]
        for name in missing:
            version = meta_dependency_version(meta, name)
            print(f"now vendor dependency {name} {version} with --parent {args.name}")
    else:
        parents = [e for e in entries if e["name"] == args.parent]
        if not parents:
            raise SystemExit(f"{args.parent} is not in {lock_path}; vendor it first")
        parent = parents[0]
        deps = [d for d in parent.get("dependencies") or () if d["name"] != args.name] + [entry]
        parent["dependencies"] = sorted(deps, key=lambda d: d["name"])
        parent["digest"] = tree_digest(charts_dir / args.parent)
    write_lock(lock_path, entries)
    where = target.relative_to(charts_dir)
    print(f"vendored {args.name} {meta['version']} ({args.tag} {commit[:12]}) into {where}")
    return 0


def meta_dependency_version(meta: dict[str, Any], name: str) -> str:
    return next(str(d["version"]) for d in meta["dependencies"] if d["name"] == name)


def dependency_status(parent_dir: Path, name: str) -> str:
    import helm_python

    return next(d["status"] for d in helm_python.dependency_list(parent_dir) if d["name"] == name)


if __name__ == "__main__":
    sys.exit(main())
