"""domain/vllm_metrics.py against the /metrics of a real vLLM 0.32.0 server after one request."""

from __future__ import annotations

import re
from collections import defaultdict

import httpx
import pytest

from domain.vllm_metrics import (
    EXPORTED_METRICS,
    KV_CACHE_USAGE,
    MODEL_NAME_LABEL,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    RENAMED_METRICS,
    TIME_TO_FIRST_TOKEN_SECONDS,
    check_metric_name,
)
from tests.e2e.conftest import SERVED_MODEL_NAME
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)")


class Exposition:
    """The parts of Prometheus' text format these tests read."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.samples: dict[str, list[tuple[str, float]]] = defaultdict(list)
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split(" ", 3)
                self.types[name] = kind
            elif line and not line.startswith("#") and (match := _SAMPLE.match(line)):
                self.samples[match["name"]].append((match["labels"] or "", float(match["value"])))

    def vllm_families(self) -> dict[str, str]:
        # prometheus_client adds a `<name>_created` gauge per counter and histogram; not vLLM's own.
        return {
            name: kind
            for name, kind in self.types.items()
            if name.startswith("vllm:") and not name.endswith("_created")
        }


@pytest.fixture(scope="module")
def exposition(served_one_request: RunningVllmServer) -> Exposition:
    response = httpx.get(f"{served_one_request.base_url}/metrics", timeout=10)
    assert response.status_code == 200
    return Exposition(response.text)


def test_server_exports_every_listed_metric_with_its_type(exposition: Exposition) -> None:
    exported = exposition.vllm_families()
    wrong = {
        name: (kind, exported.get(name))
        for name, kind in EXPORTED_METRICS.items()
        if exported.get(name) != kind
    }
    assert wrong == {}, "listed in domain/vllm_metrics.py as (type, what the server has)"


def test_server_exports_no_vllm_metric_missing_from_the_list(exposition: Exposition) -> None:
    unlisted = {
        name: kind for name, kind in exposition.vllm_families().items() if name not in EXPORTED_METRICS
    }
    assert unlisted == {}, "add these to EXPORTED_METRICS in domain/vllm_metrics.py"


def test_histograms_have_observations_after_one_request(exposition: Exposition) -> None:
    counts = [value for _, value in exposition.samples[f"{TIME_TO_FIRST_TOKEN_SECONDS}_count"]]
    assert counts and sum(counts) >= 1
    for name, kind in EXPORTED_METRICS.items():
        if kind == "histogram":
            assert exposition.samples[f"{name}_bucket"], f"{name} has no buckets"


def test_renamed_away_names_are_not_exported_and_their_successors_are(exposition: Exposition) -> None:
    for old, new in RENAMED_METRICS.items():
        assert old not in exposition.samples and old not in exposition.types
        assert new in exposition.vllm_families()
    assert "vllm:gpu_cache_usage_perc" not in exposition.samples
    assert exposition.samples[KV_CACHE_USAGE]


def test_autoscaling_gauges_carry_the_served_model_name_label(exposition: Exposition) -> None:
    for name in (NUM_REQUESTS_WAITING, NUM_REQUESTS_RUNNING, KV_CACHE_USAGE):
        assert exposition.types[name] == "gauge"
        labels = [labels for labels, _ in exposition.samples[name]]
        assert labels and all(f'{MODEL_NAME_LABEL}="{SERVED_MODEL_NAME}"' in label for label in labels), (
            labels
        )


def test_check_metric_name_accepts_exported_families_and_their_series() -> None:
    for name in (NUM_REQUESTS_WAITING, KV_CACHE_USAGE, "vllm:prompt_tokens_total"):
        assert check_metric_name(name) is None
    assert check_metric_name(f"{TIME_TO_FIRST_TOKEN_SECONDS}_bucket") is None
    assert check_metric_name(f"{TIME_TO_FIRST_TOKEN_SECONDS}_count") is None


def test_check_metric_name_points_a_renamed_metric_at_its_successor() -> None:
    assert check_metric_name("vllm:gpu_cache_usage_perc") == (
        "vLLM 0.32.0 does not export vllm:gpu_cache_usage_perc: it was renamed to "
        "vllm:kv_cache_usage_perc; use vllm:kv_cache_usage_perc"
    )
    message = check_metric_name("vllm:time_per_output_token_seconds_bucket")
    assert message is not None and "use vllm:inter_token_latency_seconds_bucket" in message


def test_check_metric_name_suggests_fixes_for_typos_and_bare_counters() -> None:
    typo = check_metric_name("vllm:num_request_waiting")
    assert typo is not None and "did you mean vllm:num_requests_waiting" in typo
    bare = check_metric_name("vllm:prompt_tokens")
    assert bare is not None and "use vllm:prompt_tokens_total" in bare
    gauge_series = check_metric_name(f"{KV_CACHE_USAGE}_bucket")
    assert gauge_series is not None and "does not export" in gauge_series
