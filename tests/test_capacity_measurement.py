"""bench/capacity: the vLLM log parser, the measurement loop (against a fake server) and mkshape."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from domain.catalogue.model_shapes import model_shape_presets
from tests.conftest import REPO_ROOT
from tests.test_capacity_observations import ObservationFile

BENCH = REPO_ROOT / "bench" / "capacity"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_capacity_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


vllm_log = _module("vllm_log")
measure_kv_cache = _module("measure_kv_cache")
mkshape = _module("mkshape")

# Lines as vLLM 0.26.0 prints them (logger format "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]
# %(message)s" behind the process prefix), with the messages of the log calls the parser reads, a
# harmless import traceback in between.
SAMPLE_LOG = (REPO_ROOT / "tests" / "data" / "vllm_0.26.0_startup.log").read_text()


def test_the_parser_reads_every_number_vllm_logs_about_its_kv_cache() -> None:
    record = vllm_log.parse_vllm_log(SAMPLE_LOG)
    assert record["weights_gib"] == 14.99
    assert record["available_kv_cache_gib"] == 108.48
    assert record["kv_cache_tokens"] == 1_777_200
    assert (record["max_concurrency_tokens"], record["max_concurrency"]) == (8192, 216.94)
    assert vllm_log.kv_cache_reported(record)


def test_the_parser_reads_the_debug_breakdown_of_the_profile_run() -> None:
    record = vllm_log.parse_vllm_log(SAMPLE_LOG)
    assert record["cuda_total_gib"] == 139.81 and record["init_free_gib"] == 139.21
    assert record["requested_gib"] == 125.83
    assert record["profile_gib"] == {
        "non_kv_cache": 16.92,
        "torch_peak_increase": 1.21,
        "non_torch_increase": 0.28,
        "weights": 14.99,
    }
    assert record["cudagraph_estimate_mib"]["PIECEWISE"] == {
        "first_capture": 98.0,
        "graphs": 51,
        "per_graph": 6.0,
    }
    assert record["cudagraph_estimate_mib"]["FULL"]["graphs"] == 35
    assert record["cudagraph_utilization"] == {"configured": 0.9, "equivalent_without_graphs": 0.895}
    assert record["cudagraph_profile"] == "PIECEWISE=51 (largest=512), FULL=35 (largest=256)"


def test_the_parser_ignores_colours_and_lines_without_numbers() -> None:
    coloured = (
        "\x1b[36m(EngineCore_DP0 pid=7)\x1b[0m INFO 11-29 15:41:12 \x1b[90m[kv_cache_utils.py:2177]\x1b[0m "
        "GPU KV cache size: 905,862 tokens"
    )
    record = vllm_log.parse_vllm_log([coloured, "Traceback (most recent call last):", "ImportError: x"])
    assert record == {"kv_cache_tokens": 905_862}
    assert not vllm_log.kv_cache_reported(record)


def test_the_run_command_serves_dummy_weights_with_the_planned_settings() -> None:
    run = {
        "name": "r",
        "preset": "llama-3.1-8b",
        "model_dir": "/tmp/m/llama8b",
        "gpu_memory_utilization": 0.6,
        "max_model_len": 8192,
        "max_num_seqs": 256,
        "kv_cache_dtype": "fp8",
        "extra_args": ["--seed", "1"],
    }
    command = measure_kv_cache.build_command("python3", run, 8011)
    assert command[:5] == ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/tmp/m/llama8b"]
    joined = " ".join(command)
    for expected in (
        "--load-format dummy",
        "--gpu-memory-utilization 0.6",
        "--max-model-len 8192",
        "--max-num-seqs 256",
        "--kv-cache-dtype fp8",
    ):
        assert expected in joined
    assert "--max-num-batched-tokens" not in joined and command[-2:] == ["--seed", "1"]


FAKE_SERVER = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(os.environ["FAKE_CHILD_PID_FILE"], "w").write(str(child.pid))
for line in open(os.environ["FAKE_LOG"]):
    print(line, end="", flush=True)
    time.sleep(0.01)
if os.environ.get("FAKE_EXIT"):
    sys.exit(int(os.environ["FAKE_EXIT"]))
time.sleep(600)
"""


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "site" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for folder in (package, package.parent, package.parent.parent):
        (folder / "__init__.py").write_text("")
    (package / "api_server.py").write_text(FAKE_SERVER)
    (tmp_path / "log.txt").write_text(SAMPLE_LOG)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log.txt"))
    monkeypatch.setenv("FAKE_CHILD_PID_FILE", str(tmp_path / "child.pid"))
    return tmp_path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a reaped-but-not-waited zombie still answers signal 0; it no longer runs
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"


RUN = {
    "name": "fake",
    "preset": "llama-3.1-8b",
    "model_dir": "/unused",
    "gpu_memory_utilization": 0.9,
    "max_model_len": 8192,
    "max_num_seqs": 256,
}


def test_a_run_waits_past_tracebacks_for_the_kv_cache_lines_then_stops_the_whole_session(
    fake_vllm: Path,
) -> None:
    observation = measure_kv_cache.measure(RUN, sys.executable, 8011, 60, fake_vllm, debug=True)
    assert observation["outcome"] == "ok"
    assert observation["kv_cache_tokens"] == 1_777_200 and observation["weights_gib"] == 14.99
    assert observation["settings"]["gpu_memory_utilization"] == 0.9
    assert "Traceback" in (fake_vllm / "fake.log").read_text()
    child = int((fake_vllm / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), "the server's child process outlived the run"


def test_a_server_that_exits_early_is_recorded_with_its_last_lines(
    fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_vllm / "log.txt").write_text("\n".join(SAMPLE_LOG.splitlines()[:4]) + "\nValueError: no memory\n")
    monkeypatch.setenv("FAKE_EXIT", "1")
    observation = measure_kv_cache.measure(RUN, sys.executable, 8011, 60, fake_vllm, debug=False)
    assert observation["outcome"] == "vLLM exited with code 1 before sizing its KV cache"
    assert observation["log_tail"][-1] == "ValueError: no memory"
    assert "kv_cache_tokens" not in observation


def test_mkshape_writes_a_presets_config_json_with_the_tokenizer_of_another_model(tmp_path: Path) -> None:
    source = tmp_path / "llama8b"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    (source / "tokenizer.json").write_text("{}")
    (source / "tokenizer_config.json").write_text("{}")
    out = mkshape.write_model_dir("qwen2.5-7b", tmp_path / "qwen7b", source)
    config = json.loads((out / "config.json").read_text())
    expected = dict(model_shape_presets()["qwen2.5-7b"].config_json)
    assert {key: config[key] for key in expected} == expected
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["torch_dtype"] == "bfloat16"
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert sorted(path.name for path in out.iterdir()) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *memory.used*) echo 3 ;;
  *memory.reserved*) echo "NVIDIA H200, 143771, 606, 570.86.15" ;;
esac
"""


def test_the_script_accumulates_runs_in_one_observations_file(
    fake_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tools = fake_vllm / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    model_dir = fake_vllm / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    plan = fake_vllm / "plan.json"
    plan.write_text(
        json.dumps({"runs": [{**RUN, "name": name, "model_dir": str(model_dir)} for name in ("a", "b")]})
    )
    out = fake_vllm / "observations.json"
    common = [str(plan), "--out", str(out), "--log-dir", str(fake_vllm / "logs"), "--timeout-seconds", "60"]
    assert measure_kv_cache.main([*common, "--only", "a"]) == 0
    assert measure_kv_cache.main([*common, "--only", "b"]) == 0
    document = json.loads(out.read_text())
    assert [o["name"] for o in document["observations"]] == ["a", "b"]
    assert all(o["kv_cache_tokens"] == 1_777_200 for o in document["observations"])
    assert document["gpu"]["nvidia_smi_memory_total_mib"] == 143771
    assert document["gpu"]["nvidia_smi_memory_reserved_mib"] == 606
    # what the script writes is what tests/data/kv_cache_observations.json must hold
    assert len(ObservationFile.model_validate(document).observations) == 2
