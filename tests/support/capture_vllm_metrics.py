"""Capture the `/metrics` exposition of the real vLLM 0.32.0 CPU server for the canary analysis tests.

    .venv/bin/python -m tests.support.capture_vllm_metrics [OUT]
    # OUT defaults to tests/data/vllm_0.32.0_metrics.txt

Starts the pinned vLLM (CPU build, tiny random Llama) with the dev stack's rendered arguments, as
tests/e2e does, sends a few completions (plain and streamed) so every histogram has observations,
and writes the exposition as the server returned it. tests/promtool build their input series from
the names and labels in that file, and tests/e2e/test_canary_metrics.py re-checks it against a
live server, so the fixture cannot drift from the pin.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.support.vllm_server import REPO_ROOT, running_vllm_server

DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "vllm_0.32.0_metrics.txt"
API_KEY = "capture-metrics"


def exercise(base_url: str, served_model_name: str) -> None:
    """The requests before the capture: enough for every histogram the analysis reads."""
    import httpx

    headers = {"Authorization": f"Bearer {API_KEY}"}
    for index in range(4):
        response = httpx.post(
            f"{base_url}/v1/completions",
            headers=headers,
            json={
                "model": served_model_name,
                "prompt": f"def main_{index}():",
                "max_tokens": 8,
                "stream": index % 2 == 1,
            },
            timeout=60,
        )
        assert response.status_code == 200, response.text


def main(argv: list[str]) -> int:
    import subprocess

    import httpx

    from tests.e2e.conftest import SERVED_MODEL_NAME, server_arguments
    from tests.support.vllm_server import require_vllm_venv, vllm_subprocess_env

    out = Path(argv[0]) if argv else DEFAULT_OUT
    with tempfile.TemporaryDirectory() as work:
        model_dir = Path(work) / "tiny-llama"
        subprocess.run(
            [str(require_vllm_venv()), "-m", "tests.support.tiny_model", str(model_dir)],
            cwd=REPO_ROOT,
            env=vllm_subprocess_env(),
            check=True,
            capture_output=True,
        )
        with running_vllm_server(
            server_arguments(model_dir), log_path=Path(work) / "vllm.log", env={"VLLM_API_KEY": API_KEY}
        ) as server:
            exercise(server.base_url, SERVED_MODEL_NAME)
            text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    out.write_text(text)
    print(f"wrote {out} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
