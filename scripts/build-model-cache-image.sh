#!/usr/bin/env bash
# Builds the model-cache (preloader) image from model-cache/Dockerfile without any container
# registry: the base image is assembled here from Debian packages (debootstrap), imported with
# `buildah from scratch`, and passed to the Dockerfile as PYTHON_IMAGE. Then the built image's own
# entry point runs inside a container (`model-cache --help`, `preload --help`, `verify` of a real
# cache directory) to prove the image works. The published image is built by
# .github/workflows/release-model-cache.yaml from python:3.12-slim-bookworm instead.
#
#   sudo bash scripts/build-model-cache-image.sh [--rebuild]
#
# Needs root, buildah and debootstrap (Debian: apt-get install buildah debootstrap), and the Debian
# archive and PyPI reachable (the Dockerfile's pip steps install requirements*.lock by hash).
# The result stays in buildah's storage as localhost/model-cache:<version>, labelled with a digest
# of its build context; model-cache/tests/test_image.py runs the preloader from it against a real S3
# API. Idempotent: the base (localhost/model-cache-base:bookworm) is assembled once, and the image is
# rebuilt only when model-cache/ changed (or with --rebuild). scripts/setup-test-tools.sh calls it.
# Timings on this repository's 2-core machine are in model-cache/README.md ("Building the image").
set -euo pipefail
cd "$(dirname "$0")/.."

rebuild=false
[ "${1:-}" = "--rebuild" ] && rebuild=true
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "$tool is missing: apt-get install buildah debootstrap" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "run as root (debootstrap and buildah's chroot need it)" >&2; exit 2; }

# The image's tag is the project's version (the release workflow and domain/versions.py use the same).
version="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
suite="bookworm"  # the Debian release python:3.12-slim-bookworm is built on
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base_image="localhost/model-cache-base:${suite}"
image="localhost/model-cache:${version}"
# What the Dockerfile COPYs, hashed as `sha256sum` lists it (model-cache/tests/test_image.py
# recomputes it to refuse a stale image).
context_label="org.vllm-platform.model-cache.context-sha256"
context_digest="$(cd model-cache && find Dockerfile requirements.lock requirements-build.lock pyproject.toml \
  README.md model_cache -type f ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum \
  | sha256sum | cut -d' ' -f1)"
build_dir="${BUILD_DIR:-$(mktemp -d /tmp/model-cache-image.XXXXXX)}"
rootfs="$build_dir/rootfs"
containers=()
cleanup() {
  for container in "${containers[@]}"; do buildah rm "$container" >/dev/null 2>&1 || true; done
  [ -n "${BUILD_DIR:-}" ] || rm -rf "$build_dir"
}
trap cleanup EXIT
step() { echo "== $(date -u +%H:%M:%S) $*"; }
image_exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }

# A Debian tree with Python, pip and venv, imported as an image: what the Dockerfile needs of
# python:3.12-slim-bookworm (here Debian's Python 3.11, which model-cache supports).
assemble_base() {
  step "debootstrap $suite (minbase + python3, venv, pip) into $rootfs"
  if [ ! -x "$rootfs/usr/bin/python3" ]; then
    debootstrap --variant=minbase \
      --include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates \
      "$suite" "$rootfs" "$mirror" >"$build_dir/debootstrap.log" 2>&1 \
      || { tail -20 "$build_dir/debootstrap.log" >&2; exit 1; }
  fi
  # Like the python image: `python` and `pip` on PATH, and pip may install into the system Python
  # (the Dockerfile's build stage does; Debian marks its Python externally managed, PEP 668).
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  # Certificate authorities this host adds (e.g. a TLS-inspecting egress proxy) so pip in the build
  # reaches PyPI as the host does; only the local test base gets them, never the published image.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null
  fi
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb

  step "import the tree as $base_image"
  tar -C "$rootfs" --numeric-owner -cf "$build_dir/rootfs.tar" .
  base="$(buildah from scratch)"
  containers+=("$base")
  buildah add --quiet "$base" "$build_dir/rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$base"
  buildah commit --quiet --rm "$base" "$base_image" >/dev/null
  rm -f "$build_dir/rootfs.tar"
}

if image_exists "$base_image" && [ "$rebuild" = false ]; then
  step "base $base_image exists"
else
  assemble_base
fi

built_from="$(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$context_label\"}}" \
  "$image" 2>/dev/null || true)"
if [ "$built_from" = "$context_digest" ] && [ "$rebuild" = false ]; then
  step "$image is up to date with model-cache/ ($context_digest)"
else
  step "build $image from model-cache/Dockerfile (PYTHON_IMAGE=$base_image)"
  buildah build --quiet --pull=never --network host --isolation chroot --layers=false \
    --build-arg "PYTHON_IMAGE=$base_image" --label "$context_label=$context_digest" \
    -t "$image" model-cache/ >/dev/null
  buildah rmi --prune >/dev/null 2>&1 || true  # the previous build's now untagged image
fi

step "run the image's entry point in a container"
user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")"
entrypoint="$(buildah inspect --type image --format '{{.OCIv1.Config.Entrypoint}}' "$image")"
[ "$user" = "10001:10001" ] || { echo "image user is '$user', expected 10001:10001" >&2; exit 1; }
[ "$entrypoint" = '[model-cache]' ] || { echo "entry point is $entrypoint" >&2; exit 1; }
container="$(buildah from --pull=never "$image")"
containers+=("$container")
# `buildah run` does not apply the entry point, so name it as the pod's `command` does.
run() { buildah run --isolation chroot --user 10001:10001 "$container" -- "$@"; }
run model-cache --help | head -3
run model-cache preload --help | grep -q -- '--shared-root'
# A real (empty) revision directory checked by the installed program: `verify` must refuse it
# (no completion marker, exit 8) and say so, proving the package and its dependencies import.
set +e
verify_output="$(run model-cache verify --dir /tmp 2>&1)"
verify_status=$?
set -e
[ "$verify_status" -eq 8 ] || { echo "verify exited $verify_status: $verify_output" >&2; exit 1; }
run python -c 'import boto3, model_cache; print("boto3", boto3.__version__)'
# The code is root-owned: the runtime user cannot modify it.
if run sh -c 'touch /opt/model-cache/bin/model-cache' 2>/dev/null; then
  echo "the runtime user can write the installed program" >&2; exit 1
fi
step "ok: $image"
