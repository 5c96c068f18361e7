"""What serving LoRA adapters costs in memory: vLLM's GPU slots and its host-side adapter cache.

With `--enable-lora`, vLLM wraps every linear layer of the model, and its input embedding and LM
head, in a LoRA layer that allocates, at start and whether or not an adapter is loaded, one stacked
A and B matrix per slice for `max_loras` adapters of rank `max_lora_rank`
(vllm/lora/layers/*.py, `create_lora_weights`; 0.32.0):

    column-parallel linear (q, k, v, gate, up; one slice each):  A: rank × in,      B: out/TP × rank
    row-parallel linear (o, down):                                A: rank × in/TP,   B: out × rank
    embedding:                                                    A: vocab × rank,   B: hidden × rank
    LM head (the logits processor):                               A: rank × hidden,  B: vocab × rank

in the LoRA dtype (`--lora-dtype auto`: the model's compute dtype). This happens while the model
loads, so vLLM counts it in "Model loading took ... GiB" and the KV cache gets that much less.
tests/e2e/test_lora.py compares `lora_slot_bytes` with the tensors the real vLLM 0.32.0 allocates
for the tiny test model on CPU. On a GPU (one H200, vLLM 0.26.0; issue 25, item 7), 16 rank-16
slots of Llama-3.1-8B made "Model loading took" 1.41 GiB larger where `lora_gpu_bytes` computes
1.376 GiB (bench/lora/RESULTS.md); tests/test_lora_report.py checks that they agree within 5 %.

Adapters not in the current batch wait in host memory, up to `max_cpu_loras` of them, each at its
own rank (vLLM's LoRAModel holds the adapter's A and B tensors as loaded from its safetensors);
`lora_cpu_cache_bytes` bounds that with every cached adapter at `max_lora_rank`.
"""

from __future__ import annotations

from domain.architecture import ModelShape


def _linear_sizes(shape: ModelShape) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(column-parallel, row-parallel) linear layers of one decoder layer as (in, out) pairs."""
    hidden, head = shape.hidden_size, shape.head_dim
    column = [
        (hidden, shape.num_attention_heads * head),  # q
        (hidden, shape.num_key_value_heads * head),  # k
        (hidden, shape.num_key_value_heads * head),  # v
    ]
    row = [(shape.num_attention_heads * head, hidden)]  # o
    if shape.is_moe:
        # Routed experts (and shared ones) each carry their own gate/up/down adapter slices.
        experts = (shape.num_experts or 0) + shape.num_shared_experts
        width = shape.moe_intermediate_size or shape.intermediate_size
        column += [(hidden, width), (hidden, width)] * experts
        row += [(width, hidden)] * experts
    else:
        column += [(hidden, shape.intermediate_size), (hidden, shape.intermediate_size)]  # gate, up
        row.append((shape.intermediate_size, hidden))  # down
    return column, row


def lora_slot_bytes(shape: ModelShape, tensor_parallel_size: int, rank: int, dtype_bytes: int) -> int:
    """GPU bytes vLLM sets aside on each GPU for one adapter slot of `rank` (dense models exactly as
    vLLM 0.32.0 allocates them; MoE and MLA layers approximated by their expert MLPs and projections)."""
    tp = tensor_parallel_size
    column, row = _linear_sizes(shape)
    per_layer = sum(rank * in_size + (out_size // tp) * rank for in_size, out_size in column)
    per_layer += sum(rank * (in_size // tp) + out_size * rank for in_size, out_size in row)
    embeddings = 2 * rank * (shape.vocab_size + shape.hidden_size)  # input embedding and LM head
    return (per_layer * shape.num_hidden_layers + embeddings) * dtype_bytes


def lora_gpu_bytes(
    shape: ModelShape, tensor_parallel_size: int, max_loras: int, max_lora_rank: int, dtype_bytes: int
) -> int:
    """What `--max-loras` slots of `--max-lora-rank` take on each GPU of a replica."""
    return max_loras * lora_slot_bytes(shape, tensor_parallel_size, max_lora_rank, dtype_bytes)


def lora_cpu_cache_bytes(shape: ModelShape, max_cpu_loras: int, max_lora_rank: int, dtype_bytes: int) -> int:
    """Host memory of a full adapter cache: `max_cpu_loras` adapters, at most `max_lora_rank` each
    (unsharded: the host copy is the whole adapter)."""
    return max_cpu_loras * lora_slot_bytes(shape, 1, max_lora_rank, dtype_bytes)
