"""The per-model plan the rest of the stack consumes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.config.models import ModelConfig
from infra.config.platform import PlatformConfig

_BYTES_PER_PARAMETER = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "int8": 1, "int4": 0.5}


@dataclass(frozen=True)
class ModelPlan:
    model: str
    gpu_group: str
    gpu_model: str
    weight_bytes_per_gpu: int
    startup_budget_seconds: int


@dataclass(frozen=True)
class PlatformPlan:
    models: dict[str, ModelPlan]


def weight_bytes(model: ModelConfig) -> int:
    parameters = (model.architecture.parameters_billion or 8.0) * 1e9
    dtype = model.architecture.weight_dtype or "bfloat16"
    return int(parameters * _BYTES_PER_PARAMETER[dtype])


def startup_budget_seconds(model: ModelConfig) -> int:
    """Image pull + copy from the shared volume + load into GPU memory + compile, with a margin."""
    mib = weight_bytes(model) / 2**20
    startup = model.startup
    seconds = (
        startup.image_pull_seconds
        + mib / startup.shared_volume_mib_per_second
        + mib / startup.weight_load_mib_per_second
        + startup.compile_seconds
    )
    return int(math.ceil(seconds * startup.safety_factor))


def plan_platform(config: PlatformConfig) -> PlatformPlan:
    plans = {}
    for model in config.models:
        group = config.node_groups.gpu[model.gpu_group]
        plans[model.name] = ModelPlan(
            model=model.name,
            gpu_group=model.gpu_group,
            gpu_model=group.gpu_model.name,
            weight_bytes_per_gpu=weight_bytes(model) // model.tensor_parallel_size,
            startup_budget_seconds=startup_budget_seconds(model),
        )
    return PlatformPlan(models=plans)
