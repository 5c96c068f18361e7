"""A model at zero replicas: how long its first request waits, and how long the router holds it.

The wake is the time from the first request for a model at zero to its first token. The router
holds the request (components/router.py, `hold_arguments`) and counts each held attempt; Prometheus
scrapes that count, KEDA's operator sees it on its next poll and scales the workload 0 -> 1 itself
(activation is KEDA's, not the HPA's), the pod starts as any new replica does
(domain/capacity/time_to_serve.py, from the measured start-up in domain/catalogue/startup_timings.yaml),
the router's Kubernetes discovery adds the Ready pod, and the held request's next retry reaches it.

Two cases, as for any new replica: a GPU node with room (`warm_node`), or none, so the Cluster
Autoscaler adds one (`new_node`). Which one a wake should expect depends on the model's GPU group:
with `min_size: 0` the group may itself be at zero when the request comes. The hold is derived from
the expected case (× startup.safety_factor) unless the stack sets `autoscaling.wake_hold_seconds`,
and every timeout on the request's path must be at least that long (`wake_problems`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from domain.capacity.time_to_serve import ServingTimes, Step, TimeToServe
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig

HOLD_INITIAL_BACKOFF_MS = 500
HOLD_MAX_BACKOFF_MS = 2000
HOLD_BACKOFF_MULTIPLIER = 2
"""The router's retry schedule while it holds a request for a model at zero: 0.5, 1, 2, 2, 2 ... s,
so a held request reaches a replica at most 2 s after the router knows it (vllm-router 0.1.17
retries its own `No available workers` 503 with this backoff)."""

HOLD_ROUNDING_SECONDS = 5

Case = Literal["warm_node", "new_node"]


@dataclass(frozen=True)
class WakePlan:
    model: str
    scales_to_zero: bool
    warm_node: tuple[Step, ...]
    """First request -> first token when a GPU node has room for the replica."""
    new_node: tuple[Step, ...]
    """The same when the Cluster Autoscaler must add a node first."""
    expected_case: Case
    """`new_node` when the model's GPU group may be at zero (min_size 0), else `warm_node`."""
    hold_seconds: int
    """How long the router holds a request before answering 503."""
    hold_source: str
    warm_replica_gpu_hours_per_day: int
    """What keeping one replica instead (min_replicas 1) would hold around the clock."""
    idle_group_gpu_hours_per_day: int
    """GPUs the model's group keeps at its min_size whatever the models do (0 when it can reach zero)."""

    def seconds(self, case: Case) -> float:
        return _total(self.warm_node if case == "warm_node" else self.new_node)

    @property
    def expected_seconds(self) -> float:
        return self.seconds(self.expected_case)


def _total(steps: tuple[Step, ...]) -> float:
    return sum(step.seconds for step in steps)


def _wake_signal(model: ModelConfig, config: PlatformConfig) -> list[Step]:
    scrape = config.monitoring.scrape_interval_seconds
    polling = model.autoscaling.keda_polling_interval_seconds
    return [
        Step(
            "Prometheus scrapes the router's held requests",
            scrape,
            f"monitoring.scrape_interval_seconds ({scrape} s): each held attempt counts "
            "vllm_router_request_errors_total{error_type=no_available_workers}",
            "signal",
        ),
        Step(
            "KEDA sees the demand and scales 0 -> 1",
            polling,
            f"autoscaling.keda_polling_interval_seconds ({polling} s): the operator activates the "
            "workload itself on a poll above activationThreshold",
            "signal",
        ),
    ]


def _router_reaches_pod() -> Step:
    return Step(
        "the router's discovery adds the Ready pod; the held request's next retry reaches it",
        HOLD_MAX_BACKOFF_MS / 1000,
        f"the hold's longest backoff ({HOLD_MAX_BACKOFF_MS} ms); vllm-router's Kubernetes discovery "
        "watches the pods, so it adds a Ready pod at once",
        "pod",
    )


def _steps_after_signal(times: TimeToServe) -> list[Step]:
    """The node and pod steps of a new replica (its own signal steps are the HPA's, not a wake's)."""
    return [step for step in times.steps if step.stage != "signal"]


def wake_plan(
    model: ModelConfig, config: PlatformConfig, serving: ServingTimes, gpu_group: str | None = None
) -> WakePlan:
    """The wake of `model` on `gpu_group` (default: its own), which need not scale to zero: the plan
    can say what its wake would be."""
    signal = _wake_signal(model, config)
    warm = (*signal, *_steps_after_signal(serving.warm_node), _router_reaches_pod())
    new = (*signal, *_steps_after_signal(serving.new_node), _router_reaches_pod())
    group = config.node_groups.gpu[gpu_group or model.gpu_group]
    expected: Case = "new_node" if group.min_size == 0 else "warm_node"
    expected_seconds = _total(new if expected == "new_node" else warm)
    configured = model.autoscaling.wake_hold_seconds
    if configured is not None:
        hold, source = configured, "autoscaling.wake_hold_seconds"
    else:
        factor = model.startup.safety_factor
        hold = derived_hold_seconds(expected_seconds, factor)
        source = (
            f"derived: the {expected.replace('_', ' ')} wake ({expected_seconds:.0f} s) x "
            f"startup.safety_factor ({factor:g}), rounded up to {HOLD_ROUNDING_SECONDS} s"
        )
    return WakePlan(
        model=model.name,
        scales_to_zero=model.scales_to_zero,
        warm_node=warm,
        new_node=new,
        expected_case=expected,
        hold_seconds=hold,
        hold_source=source,
        warm_replica_gpu_hours_per_day=24 * model.gpus_per_group,
        idle_group_gpu_hours_per_day=24 * group.min_size * group.min_gpus_per_node,
    )


def derived_hold_seconds(expected_seconds: float, safety_factor: float) -> int:
    return HOLD_ROUNDING_SECONDS * math.ceil(expected_seconds * safety_factor / HOLD_ROUNDING_SECONDS)


def hold_attempts(hold_seconds: int) -> int:
    """`--retry-max-retries` of the model's router (vllm-router counts attempts: N of them are N - 1
    backoffs) that holds a request about `hold_seconds`: backoffs of 0.5, 1, then 2 s each (the
    schedule above, no jitter).

    Each attempt of the front router holds the whole hold: the front counts a model router's 503 as
    a failure and, with 10 in a row, opens its circuit for 60 s; a hold split over the front's attempts
    would let a burst of held requests open it mid-wake (measured: tests/e2e/test_scale_to_zero.py,
    and `--disable-circuit-breaker` does not reach workers registered through its API, as the
    registrar registers them). So past the hold a request gets 503 after between one hold and
    `router.max_retries` holds (the front's retries; fewer once its circuit is open)."""
    ramp = [HOLD_INITIAL_BACKOFF_MS / 1000]
    while ramp[-1] * HOLD_BACKOFF_MULTIPLIER < HOLD_MAX_BACKOFF_MS / 1000:
        ramp.append(ramp[-1] * HOLD_BACKOFF_MULTIPLIER)
    backoffs = len(ramp)
    if hold_seconds > sum(ramp):
        backoffs += math.ceil((hold_seconds - sum(ramp)) / (HOLD_MAX_BACKOFF_MS / 1000))
    return backoffs + 1


def wake_problems(model: ModelConfig, index: int, config: PlatformConfig, wake: WakePlan) -> list[Problem]:
    """A to-zero model's hold shorter than its predicted wake, or a timeout on the request's path
    shorter than the hold: either would turn a wake into a failed request."""
    if not model.scales_to_zero:
        return []
    expected = wake.expected_seconds
    case = wake.expected_case.replace("_", " ")
    problems = []
    derived = derived_hold_seconds(expected, model.startup.safety_factor)
    if model.autoscaling.wake_hold_seconds is not None and wake.hold_seconds < expected:
        problems.append(
            Problem(
                ("models", index, "autoscaling", "wake_hold_seconds"),
                wake.hold_seconds,
                f"shorter than the model's predicted wake on a {case} ({expected:.0f} s, `vllm-platform "
                "plan`): the first requests would get 503 before a replica is Ready; raise it to at least "
                f"{math.ceil(expected)} or leave it unset (derived: {derived} s)",
            )
        )
    # The front's request to the model's router lasts one hold; the client's connection, idle while a
    # request is held, up to the front's attempts times it when no replica comes (hold_attempts).
    longest = wake.hold_seconds * config.router.max_retries
    timeouts = [
        (
            ("router", "request_timeout_seconds"),
            config.router.request_timeout_seconds,
            "the router",
            wake.hold_seconds,
            "the hold",
        ),
    ]
    if config.ingress.enabled:
        timeouts.append(
            (
                ("ingress", "idle_timeout_seconds"),
                config.ingress.idle_timeout_seconds,
                "the load balancer",
                longest,
                f"router.max_retries ({config.router.max_retries}) x the hold, the longest a held "
                "request stays silent before its 503",
            )
        )
    for path, value, who, least, what in timeouts:
        if value < least:
            problems.append(
                Problem(
                    path,
                    value,
                    f"shorter than {what} of model '{model.name}' ({least} s; hold {wake.hold_seconds} s, "
                    f"{wake.hold_source}): {who} would cut a held request before it is answered; raise it "
                    f"to at least {least}, or lower models[{index}].autoscaling.wake_hold_seconds",
                )
            )
    return problems
