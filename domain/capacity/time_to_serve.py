"""What a user is told besides the startupProbe budget: the expected time to a serving replica.

Two cases, each a list of steps with the seconds expected and where the number comes from:

- `warm_node`: the autoscaler adds a pod on a node that has the image and the model's weights on
  NVMe, with vLLM's compile, Triton and FlashInfer caches warm;
- `new_node`: no node has room, so the Cluster Autoscaler adds one, which boots, pulls the image,
  copies the weights from the shared volume and starts vLLM with the caches of the shared volume.

Measured start-up phases come from one data file (domain/catalogue/startup_timings.yaml); the
autoscaler's windows from the stack's config; the weight read from the capacity plan's storage
speeds. The target (issue 24): a pod on a warm node Ready within 60 s; where the numbers say it is
not, `blockers` names the steps that stand in the way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from domain.capacity.startup import StartupPlan
from domain.catalogue.model_shapes import lookup_preset
from domain.catalogue.startup_timings import StartupTimings, startup_timings
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig

WARM_START = "warm_pod"
"""The measured start of a new replica whose caches an earlier pod wrote, with the pod's constant HOME
(so vLLM's compile-cache key matches and the graphs are loaded): bench/startup, "Wake from zero".
(`warm_caches`, the lab's earlier per-server HOME, recompiled for 22 s; kept for the record.)"""

WARM_POD_READY_TARGET_SECONDS = 60
"""Issue 24: a new pod on a node that has the image, with the caches warm, Ready within a minute."""

Stage = Literal["signal", "node", "pod"]


@dataclass(frozen=True)
class Step:
    name: str
    seconds: float
    """Expected (for a window: the longest it can take)."""
    source: str
    stage: Stage
    """`signal`: the load is seen and replicas raised; `node`: a node is added; `pod`: the pod's own
    start, scheduling to Ready (what the 60 s target is about)."""
    parts: tuple[tuple[str, float], ...] = ()
    """Measured phases inside the step (vLLM's start), so what stands in the way can be named."""


@dataclass(frozen=True)
class TimeToServe:
    case: Literal["warm_node", "new_node"]
    steps: tuple[Step, ...]

    def seconds(self, stage: Stage | None = None) -> float:
        return sum(step.seconds for step in self.steps if stage is None or step.stage == stage)

    @property
    def pod_ready_seconds(self) -> float:
        return self.seconds("pod")


@dataclass(frozen=True)
class AutoscalerWindow:
    name: str
    value: str
    source: str


@dataclass(frozen=True)
class ServingTimes:
    model: str
    warm_node: TimeToServe
    new_node: TimeToServe
    windows: tuple[AutoscalerWindow, ...]
    measured_on: str
    autoscaled: bool
    unlike_the_measurement: str | None = None
    """How this model's placement differs from the measured one (GPU, tensor parallelism), if it does."""

    @property
    def meets_target(self) -> bool:
        return self.warm_node.pod_ready_seconds <= WARM_POD_READY_TARGET_SECONDS

    @property
    def blockers(self) -> tuple[tuple[str, float], ...]:
        """Where a warm pod's time goes when it misses the target, longest first (a measured step by
        its phases); empty when the target is met."""
        if self.meets_target:
            return ()
        pieces = [
            piece
            for step in self.warm_node.steps
            if step.stage == "pod"
            for piece in (step.parts or ((step.name, step.seconds),))
        ]
        return tuple(sorted(pieces, key=lambda piece: -piece[1]))


def _signal_steps(model: ModelConfig, config: PlatformConfig, timings: StartupTimings) -> list[Step]:
    autoscaling = model.autoscaling
    scrape = config.monitoring.scrape_interval_seconds
    steps = [
        Step(
            "Prometheus scrapes the queue",
            scrape,
            f"monitoring.scrape_interval_seconds ({scrape} s): the new value is seen within one interval",
            "signal",
        ),
    ]
    hpa_sync = timings.outside_the_pod["hpa_sync"]
    if autoscaling.backend == "keda":
        steps.append(
            Step(
                "the HPA (KEDA's) reads it",
                hpa_sync.seconds,
                hpa_sync.source + "; KEDA's metrics server queries Prometheus on each read",
                "signal",
            )
        )
    else:
        steps.append(
            Step("the HPA reads it from the Prometheus Adapter", hpa_sync.seconds, hpa_sync.source, "signal")
        )
    stabilization = autoscaling.scale_up_stabilization_seconds
    if stabilization:
        steps.append(
            Step(
                "scale-up stabilization",
                stabilization,
                f"autoscaling.scale_up_stabilization_seconds ({stabilization} s)",
                "signal",
            )
        )
    return steps


def _vllm_start(timings: StartupTimings, key: str, shared_volume: bool) -> Step:
    """vLLM's measured start; a measured weight read is left out, since the plan's own read of the
    model's checkpoint (its own step) stands in for it."""
    measured = timings.starts[key]
    phases = {
        name: phase
        for name, phase in measured.phases.items()
        if not (timings.weights == "real" and name == "weights")
    }
    listed = ", ".join(f"{name} {phase.seconds:g} s" for name, phase in phases.items())
    source = f"startup_timings.yaml {key}: {listed} ({measured.total_seconds.source}"
    if len(phases) < len(measured.phases):
        source += f", less its {measured.phases['weights'].seconds:g} s weight read"
    source += ")"
    name = "vLLM starts, caches warm (to /health)"
    if shared_volume:
        source += (
            "; caches copied from another folder rebuilt FlashInfer's kernels (bench/startup 'copied'), "
            "but every pod mounts the shared caches at the same path, so the same-host figure stands in"
        )
    parts = tuple((f"vLLM {name.replace('_', ' ')}", phase.seconds) for name, phase in phases.items())
    return Step(name, round(sum(seconds for _, seconds in parts), 1), source, "pod", parts)


TORCH_DEFAULT_TIMEOUT_SECONDS = 600
"""PyTorch's default timeout of an NCCL process group's set-up and collectives, which vLLM keeps when
`--distributed-timeout-seconds` is unset."""
CPU_GROUP_DEFAULT_TIMEOUT_SECONDS = 1800
"""PyTorch's default for gloo (CPU) groups, which vLLM keeps when `--cpu-distributed-timeout-seconds`
is unset."""


def group_join_timeout_seconds(model: ModelConfig, startup: StartupPlan, serving: ServingTimes) -> int:
    """How long a multi-node replica's members wait for each other at vLLM's rendezvous and its first
    collectives (`--distributed-timeout-seconds`; issue 50): the plan's start-up skew between a member
    that restarts on a warm node and one that comes up on a new node (the new node's launch, the image
    pull, the preloader's copy and the cold compile: new-node time minus warm-node time) times
    `startup.safety_factor`, plus `startup.group_rendezvous_seconds`; never below PyTorch's 600 s.

    With PyTorch's default a warm member gave up after 600 s while a member on a new node was still
    pulling and copying, and the group was torn down as it formed. The price of a longer timeout is a
    slower NCCL error on a hung collective; the leader's liveness probe on /health catches a hung
    engine first (components/leader_worker_set.py)."""
    skew = max(0.0, serving.new_node.seconds() - serving.warm_node.seconds())
    seconds = math.ceil(skew * startup.safety_factor) + model.startup.group_rendezvous_seconds
    return max(TORCH_DEFAULT_TIMEOUT_SECONDS, seconds)


def serving_times(
    model: ModelConfig,
    config: PlatformConfig,
    startup: StartupPlan,
    timings: StartupTimings | None = None,
    gpu_model: str | None = None,
    karpenter_pool: bool = False,
) -> ServingTimes:
    """Expected time to a serving replica of `model` on a warm node and on a new node (`gpu_model`:
    the GPU it runs on, to say when that is not the one measured)."""
    timings = timings or startup_timings()
    differences = []
    measured = lookup_preset(timings.model_shape)
    if measured is None or model.architecture.resolved() != dict(measured.architecture):
        # Compared by value: explicit numbers equal to the preset plan the same as the preset.
        differences.append(f"is not the {timings.model_shape} shape")
    if gpu_model is not None and gpu_model != timings.gpu:
        differences.append(f"runs on {gpu_model}")
    if model.tensor_parallel_size != timings.tensor_parallel_size:
        differences.append(f"uses tensor parallelism {model.tensor_parallel_size}")
    phases = dict(startup.phases)
    probe = model.startup.probe_period_seconds
    weights = Step(
        "vLLM reads the weights",
        phases["load_weights"],
        "capacity plan: checkpoint size / startup.weight_load_mib_per_second (NVMe) or "
        "shared_volume_mib_per_second (no NVMe), in place of the measured start's own read",
        "pod",
    )
    probe_step = Step(
        "the startupProbe sees /health",
        probe,
        f"startup.probe_period_seconds ({probe} s): the first success comes within one period",
        "pod",
    )
    # Without an autoscaler nothing watches the load: a replica starts when someone raises `replicas`.
    signal = _signal_steps(model, config, timings) if model.autoscaling.enabled else []
    # A multi-node replica is a group: its members start in parallel, then the leader's engine waits
    # at vLLM's rendezvous until every member has joined (the wake of a group from zero included).
    rendezvous: tuple[Step, ...] = ()
    if model.is_multi_node:
        rendezvous = (
            Step(
                "the group's members join the leader's engine",
                float(model.startup.group_rendezvous_seconds),
                f"startup.group_rendezvous_seconds ({model.startup.group_rendezvous_seconds} s, an "
                "allowance not yet measured: docs/multi-node.md)",
                "pod",
            ),
        )
    warm = TimeToServe(
        "warm_node",
        (*signal, weights, _vllm_start(timings, WARM_START, False), *rendezvous, probe_step),
    )
    node_ready = timings.outside_the_pod["gpu_node_ready"]
    if karpenter_pool:
        # Karpenter's launch path (issue 41): its batch window closes, it creates a NodeClaim and
        # launches the instance itself (CreateFleet), no Auto Scaling group in between.
        batch = timings.outside_the_pod["karpenter_batch"]
        seen = Step(
            "Karpenter batches the pending pod and creates a NodeClaim", batch.seconds, batch.source, "node"
        )
    else:
        scan = timings.outside_the_pod["cluster_autoscaler_scan"]
        seen = Step("the Cluster Autoscaler sees the pending pod", scan.seconds, scan.source, "node")
    node_steps = [
        seen,
        Step("the GPU node boots and registers its GPUs", node_ready.seconds, node_ready.source, "node"),
        Step(
            "the vLLM image is pulled",
            phases["image_pull"],
            f"startup.image_pull_seconds ({model.startup.image_pull_seconds} s; the node's pull settings "
            "are in docs/aws.md, 'The vLLM image on a new node')",
            "pod",
        ),
    ]
    if phases.get("copy_to_nvme"):
        node_steps.append(
            Step(
                "the preloader copies the weights to NVMe",
                phases["copy_to_nvme"],
                "capacity plan: checkpoint size / startup.shared_volume_mib_per_second",
                "pod",
            )
        )
    new = TimeToServe(
        "new_node",
        (*signal, *node_steps, weights, _vllm_start(timings, WARM_START, True), *rendezvous, probe_step),
    )
    return ServingTimes(
        model=model.name,
        warm_node=warm,
        new_node=new,
        windows=autoscaler_windows(model, config, timings),
        measured_on=timings.measured_on,
        autoscaled=model.autoscaling.enabled,
        unlike_the_measurement=(
            f"this model {', '.join(differences)}; the start-up figures were measured on "
            f"{timings.measured_on} and stand in until it is measured"
            if differences
            else None
        ),
    )


def autoscaler_windows(
    model: ModelConfig, config: PlatformConfig, timings: StartupTimings
) -> tuple[AutoscalerWindow, ...]:
    """The autoscaler's own windows for this model, beside the start-up times."""
    autoscaling = model.autoscaling
    if not autoscaling.enabled:
        return (AutoscalerWindow("autoscaling", "off", f"models[{model.name}].autoscaling.enabled"),)
    windows = [
        AutoscalerWindow(
            "scrape interval",
            f"{config.monitoring.scrape_interval_seconds} s",
            "monitoring.scrape_interval_seconds",
        ),
        AutoscalerWindow(
            "HPA sync period", f"{timings.outside_the_pod['hpa_sync'].seconds:g} s", "Kubernetes default"
        ),
    ]
    if autoscaling.backend == "keda":
        windows.append(
            AutoscalerWindow(
                "KEDA polling interval",
                f"{autoscaling.keda_polling_interval_seconds} s",
                "autoscaling.keda_polling_interval_seconds (activation from zero and the fallback count)",
            )
        )
    else:
        windows.append(
            AutoscalerWindow(
                "adapter relist interval",
                f"{config.addons.prometheus_adapter.metrics_relist_interval_seconds} s",
                "addons.prometheus_adapter.metrics_relist_interval_seconds (a new pod's series appear "
                "within it)",
            )
        )
    windows += [
        AutoscalerWindow(
            "scale-up",
            f"after {autoscaling.scale_up_stabilization_seconds} s, +{autoscaling.scale_up_pods_per_period} "
            f"or +{autoscaling.scale_up_percent_per_period} %/{autoscaling.scale_up_period_seconds} s",
            "autoscaling.scale_up_stabilization_seconds, then the larger of scale_up_pods_per_period "
            "and scale_up_percent_per_period per scale_up_period_seconds",
        ),
        AutoscalerWindow(
            "scale-down",
            f"after {autoscaling.scale_down_stabilization_seconds} s, "
            f"-{autoscaling.scale_down_pods_per_period}/{autoscaling.scale_down_period_seconds} s",
            "autoscaling.scale_down_stabilization_seconds (highest recommendation of that window), then "
            "scale_down_pods_per_period per scale_down_period_seconds",
        ),
    ]
    return tuple(windows)
