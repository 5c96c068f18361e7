"""bench/tensor_parallel/analyze.py on the committed lab files: starts that never reached /health."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.tensor_parallel import analyze, prepare

RAW = Path(analyze.__file__).resolve().parent / "raw"
TEARDOWN_ERROR = (
    "ServerFailedError: tp2: no health within 450 s\nframe #15: VLLM::Worker_TP1() [0x6b542d]\n\n"
    "  what():  CUDA error: an illegal memory access was encountered\n"
    "Exception raised from ~AllocationRef at /pytorch/CUDASymmetricMemory.cu:51 (most recent call first):\n"
    "frame #13: Py_FinalizeEx + 0x4e (0x6b118e in VLLM::Worker_TP0)\n"
)


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    """The lab's completed tp1 run, and a tp2 run that stopped logging after torch.compile."""
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(RAW / "tp1.json", raw / "tp1.json")
    tp1 = json.loads((raw / "tp1.json").read_text())
    tp2 = {
        **{key: tp1[key] for key in ("generated_by", "mode", "gpus", "software")},
        "started_at": "2026-11-29T18:33:41+0000",
        "budget_s": 470.0,
        "runs": {
            "tp2": {
                "tensor_parallel_size": 2,
                "status": "failed",
                "error": TEARDOWN_ERROR,
                "steps": [{"at_s": 0.3, "step": "tp2: started vllm serve"}],
            }
        },
        "status": "stopped: budget of 470 s exhausted",
    }
    (raw / "tp2-a.json").write_text(json.dumps(tp2))
    (raw / "tp2-a-lab.log").write_text(
        "[18:35:14 +  93.4s] tp2: attention_backend = FLASH_ATTN at 93.1 s\n"
        "[18:35:15 +  94.4s] tp2: model_load_s = 1.716691 at 94.1 s\n"
        "[18:35:37 + 116.5s] tp2: torch_compile_s = 21.47 at 116.2 s\n"
        "[18:35:37 + 116.5s] tp1: torch_compile_s = 99.0 at 99.0 s\n"
    )
    return raw


def test_a_failed_start_keeps_how_far_it_got_from_the_lab_log(raw: Path) -> None:
    (attempt,) = analyze.analyze(raw, prepare.PLAN_FILE)["failed_starts"]
    assert attempt["variant"] == "tp2" and attempt["file"] == "tp2-a.json"
    # Only this variant's progress lines, each milestone at its first time.
    assert attempt["milestones_s"] == {
        "attention_backend": 93.1,
        "model_load_s": 94.1,
        "torch_compile_s": 116.2,
    }
    assert attempt["error"] == "ServerFailedError: tp2: no health within 450 s"
    assert attempt["error_detail"] == [
        "what():  CUDA error: an illegal memory access was encountered",
        "Exception raised from ~AllocationRef at /pytorch/CUDASymmetricMemory.cu:51",
    ]
    assert attempt["raised_at_exit"] is True


def test_the_record_milestones_win_over_the_lab_log(raw: Path) -> None:
    document = json.loads((raw / "tp2-a.json").read_text())
    document["runs"]["tp2"]["milestones_s"] = {"model_load_s": 80.0}
    document["runs"]["tp2"]["stall"] = {"after_milestone": "torch_compile_s", "waited_s": 150}
    (raw / "tp2-a.json").write_text(json.dumps(document))
    results = analyze.analyze(raw, prepare.PLAN_FILE)
    assert results["failed_starts"][0]["milestones_s"] == {"model_load_s": 80.0}
    markdown = analyze.render_markdown(results)
    assert "stalled: no KV-cache line 150 s after torch_compile_s" in markdown


def test_the_report_shows_the_failure_briefly_beside_the_completed_start(raw: Path) -> None:
    results = analyze.analyze(raw, prepare.PLAN_FILE)
    markdown = analyze.render_markdown(results)
    section = markdown.split("## Starts that did not reach /health", 1)[1].split("\n## ", 1)[0]
    assert "| tp2-a.json | tp2 | – | attention_backend 93, model_load_s 94, torch_compile_s 116 |" in section
    assert "(`Py_FinalizeEx` in its traceback)" in section and "before the runner stopped anything" in section
    tp1 = results["completed_milestones_s"]["tp1"]
    gap = tp1["kv_cache_tokens"] - tp1["torch_compile_s"]
    assert f"tp1 logged its KV-cache size {gap:.0f} s after torch.compile" in section
    assert "frame #" not in markdown, "the traceback stays in the raw file"


def test_no_failed_start_no_section(raw: Path) -> None:
    (raw / "tp2-a.json").unlink()
    results = analyze.analyze(raw, prepare.PLAN_FILE)
    assert results["failed_starts"] == []
    assert "did not reach /health" not in analyze.render_markdown(results)


def _completed_tp2_nccl(raw: Path, kv_cache_tokens: int) -> None:
    """A completed tp2-nccl record: the lab's tp1 record reshaped as two workers' numbers."""
    tp1 = json.loads((raw / "tp1.json").read_text())
    record = json.loads(json.dumps(tp1["runs"]["tp1"]))
    record["tensor_parallel_size"] = 2
    record["kv_cache"]["kv_cache_tokens"] = kv_cache_tokens
    record["command"] = json.loads(prepare.PLAN_FILE.read_text())["variants"]["tp2-nccl"]["serve_args"]
    document = {**tp1, "started_at": "2026-11-30T10:00:00+0000", "runs": {"tp2-nccl": record}}
    (raw / "tp2-nccl.json").write_text(json.dumps(document))


def test_the_nccl_diagnosis_stands_in_for_tp2_only_when_the_stacks_tp2_did_not_start(raw: Path) -> None:
    _completed_tp2_nccl(raw, 4_380_000)
    results = analyze.analyze(raw, prepare.PLAN_FILE)
    comparison = results["comparison"]
    assert comparison["tp2_source"] == "tp2-nccl"
    nccl = comparison["variants"]["tp2-nccl"]
    assert nccl["predicted"] == comparison["variants"]["tp2"]["predicted"]
    assert nccl["observed"]["kv_cache_tokens"] == 4_380_000
    planned = nccl["predicted"]["kv_cache_tokens"]
    assert nccl["difference_pct"]["kv_cache_tokens"] == round((4_380_000 - planned) / planned * 100, 2)
    assert comparison["tp2_over_tp1"]["kv_cache_tokens_observed"] == pytest.approx(
        4_380_000 / comparison["variants"]["tp1"]["observed"]["kv_cache_tokens"], abs=1e-3
    )
    assert "**The TP=2 columns are the lab diagnosis `tp2-nccl`**" in analyze.render_markdown(results)


def test_the_stacks_own_tp2_wins_over_the_diagnosis_when_it_started(raw: Path) -> None:
    _completed_tp2_nccl(raw, 4_380_000)
    document = json.loads((raw / "tp2-nccl.json").read_text())
    stack_tp2 = {**document["runs"]["tp2-nccl"], "kv_cache": {**document["runs"]["tp2-nccl"]["kv_cache"]}}
    stack_tp2["kv_cache"]["kv_cache_tokens"] = 4_390_000
    (raw / "tp2-b.json").write_text(json.dumps({**document, "runs": {"tp2": stack_tp2}}))
    results = analyze.analyze(raw, prepare.PLAN_FILE)
    assert results["comparison"]["tp2_source"] == "tp2"
    assert results["comparison"]["variants"]["tp2"]["observed"]["kv_cache_tokens"] == 4_390_000
    assert "lab diagnosis `tp2-nccl`**" not in analyze.render_markdown(results)


def test_the_report_names_the_all_reduce_backend_that_made_the_difference() -> None:
    # 2026-11-29: tp2 and tp2-nccl failed with vLLM's mnnvl choice; tp2 completed with the stack's trtllm.
    failed = [
        {"file": f"{variant}-x.json", "variant": variant, "status": "stalled", "error": "StallError: x",
         "error_detail": [], "milestones_s": {"torch_compile_s": 116.0}, "stall": None,
         "raised_at_exit": False, "worker_error": None, "allreduce_backend": backend}
        for variant, backend in (("tp2", "mnnvl"), ("tp2-nccl", "mnnvl"), ("tp2", None))
    ]
    text = "\n".join(analyze.render_failed_starts(failed, {}, {"tp2": "trtllm", "tp1": None}))
    assert "| tp2-x.json | tp2 | mnnvl |" in text and "| tp2-x.json | tp2 | – |" in text
    assert "tp2 completed with the fused all-reduce backend `trtllm`" in text
    assert "used `mnnvl` and failed in its first forward pass" in text
    # The same backend on both sides explains nothing: no sentence.
    same = "\n".join(analyze.render_failed_starts(failed, {}, {"tp2": "mnnvl"}))
    assert "completed with the fused all-reduce backend" not in same
