"""vLLM log facts: the KV-cache lines the capacity planner is calibrated with, and start-up timings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.serving.vllm_log import (
    compile_cache_key,
    kv_cache_ready,
    line_time,
    milestone_times,
    parse_line,
    parse_log,
)

# Spelled as vLLM 0.26.0/0.32.0 log them (format strings in bench/serving/vllm_log.py's docstring),
# with the process prefixes the V1 engine adds.
API = "(APIServer pid=4012) INFO 11-29 10:00:01 "
CORE = "(EngineCore pid=4100) INFO 11-29 10:01:09 "
GPU_LOG = [
    API + "[utils.py:253] non-default args: {'model': '/tmp/m/llama8b'}",
    CORE + "[cuda.py:483] Using FLASH_ATTN attention backend out of potential backends: ('FLASH_ATTN',).",
    CORE + "[gpu_model_runner.py:5348] Model loading took 14.99 GiB memory and 4.712345 seconds",
    "(EngineCore pid=4100) Traceback (most recent call last):  # a harmless optional-import warning",
    CORE + "[monitor.py:20] torch.compile took 38.27 s in total",
    CORE + "[gpu_worker.py:561] Available KV cache memory: 106.83 GiB",
    CORE + "[kv_cache_utils.py:2177] GPU KV cache size: 1,750,288 tokens",
    CORE + "[kv_cache_utils.py:2179] Maximum concurrency for 16,384 tokens per request: 106.83x",
    CORE + "[gpu_model_runner.py:6845] Graph capturing finished in 21 secs, took 0.61 GiB",
    CORE + "[core.py:331] init engine (profile, create kv cache, warmup model) took 70.12 s",
    "(APIServer pid=4012) INFO:     Application startup complete.",
]


def test_kv_cache_lines_give_memory_tokens_and_concurrency() -> None:
    facts = parse_log(GPU_LOG)
    assert facts["available_kv_cache_gib"] == 106.83
    assert facts["kv_cache_tokens"] == 1_750_288
    assert facts["max_concurrency"] == 106.83
    assert facts["max_concurrency_context_tokens"] == 16_384
    assert len(facts["kv_cache_log_lines"]) == 3
    assert kv_cache_ready(facts)


def test_startup_timings_are_parsed() -> None:
    facts = parse_log(GPU_LOG)
    assert facts["model_load_gib"] == 14.99 and facts["model_load_s"] == 4.712345
    assert facts["torch_compile_s"] == 38.27
    assert facts["graph_capture_s"] == 21 and facts["graph_capture_gib"] == 0.61
    assert facts["init_engine_s"] == 70.12
    assert facts["attention_backend"] == "FLASH_ATTN"
    assert facts["startup_complete"] is True


def test_kv_cache_not_ready_until_tokens_and_concurrency_are_logged() -> None:
    partial = parse_log(GPU_LOG[:7])
    assert partial["kv_cache_tokens"] == 1_750_288 and "available_kv_cache_gib" in partial
    assert not kv_cache_ready(partial)


def test_vllm_0_32_logs_size_and_concurrency_in_one_line() -> None:
    line = (
        CORE + "[kv_cache_utils.py:2327] GPU KV cache size: 3,500,576 tokens, Maximum concurrency for "
        "16,384 tokens per request: 213.66x"
    )
    facts = parse_log([CORE + "[gpu_worker.py:760] Available KV cache memory: 106.83 GiB", line])
    assert facts["kv_cache_tokens"] == 3_500_576 and facts["max_concurrency"] == 213.66
    assert kv_cache_ready(facts)
    cpu = parse_line(
        "INFO [kv_cache_utils.py:2327] CPU KV cache size: 4,194,304 tokens, "
        "Maximum concurrency for 16,384 tokens per request: 256.00x"
    )
    assert cpu["kv_cache_tokens"] == 4_194_304 and cpu["max_concurrency"] == 256.0
    assert parse_line("GPU + host KV cache size: 10 tokens")["kv_cache_tokens"] == 10


def test_unrelated_lines_state_nothing() -> None:
    assert parse_line(GPU_LOG[0]) == {}
    assert parse_line(GPU_LOG[3]) == {}


def test_small_numbers_without_separators() -> None:
    facts = parse_line("INFO [kv_cache_utils.py:2179] Maximum concurrency for 512 tokens per request: 3.50x")
    assert facts == {"max_concurrency_context_tokens": 512, "max_concurrency": 3.5}
    assert parse_line("INFO GPU KV cache size: 880 tokens") == {"kv_cache_tokens": 880}


def test_milestones_carry_the_logs_own_stamps_in_the_runs_time_zone() -> None:
    times = milestone_times(GPU_LOG, year=2026, utc_offset=timedelta(hours=1))
    at = datetime(2026, 11, 29, 9, 0, 1, tzinfo=UTC).timestamp()  # 10:00:01 at UTC+1
    assert times["first_log_line"] == at
    assert times["model_loaded"] - at == 68  # 10:01:09
    assert set(times) == {
        "first_log_line",
        "model_loaded",
        "torch_compile_done",
        "kv_cache_allocated",
        "graphs_captured",
        "engine_ready",
    }, "no 'Initializing a V1 LLM engine' line in this log"
    assert (
        line_time(
            "(APIServer pid=4012) INFO:     Application startup complete.", year=2026, utc_offset=timedelta(0)
        )
        is None
    )


def test_compile_cache_key_is_the_folder_vllm_names() -> None:
    line = (
        CORE + "[backends.py:1094] Using cache directory: /c/torch_compile_cache/3e7f0439bf/rank_0_0/backbone"
    )
    assert compile_cache_key([GPU_LOG[0], line]) == "3e7f0439bf"
    assert compile_cache_key(GPU_LOG) is None
