"""The per-model plan the rest of the stack consumes: memory per GPU, KV cache, concurrency, startup.

`plan_platform(config)` plans every model on its own GPU group (`PlatformPlan.models`) and, for
comparison, on every other GPU group of the stack (`PlatformPlan.alternatives`). A plan that says a
model cannot start carries the reasons with the numbers and a fix (`ModelPlan.problems`);
`capacity_problems` turns them into config problems for validate/render/preview.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from domain.architecture import (
    BYTES_PER_DTYPE,
    ModelShape,
    activation_dtype,
    checkpoint_bytes,
    linear_weight_dtype,
    model_shape,
    tensor_parallel_problems,
    total_parameters,
    weight_bytes_per_gpu,
)
from domain.capacity.lora import lora_cpu_cache_bytes, lora_gpu_bytes
from domain.capacity.memory import (
    GIB,
    NON_TORCH_INCREASE_BYTES,
    EngineSettings,
    GpuMemory,
    KvCacheSizing,
    activation_peak_bytes,
    blocks_per_request,
    cudagraph_memory_bytes,
    effective_max_num_batched_tokens,
    kv_dtype_bytes,
    longest_request_that_fits,
    size_kv_cache,
)
from domain.capacity.startup import StartupPlan, plan_startup
from domain.capacity.time_to_serve import ServingTimes, group_join_timeout_seconds, serving_times
from domain.capacity.wake import WakePlan, wake_plan, wake_problems
from domain.catalogue.gpu_instances import GpuModel, gpu_instance_types
from domain.config.base import INT32_MAX
from domain.config.cluster import GpuNodeGroupConfig
from domain.config.errors import Problem
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.config.tenants import TenantConcurrency, tenant_concurrency

MAX_GPUS_PER_REPLICA = 8
"""The most GPUs of one node a replica may use (models[].gpus_per_replica)."""

HIGHEST_SUGGESTED_UTILIZATION = 0.95
"""Above this vLLM leaves too little room for the CUDA context and fragmentation to be a fix we offer."""


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes on each GPU of one replica, in the order vLLM accounts for them."""

    gpu_total_bytes: int
    """nvidia-smi memory.total."""
    cuda_total_bytes: int
    """What CUDA reports as total (vLLM's total_memory)."""
    requested_bytes: int
    """cuda_total × gpu_memory_utilization: everything below must fit in it."""
    weight_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    kv_cache_bytes: int
    """What is left for the KV cache (negative: does not fit)."""
    lora_bytes: int = 0
    """LoRA adapter slots (max_loras × max_lora_rank), allocated while the model loads."""

    @property
    def overhead_bytes(self) -> int:
        return self.activation_peak_bytes + self.non_torch_bytes + self.cudagraph_bytes


@dataclass(frozen=True)
class CapacityProblem:
    """Why a model cannot start on a GPU group, at a key path relative to the model."""

    at: tuple[str | int, ...]
    value: Any
    message: str


@dataclass(frozen=True)
class NodeSource:
    """Where a replica's node comes from (issue 41): a managed group's Auto Scaling group scaled by the
    Cluster Autoscaler, or a Karpenter NodePool that may launch any of its types."""

    provisioner: str
    """`managed` or `karpenter`."""
    instance_types: tuple[tuple[str, int], ...]
    """(type, GPUs per node) of every type a new node may be."""
    capacity_types: tuple[str, ...]
    """In the order they are tried (a managed group has one)."""
    worst_case: str
    """The instance type with the fewest GPUs: the one every replica must fit (validate checks it)."""
    gpu_limit: int
    """Most GPUs the group or pool may hold (max_size × GPUs, or the pool's max_gpus)."""
    new_node_seconds: float
    """Expected time from the pending pod to a serving replica on a new node (`serving.new_node`)."""

    @property
    def path(self) -> str:
        if self.provisioner == "karpenter":
            return "Karpenter NodePool -> NodeClaim -> EC2 CreateFleet"
        return "Cluster Autoscaler -> managed node group's Auto Scaling group"


@dataclass(frozen=True)
class ModelPlan:
    model: str
    gpu_group: str
    gpu_model: str
    tensor_parallel_size: int
    parameters: float
    weight_bytes_per_gpu: int
    startup_budget_seconds: int
    kv_cache_bytes_per_token: int
    """KV bytes one token takes on one GPU (all layers)."""
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    """Effective token budget per step (vLLM's default when the stack leaves it unset)."""
    memory: MemoryPlan
    kv_cache: KvCacheSizing
    typical_request_tokens: int
    typical_concurrency: float
    """Requests of typical length whose KV cache fits at once."""
    startup: StartupPlan
    serving: ServingTimes
    """Expected time to a serving replica on a warm node and on a new node (besides the budget)."""
    wake: WakePlan
    """From the first request at zero replicas to its first token, and the router's hold."""
    problems: tuple[CapacityProblem, ...] = ()
    lora_cpu_cache_bytes: int = 0
    """Host memory of vLLM's full LoRA adapter cache (max_cpu_loras adapters of max_lora_rank)."""
    node_source: NodeSource | None = None
    """Where a new replica's node comes from: the group's provisioner, instance types, capacity types."""
    nodes_per_replica: int = 1
    """Nodes (pods) of one replica; above 1 a LeaderWorkerSet group (issue 42)."""
    pipeline_parallel_size: int = 1
    """Pipeline stages of one replica; memory above is per GPU of the largest stage."""
    gpus_per_node: int = 0
    """GPUs of each pod of the replica (gpus_per_replica); 0 where not set (tests' hand-built plans)."""
    data_parallel_size: int = 1
    """Engines of one replica, each with its own scheduler and KV cache: the KV cache, tokens and
    concurrency above are one rank's."""
    expert_parallel: bool = False
    """A MoE model's routed experts spread over tensor × data ranks (weights above are one GPU's share)."""
    group_join_timeout_seconds: int | None = None
    """A multi-node replica's `--distributed-timeout-seconds` (group_join_timeout_seconds); None for
    one-node models (PyTorch's default applies)."""

    @property
    def gpus_per_replica_total(self) -> int:
        """Every GPU one replica holds, over all its nodes."""
        return (self.gpus_per_node or self.tensor_parallel_size) * self.nodes_per_replica

    @property
    def gpu_hours_per_day(self) -> int:
        """What one warm replica holds in a day, in GPU-hours (× the GPU's hourly price for its cost)."""
        return 24 * self.gpus_per_replica_total

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def max_num_seqs_reachable(self) -> bool:
        """Whether max_num_seqs typical requests fit in the KV cache at once."""
        return self.typical_concurrency >= self.max_num_seqs


@dataclass(frozen=True)
class PlatformPlan:
    models: dict[str, ModelPlan]
    """Each model on its configured GPU group."""
    alternatives: tuple[ModelPlan, ...] = ()
    """Each model on every other GPU group of the stack, same tensor parallelism."""
    candidates: dict[str, ModelPlan] = field(default_factory=dict)
    """Each multi-node canary's candidate (`rollout.canary.candidate`) by model name, on its group."""
    tenants: tuple[TenantConcurrency, ...] = ()
    """Each tenant's in-flight limit on each model it may call: the stack's, or on a model shared
    with other tenants the default share (issue 40; domain/config/tenants.py)."""


@dataclass(frozen=True)
class _Placement:
    """Where and how a model runs: everything the arithmetic depends on besides the shape."""

    gpu: GpuModel
    tensor_parallel_size: int
    settings: EngineSettings
    gpus_per_node: int


@dataclass(frozen=True)
class MemorySizing:
    memory: MemoryPlan
    kv_cache: KvCacheSizing
    max_num_batched_tokens: int
    kv_bytes_per_token: int


def _size(shape: ModelShape, placement: _Placement) -> MemorySizing:
    return size_memory(shape, placement.gpu, placement.tensor_parallel_size, placement.settings)


def size_memory(
    shape: ModelShape, gpu_model: GpuModel, tensor_parallel_size: int, settings: EngineSettings
) -> MemorySizing:
    """Memory on each GPU and the KV cache vLLM will size, for one shape, GPU and set of settings."""
    tp = tensor_parallel_size
    gpu = GpuMemory(name=gpu_model.name, memory_bytes=gpu_model.memory_bytes)
    compute = activation_dtype(shape, settings.dtype)
    act_bytes = int(BYTES_PER_DTYPE[compute])
    weights = weight_bytes_per_gpu(
        shape,
        tp,
        linear_dtype=linear_weight_dtype(shape, settings.quantization, compute),
        compute_dtype=compute,
    )
    tokens = effective_max_num_batched_tokens(settings, gpu)
    activation = activation_peak_bytes(shape, tp, gpu, tokens, settings.max_num_seqs, act_bytes)
    graphs = cudagraph_memory_bytes(shape, tp, settings, tokens, act_bytes)
    lora = (
        lora_gpu_bytes(shape, tp, settings.max_loras, settings.max_lora_rank, act_bytes)
        if settings.max_loras
        else 0
    )
    requested = math.ceil(gpu.cuda_total_bytes * settings.gpu_memory_utilization)
    available = requested - weights - lora - activation - NON_TORCH_INCREASE_BYTES - graphs
    dtype_bytes = kv_dtype_bytes(settings, compute)
    kv = size_kv_cache(shape, tp, available, dtype_bytes, settings.max_model_len, tokens)
    memory = MemoryPlan(
        gpu_total_bytes=gpu.memory_bytes,
        cuda_total_bytes=gpu.cuda_total_bytes,
        requested_bytes=requested,
        weight_bytes=weights,
        activation_peak_bytes=activation,
        non_torch_bytes=NON_TORCH_INCREASE_BYTES,
        cudagraph_bytes=graphs,
        kv_cache_bytes=available,
        lora_bytes=lora,
    )
    per_token = kv.page_bytes_per_layer * shape.num_hidden_layers // kv.block_size_tokens
    return MemorySizing(
        memory=memory, kv_cache=kv, max_num_batched_tokens=tokens, kv_bytes_per_token=per_token
    )


def _starts(shape: ModelShape, placement: _Placement) -> bool:
    """vLLM gets through startup: the shape splits, and one max_model_len request fits the KV cache."""
    if tensor_parallel_problems(shape, placement.tensor_parallel_size):
        return False
    sizing = _size(shape, placement)
    needed = blocks_per_request(shape, placement.settings.max_model_len, sizing.max_num_batched_tokens)
    return sizing.memory.kv_cache_bytes > 0 and sizing.kv_cache.num_blocks >= needed


def _gib(value: int | float) -> str:
    return f"{value / GIB:.1f} GiB"


def _nice_length(tokens: int) -> int:
    """A max_model_len a person would write: a multiple of 1024 (of 256 below 4096)."""
    step = 1024 if tokens >= 4096 else 256
    return max(step, tokens // step * step) if tokens >= step else tokens


def _fixes(shape: ModelShape, placement: _Placement) -> list[str]:
    """Changes that would let the model start, each checked with the same arithmetic."""
    fixes: list[str] = []
    tp = placement.tensor_parallel_size
    for larger in range(tp + 1, MAX_GPUS_PER_REPLICA + 1):
        option = dataclasses.replace(placement, tensor_parallel_size=larger, gpus_per_node=larger)
        if not _starts(shape, option):
            continue
        per_gpu = f"{_gib(_size(shape, option).memory.weight_bytes)} of weights per GPU"
        if larger <= placement.gpus_per_node:
            fixes.append(f"gpus_per_replica: {larger} ({per_gpu})")
        else:
            roomy = sorted(
                (
                    i
                    for i in gpu_instance_types().values()
                    if i.gpu.name == placement.gpu.name and i.gpus_per_node >= larger
                ),
                key=lambda i: (i.gpus_per_node, i.vcpus),
            )
            if roomy:
                fixes.append(
                    f"gpus_per_replica: {larger} ({per_gpu}) in a GPU group of instance types with "
                    f"{larger}+ {placement.gpu.name} GPUs, e.g. {roomy[0].name}"
                )
        break
    settings = placement.settings
    if settings.gpu_memory_utilization < HIGHEST_SUGGESTED_UTILIZATION:
        for step in range(
            round(settings.gpu_memory_utilization * 100) + 1, round(HIGHEST_SUGGESTED_UTILIZATION * 100) + 1
        ):
            option = dataclasses.replace(
                placement, settings=dataclasses.replace(settings, gpu_memory_utilization=step / 100)
            )
            if _starts(shape, option):
                fixes.append(f"vllm.gpu_memory_utilization: {step / 100:.2f}")
                break
    if not settings.kv_cache_dtype.startswith("fp8") and placement.gpu.fp8:
        option = dataclasses.replace(placement, settings=dataclasses.replace(settings, kv_cache_dtype="fp8"))
        if _starts(shape, option):
            fixes.append("vllm.kv_cache_dtype: fp8 (half the KV bytes per token)")
    if shape.weight_dtype in ("bfloat16", "float16", "float32") and settings.quantization is None:
        if placement.gpu.fp8:
            option = dataclasses.replace(
                placement, settings=dataclasses.replace(settings, quantization="fp8")
            )
            if _starts(shape, option):
                fixes.append("quantised weights: vllm.quantization: fp8")
        if not fixes or not fixes[-1].startswith("quantised"):
            option_shape = dataclasses.replace(shape, weight_dtype="int4")
            if _starts(option_shape, placement):
                fixes.append(
                    "quantised weights: an int4 (AWQ/GPTQ) checkpoint with architecture.weight_dtype: int4"
                )
    bigger = []
    for gpu in sorted(
        {i.gpu.name: i.gpu for i in gpu_instance_types().values()}.values(), key=lambda g: g.memory_mib
    ):
        if gpu.memory_mib > placement.gpu.memory_mib and _starts(
            shape, dataclasses.replace(placement, gpu=gpu)
        ):
            bigger.append(gpu.name)
    if bigger:
        gpus = f"{tp} GPU{'s' if tp > 1 else ''}"
        fixes.append(f"a GPU group with more memory per GPU ({', '.join(bigger[:3])} at {gpus})")
    return fixes


def _fix_text(fixes: list[str]) -> str:
    if not fixes:
        return "no single change in this GPU group fits it; use a GPU with more memory and tensor parallelism"
    return "fix: " + "; or ".join(fixes)


def _lora_fixes(shape: ModelShape, placement: _Placement) -> list[str]:
    """Fewer or smaller LoRA slots that let the model start, each checked with the same arithmetic."""
    settings = placement.settings
    fixes = []
    for loras in range(settings.max_loras - 1, 0, -1):
        option = dataclasses.replace(placement, settings=dataclasses.replace(settings, max_loras=loras))
        if _starts(shape, option):
            fixes.append(f"lora.max_loras: {loras}")
            break
    for rank in (r for r in (256, 128, 64, 32, 16, 8, 1) if r < settings.max_lora_rank):
        option = dataclasses.replace(placement, settings=dataclasses.replace(settings, max_lora_rank=rank))
        if _starts(shape, option):
            fixes.append(f"lora.max_lora_rank: {rank} (if every adapter's rank is at most {rank})")
            break
    return fixes or _fixes(shape, placement)


def _problems(shape: ModelShape, placement: _Placement, sizing: MemorySizing) -> list[CapacityProblem]:
    tp = placement.tensor_parallel_size
    gpu = placement.gpu.name
    settings = placement.settings
    problems: list[CapacityProblem] = []
    split = tensor_parallel_problems(shape, tp)
    if tp > placement.gpus_per_node:
        problems.append(
            CapacityProblem(
                at=("gpus_per_replica",),
                value=tp,
                message=f"one replica needs {tp} GPUs on one node; nodes of this group have "
                f"{placement.gpus_per_node}",
            )
        )
        return problems
    if split:
        valid = [n for n in range(1, placement.gpus_per_node + 1) if not tensor_parallel_problems(shape, n)]
        problems.append(
            CapacityProblem(
                at=("gpus_per_replica",),
                value=tp,
                message=f"vLLM cannot split this model across {tp} GPUs: {'; '.join(split)}; "
                f"fix: gpus_per_replica one of {', '.join(map(str, valid))}",
            )
        )
        return problems
    limit = shape.max_position_embeddings
    if limit is not None and settings.max_model_len > limit:
        problems.append(
            CapacityProblem(
                at=("vllm", "max_model_len"),
                value=settings.max_model_len,
                message=f"the model supports at most {limit} tokens (architecture.max_position_embeddings) "
                f"and vLLM refuses a longer max_model_len; fix: vllm.max_model_len: {limit} or less "
                "(or raise max_position_embeddings if the checkpoint's context was extended, e.g. with YaRN)",
            )
        )
    memory = sizing.memory
    usable = (
        f"vLLM may use {_gib(memory.requested_bytes)} of each {gpu} ({settings.gpu_memory_utilization:g} × "
        f"{_gib(memory.cuda_total_bytes)})"
    )
    if memory.kv_cache_bytes <= 0 and memory.lora_bytes and memory.kv_cache_bytes + memory.lora_bytes > 0:
        # The model alone fits: the LoRA slots set aside at start are what does not (issue 34).
        problems.append(
            CapacityProblem(
                at=("lora", "max_loras"),
                value=settings.max_loras,
                message=f"the LoRA slots do not fit: {settings.max_loras} adapter(s) of max_lora_rank "
                f"{settings.max_lora_rank} set aside {_gib(memory.lora_bytes)} per GPU at start, beside "
                f"{_gib(memory.weight_bytes)} of weights and {_gib(memory.overhead_bytes)} of activations, "
                f"CUDA graphs and runtime, but {usable}; {_fix_text(_lora_fixes(shape, placement))}",
            )
        )
        return problems
    if memory.kv_cache_bytes <= 0:
        problems.append(
            CapacityProblem(
                at=("gpus_per_replica",),
                value=tp,
                message=f"the model does not fit: {_gib(memory.weight_bytes)} of weights per GPU at {tp} GPU"
                f"{'s' if tp > 1 else ''} plus {_gib(memory.overhead_bytes)} of activations, CUDA graphs and "
                f"runtime, but {usable}; {_fix_text(_fixes(shape, placement))}",
            )
        )
        return problems
    needed = blocks_per_request(shape, settings.max_model_len, sizing.max_num_batched_tokens)
    if sizing.kv_cache.num_blocks < needed:
        block = sizing.kv_cache.block_size_tokens
        longest = longest_request_that_fits(
            shape, sizing.kv_cache.num_blocks, sizing.max_num_batched_tokens, settings.max_model_len
        )
        fixes = [f"vllm.max_model_len: {_nice_length(longest)}"] if longest >= block else []
        fixes += _fixes(shape, placement)
        problems.append(
            CapacityProblem(
                at=("vllm", "max_model_len"),
                value=settings.max_model_len,
                message="the KV cache cannot hold one request of max_model_len "
                f"{settings.max_model_len} tokens: it needs "
                f"{_gib(needed * block * sizing.kv_bytes_per_token)} per GPU, "
                f"{_gib(memory.kv_cache_bytes)} is left after {_gib(memory.weight_bytes)} of weights"
                f"{f', {_gib(memory.lora_bytes)} of LoRA slots' if memory.lora_bytes else ''} and "
                f"{_gib(memory.overhead_bytes)} of activations, CUDA graphs and runtime ({usable}); "
                f"{_fix_text(fixes)}",
            )
        )
    return problems


def _settings(model: ModelConfig) -> EngineSettings:
    engine = model.vllm
    return EngineSettings(
        gpu_memory_utilization=engine.gpu_memory_utilization,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        enable_chunked_prefill=engine.enable_chunked_prefill,
        kv_cache_dtype=engine.kv_cache_dtype,
        dtype=engine.dtype,
        quantization=engine.quantization,
        enforce_eager=engine.enforce_eager,
        max_loras=model.lora.max_loras if model.lora else 0,
        max_lora_rank=model.lora.max_lora_rank if model.lora else 0,
    )


def plan_model(model: ModelConfig, config: PlatformConfig, gpu_group: str) -> ModelPlan:
    """Plan `model` on the GPU group `gpu_group` of `config` (its own, or another for comparison)."""
    from domain.multi_node import expert_shard_shape, pipeline_stage_shape

    group = config.node_groups.gpu[gpu_group]
    whole_model = model_shape(model)
    # A multi-node replica is planned per GPU of its largest pipeline stage (issue 42), and with
    # expert parallelism over data-parallel ranks, of one rank's share of the routed experts.
    shape = pipeline_stage_shape(whole_model, model.pipeline_parallel_size)
    if model.parallelism.expert_parallel:
        shape = expert_shard_shape(shape, model.data_parallel_size)
    gpus_per_node = max(instance.gpus_per_node for instance in group.gpu_instances)
    if model.is_multi_node:
        # Tensor parallelism wider than a node is domain/multi_node.py's to refuse (or allow).
        gpus_per_node = max(gpus_per_node, model.tensor_parallel_size)
    placement = _Placement(
        gpu=group.gpu_model,
        tensor_parallel_size=model.tensor_parallel_size,
        settings=_settings(model),
        gpus_per_node=gpus_per_node,
    )
    sizing = _size(shape, placement)
    typical = model.capacity.typical_input_tokens + model.capacity.typical_output_tokens
    typical_concurrency = sizing.kv_cache.num_blocks / blocks_per_request(
        shape, typical, sizing.max_num_batched_tokens
    )
    local_nvme = group.local_nvme.enabled and all(
        instance.local_nvme_gib > 0 for instance in group.gpu_instances
    )
    startup = plan_startup(
        model.startup,
        checkpoint_bytes(whole_model),  # every node of a group copies and reads the whole checkpoint
        local_nvme=local_nvme,
        tensor_parallel_size=model.tensor_parallel_size,
        nodes_per_replica=model.nodes_per_replica,
    )
    serving = serving_times(
        model, config, startup, gpu_model=group.gpu_model.name, karpenter_pool=group.is_karpenter_pool
    )
    return ModelPlan(
        model=model.name,
        gpu_group=gpu_group,
        gpu_model=group.gpu_model.name,
        tensor_parallel_size=model.tensor_parallel_size,
        parameters=total_parameters(whole_model),
        weight_bytes_per_gpu=sizing.memory.weight_bytes,
        startup_budget_seconds=startup.budget_seconds,
        kv_cache_bytes_per_token=sizing.kv_bytes_per_token,
        max_model_len=model.vllm.max_model_len,
        max_num_seqs=model.vllm.max_num_seqs,
        max_num_batched_tokens=sizing.max_num_batched_tokens,
        memory=sizing.memory,
        kv_cache=sizing.kv_cache,
        typical_request_tokens=typical,
        typical_concurrency=typical_concurrency,
        startup=startup,
        serving=serving,
        wake=wake_plan(model, config, serving, gpu_group),
        problems=tuple(_problems(shape, placement, sizing) + _startup_problems(model, startup, local_nvme)),
        lora_cpu_cache_bytes=_lora_cpu_cache_bytes(model, shape, placement.settings),
        node_source=node_source(group, serving.new_node.seconds()),
        nodes_per_replica=model.nodes_per_replica,
        pipeline_parallel_size=model.pipeline_parallel_size,
        gpus_per_node=model.gpus_per_replica,
        data_parallel_size=model.data_parallel_size,
        expert_parallel=model.parallelism.expert_parallel,
        group_join_timeout_seconds=(
            group_join_timeout_seconds(model, startup, serving) if model.is_multi_node else None
        ),
    )


def node_source(group: GpuNodeGroupConfig, new_node_seconds: float) -> NodeSource:
    instances = tuple((instance.name, instance.gpus_per_node) for instance in group.gpu_instances)
    worst = min(group.gpu_instances, key=lambda instance: (instance.gpus_per_node, instance.name))
    if group.is_karpenter_pool:
        capacity, limit = tuple(group.karpenter.capacity_types), group.pool_gpu_limit
    else:
        capacity, limit = (group.capacity_type.replace("_", "-"),), group.max_size * group.max_gpus_per_node
    return NodeSource(
        provisioner=group.provisioner,
        instance_types=instances,
        capacity_types=capacity,
        worst_case=worst.name,
        gpu_limit=limit,
        new_node_seconds=new_node_seconds,
    )


def _startup_problems(model: ModelConfig, startup: StartupPlan, local_nvme: bool) -> list[CapacityProblem]:
    """The startupProbe's failureThreshold is an int32: a budget past it cannot be rendered (issue 34).
    Blamed on the setting behind the longest phase, almost always a storage speed typed near zero."""
    period = model.startup.probe_period_seconds
    threshold = math.ceil(startup.budget_seconds / period)
    if threshold <= INT32_MAX:
        return []
    phase, _ = max(startup.phases, key=lambda item: item[1])
    key = {
        "image_pull": "image_pull_seconds",
        "copy_to_nvme": "shared_volume_mib_per_second",
        "load_weights": "weight_load_mib_per_second" if local_nvme else "shared_volume_mib_per_second",
        "engine_start": "engine_start_seconds",
        "compile": "compile_seconds",
        "allreduce_jit": "allreduce_jit_seconds",
    }[phase]
    return [
        CapacityProblem(
            at=("startup", key),
            value=getattr(model.startup, key),
            message=f"the startup budget is {startup.budget_seconds} s, mostly {phase}: the startupProbe "
            f"would need failureThreshold {threshold}, beyond Kubernetes' int32 ({INT32_MAX}); fix: give "
            f"startup.{key} a realistic value (speeds in MiB/s, e.g. the defaults 1280 for local disk and "
            "300 for the shared volume)",
        )
    ]


def _lora_cpu_cache_bytes(model: ModelConfig, shape: ModelShape, settings: EngineSettings) -> int:
    if model.lora is None:
        return 0
    dtype_bytes = int(BYTES_PER_DTYPE[activation_dtype(shape, settings.dtype)])
    return lora_cpu_cache_bytes(shape, model.lora.cpu_cache_size, model.lora.max_lora_rank, dtype_bytes)


def plan_platform(config: PlatformConfig) -> PlatformPlan:
    models = {model.name: plan_model(model, config, model.gpu_group) for model in config.models}
    alternatives = tuple(
        plan_model(model, config, group)
        for model in config.models
        for group in config.node_groups.gpu
        if group != model.gpu_group
    )
    candidates = {
        model.name: plan_model(candidate, config, model.gpu_group)
        for model in config.models
        if model.is_multi_node and (candidate := model.canary_candidate()) is not None
    }
    tenants = tuple(row for model in config.models for row in tenant_concurrency(config, model))
    return PlatformPlan(models=models, alternatives=alternatives, candidates=candidates, tenants=tenants)


def capacity_problems(config: PlatformConfig) -> list[Problem]:
    """Validate-time check: every model that cannot start on its GPU group, with numbers and a fix."""
    from domain.multi_node import model_versions

    problems = []
    for at, model in model_versions(config):
        for problem in plan_model(model, config, model.gpu_group).problems:
            path, message = (*at, *problem.at), problem.message
            if len(at) > 2 and problem.at[:1] != ("vllm",):
                # A candidate has only source and vllm keys of its own: name the model's key, and why.
                path, message = (*at[:2], *problem.at), f"the canary's candidate: {message}"
            problems.append(Problem(path=path, value=problem.value, message=message))
    return problems


def scale_to_zero_problems(config: PlatformConfig) -> list[Problem]:
    """Validate-time check: a to-zero model's hold covers its predicted wake, and no timeout on the
    request's path is shorter than the hold (domain/capacity/wake.py)."""
    problems = []
    for index, model in enumerate(config.models):
        if model.scales_to_zero:
            wake = plan_model(model, config, model.gpu_group).wake
            problems.extend(wake_problems(model, index, config, wake))
    return problems


def scale_to_zero_warnings(config: PlatformConfig) -> list[Problem]:
    """Valid but costly: a to-zero model on a GPU group that keeps idle nodes anyway (every model on
    the group scales to zero, yet its min_size holds nodes)."""
    warnings = []
    for model in config.models:
        if not model.scales_to_zero:
            continue
        group = config.node_groups.gpu[model.gpu_group]
        sharing = [other for other in config.models if other.gpu_group == model.gpu_group]
        if group.min_size > 0 and all(other.scales_to_zero for other in sharing):
            wake = plan_model(model, config, model.gpu_group).wake
            warnings.append(
                Problem(
                    ("node_groups", "gpu", model.gpu_group, "min_size"),
                    group.min_size,
                    f"model '{model.name}' scales to zero, but this group keeps {group.min_size} node(s) "
                    f"of {group.min_gpus_per_node} GPU(s) whatever the models do: "
                    f"{wake.idle_group_gpu_hours_per_day} GPU-hours a day idle when nothing runs; set "
                    "min_size: 0 so the Cluster Autoscaler removes the last node too (a wake then adds "
                    f"a node: about {wake.seconds('new_node'):.0f} s instead of "
                    f"{wake.seconds('warm_node'):.0f} s, `vllm-platform plan`)",
                )
            )
    return warnings
