"""Measured start-up phases of a vLLM replica (startup_timings.yaml beside this file).

One data file holds every measured start-up number and its source; the planner's expected time to
a serving replica (domain/capacity/time_to_serve.py) reads only this module. Replacing the figures
with a new benchmark run means editing that file alone.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

TIMINGS_FILE = Path(__file__).with_name("startup_timings.yaml")

# A phase sum may differ from the measured total by rounding of the quoted figures.
_ROUNDING_SECONDS = 1.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timing(_Strict):
    seconds: Annotated[float, Field(ge=0)]
    source: Annotated[str, Field(min_length=8)]
    """Where the number comes from: a run, a log line, a default, or `derived: ...` / `estimate ...`."""


class StartMeasurement(_Strict):
    summary: str
    total_seconds: Timing
    """Process start to /health answering 200."""
    phases: dict[str, Timing]
    """In the order they happen; they add up to the total."""

    @model_validator(mode="after")
    def _phases_add_up(self) -> StartMeasurement:
        parts = sum(phase.seconds for phase in self.phases.values())
        if abs(parts - self.total_seconds.seconds) > _ROUNDING_SECONDS:
            raise ValueError(
                f"the phases add up to {parts:g} s but the total is {self.total_seconds.seconds:g} s; "
                "add a `derived` phase for the rest"
            )
        return self


class StartupTimings(_Strict):
    gpu: str
    vllm_version: str
    model_shape: str
    tensor_parallel_size: Annotated[int, Field(ge=1)]
    weights: str
    """`dummy` (vLLM's dummy loader: no checkpoint read) or `real`."""
    starts: dict[str, StartMeasurement]
    """`cold` (nothing cached), `warm_caches` (caches from an earlier start, compile recomputed) and
    `warm_pod` (caches and HOME as a pod has them: what the planner uses) at least."""
    outside_the_pod: dict[str, Timing]
    """Windows the stack does not set: controller defaults and estimates."""

    @model_validator(mode="after")
    def _has_what_the_planner_reads(self) -> StartupTimings:
        missing = {"cold", "warm_caches", "warm_pod"} - set(self.starts)
        missing |= {"hpa_sync", "cluster_autoscaler_scan", "gpu_node_ready"} - set(self.outside_the_pod)
        if missing:
            raise ValueError(f"{TIMINGS_FILE.name} lacks {', '.join(sorted(missing))}")
        return self

    @property
    def measured_on(self) -> str:
        return (
            f"{self.gpu}, vLLM {self.vllm_version}, {self.model_shape} shape, "
            f"TP {self.tensor_parallel_size}, {self.weights} weights"
        )


@cache
def startup_timings() -> StartupTimings:
    return StartupTimings.model_validate(yaml.safe_load(TIMINGS_FILE.read_text()))
