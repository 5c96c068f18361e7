"""A model's shape as numbers: parameters, weight bytes per GPU and KV-cache bytes per token.

Parameter counts follow the Transformers / vLLM module layout of each family (Llama, Qwen2,
Mistral, Mixtral, DeepSeek-V2). Per-GPU numbers follow vLLM's tensor-parallel layers:
column/row-parallel linears split their output/input dimension, the vocabulary is padded and split,
norms, MoE routers and the MLA down-projection are replicated, and KV heads are split — or
replicated, one per GPU, when there are fewer KV heads than GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from domain.config.models import ModelConfig

VOCAB_PADDING = 64
"""vLLM pads the vocabulary of its embedding and LM head to a multiple of 64 rows before splitting it
across GPUs (DEFAULT_VOCAB_PADDING_SIZE, vllm/model_executor/layers/vocab_parallel_embedding.py)."""

INT4_GROUP_SIZE = 128
"""AWQ/GPTQ checkpoints quantise in groups of 128 weights, each with an fp16 scale and a packed
4-bit zero point (the group size of nearly every published int4 checkpoint)."""

BYTES_PER_DTYPE: dict[str, float] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5 + (2 + 0.5) / INT4_GROUP_SIZE,
}
"""Bytes per parameter of a linear layer's weight; int4 includes its group scale and zero point."""

UNQUANTISED_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class ModelShape:
    """Everything the planner needs from config.json, with the family defaults filled in."""

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None = None
    sliding_window: int | None = None
    qkv_bias: bool = False
    attention_output_bias: bool = False
    tie_word_embeddings: bool = False
    num_experts: int | None = None
    num_experts_per_token: int | None = None
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    parameters_declared: float | None = None
    weight_dtype: str = "bfloat16"

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ModelShape:
        """From ArchitectureConfig.resolved() (config.json names, validated there)."""
        heads = values["num_attention_heads"]
        declared = values.get("parameters_billion")
        return cls(
            num_hidden_layers=values["num_hidden_layers"],
            hidden_size=values["hidden_size"],
            num_attention_heads=heads,
            num_key_value_heads=values.get("num_key_value_heads") or heads,
            head_dim=values.get("head_dim") or values["hidden_size"] // heads,
            intermediate_size=values["intermediate_size"],
            vocab_size=values["vocab_size"],
            max_position_embeddings=values.get("max_position_embeddings"),
            sliding_window=values.get("sliding_window"),
            qkv_bias=bool(values.get("qkv_bias")),
            attention_output_bias=bool(values.get("attention_output_bias")),
            tie_word_embeddings=bool(values.get("tie_word_embeddings")),
            num_experts=values.get("num_experts"),
            num_experts_per_token=values.get("num_experts_per_token"),
            moe_intermediate_size=values.get("moe_intermediate_size") or values["intermediate_size"],
            num_shared_experts=values.get("num_shared_experts") or 0,
            first_dense_layers=values.get("first_dense_layers") or 0,
            kv_lora_rank=values.get("kv_lora_rank"),
            q_lora_rank=values.get("q_lora_rank"),
            qk_rope_head_dim=values.get("qk_rope_head_dim"),
            qk_nope_head_dim=values.get("qk_nope_head_dim"),
            v_head_dim=values.get("v_head_dim"),
            parameters_declared=declared * 1e9 if declared else None,
            weight_dtype=values.get("weight_dtype") or "bfloat16",
        )

    @property
    def is_moe(self) -> bool:
        return bool(self.num_experts)

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def rotary_dim(self) -> int:
        return self.qk_rope_head_dim if self.uses_mla and self.qk_rope_head_dim else self.head_dim


@dataclass(frozen=True)
class ParameterCount:
    """Parameters held by one GPU (or the whole model when tensor_parallel_size is 1), by kind.

    `linear` is what quantisation shrinks; `other` (embeddings, LM head, norms, biases, MoE routers)
    stays in the activation dtype, as in vLLM's quantised checkpoints.
    """

    linear: int
    other: int

    @property
    def total(self) -> int:
        return self.linear + self.other


def _split(value: int, parts: int) -> int:
    return math.ceil(value / parts)


def kv_heads_per_gpu(shape: ModelShape, tensor_parallel_size: int) -> int:
    """KV heads one GPU stores: split, or one replicated head each when there are fewer than GPUs."""
    return max(1, shape.num_key_value_heads // tensor_parallel_size)


def count_parameters(shape: ModelShape) -> ParameterCount:
    """The model's parameters, as its model card counts them."""
    return _count(shape, 1, shape.vocab_size)


def parameters_per_gpu(shape: ModelShape, tensor_parallel_size: int) -> ParameterCount:
    """Parameters one GPU allocates under tensor parallelism (padded vocabulary, split layers)."""
    padded_vocab = math.ceil(shape.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    return _count(shape, tensor_parallel_size, _split(padded_vocab, tensor_parallel_size))


def _count(shape: ModelShape, tensor_parallel_size: int, vocab: int) -> ParameterCount:
    tp = tensor_parallel_size
    hidden = shape.hidden_size
    other = (
        vocab * hidden * (1 if shape.tie_word_embeddings else 2) + hidden
    )  # embeddings, LM head, final norm
    linear = 0
    heads = shape.num_attention_heads // tp
    for layer in range(shape.num_hidden_layers):
        other += 2 * hidden  # input and post-attention RMSNorm
        if shape.uses_mla:
            assert shape.qk_rope_head_dim and shape.qk_nope_head_dim and shape.v_head_dim
            qk_head = shape.qk_nope_head_dim + shape.qk_rope_head_dim
            if shape.q_lora_rank:
                linear += hidden * shape.q_lora_rank + shape.q_lora_rank * heads * qk_head
                other += shape.q_lora_rank
            else:
                linear += hidden * heads * qk_head
            # kv_a_proj_with_mqa is replicated; kv_b_proj and o_proj are split by heads.
            linear += hidden * (shape.kv_lora_rank + shape.qk_rope_head_dim)
            other += shape.kv_lora_rank
            linear += shape.kv_lora_rank * heads * (shape.qk_nope_head_dim + shape.v_head_dim)
            linear += heads * shape.v_head_dim * hidden
        else:
            q_width = heads * shape.head_dim
            kv_width = kv_heads_per_gpu(shape, tp) * shape.head_dim
            linear += hidden * (q_width + 2 * kv_width) + q_width * hidden
            if shape.qkv_bias:
                other += q_width + 2 * kv_width
            if shape.attention_output_bias:
                other += hidden
        if shape.is_moe and layer >= shape.first_dense_layers:
            assert shape.num_experts and shape.moe_intermediate_size
            expert_width = _split(shape.moe_intermediate_size, tp)
            linear += shape.num_experts * 3 * hidden * expert_width
            linear += 3 * hidden * _split(shape.num_shared_experts * shape.moe_intermediate_size, tp)
            other += hidden * shape.num_experts  # router, replicated
        else:
            linear += 3 * hidden * _split(shape.intermediate_size, tp)  # gate, up, down
    return ParameterCount(linear=linear, other=other)


def total_parameters(shape: ModelShape) -> float:
    """The declared count when given, else the count from the shape."""
    return shape.parameters_declared or count_parameters(shape).total


def activation_dtype(shape: ModelShape, dtype_setting: str) -> str:
    """vLLM's compute dtype: the `--dtype` setting, or for `auto` the checkpoint's (float32 is served in
    bfloat16, quantised checkpoints compute in bfloat16), as vLLM's ModelConfig resolves `auto`."""
    if dtype_setting != "auto":
        return dtype_setting
    return shape.weight_dtype if shape.weight_dtype in ("bfloat16", "float16") else "bfloat16"


def linear_weight_dtype(shape: ModelShape, quantization: str | None, compute_dtype: str) -> str:
    """Precision of the linear layers on the GPU: `--quantization fp8` quantises a 16-bit checkpoint
    at load time; an unquantised checkpoint is cast to the compute dtype; a quantised one stays."""
    if quantization == "fp8" and shape.weight_dtype in UNQUANTISED_DTYPES:
        return "fp8"
    if shape.weight_dtype in UNQUANTISED_DTYPES:
        return compute_dtype
    return shape.weight_dtype


def rotary_cache_bytes(shape: ModelShape, compute_dtype: str) -> int:
    """vLLM keeps one cos/sin table of max_position_embeddings × rotary_dim in the compute dtype,
    shared by all layers (RotaryEmbedding.cos_sin_cache, cached by get_rope); it counts as weights."""
    return (shape.max_position_embeddings or 0) * shape.rotary_dim * int(BYTES_PER_DTYPE[compute_dtype])


def weight_bytes_per_gpu(
    shape: ModelShape, tensor_parallel_size: int, *, linear_dtype: str, compute_dtype: str
) -> int:
    """What vLLM logs as `Model loading took X GiB` on each GPU."""
    per_gpu = parameters_per_gpu(shape, tensor_parallel_size)
    if shape.parameters_declared:
        # Keep the per-GPU split of the counted shape, scaled to the declared total.
        scale = shape.parameters_declared / count_parameters(shape).total
        per_gpu = ParameterCount(linear=round(per_gpu.linear * scale), other=round(per_gpu.other * scale))
    return int(
        per_gpu.linear * BYTES_PER_DTYPE[linear_dtype]
        + per_gpu.other * BYTES_PER_DTYPE[compute_dtype]
        + rotary_cache_bytes(shape, compute_dtype)
    )


def checkpoint_bytes(shape: ModelShape) -> int:
    """Size of the checkpoint files (what is copied and read at startup)."""
    counted = count_parameters(shape)
    scale = shape.parameters_declared / counted.total if shape.parameters_declared else 1.0
    other_dtype = shape.weight_dtype if shape.weight_dtype in UNQUANTISED_DTYPES else "bfloat16"
    return int(
        (counted.linear * BYTES_PER_DTYPE[shape.weight_dtype] + counted.other * BYTES_PER_DTYPE[other_dtype])
        * scale
    )


def kv_cache_bytes_per_token(shape: ModelShape, tensor_parallel_size: int, kv_dtype_bytes: int) -> int:
    """KV-cache bytes one token occupies on one GPU, all layers together.

    Standard attention stores K and V per KV head: 2 × layers × kv_heads_per_gpu × head_dim × bytes.
    Multi-head latent attention stores one compressed latent plus the rotary key per token and layer,
    the same on every GPU (vLLM's MLAAttentionSpec: one "head" of kv_lora_rank + qk_rope_head_dim).
    """
    if shape.uses_mla:
        assert shape.kv_lora_rank and shape.qk_rope_head_dim
        return shape.num_hidden_layers * (shape.kv_lora_rank + shape.qk_rope_head_dim) * kv_dtype_bytes
    return (
        2
        * shape.num_hidden_layers
        * kv_heads_per_gpu(shape, tensor_parallel_size)
        * shape.head_dim
        * kv_dtype_bytes
    )


def tensor_parallel_problems(shape: ModelShape, tensor_parallel_size: int) -> list[str]:
    """Dimensions vLLM's parallel layers cannot split evenly across `tensor_parallel_size` GPUs."""
    tp = tensor_parallel_size
    problems = []
    if shape.num_attention_heads % tp:
        problems.append(f"num_attention_heads {shape.num_attention_heads} is not divisible by {tp} GPUs")
    kv = shape.num_key_value_heads
    if not shape.uses_mla and (kv % tp if kv >= tp else tp % kv):
        problems.append(f"num_key_value_heads {kv} neither divides nor is divisible by {tp} GPUs")
    width = shape.moe_intermediate_size if shape.is_moe else shape.intermediate_size
    if width and width % tp:
        problems.append(
            f"{'moe_' if shape.is_moe else ''}intermediate_size {width} is not divisible by {tp} GPUs"
        )
    return problems


def model_shape(model: ModelConfig) -> ModelShape:
    return ModelShape.from_values(model.architecture.resolved())
