"""The root of the typed config and the cross-section checks (models ↔ node groups ↔ switches)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from infra.config.base import StrictModel
from infra.config.cluster import ClusterConfig, NodeGroupsConfig
from infra.config.errors import ConfigProblem
from infra.config.models import ModelConfig


class StorageConfig(StrictModel):
    model_bucket_name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")] | None = None
    """S3 bucket for model weights (created in mode `eks`); defaults to `<cluster-name>-model-weights`."""
    efs_throughput_mode: Literal["elastic", "bursting"] = "elastic"
    """Elastic: burst to GB/s when many replicas load at once, pay per byte."""
    model_volume_size_gib: Annotated[int, Field(ge=10)] = 1000
    """Size asked for by the model PVC (EFS does not enforce it; quota tooling reads it)."""
    existing_efs_file_system_id: Annotated[str, Field(pattern=r"^fs-[0-9a-f]{8,17}$")] | None = None
    """Mode `existing`: the EFS file system that backs the shared model volume."""


class SecretStoreConfig(StrictModel):
    provider: Literal["aws-secrets-manager", "vault", "kubernetes-secret"] = "aws-secrets-manager"
    """Where API keys and tokens live; `kubernetes-secret` is an explicit opt-in for clusters with
    neither Secrets Manager nor Vault."""
    vault_address: str | None = None
    vault_role: str | None = None
    vault_kubernetes_mount_path: str = "kubernetes"

    @model_validator(mode="after")
    def _vault_settings(self) -> SecretStoreConfig:
        if self.provider == "vault" and not (self.vault_address and self.vault_role):
            raise ConfigProblem(
                "the Vault provider needs vault_address (e.g. https://vault.example.com:8200) and vault_role",
                at=("vault_address" if not self.vault_address else "vault_role",),
            )
        return self


class SecurityConfig(StrictModel):
    secret_store: SecretStoreConfig = SecretStoreConfig()
    network_policies: bool = True
    """Default-deny NetworkPolicy per model namespace with explicit allows."""
    ingress_controller_namespace: str = "kube-system"
    """Namespace of the ingress controller allowed to reach vLLM pods (ALB target type `ip`)."""


class IngressConfig(StrictModel):
    enabled: bool = True
    class_name: str = "alb"
    scheme: Literal["internal", "internet-facing"] = "internal"
    domain: str | None = None
    """Models get `<model>.<domain>` unless they set ingress_host."""
    certificate_arn: Annotated[str, Field(pattern=r"^arn:aws[-a-z]*:acm:[a-z0-9-]+:\d{12}:certificate/.+$")] | None = None
    """ACM certificate for TLS; when unset the AWS Load Balancer Controller discovers one by host."""
    idle_timeout_seconds: Annotated[int, Field(ge=60, le=4000)] = 3600
    """ALB idle timeout: long enough that an SSE stream waiting on a queued request is not cut."""
    inbound_cidrs: list[str] = []


class MonitoringConfig(StrictModel):
    enabled: bool = True
    prometheus: Literal["kube-prometheus-stack", "existing"] = "kube-prometheus-stack"
    existing_prometheus_url: str | None = None
    namespace: str = "monitoring"
    scrape_interval_seconds: Annotated[int, Field(ge=5, le=120)] = 15
    retention_days: Annotated[int, Field(ge=1, le=365)] = 15


class AddonsConfig(StrictModel):
    """Cluster add-ons from pinned upstream charts (versions in infra/versions.py)."""

    nvidia_device_plugin: bool = True
    dcgm_exporter: bool = True
    prometheus_adapter: bool = True
    keda: bool = False
    efs_csi_driver: bool = True
    secrets_store_csi_driver: bool = True
    aws_load_balancer_controller: bool = True
    metrics_server: bool = True
    image_prepull: bool = True
    """Pull the pinned vLLM image on every GPU node ahead of scale-up."""


class PlatformConfig(StrictModel):
    cluster: ClusterConfig = ClusterConfig()
    node_groups: NodeGroupsConfig
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    storage: StorageConfig = StorageConfig()
    security: SecurityConfig = SecurityConfig()
    ingress: IngressConfig = IngressConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    addons: AddonsConfig = AddonsConfig()

    @model_validator(mode="after")
    def _models_fit_their_groups(self) -> PlatformConfig:
        seen: dict[str, int] = {}
        for index, model in enumerate(self.models):
            if model.name in seen:
                raise ConfigProblem(
                    f"duplicate model name (also models[{seen[model.name]}]); model names must be unique "
                    "because each gets its own namespace",
                    at=("models", index, "name"),
                )
            seen[model.name] = index
            group = self.node_groups.gpu.get(model.gpu_group)
            if group is None:
                known = ", ".join(sorted(self.node_groups.gpu))
                raise ConfigProblem(
                    f"no GPU node group of that name; node_groups.gpu defines: {known}",
                    at=("models", index, "gpu_group"),
                )
            too_small = [i.name for i in group.gpu_instances if i.gpus_per_node < model.gpus_per_replica]
            if too_small:
                largest = max(i.gpus_per_node for i in group.gpu_instances)
                raise ConfigProblem(
                    f"one replica needs {model.gpus_per_replica} GPUs on one node, but {', '.join(too_small)} in "
                    f"group '{model.gpu_group}' {'has' if len(too_small) == 1 else 'have'} fewer; use at most "
                    f"{largest} GPUs per replica or an instance type with more GPUs per node",
                    at=("models", index, "gpus_per_replica"),
                )
            if model.autoscaling.enabled and model.autoscaling.backend == "keda" and not self.addons.keda:
                raise ConfigProblem(
                    "autoscaling backend 'keda' needs the KEDA add-on; set addons.keda: true or use backend 'hpa'",
                    at=("models", index, "autoscaling", "backend"),
                )
        if self.cluster.mode == "existing" and self.storage.existing_efs_file_system_id is None:
            raise ConfigProblem(
                "mode 'existing' needs the EFS file system that backs the shared model volume "
                "(storage.existing_efs_file_system_id, e.g. fs-0123456789abcdef0)",
                at=("storage", "existing_efs_file_system_id"),
                value=None,
            )
        if self.monitoring.prometheus == "existing" and not self.monitoring.existing_prometheus_url:
            raise ConfigProblem(
                "monitoring.prometheus 'existing' needs existing_prometheus_url "
                "(e.g. http://prometheus-operated.monitoring.svc:9090) for the Prometheus Adapter",
                at=("monitoring", "existing_prometheus_url"),
                value=None,
            )
        return self
