"""The GPU instance catalogue: instance type → GPU model, GPUs per node, GPU memory, local NVMe.

The data and its sources are in gpu_instances.yaml beside this file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

# FP8 tensor cores from here on (GpuModel.fp8).
FP8_COMPUTE_CAPABILITY = (8, 9)


class GpuModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    memory_mib: int
    compute_capability: str
    """NVIDIA's major.minor, e.g. "8.0" for A100, "9.0" for H100 and H200."""

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024

    @property
    def fp8(self) -> bool:
        """FP8 tensor cores: compute capability 8.9 or later (Ada Lovelace, Hopper, Blackwell). vLLM
        runs FP8 weights and activations (W8A8) only there; below, from 7.5, it runs FP8 weights
        weight-only (W8A16, FP8 Marlin) — vLLM 0.32.0 docs, "FP8 W8A8"
        (https://docs.vllm.ai/en/v0.32.0/features/quantization/llm_compressor/fp8/), and its
        `CudaPlatform.supports_fp8()`, `has_device_capability(89)`."""
        major, minor = (int(part) for part in self.compute_capability.split("."))
        return (major, minor) >= FP8_COMPUTE_CAPABILITY


class GpuInstanceType(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: GpuModel
    gpus_per_node: int
    vcpus: int
    memory_gib: int
    local_nvme_gib: int


@cache
def gpu_instance_types() -> dict[str, GpuInstanceType]:
    raw = yaml.safe_load((Path(__file__).with_name("gpu_instances.yaml")).read_text())
    gpus = {name: GpuModel(name=name, **spec) for name, spec in raw["gpus"].items()}
    return {
        name: GpuInstanceType(name=name, **{**spec, "gpu": gpus[spec["gpu"]]})
        for name, spec in raw["instance_types"].items()
    }


def lookup_instance_type(name: str) -> GpuInstanceType | None:
    return gpu_instance_types().get(name)
