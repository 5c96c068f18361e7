"""What the stack relies on from a real vLLM 0.32.0 server: auth, health, SSE framing."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import API_KEY, SERVED_MODEL_NAME
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e


def test_health_answers_200_without_an_api_key(vllm_server: RunningVllmServer) -> None:
    # Kubernetes probes carry no key, so /health must stay open when VLLM_API_KEY is set.
    assert httpx.get(f"{vllm_server.base_url}/health", timeout=10).status_code == 200


def test_api_key_from_the_vllm_api_key_env_protects_v1_routes(vllm_server: RunningVllmServer) -> None:
    url = f"{vllm_server.base_url}/v1/models"
    assert httpx.get(url, timeout=10).status_code == 401
    wrong = httpx.get(url, headers={"Authorization": "Bearer not-the-key"}, timeout=10)
    assert wrong.status_code == 401
    right = httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    assert right.status_code == 200
    assert [model["id"] for model in right.json()["data"]] == [SERVED_MODEL_NAME]


def test_metrics_answer_without_an_api_key(vllm_server: RunningVllmServer) -> None:
    # Prometheus scrapes pods without the key: /metrics is outside the guarded /v1 prefix.
    response = httpx.get(f"{vllm_server.base_url}/metrics", timeout=10)
    assert response.status_code == 200
    assert "vllm:num_requests_waiting" in response.text


def test_streamed_chat_completion_is_sse_data_events_ending_with_done(vllm_server: RunningVllmServer) -> None:
    body = {
        "model": SERVED_MODEL_NAME,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST",
        f"{vllm_server.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = list(response.iter_lines())

    events = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in events), events
    payloads = [line.removeprefix("data: ") for line in events]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    assert any(choice["delta"].get("content") for chunk in chunks for choice in chunk["choices"])
