"""bench/startup: the committed start-up report and summary are what the committed stamped server logs
say, and every server's phases add up to its time to /health (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.startup import mkckpt, phases, report

STARTUP = Path(__file__).resolve().parents[1] / "bench" / "startup"
RAW = STARTUP / "raw" / "2026-12-01-b"


def test_committed_summary_and_results_are_what_the_raw_logs_make() -> None:
    summary = report.build(RAW)
    assert json.loads((STARTUP / "summary.json").read_text()) == json.loads(json.dumps(summary)), (
        "bench/startup/summary.json is stale: run `.venv/bin/python -m bench.startup.report`"
    )
    assert (STARTUP / "RESULTS.md").read_text() == report.render(summary)


@pytest.mark.parametrize("log", sorted(path.name for path in RAW.glob("*-server.log.gz")))
def test_every_servers_phases_are_found_and_add_up_to_its_time_to_health(log: str) -> None:
    parsed = phases.parse_file(RAW / log)
    assert all(value is not None and value >= 0 for value in parsed["phases"].values()), parsed["phases"]
    total = parsed["before_engine_s"] + parsed["engine_init_s"] + parsed["phases"]["api_ready"]
    assert total == pytest.approx(parsed["start_to_health_s"], abs=0.1)
    assert parsed["compile_s"] is not None and parsed["compile_cache_dir"]


def test_the_table_has_every_case_the_issue_asks_for() -> None:
    cases = json.loads((STARTUP / "summary.json").read_text())["cases"]
    assert {"cold", "same-host", "copied", "concurrent-first", "after-concurrent"} <= set(cases)
    loads = json.loads((STARTUP / "summary.json").read_text())["weight_load"]
    assert loads["default"]["samples"] and loads["fastsafetensors"]["samples"]


def test_phase_boundaries_follow_vllms_lines_in_order() -> None:
    engine = "(EngineCore pid=1) INFO 12-01 10:00:00"
    lines = [
        (0.0, "LAB-START python -m vllm.entrypoints.cli.main serve m"),
        (10.0, "INFO 12-01 10:00:00 [api_utils.py:273] non-default args: {}"),
        (11.0, "INFO 12-01 10:00:01 [model.py:623] Resolved architecture: LlamaForCausalLM"),
        (12.0, "(ApiServer_0 pid=2) INFO 12-01 10:00:02 [model.py:623] Resolved architecture: X"),
        (20.0, f"{engine} [core.py:116] Initializing a V1 LLM engine (v0.26.0) with config"),
        (21.0, f"{engine} [model_runner.py:284] Loading model from scratch..."),
        (22.0, f"{engine} [default_loader.py:430] Loading weights took 0.50 seconds"),
        (23.0, f"{engine} [model_runner.py:305] Model loading took 15.0 GiB and 2.0 seconds"),
        (30.0, f"{engine} [monitor.py:53] torch.compile took 7.00 s in total"),
        (31.0, f"{engine} [kv_cache_utils.py:2177] GPU KV cache size: 1,000 tokens"),
        (35.0, f"{engine} [model_runner.py:747] Graph capturing finished in 4 secs"),
        (40.0, f"{engine} [core.py:340] init engine (profile, create kv cache, warmup model) took 20.00 s"),
        (41.5, "LAB-HEALTHY 41.5"),
    ]
    parsed = phases.parse("\n".join(f"{1796159000 + at:.3f} {line}" for at, line in lines))
    assert parsed["phases"] == {
        "imports": 10.0, "model_config": 1.0, "processes": 9.0, "engine_setup": 1.0, "weights": 2.0,
        "torch_compile": 7.0, "kv_cache": 1.0, "cuda_graphs": 4.0, "jit_warmup": 5.0, "api_ready": 1.5,
    }  # fmt: skip
    assert parsed["before_engine_s"] == 20.0 and parsed["start_to_health_s"] == 41.5
    assert (
        parsed["weights_read_s"] == 0.5 and parsed["compile_s"] == 7.0 and not parsed["compile_cache_loaded"]
    )


def test_the_random_checkpoint_has_llama_3_1_8b_names_and_size() -> None:
    config = {
        "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "num_hidden_layers": 32,
    }  # fmt: skip
    entries = dict(mkckpt.shapes(config))
    assert sum(2 * mkckpt._numel(shape) for shape in entries.values()) == 16_060_522_496
    assert entries["model.layers.31.self_attn.k_proj.weight"] == (1024, 4096)
    assert entries["lm_head.weight"] == (128256, 4096) and len(entries) == 2 + 32 * 9 + 1
