"""Model shape arithmetic: parameters, weight bytes per GPU and KV-cache bytes per token."""

from __future__ import annotations

from typing import Any

import pytest

from domain.architecture import (
    ModelShape,
    count_parameters,
    kv_cache_bytes_per_token,
    parameters_per_gpu,
    tensor_parallel_problems,
    weight_bytes_per_gpu,
)
from domain.catalogue.model_shapes import lookup_preset


def shape(preset: str, **overrides: Any) -> ModelShape:
    found = lookup_preset(preset)
    assert found is not None
    return ModelShape.from_values({**found.architecture, **overrides})


def test_llama_3_1_8b_kv_cache_takes_131072_bytes_per_token_in_bf16() -> None:
    assert kv_cache_bytes_per_token(shape("llama-3.1-8b"), 1, 2) == 2 * 32 * 8 * 128 * 2 == 131072


def test_fp8_kv_cache_halves_the_bytes_per_token() -> None:
    llama = shape("llama-3.1-8b")
    assert kv_cache_bytes_per_token(llama, 1, 1) * 2 == kv_cache_bytes_per_token(llama, 1, 2)


def test_tensor_parallelism_splits_kv_heads_across_gpus() -> None:
    llama = shape("llama-3.1-8b")  # 8 KV heads
    assert kv_cache_bytes_per_token(llama, 2, 2) == 2 * 32 * 4 * 128 * 2
    assert kv_cache_bytes_per_token(llama, 8, 2) == 2 * 32 * 1 * 128 * 2


def test_kv_heads_are_replicated_when_there_are_fewer_than_gpus() -> None:
    qwen = shape("qwen2.5-7b")  # 4 KV heads: at TP 8 every GPU still stores one whole head
    assert kv_cache_bytes_per_token(qwen, 8, 2) == 2 * 28 * 1 * 128 * 2
    assert kv_cache_bytes_per_token(qwen, 8, 2) * 8 > kv_cache_bytes_per_token(qwen, 1, 2)


def test_mla_caches_one_latent_and_rotary_key_per_layer_on_every_gpu() -> None:
    deepseek = shape("deepseek-v2-lite")  # kv_lora_rank 512, qk_rope_head_dim 64, 27 layers
    assert kv_cache_bytes_per_token(deepseek, 1, 2) == 27 * (512 + 64) * 2
    assert kv_cache_bytes_per_token(deepseek, 2, 2) == kv_cache_bytes_per_token(deepseek, 1, 2)


def _within(value: float, expected: float, tolerance: float) -> bool:
    return abs(value - expected) <= tolerance * expected


def test_llama_3_1_8b_counts_8_03_billion_parameters() -> None:
    assert _within(count_parameters(shape("llama-3.1-8b")).total, 8.03e9, 0.005)


def test_qwen2_5_7b_counts_7_62_billion_parameters_including_its_qkv_biases() -> None:
    with_biases = count_parameters(shape("qwen2.5-7b")).total
    without = count_parameters(shape("qwen2.5-7b", qkv_bias=False)).total
    assert with_biases - without == 28 * (3584 + 2 * 4 * 128)
    assert _within(with_biases, 7.62e9, 0.005)


@pytest.mark.parametrize(
    ("preset", "published"),
    [  # model cards: "70B", "72.7B", "7.25B", "46.7B total", "15.7B total"
        ("llama-3.1-70b", 70.6e9),
        ("qwen2.5-72b", 72.7e9),
        ("mistral-7b-v0.3", 7.25e9),
        ("mixtral-8x7b", 46.7e9),
        ("deepseek-v2-lite", 15.7e9),
    ],
)
def test_every_preset_counts_its_published_size(preset: str, published: float) -> None:
    assert _within(count_parameters(shape(preset)).total, published, 0.01)


def test_tied_embeddings_are_stored_once() -> None:
    untied = count_parameters(shape("llama-3.1-8b")).total
    tied = count_parameters(shape("llama-3.1-8b", tie_word_embeddings=True)).total
    assert untied - tied == 128256 * 4096


def test_tensor_parallelism_splits_layers_and_vocabulary_but_keeps_norms_whole() -> None:
    llama = shape("llama-3.1-8b")
    replicated_norms = 2 * 32 * 4096 + 4096
    assert 2 * parameters_per_gpu(llama, 2).total - count_parameters(llama).total == replicated_norms


def test_weights_on_the_gpu_add_the_rotary_table_to_the_parameters() -> None:
    llama = shape("llama-3.1-8b")
    weights = weight_bytes_per_gpu(llama, 1, linear_dtype="bfloat16", compute_dtype="bfloat16")
    assert weights == count_parameters(llama).total * 2 + 131072 * 128 * 2


def test_fp8_weights_halve_the_linear_layers_but_not_the_embeddings() -> None:
    llama = shape("llama-3.1-8b")
    counted = parameters_per_gpu(llama, 1)
    fp8 = weight_bytes_per_gpu(llama, 1, linear_dtype="fp8", compute_dtype="bfloat16")
    assert fp8 == counted.linear * 1 + counted.other * 2 + 131072 * 128 * 2
    assert counted.other >= 2 * 128256 * 4096


def test_a_declared_parameter_count_scales_the_weights() -> None:
    counted = weight_bytes_per_gpu(
        shape("llama-3.1-8b"), 1, linear_dtype="bfloat16", compute_dtype="bfloat16"
    )
    doubled = weight_bytes_per_gpu(
        shape("llama-3.1-8b", parameters_billion=2 * 8.030261248),
        1,
        linear_dtype="bfloat16",
        compute_dtype="bfloat16",
    )
    rotary = 131072 * 128 * 2
    assert abs((doubled - rotary) - 2 * (counted - rotary)) <= 4


def test_shapes_vllm_cannot_split_are_named() -> None:
    problems = tensor_parallel_problems(shape("qwen2.5-7b"), 8)
    assert any("num_attention_heads 28" in problem for problem in problems)
    assert tensor_parallel_problems(shape("qwen2.5-7b"), 4) == []
    assert tensor_parallel_problems(shape("llama-3.1-8b"), 8) == []
