"""infra/smoke.py against the real vLLM server, and against the failures a real endpoint shows."""

from __future__ import annotations

import httpx
import pytest

from infra.smoke import SmokeError, chat_completions_url, format_smoke_result, iter_sse_data, run_smoke
from tests.e2e.conftest import API_KEY, SERVED_MODEL_NAME
from tests.support.vllm_server import RunningVllmServer, free_port

pytestmark = pytest.mark.e2e


def test_smoke_streams_a_completion_and_measures_it(vllm_server: RunningVllmServer) -> None:
    result = run_smoke(vllm_server.base_url, SERVED_MODEL_NAME, API_KEY, max_tokens=16)

    assert result.time_to_first_token_seconds > 0
    assert result.total_seconds >= result.time_to_first_token_seconds
    assert result.completion_tokens == 16
    assert result.completion_tokens_source == "usage"
    assert result.prompt_tokens is not None and result.prompt_tokens > 0
    assert result.tokens_per_second > 0
    assert result.finish_reason == "length"
    assert result.text
    report = format_smoke_result(result)
    assert report.startswith(f"smoke test passed: {vllm_server.base_url} model {SERVED_MODEL_NAME}")
    assert "time to first token" in report and "tokens/s" in report


def test_smoke_accepts_a_base_url_that_ends_in_v1(vllm_server: RunningVllmServer) -> None:
    # 16 tokens, not 2: the tiny model's random weights sample freely, and two tokens that both decode
    # to no text (a partial UTF-8 byte, a special token) made the smoke client say "without a single
    # token" once in CI; what this test checks is the URL, not the model's text.
    result = run_smoke(f"{vllm_server.base_url}/v1/", SERVED_MODEL_NAME, API_KEY, max_tokens=16)
    assert 1 <= result.completion_tokens <= 16


def test_smoke_without_a_key_fails_with_401_and_says_how_to_give_one(vllm_server: RunningVllmServer) -> None:
    with pytest.raises(
        SmokeError, match=r"401 Unauthorized .* none was given; pass --api-key or set VLLM_API_KEY"
    ):
        run_smoke(vllm_server.base_url, SERVED_MODEL_NAME, None)


def test_smoke_with_a_wrong_key_says_the_key_was_rejected(vllm_server: RunningVllmServer) -> None:
    with pytest.raises(SmokeError, match=r"401 Unauthorized .* rejected the API key"):
        run_smoke(vllm_server.base_url, SERVED_MODEL_NAME, "not-the-key")


def test_smoke_for_an_unknown_model_shows_the_servers_message(vllm_server: RunningVllmServer) -> None:
    with pytest.raises(SmokeError, match=r"HTTP 404 .*does not exist.*served model name"):
        run_smoke(vllm_server.base_url, "no-such-model", API_KEY)


def test_smoke_reports_connection_refused_clearly() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(SmokeError, match=r"cannot connect to .*/v1/chat/completions.* Is the server"):
        run_smoke(url, SERVED_MODEL_NAME, API_KEY, timeout_seconds=5)


def _transport(status: int, content: bytes, content_type: str) -> httpx.MockTransport:
    return httpx.MockTransport(
        lambda request: httpx.Response(status, content=content, headers={"content-type": content_type})
    )


def test_smoke_rejects_a_200_that_is_not_an_event_stream() -> None:
    # What a proxy or a non-vLLM backend answers, e.g. a JSON completion or an HTML login page.
    transport = _transport(200, b'{"choices": []}', "application/json")
    with pytest.raises(SmokeError, match="application/json instead of a text/event-stream"):
        run_smoke("http://endpoint", "m", "k", transport=transport)


def test_smoke_rejects_a_stream_cut_before_done() -> None:
    chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
    with pytest.raises(SmokeError, match="without `data: \\[DONE\\]`"):
        run_smoke("http://endpoint", "m", "k", transport=_transport(200, chunk, "text/event-stream"))


def test_smoke_counts_chunks_when_the_server_sends_no_usage() -> None:
    stream = b"".join(
        f'data: {{"choices": [{{"index": 0, "delta": {{"content": "t{i}"}}}}]}}\n\n'.encode()
        for i in range(3)
    )
    stream += b"data: [DONE]\n\n"
    result = run_smoke("http://endpoint", "m", "k", transport=_transport(200, stream, "text/event-stream"))
    assert (result.completion_tokens, result.completion_tokens_source, result.text) == (3, "chunks", "t0t1t2")


def test_smoke_surfaces_an_error_event_sent_mid_stream() -> None:
    # vLLM streams this when its engine dies after the 200 was sent.
    stream = (
        b'data: {"error": {"message": "EngineCore encountered an issue.", "code": 500}}\n\ndata: [DONE]\n\n'
    )
    with pytest.raises(SmokeError, match="error mid-stream: EngineCore encountered an issue"):
        run_smoke("http://endpoint", "m", "k", transport=_transport(200, stream, "text/event-stream"))


def test_sse_parser_joins_multiline_data_and_skips_comments() -> None:
    lines = [": keep-alive", "", "data: a", "data:b", "", "event: x", "data: [DONE]"]
    assert list(iter_sse_data(iter(lines))) == ["a\nb", "[DONE]"]


def test_chat_completions_url_accepts_base_urls_with_or_without_v1() -> None:
    assert chat_completions_url("https://h.example/") == "https://h.example/v1/chat/completions"
    assert chat_completions_url("https://h.example/v1") == "https://h.example/v1/chat/completions"


def test_cli_smoke_takes_the_key_from_vllm_api_key_env(
    vllm_server: RunningVllmServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    exit_code = main(
        ["smoke", "--url", vllm_server.base_url, "--model", SERVED_MODEL_NAME, "--max-tokens", "4"]
    )
    assert exit_code == 0
    assert capsys.readouterr().out.startswith("smoke test passed")


def test_cli_smoke_without_a_key_exits_non_zero_with_the_reason(
    vllm_server: RunningVllmServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra.cli import main

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    exit_code = main(["smoke", "--url", vllm_server.base_url, "--model", SERVED_MODEL_NAME])
    assert exit_code != 0
    assert "401 Unauthorized" in capsys.readouterr().err
