"""The GPU instance catalogue: instance type → GPU model, GPUs per node, GPU memory, local NVMe.

The data and its sources are in gpu_instances.yaml beside this file.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict


class GpuModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    memory_mib: int
    compute_capability: str
    fp8: bool

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * 1024 * 1024


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
