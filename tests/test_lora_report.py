"""bench/lora/report.py (issue 25, item 7): each number of adapters in use is the median over the fresh
LoRA servers against the same session's profile servers, and the memory the LoRA server loses to its
slots (from vLLM 0.26.0's own log lines) is set beside domain/capacity/lora.py's prediction."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.lora import report
from tests.support.lab_session import LabSession, memory_log_lines, write_server_log

BASE = [10500.0, 10600.0, 10550.0]  # profile servers at 256, output tok/s
# LoRA server k -> adapters in use -> output tok/s
LORA = [
    {0: 10300.0, 1: 9800.0, 4: 9500.0, 16: 9000.0},
    {0: 10350.0, 1: 9900.0, 4: 9400.0, 16: 9100.0},
    {0: 10250.0, 1: 9850.0, 4: 9450.0, 16: 8900.0},
]
# (Model loading GiB, available KV cache GiB, KV cache tokens) per server, as the logs say
BASE_MEMORY = [(15.04, 109.46, 1_793_328), (15.04, 109.44, 1_793_072), (15.04, 109.46, 1_793_328)]
LORA_MEMORY = [(16.45, 107.9, 1_767_776), (16.43, 107.92, 1_768_096), (16.45, 107.9, 1_767_776)]
PLANNER_GIB = 16 * 88.078125 / 1024  # bench/lora/README.md: 88.1 MiB per rank-16 slot of the 8B shape


def write_lab(
    tmp_path: Path, lora_servers: int = 3, base_servers: int = 3, logs_for: set[str] | None = None
) -> tuple[Path, Path]:
    session = LabSession(tmp_path / "raw" / "2026-12-02")
    logs = tmp_path / "startup" / "2026-12-02"
    memory = {}
    for index in range(base_servers):
        label = session.server("profile")
        session.run(label, 256, BASE[index], 3000.0 + 10 * index, mean_tpot_ms=20.3)
        session.run(label, 1, 198.0, 27.0)  # level 1: not the base row at 256
        memory[label] = BASE_MEMORY[index]
    for index in range(lora_servers):
        label = session.server("profile-lora")
        for adapters, throughput in LORA[index].items():
            session.run(
                label, 256, throughput, 3500.0 + 100 * adapters + index, adapters=adapters, mean_tpot_ms=21.0
            )
        memory[label] = LORA_MEMORY[index]
    session.save()
    for label, (weights, kv_cache, tokens) in memory.items():
        if logs_for is None or label in logs_for:
            write_server_log(logs, label, memory_log_lines(weights, kv_cache, tokens))
    return session.raw, logs


def test_each_number_of_adapters_is_the_median_over_the_lora_servers_against_the_profile_servers(
    tmp_path: Path,
) -> None:
    raw, logs = write_lab(tmp_path)
    summary = report.summary(raw, logs)
    assert summary["base"]["servers"] == 3 and summary["lora_servers"] == 3
    assert summary["base"]["output_throughput"]["median"] == statistics.median(BASE)
    for adapters in (0, 1, 4, 16):
        values = [server[adapters] for server in LORA]
        entry = summary["adapters"][str(adapters)]
        assert entry["output_throughput"]["values"] == values
        assert entry["output_throughput"]["median"] == statistics.median(values)
        expected = 100 * (statistics.median(values) / statistics.median(BASE) - 1)
        assert summary["vs_base_pct"][str(adapters)] == pytest.approx(expected, abs=0.005)
        assert entry["p99_ttft_ms"]["median"] == 3500.0 + 100 * adapters + 1
    text = report.render(raw, logs)
    row = next(line for line in text.splitlines() if line.startswith("| LoRA server, 16 adapters in use |"))
    assert "9,000 (8,900-9,100, 3 servers)" in row and f"{summary['vs_base_pct']['16']:+.1f} %" in row
    base_row = next(line for line in text.splitlines() if line.startswith("| base model alone"))
    assert "10,550 (10,500-10,600, 3 servers)" in base_row


def test_memory_is_lora_minus_base_medians_against_the_planners_slots(tmp_path: Path) -> None:
    raw, logs = write_lab(tmp_path)
    memory = report.summary(raw, logs)["memory"]
    assert memory["planner_gib"] == pytest.approx(PLANNER_GIB)
    weights = statistics.median(m[0] for m in LORA_MEMORY) - statistics.median(m[0] for m in BASE_MEMORY)
    kv_cache = statistics.median(m[1] for m in LORA_MEMORY) - statistics.median(m[1] for m in BASE_MEMORY)
    tokens = statistics.median(m[2] for m in LORA_MEMORY) - statistics.median(m[2] for m in BASE_MEMORY)
    assert memory["lora_minus_base"]["weights_gib"] == pytest.approx(weights)
    assert memory["lora_minus_base"]["available_kv_cache_gib"] == pytest.approx(kv_cache)
    assert memory["lora_minus_base"]["kv_cache_tokens"] == tokens
    assert memory["relative_error"]["weights_gib"] == pytest.approx((weights - PLANNER_GIB) / PLANNER_GIB)
    assert memory["relative_error"]["available_kv_cache_gib"] == pytest.approx(
        (kv_cache + PLANNER_GIB) / PLANNER_GIB
    )
    text = report.render(raw, logs)
    assert f"| Model loading took (GiB) | 15.04 | 16.45 | {weights:+.2f} | +1.376 |" in text
    assert f"{100 * (weights - PLANNER_GIB) / PLANNER_GIB:+.1f} %" in text
    assert "| profile-lora-s2 | profile-lora | 16.43 | 107.92 | 1,768,096 |" in text


def test_model_loading_is_read_in_both_of_vllms_wordings(tmp_path: Path) -> None:
    raw, logs = write_lab(tmp_path, lora_servers=1, base_servers=1)
    write_server_log(logs, "profile-lora-s1", memory_log_lines(16.5, 107.8, 1_766_000, with_memory_word=True))
    memory = report.summary(raw, logs)["memory"]
    assert memory["servers"]["profile-lora-s1"]["weights_gib"] == 16.5
    assert memory["lora_minus_base"]["weights_gib"] == pytest.approx(16.5 - 15.04)


def test_missing_logs_are_said_in_the_report_not_fatal(tmp_path: Path) -> None:
    raw, logs = write_lab(tmp_path, logs_for={"profile-s1", "profile-lora-s1", "profile-lora-s3"})
    memory = report.summary(raw, logs)["memory"]
    assert memory["missing"] == ["profile-s2", "profile-s3", "profile-lora-s2"]
    assert memory["lora_minus_base"]["weights_gib"] == pytest.approx(16.45 - 15.04)
    assert "No memory lines found for: profile-s2, profile-s3, profile-lora-s2" in report.render(raw, logs)
    nowhere = tmp_path / "no-logs"
    text = report.render(raw, nowhere)
    assert "No server log with vLLM's memory lines under" in text and "| quantity |" not in text
    assert report.summary(raw, nowhere)["memory"]["relative_error"]["weights_gib"] is None


def test_fewer_fresh_servers_than_planned_are_reported_and_said(tmp_path: Path) -> None:
    raw, logs = write_lab(tmp_path, lora_servers=1, base_servers=2)
    summary = report.summary(raw, logs)
    assert (summary["lora_servers"], summary["base_servers"]) == (1, 2)
    assert summary["adapters"]["4"]["output_throughput"]["values"] == [LORA[0][4]]
    text = report.render(raw, logs)
    assert "1 LoRA server(s) and 2 base server(s) ran" in text
    assert "| LoRA server, 4 adapters in use | 9,500 (1 server) |" in text
    full = report.render(*write_lab(tmp_path / "full"))
    assert "Fewer fresh servers" not in full


def test_a_result_whose_metadata_names_other_adapters_than_its_file_is_refused(tmp_path: Path) -> None:
    raw, _ = write_lab(tmp_path, lora_servers=1, base_servers=1)
    wrong = raw / "profile-lora-s1-c256-a4.json"
    wrong.write_text(wrong.read_text().replace('"lab_adapters": "4"', '"lab_adapters": "1"'))
    with pytest.raises(ValueError, match="lab_adapters=1"):
        report.summary(raw)


def test_every_run_lists_each_lora_run_with_its_adapters_and_seed(tmp_path: Path) -> None:
    raw, logs = write_lab(tmp_path, lora_servers=2, base_servers=1)
    every_run = report.render(raw, logs).split("## Every run")[1].splitlines()
    # seeds count up from 1000: profile-s1 took two (256 and 1), then four per LoRA server
    assert "| profile-lora-s2 | dummy | 16 | 1009 | 9,100 | 5,101 | 9.0 % / 90.0 % |" in every_run
    assert (
        "| profile-s1 | dummy | base (no --enable-lora) | 1000 | 10,500 | 3,000 | 9.0 % / 90.0 % |"
        in every_run
    )
    assert sum(line.startswith("| profile") for line in every_run) == 1 + 2 * 4


def test_planner_slots_follow_the_lora_servers_recorded_arguments(tmp_path: Path) -> None:
    raw, logs = write_lab(tmp_path, lora_servers=1, base_servers=1)
    # the job as lab.py records it: its command line, here with fewer slots than the 16
    data = json.loads((raw / "session.json").read_text())
    for job in data["jobs"].values():
        if job["config"] == "profile-lora":
            job["argv"] = [
                "serve",
                "/tmp/m/llama8b",
                "--enable-lora",
                "--max-loras",
                "4",
                "--max-lora-rank",
                "16",
            ]
    (raw / "session.json").write_text(json.dumps(data))
    memory = report.summary(raw, logs)["memory"]
    assert memory["planner_settings"] == {"max_loras": 4, "max_lora_rank": 16, "tensor_parallel_size": 1}
    assert memory["planner_gib"] == pytest.approx(PLANNER_GIB / 4)


def test_committed_lora_results_are_what_the_gpu_sessions_raw_files_make() -> None:
    # Issue 25, item 7: the table committed is the one the committed client files and logs give, and
    # the planner's LoRA slots are within 5 % of what the GPU's vLLM set aside.
    repo = Path(__file__).resolve().parents[1]
    raw, logs = (
        repo / "bench" / "serving" / "raw" / "2026-12-02",
        repo / "bench" / "startup" / "raw" / "2026-12-02",
    )
    assert (repo / "bench" / "lora" / "RESULTS.md").read_text() == report.render(raw, logs), (
        "bench/lora/RESULTS.md is stale: run `.venv/bin/python -m bench.lora.report "
        "bench/serving/raw/2026-12-02 bench/startup/raw/2026-12-02`"
    )
    found = report.summary(raw, logs)
    extra = found["memory"]["lora_minus_base"]["weights_gib"]
    assert abs(extra / found["memory"]["planner_gib"] - 1) < 0.05
    assert found["memory"]["lora_minus_base"]["available_kv_cache_gib"] < 0
