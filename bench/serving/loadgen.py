"""Closed-loop streaming load on an OpenAI-compatible `/v1/completions` endpoint (stdlib only).

Each level keeps `concurrency` requests in flight until `num_prompts` have been sent (or the level's
time cap passes), like `vllm bench serve --max-concurrency C --num-prompts N --ignore-eos` with a
random dataset: prompts are `input_len` random token ids (sent as ids, so the length is exact) and
every request generates exactly `output_len` tokens (`ignore_eos`). Per request it records the
time to the first streamed token (TTFT), the end, and the output token count from the final usage
chunk; TPOT = (end - first token) / (tokens - 1), as vLLM's benchmark defines it.

The client is split over several processes at high concurrency so that parsing hundreds of
server-sent-event streams in one Python process never becomes the bottleneck being measured. It
has no dependencies, so it runs unchanged on the lab GPU host, in the vLLM CPU venv and in tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

CLIENTS_PER_PROCESS = 32
MAX_PROCESSES = 8


@dataclass
class RequestRecord:
    start: float
    first_token: float | None = None
    end: float | None = None
    output_tokens: int = 0
    events: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.first_token is not None


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    model: str
    path: str = "/v1/completions"


class StreamError(Exception):
    pass


async def _read_chunked(reader: asyncio.StreamReader):
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise StreamError("connection closed inside a chunked body")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()  # the CRLF after the last chunk (no trailers from uvicorn)
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def _read_until_eof(reader: asyncio.StreamReader):
    while True:
        data = await reader.read(65536)
        if not data:
            return
        yield data


def request_body(target: Target, prompt_ids: Sequence[int], output_len: int) -> bytes:
    return json.dumps(
        {
            "model": target.model,
            "prompt": list(prompt_ids),
            "max_tokens": output_len,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def stream_request(target: Target, body: bytes, timeout_s: float) -> RequestRecord:
    record = RequestRecord(start=time.time())
    try:
        await asyncio.wait_for(_stream(target, body, record), timeout_s)
    except TimeoutError:
        record.error = f"timed out after {timeout_s:.0f} s"
    except (OSError, StreamError, asyncio.IncompleteReadError, ValueError) as error:
        record.error = f"{type(error).__name__}: {error}"[:300]
    return record


async def _stream(target: Target, body: bytes, record: RequestRecord) -> None:
    reader, writer = await asyncio.open_connection(target.host, target.port, limit=1 << 20)
    try:
        writer.write(
            f"POST {target.path} HTTP/1.1\r\nHost: {target.host}:{target.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise StreamError(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[bytes, bytes] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.partition(b":")
            headers[key.strip().lower()] = value.strip().lower()
        chunked = headers.get(b"transfer-encoding") == b"chunked"
        body_parts = _read_chunked(reader) if chunked else _read_until_eof(reader)
        if status != 200:
            text = b"".join([part async for part in body_parts])[:300]
            raise StreamError(f"HTTP {status}: {text.decode(errors='replace')}")
        buffer = b""
        done = False
        async for part in body_parts:
            buffer += part
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                done = _handle_event(event.replace(b"\r", b""), record) or done
        record.end = time.time()
        if not done:
            raise StreamError("the stream ended without data: [DONE]")
        if record.output_tokens == 0:
            raise StreamError("no usage chunk (stream_options.include_usage) with completion_tokens")
    finally:
        writer.close()


def _handle_event(event: bytes, record: RequestRecord) -> bool:
    """Account one SSE event; True at `data: [DONE]`. JSON is parsed only for the usage chunk."""
    for line in event.split(b"\n"):
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return True
        if b'"error"' in payload and b'"choices"' not in payload:
            raise StreamError(payload.decode(errors="replace")[:300])
        if b'"completion_tokens"' in payload:
            chunk = json.loads(payload)
            record.output_tokens = int((chunk.get("usage") or {}).get("completion_tokens") or 0)
            if not chunk.get("choices"):
                continue  # the final usage-only chunk carries no token
        record.events += 1
        if record.first_token is None:
            record.first_token = time.time()
    return False


def make_prompts(count: int, input_len: int, token_id_range: tuple[int, int], seed: int) -> list[list[int]]:
    low, high = token_id_range
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(input_len)] for _ in range(count)]


async def _run_share(
    target: Target,
    prompts: list[list[int]],
    concurrency: int,
    output_len: int,
    start_at: float,
    stop_sending_at: float,
    request_timeout_s: float,
) -> list[RequestRecord]:
    await asyncio.sleep(max(0.0, start_at - time.time()))
    queue = list(reversed(prompts))
    records: list[RequestRecord] = []

    async def client() -> None:
        while queue and time.time() < stop_sending_at:
            body = request_body(target, queue.pop(), output_len)
            records.append(await stream_request(target, body, request_timeout_s))

    await asyncio.gather(*(client() for _ in range(max(1, concurrency))))
    return records


def _run(coroutine: Any) -> Any:
    """Run on a private event loop: asyncio.run would leave the thread without one afterwards, which
    breaks callers that rely on asyncio.get_event_loop() later in the same process (Pulumi's runtime)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def _worker(job: dict[str, Any]) -> list[dict[str, Any]]:
    target = Target(**job["target"])
    records = _run(
        _run_share(
            target,
            job["prompts"],
            job["concurrency"],
            job["output_len"],
            job["start_at"],
            job["stop_sending_at"],
            job["request_timeout_s"],
        )
    )
    return [asdict(record) for record in records]


def split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def run_level(
    target: Target,
    *,
    concurrency: int,
    num_prompts: int,
    input_len: int,
    output_len: int,
    token_id_range: tuple[int, int],
    time_cap_s: float,
    seed: int = 0,
    request_timeout_s: float = 600.0,
    processes: int | None = None,
) -> dict[str, Any]:
    """One concurrency level: summary metrics plus the per-request records."""
    if processes is None:
        processes = min(MAX_PROCESSES, max(1, math.ceil(concurrency / CLIENTS_PER_PROCESS)))
    processes = max(1, min(processes, concurrency))
    prompts = make_prompts(num_prompts, input_len, token_id_range, seed)
    shares = split_evenly(concurrency, processes)
    prompt_shares = split_evenly(num_prompts, processes)
    start_at = time.time() + 0.5 + 0.25 * processes  # all processes started and importing done
    jobs = []
    offset = 0
    for share, prompt_count in zip(shares, prompt_shares, strict=True):
        jobs.append(
            {
                "target": asdict(target),
                "prompts": prompts[offset : offset + prompt_count],
                "concurrency": share,
                "output_len": output_len,
                "start_at": start_at,
                "stop_sending_at": start_at + time_cap_s,
                "request_timeout_s": request_timeout_s,
            }
        )
        offset += prompt_count
    if processes == 1:
        raw = _worker(jobs[0])
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            raw = [record for share in pool.map(_worker, jobs) for record in share]
    records = [RequestRecord(**record) for record in raw]
    summary = summarize(records, input_len=input_len)
    summary.update(
        concurrency=concurrency,
        num_prompts_planned=num_prompts,
        processes=processes,
        input_len=input_len,
        output_len=output_len,
    )
    return {"summary": summary, "requests": [_compact(record) for record in records]}


def _compact(record: RequestRecord) -> list[Any]:
    """[start, ttft_ms, e2e_ms, output_tokens, error] — small enough to keep every request."""
    ttft = None if record.first_token is None else round((record.first_token - record.start) * 1000, 2)
    e2e = None if record.end is None else round((record.end - record.start) * 1000, 2)
    return [round(record.start, 4), ttft, e2e, record.output_tokens, record.error]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default method)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def _stats_ms(values: list[float]) -> dict[str, float | None]:
    scaled = [value * 1000 for value in values]
    return {
        "mean": sum(scaled) / len(scaled) if scaled else None,
        "median": percentile(scaled, 50),
        "p90": percentile(scaled, 90),
        "p99": percentile(scaled, 99),
        "max": max(scaled) if scaled else None,
    }


def summarize(records: list[RequestRecord], *, input_len: int) -> dict[str, Any]:
    ok = [record for record in records if record.ok]
    failed = [record for record in records if not record.ok]
    summary: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(failed),
        "errors": sorted({str(record.error) for record in failed})[:5],
    }
    if not ok:
        return summary
    begin = min(record.start for record in records)
    finish = max(record.end for record in ok if record.end is not None)
    duration = max(finish - begin, 1e-9)
    output_tokens = sum(record.output_tokens for record in ok)
    ttft = [record.first_token - record.start for record in ok]  # type: ignore[operator]
    tpot = [
        (record.end - record.first_token) / (record.output_tokens - 1)  # type: ignore[operator]
        for record in ok
        if record.output_tokens > 1
    ]
    e2e = [record.end - record.start for record in ok]  # type: ignore[operator]
    summary.update(
        duration_s=duration,
        output_tokens=output_tokens,
        output_throughput_tok_s=output_tokens / duration,
        total_throughput_tok_s=(output_tokens + input_len * len(ok)) / duration,
        request_throughput_req_s=len(ok) / duration,
        ttft_ms=_stats_ms(ttft),
        tpot_ms=_stats_ms(tpot),
        e2e_ms=_stats_ms(e2e),
        mean_events_per_request=sum(record.events for record in ok) / len(ok),
    )
    return summary
