"""The recorded /metrics the alert and autoscaling tests build their series from
(tests/data/vllm-metrics/, bench/metrics/capture_vllm_metrics.py) against the live vLLM 0.32.0
server: a family renamed or a label dropped in the pinned vLLM fails here, and with it the
recording must be captured again."""

from __future__ import annotations

import re
from collections import defaultdict

import httpx
import pytest

from tests.support.promql_names import EXPOSITION
from tests.support.vllm_server import RunningVllmServer

pytestmark = pytest.mark.e2e

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? ")
_LABEL_NAME = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def label_names_by_series(text: str) -> dict[str, set[tuple[str, ...]]]:
    """Series name -> the sets of label names it is exported with (vLLM's and the API server's)."""
    found: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and (match["name"].startswith(("vllm:", "http_requests_total"))):
            found[match["name"]].add(tuple(sorted(_LABEL_NAME.findall(match["labels"] or ""))))
    return found


def test_the_live_server_exports_every_recorded_series_with_the_same_labels(
    served_one_request: RunningVllmServer,
) -> None:
    live = label_names_by_series(httpx.get(f"{served_one_request.base_url}/metrics", timeout=10).text)
    recorded = label_names_by_series(EXPOSITION.read_text())
    assert len(recorded) > 100
    missing = {name for name in recorded if name not in live}
    assert missing == set(), (
        "the pinned vLLM no longer exports these; re-run bench/metrics/capture_vllm_metrics.py"
    )
    changed = {name: (recorded[name], live[name]) for name in recorded if not recorded[name] <= live[name]}
    assert changed == {}, "label names differ (recorded, live)"
