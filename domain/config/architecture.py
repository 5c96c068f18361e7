"""`models[].architecture` and `models[].capacity_planning`: the numbers the capacity planner reads a
model's shape from (a preset or the config.json values), and the planner's own settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from domain.config.base import StrictModel
from domain.config.errors import ConfigProblem


class ArchitectureConfig(StrictModel):
    """The model's shape, as in its config.json: what the capacity planner sizes memory from.

    Either name a `preset` from domain/catalogue/model_shapes.yaml or give the numbers.
    """

    preset: str | None = None
    """A shape from domain/catalogue/model_shapes.yaml (e.g. `llama-3.1-8b`); fields set here override it."""
    architecture_class: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")] | None = None
    """The model class (config.json `architectures[0]`, e.g. `LlamaForCausalLM`); presets carry it.
    Needed with `lora`: whether the pinned vLLM serves LoRA adapters depends on it."""
    parameters_billion: Annotated[float, Field(gt=0)] | None = None
    """Declared parameter count; by default counted from the shape (docs/capacity.md)."""
    num_hidden_layers: Annotated[int, Field(gt=0)] | None = None
    """Transformer layers (config.json `num_hidden_layers`)."""
    hidden_size: Annotated[int, Field(gt=0)] | None = None
    """Model width (config.json `hidden_size`)."""
    num_attention_heads: Annotated[int, Field(gt=0)] | None = None
    """Query heads; must divide by gpus_per_replica."""
    num_key_value_heads: Annotated[int, Field(gt=0)] | None = None
    """KV heads (grouped-query attention); defaults to num_attention_heads."""
    head_dim: Annotated[int, Field(gt=0)] | None = None
    """Defaults to hidden_size / num_attention_heads."""
    intermediate_size: Annotated[int, Field(gt=0)] | None = None
    """MLP width of dense layers (for Mixtral-style MoE, of each expert)."""
    vocab_size: Annotated[int, Field(gt=0)] | None = None
    """Vocabulary size (embeddings and LM head)."""
    max_position_embeddings: Annotated[int, Field(gt=0)] | None = None
    """The longest context the model supports; vllm.max_model_len may not exceed it."""
    sliding_window: Annotated[int, Field(gt=0)] | None = None
    """Every attention layer attends only to this many past tokens (Mistral-7B v0.1: 4096)."""
    qkv_bias: bool | None = None
    """Q/K/V projections carry biases (Qwen2 family)."""
    attention_output_bias: bool | None = None
    """Whether the attention output projection has a bias."""
    num_experts: Annotated[int, Field(gt=0)] | None = None
    """Routed experts per MoE layer (config.json num_local_experts / n_routed_experts)."""
    num_experts_per_token: Annotated[int, Field(gt=0)] | None = None
    """MoE: experts routed per token."""
    moe_intermediate_size: Annotated[int, Field(gt=0)] | None = None
    """Width of each routed expert; defaults to intermediate_size."""
    num_shared_experts: Annotated[int, Field(ge=0)] | None = None
    """Always-active experts of DeepSeek-style MoE layers."""
    first_dense_layers: Annotated[int, Field(ge=0)] | None = None
    """Leading layers with a dense MLP instead of experts (config.json first_k_dense_replace)."""
    kv_lora_rank: Annotated[int, Field(gt=0)] | None = None
    """Multi-head latent attention (DeepSeek): the compressed KV width cached per token."""
    q_lora_rank: Annotated[int, Field(gt=0)] | None = None
    """MLA: query low-rank dimension (DeepSeek-style attention)."""
    qk_rope_head_dim: Annotated[int, Field(gt=0)] | None = None
    """MLA: rotary part of each query/key head."""
    qk_nope_head_dim: Annotated[int, Field(gt=0)] | None = None
    """MLA: non-rotary part of each query/key head."""
    v_head_dim: Annotated[int, Field(gt=0)] | None = None
    """MLA: value head dimension."""
    tie_word_embeddings: bool | None = None
    """The output projection shares the embedding matrix (not stored twice)."""
    weight_dtype: Literal["bfloat16", "float16", "float32", "fp8", "int8", "int4"] | None = None
    """Precision of the checkpoint's linear layers (default bfloat16; int4 for AWQ/GPTQ checkpoints)."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        from domain.catalogue.model_shapes import model_shape_presets

        known = sorted(model_shape_presets())
        if value is not None and value not in known:
            import difflib

            close = difflib.get_close_matches(value, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ValueError(
                f"unknown preset: {hint}domain/catalogue/model_shapes.yaml knows {', '.join(known)}; "
                "or leave preset out and give the numbers from the model's config.json (docs/capacity.md)"
            )
        return value

    @model_validator(mode="after")
    def _enough_to_plan(self) -> ArchitectureConfig:
        shape = self.resolved()
        missing = [key for key in ARCHITECTURE_REQUIRED_KEYS if shape.get(key) is None]
        if missing:
            raise ConfigProblem(
                f"the capacity planner needs {', '.join(missing)} (from the model's config.json), "
                "or a preset such as 'llama-3.1-8b' (docs/capacity.md)",
                at=(missing[0],),
            )
        heads = shape["num_attention_heads"]
        kv_heads = shape.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ConfigProblem(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
                at=("num_key_value_heads",),
            )
        if shape.get("kv_lora_rank") is not None:
            for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if shape.get(key) is None:
                    raise ConfigProblem(
                        f"multi-head latent attention (kv_lora_rank) also needs {key}", at=(key,)
                    )
        if shape.get("num_experts") is not None:
            per_token = shape.get("num_experts_per_token")
            if per_token is None or per_token > shape["num_experts"]:
                raise ConfigProblem(
                    "a MoE model needs num_experts_per_token between 1 and num_experts "
                    f"({shape['num_experts']})",
                    at=("num_experts_per_token",),
                    value=per_token,
                )
        return self

    def resolved(self) -> dict[str, Any]:
        """The preset's values with every field set explicitly in the stack file on top."""
        from domain.catalogue.model_shapes import lookup_preset

        preset = lookup_preset(self.preset) if self.preset else None
        values = dict(preset.architecture) if preset else {}
        values.update({name: getattr(self, name) for name in self.model_fields_set if name != "preset"})
        return values


ARCHITECTURE_REQUIRED_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


class CapacityPlanningConfig(StrictModel):
    """What the capacity plan reports concurrency for, besides one full `max_model_len` request."""

    typical_input_tokens: Annotated[int, Field(ge=1)] = 512
    """Prompt length of a typical request."""
    typical_output_tokens: Annotated[int, Field(ge=1)] = 256
    """Completion length of a typical request."""
