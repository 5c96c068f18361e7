"""Which series a PromQL expression reads, and whether the pinned exporters export them.

The expression is parsed by promql-parser (GreptimeTeam's Rust PromQL parser, a test dependency);
`promtool check rules` parses the same expressions in the tests too, so a query Prometheus itself
rejects fails there. Grafana's variables are substituted first (`$__rate_interval` -> 5m, any other
`$var` -> `.+`).

Known series: vLLM 0.32.0 (domain/vllm_metrics.py, checked against a real server by tests/e2e),
vLLM's API-server HTTP families (tests/data/vllm-metrics/exposition.txt), the DCGM exporter's
default counters (domain/dcgm_metrics.py), the kube-state-metrics series this stack reads
(domain/kube_state_metrics.py), the pinned vllm-router's families (domain/router_metrics.py) and the
per-tenant series the API-key middleware adds to vLLM's /metrics (domain/tenant_metrics.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import promql_parser

from domain import dcgm_metrics, kube_state_metrics, router_metrics, tenant_metrics, vllm_metrics

EXPOSITION = Path(__file__).resolve().parents[1] / "data" / "vllm-metrics" / "exposition.txt"
_DURATION_VARIABLES = re.compile(
    r"\$(__rate_interval|__interval|__range|interval)\b|\$\{(__rate_interval|__interval|__range|interval)\}"
)
_VARIABLE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")


def vllm_http_series() -> frozenset[str]:
    """The API server's non-vLLM-prefixed series the recording has (http_requests_total, ...)."""
    names = set()
    for line in EXPOSITION.read_text().splitlines():
        if line.startswith("http_"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return frozenset(names)


def exported_by(name: str) -> str | None:
    """The exporter that exports series `name`, or None."""
    if name.startswith("vllm:"):
        return "vllm" if vllm_metrics.is_exported(name) else None
    if name in vllm_http_series():
        return "vllm"
    if name in dcgm_metrics.EXPORTED_SERIES:
        return "dcgm-exporter"
    if name in kube_state_metrics.EXPORTED_SERIES:
        return "kube-state-metrics"
    if name in router_metrics.EXPORTED_SERIES:
        return "vllm-router"
    if name in tenant_metrics.EXPORTED_SERIES:
        return "vllm-platform-auth"
    return None


def substitute_grafana_variables(expr: str) -> str:
    return _VARIABLE.sub(".+", _DURATION_VARIABLES.sub("5m", expr))


def series_names(expr: str) -> set[str]:
    """Every metric name a selector in `expr` names (by name or by `__name__="..."`)."""
    names: set[str] = set()
    for node in _walk(promql_parser.parse(substitute_grafana_variables(expr))):
        if type(node).__name__ == "VectorSelector":
            if node.name:
                names.add(node.name)
            for matcher in node.matchers.matchers:
                if matcher.name == "__name__":
                    names.add(matcher.value)
    return names


def _walk(node: object) -> Iterator[object]:
    yield node
    for attribute in ("lhs", "rhs", "expr", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, (int, float, str)):
            yield from _walk(child)
    for child in getattr(node, "args", None) or []:
        yield from _walk(child)


def unknown_series(expr: str) -> set[str]:
    return {name for name in series_names(expr) if exported_by(name) is None}
