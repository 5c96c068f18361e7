"""The load generator measures what a streaming client sees, against a server with known delays."""

from __future__ import annotations

import socket

import pytest

from bench.serving.fake_server import FakeBehaviour, fake_vllm_server
from bench.serving.loadgen import RequestRecord, Target, percentile, run_level, split_evenly, summarize

FIRST_TOKEN_S = 0.15
TOKEN_S = 0.004


def _level(port: int, **overrides) -> dict:
    options = dict(
        concurrency=4,
        num_prompts=8,
        input_len=32,
        output_len=40,
        token_id_range=(3, 100),
        time_cap_s=30,
        processes=1,
    )
    options.update(overrides)
    return run_level(Target("127.0.0.1", port, "m"), **options)


def test_ttft_tpot_and_tokens_match_the_server_delays() -> None:
    with fake_vllm_server(FakeBehaviour(first_token_delay_s=FIRST_TOKEN_S, token_interval_s=TOKEN_S)) as port:
        summary = _level(port)["summary"]
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert summary["output_tokens"] == 8 * 40
    assert FIRST_TOKEN_S * 1000 <= summary["ttft_ms"]["mean"] < FIRST_TOKEN_S * 1000 + 400
    assert TOKEN_S * 1000 * 0.9 <= summary["tpot_ms"]["mean"] < TOKEN_S * 1000 * 4
    # two waves of four: each about first token + 39 tokens
    single = FIRST_TOKEN_S + 39 * TOKEN_S
    assert 2 * single * 0.9 <= summary["duration_s"] < 2 * single + 2
    assert summary["output_throughput_tok_s"] == pytest.approx(
        summary["output_tokens"] / summary["duration_s"]
    )


def test_stream_interval_groups_tokens_but_usage_counts_them_all() -> None:
    with fake_vllm_server(
        FakeBehaviour(first_token_delay_s=0.01, token_interval_s=0.001, stream_interval=4)
    ) as port:
        summary = _level(port, output_len=41)["summary"]
    assert summary["output_tokens"] == 8 * 41
    assert summary["mean_events_per_request"] == 1 + 40 / 4


def test_several_client_processes_share_the_concurrency() -> None:
    with fake_vllm_server(FakeBehaviour(first_token_delay_s=0.01, token_interval_s=0.001)) as port:
        level = _level(port, concurrency=6, num_prompts=12, processes=3)
    assert level["summary"]["completed"] == 12
    assert level["summary"]["processes"] == 3
    assert len(level["requests"]) == 12
    start, ttft_ms, e2e_ms, tokens, error = level["requests"][0]
    assert ttft_ms <= e2e_ms and tokens == 40 and error is None and start > 0


def test_http_errors_are_failed_requests_with_the_message() -> None:
    with fake_vllm_server(FakeBehaviour(fail_status=400)) as port:
        summary = _level(port, num_prompts=3, concurrency=1)["summary"]
    assert summary["completed"] == 0 and summary["failed"] == 3
    assert "HTTP 400" in summary["errors"][0] and "fake failure" in summary["errors"][0]


def test_refused_connection_is_a_failed_request() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    summary = _level(port, num_prompts=2, concurrency=1)["summary"]
    assert summary["failed"] == 2 and "ConnectionRefusedError" in summary["errors"][0]


def test_time_cap_stops_sending_new_requests() -> None:
    with fake_vllm_server(FakeBehaviour(first_token_delay_s=0.3, token_interval_s=0.0)) as port:
        summary = _level(port, concurrency=1, num_prompts=50, time_cap_s=0.5)["summary"]
    assert 1 <= summary["completed"] <= 3


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 50) == 2.5
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile([], 50) is None


def test_split_evenly_covers_the_total() -> None:
    assert split_evenly(10, 3) == [4, 3, 3]
    assert sum(split_evenly(256, 8)) == 256


def test_summary_without_completed_requests_has_no_rates() -> None:
    summary = summarize([RequestRecord(start=1.0, error="boom")], input_len=8)
    assert summary == {"completed": 0, "failed": 1, "errors": ["boom"]}
