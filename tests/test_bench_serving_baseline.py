"""The Transformers baseline's time budget: each batch is estimated from a probe at that batch.

A stand-in runner plays `generate` on a simulated clock, with an 8B model's cost shape on an H200:
a decode step costs nearly the same at batch 1 and 64 (the weights dominate), the prefill grows
with the batch, and a batch past the GPU's memory raises OutOfMemory.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench.serving import hf_baseline
from bench.serving.hf_baseline import OutOfMemory, StepTimes, estimate_run_s, run_batches

INPUT_LEN = 512
OUTPUT_LEN = 256


class SimulatedRunner:
    def __init__(
        self,
        *,
        step_s: float = 0.025,
        step_growth_per_batch_s: float = 0.0001,
        prefill_per_sequence_s: float = 0.004,
        oom_from_batch: int | None = None,
        oom_only_in_full_run: bool = False,
    ) -> None:
        self.now = 0.0
        self.step_s = step_s
        self.step_growth_per_batch_s = step_growth_per_batch_s
        self.prefill_per_sequence_s = prefill_per_sequence_s
        self.oom_from_batch = oom_from_batch
        self.oom_only_in_full_run = oom_only_in_full_run
        self.calls: list[tuple[int, int]] = []

    def generate(self, batch: int, new_tokens: int) -> StepTimes:
        self.calls.append((batch, new_tokens))
        past_memory = self.oom_from_batch is not None and batch >= self.oom_from_batch
        if past_memory and (new_tokens == OUTPUT_LEN or not self.oom_only_in_full_run):
            raise OutOfMemory(f"CUDA out of memory at batch {batch}")
        start = self.now
        self.now += 0.001
        stamps = [self.now]  # the prompt handed to the streamer
        self.now += self.prefill_per_sequence_s * batch
        stamps.append(self.now)  # first token
        for _ in range(new_tokens - 1):
            self.now += self.step_s + self.step_growth_per_batch_s * batch
            stamps.append(self.now)
        stamps.append(self.now)  # end()
        return StepTimes(start, stamps)

    def level_extras(self) -> dict[str, Any]:
        return {"peak_memory_allocated_mib": 16_000}

    def launch_us(self) -> float | None:
        return 9.5


def _result() -> dict[str, Any]:
    return {
        "workload": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN},
        "levels": {},
        "largest_batch_served": None,
        "oom_at_batch": None,
        "skipped_for_time": [],
    }


def _run(runner: SimulatedRunner, budget_s: float, batch_sizes: list[int] | None = None) -> dict[str, Any]:
    result = _result()
    saves: list[int] = []
    run_batches(
        runner,
        result,
        batch_sizes=batch_sizes or [1, 8, 16, 64, 256],
        output_len=OUTPUT_LEN,
        budget_s=budget_s,
        elapsed_s=lambda: runner.now,
        save=lambda: saves.append(1),
    )
    assert saves, "the result is saved as the run goes"
    return result


def test_estimate_is_the_probes_prefill_plus_its_median_step_for_every_output_token() -> None:
    probe = StepTimes(0.0, [0.0, 0.2, 0.225, 0.25, 0.40, 0.425, 0.45])  # one slow step of 150 ms
    estimate = estimate_run_s(probe, OUTPUT_LEN, margin=1.0)
    assert estimate == pytest.approx(0.2 + 255 * 0.025)


def test_probe_without_decode_steps_cannot_estimate() -> None:
    with pytest.raises(ValueError, match="at least two new tokens"):
        estimate_run_s(StepTimes(0.0, [0.0, 0.2, 0.2]), OUTPUT_LEN)


def test_larger_batches_are_not_skipped_when_a_step_costs_the_same() -> None:
    # Batch 1 takes ~7 s here; scaling it linearly would "need" ~1,800 s at batch 256.
    runner = SimulatedRunner()
    result = _run(runner, budget_s=120)
    assert set(result["levels"]) == {"1", "8", "16", "64", "256"}
    assert result["skipped_for_time"] == []
    assert result["largest_batch_served"] == 256
    level_64 = result["levels"]["64"]
    assert level_64["duration_s"] <= level_64["estimated_s"]
    assert level_64["estimated_s"] < 2 * result["levels"]["1"]["duration_s"]


def test_each_batch_is_probed_at_its_own_size_before_its_full_run() -> None:
    runner = SimulatedRunner()
    _run(runner, budget_s=120, batch_sizes=[1, 64])
    probe_tokens = hf_baseline.PROBE_STEPS + 1
    assert runner.calls == [(1, probe_tokens), (1, OUTPUT_LEN), (64, probe_tokens), (64, OUTPUT_LEN)]


def test_a_batch_that_would_overrun_the_budget_is_skipped_with_its_probe_and_estimate() -> None:
    runner = SimulatedRunner(step_s=0.05, step_growth_per_batch_s=0.001)  # batch 256: ~0.3 s a step
    result = _run(runner, budget_s=70)
    skipped = {entry["batch"]: entry for entry in result["skipped_for_time"]}
    assert 256 in skipped and "256" not in result["levels"]
    assert skipped[256]["estimated_s"] > skipped[256]["remaining_s"]
    assert skipped[256]["probe"]["step_ms_median"] == pytest.approx(50 + 256, rel=0.01)
    assert "1" in result["levels"] and "8" in result["levels"]


def test_out_of_memory_in_the_probe_stops_at_that_batch() -> None:
    runner = SimulatedRunner(oom_from_batch=64)
    result = _run(runner, budget_s=600)
    assert result["oom_at_batch"] == 64
    assert result["levels"]["64"]["oom"] is True and "probe" in result["levels"]["64"]["error"]
    assert result["largest_batch_served"] == 16
    assert all(batch < 256 for batch, _ in runner.calls), "nothing is tried past the first OOM"


def test_out_of_memory_in_the_full_run_also_stops() -> None:
    runner = SimulatedRunner(oom_from_batch=256, oom_only_in_full_run=True)
    result = _run(runner, budget_s=600)
    assert result["oom_at_batch"] == 256 and result["levels"]["256"]["oom"] is True
    assert result["largest_batch_served"] == 64


def test_level_records_the_step_spread_and_what_competed_for_the_cpu() -> None:
    result = _run(SimulatedRunner(), budget_s=120, batch_sizes=[8])
    level = result["levels"]["8"]
    assert level["tpot_ms"] == pytest.approx(25.8, rel=1e-6)
    assert level["step_ms"]["median"] == pytest.approx(25.8, abs=0.01)
    assert level["steps_timed"] == OUTPUT_LEN and level["output_tokens"] == 8 * OUTPUT_LEN
    assert level["launch_us_before"] == 9.5
    assert len(level["load_1m_before_after"]) == 2
    assert "probe" in result["estimate"]["method"]
