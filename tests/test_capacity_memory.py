"""vLLM's KV-cache sizing arithmetic: defaults, blocks, tokens, concurrency, overhead terms."""

from __future__ import annotations

import dataclasses
import math

import pytest

from domain.architecture import ModelShape
from domain.capacity import memory
from domain.capacity.memory import (
    EngineSettings,
    GpuMemory,
    blocks_per_request,
    cudagraph_capture_sizes,
    effective_max_num_batched_tokens,
)
from domain.capacity.plan import size_memory
from domain.catalogue.gpu_instances import GpuModel, gpu_instance_types
from domain.catalogue.model_shapes import lookup_preset

GPUS: dict[str, GpuModel] = {instance.gpu.name: instance.gpu for instance in gpu_instance_types().values()}
SERVING = EngineSettings(gpu_memory_utilization=0.9, max_model_len=8192, max_num_seqs=256)


def shape(preset: str, **overrides: object) -> ModelShape:
    found = lookup_preset(preset)
    assert found is not None
    return ModelShape.from_values({**found.architecture, **overrides})


def gpu_memory(name: str) -> GpuMemory:
    return GpuMemory(name=name, memory_bytes=GPUS[name].memory_bytes)


@pytest.mark.parametrize(
    ("gpu", "tokens"),
    [("H200", 8192), ("H100", 8192), ("A100-80GB", 2048), ("L40S", 2048), ("L4", 2048), ("B200", 16384)],
)
def test_unset_max_num_batched_tokens_takes_vllms_default_for_the_gpu(gpu: str, tokens: int) -> None:
    assert effective_max_num_batched_tokens(SERVING, gpu_memory(gpu)) == tokens


def test_without_chunked_prefill_one_step_must_hold_a_whole_prompt() -> None:
    settings = dataclasses.replace(SERVING, enable_chunked_prefill=False, max_model_len=32768)
    assert effective_max_num_batched_tokens(settings, gpu_memory("H200")) == 32768


def test_the_default_batch_budget_never_exceeds_what_the_sequences_can_use() -> None:
    settings = dataclasses.replace(SERVING, max_num_seqs=2, max_model_len=1024)
    assert effective_max_num_batched_tokens(settings, gpu_memory("H200")) == 2048


def test_cuda_graphs_are_captured_for_vllms_default_sizes() -> None:
    sizes = cudagraph_capture_sizes(max_num_seqs=256, max_num_batched_tokens=8192)
    assert sizes[:5] == [1, 2, 4, 8, 16]
    assert sizes[-1] == 512 and len(sizes) == 3 + len(range(8, 256, 8)) + len(range(256, 513, 16))
    assert cudagraph_capture_sizes(max_num_seqs=64, max_num_batched_tokens=8192)[-1] == 128


def test_kv_cache_is_whole_16_token_blocks_across_every_layer() -> None:
    llama = shape("llama-3.1-8b")
    sizing = size_memory(llama, GPUS["H200"], 1, SERVING)
    page = 2 * 16 * 8 * 128 * 2
    assert sizing.kv_cache.page_bytes_per_layer == page
    assert sizing.kv_cache.num_blocks == sizing.memory.kv_cache_bytes // page // 32
    assert sizing.kv_cache.tokens == sizing.kv_cache.num_blocks * 16
    assert sizing.kv_cache.max_concurrency == pytest.approx(sizing.kv_cache.tokens / 8192)


def test_kv_cache_memory_is_what_the_request_leaves_after_weights_and_overheads() -> None:
    sizing = size_memory(shape("qwen2.5-7b"), GPUS["H200"], 1, SERVING).memory
    assert sizing.requested_bytes == math.ceil(sizing.cuda_total_bytes * 0.9)
    assert sizing.kv_cache_bytes == (
        sizing.requested_bytes
        - sizing.weight_bytes
        - sizing.activation_peak_bytes
        - sizing.non_torch_bytes
        - sizing.cudagraph_bytes
    )
    assert sizing.cuda_total_bytes == GPUS["H200"].memory_bytes - memory.DRIVER_RESERVED_BYTES


def test_lowering_utilization_takes_memory_from_the_kv_cache_only() -> None:
    llama = shape("llama-3.1-8b")
    high = size_memory(llama, GPUS["H200"], 1, SERVING).memory
    low = size_memory(llama, GPUS["H200"], 1, dataclasses.replace(SERVING, gpu_memory_utilization=0.6)).memory
    assert high.kv_cache_bytes - low.kv_cache_bytes == high.requested_bytes - low.requested_bytes
    assert (high.weight_bytes, high.activation_peak_bytes) == (low.weight_bytes, low.activation_peak_bytes)


def test_enforce_eager_reserves_no_cuda_graph_memory() -> None:
    llama = shape("llama-3.1-8b")
    graphs = size_memory(llama, GPUS["H200"], 1, SERVING).memory.cudagraph_bytes
    eager = size_memory(llama, GPUS["H200"], 1, dataclasses.replace(SERVING, enforce_eager=True)).memory
    assert graphs > 0 and eager.cudagraph_bytes == 0


def test_more_batched_tokens_raise_the_activation_peak() -> None:
    llama = shape("llama-3.1-8b")
    small = size_memory(llama, GPUS["H200"], 1, dataclasses.replace(SERVING, max_num_batched_tokens=2048))
    large = size_memory(llama, GPUS["H200"], 1, dataclasses.replace(SERVING, max_num_batched_tokens=16384))
    assert large.memory.activation_peak_bytes > small.memory.activation_peak_bytes
    # the MLP peak: residual + attention output + new residual + gate/up + activation, per token
    per_token = (4096 + 2 * 4096 + 3 * 14336) * 2
    assert large.memory.activation_peak_bytes == 16384 * per_token + memory.CUBLAS_WORKSPACE_BYTES


def test_sampler_over_many_sequences_can_set_the_peak() -> None:
    llama = shape("llama-3.1-8b")
    fewer = size_memory(llama, GPUS["L4"], 1, dataclasses.replace(SERVING, max_num_seqs=512))
    more = size_memory(llama, GPUS["L4"], 1, dataclasses.replace(SERVING, max_num_seqs=1024))
    # 2048 batched tokens on an L4: the sampler's logits over 128256 tokens outgrow the forward pass
    logits_growth = (1024 - 512) * 128256 * (2 + 4 * memory.SAMPLER_FP32_COPIES)
    assert more.memory.activation_peak_bytes - fewer.memory.activation_peak_bytes == logits_growth


def test_sliding_window_requests_hold_the_window_not_the_whole_context() -> None:
    windowed = shape("mistral-7b-v0.3", sliding_window=4096)  # Mistral-7B v0.1's window
    assert blocks_per_request(windowed, 32768, 2048) == math.ceil((4095 + 2 * 2048) / 16) + 1
    long_context = dataclasses.replace(SERVING, max_model_len=32768)
    full = size_memory(shape("mistral-7b-v0.3"), GPUS["H200"], 1, long_context)
    sliding = size_memory(windowed, GPUS["H200"], 1, long_context)
    assert sliding.kv_cache.num_blocks == full.kv_cache.num_blocks
    assert sliding.kv_cache.tokens > full.kv_cache.tokens


def test_mla_models_use_64_token_pages() -> None:
    sizing = size_memory(shape("deepseek-v2-lite"), GPUS["H200"], 1, SERVING)
    assert sizing.kv_cache.block_size_tokens == 64
    assert sizing.kv_cache.page_bytes_per_layer == 64 * (512 + 64) * 2
    assert sizing.kv_bytes_per_token == 27 * (512 + 64) * 2
