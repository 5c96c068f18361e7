"""infra/loadtest.py without a server: percentiles, per-level summaries from request samples, the SLO
verdict and the CLI's argument checks. The real runs are in tests/e2e/test_loadtest.py."""

from __future__ import annotations

import random
import statistics

import pytest

from infra import cli
from infra.loadtest import LoadtestReport, Slo, format_report, level_from_samples, percentile


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
    assert [line.split()[-1] for line in table.splitlines()[2:5]] == ["met", "met", "missed"]


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
