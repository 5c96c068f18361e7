"""`vllm-platform loadtest` against the real vLLM 0.32.0 CPU server: Locust streams authenticated
chat completions at each level; the report counts every request, its tokens and errors, and names the
largest level meeting the SLO. Consecutive levels send prompts the server's prefix cache has not
seen, by vLLM's own counters, unless the shared-prefix workload asks for reuse (issue 27).
Behaviour only: no timing is asserted beyond its ordering."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
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


def test_a_run_without_a_seed_draws_one_prints_it_and_records_it(generous) -> None:
    finished, out = generous
    report = json.loads((out / "loadtest.json").read_text())
    assert isinstance(report["seed"], int)
    assert f"--seed {report['seed']} repeats them" in finished.stdout
    assert report["workload"]["kind"] == "fresh"


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


# --- prefix caching, by vLLM's own counters (vllm:prefix_cache_*_total count prompt tokens) ---

FRESH_PROMPT_WORDS = "80"  # ~220 tokens of the tiny model: more than one KV block (128 on CPU)
SHARED_PREFIX_WORDS = "60"  # ~165 tokens: one whole block the shared-prefix prompts have in common
REQUESTS_PER_RUN = (1 + 2) * REQUESTS_PER_USER  # levels 1 and 2


@dataclass(frozen=True)
class PrefixCache:
    queries: float
    hits: float

    def __sub__(self, before: PrefixCache) -> PrefixCache:
        return PrefixCache(self.queries - before.queries, self.hits - before.hits)


def _counter(text: str, name: str) -> float:
    values = [float(m[1]) for m in re.finditer(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M)]
    assert values, f"the server's /metrics has no {name}"
    return sum(values)  # one series per engine


def prefix_cache(server: RunningVllmServer) -> PrefixCache:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return PrefixCache(
        _counter(text, "vllm:prefix_cache_queries_total"), _counter(text, "vllm:prefix_cache_hits_total")
    )


def block_size(server: RunningVllmServer) -> int:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return int(re.search(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', text, re.M)[1])


def loadtest_counted(server: RunningVllmServer, out: Path, *extra: str) -> tuple[PrefixCache, dict]:
    before = prefix_cache(server)
    finished = loadtest(server, out, *extra)
    assert finished.returncode == 0, finished.stderr
    report = json.loads((out / "loadtest.json").read_text())
    assert [level["errors"] for level in report["levels"]] == [0, 0], report["levels"]
    return prefix_cache(server) - before, report


@pytest.fixture(scope="module")
def prefix_cache_runs(vllm_server: RunningVllmServer, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three runs of levels 1 and 2 in turn: fresh prompts with a new seed, the same seed again, and the
    shared-prefix workload; each with the server's prefix-cache counters before and after."""
    seed = str(secrets.randbelow(2**32))
    fresh = ("--prompt-words", FRESH_PROMPT_WORDS, "--seed", seed)
    shared = (
        "--workload",
        "shared-prefix",
        "--shared-prefix-words",
        SHARED_PREFIX_WORDS,
        "--prompt-words",
        "8",
    )
    runs = {}
    for name, extra in (("fresh", fresh), ("same seed", fresh), ("shared prefix", shared)):
        runs[name] = loadtest_counted(vllm_server, tmp_path_factory.mktemp("prefix-cache"), *extra)
    runs["block size"] = block_size(vllm_server)
    runs["seed"] = int(seed)
    return runs


def test_consecutive_fresh_levels_get_no_prefix_cache_hits(prefix_cache_runs: dict) -> None:
    counted, report = prefix_cache_runs["fresh"]
    assert report["seed"] == prefix_cache_runs["seed"] and report["workload"]["kind"] == "fresh"
    # Every prompt was long enough to fill a KV block, so a repeated one would have hit (next test).
    assert counted.queries >= REQUESTS_PER_RUN * prefix_cache_runs["block size"], counted
    assert counted.hits == 0, counted


def test_the_same_seed_sends_the_same_prompts_again_and_they_hit_the_cache(prefix_cache_runs: dict) -> None:
    first, _ = prefix_cache_runs["fresh"]
    again, report = prefix_cache_runs["same seed"]
    assert report["seed"] == prefix_cache_runs["seed"]
    assert again.queries == first.queries  # the same prompt tokens
    assert again.hits >= REQUESTS_PER_RUN * prefix_cache_runs["block size"], again


def test_the_shared_prefix_workload_hits_the_cache_in_every_request_after_the_first(
    prefix_cache_runs: dict,
) -> None:
    counted, report = prefix_cache_runs["shared prefix"]
    assert report["workload"]["kind"] == "shared-prefix"
    assert report["workload"]["prefix_words"] == int(SHARED_PREFIX_WORDS)
    assert "prefix-cache reuse" in report["workload"]["measures"]
    assert counted.hits >= (REQUESTS_PER_RUN - 1) * prefix_cache_runs["block size"], counted
