"""bench/serving/report.py over several lab sessions: every fresh server of a configuration is pooled
(issue 27's three servers at 256), each session's median and its ratio to its own defaults are shown
beside the pooled ones, and LoRA runs (`-a<N>` files) are not a serving configuration."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from bench.serving import report
from tests.support.lab_session import LabSession

SERVING = Path(__file__).resolve().parents[1] / "bench" / "serving"
PROFILE_ARGS = ["--kv-cache-dtype", "fp8", "--stream-interval", "4"]

# session -> configuration -> output tok/s of each fresh server at 256 (p99 TTFT = tok/s / 4 ms)
FIRST = {"defaults": [9000.0, 9200.0], "profile": [10000.0, 10200.0, 10400.0]}
SECOND = {"defaults": [9600.0], "profile": [11000.0, 11100.0, 11200.0], "profile-fp8w": [14000.0]}


def write_session(
    raw: Path, throughputs: dict[str, list[float]], seed_base: int, one_concurrent: bool
) -> LabSession:
    session = LabSession(raw, seed_base=seed_base)
    for config, values in throughputs.items():
        for index, value in enumerate(values):
            label = session.server(config, load="default")  # the checkpoint: bare group names
            session.run(label, 256, value, value / 4, mean_tpot_ms=20.0 + index / 10)
            if one_concurrent:
                session.run(label, 1, value / 50, 30.0 + index, mean_tpot_ms=5.0 + index / 10)
    plan = {"configs": {"defaults": {"args": []}, "profile": {"args": PROFILE_ARGS}}}
    plan["configs"]["profile-fp8w"] = {"args": [*PROFILE_ARGS, "--quantization", "fp8"]}
    (raw / "lab_plan.json").write_text(json.dumps(plan))
    session.save()
    return session


@pytest.fixture
def two_sessions(tmp_path: Path) -> list[Path]:
    first = write_session(tmp_path / "2026-12-01-b", FIRST, seed_base=1000, one_concurrent=False)
    second = write_session(tmp_path / "2026-12-02", SECOND, seed_base=2000, one_concurrent=True)
    # The second session's LoRA server: its runs are bench/lora's, not a serving configuration.
    label = second.server("profile-lora")
    for adapters in (0, 1, 4, 16):
        second.run(label, 256, 9000.0 - adapters, 4000.0, adapters=adapters)
    second.save()
    return [first.raw, second.raw]


def test_pooled_256_row_is_median_and_range_over_every_fresh_server_of_both_sessions(
    two_sessions: list[Path],
) -> None:
    summary = report.summary(two_sessions)
    profile = summary["profile"]["256"]
    everything = FIRST["profile"] + SECOND["profile"]
    assert profile["servers"] == 6
    assert profile["output_throughput"]["median"] == round(statistics.median(everything), 1)
    assert (profile["output_throughput"]["min"], profile["output_throughput"]["max"]) == (10000.0, 11200.0)
    assert profile["sessions"] == {
        "2026-12-01-b": {"output_throughput_median": 10200.0, "servers": 3},
        "2026-12-02": {"output_throughput_median": 11100.0, "servers": 3},
    }
    assert summary["defaults"]["256"]["servers"] == 3
    assert summary["defaults"]["256"]["output_throughput"]["median"] == 9200.0


def test_vs_defaults_is_given_pooled_and_against_each_sessions_own_defaults(two_sessions: list[Path]) -> None:
    summary = report.summary(two_sessions)
    pooled_profile = statistics.median(FIRST["profile"] + SECOND["profile"])
    pooled_defaults = statistics.median(FIRST["defaults"] + SECOND["defaults"])
    assert summary["profile"]["256"]["vs_defaults"] == round(pooled_profile / pooled_defaults, 4)
    assert summary["profile"]["256"]["vs_defaults_same_session"] == {
        "2026-12-01-b": round(10200.0 / 9100.0, 4),
        "2026-12-02": round(11100.0 / 9600.0, 4),
    }
    # FP8 weights ran only in the second session: its same-session ratio is that session's alone.
    assert summary["profile-fp8w"]["256"]["vs_defaults_same_session"] == {
        "2026-12-02": round(14000 / 9600, 4)
    }
    text = report.render(two_sessions)
    row = next(line for line in text.splitlines() if line.startswith("| profile |"))
    assert "2026-12-01-b: 10,200 (3); 2026-12-02: 11,100 (3)" in row
    assert f"{100 * (pooled_profile / pooled_defaults - 1):+.1f} %" in row
    assert (
        f"2026-12-01-b: {100 * (10200 / 9100 - 1):+.1f} %; 2026-12-02: {100 * (11100 / 9600 - 1):+.1f} %"
        in row
    )


def test_a_session_without_defaults_has_no_same_session_ratio(tmp_path: Path) -> None:
    with_defaults = write_session(tmp_path / "a", FIRST, seed_base=1000, one_concurrent=False).raw
    without = write_session(tmp_path / "b", {"profile": [12000.0]}, seed_base=2000, one_concurrent=False).raw
    summary = report.summary([with_defaults, without])
    assert summary["profile"]["256"]["vs_defaults_same_session"] == {"a": round(10200.0 / 9100.0, 4)}
    assert summary["profile"]["256"]["servers"] == 4


def test_lora_runs_are_not_a_serving_configuration(two_sessions: list[Path]) -> None:
    assert "profile-lora" not in report.summary(two_sessions)
    text = report.render(two_sessions)
    assert "profile-lora" not in text
    every_run = text.split("## Every run")[1]
    assert sum(line.startswith("| 2026-12-02 |") for line in every_run.splitlines()) == 2 * 5


def test_one_concurrent_table_is_median_and_range_over_every_server_that_ran_it(
    two_sessions: list[Path],
) -> None:
    summary = report.summary(two_sessions)
    values = [value / 50 for value in SECOND["profile"]]
    assert summary["profile"]["1"]["servers"] == 3
    assert summary["profile"]["1"]["output_throughput"]["values"] == [round(v, 1) for v in values]
    section = report.render(two_sessions).split("## 1 concurrent")[1].split("## Configurations")[0]
    row = next(line for line in section.splitlines() if line.startswith("| profile |"))
    assert f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f}, 3 servers)" in row
    assert "31 (30-32, 3 servers)" in row  # p99 TTFT of the three servers


def test_sessions_that_ran_a_configuration_differently_get_a_row_each(two_sessions: list[Path]) -> None:
    plan_file = two_sessions[1] / "lab_plan.json"
    plan = json.loads(plan_file.read_text())
    plan["configs"]["profile"]["args"] = [*PROFILE_ARGS, "--max-num-seqs", "256"]
    plan_file.write_text(json.dumps(plan))
    text = report.render(two_sessions)
    assert "| profile (2026-12-01-b) | `--kv-cache-dtype fp8 --stream-interval 4` |" in text
    assert "| profile (2026-12-02) | `--kv-cache-dtype fp8 --stream-interval 4 --max-num-seqs 256` |" in text
    assert "| defaults | `(vLLM's defaults)` |" in text


def test_one_folder_is_a_list_of_one(two_sessions: list[Path]) -> None:
    assert report.render(two_sessions[0]) == report.render([two_sessions[0]])
    assert report.summary(two_sessions[0]) == report.summary([two_sessions[0]])


def test_default_sessions_are_the_raw_folders_with_a_seed_base(tmp_path: Path) -> None:
    write_session(tmp_path / "2026-12-01", FIRST, seed_base=0, one_concurrent=False)
    LabSession(tmp_path / "2026-12-01").save(with_seed_base=False)  # the seed-0 ablation session
    write_session(tmp_path / "2026-12-02", SECOND, seed_base=2000, one_concurrent=False)
    (tmp_path / "notes").mkdir()
    assert [path.name for path in report.fresh_seed_sessions(tmp_path)] == ["2026-12-02"]
    committed = [path.name for path in report.fresh_seed_sessions(SERVING / "raw")]
    assert "2026-12-01-b" in committed and "2026-12-01" not in committed


def test_the_committed_session_renders_through_the_list_form() -> None:
    raw = SERVING / "raw" / "2026-12-01-b"
    text = report.render([raw])
    row = next(line for line in text.splitlines() if line.startswith("| profile |"))
    assert "10,577 (10,554-10,625, 3 servers)" in row and "2026-12-01-b: +14.0 %" in row
    assert "`bench/serving/raw/2026-12-01-b`" in text
