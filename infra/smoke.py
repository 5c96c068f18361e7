"""Smoke-test a deployed vLLM endpoint: stream one chat completion and time it.

Used by `vllm-platform smoke --url URL --model NAME [--api-key KEY]`. It speaks the OpenAI API the
way clients do (`POST /v1/chat/completions`, `stream: true`, Server-Sent Events) and reads the
stream itself rather than through an SDK, so a proxy that buffers or rewrites SSE is caught too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_PROMPT = "Write one sentence about Kubernetes."
_ERROR_BODY_CHARS = 300


class SmokeError(RuntimeError):
    """The endpoint did not stream a completion; the message says what went wrong and what to try."""


@dataclass(frozen=True)
class SmokeResult:
    url: str
    model: str
    text: str
    completion_tokens: int
    # "usage" when the server's usage chunk gave the count, else "chunks" (content events counted).
    completion_tokens_source: str
    prompt_tokens: int | None
    finish_reason: str | None
    # From sending the request (connection included) to the first event carrying text.
    time_to_first_token_seconds: float
    # From sending the request to `data: [DONE]`.
    total_seconds: float
    # Completion tokens per second from the first token to the end of the stream (the decode rate a
    # user sees); over the whole request when there is a single token.
    tokens_per_second: float
    events: int


def chat_completions_url(url: str) -> str:
    """The endpoint for a base URL given with or without its `/v1`."""
    base = url.rstrip("/")
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


def run_smoke(
    url: str,
    model: str,
    api_key: str | None,
    prompt: str = DEFAULT_PROMPT,
    max_tokens: int = 64,
    timeout_seconds: float = 60,
    *,
    transport: httpx.BaseTransport | None = None,
) -> SmokeResult:
    """Stream one chat completion from `url` and measure it; raise SmokeError on any failure."""
    endpoint = chat_completions_url(url)
    headers = {"Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    try:
        with (
            httpx.Client(timeout=timeout_seconds, transport=transport) as client,
            client.stream("POST", endpoint, json=body, headers=headers) as response,
        ):
            _raise_for_response(response, endpoint, model, api_key)
            return _read_stream(response, url=url, model=model, started=started)
    except httpx.ConnectError as error:
        raise SmokeError(
            f"cannot connect to {endpoint}: {error}. Is the server (or the port-forward / load balancer "
            "in front of it) up, and are the scheme, host and port right?"
        ) from error
    except httpx.TimeoutException as error:
        raise SmokeError(
            f"{endpoint} did not answer within {timeout_seconds:g} s ({type(error).__name__}); the model "
            "may still be loading (check /health) or a proxy is holding the stream"
        ) from error
    except httpx.TransportError as error:
        raise SmokeError(f"the connection to {endpoint} failed: {type(error).__name__}: {error}") from error


def _raise_for_response(response: httpx.Response, endpoint: str, model: str, api_key: str | None) -> None:
    if response.status_code == 401:
        if api_key:
            raise SmokeError(
                f"401 Unauthorized from {endpoint}: the server rejected the API key given; "
                "check it against the key in the model's secret"
            )
        raise SmokeError(
            f"401 Unauthorized from {endpoint}: the server requires an API key and none was given; "
            "pass --api-key or set VLLM_API_KEY"
        )
    if response.status_code != 200:
        detail = _error_detail(response)
        hint = (
            f" (is {model!r} the served model name? GET /v1/models lists them)"
            if response.status_code == 404
            else ""
        )
        raise SmokeError(f"HTTP {response.status_code} from {endpoint}: {detail}{hint}")
    content_type = response.headers.get("content-type", "")
    if not content_type.startswith("text/event-stream"):
        excerpt = response.read()[:_ERROR_BODY_CHARS].decode(errors="replace")
        raise SmokeError(
            f"{endpoint} answered 200 with {content_type or 'no content type'} instead of a "
            f"text/event-stream; is it a vLLM OpenAI server (or a proxy that rewrites streams)? "
            f"Body starts: {excerpt!r}"
        )


def _error_detail(response: httpx.Response) -> str:
    raw = response.read()
    try:
        payload = json.loads(raw)
    except ValueError:
        return raw[:_ERROR_BODY_CHARS].decode(errors="replace") or "(empty body)"
    if isinstance(payload, dict):
        error = payload.get("error", payload)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
    return json.dumps(payload)[:_ERROR_BODY_CHARS]


def iter_sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The `data` of each Server-Sent Event: `data:` lines of one event joined, comments skipped."""
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        # Comments (":" keep-alives) and the event/id/retry fields carry nothing for us.
    if data:
        yield "\n".join(data)


def _delta_text(chunk: dict[str, Any]) -> str:
    text = ""
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        for key in ("content", "reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                text += delta[key]
    return text


def _read_stream(response: httpx.Response, *, url: str, model: str, started: float) -> SmokeResult:
    first_token_at: float | None = None
    text_parts: list[str] = []
    content_events = 0
    events = 0
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done = False
    for data in iter_sse_data(response.iter_lines()):
        if data.strip() == "[DONE]":
            done = True
            break
        events += 1
        try:
            chunk = json.loads(data)
        except ValueError as error:
            raise SmokeError(
                f"the stream sent an event that is not JSON: {data[:_ERROR_BODY_CHARS]!r}"
            ) from error
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise SmokeError(f"the server reported an error mid-stream: {message}")
        text = _delta_text(chunk)
        if text:
            if first_token_at is None:
                first_token_at = time.perf_counter()
            content_events += 1
            text_parts.append(text)
        for choice in chunk.get("choices") or []:
            finish_reason = choice.get("finish_reason") or finish_reason
        if chunk.get("usage"):
            usage = chunk["usage"]
    finished = time.perf_counter()
    if not done:
        raise SmokeError(
            f"the stream ended after {events} events without `data: [DONE]`; the server or a proxy cut it"
        )
    if first_token_at is None:
        raise SmokeError(f"the stream finished ([DONE]) after {events} events without a single token")

    if usage and isinstance(usage.get("completion_tokens"), int):
        completion_tokens, source = int(usage["completion_tokens"]), "usage"
    else:
        completion_tokens, source = content_events, "chunks"
    decode_seconds = finished - first_token_at
    if completion_tokens > 1 and decode_seconds > 0:
        tokens_per_second = (completion_tokens - 1) / decode_seconds
    else:
        tokens_per_second = completion_tokens / (finished - started)
    return SmokeResult(
        url=url,
        model=model,
        text="".join(text_parts),
        completion_tokens=completion_tokens,
        completion_tokens_source=source,
        prompt_tokens=usage.get("prompt_tokens") if usage else None,
        finish_reason=finish_reason,
        time_to_first_token_seconds=first_token_at - started,
        total_seconds=finished - started,
        tokens_per_second=tokens_per_second,
        events=events,
    )


def format_smoke_result(result: SmokeResult) -> str:
    preview = result.text if len(result.text) <= 120 else result.text[:117] + "..."
    counted = "from usage" if result.completion_tokens_source == "usage" else "counted from stream chunks"
    prompt = f", {result.prompt_tokens} prompt tokens" if result.prompt_tokens is not None else ""
    return "\n".join(
        [
            f"smoke test passed: {result.url} model {result.model}",
            f"  time to first token  {result.time_to_first_token_seconds * 1000:.0f} ms",
            f"  total                {result.total_seconds:.2f} s, {result.events} stream events",
            f"  completion tokens    {result.completion_tokens} ({counted}){prompt}, "
            f"finish reason {result.finish_reason or 'none'}",
            f"  decode rate          {result.tokens_per_second:.1f} tokens/s",
            f"  text                 {preview!r}",
        ]
    )
