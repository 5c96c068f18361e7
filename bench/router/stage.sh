#!/usr/bin/env bash
# On a machine with PyPI: the router's wheels for the GPU host, which has vLLM 0.26.0 (and with it
# fastapi, uvicorn, aiohttp, requests) but no package index.   bash bench/router/stage.sh .gpu/router
set -euo pipefail
dest=${1:-.gpu/router}
repo=$(cd "$(dirname "$0")/../.." && pwd)
version=$(cd "$repo" && python3 -c 'from domain.versions import VLLM_ROUTER_VERSION; print(VLLM_ROUTER_VERSION)')
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$dest" "vllm-router==$version" orjson setproctitle
ls -l "$dest"
