"""Every signal an autoscaler or alert reads is one the stack produces, at an interval its queries can
resolve (issue 40). Run by `validate` with the other cross-component checks (infra/stack_checks.py).

- Produced: what makes each exporter's series exist under the stack's monitoring settings is
  `components.scrape.series_gaps`; the autoscaling metrics are checked against it where they are
  listed (components/adapter_rules.py), and here the readers that are not listed there: the trigger
  that wakes a model at zero (the router's series), a canary's analysis and the platform's alerts and
  dashboards (vLLM's own series).
- Resolvable: `rate()`, `increase()` and the other range functions need at least two samples inside
  their range, and Prometheus scrapes every `monitoring.scrape_interval_seconds`, so every range the
  stack renders into a KEDA trigger or an alert rule must be at least twice that. With less, the
  function sees one sample (or none) and reads nothing while requests flow: a to-zero model's demand
  reads 0 and KEDA takes its last replica mid-use. (A canary's analysis window is checked by
  components/rollouts.py with the same rule.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from domain.config.errors import Problem
from domain.config.platform import PlatformConfig

SAMPLES_A_RANGE_NEEDS = 2
"""`rate()`/`increase()`/`deriv()` extrapolate between the first and last sample in their range."""

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# A range selector `[5m]`, `[1h30m]`; not a subquery `[5m:30s]`, whose points are evaluations (at the
# subquery's own step), not scrapes.
_RANGE = re.compile(r"\[((?:\d+(?:ms|s|m|h|d|w|y))+)\]")
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def range_seconds(query: str) -> Iterator[tuple[str, float]]:
    """Every range selector of a PromQL query, as written and in seconds."""
    for match in _RANGE.finditer(query):
        seconds = sum(int(number) * _UNIT_SECONDS[unit] for number, unit in _PART.findall(match.group(1)))
        yield match.group(0), seconds


def shortest_range(scrape_interval_seconds: int) -> int:
    return SAMPLES_A_RANGE_NEEDS * scrape_interval_seconds


def query_window_problems(config: PlatformConfig) -> list[Problem]:
    """Every range of every KEDA trigger and alert rule the stack renders, against the scrape interval."""
    from components.adapter_rules import SIGNALS
    from components.alert_rules import alert_rule_groups
    from components.autoscaling import ROUTER_DEMAND_TRIGGER, scaled_object_spec
    from components.monitoring import prometheus_url
    from components.rollouts import workload_reference

    if not config.monitoring.enabled:
        return []
    scrape = config.monitoring.scrape_interval_seconds
    least = shortest_range(scrape)
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        autoscaling = model.autoscaling
        known = all(metric.metric in SIGNALS for metric in autoscaling.metrics)
        if not (autoscaling.enabled and autoscaling.backend == "keda" and known):
            continue  # an unknown metric is autoscaling_metric_problems' to report
        spec = scaled_object_spec(
            autoscaling,
            workload_reference(model, "vllm"),
            model.namespace,
            prometheus_url(config.monitoring),
            model_name=model.name,
        )
        metric_names = [SIGNALS[metric.metric].custom_metric_name for metric in autoscaling.metrics]
        for trigger in spec["triggers"]:
            for written, seconds in range_seconds(trigger["metadata"]["query"]):
                if seconds >= least:
                    continue
                if trigger["name"] == ROUTER_DEMAND_TRIGGER:
                    path: tuple[str | int, ...] = ("models", index, "autoscaling", "idle_seconds_before_zero")
                    value: Any = autoscaling.idle_seconds_before_zero
                    fix = (
                        f"raise it to at least {least}, or lower monitoring.scrape_interval_seconds to "
                        f"{int(seconds) // SAMPLES_A_RANGE_NEEDS} or less"
                    )
                    what = "the idle window of the trigger that wakes this model and keeps it up"
                else:
                    position = metric_names.index(trigger["name"])
                    path = ("models", index, "autoscaling", "metrics", position, "metric")
                    value = autoscaling.metrics[position].metric
                    highest = int(seconds) // SAMPLES_A_RANGE_NEEDS
                    fix = f"lower monitoring.scrape_interval_seconds to {highest} or less"
                    what = f"KEDA trigger {trigger['name']}"
                problems.append(Problem(path, value, _too_short(what, written, seconds, scrape, fix)))
    groups = alert_rule_groups(
        config.models,
        config.monitoring.alerts,
        dcgm_exporter=config.addons.dcgm_exporter.enabled,
        tenants=config.tenants,
    )
    for group in groups:
        for rule in group["rules"]:
            for written, seconds in range_seconds(rule["expr"]):
                if seconds < least:
                    fix = f"lower it to {int(seconds) // SAMPLES_A_RANGE_NEEDS} or less"
                    message = _too_short(f"alert {rule['alert']}", written, seconds, scrape, fix)
                    problems.append(Problem(("monitoring", "scrape_interval_seconds"), scrape, message))
    return problems


def _too_short(what: str, written: str, seconds: float, scrape: int, fix: str) -> str:
    return (
        f"{what} reads a range of {written} ({seconds:g} s), and Prometheus scrapes every {scrape} s "
        f"(monitoring.scrape_interval_seconds): rate()/increase() need at least {SAMPLES_A_RANGE_NEEDS} "
        f"samples in their range, so it would read nothing while requests flow (the range must be at "
        f"least {SAMPLES_A_RANGE_NEEDS} x the scrape interval, {SAMPLES_A_RANGE_NEEDS * scrape} s); {fix}"
    )


def signal_source_problems(config: PlatformConfig) -> list[Problem]:
    """The readers of a signal that no `autoscaling.metrics` entry names, against what the stack
    produces (`series_gaps`; the listed metrics are checked in components/adapter_rules.py)."""
    from components.adapter_rules import SIGNALS
    from components.scrape import series_gaps
    from components.vllm_arguments import disables_statistics, flag_name

    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        gaps = series_gaps(config, model)
        if not config.monitoring.enabled:
            continue  # autoscaling and canaries are refused once for it, at their own keys
        if model.scales_to_zero and "router" in gaps:
            problems.append(
                Problem(
                    ("models", index, "autoscaling", "min_replicas"),
                    0,
                    "the trigger that wakes a model at zero reads its router's held and routed requests "
                    "(vllm_router_request_errors_total and vllm_router_requests_total with "
                    f'model="{model.name}"); that series {gaps["router"]}. Without it the model never '
                    "wakes; or set min_replicas: 1",
                )
            )
        flag = disables_statistics(model.vllm.extra_args)
        if "vllm" in gaps and flag is not None:
            readers = ["the platform's dashboards"]
            if config.monitoring.alerts.enabled:
                readers.insert(0, "its alerts (latency, errors, queue, KV cache)")
            if model.rollout.strategy == "canary":
                readers.insert(0, "its canary analysis")
            scaled_on = [m.metric for m in model.autoscaling.metrics if SIGNALS[m.metric].exporter == "vllm"]
            if model.autoscaling.enabled and scaled_on:
                readers.insert(0, f"its autoscaler ({', '.join(scaled_on)})")
            position = next(i for i, token in enumerate(model.vllm.extra_args) if flag_name(token) == flag)
            problems.append(
                Problem(
                    ("models", index, "vllm", "extra_args", position),
                    flag,
                    f"with {flag} vLLM keeps no statistics and exports none of its vllm:* series, which "
                    f"{', '.join(readers[:-1])} and {readers[-1]} read: remove it",
                )
            )
    return problems
