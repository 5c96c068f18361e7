"""bench/serving/analyze.py on synthetic phase outputs: verdicts computed from whatever was measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.serving import analyze


def _vllm_level(
    concurrency: int, output_tok_s: float, ttft_mean: float, ttft_p99: float, tpot: float
) -> dict:
    return {
        "completed": concurrency * 4,
        "failed": 0,
        "output_throughput_tok_s": output_tok_s,
        "total_throughput_tok_s": output_tok_s * 3,
        "ttft_ms": {"mean": ttft_mean, "p99": ttft_p99},
        "tpot_ms": {"mean": tpot, "p99": tpot * 1.5},
        "gpu": {"peak_memory_used_mib": 129_000},
    }


def _phase(name: str, levels: dict[int, tuple[float, float, float, float]], **extra: Any) -> dict:
    return {
        "phase": name,
        "status": "completed",
        "started_at": "2026-11-29T16:00:00+0000",
        "host": {"gpu": "NVIDIA H200", "gpu_memory_total_mib": 143771, "driver": "580.1", "python": "3.12.3"},
        "software": {"torch": "2.11.0", "transformers": "5.17.0", "vllm": "0.26.0"},
        "plan": {
            "stack": "prod",
            "model": "llama-3-1-8b",
            "stack_vllm_version": "0.32.0",
            "tuning_profile": {"name": "h200-throughput", "settings": {"kv_cache_dtype": "fp8"}},
        },
        "levels": {str(c): _vllm_level(c, *values) for c, values in levels.items()},
        **extra,
    }


def _baseline(levels: dict[int, tuple[float, float, float] | None]) -> dict:
    data: dict[str, Any] = {
        "levels": {},
        "largest_batch_served": None,
        "oom_at_batch": None,
        "environment": {"torch": "2.11.0", "transformers": "5.17.0", "attn_implementation": "sdpa"},
    }
    for batch, values in levels.items():
        if values is None:
            data["levels"][str(batch)] = {"batch": batch, "oom": True}
            data["oom_at_batch"] = batch
            continue
        tok_s, ttft, tpot = values
        data["levels"][str(batch)] = {
            "batch": batch,
            "output_throughput_tok_s": tok_s,
            "total_throughput_tok_s": tok_s * 3,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "peak_memory_allocated_mib": 20_000 + batch * 100,
        }
        data["largest_batch_served"] = batch
    return {
        "phase": "baseline",
        "status": "completed",
        "started_at": "2026-11-29T16:20:00+0000",
        "host": {"gpu": "NVIDIA H200"},
        "software": {},
        "transformers": data,
    }


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    stack = _phase(
        "stack",
        {1: (150, 20, 25, 6.0), 64: (6000, 90, 200, 10.0), 256: (14000, 300, 900, 17.0)},
        cold_start_s=175.0,
        warm_start_s=52.0,
        serve_args=["/tmp/m/llama8b", "--kv-cache-dtype", "fp8"],
        changes_from_render=[
            {"what": "model", "action": "replaced", "from": "/mnt/x", "to": "/tmp/m", "why": "lab"}
        ],
        kv_cache={
            "available_kv_cache_gib": 106.8,
            "kv_cache_tokens": 1_750_288,
            "max_concurrency": 106.8,
            "max_concurrency_context_tokens": 16384,
        },
    )
    defaults = _phase(
        "defaults",
        {64: (5800, 95, 210, 10.5), 256: (12000, 320, 1000, 20.0)},
        start_s=150.0,
        serve_args=["/tmp/m/llama8b"],
        kv_probes={
            "stack-util-0.60": {
                "kv_cache_tokens": 900_000,
                "available_kv_cache_gib": 55.0,
                "max_concurrency": 54.9,
            }
        },
    )
    baseline = _baseline({1: (30, 60, 30.0), 8: (220, 400, 34.0), 64: (500, 3000, 90.0), 256: None})
    for name, data in (("stack", stack), ("defaults", defaults), ("baseline", baseline)):
        (raw / f"{name}.json").write_text(json.dumps(data))
    return raw


def test_vllm_over_transformers_ratio_at_64_against_the_10x_target(raw: Path) -> None:
    comparison = analyze.analyze(raw)["comparisons"]["vllm_vs_transformers"]
    assert comparison["ratio"] == pytest.approx(6000 / 500)
    assert comparison["met"] is True
    assert comparison["best_transformers_batch"] == 64


def test_tuned_vs_default_gain_and_p99_ttft_at_256(raw: Path) -> None:
    comparison = analyze.analyze(raw)["comparisons"]["tuned_vs_default"]
    assert comparison["throughput_gain_pct"] == pytest.approx((14000 / 12000 - 1) * 100)
    assert comparison["ttft_p99_no_worse"] is True
    assert comparison["met"] is True


def test_tuned_gain_with_a_worse_p99_ttft_misses(raw: Path) -> None:
    defaults = json.loads((raw / "defaults.json").read_text())
    defaults["levels"]["256"]["ttft_ms"]["p99"] = 850.0
    (raw / "defaults.json").write_text(json.dumps(defaults))
    comparison = analyze.analyze(raw)["comparisons"]["tuned_vs_default"]
    assert comparison["throughput_gain_pct"] > 15
    assert comparison["ttft_p99_no_worse"] is False
    assert comparison["met"] is False


def test_transformers_oom_bounds_its_largest_concurrency(raw: Path) -> None:
    results = analyze.analyze(raw)
    assert results["series"]["transformers"]["largest_concurrency_served"] == 64
    assert results["series"]["transformers"]["oom_at"] == 256
    assert results["series"]["vllm_tuned"]["largest_concurrency_served"] == 256


def test_start_times_against_the_60_second_target(raw: Path) -> None:
    starts = analyze.analyze(raw)["comparisons"]["start_times"]
    assert starts["warm_start_s"] == 52.0 and starts["warm_met"] is True
    assert starts["cold_start_s"] == 175.0 and starts["cold_met"] is False


def test_source_document_claims_are_set_beside_the_measurements(raw: Path) -> None:
    claims = analyze.analyze(raw)["comparisons"]["source_claims"]
    by_metric = {(claim["system"], claim["metric"]): claim for claim in claims}
    assert by_metric[("transformers", "output tokens/s at 8")] == {
        "system": "transformers",
        "metric": "output tokens/s at 8",
        "claimed": 142.0,
        "measured": 220,
    }
    assert by_metric[("vllm", "mean TTFT at 64 (ms)")]["measured"] == 90
    assert by_metric[("vllm", "largest concurrency served")]["claimed"] == 64


def test_markdown_and_plot_are_written(raw: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "results"
    monkeypatch.setattr("sys.argv", ["analyze", "--raw", str(raw), "--results", str(out)])
    analyze.main()
    markdown = (out / "RESULTS.md").read_text()
    assert "NVIDIA H200" in markdown and "0.26.0" in markdown and "0.32.0" in markdown
    assert "| ≥ 10× | 12.0× | **met** |" in markdown
    assert "out of memory" in markdown
    assert "vllm serve /tmp/m/llama8b --kv-cache-dtype fp8" in markdown
    assert (out / "throughput_ttft.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "results.json").read_text())["environment"]["stack_vllm"] == "0.32.0"


def test_missing_phases_are_reported_as_not_measured(raw: Path) -> None:
    (raw / "defaults.json").unlink()
    (raw / "baseline.json").unlink()
    results = analyze.analyze(raw)
    assert results["comparisons"]["tuned_vs_default"]["met"] is None
    assert results["comparisons"]["vllm_vs_transformers"]["ratio"] is None
    markdown = analyze.render_markdown(results, None)
    assert "not measured" in markdown
    assert results["phase_status"] == {"stack": "completed", "defaults": "not run", "baseline": "not run"}


def test_no_phase_output_at_all_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"stack\.json"):
        analyze.analyze(tmp_path)
