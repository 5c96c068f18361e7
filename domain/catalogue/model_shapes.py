"""Model shapes by preset name: the config.json values of the models the stack plans for.

The data and the URL of each config.json are in model_shapes.yaml beside this file.
`architecture_values` reads a Hugging Face config.json (a preset's, or one a user has in hand) into
the field names of `ArchitectureConfig`; bench/capacity/mkshape.py writes a preset's config.json back
out so vLLM can serve that shape with dummy weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

_CATALOGUE = Path(__file__).with_name("model_shapes.yaml")

_TORCH_DTYPES = {"bfloat16", "float16", "float32"}


@dataclass(frozen=True)
class ModelShapePreset:
    name: str
    source: str
    """URL of the config.json the values were copied from."""
    config_json: Mapping[str, Any]
    """The config.json keys that decide memory, verbatim."""

    @property
    def architecture(self) -> dict[str, Any]:
        """The preset as ArchitectureConfig field values."""
        return architecture_values(self.config_json)


@cache
def model_shape_presets() -> dict[str, ModelShapePreset]:
    raw = yaml.safe_load(_CATALOGUE.read_text())
    return {
        name: ModelShapePreset(name=name, source=spec["source"], config_json=dict(spec["config_json"]))
        for name, spec in raw["presets"].items()
    }


def lookup_preset(name: str) -> ModelShapePreset | None:
    return model_shape_presets().get(name)


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


def architecture_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """ArchitectureConfig field values from a Hugging Face config.json (absent keys are left out).

    Family-specific reading, each from the Transformers modelling code of that family:
    - Qwen2 has Q/K/V biases and no flag for them; its `sliding_window` applies only when
      `use_sliding_window` is true.
    - Llama's `attention_bias` puts biases on q/k/v and o.
    - Mixtral's experts use `intermediate_size`; DeepSeek and Qwen-MoE name it `moe_intermediate_size`
      and count experts as `n_routed_experts` / `num_experts`.
    """
    model_type = str(config.get("model_type", ""))
    classes = config.get("architectures") or [None]
    values: dict[str, Any] = {
        "architecture_class": classes[0],
        "num_hidden_layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "num_attention_heads": config.get("num_attention_heads"),
        "num_key_value_heads": config.get("num_key_value_heads"),
        "head_dim": config.get("head_dim"),
        "intermediate_size": config.get("intermediate_size"),
        "vocab_size": config.get("vocab_size"),
        "max_position_embeddings": config.get("max_position_embeddings"),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
    }
    if config.get("use_sliding_window", True):
        values["sliding_window"] = config.get("sliding_window")
    if model_type.startswith("qwen2"):
        values["qkv_bias"] = True
        values["attention_output_bias"] = False
    elif "attention_bias" in config:
        values["qkv_bias"] = bool(config["attention_bias"])
        values["attention_output_bias"] = bool(config["attention_bias"])

    experts = _first(config, "num_local_experts", "n_routed_experts", "num_experts")
    if experts:
        values["num_experts"] = experts
        values["num_experts_per_token"] = config.get("num_experts_per_tok")
        values["moe_intermediate_size"] = _first(config, "moe_intermediate_size", "intermediate_size")
        values["num_shared_experts"] = config.get("n_shared_experts")
        values["first_dense_layers"] = config.get("first_k_dense_replace")

    if config.get("kv_lora_rank"):
        for key in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            values[key] = config.get(key)

    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype in _TORCH_DTYPES:
        values["weight_dtype"] = dtype
    return {key: value for key, value in values.items() if value is not None}
