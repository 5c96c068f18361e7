#!/usr/bin/env python3
"""Run checkov over rendered Kubernetes manifests and judge the result against checkov/skips.yaml.

    python scripts/checkov_gate.py out/dev/kubernetes out/prod/kubernetes [--checkov PATH]

Fails (exit 1) on any failed check the skip list does not cover, and on any skip that no longer
matches a failure (a stale skip hides the next real finding). tests/test_security_scan.py runs the
same functions over every stack. checkov lives in its own venv (scripts/setup-checkov.sh).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
SKIPS_FILE = REPO_ROOT / "checkov" / "skips.yaml"
DEFAULT_CHECKOV = REPO_ROOT / ".venv-checkov" / "bin" / "checkov"


@dataclass(frozen=True)
class Finding:
    check_id: str
    check_name: str
    resource: str  # checkov's id: Kind.namespace.name
    file: str

    def __str__(self) -> str:
        return f"{self.check_id} ({self.check_name}) on {self.resource} in {self.file}"


@dataclass(frozen=True)
class Skip:
    check: str
    reason: str
    resources: tuple[str, ...] = ("*",)

    def covers(self, finding: Finding) -> bool:
        return finding.check_id == self.check and any(
            fnmatch.fnmatchcase(finding.resource, p) for p in self.resources
        )

    def __str__(self) -> str:
        return f"{self.check} on {', '.join(self.resources)}"


def load_skips(path: Path = SKIPS_FILE) -> list[Skip]:
    document = yaml.safe_load(path.read_text()) or {}
    skips = []
    for index, entry in enumerate(document.get("skips") or []):
        if not entry.get("check") or not str(entry.get("reason", "")).strip():
            raise ValueError(f"{path}: skips[{index}] needs `check` and a `reason`")
        skips.append(Skip(entry["check"], entry["reason"].strip(), tuple(entry.get("resources") or ("*",))))
    return skips


def checkov_executable() -> Path:
    executable = Path(os.environ.get("CHECKOV", DEFAULT_CHECKOV))
    if not executable.exists():
        raise FileNotFoundError(
            f"checkov not found at {executable}; run scripts/setup-checkov.sh (or set CHECKOV)"
        )
    return executable


@dataclass(frozen=True)
class Report:
    failed: list[Finding]
    passed: list[Finding]
    summary: dict


def run_checkov(directories: dict[str, Path], checkov: Path | None = None) -> Report:
    """checkov --framework kubernetes over the manifests, every check on (skips are applied after).

    `directories` maps a label (the stack) to its rendered kubernetes/ folder; they are scanned in one
    run, each under its label, so findings name the stack in their file path.
    """
    checkov = checkov or checkov_executable()
    with tempfile.TemporaryDirectory(prefix="checkov-") as scratch:
        root = Path(scratch) / "rendered"
        for label, directory in directories.items():
            shutil.copytree(directory, root / label)
        # cwd outside the repo so no stray .checkov.yaml applies; --skip-download: no network.
        completed = subprocess.run(
            [
                str(checkov),
                "--directory",
                str(root),
                "--framework",
                "kubernetes",
                "--output",
                "json",
                "--skip-download",
            ],
            cwd=scratch,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "LOG_LEVEL": "ERROR"},
        )
    if completed.returncode not in (0, 1):
        raise RuntimeError(f"checkov exited {completed.returncode}:\n{completed.stderr[-4000:]}")
    report = json.loads(completed.stdout)
    if isinstance(report, list):  # one entry per framework when several ran
        report = next(r for r in report if r.get("check_type") == "kubernetes")
    results = report.get("results") or {}

    def findings(key: str) -> list[Finding]:
        return [
            Finding(f["check_id"], f["check_name"], f["resource"], f["file_path"].lstrip("/"))
            for f in results.get(key, [])
        ]

    # With nothing to scan checkov prints only a summary.
    return Report(findings("failed_checks"), findings("passed_checks"), report.get("summary", report))


def unskipped(findings: list[Finding], skips: list[Skip]) -> list[Finding]:
    return [finding for finding in findings if not any(skip.covers(finding) for skip in skips)]


def stale(findings: list[Finding], skips: list[Skip]) -> list[Skip]:
    return [skip for skip in skips if not any(skip.covers(finding) for finding in findings)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "directories", nargs="+", type=Path, help="rendered kubernetes/ folders (out/<stack>/kubernetes)"
    )
    parser.add_argument(
        "--checkov", type=Path, help="checkov executable (default: .venv-checkov/bin/checkov)"
    )
    parser.add_argument("--skips", type=Path, default=SKIPS_FILE)
    args = parser.parse_args(argv)
    # out/<stack>/kubernetes is labelled <stack>, out/<stack>/charts <stack>+charts.
    labels = {
        (directory.parent.name or str(index))
        + ("" if directory.name == "kubernetes" else f"+{directory.name}"): directory
        for index, directory in enumerate(args.directories)
    }
    report = run_checkov(labels, args.checkov)
    findings, summary = report.failed, report.summary
    skips = load_skips(args.skips)
    new, old = unskipped(findings, skips), stale(findings, skips)
    print(
        f"checkov {summary.get('checkov_version', '?')}: {summary.get('passed', 0)} passed, "
        f"{summary.get('failed', 0)} failed over {summary.get('resource_count', 0)} resources; "
        f"{len(findings) - len(new)} failures skipped by {args.skips.relative_to(REPO_ROOT)}"
    )
    for finding in new:
        print(f"FAILED {finding}")
    for skip in old:
        print(f"STALE SKIP {skip}: no failure matches it any more; remove it from {args.skips.name}")
    return 1 if new or old else 0


if __name__ == "__main__":
    sys.exit(main())
