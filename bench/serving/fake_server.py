"""A stand-in for vLLM's OpenAI server: `/health` and streaming `/v1/completions` (stdlib only).

It answers the way vLLM 0.26/0.32 stream completions (chunked transfer encoding, one SSE `data:`
event per `stream_interval` tokens, a final usage-only chunk when `stream_options.include_usage`,
then `data: [DONE]`), with configurable delays, so the load generator's timing and parsing can be
tested without a model (tests, and the GPU selftest in seconds).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class FakeBehaviour:
    first_token_delay_s: float = 0.05
    token_interval_s: float = 0.002
    stream_interval: int = 1
    fail_status: int | None = None


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, behaviour: FakeBehaviour
) -> None:
    try:
        request_line = await reader.readline()
        headers = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        method, path = request_line.decode().split(" ")[:2]
        if method == "GET" and path == "/health":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            return
        if behaviour.fail_status is not None:
            message = b'{"error": {"message": "fake failure"}}'
            writer.write(
                f"HTTP/1.1 {behaviour.fail_status} Error\r\ncontent-length: {len(message)}\r\n"
                "connection: close\r\n\r\n".encode()
                + message
            )
            return
        request = json.loads(body)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )

        def send(event: dict | str) -> None:
            data = event if isinstance(event, str) else json.dumps(event)
            payload = f"data: {data}\n\n".encode()
            writer.write(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")

        tokens = int(request["max_tokens"])
        await asyncio.sleep(behaviour.first_token_delay_s)
        sent = 0
        while sent < tokens:
            step = 1 if sent == 0 else min(behaviour.stream_interval, tokens - sent)
            if sent > 0:
                await asyncio.sleep(behaviour.token_interval_s * step)
            sent += step
            send(
                {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "model": request["model"],
                    "choices": [{"index": 0, "text": "x" * step, "logprobs": None, "finish_reason": None}],
                }
            )
            await writer.drain()
        if (request.get("stream_options") or {}).get("include_usage"):
            send(
                {
                    "id": "cmpl-fake",
                    "object": "text_completion",
                    "model": request["model"],
                    "choices": [],
                    "usage": {
                        "prompt_tokens": len(request["prompt"]),
                        "completion_tokens": tokens,
                        "total_tokens": len(request["prompt"]) + tokens,
                    },
                }
            )
        send("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    finally:
        writer.close()


@contextmanager
def fake_vllm_server(behaviour: FakeBehaviour | None = None) -> Iterator[int]:
    """Serve on 127.0.0.1 in a background thread; yields the port."""
    behaviour = behaviour or FakeBehaviour()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, object] = {}

    async def start() -> None:
        server = await asyncio.start_server(
            lambda r, w: _handle(r, w, behaviour), "127.0.0.1", 0, backlog=1024
        )
        holder["server"] = server
        holder["port"] = server.sockets[0].getsockname()[1]
        ready.set()

    thread = threading.Thread(
        target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True
    )
    thread.start()
    ready.wait(10)
    try:
        yield int(holder["port"])  # type: ignore[call-overload]
    finally:
        loop.call_soon_threadsafe(holder["server"].close)  # type: ignore[attr-defined]
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        if not loop.is_running():
            loop.close()


def main() -> None:
    """`python -m bench.serving.fake_server --fake-port P [vLLM args]`: a stand-in server process that
    logs like vLLM (its own port option, since the vLLM arguments after it carry the stack's --port)."""
    import argparse
    import sys
    import time

    cli = argparse.ArgumentParser(description=main.__doc__)
    cli.add_argument("--fake-port", type=int, required=True)
    cli.add_argument("--startup-s", type=float, default=0.5)
    cli.add_argument("--exit-code", type=int, default=None, help="exit with this code instead of serving")
    options, _ = cli.parse_known_args()  # vLLM's flags are accepted and ignored
    print(
        "(EngineCore pid=1) INFO [gpu_model_runner.py:5348] Model loading took 14.99 GiB memory and 3.2 s"
        "econds",
        flush=True,
    )
    time.sleep(options.startup_s)
    if options.exit_code is not None:
        print("RuntimeError: fake failure", flush=True)
        sys.exit(options.exit_code)
    print("(EngineCore pid=1) INFO [gpu_worker.py:561] Available KV cache memory: 101.25 GiB", flush=True)
    print("(EngineCore pid=1) INFO [kv_cache_utils.py:2177] GPU KV cache size: 1,658,880 tokens", flush=True)
    print(
        "(EngineCore pid=1) INFO [kv_cache_utils.py:2179] Maximum concurrency for 16,384 tokens per request: "
        "101.25x",
        flush=True,
    )

    async def serve() -> None:
        behaviour = FakeBehaviour(first_token_delay_s=0.02, token_interval_s=0.001)
        server = await asyncio.start_server(
            lambda r, w: _handle(r, w, behaviour), "127.0.0.1", options.fake_port, backlog=1024
        )
        print("(APIServer pid=1) INFO: Application startup complete.", flush=True)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
