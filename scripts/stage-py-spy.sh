#!/usr/bin/env bash
# py-spy for the lab GPU host's stall dumps (bench/tensor_parallel/run.py), which has no package index:
# the static binary from PyPI's manylinux wheel into DIR (default .gpu/tools, git-ignored), carried
# there by `bench/lab_session.sh stage tools`. The version is the test extra's (pyproject.toml).
set -euo pipefail
dir=${1:-.gpu/tools}
version=0.4.3
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
  --python-version 3.12 --dest "$work" "py-spy==$version"
"$python" -m zipfile -e "$work"/py_spy-"$version"-*.whl "$work/x"
mkdir -p "$dir"
install -m 0755 "$(find "$work/x" -type f -name py-spy | head -n 1)" "$dir/py-spy"
"$dir/py-spy" --version
