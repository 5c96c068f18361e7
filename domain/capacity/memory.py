"""How vLLM sizes its KV cache on one GPU, as arithmetic on the model's shape.

vLLM (V1 engine, GPU worker `determine_available_memory`; the same in 0.26.0, measured on the lab
GPU, and 0.32.0, the version this stack deploys) computes

    requested  = ceil(total CUDA memory × gpu_memory_utilization)
    KV memory  = requested − weights − activation peak − non-torch increase − CUDA-graph estimate
    num_blocks = KV memory // (page bytes × attention layers)      (kv_cache_utils.get_num_blocks)

and logs `Available KV cache memory: <KV memory> GiB`, `GPU KV cache size: N tokens` and
`Maximum concurrency for L tokens per request: X`. Weights and the KV page are exact arithmetic;
the three overhead terms are what vLLM measures during its profile run, modelled below from what
that run allocates. Every constant is named here with where it comes from; docs/capacity.md has
the derivation and bench/capacity/ the measurements that check it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from domain.architecture import BYTES_PER_DTYPE, ModelShape, kv_heads_per_gpu

GIB = 1 << 30
MIB = 1 << 20

DRIVER_RESERVED_BYTES = 512 * MIB
"""nvidia-smi's memory.total (the catalogue's memory_mib) includes memory the driver keeps for
itself (`nvidia-smi -q`, FB Memory Usage, "Reserved": about 0.3–0.7 GiB depending on GPU and
driver); CUDA, and so vLLM's `total_memory`, sees the rest. bench/capacity records both."""

BLOCK_SIZE_TOKENS = 16
"""vLLM's default KV block (CacheConfig.DEFAULT_BLOCK_SIZE) for the FlashAttention backend."""

MLA_BLOCK_SIZE_TOKENS = 64
"""FlashMLA, the MLA backend on Hopper, requires 64-token pages."""

CONCURRENT_BATCHES = 2
"""With async scheduling (on by default) two steps are in flight; sliding-window layers keep their
blocks for both (VllmConfig.max_concurrent_batches, max_in_flight_tokens)."""

CUBLAS_WORKSPACE_BYTES = 32 * MIB
"""PyTorch allocates its cuBLAS workspace (":4096:8", 8 × 4 MiB on Hopper) through its caching
allocator on the first matmul, which is in the profile run, so it counts as activation."""

SAMPLER_FP32_COPIES = 3
"""The dummy sampler run (GPUModelRunner._dummy_sampler_run, its second call with a seeded
generator, taking TopKTopPSampler.forward_native) holds at once: the fp32 copy of the logits
(Sampler.forward), the softmax probabilities and the exponential noise `q` (random_sample), each
max_num_seqs × vocab × 4 bytes, besides the logits in the compute dtype."""

TOP_K_TOP_P_MIN_BATCH = 8
"""apply_top_k_top_p uses the Triton kernel for batches of 8 or more; it keeps a float32 buffer of
min(next_pow2(min(SMs, batch)), SMs) × vocab rows (topk_topp_triton._TRITON_BUFFER_CACHE)."""

STREAMING_MULTIPROCESSORS = {
    "A10G": 80,
    "L4": 58,
    "L40S": 142,
    "A100-40GB": 108,
    "A100-80GB": 108,
    "H100": 132,
    "H200": 132,
    "B200": 148,
}
"""SM count per GPU model (NVIDIA architecture whitepapers and datasheets); sizes the Triton buffer."""

NON_TORCH_INCREASE_BYTES = 256 * MIB
"""Device memory vLLM's process gains outside PyTorch's allocator after its start-of-worker
snapshot (taken after the CUDA context and NCCL are up): CUDA modules of the kernels first used in
the profile run — cuBLAS, FlashAttention, Inductor's Triton kernels, FlashInfer's sampler.
vLLM logs it at DEBUG as "non-torch forward increase memory"; 0.2–0.3 GiB on a single-GPU 8B
model. An estimate, checked by the observations in tests/data/kv_cache_observations.json."""

PIECEWISE_GRAPH_BYTES_PER_PIECE = 192 * 1024
"""A piecewise CUDA graph is one graph per piece between attention layers (layers + 1 pieces);
each executable holds its kernel nodes' parameters on the device. The estimate matches vLLM's
"Graph capturing finished ..., took ~0.5 GiB" for 8B models with ~67 piecewise sizes."""

FULL_GRAPH_BYTES_PER_LAYER = 64 * 1024
"""A full decode graph is one executable with every layer's kernels (attention included)."""

MIN_GRAPH_BYTES = MIB
"""vLLM's estimator counts at least 1 MiB per graph "for driver overhead"
(GPUModelRunner.profile_cudagraph_memory)."""

CUDAGRAPH_MAX_CAPTURE_SIZE = 512
"""Largest default capture size: min(2 × max_num_seqs, 512, max_num_batched_tokens)
(VllmConfig._set_cudagraph_sizes)."""


@dataclass(frozen=True)
class EngineSettings:
    """The vLLM settings that change memory, as the stack passes them to `vllm serve`."""

    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    kv_cache_dtype: str = "auto"
    dtype: str = "auto"
    quantization: str | None = None
    enforce_eager: bool = False
    max_loras: int = 0
    """`--max-loras` with `--enable-lora`; 0 without LoRA (domain/capacity/lora.py)."""
    max_lora_rank: int = 0


@dataclass(frozen=True)
class GpuMemory:
    name: str
    memory_bytes: int
    """nvidia-smi memory.total."""

    @property
    def cuda_total_bytes(self) -> int:
        return self.memory_bytes - DRIVER_RESERVED_BYTES

    @property
    def streaming_multiprocessors(self) -> int:
        return STREAMING_MULTIPROCESSORS.get(self.name, 132)


def default_max_num_batched_tokens(gpu: GpuMemory) -> int:
    """vLLM's default for the OpenAI server (EngineArgs.get_batch_defaults in 0.32.0): 16384 on GPUs
    with ≥ 160 GiB, 8192 on other GPUs with ≥ 70 GiB except A100, 2048 elsewhere."""
    if gpu.cuda_total_bytes >= 160 * GIB:
        return 16384
    if gpu.cuda_total_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return 8192
    return 2048


def effective_max_num_batched_tokens(settings: EngineSettings, gpu: GpuMemory) -> int:
    """The token budget per step vLLM ends up with (also the size of its profile run)."""
    if settings.max_num_batched_tokens is not None:
        return settings.max_num_batched_tokens
    tokens = default_max_num_batched_tokens(gpu)
    if settings.enable_chunked_prefill is False:
        tokens = max(settings.max_model_len, tokens)
    return min(settings.max_num_seqs * settings.max_model_len, tokens)


def kv_dtype_bytes(settings: EngineSettings, compute_dtype: str) -> int:
    return 1 if settings.kv_cache_dtype.startswith("fp8") else int(BYTES_PER_DTYPE[compute_dtype])


def block_size_tokens(shape: ModelShape) -> int:
    return MLA_BLOCK_SIZE_TOKENS if shape.uses_mla else BLOCK_SIZE_TOKENS


def kv_page_bytes_per_layer(shape: ModelShape, tensor_parallel_size: int, dtype_bytes: int) -> int:
    """One block of one layer: 2 × block × KV heads per GPU × head_dim × bytes (MLA: block × latent)."""
    block = block_size_tokens(shape)
    if shape.uses_mla:
        assert shape.kv_lora_rank and shape.qk_rope_head_dim
        return block * (shape.kv_lora_rank + shape.qk_rope_head_dim) * dtype_bytes
    return 2 * block * kv_heads_per_gpu(shape, tensor_parallel_size) * shape.head_dim * dtype_bytes


def forward_activation_bytes(
    shape: ModelShape, tensor_parallel_size: int, tokens: int, act_bytes: int
) -> int:
    """Peak live tensors of one forward pass over `tokens` tokens, beyond the weights.

    vLLM compiles the model into pieces between attention layers (torch.compile/Inductor frees
    each buffer after its last use). Inside a piece the inputs stay alive (the previous attention
    output and the residual); the peak is in the MLP, when the residual, the fused gate/up output
    (2 × intermediate) and the activation output (intermediate) coexist, or in the attention
    projections. MoE layers use the Triton fused-MoE workspaces (TritonExperts.workspace_shapes:
    tokens × top-k × (max(I, H) + max(2I, H))) plus the router logits in float32.
    """
    tp = tensor_parallel_size
    hidden = shape.hidden_size
    heads = shape.num_attention_heads // tp
    if shape.uses_mla:
        assert shape.qk_rope_head_dim and shape.qk_nope_head_dim and shape.v_head_dim and shape.kv_lora_rank
        attention_out = heads * shape.v_head_dim
        attention = (
            heads * (shape.qk_nope_head_dim + shape.qk_rope_head_dim)
            + shape.kv_lora_rank
            + shape.qk_rope_head_dim
            + heads * (shape.qk_nope_head_dim + shape.v_head_dim)
            + attention_out
        )
    else:
        attention_out = heads * shape.head_dim
        attention = attention_out + 2 * kv_heads_per_gpu(shape, tp) * shape.head_dim + attention_out
    carried = attention_out + 2 * hidden  # piece inputs (attention output, residual) + new residual
    stages = [tokens * (2 * hidden + attention) * act_bytes]
    if shape.first_dense_layers or not shape.is_moe:
        stages.append(tokens * (carried + 3 * math.ceil(shape.intermediate_size / tp)) * act_bytes)
    if shape.is_moe:
        assert shape.moe_intermediate_size and shape.num_experts and shape.num_experts_per_token
        expert = math.ceil(shape.moe_intermediate_size / tp)
        shared = 3 * math.ceil(shape.num_shared_experts * shape.moe_intermediate_size / tp)
        workspaces = shape.num_experts_per_token * (max(expert, hidden) + max(2 * expert, hidden))
        stages.append(tokens * ((carried + hidden + shared + workspaces) * act_bytes + shape.num_experts * 4))
    return max(stages)


def sampler_activation_bytes(
    shape: ModelShape, gpu: GpuMemory, tokens: int, sequences: int, act_bytes: int
) -> int:
    """The dummy sampler run after the forward pass: hidden states of all `tokens` are still held,
    the logits of `sequences` requests over the whole vocabulary (gathered on every GPU) and the
    sampler's float32 copies (SAMPLER_FP32_COPIES) plus the Triton top-k/top-p buffer."""
    vocab = shape.vocab_size
    held = tokens * shape.hidden_size * act_bytes + sequences * vocab * (act_bytes + 4 * SAMPLER_FP32_COPIES)
    if sequences >= TOP_K_TOP_P_MIN_BATCH:
        sms = gpu.streaming_multiprocessors
        rows = min(1 << (min(sms, sequences) - 1).bit_length(), sms)
        held += rows * vocab * 4
    return held


def activation_peak_bytes(
    shape: ModelShape,
    tensor_parallel_size: int,
    gpu: GpuMemory,
    tokens: int,
    max_num_seqs: int,
    act_bytes: int,
) -> int:
    """vLLM's "torch peak memory increase" of its profile run: one forward over max_num_batched_tokens
    tokens split into min(tokens, max_num_seqs) requests, then the sampler over those requests."""
    sequences = min(tokens, max_num_seqs)
    return (
        max(
            forward_activation_bytes(shape, tensor_parallel_size, tokens, act_bytes),
            sampler_activation_bytes(shape, gpu, tokens, sequences, act_bytes),
        )
        + CUBLAS_WORKSPACE_BYTES
    )


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int) -> list[int]:
    """Batch sizes vLLM captures by default (VllmConfig._set_cudagraph_sizes)."""
    largest = min(2 * max_num_seqs, CUDAGRAPH_MAX_CAPTURE_SIZE, max_num_batched_tokens)
    sizes = [size for size in (1, 2, 4) if size <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8))
    sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest:
        sizes.append(max_num_batched_tokens)
    return sorted(set(sizes))


def cudagraph_memory_bytes(
    shape: ModelShape,
    tensor_parallel_size: int,
    settings: EngineSettings,
    max_num_batched_tokens: int,
    act_bytes: int,
) -> int:
    """vLLM's CUDA-graph memory estimate, subtracted from the KV cache by default since 0.21.

    vLLM captures the two largest graphs of each mode and extrapolates
    (GPUModelRunner.profile_cudagraph_memory): the first piecewise capture costs the warm-up run's
    activations (kept in the caching allocator) plus the same again in the graph pool; every further
    graph costs its executable. Piecewise graphs cover every capture size, full decode graphs the
    sizes up to max_num_seqs (cudagraph mode FULL_AND_PIECEWISE, the default).
    """
    if settings.enforce_eager:
        return 0
    sizes = cudagraph_capture_sizes(settings.max_num_seqs, max_num_batched_tokens)
    decode_sizes = [size for size in sizes if size <= settings.max_num_seqs]
    layers = shape.num_hidden_layers
    piecewise_graph = max(MIN_GRAPH_BYTES, (layers + 1) * PIECEWISE_GRAPH_BYTES_PER_PIECE)
    full_graph = max(MIN_GRAPH_BYTES, layers * FULL_GRAPH_BYTES_PER_LAYER)
    first_capture = 2 * forward_activation_bytes(shape, tensor_parallel_size, sizes[-1], act_bytes)
    return first_capture + len(sizes) * piecewise_graph + len(decode_sizes) * full_graph


@dataclass(frozen=True)
class KvCacheSizing:
    """The numbers vLLM logs at startup, predicted."""

    available_bytes: int
    """`Available KV cache memory` (negative: the weights and overheads alone exceed the request)."""
    page_bytes_per_layer: int
    block_size_tokens: int
    num_blocks: int
    tokens: int
    """`GPU KV cache size: N tokens`."""
    max_concurrency: float
    """`Maximum concurrency for max_model_len tokens per request`."""


def blocks_per_request(shape: ModelShape, request_tokens: int, max_num_batched_tokens: int) -> int:
    """Blocks one request of `request_tokens` tokens holds at most (FullAttentionSpec /
    SlidingWindowSpec.max_memory_usage_bytes): all its tokens, or for sliding-window attention the
    window plus the tokens of the steps in flight, plus one block."""
    block = block_size_tokens(shape)
    if shape.sliding_window:
        held = min(shape.sliding_window - 1 + CONCURRENT_BATCHES * max_num_batched_tokens, request_tokens)
        return math.ceil(held / block) + 1
    return math.ceil(request_tokens / block)


def size_kv_cache(
    shape: ModelShape,
    tensor_parallel_size: int,
    available_bytes: int,
    dtype_bytes: int,
    max_model_len: int,
    max_num_batched_tokens: int,
) -> KvCacheSizing:
    page = kv_page_bytes_per_layer(shape, tensor_parallel_size, dtype_bytes)
    num_blocks = max(0, available_bytes) // page // shape.num_hidden_layers
    concurrency = num_blocks / blocks_per_request(shape, max_model_len, max_num_batched_tokens)
    return KvCacheSizing(
        available_bytes=available_bytes,
        page_bytes_per_layer=page,
        block_size_tokens=block_size_tokens(shape),
        num_blocks=num_blocks,
        tokens=int(concurrency * max_model_len),
        max_concurrency=concurrency,
    )


def longest_request_that_fits(
    shape: ModelShape, num_blocks: int, max_num_batched_tokens: int, upper_bound: int
) -> int:
    """The longest max_model_len whose one request fits in `num_blocks` blocks (vLLM's
    estimate_max_model_len, a binary search over the same per-request usage), at most upper_bound."""
    low, high, best = 1, upper_bound, 0
    while low <= high:
        middle = (low + high) // 2
        if blocks_per_request(shape, middle, max_num_batched_tokens) <= num_blocks:
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best
