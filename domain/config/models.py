"""Per-model settings: source, placement, replicas/autoscaling, vLLM engine, pod resources."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from domain.catalogue.tuning_profiles import UnknownTuningProfileError, apply_tuning_profile
from domain.config.base import INT32_MAX, Hostname, PinnedImage, StrictModel, dns_label
from domain.config.errors import ConfigProblem
from domain.config.rollout import RolloutConfig
from domain.config.source import ModelSourceConfig
from domain.versions import VLLM_EFA_IMAGE, VLLM_IMAGE

RoutingPolicy = Literal["cache_aware", "round_robin", "consistent_hash", "power_of_two", "random"]
"""vllm-router 0.1.17's policies the stack offers (docs/routing.md, "Policies")."""


LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
"""The adapter ranks vLLM 0.32.0 can reserve room for (`--max-lora-rank` choices, in the flags snapshot
infra/data/vllm-0.32.0-server-flags.json)."""

_ADAPTER_NAME = r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,99}$"


class LoraAdapterConfig(StrictModel):
    """One LoRA adapter served on top of the model: clients name it as the request's `model`."""

    name: Annotated[str, Field(pattern=_ADAPTER_NAME)]
    """The `model` clients send to reach this adapter (unique across every model's served names);
    letters, digits, `.`, `_`, `+`, `-`, not starting with `.` or `-` (it is also a directory name)."""
    source: ModelSourceConfig
    """Where the adapter's files (adapter_config.json, adapter_model.safetensors) live, pinned to a
    revision exactly like the model's own `source`."""
    rank: Annotated[int, Field(ge=1, le=512)]
    """The adapter's LoRA rank (`r` in its adapter_config.json); at most `max_lora_rank`. The
    preloader refuses an adapter whose file says otherwise."""


class LoraConfig(StrictModel):
    """LoRA adapters served by the model's own replicas (vLLM `--enable-lora`; docs/lora.md)."""

    adapters: list[LoraAdapterConfig] = []
    """Adapters preloaded beside the weights and registered at start (`--lora-modules`)."""
    max_loras: Annotated[int, Field(ge=1, le=256)] = 1
    """Adapters usable in one batch (`--max-loras`): GPU memory for this many adapters of
    `max_lora_rank` is set aside at start (the capacity plan counts it); requests for more wait."""
    max_lora_rank: LoraRank = 16
    """Largest adapter rank served (`--max-lora-rank`); sizes the GPU reservation."""
    max_cpu_loras: Annotated[int, Field(ge=1, le=4096)] | None = None
    """Adapters kept in host memory, ready to swap onto the GPU (`--max-cpu-loras`); at least
    max_loras; null = vLLM's default, max_loras."""
    runtime_loading: bool = False
    """Let holders of the model's API key load and unload adapters at run time
    (`/v1/load_lora_adapter`, vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING`). Off: the adapters are
    exactly the pinned list above. On is a trust decision: any key holder can make the server fetch
    and run weights from any path or Hugging Face repo it can reach (docs/lora.md)."""

    @model_validator(mode="after")
    def _adapters_fit(self) -> LoraConfig:
        seen: dict[str, int] = {}
        for index, adapter in enumerate(self.adapters):
            if adapter.name in seen:
                raise ConfigProblem(
                    f"duplicate adapter name (also adapters[{seen[adapter.name]}]); each adapter is one "
                    "served model name",
                    at=("adapters", index, "name"),
                    value=adapter.name,
                )
            seen[adapter.name] = index
            if adapter.rank > self.max_lora_rank:
                raise ConfigProblem(
                    f"rank {adapter.rank} is larger than max_lora_rank {self.max_lora_rank}; raise "
                    "max_lora_rank (GPU memory is set aside for max_loras adapters of that rank)",
                    at=("adapters", index, "rank"),
                    value=adapter.rank,
                )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ConfigProblem(
                f"max_cpu_loras {self.max_cpu_loras} is below max_loras {self.max_loras} (vLLM refuses "
                "to start); raise it or leave it unset",
                at=("max_cpu_loras",),
                value=self.max_cpu_loras,
            )
        if not self.adapters and not self.runtime_loading:
            raise ConfigProblem(
                "LoRA is on but serves nothing: list adapters, or set runtime_loading: true, or remove lora",
                at=("adapters",),
                value=[],
            )
        return self

    @property
    def cpu_cache_size(self) -> int:
        """Adapters vLLM keeps in host memory (`--max-cpu-loras`, vLLM's default max_loras)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras


class ArchitectureConfig(StrictModel):
    """The model's shape, as in its config.json: what the capacity planner sizes memory from.

    Either name a `preset` from domain/catalogue/model_shapes.yaml or give the numbers.
    """

    preset: str | None = None
    """A shape from domain/catalogue/model_shapes.yaml (e.g. `llama-3.1-8b`); fields set here override it."""
    architecture_class: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")] | None = None
    """The model class (config.json `architectures[0]`, e.g. `LlamaForCausalLM`); presets carry it.
    Needed with `lora`: whether the pinned vLLM serves LoRA adapters depends on it."""
    parameters_billion: Annotated[float, Field(gt=0)] | None = None
    """Declared parameter count; by default counted from the shape (docs/capacity.md)."""
    num_hidden_layers: Annotated[int, Field(gt=0)] | None = None
    """Transformer layers (config.json `num_hidden_layers`)."""
    hidden_size: Annotated[int, Field(gt=0)] | None = None
    """Model width (config.json `hidden_size`)."""
    num_attention_heads: Annotated[int, Field(gt=0)] | None = None
    """Query heads; must divide by gpus_per_replica."""
    num_key_value_heads: Annotated[int, Field(gt=0)] | None = None
    """KV heads (grouped-query attention); defaults to num_attention_heads."""
    head_dim: Annotated[int, Field(gt=0)] | None = None
    """Defaults to hidden_size / num_attention_heads."""
    intermediate_size: Annotated[int, Field(gt=0)] | None = None
    """MLP width of dense layers (for Mixtral-style MoE, of each expert)."""
    vocab_size: Annotated[int, Field(gt=0)] | None = None
    """Vocabulary size (embeddings and LM head)."""
    max_position_embeddings: Annotated[int, Field(gt=0)] | None = None
    """The longest context the model supports; vllm.max_model_len may not exceed it."""
    sliding_window: Annotated[int, Field(gt=0)] | None = None
    """Every attention layer attends only to this many past tokens (Mistral-7B v0.1: 4096)."""
    qkv_bias: bool | None = None
    """Q/K/V projections carry biases (Qwen2 family)."""
    attention_output_bias: bool | None = None
    """Whether the attention output projection has a bias."""
    num_experts: Annotated[int, Field(gt=0)] | None = None
    """Routed experts per MoE layer (config.json num_local_experts / n_routed_experts)."""
    num_experts_per_token: Annotated[int, Field(gt=0)] | None = None
    """MoE: experts routed per token."""
    moe_intermediate_size: Annotated[int, Field(gt=0)] | None = None
    """Width of each routed expert; defaults to intermediate_size."""
    num_shared_experts: Annotated[int, Field(ge=0)] | None = None
    """Always-active experts of DeepSeek-style MoE layers."""
    first_dense_layers: Annotated[int, Field(ge=0)] | None = None
    """Leading layers with a dense MLP instead of experts (config.json first_k_dense_replace)."""
    kv_lora_rank: Annotated[int, Field(gt=0)] | None = None
    """Multi-head latent attention (DeepSeek): the compressed KV width cached per token."""
    q_lora_rank: Annotated[int, Field(gt=0)] | None = None
    """MLA: query low-rank dimension (DeepSeek-style attention)."""
    qk_rope_head_dim: Annotated[int, Field(gt=0)] | None = None
    """MLA: rotary part of each query/key head."""
    qk_nope_head_dim: Annotated[int, Field(gt=0)] | None = None
    """MLA: non-rotary part of each query/key head."""
    v_head_dim: Annotated[int, Field(gt=0)] | None = None
    """MLA: value head dimension."""
    tie_word_embeddings: bool | None = None
    """The output projection shares the embedding matrix (not stored twice)."""
    weight_dtype: Literal["bfloat16", "float16", "float32", "fp8", "int8", "int4"] | None = None
    """Precision of the checkpoint's linear layers (default bfloat16; int4 for AWQ/GPTQ checkpoints)."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        from domain.catalogue.model_shapes import model_shape_presets

        known = sorted(model_shape_presets())
        if value is not None and value not in known:
            import difflib

            close = difflib.get_close_matches(value, known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise ValueError(
                f"unknown preset: {hint}domain/catalogue/model_shapes.yaml knows {', '.join(known)}; "
                "or leave preset out and give the numbers from the model's config.json (docs/capacity.md)"
            )
        return value

    @model_validator(mode="after")
    def _enough_to_plan(self) -> ArchitectureConfig:
        shape = self.resolved()
        missing = [key for key in ARCHITECTURE_REQUIRED_KEYS if shape.get(key) is None]
        if missing:
            raise ConfigProblem(
                f"the capacity planner needs {', '.join(missing)} (from the model's config.json), "
                "or a preset such as 'llama-3.1-8b' (docs/capacity.md)",
                at=(missing[0],),
            )
        heads = shape["num_attention_heads"]
        kv_heads = shape.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise ConfigProblem(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
                at=("num_key_value_heads",),
            )
        if shape.get("kv_lora_rank") is not None:
            for key in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
                if shape.get(key) is None:
                    raise ConfigProblem(
                        f"multi-head latent attention (kv_lora_rank) also needs {key}", at=(key,)
                    )
        if shape.get("num_experts") is not None:
            per_token = shape.get("num_experts_per_token")
            if per_token is None or per_token > shape["num_experts"]:
                raise ConfigProblem(
                    "a MoE model needs num_experts_per_token between 1 and num_experts "
                    f"({shape['num_experts']})",
                    at=("num_experts_per_token",),
                    value=per_token,
                )
        return self

    def resolved(self) -> dict[str, Any]:
        """The preset's values with every field set explicitly in the stack file on top."""
        from domain.catalogue.model_shapes import lookup_preset

        preset = lookup_preset(self.preset) if self.preset else None
        values = dict(preset.architecture) if preset else {}
        values.update({name: getattr(self, name) for name in self.model_fields_set if name != "preset"})
        return values


ARCHITECTURE_REQUIRED_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


class CapacityPlanningConfig(StrictModel):
    """What the capacity plan reports concurrency for, besides one full `max_model_len` request."""

    typical_input_tokens: Annotated[int, Field(ge=1)] = 512
    """Prompt length of a typical request."""
    typical_output_tokens: Annotated[int, Field(ge=1)] = 256
    """Completion length of a typical request."""


class AutoscalingMetricConfig(StrictModel):
    """One autoscaling signal: a metric and the per-replica average the HPA holds it at."""

    metric: str
    """Prometheus series: vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc,
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (per pod) or vllm_router_running_requests (the model's requests in
    flight through the router; needs router.enabled) — the catalogue in components/adapter_rules.py,
    docs/autoscaling.md. DCGM_FI_DEV_GPU_UTIL is refused: it reads full at one request."""
    target_average_value: Annotated[float, Field(gt=0)]
    """Per-replica average the autoscaler holds the metric at, in the metric's unit (requests, fraction
    0–1 of the KV cache, fraction 0–1 of tensor-pipe cycles); at most three decimals (a Kubernetes
    quantity)."""


def _default_autoscaling_metrics() -> list[AutoscalingMetricConfig]:
    return [
        AutoscalingMetricConfig(metric="vllm:num_requests_waiting", target_average_value=5),
        AutoscalingMetricConfig(metric="vllm:kv_cache_usage_perc", target_average_value=0.8),
    ]


class AutoscalingConfig(StrictModel):
    """Replicas driven by vLLM's queue and KV-cache usage, optionally DCGM's tensor-pipe activity
    (docs/autoscaling.md)."""

    enabled: bool = False
    """Off: the Deployment runs `replicas` pods. On: an autoscaler owns the replica count."""
    backend: Literal["hpa", "keda"] = "keda"
    """`keda` (default): a KEDA ScaledObject with Prometheus triggers (needs addons.keda, on by default
    in mode eks); the only backend that scales to zero. `hpa`: autoscaling/v2 HPA on Pods metrics from
    the Prometheus Adapter, which its maintainers propose to deprecate
    (kubernetes-sigs/prometheus-adapter#701); still supported."""
    min_replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] = 1
    """Fewest replicas the autoscaler keeps. 0 (opt-in, backend keda, router.enabled): the model
    scales to zero after `idle_seconds_before_zero` without requests, and the router holds the
    requests that wake it (docs/autoscaling.md, "Scale to zero")."""
    idle_seconds_before_zero: Annotated[int, Field(ge=60, le=86400)] = 900
    """min_replicas 0: seconds without a request through the router (and nothing queued or running in
    vLLM) before the last replica goes. 15 minutes: a wake costs about a minute of waiting on a warm
    node, so only a model idle for much longer than that should give its GPUs back. At least twice
    monitoring.scrape_interval_seconds: the wake trigger's increase() needs two samples in the window."""
    wake_hold_seconds: Annotated[int, Field(ge=30, le=3600)] | None = None
    """min_replicas 0: how long the router holds a request for the model while it wakes, before it
    answers 503. null = the predicted wake time (`vllm-platform plan`) × startup.safety_factor; a
    value below the predicted wake is refused."""
    max_replicas: Annotated[int, Field(ge=1, le=INT32_MAX)] = 2
    """Most replicas; sizes the namespace's GPU quota."""
    metrics: Annotated[list[AutoscalingMetricConfig], Field(min_length=1)] = Field(
        default_factory=_default_autoscaling_metrics
    )
    """Signals; the autoscaler follows whichever asks for the most replicas. Default: queue depth 5,
    KV cache 0.8 (vLLM's own signals lead: they grow with the load users put on a replica)."""
    scale_up_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """Scale up on the first reading above target: a new replica takes minutes to load the model."""
    scale_up_pods_per_period: Annotated[int, Field(ge=1)] = 4
    """Scale-up: most pods added per period."""
    scale_up_percent_per_period: Annotated[int, Field(ge=1, le=1000)] = 100
    """Per `scale_up_period_seconds`, add up to the larger of this many pods and this percentage."""
    scale_up_period_seconds: Annotated[int, Field(ge=15, le=1800)] = 60
    """Scale-up policy period."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 600
    """Scale down only to the highest recommendation of the last 10 minutes (bursty traffic)."""
    scale_down_pods_per_period: Annotated[int, Field(ge=1)] = 1
    """Scale-down: most pods removed per period (slow on purpose: a GPU pod takes minutes to come back)."""
    scale_down_period_seconds: Annotated[int, Field(ge=15, le=1800)] = 300
    """Remove at most `scale_down_pods_per_period` pods per this period."""
    keda_polling_interval_seconds: Annotated[int, Field(ge=5, le=300)] = 15
    """`backend: keda`: how often KEDA queries Prometheus."""
    keda_fallback_replicas: Annotated[int, Field(ge=1)] | None = None
    """`backend: keda`: replicas KEDA sets while its Prometheus query fails (its `fallback`); null =
    max_replicas: while the autoscaler is blind, capacity matters more than cost. (An HPA keeps its
    current count when its metrics fail.)"""
    keda_fallback_failure_threshold: Annotated[int, Field(ge=1, le=60)] = 3
    """`backend: keda`: failed queries in a row before the fallback applies."""

    @model_validator(mode="after")
    def _bounds_ordered(self) -> AutoscalingConfig:
        if self.keda_fallback_replicas is not None and not (
            self.min_replicas <= self.keda_fallback_replicas <= self.max_replicas
        ):
            raise ConfigProblem(
                f"keda_fallback_replicas {self.keda_fallback_replicas} is outside min_replicas "
                f"{self.min_replicas} .. max_replicas {self.max_replicas}; choose a count in that range "
                "or null (max_replicas)",
                at=("keda_fallback_replicas",),
            )
        if self.min_replicas == 0 and self.backend != "keda":
            raise ConfigProblem(
                f"min_replicas 0 needs backend 'keda' (backend is '{self.backend}'): an HPA cannot "
                "scale to zero on the adapter's metrics, and a model at zero has none; set backend: keda "
                "(with addons.keda: true) or min_replicas: 1",
                at=("min_replicas",),
            )
        if self.min_replicas > self.max_replicas:
            raise ConfigProblem(
                f"min_replicas {self.min_replicas} is larger than max_replicas {self.max_replicas}; "
                "raise max_replicas or lower min_replicas",
                at=("min_replicas",),
            )
        return self


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


class SecretRefConfig(StrictModel):
    """A secret in the configured secret store (never its value)."""

    name: Annotated[str, Field(min_length=1, max_length=512)]
    """Secrets Manager secret name, Vault path, or Kubernetes Secret name."""
    key: Annotated[str, Field(min_length=1)] = "value"
    """Key inside the secret (JSON key for Secrets Manager, field for Vault/Kubernetes)."""


class SloConfig(StrictModel):
    """A model's service-level objectives: the alert thresholds of components/alert_rules.py
    (docs/operations.md). Latencies are vLLM's own histograms, over 5-minute rates."""

    time_to_first_token_p95_seconds: Annotated[float, Field(gt=0, le=600)] = 2.0
    """p95 time to first token (vLLM's `vllm:time_to_first_token_seconds`, queueing included)."""
    inter_token_latency_p95_seconds: Annotated[float, Field(gt=0, le=60)] = 0.1
    """p95 time per output token while streaming (`vllm:inter_token_latency_seconds`)."""
    latency_for_minutes: Annotated[int, Field(ge=1, le=120)] = 10
    """A latency objective is missed this long before the alert fires."""
    error_ratio: Annotated[float, Field(gt=0, lt=1)] = 0.01
    """Share of API requests answered 5xx (vLLM's `http_requests_total`) that fires the error alert."""
    queue_minutes: Annotated[int, Field(ge=1, le=120)] = 5
    """Requests waiting the whole time and the queue not shrinking for this long: the autoscaler
    is not keeping up (at its maximum, or no GPU node for new replicas)."""
    kv_cache_usage_ratio: Annotated[float, Field(gt=0, le=1)] = 0.95
    """A pod's KV-cache usage (0–1) above this for 5 minutes: requests are about to be preempted."""


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


class ModelConfig(StrictModel):
    """One served model: its own namespace, vLLM Deployment, Service, PDB, autoscaler and ingress."""

    name: Annotated[str, dns_label(40)]
    """DNS-safe, unique; the model's namespace is `vllm-<name>`."""
    served_model_name: str | None = None
    """The `model` clients send in OpenAI requests; defaults to `name`."""
    source: ModelSourceConfig
    architecture: ArchitectureConfig
    """The model's shape: a preset or the numbers of its config.json (docs/capacity.md)."""
    gpu_group: str
    """Name of the GPU node group (node_groups.gpu) the model runs on."""
    gpus_per_replica: Annotated[int, Field(ge=1, le=8)] = 1
    """GPUs of one pod = vLLM tensor-parallel size. With parallelism.nodes_per_replica above 1: the GPUs
    of each of the replica's pods, which must be every GPU of the group's nodes (one pod per node)."""
    parallelism: ParallelismConfig = ParallelismConfig()
    """Replicas larger than one node: nodes per replica and vLLM's tensor/pipeline/data/expert split
    (docs/multi-node.md). Default: one node, tensor parallel over gpus_per_replica."""
    replicas: Annotated[int, Field(ge=0, le=INT32_MAX)] = 1
    """Fixed replica count, used when autoscaling is off."""
    autoscaling: AutoscalingConfig = AutoscalingConfig()
    slo: SloConfig = SloConfig()
    """Alert thresholds for this model (docs/operations.md)."""
    vllm: VllmEngineConfig = VllmEngineConfig()
    resources: ResourcesConfig = ResourcesConfig()
    """CPU, memory and `/dev/shm` of the vLLM container and the preloader."""
    startup: StartupConfig = StartupConfig()
    capacity: CapacityPlanningConfig = CapacityPlanningConfig()
    drain: DrainConfig = DrainConfig()
    """Graceful drain: preStop sleep and vLLM's shutdown timeout."""
    probes: HealthProbesConfig = HealthProbesConfig()
    rollout: RolloutConfig = RolloutConfig()
    """How a new revision, image or argument set replaces the pods: `rolling` or a `canary` checked
    against vLLM's metrics (docs/rollouts.md)."""
    image: PinnedImage | None = None
    """The vLLM serving image; null: the pinned one (domain/versions.py): `vllm/vllm-openai` for a
    one-node model, and for a multi-node model the same vLLM with AWS's EFA userspace
    (`ghcr.io/vllm-platform/vllm-openai-efa`, serving-image/README.md), whose libfabric EFA provider
    and aws-ofi-nccl plugin its NCCL needs between nodes. Set it to a mirror in a private registry,
    pinned to a version tag or a sha256 digest. A multi-node model's image must be known to carry EFA:
    the pinned EFA image (by tag, with or without a digest), or one marked `image_carries_efa`."""
    image_carries_efa: bool = False
    """Says that `image` carries libfabric's EFA provider and the aws-ofi-nccl plugin, with
    `LD_LIBRARY_PATH` and `NCCL_NET_PLUGIN` set as the pinned EFA image sets them: for a mirror of that
    image or a build of your own. `validate` cannot look inside an image; it takes this as said. Without
    it a multi-node model on any other image is refused: its group would stop at NCCL's start."""
    read_only_root_filesystem: bool = True
    """vLLM container with a read-only root filesystem; everything it writes goes to HOME, /tmp,
    /dev/shm and the model volume. Set false only if a vLLM feature writes elsewhere."""
    api_key_secret: SecretRefConfig | None = None
    """Defaults to `vllm-platform/<stack>/<model>/api-key`, key `value`, in the secret store."""
    hf_token_secret: SecretRefConfig | None = None
    """Needed when source.requires_hf_token; defaults like api_key_secret with `hf-token`."""
    ingress_host: Hostname | None = None
    """Public hostname; defaults to `<name>.<ingress.domain>` when ingress is on. None for a model that
    scales to zero: it has no Ingress of its own (only the router holds its requests while it wakes),
    so a hostname set here is refused."""
    router_policy: RoutingPolicy | None = None
    """How the router spreads this model's requests over its replicas; null = router.default_policy."""
    lora: LoraConfig | None = None
    """LoRA adapters served by this model's replicas under their own names (docs/lora.md); null:
    none."""
    min_available: Annotated[int, Field(ge=0)] = 1
    """PodDisruptionBudget: replicas kept serving during voluntary disruptions. When it is not below
    the fewest replicas (replicas, or autoscaling.min_replicas), the budget instead lets one pod go
    at a time, so node drains never block (docs/serving.md)."""

    @model_validator(mode="before")
    @classmethod
    def _architecture_given(cls, data: Any) -> Any:
        # Without a shape nothing can be sized, so say what to write instead of "required key".
        if isinstance(data, dict) and data.get("architecture") is None:
            from domain.catalogue.model_shapes import model_shape_presets

            raise ConfigProblem(
                "required: the capacity planner sizes GPU memory from the model's shape; set "
                f"architecture.preset to one of {', '.join(sorted(model_shape_presets()))}, or give the "
                "numbers from its config.json (docs/capacity.md)",
                at=("architecture",),
            )
        return data

    @model_validator(mode="after")
    def _candidate_engine_settings(self) -> ModelConfig:
        candidate = self.rollout.canary.candidate
        if candidate is None:
            return self
        at = ("rollout", "canary", "candidate", "vllm")
        if "tuning_profile" in candidate.vllm:
            raise ConfigProblem(
                "a candidate's engine settings are merged over the model's own, which already hold their "
                "profile's values; give the settings that differ themselves",
                at=(*at, "tuning_profile"),
                value=candidate.vllm["tuning_profile"],
            )
        try:
            self.candidate_vllm()
        except ValidationError as error:
            first = error.errors()[0]
            loc = tuple(part for part in first["loc"] if isinstance(part, (str, int)))
            message = first["msg"] + (
                "; models[].vllm has no such key" if first["type"] == "extra_forbidden" else ""
            )
            raise ConfigProblem(message, at=(*at, *loc), value=first.get("input")) from None
        return self

    def candidate_vllm(self) -> VllmEngineConfig:
        """The candidate's engine settings: `rollout.canary.candidate.vllm` over the model's own."""
        candidate = self.rollout.canary.candidate
        overrides = candidate.vllm if candidate is not None else {}
        return VllmEngineConfig.model_validate({**self.vllm.model_dump(), **overrides})

    def canary_candidate(self) -> ModelConfig | None:
        """The version under test of a multi-node canary (`rollout.canary.candidate`): this model with
        the candidate's source and engine settings, and no candidate of its own. None when there is none."""
        candidate = self.rollout.canary.candidate
        if candidate is None:
            return None
        canary = self.rollout.canary.model_copy(update={"candidate": None})
        return self.model_copy(
            update={
                "source": candidate.source or self.source,
                "vllm": self.candidate_vllm(),
                "rollout": self.rollout.model_copy(update={"canary": canary}),
            }
        )

    @property
    def namespace(self) -> str:
        return f"vllm-{self.name}"

    @property
    def nodes_per_replica(self) -> int:
        return self.parallelism.nodes_per_replica

    @property
    def is_multi_node(self) -> bool:
        """A replica is a LeaderWorkerSet group of nodes_per_replica pods (issue 42)."""
        return self.parallelism.nodes_per_replica > 1

    @property
    def serving_image(self) -> str:
        """The image of the vLLM container: `image`, else the pinned EFA image for a multi-node model
        (its members need libfabric and the NCCL plugin, issue 50) and the pinned vLLM image otherwise."""
        if self.image is not None:
            return self.image
        return VLLM_EFA_IMAGE.reference if self.is_multi_node else VLLM_IMAGE.reference

    @property
    def gpus_per_group(self) -> int:
        """Every GPU of one replica, over all its pods."""
        return self.gpus_per_replica * self.parallelism.nodes_per_replica

    @property
    def pipeline_parallel_size(self) -> int:
        """The stack's value, else one stage per node, or with data parallelism 1 (each data-parallel
        rank on one node; domain/multi_node.py)."""
        given = self.parallelism.pipeline_parallel_size
        if given is not None:
            return given
        return 1 if self.parallelism.data_parallel_size > 1 else self.parallelism.nodes_per_replica

    @property
    def data_parallel_size(self) -> int:
        return self.parallelism.data_parallel_size

    @property
    def api_server_count(self) -> int:
        """API-server processes of one pod (a multi-node group's leader): `--api-server-count` where
        extra_args set it, else vLLM 0.32.0's default, the data-parallel size (its internal load
        balancing, the only mode the stack renders: vllm/entrypoints/cli/serve.py), 1 without data
        parallelism; at most 1 with `--enable-elastic-ep`, which vLLM caps so (issue 49: the default
        was taken as 1, so a DP=2 leader's two processes each held a whole share)."""
        count = self.vllm.api_server_count_flag or self.data_parallel_size
        return 1 if "--enable-elastic-ep" in self.vllm.extra_args else count

    @property
    def tensor_parallel_size(self) -> int:
        """`--tensor-parallel-size`: gpus_per_replica on one node; across nodes the stack's value or
        the GPUs left per pipeline stage and data-parallel rank (a product that does not match is
        refused by validate, domain/multi_node.py)."""
        given = self.parallelism.tensor_parallel_size
        if given is not None:
            return given
        return max(1, self.gpus_per_group // (self.pipeline_parallel_size * self.data_parallel_size))

    @property
    def openai_model_name(self) -> str:
        return self.served_model_name or self.name

    @property
    def adapter_names(self) -> list[str]:
        """The served names of this model's LoRA adapters, in config order."""
        return [adapter.name for adapter in self.lora.adapters] if self.lora else []

    @property
    def needs_hf_token(self) -> bool:
        """The preloader fetches the model or one of its adapters from a gated Hugging Face repo."""
        sources = [self.source, *(adapter.source for adapter in (self.lora.adapters if self.lora else []))]
        return any(source.requires_hf_token for source in sources)

    @property
    def max_replicas(self) -> int:
        return self.autoscaling.max_replicas if self.autoscaling.enabled else self.replicas

    @property
    def scales_to_zero(self) -> bool:
        """autoscaling on with min_replicas 0: the router holds its requests while it wakes."""
        return self.autoscaling.enabled and self.autoscaling.min_replicas == 0
