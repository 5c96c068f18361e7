"""infra/loadtest.py without a server: percentiles, per-level summaries from request samples, the SLO
verdict, the prompts each level draws from the run's seed, and the CLI's argument checks. The real
runs (and vLLM's own prefix-cache counters over them) are in tests/e2e/test_loadtest.py."""

from __future__ import annotations

import random
import statistics

import pytest

from infra import cli
from infra.loadtest import (
    LoadtestReport,
    Slo,
    Workload,
    format_report,
    level_from_samples,
    level_prompts,
    new_seed,
    percentile,
)


def test_percentile_matches_the_standard_librarys_inclusive_quantiles() -> None:
    rng = random.Random(7)
    values = [rng.uniform(1, 500) for _ in range(101)]
    cut_points = statistics.quantiles(values, n=100, method="inclusive")
    for q in (50, 90, 95, 99):
        assert percentile(values, q) == pytest.approx(cut_points[q - 1])


def _sample(start: float, first: float, end: float, tokens: int, error: str | None = None) -> dict:
    return {"start": start, "first": first, "end": end, "tokens": tokens, "error": error}


def test_level_counts_tokens_over_the_span_and_tpot_after_the_first_token() -> None:
    samples = [_sample(0.0, 0.1, 1.1, 11), _sample(0.5, 0.7, 2.7, 21)]
    level = level_from_samples(2, {"samples": samples}, Slo(ttft_ms=500, tpot_ms=150))
    assert (level.requests, level.errors, level.output_tokens) == (2, 0, 32)
    assert level.duration_s == pytest.approx(2.7)
    assert level.output_tokens_per_s == pytest.approx(32 / 2.7, abs=0.1)
    assert level.ttft_ms["p50"] == pytest.approx(150)  # 100 and 200 ms
    assert level.tpot_ms["p50"] == pytest.approx(100)  # 1 s / 10 and 2 s / 20
    assert level.meets_slo


def test_a_failed_request_fails_the_slo_and_is_counted_by_message() -> None:
    samples = [_sample(0.0, 0.1, 1.1, 11), _sample(0.0, None, None, 0, "HTTP 401: unauthorized")]
    level = level_from_samples(2, {"samples": samples}, Slo(ttft_ms=10_000, tpot_ms=10_000))
    assert (level.requests, level.errors) == (2, 1)
    assert level.error_messages == {"HTTP 401: unauthorized": 1}
    assert not level.meets_slo


def test_max_safe_concurrency_is_the_largest_level_within_the_slo() -> None:
    slo = Slo(ttft_ms=300, tpot_ms=1000)
    report = LoadtestReport(url="http://x", model="m", engine="locust", slo=slo)
    for concurrency, ttft in ((1, 0.1), (4, 0.2), (16, 0.9)):
        report.levels.append(
            level_from_samples(concurrency, {"samples": [_sample(0, ttft, ttft + 1, 11)]}, slo)
        )
    assert report.max_safe_concurrency == 4
    table = format_report(report)
    assert "max safe concurrency: 4" in table
    assert [line.split()[-1] for line in table.splitlines()[3:6]] == ["met", "met", "missed"]


@pytest.mark.parametrize("text", ["", "a,b", "0,4", "-1"])
def test_concurrency_list_must_be_positive_integers(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.build_parser().parse_args(
            ["loadtest", "--url", "http://x", "--model", "m", "--concurrency", text,
             "--slo-ttft-ms", "1", "--slo-tpot-ms", "1"]
        )  # fmt: skip
    assert raised.value.code == 2
    assert "comma-separated list of positive integers" in capsys.readouterr().err


def test_concurrency_levels_are_sorted_and_deduplicated() -> None:
    args = cli.build_parser().parse_args(
        ["loadtest", "--url", "http://x", "--model", "m", "--concurrency", "16,1,4,4",
         "--slo-ttft-ms", "1", "--slo-tpot-ms", "1"]
    )  # fmt: skip
    assert args.concurrency == [1, 4, 16]


def test_a_level_missing_the_slo_caps_the_max_safe_concurrency_below_it() -> None:
    slo = Slo(ttft_ms=300, tpot_ms=1000)
    report = LoadtestReport(url="http://x", model="m", engine="locust", slo=slo)
    for concurrency, ttft in ((1, 0.1), (2, 0.5), (4, 0.2)):  # 2 missed, 4 met again (noise or not)
        report.levels.append(
            level_from_samples(concurrency, {"samples": [_sample(0, ttft, ttft + 1, 11)]}, slo)
        )
    assert report.max_safe_concurrency == 1


SHARED = Workload(kind="shared-prefix", prefix_words=40, prefixes=2)


def _leading_words(prompt: str, count: int = 16) -> str:
    return " ".join(prompt.split()[:count])


def test_every_request_of_every_level_gets_its_own_prompt() -> None:
    # No prompt repeats another's first 16 words (the prefix cache reuses only identical leading
    # blocks of tokens); whether the server agrees is tests/e2e/test_loadtest.py's question.
    run = {level: level_prompts(7, level, level * 4, 64, Workload()) for level in (1, 4, 16)}
    prompts = [prompt for level in run.values() for prompt in level]
    assert len(prompts) == 4 * (1 + 4 + 16)
    assert len({_leading_words(prompt) for prompt in prompts}) == len(prompts)
    assert all(len(prompt.split()) == 64 for prompt in prompts)


def test_the_same_seed_repeats_a_levels_prompts_and_another_seed_does_not() -> None:
    assert level_prompts(7, 4, 16, 64, Workload()) == level_prompts(7, 4, 16, 64, Workload())
    other = level_prompts(8, 4, 16, 64, Workload())
    assert not {_leading_words(p) for p in other} & {
        _leading_words(p) for p in level_prompts(7, 4, 16, 64, Workload())
    }


def test_runs_without_a_seed_draw_different_seeds() -> None:
    assert len({new_seed() for _ in range(20)}) == 20


def test_shared_prefix_prompts_start_with_the_runs_shared_texts_in_turn_then_fresh_words() -> None:
    one, four = level_prompts(7, 1, 4, 10, SHARED), level_prompts(7, 4, 16, 10, SHARED)
    prefixes = [" ".join(prompt.split()[:40]) for prompt in one + four]
    assert len(set(prefixes)) == 2  # the same two texts in both levels
    assert prefixes[:4] == [prefixes[0], prefixes[1]] * 2  # taken in turn
    suffixes = [" ".join(prompt.split()[40:]) for prompt in one + four]
    assert all(len(suffix.split()) == 10 for suffix in suffixes)
    assert len(set(suffixes)) == len(suffixes)
    assert level_prompts(8, 1, 4, 10, SHARED)[0].split()[:40] != one[0].split()[:40]


@pytest.mark.parametrize(
    "workload",
    [
        {"kind": "shared-prefix", "prefix_words": 0, "prefixes": 1},
        {"kind": "shared-prefix", "prefix_words": 10, "prefixes": 0},
        {"kind": "fresh", "prefix_words": 10, "prefixes": 1},
    ],
)
def test_a_workload_without_a_usable_prefix_or_with_a_stray_one_is_refused(workload: dict) -> None:
    with pytest.raises(ValueError):
        Workload(**workload)


def test_the_report_records_the_seed_and_what_the_workload_measures() -> None:
    slo = Slo(ttft_ms=300, tpot_ms=1000)
    fresh = LoadtestReport(url="http://x", model="m", engine="locust", slo=slo, seed=1234)
    fresh.levels.append(level_from_samples(1, {"samples": [_sample(0, 0.1, 1.1, 11)]}, slo))
    document = fresh.as_json()
    assert document["seed"] == 1234
    assert document["workload"]["kind"] == "fresh"
    assert "not vLLM's prefix cache" in document["workload"]["measures"]
    assert "seed 1234 (--seed 1234 repeats them)" in format_report(fresh)
    shared = LoadtestReport(url="http://x", model="m", engine="locust", slo=slo, seed=5, workload=SHARED)
    assert shared.as_json()["workload"] | {"measures": ""} == {
        "kind": "shared-prefix",
        "prefix_words": 40,
        "prefixes": 2,
        "measures": "",
    }
    assert "measures serving with prefix-cache reuse" in format_report(shared)


def _loadtest_args(*extra: str) -> list[str]:
    return [
        "loadtest",
        "--url",
        "http://x",
        "--model",
        "m",
        "--slo-ttft-ms",
        "1",
        "--slo-tpot-ms",
        "1",
        *extra,
    ]


def test_seed_and_workload_arguments_are_parsed() -> None:
    args = cli.build_parser().parse_args(_loadtest_args("--seed", "42", "--workload", "shared-prefix"))
    assert (args.seed, args.workload) == (42, "shared-prefix")
    assert cli.build_parser().parse_args(_loadtest_args()).seed is None  # drawn per run


@pytest.mark.parametrize("extra", [["--seed", "-1"], ["--seed", "x"], ["--shared-prefix-words", "0"]])
def test_a_negative_seed_or_an_empty_prefix_is_an_argument_error(extra: list[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.build_parser().parse_args(_loadtest_args(*extra))
    assert raised.value.code == 2


def test_shared_prefix_options_without_the_shared_prefix_workload_are_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(_loadtest_args("--shared-prefix-words", "100")) == 2
    assert "need --workload shared-prefix" in capsys.readouterr().err
