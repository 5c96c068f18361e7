"""Per-model settings: source, placement, replicas/autoscaling, vLLM engine, pod resources."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from infra.config.base import StrictModel, dns_label
from infra.config.errors import ConfigProblem

_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])/(?P<prefix>[^\s]+?)/?$")
_HF_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelSourceConfig(StrictModel):
    """Where the weights of one model revision live. Exactly one of `s3_uri` / `huggingface_repo`."""

    s3_uri: str | None = None
    """S3 prefix holding exactly this revision's files, e.g. s3://acme-models/llama-3.1-8b/0e9e39f/."""
    huggingface_repo: str | None = None
    """Hugging Face repo id, e.g. meta-llama/Llama-3.1-8B-Instruct (fetched once into the shared volume)."""
    revision: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
    """Immutable revision label (for Hugging Face: the commit sha); the cache key on the shared volume."""
    requires_hf_token: bool = False
    """Gated Hugging Face repos: mount the token from the secret store for the preloader."""

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelSourceConfig:
        if (self.s3_uri is None) == (self.huggingface_repo is None):
            raise ConfigProblem(
                "set exactly one of s3_uri (e.g. s3://bucket/llama-3.1-8b/rev/) or huggingface_repo "
                "(e.g. meta-llama/Llama-3.1-8B-Instruct)",
                at=("s3_uri",),
                value=self.s3_uri,
            )
        if self.s3_uri is not None and not _S3_URI.match(self.s3_uri):
            raise ConfigProblem("must look like s3://bucket/prefix/ (a bucket and a non-empty prefix)", at=("s3_uri",))
        if self.huggingface_repo is not None and not _HF_REPO.match(self.huggingface_repo):
            raise ConfigProblem("must be a Hugging Face repo id like 'org/name'", at=("huggingface_repo",))
        if self.requires_hf_token and self.huggingface_repo is None:
            raise ConfigProblem("only Hugging Face sources use a token; remove it", at=("requires_hf_token",))
        return self

    @property
    def s3_bucket(self) -> str | None:
        match = _S3_URI.match(self.s3_uri or "")
        return match["bucket"] if match else None

    @property
    def s3_prefix(self) -> str | None:
        match = _S3_URI.match(self.s3_uri or "")
        return match["prefix"].rstrip("/") + "/" if match else None

    @property
    def uri(self) -> str:
        return self.s3_uri if self.s3_uri is not None else f"hf://{self.huggingface_repo}"


class ArchitectureConfig(StrictModel):
    """The model's shape, as in its config.json: what the capacity planner sizes memory from.

    Either name a `preset` from infra/catalogue/model_shapes.yaml or give the numbers.
    """

    preset: str | None = None
    parameters_billion: Annotated[float, Field(gt=0)] | None = None
    num_hidden_layers: Annotated[int, Field(gt=0)] | None = None
    hidden_size: Annotated[int, Field(gt=0)] | None = None
    num_attention_heads: Annotated[int, Field(gt=0)] | None = None
    num_key_value_heads: Annotated[int, Field(gt=0)] | None = None
    head_dim: Annotated[int, Field(gt=0)] | None = None
    intermediate_size: Annotated[int, Field(gt=0)] | None = None
    vocab_size: Annotated[int, Field(gt=0)] | None = None
    max_position_embeddings: Annotated[int, Field(gt=0)] | None = None
    sliding_window: Annotated[int, Field(gt=0)] | None = None
    num_experts: Annotated[int, Field(gt=0)] | None = None
    num_experts_per_token: Annotated[int, Field(gt=0)] | None = None
    tie_word_embeddings: bool | None = None
    weight_dtype: Literal["bfloat16", "float16", "float32", "fp8", "int8", "int4"] | None = None


class AutoscalingMetricConfig(StrictModel):
    """One autoscaling signal: a per-pod metric and the average value the HPA holds it at."""

    metric: str
    """vLLM metric (e.g. vllm:num_requests_waiting, vllm:kv_cache_usage_perc) or DCGM_FI_DEV_GPU_UTIL."""
    target_average_value: Annotated[float, Field(gt=0)]


def _default_autoscaling_metrics() -> list[AutoscalingMetricConfig]:
    return [
        AutoscalingMetricConfig(metric="vllm:num_requests_waiting", target_average_value=5),
        AutoscalingMetricConfig(metric="vllm:kv_cache_usage_perc", target_average_value=0.8),
        AutoscalingMetricConfig(metric="DCGM_FI_DEV_GPU_UTIL", target_average_value=80),
    ]


class AutoscalingConfig(StrictModel):
    enabled: bool = False
    backend: Literal["hpa", "keda"] = "hpa"
    min_replicas: Annotated[int, Field(ge=1)] = 1
    max_replicas: Annotated[int, Field(ge=1)] = 2
    metrics: Annotated[list[AutoscalingMetricConfig], Field(min_length=1)] = Field(
        default_factory=_default_autoscaling_metrics
    )
    scale_up_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 600
    scale_down_pods_per_period: Annotated[int, Field(ge=1)] = 1
    scale_down_period_seconds: Annotated[int, Field(ge=15, le=1800)] = 300

    @model_validator(mode="after")
    def _bounds_ordered(self) -> AutoscalingConfig:
        if self.min_replicas > self.max_replicas:
            raise ConfigProblem(
                f"min_replicas {self.min_replicas} is larger than max_replicas {self.max_replicas}; "
                "raise max_replicas or lower min_replicas",
                at=("min_replicas",),
            )
        return self


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
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    quantization: str | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool | None = None
    enforce_eager: bool = False
    """Skip CUDA graphs/torch.compile: faster start, slower serving."""
    port: Annotated[int, Field(ge=1024, le=65535)] = 8000
    extra_args: list[str] = []
    """Further `vllm serve` flags, checked against the pinned vLLM's own parser at validate time."""
    tuning_profile: str | None = None
    """A named, measured tuning from infra/catalogue/tuning_profiles.yaml (e.g. `h200-throughput`):
    its settings apply wherever this block does not set the same key (applied at load time, so the
    fields above hold the effective values)."""

    @model_validator(mode="before")
    @classmethod
    def _apply_tuning_profile(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("tuning_profile") is None:
            return data
        from infra.catalogue.tuning_profiles import apply_tuning_profile

        return apply_tuning_profile(data)

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


class ResourcesConfig(StrictModel):
    cpu_request_cores: Annotated[float, Field(gt=0)] = 4
    cpu_limit_cores: Annotated[float, Field(gt=0)] | None = None
    """No CPU limit by default: CFS throttling stalls tokenization and the scheduler loop."""
    memory_request_gib: Annotated[float, Field(gt=0)] = 32
    memory_limit_gib: Annotated[float, Field(gt=0)] = 64
    shm_size_gib: Annotated[float, Field(gt=0)] = 8
    """Memory-backed /dev/shm on every vLLM pod (NCCL and the engine's IPC use it)."""

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> ResourcesConfig:
        if self.memory_request_gib > self.memory_limit_gib:
            raise ConfigProblem("memory_request_gib is larger than memory_limit_gib; raise the limit",
                                at=("memory_request_gib",))
        if self.cpu_limit_cores is not None and self.cpu_request_cores > self.cpu_limit_cores:
            raise ConfigProblem("cpu_request_cores is larger than cpu_limit_cores", at=("cpu_request_cores",))
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
    weight_load_mib_per_second: Annotated[float, Field(gt=0)] = 1000
    """Sustained read speed of the weights into GPU memory (node-local NVMe: ~1000–2000 MiB/s)."""
    shared_volume_mib_per_second: Annotated[float, Field(gt=0)] = 300
    """Copy speed from the shared EFS volume onto node NVMe for a cold node."""
    compile_seconds: Annotated[int, Field(ge=0)] = 240
    """torch.compile + CUDA-graph capture on a cold compile cache."""
    safety_factor: Annotated[float, Field(ge=1, le=5)] = 1.5
    probe_period_seconds: Annotated[int, Field(ge=1, le=60)] = 10


class DrainConfig(StrictModel):
    pre_stop_sleep_seconds: Annotated[int, Field(ge=0, le=300)] = 15
    """Time for load balancers to stop sending new requests before vLLM is told to stop."""
    shutdown_timeout_seconds: Annotated[int, Field(ge=0, le=3600)] = 120
    """vLLM `--shutdown-timeout`: how long in-flight (streaming) requests may finish."""


class SecretRefConfig(StrictModel):
    """A secret in the configured secret store (never its value)."""

    name: Annotated[str, Field(min_length=1, max_length=512)]
    """Secrets Manager secret name, Vault path, or Kubernetes Secret name."""
    key: Annotated[str, Field(min_length=1)] = "value"
    """Key inside the secret (JSON key for Secrets Manager, field for Vault/Kubernetes)."""


class ModelConfig(StrictModel):
    name: Annotated[str, dns_label(40)]
    """DNS-safe, unique; the model's namespace is `vllm-<name>`."""
    served_model_name: str | None = None
    """The `model` clients send in OpenAI requests; defaults to `name`."""
    source: ModelSourceConfig
    architecture: ArchitectureConfig = ArchitectureConfig()
    gpu_group: str
    gpus_per_replica: Annotated[int, Field(ge=1, le=8)] = 1
    """GPUs of one pod = vLLM tensor-parallel size."""
    replicas: Annotated[int, Field(ge=0)] = 1
    """Fixed replica count, used when autoscaling is off."""
    autoscaling: AutoscalingConfig = AutoscalingConfig()
    vllm: VllmEngineConfig = VllmEngineConfig()
    resources: ResourcesConfig = ResourcesConfig()
    startup: StartupConfig = StartupConfig()
    drain: DrainConfig = DrainConfig()
    api_key_secret: SecretRefConfig | None = None
    """Defaults to `vllm-platform/<stack>/<model>/api-key`, key `value`, in the secret store."""
    hf_token_secret: SecretRefConfig | None = None
    """Needed when source.requires_hf_token; defaults like api_key_secret with `hf-token`."""
    ingress_host: str | None = None
    """Public hostname; defaults to `<name>.<ingress.domain>` when ingress is on."""
    min_available: Annotated[int, Field(ge=0)] = 1
    """PodDisruptionBudget: replicas kept serving during voluntary disruptions."""

    @property
    def namespace(self) -> str:
        return f"vllm-{self.name}"

    @property
    def tensor_parallel_size(self) -> int:
        return self.gpus_per_replica

    @property
    def openai_model_name(self) -> str:
        return self.served_model_name or self.name

    @property
    def max_replicas(self) -> int:
        return self.autoscaling.max_replicas if self.autoscaling.enabled else self.replicas
