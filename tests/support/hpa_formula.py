"""The HPA controller's replica recommendation (kubernetes pkg/controller/podautoscaler,
replica_calculator.go), for tests and the docs' plot that apply it to recorded series."""

from __future__ import annotations

import math

HPA_SYNC_SECONDS = 15
"""kube-controller-manager's --horizontal-pod-autoscaler-sync-period default."""
HPA_TOLERANCE = 0.1
"""--horizontal-pod-autoscaler-tolerance default: no change while within 10 % of the target."""


def desired_replicas(current: int, average: float, target: float) -> int:
    """ceil(current × average / target) for an AverageValue Pods metric, unchanged within tolerance."""
    ratio = average / target
    if abs(ratio - 1) <= HPA_TOLERANCE:
        return current
    return math.ceil(current * ratio)
