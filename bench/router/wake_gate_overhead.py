"""What the wake gate (router/wake_gate.py) adds to an awake to-zero model's requests: the same
requests through the pinned vllm-router front and model router, once with the front routing the model
to its router directly and once through the gate, as the router pod routes a to-zero model.

The backend is a small stdlib server standing in for vLLM's timing only (it answers at once and
streams N SSE chunks back to back), so what differs between the two paths is the gate's hop alone.
Loopback only; every process is stopped by its process group. Run from the repository root:

    VLLM_ROUTER_VENV=.venv-router PYTHONPATH=. .venv/bin/python bench/router/wake_gate_overhead.py

(`--requests N`, default 200). It prints, per path, the median and p95 of a short request's round
trip (sequential), and the chunks per second of CONCURRENT streams of CHUNKS chunks each.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.server
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from router.registrar import RouterClient, desired_workers, reconcile
from tests.support.vllm_router import start_router, start_wake_gate, stop_process_group, stop_router

MODEL = "bench-model"
KEY = "bench-model-key"
CONCURRENT, CHUNKS = 16, 256


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as vLLM's uvicorn does

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        chunks = int(request.get("max_tokens") or 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index in range(chunks):
            event = b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % index
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.write(b"6\r\ndata: \r\n0\r\n\r\n")

    def log_message(self, *args: object) -> None:
        pass


def chat(client: httpx.Client, chunks: int) -> float:
    started = time.perf_counter()
    with client.stream(
        "POST",
        "/v1/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": chunks,
            "stream": True,
        },
    ) as response:
        assert response.status_code == 200, response.read()
        for _ in response.iter_bytes():
            pass
    return time.perf_counter() - started


def measure(front_url: str, requests: int) -> dict[str, float]:
    with httpx.Client(base_url=front_url, timeout=60) as client:
        for _ in range(10):
            chat(client, 1)  # warm the connection pools
        short = sorted(chat(client, 1) for _ in range(requests))
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CONCURRENT) as pool:
        clients = [httpx.Client(base_url=front_url, timeout=120) for _ in range(CONCURRENT)]
        list(pool.map(lambda client: chat(client, CHUNKS), clients))
        for client in clients:
            client.close()
    elapsed = time.perf_counter() - started
    return {
        "short_median_ms": 1000 * statistics.median(short),
        "short_p95_ms": 1000 * short[int(0.95 * len(short)) - 1],
        "stream_chunks_per_second": CONCURRENT * CHUNKS / elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="wake-gate-overhead-"))
    backend = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
    backend.daemon_threads = True
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    backend_url = f"http://127.0.0.1:{backend.server_port}"
    (logs / "keys").mkdir()
    (logs / "keys" / f"{MODEL}.api-key").write_text(KEY)
    gate_config = {
        "max_body_bytes": 1 << 20,
        "upstream_timeout_seconds": 60,
        "keys_dir": "",
        "inference_routes": ["/v1/chat/completions"],
        "models": [
            {
                "model": MODEL,
                "port": 0,
                "model_router_url": "",
                "served_names": [MODEL],
                "retry_after_seconds": 60,
                "callers": [{"name": "model key", "files": [f"{MODEL}.api-key"], "models": [MODEL]}],
            }
        ],
    }
    common = ["--policy", "round_robin", "--health-check-endpoint", "/health", "--log-level", "warning"]
    model_router = start_router([*common, "--worker-urls", backend_url], log_path=logs / "model.log")
    front = start_router(["--enable-igw", *common], log_path=logs / "front.log")
    gate = start_wake_gate(
        gate_config,
        MODEL,
        model_router_url=model_router.base_url,
        keys_dir=logs / "keys",
        log_path=logs / "gate.log",
    )
    try:
        results = {}
        for path, front_url in (("direct", ""), ("through the gate", gate.base_url)):
            worker = {
                "url": model_router.base_url,
                "model_id": MODEL,
                "policy": "round_robin",
                "front_url": front_url,
            }
            reconcile(RouterClient(front.base_url), desired_workers({"workers": [worker]}))
            results[path] = measure(front.base_url, args.requests)
            print(path, {k: round(v, 2) for k, v in results[path].items()}, flush=True)
    finally:
        stop_router(front)
        stop_process_group(gate.process)
        stop_router(model_router)
        backend.shutdown()


if __name__ == "__main__":
    main()
