#!/usr/bin/env bash
# Create (or repair) the virtualenv that runs checkov over the rendered Kubernetes manifests.
# Idempotent: a venv that already runs the pinned checkov is left as it is.
#
#   scripts/setup-checkov.sh [VENV_DIR]      (default: .venv-checkov, relative to the repo root)
#
# checkov has its own venv because its `packaging` pin conflicts with the Pulumi SDK's.
# The version is pinned: a new checkov brings new checks, and the suite fails on any failed check
# that checkov/skips.yaml does not list — bump it deliberately and review the new findings.
set -euo pipefail

# Pinned 2026-11-29: checkov 3.3.30 (PyPI, released 2026-10).
CHECKOV_VERSION="3.3.30"
PYTHON="${PYTHON:-python3}"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-.venv-checkov}"
case "$venv" in /*) ;; *) venv="$repo_root/$venv" ;; esac

installed_version() {
    # Prints the installed checkov version, or nothing when checkov does not run.
    "$venv/bin/checkov" --version 2>/dev/null | tail -n 1 || true
}

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv"
    "$PYTHON" -m venv "$venv"
fi

if [[ "$(installed_version)" != "$CHECKOV_VERSION" ]]; then
    echo "installing checkov==$CHECKOV_VERSION into $venv (takes a minute or two)"
    "$venv/bin/pip" install --quiet --upgrade pip
    "$venv/bin/pip" install --quiet "checkov==$CHECKOV_VERSION"
fi

echo "checkov $(installed_version) in $venv"
