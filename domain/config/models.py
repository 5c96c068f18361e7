"""Per-model settings: source, placement, replicas/autoscaling, vLLM engine, pod resources."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from domain.config.architecture import ArchitectureConfig, CapacityPlanningConfig
from domain.config.autoscaling import AutoscalingConfig
from domain.config.base import INT32_MAX, Hostname, PinnedImage, StrictModel, dns_label
from domain.config.engine import (
    DrainConfig,
    HealthProbesConfig,
    ParallelismConfig,
    ResourcesConfig,
    StartupConfig,
    VllmEngineConfig,
)
from domain.config.errors import ConfigProblem
from domain.config.lora import LoraConfig
from domain.config.rollout import RolloutConfig
from domain.config.source import ModelSourceConfig
from domain.versions import VLLM_EFA_IMAGE, VLLM_IMAGE

RoutingPolicy = Literal["cache_aware", "round_robin", "consistent_hash", "power_of_two", "random"]
"""vllm-router 0.1.17's policies the stack offers (docs/routing.md, "Policies")."""


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
