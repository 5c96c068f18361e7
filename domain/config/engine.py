"""How one vLLM server of a model runs: `models[].vllm` (the engine's settings), its resources, startup,
probes and drain, and `models[].parallelism` (tensor, pipeline, data and expert parallelism; nodes per
replica)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from domain.catalogue.tuning_profiles import UnknownTuningProfileError, apply_tuning_profile
from domain.config.base import StrictModel
from domain.config.errors import ConfigProblem

DEFAULT_NCCL_ENV: dict[str, str] = {
    # NCCL's own warnings (a transport fallback, a failed connection) in the pod log; silent otherwise.
    "NCCL_DEBUG": "WARN",
    # Tensor parallelism never leaves the pod (one node): no network transport is needed, and on EFA
    # nodes the IB transport would otherwise probe the EFA devices through verbs.
    "NCCL_IB_DISABLE": "1",
    # NVLink SHARP (multicast) buffers take GPU memory the capacity plan does not count, and the
    # planner's TP measurements ran with it off (the lab host requires it); opt in after measuring.
    "NCCL_NVLS_ENABLE": "0",
}
"""NCCL environment of tensor-parallel pods unless vllm.nccl_env says otherwise (docs/tensor-parallel.md)."""


_NCCL_ENV_NAME = re.compile(r"^(TORCH_)?NCCL_[A-Z0-9_]+$")


class VllmEngineConfig(StrictModel):
    """vLLM server settings; each maps to one `vllm serve` flag (README.md, 'Serving settings')."""

    gpu_memory_utilization: float = 0.90
    """Fraction of each GPU's memory vLLM may use for weights, activations and KV cache."""
    max_model_len: Annotated[int, Field(ge=16)] = 8192
    """Longest prompt + completion, in tokens, one request may have."""
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    """Most sequences batched together in one scheduler step."""
    max_num_batched_tokens: Annotated[int, Field(ge=16)] | None = None
    """Token budget per scheduler step (vLLM's default when unset)."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Weight/activation dtype (`--dtype`); `auto` follows the checkpoint."""
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    """KV-cache dtype (`--kv-cache-dtype`); `fp8` halves KV memory and reads."""
    quantization: str | None = None
    """Quantisation method (`--quantization`), e.g. `fp8`, `awq`; unset follows the checkpoint. FP8
    weights (`fp8` and the other FP8 methods) only on GPUs with FP8 tensor cores (compute capability
    8.9 or later: L4, L40S, H100, H200, B200); `validate` refuses them on A100 and A10G."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (`--enable-prefix-caching`)."""
    enable_chunked_prefill: bool | None = None
    """Chunked prefill (`--enable-chunked-prefill`); unset keeps vLLM's default (on)."""
    enforce_eager: bool = False
    """Skip CUDA graphs/torch.compile: faster start, slower serving."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    """Container port of the OpenAI API, `/health` and `/metrics`."""
    extra_args: list[str] = []
    """Further `vllm serve` flags, checked against the pinned vLLM's own parser at validate time, and
    against what the probes, router and load balancer need: flags that take the API off
    `0.0.0.0:<port>` over plain HTTP (`--headless`, `--api-server-count 0`, `--uds`, `--grpc`, TLS,
    multi-node) and `--disable-log-stats` (no `vllm:*` series) are refused (docs/checks.md)."""
    nccl_env: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_NCCL_ENV))
    """NCCL settings in the environment of pods with gpus_per_replica > 1 (docs/tensor-parallel.md).
    Keys given here replace or add to the defaults NCCL_DEBUG=WARN, NCCL_IB_DISABLE=1 and
    NCCL_NVLS_ENABLE=0; defaults not named stay. Names start with NCCL_ or TORCH_NCCL_."""
    flashinfer_allreduce_backend: Literal["trtllm", "mnnvl", "auto"] = "trtllm"
    """`VLLM_FLASHINFER_ALLREDUCE_BACKEND` of pods with gpus_per_replica > 1: the backend of vLLM's fused
    all-reduce + RMSNorm on Hopper/Blackwell. `trtllm` uses only peer-to-peer memory (CUDA IPC), vLLM's
    single-node choice until 0.25; vLLM's own `auto` now picks `mnnvl`, which needs NVSwitch multicast
    and, where the node lacks it, crashed the first forward pass of TP=2 starts on the lab's two H200s
    and in vllm-project/vllm#34948 (docs/tensor-parallel.md)."""
    tuning_profile: str | None = None
    """A named, measured tuning from domain/catalogue/tuning_profiles.yaml (e.g. `h200-throughput`):
    its settings apply wherever this block does not set the same key (applied at load time, so the
    fields above hold the effective values)."""

    @property
    def api_server_count_flag(self) -> int | None:
        """`--api-server-count`/`-asc` as extra_args set it; None where they do not (vLLM's default
        then depends on data parallelism: `ModelConfig.api_server_count`)."""
        args = self.extra_args
        for index, token in enumerate(args):
            flag, _, inline = token.partition("=")
            if flag not in ("--api-server-count", "-asc"):
                continue
            if inline:
                value = inline
            elif index + 1 < len(args):
                value = args[index + 1]
            else:
                continue
            return int(value) if value.isdigit() and int(value) > 0 else 1
        return None

    @model_validator(mode="before")
    @classmethod
    def _apply_tuning_profile(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("tuning_profile") is None:
            return data
        try:
            return apply_tuning_profile(data)
        except UnknownTuningProfileError as error:
            raise ConfigProblem(str(error), at=("tuning_profile",), value=data["tuning_profile"]) from None

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _fraction_of_gpu_memory(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError(
                "must be greater than 0 and at most 1: the fraction of each GPU's memory vLLM may use "
                "(typically 0.85–0.95; default 0.90)"
            )
        return value

    @field_validator("extra_args")
    @classmethod
    def _flags_look_like_flags(cls, value: list[str]) -> list[str]:
        if value and not value[0].startswith("--"):
            raise ValueError(f"must start with a flag such as '--max-num-batched-tokens', not '{value[0]}'")
        return value

    @field_validator("nccl_env", mode="before")
    @classmethod
    def _nccl_names_and_text_values(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        checked = {}
        for name, setting in value.items():
            if not isinstance(name, str) or not _NCCL_ENV_NAME.match(name):
                raise ValueError(
                    f"'{name}' is not an NCCL setting: names start with NCCL_ or TORCH_NCCL_ "
                    "(e.g. NCCL_DEBUG); other environment variables are not set through nccl_env"
                )
            if isinstance(setting, bool) or not isinstance(setting, str | int):
                raise ValueError(
                    f"{name}: give the value as text or a whole number, e.g. '0' or '1', not {setting!r}"
                )
            checked[name] = str(setting)
        return checked

    @field_validator("nccl_env", mode="after")
    @classmethod
    def _nccl_defaults_kept(cls, value: dict[str, str]) -> dict[str, str]:
        # A stack that only raises NCCL_DEBUG must not silently lose NVLS-off and IB-off.
        return {**DEFAULT_NCCL_ENV, **value}


class ResourcesConfig(StrictModel):
    """Pod resources besides GPUs (GPUs always equal gpus_per_replica)."""

    cpu_request_cores: Annotated[float, Field(gt=0)] = 4
    """CPU request of the vLLM container, in cores."""
    cpu_limit_cores: Annotated[float, Field(gt=0)] | None = None
    """No CPU limit by default: CFS throttling stalls tokenization and the scheduler loop."""
    memory_request_gib: Annotated[float, Field(gt=0)] = 32
    """Memory request of the vLLM container, in GiB."""
    memory_limit_gib: Annotated[float, Field(gt=0)] = 64
    """Memory limit of the vLLM container, in GiB (includes the memory-backed /dev/shm)."""
    shm_size_gib: Annotated[float, Field(gt=0)] = 8
    """Memory-backed /dev/shm on every vLLM pod (NCCL and the engine's IPC use it)."""
    scratch_size_gib: Annotated[float, Field(gt=0)] = 10
    """Size limit of each writable scratch dir of the vLLM container (HOME with the Triton, FlashInfer
    and CUDA caches; /tmp), node-disk-backed emptyDirs because the root filesystem is read-only."""
    preload_cpu_request_cores: Annotated[float, Field(gt=0)] = 1
    """The model-cache init container (download, checksum, copy to NVMe); no CPU limit."""
    preload_memory_request_gib: Annotated[float, Field(gt=0)] = 2
    """Memory request of the preload init container, in GiB."""
    preload_memory_limit_gib: Annotated[float, Field(gt=0)] = 4
    """Covers the preloader's in-flight download parts (16 parallel 64 MiB ranges by default)."""

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> ResourcesConfig:
        if self.memory_request_gib > self.memory_limit_gib:
            raise ConfigProblem(
                "memory_request_gib is larger than memory_limit_gib; raise the limit",
                at=("memory_request_gib",),
            )
        if self.cpu_limit_cores is not None and self.cpu_request_cores > self.cpu_limit_cores:
            raise ConfigProblem("cpu_request_cores is larger than cpu_limit_cores", at=("cpu_request_cores",))
        if self.preload_memory_request_gib > self.preload_memory_limit_gib:
            raise ConfigProblem(
                "preload_memory_request_gib is larger than preload_memory_limit_gib; raise the limit",
                at=("preload_memory_request_gib",),
            )
        if self.shm_size_gib >= self.memory_limit_gib:
            raise ConfigProblem(
                "a memory-backed /dev/shm counts against the memory limit; keep shm_size_gib well below "
                "memory_limit_gib",
                at=("shm_size_gib",),
            )
        return self


class StartupConfig(StrictModel):
    """Assumptions behind the startupProbe budget (the capacity planner turns them into seconds)."""

    image_pull_seconds: Annotated[int, Field(ge=0)] = 180
    """Pulling the vLLM image (10–25 GB) onto a node that does not have it yet."""
    weight_load_mib_per_second: Annotated[float, Field(ge=1)] = 1280
    """Sustained read speed of the weights into GPU memory from node-local disk. Default: the slowest
    of the measured loads of a real 16 GB checkpoint with vLLM's default loader on the lab H200's local
    disk, 1.35–1.66 GB/s, median 1.54 (bench/startup/RESULTS.md; `fastsafetensors` 1.70–2.07 GB/s).
    At least 1 MiB/s: a speed near zero makes a startup budget no probe can hold (issue 34)."""
    shared_volume_mib_per_second: Annotated[float, Field(ge=1)] = 300
    """Read speed from the shared EFS volume: the copy onto node NVMe for a cold node, or the load
    itself when the GPU group has no local NVMe."""
    engine_start_seconds: Annotated[int, Field(ge=0)] = 60
    """vLLM's own start: imports, engine-core process, tokenizer, memory profiling and graph capture
    with a warm compile cache (about 1 minute for an 8B model on the lab H200, shared/gpu/README.md)."""
    compile_seconds: Annotated[int, Field(ge=0)] = 240
    """Extra time on a cold compile cache: torch.compile (first start about 3 minutes on the lab H200)."""
    group_rendezvous_seconds: Annotated[int, Field(ge=0)] = 120
    """parallelism.nodes_per_replica above 1: the leader's engine waits at vLLM's rendezvous until every
    member of its group has loaded and joined (the members start in parallel, so a group starts in the
    time of its slowest member plus this), and NCCL then sets up its EFA channels. An allowance, not yet
    measured here (issue 42): raise it after timing a group."""
    allreduce_jit_seconds: Annotated[int, Field(ge=0)] = 180
    """Extra time with gpus_per_replica > 1 on a cold JIT cache: FlashInfer builds the fused all-reduce
    kernels of the `trtllm` backend (174 s on the lab's 2x H200 host, bench/tensor_parallel at commit
    e4331ca); later pods find them in the JIT cache on the shared volume."""
    safety_factor: Annotated[float, Field(ge=1, le=5)] = 1.5
    """Multiplies the sum of the phases: the startupProbe budget is this much longer than expected."""
    probe_period_seconds: Annotated[int, Field(ge=1, le=60)] = 10
    """Period of the startupProbe; its failureThreshold covers the planned budget."""


class HealthProbesConfig(StrictModel):
    """Readiness and liveness on vLLM's `/health`, which start once the startupProbe has passed."""

    readiness_period_seconds: Annotated[int, Field(ge=1, le=300)] = 10
    """Period of the readiness probe on /health."""
    readiness_failure_threshold: Annotated[int, Field(ge=1, le=30)] = 3
    """Not ready after 3 failed checks (30 s): the Service and the load balancer stop sending to it."""
    liveness_period_seconds: Annotated[int, Field(ge=1, le=300)] = 15
    """Period of the liveness probe on /health."""
    liveness_failure_threshold: Annotated[int, Field(ge=1, le=30)] = 4
    """Restarted after 4 failed checks (60 s): /health fails when the engine core died or hangs, and a
    busy engine still answers it, so this does not kill pods under load."""
    timeout_seconds: Annotated[int, Field(ge=1, le=60)] = 5
    """Per check; /health does no inference work, so a slow answer means the server is stuck."""


class DrainConfig(StrictModel):
    """Graceful drain: the grace period is derived to exceed both together."""

    pre_stop_sleep_seconds: Annotated[int, Field(ge=0, le=300)] = 15
    """Time for load balancers to stop sending new requests before vLLM is told to stop."""
    shutdown_timeout_seconds: Annotated[int, Field(ge=0, le=3600)] = 120
    """vLLM `--shutdown-timeout`: how long in-flight (streaming) requests may finish."""


MAX_NODES_PER_REPLICA = 16
"""Most nodes of one replica (a LeaderWorkerSet group): 16 × 8 GPUs covers every open model the issue
names (issue 42) with room; the bound keeps a typo from asking for a hundred p5 nodes."""


class ParallelismConfig(StrictModel):
    """How one replica spreads over GPUs and nodes (vLLM's tensor, pipeline, data and expert
    parallelism; docs/multi-node.md). With `nodes_per_replica: 1` (the default) a replica is one pod
    and tensor parallel over its `gpus_per_replica` GPUs, as before; above 1 it is a LeaderWorkerSet
    group of that many pods, one per node, each holding `gpus_per_replica` GPUs (the whole node)."""

    nodes_per_replica: Annotated[int, Field(ge=1, le=MAX_NODES_PER_REPLICA)] = 1
    """Nodes (pods) of one replica. Above 1: vLLM's own multi-node launch (`--nnodes`,
    `--node-rank`, `--master-addr`; the workers `--headless`) in one LeaderWorkerSet group."""
    tensor_parallel_size: Annotated[int, Field(ge=1, le=128)] | None = None
    """`--tensor-parallel-size`. null = the GPUs left per pipeline stage and data-parallel rank:
    gpus_per_replica × nodes_per_replica / (pipeline × data). Above gpus_per_replica only with
    `tensor_parallel_across_nodes`."""
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=128)] | None = None
    """`--pipeline-parallel-size`. null = nodes_per_replica (one pipeline stage per node, tensor
    parallel inside it: vLLM's advice for nodes without NVLink between them); with data_parallel_size
    above 1, 1."""
    data_parallel_size: Annotated[int, Field(ge=1, le=1024)] = 1
    """`--data-parallel-size`: engines of one replica, each with its own scheduler and KV cache, for
    MoE models served with data and expert parallelism (`expert_parallel`). Each rank lies on one node
    (tensor × pipeline divides a node's GPUs); vLLM infers each node's ranks from `--node-rank`."""
    expert_parallel: bool = False
    """`--enable-expert-parallel`: a MoE model's experts spread over the tensor-parallel (× data-
    parallel) ranks instead of each expert split across them; num_experts must divide by that count."""
    tensor_parallel_across_nodes: bool = False
    """Allow tensor parallelism wider than one node. Off: refused, since every layer's all-reduce
    would then cross the network (EFA is a fraction of NVLink's bandwidth); prefer pipeline stages."""

    @model_validator(mode="after")
    def _single_node_is_tensor_parallel(self) -> ParallelismConfig:
        if self.nodes_per_replica == 1:
            if self.pipeline_parallel_size not in (None, 1):
                raise ConfigProblem(
                    "a one-node replica is one pod, tensor parallel over gpus_per_replica; pipeline "
                    "parallelism is offered across nodes only: set nodes_per_replica above 1 or remove it",
                    at=("pipeline_parallel_size",),
                    value=self.pipeline_parallel_size,
                )
            if self.data_parallel_size != 1:
                raise ConfigProblem(
                    "data parallelism inside one node is more replicas: raise replicas instead, or set "
                    "nodes_per_replica above 1 for a data/expert-parallel group",
                    at=("data_parallel_size",),
                    value=self.data_parallel_size,
                )
            if self.tensor_parallel_across_nodes:
                raise ConfigProblem(
                    "a one-node replica has no other node to spread over; remove it",
                    at=("tensor_parallel_across_nodes",),
                    value=True,
                )
        return self
