"""The model-shape presets and the GPU catalogue entries the capacity planner relies on."""

from __future__ import annotations

import re

import pytest

from domain.architecture import ModelShape
from domain.catalogue.gpu_instances import gpu_instance_types
from domain.catalogue.model_shapes import architecture_values, model_shape_presets
from domain.config.architecture import ArchitectureConfig

REQUIRED_PRESETS = (
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "mistral-7b-v0.3",
    "mixtral-8x7b",
    "deepseek-v2-lite",
)
CONFIG_JSON_URL = re.compile(r"^https://huggingface\.co/[\w.-]+/[\w.-]+/blob/main/config\.json$")


def test_the_catalogue_has_the_presets_the_stacks_and_docs_name() -> None:
    assert set(REQUIRED_PRESETS) <= set(model_shape_presets())


@pytest.mark.parametrize("name", sorted(model_shape_presets()))
def test_every_preset_names_the_config_json_it_was_copied_from(name: str) -> None:
    preset = model_shape_presets()[name]
    assert CONFIG_JSON_URL.match(preset.source), preset.source
    assert preset.config_json["architectures"] and preset.config_json["model_type"]
    assert preset.config_json["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("name", sorted(model_shape_presets()))
def test_every_preset_is_a_complete_architecture(name: str) -> None:
    architecture = ArchitectureConfig(preset=name)
    shape = ModelShape.from_values(architecture.resolved())
    assert shape.num_attention_heads % shape.num_key_value_heads == 0
    assert (
        shape.head_dim * shape.num_attention_heads in (shape.hidden_size, 2 * shape.hidden_size)
        or shape.uses_mla
    )


def test_mistral_v0_3_attends_to_the_whole_context() -> None:
    assert model_shape_presets()["mistral-7b-v0.3"].config_json["sliding_window"] is None
    assert "sliding_window" not in model_shape_presets()["mistral-7b-v0.3"].architecture


def test_qwen_sliding_window_is_ignored_while_use_sliding_window_is_false() -> None:
    qwen = model_shape_presets()["qwen2.5-7b"]
    assert qwen.config_json["sliding_window"] == 131072
    assert "sliding_window" not in qwen.architecture
    assert architecture_values({**qwen.config_json, "use_sliding_window": True})["sliding_window"] == 131072


def test_moe_and_mla_presets_carry_their_expert_and_latent_sizes() -> None:
    mixtral = model_shape_presets()["mixtral-8x7b"].architecture
    assert (mixtral["num_experts"], mixtral["num_experts_per_token"], mixtral["moe_intermediate_size"]) == (
        8,
        2,
        14336,
    )
    deepseek = model_shape_presets()["deepseek-v2-lite"].architecture
    assert (deepseek["kv_lora_rank"], deepseek["qk_rope_head_dim"], deepseek["first_dense_layers"]) == (
        512,
        64,
        1,
    )
    assert (deepseek["num_experts"], deepseek["num_shared_experts"], deepseek["moe_intermediate_size"]) == (
        64,
        2,
        1408,
    )


def test_the_lab_h200_has_the_memory_nvidia_smi_reported_there() -> None:
    h200 = {instance.gpu for instance in gpu_instance_types().values() if instance.gpu.name == "H200"}
    assert [gpu.memory_mib for gpu in h200] == [143771]  # shared/gpu/README.md, nvidia-smi on the lab H200
