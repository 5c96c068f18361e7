"""`models[].lora`: the LoRA adapters a model serves beside its base weights, and how many at once."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from domain.config.base import StrictModel
from domain.config.errors import ConfigProblem
from domain.config.source import ModelSourceConfig

LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
"""The adapter ranks vLLM 0.32.0 can reserve room for (`--max-lora-rank` choices, in the flags snapshot
infra/data/vllm-0.32.0-server-flags.json)."""


_ADAPTER_NAME = r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,99}$"


class LoraAdapterConfig(StrictModel):
    """One LoRA adapter served on top of the model: clients name it as the request's `model`."""

    name: Annotated[str, Field(pattern=_ADAPTER_NAME)]
    """The `model` clients send to reach this adapter (unique across every model's served names);
    letters, digits, `.`, `_`, `+`, `-`, not starting with `.` or `-` (it is also a directory name)."""
    source: ModelSourceConfig
    """Where the adapter's files (adapter_config.json, adapter_model.safetensors) live, pinned to a
    revision exactly like the model's own `source`."""
    rank: Annotated[int, Field(ge=1, le=512)]
    """The adapter's LoRA rank (`r` in its adapter_config.json); at most `max_lora_rank`. The
    preloader refuses an adapter whose file says otherwise."""


class LoraConfig(StrictModel):
    """LoRA adapters served by the model's own replicas (vLLM `--enable-lora`; docs/lora.md)."""

    adapters: list[LoraAdapterConfig] = []
    """Adapters preloaded beside the weights and registered at start (`--lora-modules`)."""
    max_loras: Annotated[int, Field(ge=1, le=256)] = 1
    """Adapters usable in one batch (`--max-loras`): GPU memory for this many adapters of
    `max_lora_rank` is set aside at start (the capacity plan counts it); requests for more wait."""
    max_lora_rank: LoraRank = 16
    """Largest adapter rank served (`--max-lora-rank`); sizes the GPU reservation."""
    max_cpu_loras: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Adapters kept in host memory, ready to swap onto the GPU (`--max-cpu-loras`); at least
    max_loras; null = vLLM's default, max_loras."""
    runtime_loading: bool = False
    """Let holders of the model's API key load and unload adapters at run time
    (`/v1/load_lora_adapter`, vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`). Off: the adapters are
    exactly the pinned list above. On is a trust decision: any key holder can make the server fetch
    and run weights from any path or Hugging Face repo it can reach (docs/lora.md)."""

    @model_validator(mode="after")
    def _adapters_fit(self) -> LoraConfig:
        seen: dict[str, int] = {}
        for index, adapter in enumerate(self.adapters):
            if adapter.name in seen:
                raise ConfigProblem(
                    f"duplicate adapter name (also adapters[{seen[adapter.name]}]); each adapter is one "
                    "served model name",
                    at=("adapters", index, "name"),
                    value=adapter.name,
                )
            seen[adapter.name] = index
            if adapter.rank > self.max_lora_rank:
                raise ConfigProblem(
                    f"rank {adapter.rank} is larger than max_lora_rank {self.max_lora_rank}; raise "
                    "max_lora_rank (GPU memory is set aside for max_loras adapters of that rank)",
                    at=("adapters", index, "rank"),
                    value=adapter.rank,
                )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigProblem(
                f"max_cpu_loras {self.max_cpu_loras} is below max_loras {self.max_loras} (vLLM refuses "
                "to start); raise it or leave it unset",
                at=("max_cpu_loras",),
                value=self.max_cpu_loras,
            )
        if not self.adapters and not self.runtime_loading:
            raise ConfigProblem(
                "LoRA is on but serves nothing: list adapters, or set runtime_loading: true, or remove lora",
                at=("adapters",),
                value=[],
            )
        return self

    @property
    def cpu_cache_size(self) -> int:
        """Adapters vLLM keeps in host memory (`--max-cpu-loras`, vLLM's default max_loras)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras
