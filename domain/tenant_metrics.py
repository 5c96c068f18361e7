"""The per-tenant usage series (issue 26) that the API-key middleware
(components/pod_files/vllm_platform_auth.py, `TenantMetrics`) registers in each vLLM server and vLLM
serves on its own /metrics, for the alert, dashboard and name checks.

tests/test_serving_auth.py registers the middleware's metrics in a fresh prometheus_client registry
(in one process and in multiprocess mode) and tests/e2e/test_tenants.py reads them from a real vLLM
0.32.0 server's /metrics: both compare with the names and labels here. The tenant label is the
tenant's name from the stack, never its key; `model` is a served name of the pod, or `other`.
"""

from __future__ import annotations

from collections.abc import Mapping

TENANT_REQUESTS = "vllm_platform_tenant_requests_total"
"""Counter: a tenant's POST requests that reached vLLM, by served name and HTTP status code."""
TENANT_TOKENS = "vllm_platform_tenant_tokens_total"
"""Counter: tokens of a tenant's requests from vLLM's `usage` (kind `prompt` or `completion`)."""
TENANT_REQUESTS_IN_FLIGHT = "vllm_platform_tenant_requests_in_flight"
"""Gauge: a tenant's requests being answered now (per pod; sum over pods for the tenant's total)."""

SERIES_LABELS: Mapping[str, tuple[str, ...]] = {
    TENANT_REQUESTS: ("tenant", "model", "code"),
    TENANT_TOKENS: ("tenant", "model", "kind"),
    TENANT_REQUESTS_IN_FLIGHT: ("tenant",),
}
EXPORTED_SERIES = frozenset(SERIES_LABELS)
