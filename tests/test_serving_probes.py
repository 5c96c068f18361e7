"""Probe, drain and rollout budgets of vLLM pods: pure functions of the typed config and the plan."""

from __future__ import annotations

import math

import pytest

from components import probes
from domain.config.autoscaling import AutoscalingConfig
from domain.config.engine import DrainConfig
from domain.config.models import ModelConfig

DRAINS = [
    DrainConfig(),
    DrainConfig(pre_stop_sleep_seconds=0, shutdown_timeout_seconds=0),
    DrainConfig(pre_stop_sleep_seconds=300, shutdown_timeout_seconds=3600),
    DrainConfig(pre_stop_sleep_seconds=5, shutdown_timeout_seconds=600),
]


def a_model(**fields: object) -> ModelConfig:
    base: dict[str, object] = {
        "name": "m",
        "gpu_group": "g",
        "source": {"s3_uri": "s3://bucket/m/r1/", "revision": "r1"},
        "architecture": {"preset": "llama-3.1-8b"},
    }
    return ModelConfig.model_validate({**base, **fields})


@pytest.mark.parametrize(
    "drain", DRAINS, ids=lambda d: f"sleep{d.pre_stop_sleep_seconds}-shutdown{d.shutdown_timeout_seconds}"
)
def test_grace_period_exceeds_prestop_plus_shutdown_timeout(drain: DrainConfig) -> None:
    grace = probes.termination_grace_period_seconds(drain)
    assert grace > drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds
    assert (
        grace - (drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds) == probes.EXIT_MARGIN_SECONDS
    )


@pytest.mark.parametrize("drain", DRAINS, ids=lambda d: f"sleep{d.pre_stop_sleep_seconds}")
def test_load_balancer_keeps_connections_open_for_the_whole_drain(drain: DrainConfig) -> None:
    delay = probes.load_balancer_deregistration_delay_seconds(drain)
    assert delay == drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds
    assert delay < probes.termination_grace_period_seconds(drain)


def test_prestop_uses_the_kubelet_sleep_action_and_is_left_out_when_zero() -> None:
    assert probes.pre_stop_hook(DrainConfig(pre_stop_sleep_seconds=20)) == {
        "preStop": {"sleep": {"seconds": 20}}
    }
    assert probes.pre_stop_hook(DrainConfig(pre_stop_sleep_seconds=0)) is None


@pytest.mark.parametrize(
    ("budget", "period"), [(1, 10), (600, 10), (601, 10), (1234, 7), (59, 60), (3600, 1)]
)
def test_startup_probe_allows_the_whole_budget_and_barely_more(budget: int, period: int) -> None:
    probe = probes.startup_probe(budget, period, timeout_seconds=5)
    threshold = probe["failureThreshold"]
    assert threshold * period >= budget
    assert (threshold - 1) * period < budget
    assert probe["periodSeconds"] == period
    assert probe["httpGet"] == {"path": "/health", "port": "http"}
    assert "initialDelaySeconds" not in probe


def test_readiness_and_liveness_come_from_the_model_probe_settings() -> None:
    model = a_model(
        probes={
            "readiness_period_seconds": 7,
            "readiness_failure_threshold": 2,
            "liveness_period_seconds": 31,
            "liveness_failure_threshold": 9,
            "timeout_seconds": 3,
        }
    )
    readiness, liveness = probes.readiness_probe(model), probes.liveness_probe(model)
    assert (readiness["periodSeconds"], readiness["failureThreshold"], readiness["timeoutSeconds"]) == (
        7,
        2,
        3,
    )
    assert (liveness["periodSeconds"], liveness["failureThreshold"], liveness["timeoutSeconds"]) == (31, 9, 3)
    for probe in (readiness, liveness):
        assert probe["httpGet"]["path"] == "/health"
        assert "initialDelaySeconds" not in probe


def test_single_replica_rolls_out_with_a_surge_pod_instead_of_an_outage() -> None:
    strategy = probes.rollout_strategy(a_model(replicas=1))
    assert (strategy.max_surge, strategy.max_unavailable) == (1, 0)


def test_several_replicas_are_replaced_in_place_one_at_a_time() -> None:
    strategy = probes.rollout_strategy(a_model(replicas=3))
    assert (strategy.max_surge, strategy.max_unavailable) == (0, 1)


@pytest.mark.parametrize(("min_replicas", "expected"), [(1, (1, 0)), (2, (0, 1))])
def test_autoscaled_models_choose_the_strategy_by_their_minimum(
    min_replicas: int, expected: tuple[int, int]
) -> None:
    model = a_model(
        replicas=5, autoscaling=AutoscalingConfig(enabled=True, min_replicas=min_replicas, max_replicas=6)
    )
    strategy = probes.rollout_strategy(model)
    assert (strategy.max_surge, strategy.max_unavailable) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"replicas": 1}, 2),
        ({"replicas": 3, "gpus_per_replica": 2}, 8),
        ({"replicas": 0}, 1),
        (
            {
                "replicas": 1,
                "gpus_per_replica": 4,
                "autoscaling": {"enabled": True, "min_replicas": 1, "max_replicas": 4},
            },
            20,
        ),
    ],
)
def test_gpu_quota_covers_max_replicas_plus_one_gpu_set(fields: dict[str, object], expected: int) -> None:
    assert probes.gpu_quota(a_model(**fields)) == expected


def test_rollout_deadline_allows_a_new_gpu_node_and_the_startup_budget() -> None:
    assert probes.progress_deadline_seconds(900) == 900 + probes.NODE_PROVISIONING_SECONDS
    model = a_model(autoscaling={"enabled": True, "min_replicas": 1, "max_replicas": 4})
    assert probes.rollout_timeout_seconds(model, 900) == 4 * probes.progress_deadline_seconds(900)
    assert probes.rollout_timeout_seconds(a_model(replicas=0), 900) == probes.progress_deadline_seconds(900)


def test_startup_threshold_rounds_up_not_down() -> None:
    assert probes.startup_probe(1001, 10, 5)["failureThreshold"] == math.ceil(1001 / 10) == 101
