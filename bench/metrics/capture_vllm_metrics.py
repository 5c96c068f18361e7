"""Record a real vLLM 0.32.0 (CPU build) server's /metrics under load, for the alert and autoscaling tests.

    .venv/bin/python -m bench.metrics.capture_vllm_metrics [OUT_DIR]   # default tests/data/vllm-metrics

Starts one server with the dev stack's rendered `vllm serve` arguments (the e2e suite's CPU
changes: tiny random Llama, dummy weights, 512-token context) plus `--max-num-seqs 2`, so that a
handful of streams on two CPU cores is enough to build a queue. Then, sampling /metrics every
SAMPLE_SECONDS:

    idle        IDLE_SECONDS, no requests
    one-stream  ONE_STREAM_SECONDS, one completion after another (what a quiet model sees)
    queue       QUEUE_SECONDS, QUEUE_STREAMS concurrent clients: 2 run, the rest wait
    errors      a few requests for a model the server does not serve (404s)
    drain       IDLE_SECONDS, no requests

Writes:
    exposition.txt      the last full /metrics text (every family and label the server exports)
    load.om             the sampled series of the RECORDED families as OpenMetrics with timestamps,
                        exactly as the server exported them (no target labels), loadable with
                        `promtool tsdb create-blocks-from openmetrics`
    phases.json         when each phase started and ended (unix seconds), and the server arguments

Takes about 6 minutes on two cores (most of it the server's start). Re-run it when the vLLM pin
changes; tests/e2e/test_recorded_metrics.py fails when the live server no longer exports a family
or label the recording has.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.e2e.conftest import SERVED_MODEL_NAME, server_arguments
from tests.support.vllm_server import (
    REPO_ROOT,
    require_vllm_venv,
    start_vllm_server,
    stop_vllm_server,
    vllm_subprocess_env,
    wait_until_healthy,
)

SAMPLE_SECONDS = 1.0
IDLE_SECONDS = 20
ONE_STREAM_SECONDS = 60
QUEUE_SECONDS = 90
QUEUE_STREAMS = 8
MAX_NUM_SEQS = "2"
MAX_TOKENS = 400
API_KEY = "capture-only"
# The families the alert rules, autoscaling signals and dashboards read; load.om keeps only these.
RECORDED = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "http_requests_total",
)
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")


def _family(sample_name: str) -> str | None:
    for family in RECORDED:
        if sample_name == family or sample_name in (f"{family}_bucket", f"{family}_sum", f"{family}_count"):
            return family
    return None


class Recorder(threading.Thread):
    def __init__(self, metrics_url: str) -> None:
        super().__init__(daemon=True)
        self.metrics_url = metrics_url
        self.samples: dict[str, list[tuple[float, str]]] = {}
        self.last_text = ""
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stopping.is_set():
                started = time.time()
                text = client.get(self.metrics_url).text
                self.last_text = text
                for line in text.splitlines():
                    match = _SAMPLE.match(line)
                    if match and _family(match["name"]):
                        if match["name"].endswith("_created"):
                            continue
                        key = match["name"] + (match["labels"] or "")
                        self.samples.setdefault(key, []).append((started, match["value"]))
                self.stopping.wait(max(0.0, SAMPLE_SECONDS - (time.time() - started)))

    def openmetrics(self) -> str:
        lines: list[str] = []
        by_sample_name: dict[str, list[str]] = {}
        for key in self.samples:
            by_sample_name.setdefault(key.split("{", 1)[0], []).append(key)
        for name in sorted(by_sample_name):
            # `unknown`: OpenMetrics ties counter/histogram types to suffix rules per family, and
            # the TSDB keeps no type anyway; each sample name is its own family here.
            lines.append(f"# TYPE {name} unknown")
            for key in sorted(by_sample_name[name]):
                lines += [f"{key} {value} {timestamp:.3f}" for timestamp, value in self.samples[key]]
        return "\n".join([*lines, "# EOF", ""])


def _stream(base_url: str, stop_at: float, model: str = SERVED_MODEL_NAME) -> None:
    """Completions one after another until `stop_at`. Not streamed: on two shared cores a Python
    client parsing SSE events starves the server, and the queue is what is being recorded."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": model, "prompt": "def fibonacci(n):", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    with httpx.Client(timeout=300) as client:
        while time.time() < stop_at:
            client.post(f"{base_url}/v1/completions", headers=headers, json=body).raise_for_status()


def _streams(base_url: str, count: int, seconds: float) -> None:
    stop_at = time.time() + seconds
    threads = [threading.Thread(target=_stream, args=(base_url, stop_at)) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    python = require_vllm_venv()
    model_dir = Path(tempfile.mkdtemp(prefix="tiny-llama-"))
    subprocess.run(
        [str(python), "-m", "tests.support.tiny_model", str(model_dir)],
        cwd=REPO_ROOT,
        env=vllm_subprocess_env(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    args = [*server_arguments(model_dir), "--max-num-seqs", MAX_NUM_SEQS]
    server = start_vllm_server(
        args, env={"VLLM_API_KEY": API_KEY}, log_path=Path(tempfile.gettempdir()) / "capture-vllm.log"
    )
    phases: dict[str, list[float]] = {}
    try:
        wait_until_healthy(server, timeout_seconds=400)
        recorder = Recorder(f"{server.base_url}/metrics")
        recorder.start()

        def phase(name: str, action) -> None:
            start = time.time()
            action()
            phases[name] = [round(start, 3), round(time.time(), 3)]
            print(f"{name}: {phases[name][1] - start:.0f} s", flush=True)

        phase("idle", lambda: time.sleep(IDLE_SECONDS))
        phase("one-stream", lambda: _streams(server.base_url, 1, ONE_STREAM_SECONDS))
        phase("queue", lambda: _streams(server.base_url, QUEUE_STREAMS, QUEUE_SECONDS))

        def errors() -> None:
            for _ in range(5):
                httpx.post(
                    f"{server.base_url}/v1/completions",
                    headers={"Authorization": f"Bearer {API_KEY}"},
                    json={"model": "not-served", "prompt": "x", "max_tokens": 1},
                    timeout=30,
                )
                time.sleep(1)

        phase("errors", errors)
        phase("drain", lambda: time.sleep(IDLE_SECONDS))
        recorder.stopping.set()
        recorder.join()
    finally:
        stop_vllm_server(server)
    (out_dir / "exposition.txt").write_text(recorder.last_text)
    (out_dir / "load.om").write_text(recorder.openmetrics())
    (out_dir / "phases.json").write_text(
        json.dumps(
            {
                "served_model_name": SERVED_MODEL_NAME,
                "sample_seconds": SAMPLE_SECONDS,
                "phases": phases,
                "queue_streams": QUEUE_STREAMS,
                "server_arguments": [a if not a.startswith("/") else "<tiny-model>" for a in args],
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT / "tests" / "data" / "vllm-metrics")
