"""Probe, drain and rollout budgets of a vLLM pod (pure functions of the typed config and the plan).

How they fit together (docs/serving.md, "Probes, drain and rollouts"):

    start:  init container (preload) → image pull → startupProbe, failureThreshold × period ≥ the
            planner's startup budget → readiness and liveness on /health
    stop:   preStop sleep (load balancers stop sending) → SIGTERM → vLLM --shutdown-timeout lets
            in-flight streams finish → exit; terminationGracePeriodSeconds covers both plus a margin
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from domain.config.engine import DrainConfig
from domain.config.models import ModelConfig
from domain.rollout_pods import peak_pods

HEALTH_PATH = "/health"
PORT_NAME = "http"

EXIT_MARGIN_SECONDS = 15
"""After the shutdown timeout vLLM still stops its engine-core processes and frees GPU memory;
SIGKILL in the middle of that can leave a GPU unusable until the node's driver resets it."""

NODE_PROVISIONING_SECONDS = 600
"""A replica may wait for a GPU node: launch, join, driver and device-plugin registration take 3–8
minutes on EKS GPU AMIs; the rollout deadline allows that on top of the startup budget."""


def startup_probe(budget_seconds: int, period_seconds: int, timeout_seconds: int) -> dict[str, Any]:
    """A startupProbe that gives the server at least `budget_seconds` to come up, not a guess.

    Kubernetes restarts the container after failureThreshold × periodSeconds without one success,
    so the threshold is the budget divided by the period, rounded up.
    """
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_seconds,
        "timeoutSeconds": timeout_seconds,
        "failureThreshold": max(1, math.ceil(budget_seconds / period_seconds)),
    }


def readiness_probe(model: ModelConfig) -> dict[str, Any]:
    probes = model.probes
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": probes.readiness_period_seconds,
        "timeoutSeconds": probes.timeout_seconds,
        "failureThreshold": probes.readiness_failure_threshold,
        "successThreshold": 1,
    }


def liveness_probe(model: ModelConfig) -> dict[str, Any]:
    probes = model.probes
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": probes.liveness_period_seconds,
        "timeoutSeconds": probes.timeout_seconds,
        "failureThreshold": probes.liveness_failure_threshold,
    }


def termination_grace_period_seconds(drain: DrainConfig) -> int:
    """Strictly longer than preStop sleep + vLLM's shutdown timeout, so neither is cut short."""
    return drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds + EXIT_MARGIN_SECONDS


def pre_stop_hook(drain: DrainConfig) -> dict[str, Any] | None:
    """The kubelet's own sleep action (beta and on by default since Kubernetes 1.30, every version
    this stack supports), so the hook does not depend on a `sleep` binary in the image.
    A zero sleep is no hook: zero-second sleep actions need a newer feature gate."""
    if drain.pre_stop_sleep_seconds == 0:
        return None
    return {"preStop": {"sleep": {"seconds": drain.pre_stop_sleep_seconds}}}


def load_balancer_deregistration_delay_seconds(drain: DrainConfig) -> int:
    """How long the ALB keeps connections to a deregistered pod open: the whole drain, so a stream
    still running when vLLM is told to stop is not cut by the load balancer first."""
    return drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds


@dataclass(frozen=True)
class RolloutStrategy:
    max_surge: int
    max_unavailable: int

    def as_spec(self) -> dict[str, Any]:
        return {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": self.max_surge, "maxUnavailable": self.max_unavailable},
        }


def replica_floor(model: ModelConfig) -> int:
    """The fewest replicas the model runs with: fixed count, or the autoscaler's minimum."""
    return model.autoscaling.min_replicas if model.autoscaling.enabled else model.replicas


def rollout_strategy(model: ModelConfig) -> RolloutStrategy:
    """One pod at a time, and never an outage of a single-replica model unless the stack asks for it.

    With two or more replicas, replace in place (maxSurge 0, maxUnavailable 1): a surge pod needs a
    free GPU set that scarce GPU node groups rarely have, and a rollout waiting on one stalls while
    the old pods keep serving — in place, the freed GPUs go straight to the new pod and capacity
    dips by one replica. With one replica (or an autoscaler that may be at one), in place would take
    the model down for a whole startup budget, so surge one (maxSurge 1, maxUnavailable 0) and
    reserve that GPU set in the namespace quota (`gpu_quota`) — unless `rollout.replace_in_place`
    says to replace in place anyway: at max replicas on a full group a surge pod has no GPU to
    start on, and the update stalls (`rollouts.rolling_surge_problems` refuses that stack).
    """
    if replica_floor(model) >= 2 or model.rollout.replace_in_place:
        return RolloutStrategy(max_surge=0, max_unavailable=1)
    return RolloutStrategy(max_surge=1, max_unavailable=0)


def gpu_quota(model: ModelConfig) -> int:
    """`requests.nvidia.com/gpu` for the model's namespace: the most pods at once, plus one GPU set.

    The most pods are the most replicas, or for a canary the stable plus canary pods at its peak
    (`peak_replicas`: one more). The extra set is for the surge pod of a single-replica
    rollout, and is needed even with maxSurge 0: a pod counts against quota until it has finished
    terminating, and the Deployment (or Rollout) creates the replacement while the old pod drains
    (up to the grace period). Without it a rollout at max replicas would be refused by the quota
    and back off instead of waiting. `peak_pods` counts both, for the canary's room check too.
    """
    # A multi-node replica (issue 42) is a group of nodes_per_replica pods, replaced as a whole.
    return peak_pods(model) * model.gpus_per_replica * model.nodes_per_replica


def progress_deadline_seconds(startup_budget_seconds: int) -> int:
    """Deployment progressDeadlineSeconds: a new pod may wait for a GPU node, then start."""
    return startup_budget_seconds + NODE_PROVISIONING_SECONDS


def rollout_timeout_seconds(model: ModelConfig, startup_budget_seconds: int) -> int:
    """How long `pulumi up` waits for the Deployment: one pod at a time, each within the deadline."""
    return progress_deadline_seconds(startup_budget_seconds) * max(1, model.max_replicas)
