"""What the pinned vLLM router (vllm-router 0.1.17, domain/versions.py) exports, for autoscaling,
alert and dashboard checks.

Name and Prometheus type of each family a single-model router (the `route-<model>` containers,
components/router.py) serves on its `--prometheus-port`, as recorded from the pinned release by
bench/router/run.sh (`RECORDED_EXPOSITION`; tests/test_autoscaling_router.py reads it back, so a
family missing from that recording fails there). Worker-labelled families carry
`worker="http://<vLLM pod IP>:<port>"`; the router PodMonitor adds `model` (the model's name) to
every series of a model's router.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

RUNNING_REQUESTS = "vllm_router_running_requests"
"""Requests the router has sent to a worker and not finished (gauge, one series per worker)."""

REQUESTS_TOTAL = "vllm_router_requests_total"
"""Requests the router has routed to a worker (counter, per route)."""
REQUEST_ERRORS_TOTAL = "vllm_router_request_errors_total"
"""Failed attempts (counter, per route and `error_type`). With no worker, every attempt of a held
request counts one `error_type="no_available_workers"` (seen from the pinned release with no worker:
tests/e2e/test_scale_to_zero.py); a router that never failed exports no series of it, so it is not in
the recording below."""

RECORDED_EXPOSITION = (
    Path(__file__).resolve().parents[1]
    / "bench"
    / "router"
    / "results"
    / "raw-gpu-32-prefixes"
    / "router-cache_aware-metrics.txt"
)
"""/metrics of a single-model vllm-router 0.1.17 after a load test (bench/router/README.md)."""

EXPORTED_FAMILIES: Mapping[str, str] = {
    "vllm_router_cb_outcomes_total": "counter",
    "vllm_router_policy_decisions_total": "counter",
    "vllm_router_processed_requests_total": "counter",
    "vllm_router_prefix_routing_decisions_total": "counter",
    "vllm_router_requests_total": "counter",
    "vllm_router_kv_routing_inputs_total": "counter",
    "vllm_router_worker_health": "gauge",
    RUNNING_REQUESTS: "gauge",
    "vllm_router_cb_state": "gauge",
    "vllm_router_active_workers": "gauge",
    "vllm_router_generate_duration_seconds": "histogram",
}

EXPORTED_SERIES: frozenset[str] = frozenset(
    {name for name, kind in EXPORTED_FAMILIES.items() if kind != "histogram"}
    | {
        f"{name}{suffix}"
        for name, kind in EXPORTED_FAMILIES.items()
        if kind == "histogram"
        for suffix in ("_bucket", "_sum", "_count")
    }
)
"""Series names as Prometheus stores them (a histogram's `_bucket`, `_sum`, `_count`)."""
