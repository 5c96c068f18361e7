"""How long a replica takes from scheduling to ready: the startupProbe budget of the serving unit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from domain.config.engine import StartupConfig

MIB = 1 << 20

PHASES = {
    "image_pull": "pull the vLLM image onto the node",
    "copy_to_nvme": "preloader copies the checkpoint from the shared volume (EFS) to node NVMe",
    "load_weights": "vLLM reads the checkpoint into GPU memory (from NVMe, or from EFS without NVMe)",
    "engine_start": "imports, engine process, memory profiling, CUDA-graph capture",
    "compile": "torch.compile on a cold compile cache",
    "allreduce_jit": "gpus_per_replica > 1: FlashInfer builds its fused all-reduce kernels (cold JIT cache)",
    "group_rendezvous": "multi-node replica: the leader waits for every member of its group to join vLLM's "
    "rendezvous (members start in parallel: the group takes its slowest member's time plus this)",
}


@dataclass(frozen=True)
class StartupPlan:
    phases: tuple[tuple[str, float], ...]
    """(phase, expected seconds) in the order they happen on a cold node; names in PHASES."""
    safety_factor: float
    budget_seconds: int
    """ceil(sum of phases × safety_factor): what the startupProbe allows before restarting the pod."""

    @property
    def expected_seconds(self) -> float:
        return sum(seconds for _, seconds in self.phases)


def plan_startup(
    startup: StartupConfig,
    checkpoint_bytes: int,
    *,
    local_nvme: bool,
    tensor_parallel_size: int = 1,
    nodes_per_replica: int = 1,
) -> StartupPlan:
    """Phases of a cold start, each from the model's size and the storage speeds in `startup`.

    With node-local NVMe, the preloader copies the checkpoint from the shared EFS volume onto NVMe
    once per node, and vLLM reads it from NVMe; without, vLLM reads it from EFS directly. Each
    tensor-parallel worker reads the whole checkpoint (vLLM's safetensors iterator) at once, sharing
    the page cache, so the load takes the time of one full read. A tensor-parallel pod's first start on
    a GPU type also builds FlashInfer's fused all-reduce kernels (measured 174 s at TP=2 on the lab H200).
    A multi-node replica's members run these phases in parallel, each on its own node reading the whole
    checkpoint (the pipeline stage keeps only its layers), then meet at the leader's rendezvous: the
    leader's startupProbe covers the group.
    """
    checkpoint_mib = checkpoint_bytes / MIB
    phases: list[tuple[str, float]] = [("image_pull", float(startup.image_pull_seconds))]
    if local_nvme:
        phases.append(("copy_to_nvme", checkpoint_mib / startup.shared_volume_mib_per_second))
        phases.append(("load_weights", checkpoint_mib / startup.weight_load_mib_per_second))
    else:
        phases.append(("copy_to_nvme", 0.0))
        phases.append(("load_weights", checkpoint_mib / startup.shared_volume_mib_per_second))
    phases.append(("engine_start", float(startup.engine_start_seconds)))
    phases.append(("compile", float(startup.compile_seconds)))
    if tensor_parallel_size > 1:
        phases.append(("allreduce_jit", float(startup.allreduce_jit_seconds)))
    if nodes_per_replica > 1:
        phases.append(("group_rendezvous", float(startup.group_rendezvous_seconds)))
    expected = sum(seconds for _, seconds in phases)
    return StartupPlan(
        phases=tuple(phases),
        safety_factor=startup.safety_factor,
        budget_seconds=math.ceil(expected * startup.safety_factor),
    )
