#!/usr/bin/env bash
# Create (or repair) the virtualenv with the pinned vLLM router (PyPI vllm-router) that
# tests/e2e/test_router.py runs in front of real vLLM servers. Idempotent.
#
#   scripts/setup-vllm-router.sh [VENV_DIR]      (default: .venv-router, relative to the repo root)
#
# The version and the wheel's sha256 are the pin in domain/versions.py (VLLM_ROUTER_VERSION,
# VLLM_ROUTER_WHEEL_SHA256): the image the stack deploys (router/Dockerfile) wraps the same wheel.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-.venv-router}"
case "$venv" in /*) ;; *) venv="$repo_root/$venv" ;; esac
pin() { "$PYTHON" -c "import sys; sys.path.insert(0, '$repo_root'); from domain import versions; print(versions.$1)"; }
version="$(pin VLLM_ROUTER_VERSION)"
wheel_sha256="$(pin VLLM_ROUTER_WHEEL_SHA256)"

installed_version() {
    "$venv/bin/python" -c 'import vllm_router; print(vllm_router.__version__)' 2>/dev/null || true
}

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv"
    "$PYTHON" -m venv "$venv"
fi
if [[ "$(installed_version)" != "$version" ]]; then
    echo "installing vllm-router==$version into $venv"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$venv/bin/pip" download --quiet --no-deps --only-binary=:all: -d "$tmp" "vllm-router==$version"
    echo "$wheel_sha256  $(ls "$tmp"/vllm_router-*.whl)" | sha256sum --check --quiet
    "$venv/bin/pip" install --quiet "$tmp"/vllm_router-*.whl
fi
echo "vllm-router $(installed_version) in $venv"
