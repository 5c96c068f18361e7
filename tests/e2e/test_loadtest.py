"""`vllm-platform loadtest` against the real vLLM 0.32.0 CPU server: Locust streams authenticated
chat completions at each level; the report counts every request, its tokens and errors, and names the
largest level meeting the SLO. Behaviour only: no timing is asserted beyond its ordering."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import API_KEY, SERVED_MODEL_NAME
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTPUT_TOKENS = 6
REQUESTS_PER_USER = 2


def loadtest(
    server: RunningVllmServer, out: Path, *extra: str, key: str | None = API_KEY, slo_ttft_ms: str = "600000"
):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
    if key is not None:
        env["LOADTEST_KEY"] = key
    command = [
        sys.executable, "-m", "infra.cli", "loadtest", "--url", server.base_url, "--model", SERVED_MODEL_NAME,
        "--api-key-env", "LOADTEST_KEY", "--concurrency", "1,2", "--slo-ttft-ms", slo_ttft_ms,
        "--slo-tpot-ms", "600000", "--requests-per-user", str(REQUESTS_PER_USER), "--prompt-words", "12",
        "--output-tokens", str(OUTPUT_TOKENS), "--out", str(out), *extra,
    ]  # fmt: skip
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def generous(vllm_server: RunningVllmServer, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("loadtest")
    return loadtest(vllm_server, out), out


def test_every_level_streams_all_its_requests_with_the_api_key(generous) -> None:
    finished, out = generous
    assert finished.returncode == 0, finished.stderr
    report = json.loads((out / "loadtest.json").read_text())
    assert report["engine"].startswith("locust ")
    assert [level["concurrency"] for level in report["levels"]] == [1, 2]
    for level in report["levels"]:
        expected = level["concurrency"] * REQUESTS_PER_USER
        assert (level["requests"], level["errors"]) == (expected, 0), level["error_messages"]
        assert level["output_tokens"] == expected * OUTPUT_TOKENS  # ignore_eos: every token streamed
        assert level["output_tokens_per_s"] > 0
        ttft, tpot = level["ttft_ms"], level["tpot_ms"]
        assert 0 < ttft["p50"] <= ttft["p95"] <= ttft["p99"], ttft
        # The tiny random model's first tokens often decode to no text, so its TPOT can be ~0.
        assert 0 <= tpot["p50"] <= tpot["p95"] <= tpot["p99"], tpot


def test_largest_level_within_the_slo_is_the_max_safe_concurrency(generous) -> None:
    finished, out = generous
    report = json.loads((out / "loadtest.json").read_text())
    assert report["max_safe_concurrency"] == 2
    assert "max safe concurrency: 2" in finished.stdout
    header = next(line for line in finished.stdout.splitlines() if "out tok/s" in line)
    assert "TTFT p50" in header and "TPOT p50" in header


def test_report_plot_is_a_png(generous) -> None:
    _, out = generous
    assert (out / "loadtest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_slo_no_level_meets_names_none(vllm_server: RunningVllmServer, tmp_path: Path) -> None:
    finished = loadtest(vllm_server, tmp_path, "--concurrency", "1", slo_ttft_ms="0.001")
    assert finished.returncode == 0, finished.stderr
    report = json.loads((tmp_path / "loadtest.json").read_text())
    assert report["max_safe_concurrency"] is None
    assert report["levels"][0]["errors"] == 0 and not report["levels"][0]["meets_slo"]
    assert "none of the levels met the SLO" in finished.stdout


def test_a_wrong_api_key_is_reported_as_errors_and_fails(
    vllm_server: RunningVllmServer, tmp_path: Path
) -> None:
    finished = loadtest(vllm_server, tmp_path, "--concurrency", "1", key="not-the-key")
    assert finished.returncode == 1
    report = json.loads((tmp_path / "loadtest.json").read_text())
    level = report["levels"][0]
    assert level["errors"] == level["requests"] == REQUESTS_PER_USER
    assert any(message.startswith("HTTP 401") for message in level["error_messages"])
    assert "no request succeeded" in finished.stderr
