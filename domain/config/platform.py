"""The root of the typed config and the cross-section checks (models ↔ node groups ↔ switches)."""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, model_validator

from domain.config.base import (
    Cidr,
    Hostname,
    Labels,
    PinnedImage,
    StrictModel,
    dns_label,
    reject_retired_keys,
)
from domain.config.cluster import ClusterConfig, NodeGroupsConfig
from domain.config.errors import ConfigProblem
from domain.config.models import ModelConfig, RoutingPolicy, SecretRefConfig
from domain.config.tenants import TenantConfig
from domain.versions import MODEL_CACHE_IMAGE, VLLM_IMAGE


class StorageConfig(StrictModel):
    """Model weights: the S3 bucket (source of record) and the shared EFS volume."""

    model_bucket_name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")] | None = None
    """S3 bucket for model weights (created in mode `eks`); defaults to `<cluster-name>-model-weights`."""
    efs_throughput_mode: Literal["elastic", "bursting"] = "elastic"
    """Elastic: burst to GB/s when many replicas load at once, pay per byte."""
    model_volume_size_gib: Annotated[int, Field(ge=10)] = 1000
    """Size asked for by the model PVC (EFS does not enforce it; quota tooling reads it)."""
    existing_efs_file_system_id: Annotated[str, Field(pattern=r"^fs-[0-9a-f]{8,17}$")] | None = None
    """Mode `existing`: the EFS file system that backs the shared model volume."""
    preloader_image: PinnedImage = MODEL_CACHE_IMAGE.reference
    """Image of the model-cache init container that fills the shared volume and node NVMe with the
    weights (model-cache/README.md). The default is the release published with this version of the
    stack; set it to your mirror of that image in a private registry, pinned to a version tag or a
    sha256 digest (`latest` and untagged references are rejected)."""


class SecretStoreConfig(StrictModel):
    """The secret store the Secrets Store CSI driver reads."""

    provider: Literal["aws-secrets-manager", "vault", "kubernetes-secret"] = "aws-secrets-manager"
    """Where API keys and tokens live; `kubernetes-secret` is an explicit opt-in for clusters with
    neither Secrets Manager nor Vault."""
    vault_address: str | None = None
    """Vault URL (provider `vault`)."""
    vault_role: str | None = None
    """Vault Kubernetes-auth role the model pods log in with (provider `vault`)."""
    vault_kubernetes_mount_path: str = "kubernetes"
    """Vault's Kubernetes auth mount path (provider `vault`)."""

    @model_validator(mode="after")
    def _vault_settings(self) -> SecretStoreConfig:
        if self.provider == "vault" and not (self.vault_address and self.vault_role):
            raise ConfigProblem(
                "the Vault provider needs vault_address (e.g. https://vault.example.com:8200) and vault_role",
                at=("vault_address" if not self.vault_address else "vault_role",),
            )
        return self


class SecurityConfig(StrictModel):
    """Secret store, network policies."""

    secret_store: SecretStoreConfig = SecretStoreConfig()
    """Where API keys and tokens come from (Secrets Store CSI driver provider)."""
    network_policies: bool = True
    """Default-deny NetworkPolicy per model namespace with explicit allows."""
    ingress_controller_namespace: str = "kube-system"
    """With an ingress class other than `alb` (e.g. ingress-nginx): the namespace whose controller
    pods proxy to vLLM and may reach its port. With `alb` the load balancer connects from its own
    ENIs (target type `ip`), so no namespace is admitted, only `load_balancer_source_cidrs`."""
    ingress_controller_pod_labels: Labels = Field(default_factory=dict)
    """With a class other than `alb`: labels of the controller pods in that namespace (empty: every
    pod of the namespace); e.g. `{app.kubernetes.io/name: ingress-nginx}`."""
    load_balancer_source_cidrs: list[Cidr] = []
    """Mode `existing` with ingress class `alb`: CIDRs of the subnets the ALB's ENIs live in (the
    subnets tagged `kubernetes.io/role/elb` or `internal-elb` for its scheme). Only these reach
    vLLM's port from outside the cluster's pods. Mode `eks` computes them (the stack's public or
    internal load-balancer subnets) and rejects this key."""
    prometheus_pod_labels: Labels = Field(default_factory=lambda: {"app.kubernetes.io/name": "prometheus"})
    """Labels of the Prometheus server pods (in `monitoring.namespace`) that scrape vLLM's
    `/metrics` and the router's metrics ports; the kube-prometheus-stack default. Nothing else in
    that namespace reaches vLLM or the router."""
    operator_key_secret: SecretRefConfig | None = None
    """The operator key in the secret store (never its value): the only key that reaches vLLM's
    routes other than inference and `/v1/models` (LoRA loading, elastic EP, abort, SageMaker
    `/adapters`, profiling; docs/security.md, "Routes"), mounted into every vLLM pod like the
    tenants' keys and re-read on rotation. Unset: no key reaches those routes."""
    max_request_body_mib: Annotated[int, Field(ge=1, le=1024)] = 16
    """Largest request body a vLLM pod reads, in MiB: past it the API-key middleware answers 413
    before vLLM parses anything. 16 MiB holds a full-context text prompt many times over and a few
    base64 images; raise it for large multimodal inputs."""
    max_request_json_values: Annotated[int, Field(ge=1024, le=16 * 1024 * 1024)] | None = None
    """Most values (array elements, object members, containers) a JSON request body may hold: the
    API-key middleware counts them as the body arrives and answers 413 past it, before vLLM parses
    anything (issue 40: 5.6 million empty objects in 16 MiB stalled every tenant of the pod). Unset
    (the default): per model, 4 x its `vllm.max_model_len` + 16,384 (`server_auth.max_json_values`):
    a prompt of token IDs as long as the context, or a chat whose every message holds at least one
    token (a message costs at most 4 values beyond its tokens' text), plus room for tool schemas.
    Every value costs the pod's event loop its share of two parses (the middleware's and vLLM's), so
    the bound keeps one tenant's worst body as cheap as a long but valid one (docs/security.md, "One
    tenant cannot stall the others"). Set it to allow batches of token-ID prompts beyond that."""
    tenant_body_loop_share: Annotated[float, Field(gt=0, le=1)] = 0.25
    """With tenants: the most of a vLLM pod's API event loop (the one that answers `/health` and every
    tenant) one tenant's request bodies may take. The middleware times its own check of each body
    (the scan and the parse; vLLM's parse of the same bytes is counted as costing as much again) and
    holds a tenant's next body until its earlier ones fit this share: a tenant sending its worst
    bodies back to back waits, the others and the probes do not (issue 40; docs/security.md, "One
    tenant cannot stall the others"). Ordinary bodies cost microseconds and never wait noticeably. 1:
    no pacing."""
    tenants_share_prefix_cache: bool = False
    """With tenants: whether tenants on one model share vLLM's prefix cache. False (the default):
    the middleware gives each tenant's requests a `cache_salt` of its own, so no tenant reuses, or can
    time, another tenant's cached prompt blocks; true: requests pass as sent (one tenant can then learn
    from the cache whether another just sent a prompt; docs/security.md, "Tenants")."""


class IngressConfig(StrictModel):
    """Public TLS ingress for the OpenAI API (only `/v1` is routed)."""

    enabled: bool = True
    """Create one Ingress per model."""
    class_name: str = "alb"
    """IngressClass; `alb` gets the AWS Load Balancer Controller annotations."""
    scheme: Literal["internal", "internet-facing"] = "internal"
    """`internal` or `internet-facing` load balancer."""
    domain: Hostname | None = None
    """Models get `<model>.<domain>` unless they set ingress_host (an RFC 1123 DNS name)."""
    certificate_arn: (
        Annotated[str, Field(pattern=r"^arn:aws[-a-z]*:acm:[a-z0-9-]+:\d{12}:certificate/.+$")] | None
    ) = None
    """ACM certificate for TLS; when unset the AWS Load Balancer Controller discovers one by host."""
    idle_timeout_seconds: Annotated[int, Field(ge=60, le=4000)] = 3600
    """ALB idle timeout: long enough that an SSE stream waiting on a queued request is not cut."""
    inbound_cidrs: list[Cidr] = []
    """CIDRs allowed to reach the load balancer (empty: the controller's default)."""
    wafv2_acl_arn: (
        Annotated[str, Field(pattern=r"^arn:aws[-a-z]*:wafv2:[a-z0-9-]+:\d{12}:regional/webacl/.+$")] | None
    ) = None
    """Class `alb`: an AWS WAF (v2, regional) web ACL to attach to the load balancer, e.g. one with a
    rate-based rule per client IP (docs/security.md); unset: none."""
    requests_without_tenant_key_per_minute: Annotated[int, Field(ge=10, le=2_000_000_000)] = 60
    """With tenants' rate limits (the web ACL the stack creates): most requests per minute from one
    client address whose `Authorization` carries no tenant's key prefix (no key, another scheme, a
    key of no tenant), answered 429 by AWS WAF past it. They are refused anyway (401 from the vLLM
    pods or, for a model at zero, the router's wake gate); this bounds what they cost."""


"""vllm-router 0.1.17's policies that work in its multi-model mode (docs/routing.md, "Policies")."""


class RouterConfig(StrictModel):
    """One OpenAI endpoint for every model: vLLM's router, by model name and prefix (docs/routing.md)."""

    enabled: bool = False
    """Deploy the router (namespace `vllm-router`) in front of every model."""
    replicas: Annotated[int, Field(ge=2, le=20)] = 2
    """Router pods, spread over zones; at least two so a node drain or zone loss keeps the endpoint."""
    host: Hostname | None = None
    """Public hostname of the unified endpoint (a DNS name, not a URL); defaults to
    `api.<ingress.domain>` when ingress is on."""
    default_policy: RoutingPolicy = "cache_aware"
    """How a model's requests are spread over its replicas unless the model sets `router_policy`:
    `cache_aware` (prefix-aware: the replica whose cache most likely holds the prompt's prefix, least
    loaded when none does or load is unbalanced), `round_robin`, `consistent_hash` (session affinity
    on the `x-session-id` header), `power_of_two`, `random`."""
    per_model_hostnames: bool = True
    """Keep each model's own Ingress (`<model>.<domain>`) beside the unified one."""
    cpu_request_cores: Annotated[float, Field(gt=0, le=64)] = 0.5
    """CPU request of each router process in a pod (the front, and one per model); no limit:
    throttling would add latency to every token."""
    memory_request_gib: Annotated[float, Field(gt=0, le=256)] = 0.5
    """Memory request of each router process; the limit is twice this (prefix trees grow with
    traffic until evicted)."""
    health_check_interval_seconds: Annotated[int, Field(ge=1, le=300)] = 5
    """How often the router probes each vLLM pod's /health; a pod failing `health_failure_threshold`
    probes in a row gets no new requests until it passes again."""
    health_failure_threshold: Annotated[int, Field(ge=1, le=10)] = 2
    """Failed probes before a pod is ejected."""
    max_retries: Annotated[int, Field(ge=1, le=10)] = 3
    """Attempts per request on another pod after a connection error or a 5xx/429 answer; only
    before the first byte reaches the client (a stream is never replayed)."""
    registration_interval_seconds: Annotated[int, Field(ge=1, le=60)] = 5
    """How often the registrar sidecar re-registers each model's router with the front router."""
    drain_seconds: Annotated[int, Field(ge=0, le=600)] = 30
    """preStop sleep of a router pod, so the load balancer deregisters it before it stops taking
    connections; streams in flight then get `request_timeout_seconds`-bounded time to finish."""
    request_timeout_seconds: Annotated[int, Field(ge=30, le=86400)] = 1800
    """Longest request the router proxies (a whole SSE stream)."""


CHART_VERSION_KEYS = ("chart_version", "aws_provider_chart_version")


def reject_chart_version(data: Any) -> None:
    """Charts are pinned and locked: a stack cannot install a version that is not in the lock."""
    why = (
        "every chart is pinned in domain/versions.py and locked in components/helm/charts.lock.yaml, so "
        "a stack cannot pick another version; remove the key, or bump the pin and its lock entry "
        "(docs/charts.md, 'Bumping a chart')"
    )
    reject_retired_keys(data, dict.fromkeys(CHART_VERSION_KEYS, why))


def _check_prometheus_url(value: str) -> str:
    parsed = urlsplit(value)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.query or parsed.fragment:
        raise ValueError(
            "must be an http(s) URL of the Prometheus HTTP API, e.g. http://prometheus-operated.monitoring.svc:9090"
        )
    return value.rstrip("/")


class AlertsConfig(StrictModel):
    """Platform-wide alert rules (per-model thresholds are `models[].slo`); docs/operations.md."""

    enabled: bool = True
    """Create the PrometheusRule `vllm-platform` (needs a Prometheus Operator)."""
    gpu_temperature_celsius: Annotated[int, Field(ge=50, le=110)] = 85
    """A GPU hotter than this for 5 minutes (DCGM_FI_DEV_GPU_TEMP) fires GpuTemperatureHigh."""
    autoscaler_at_max_minutes: Annotated[int, Field(ge=1, le=240)] = 15
    """An autoscaler at max_replicas this long fires AutoscalerAtMaximum."""
    no_ready_replica_minutes: Annotated[int, Field(ge=1, le=60)] = 5
    """A model with no available replica this long fires ModelNoReadyReplica."""


class MonitoringConfig(StrictModel):
    """Prometheus scraping vLLM and DCGM, which the Prometheus Adapter and KEDA read (docs/autoscaling.md)."""

    @model_validator(mode="before")
    @classmethod
    def _no_chart_version(cls, data: Any) -> Any:
        reject_chart_version(data)
        return data

    enabled: bool = True
    """Create the scrape configuration (PodMonitor/ServiceMonitor) and, with `prometheus:
    kube-prometheus-stack`, Prometheus itself. Autoscaling needs it."""
    prometheus: Literal["kube-prometheus-stack", "existing"] = "kube-prometheus-stack"
    """`kube-prometheus-stack`: install the pinned chart. `existing`: use the Prometheus at
    `existing_prometheus_url` (nothing is installed for it)."""
    existing_prometheus_url: Annotated[str, AfterValidator(_check_prometheus_url)] | None = None
    """`prometheus: existing`: base URL of its HTTP API, read by the Prometheus Adapter and KEDA."""
    existing_prometheus_operator: bool = True
    """`prometheus: existing`: it is run by the Prometheus Operator, so the PodMonitor/ServiceMonitor
    objects this stack creates are how it finds vLLM and DCGM. When false none are created and the
    scrape jobs of docs/autoscaling.md must be added to its config by hand."""
    monitor_labels: Labels = Field(default_factory=dict)
    """Extra labels on the PodMonitor/ServiceMonitors, for an existing Prometheus whose
    podMonitorSelector/serviceMonitorSelector needs them (e.g. `release: prometheus`)."""
    namespace: Annotated[str, dns_label(63)] = "monitoring"
    """Namespace of kube-prometheus-stack, the Prometheus Adapter and the vLLM PodMonitor."""
    scrape_interval_seconds: Annotated[int, Field(ge=5, le=120)] = 15
    """How often vLLM, DCGM and the router are scraped: the freshest an autoscaling signal can be. Every
    range an autoscaler or alert reads (a to-zero model's idle window, a canary's analysis window) must
    be at least twice this: rate() and increase() need two samples."""
    retention_days: Annotated[int, Field(ge=1, le=365)] = 15
    """kube-prometheus-stack: how long Prometheus keeps samples."""
    prometheus_storage_gib: Annotated[int, Field(ge=1, le=10000)] = 10
    """kube-prometheus-stack: space for Prometheus' data; retention also stops at 85 % of it, so the
    volume never fills before `retention_days`."""
    prometheus_persistent_volume: bool = False
    """Keep Prometheus' data on a PersistentVolume instead of an emptyDir (lost when the pod moves).
    Needs a StorageClass that provisions ReadWriteOnce volumes: in mode `eks` the EBS CSI driver
    (`addons.ebs_csi_driver`) and its StorageClass `gp3`."""
    prometheus_storage_class: str | None = None
    """With prometheus_persistent_volume: the volume's StorageClass; null = `gp3` when
    addons.ebs_csi_driver is on, else the cluster's default."""
    prometheus_replicas: Annotated[int, Field(ge=1, le=3)] = 1
    """Prometheus replicas, each scraping everything into its own volume: with 2 a restart or a
    node drain leaves the autoscalers' series (and alerts) served by the other."""
    grafana: bool = False
    """kube-prometheus-stack's Grafana. Off by default: it needs `grafana_admin_secret`, because the
    chart's built-in admin password is public."""
    grafana_admin_secret: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    """Grafana's admin credential in the secret store (`security.secret_store`), with keys
    `admin-user` and `admin-password`: a Secrets Manager secret name (JSON keys) or Vault path, synced
    by the Secrets Store CSI driver; with provider `kubernetes-secret`, a Secret in `namespace`."""
    alertmanager: bool = False
    """kube-prometheus-stack's Alertmanager; needs `alertmanager_config_secret` (its receivers)."""
    alertmanager_config_secret: SecretRefConfig | None = None
    """The Alertmanager configuration (receivers, routes; alertmanager.yaml as text) in the secret
    store, at `key`: never in the stack file. Synced by the Secrets Store CSI driver into the Secret
    the Alertmanager reads (`configSecret`); with provider `kubernetes-secret`, a Secret in
    `namespace` with that key."""
    alerts: AlertsConfig = AlertsConfig()
    """Alert rules (PrometheusRule) for every model and GPU."""

    @model_validator(mode="after")
    def _grafana_has_credentials(self) -> MonitoringConfig:
        if self.grafana and not self.grafana_admin_secret:
            raise ConfigProblem(
                "Grafana needs grafana_admin_secret: the name of a Secret in the monitoring namespace with "
                "keys admin-user and admin-password (the chart's default password is public); or set "
                "grafana: false",
                at=("grafana_admin_secret",),
                value=None,
            )
        if self.alertmanager and self.alertmanager_config_secret is None:
            raise ConfigProblem(
                "Alertmanager needs alertmanager_config_secret: the secret-store entry holding its "
                "alertmanager.yaml (receivers), e.g. {name: vllm-platform/prod/alertmanager, key: "
                "alertmanager.yaml}; receivers never go in the stack file. Or set alertmanager: false",
                at=("alertmanager_config_secret",),
                value=None,
            )
        return self


class TolerationConfig(StrictModel):
    """A pod toleration, with Kubernetes semantics (an empty key with `Exists` tolerates every taint)."""

    key: str = ""
    """Taint key, e.g. nvidia.com/gpu; empty only with operator Exists (then every key)."""
    operator: Literal["Equal", "Exists"] = "Equal"
    """`Equal`: the taint's value must equal `value`. `Exists`: any value."""
    value: str = ""
    """Toleration value (with operator `Equal`)."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Empty: tolerates the key with every effect."""

    @model_validator(mode="after")
    def _operator_matches_value(self) -> TolerationConfig:
        if self.operator == "Exists" and self.value:
            raise ConfigProblem(
                "operator Exists takes no value; remove value or use operator Equal", at=("value",)
            )
        if self.operator == "Equal" and not self.key:
            raise ConfigProblem(
                "operator Equal needs a key (or use operator Exists)", at=("key",), value=self.key
            )
        return self


class AddonConfig(StrictModel):
    """One pinned upstream chart. `addons.<name>: true` is short for `addons.<name>: {enabled: true}`."""

    enabled: bool | None = None
    """Null: the default for `cluster.mode` (docs/autoscaling.md, "Add-ons per cluster mode")."""

    @model_validator(mode="before")
    @classmethod
    def _bool_is_short_for_enabled(cls, data: Any) -> Any:
        if isinstance(data, bool):
            return {"enabled": data}
        reject_chart_version(data)
        return data


class GpuAddonConfig(AddonConfig):
    tolerations: list[TolerationConfig] | None = None
    """Null (recommended): exactly the taints of the GPU node groups. A list replaces them and must
    still tolerate every GPU taint (checked at validate time)."""


class NvidiaDevicePluginConfig(GpuAddonConfig):
    """NVIDIA device plugin on the GPU node groups: registers `nvidia.com/gpu` with the kubelet."""

    gpu_feature_discovery: bool = True
    """GPU feature discovery plus its node-feature-discovery (the chart's `nfd` subchart): labels GPU
    nodes with GPU model, memory and driver. Turn off where the cluster already runs NFD."""


class DcgmExporterConfig(GpuAddonConfig):
    """NVIDIA DCGM exporter on the GPU nodes, with pod attribution (per-pod GPU metrics)."""

    collect_interval_seconds: Annotated[int, Field(ge=1, le=60)] = 5
    """How often the exporter reads the GPUs' counters (its `-c`, upstream default 30 s). A GPU
    signal is at most this plus the scrape interval old; the cost is in docs/operations.md."""


class EbsCsiDriverConfig(AddonConfig):
    """Mode `eks`: the EBS CSI driver as an EKS managed add-on (IRSA role; EKS picks the add-on
    version for the cluster's Kubernetes version) and the StorageClass `gp3`, for Prometheus'
    persistent volumes."""


class ImagePrepullConfig(GpuAddonConfig):
    """DaemonSet that pulls the pinned vLLM image onto every GPU node ahead of the pods that need it
    (no chart: `chart_version` does not apply)."""


class PrometheusAdapterConfig(AddonConfig):
    """Serves the autoscaling signals on the custom metrics API for `autoscaling.backend: hpa`."""

    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    """Two, so an HPA does not lose its metrics while one adapter pod restarts."""
    metrics_relist_interval_seconds: Annotated[int, Field(ge=15, le=600)] = 60
    """How often the adapter rediscovers series (a new pod's metrics appear after at most this)."""


class KedaConfig(AddonConfig):
    """KEDA, for models with `autoscaling.backend: keda` (the default backend, and the one that scales
    to zero). On by default in mode eks; off in mode existing, where a cluster usually runs its own."""


class ArgoRolloutsConfig(AddonConfig):
    """Argo Rollouts controller, for models with `rollout.strategy: canary` (docs/rollouts.md). Off by
    default in every mode; a canary model needs it on."""


class EfsCsiDriverConfig(AddonConfig):
    """AWS EFS CSI driver (IRSA role from the AWS layer) behind StorageClass `efs-sc`."""


class SecretsStoreCsiDriverConfig(AddonConfig):
    """Secrets Store CSI driver (secret sync on) plus the AWS provider when the secret store is AWS
    Secrets Manager."""

    rotation_poll_interval_seconds: Annotated[int, Field(ge=30, le=86400)] = 120
    """How often mounted secrets are re-read from the store (rotation)."""


class AwsLoadBalancerControllerConfig(AddonConfig):
    """AWS Load Balancer Controller (IRSA; cluster name, region and VPC from the AWS layer)."""

    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    """Controller replicas."""


class MetricsServerConfig(AddonConfig):
    """metrics-server: CPU/memory resource metrics (`kubectl top`, resource-based HPAs)."""


class ClusterAutoscalerConfig(AddonConfig):
    """Cluster Autoscaler (IRSA, node groups found by the cluster-name tags): adds GPU nodes when an
    HPA creates replicas no node has room for."""

    expander: Literal["least-waste", "random", "most-pods"] = "least-waste"
    """Which node group grows when several could fit the pending pods."""
    scale_down_unneeded_minutes: Annotated[int, Field(ge=1, le=1440)] = 10
    """A node idle this long is removed (not below the group's min_size)."""
    max_node_provision_minutes: Annotated[int, Field(ge=5, le=60)] = 20
    """GPU nodes boot slowly (driver, device plugin registration); a node not ready after this is
    treated as failed and another group is tried."""


class KarpenterConfig(AddonConfig):
    """Mode `eks`: Karpenter's controller (charts karpenter-crd and karpenter, IRSA role, the SQS
    interruption queue and its EventBridge rules from the AWS layer), installed when at least one GPU
    group has `provisioner: karpenter`. Mode `existing`: off; the cluster runs its own Karpenter."""

    replicas: Annotated[int, Field(ge=1, le=3)] = 2
    """Controller replicas (leader election): a second one takes over at once when one restarts."""


class LeaderWorkerSetConfig(AddonConfig):
    """The LeaderWorkerSet controller (chart `lws`), installed only when a model's replica spans nodes
    (docs/multi-node.md). On in both modes; off only on a cluster that already runs an LWS controller
    (API `leaderworkerset.x-k8s.io/v1`, release v0.10.0 or later) with its CRDs and admission webhooks,
    as the multi-node deploy test's cluster does (tests/test_deploy_multi_node.py)."""


# (mode eks, mode existing): add-ons an existing cluster usually runs already, or that need the IAM
# roles and VPC only mode `eks` creates, are off there unless switched on.
ADDON_DEFAULTS: dict[str, tuple[bool, bool]] = {
    "nvidia_device_plugin": (True, True),
    "dcgm_exporter": (True, True),
    "prometheus_adapter": (True, True),
    "keda": (True, False),
    "argo_rollouts": (False, False),
    "efs_csi_driver": (True, False),
    "secrets_store_csi_driver": (True, False),
    "aws_load_balancer_controller": (True, False),
    "metrics_server": (True, False),
    "cluster_autoscaler": (True, False),
    "image_prepull": (True, True),
    "ebs_csi_driver": (True, False),
    "karpenter": (True, False),
    "leader_worker_set": (True, True),
}


class AddonsConfig(StrictModel):
    """Cluster add-ons from pinned, locked upstream charts (domain/versions.py, docs/charts.md). Each
    takes `enabled` (default per `cluster.mode`, see ADDON_DEFAULTS); versions are not a stack setting."""

    nvidia_device_plugin: NvidiaDevicePluginConfig = NvidiaDevicePluginConfig()
    dcgm_exporter: DcgmExporterConfig = DcgmExporterConfig()
    prometheus_adapter: PrometheusAdapterConfig = PrometheusAdapterConfig()
    keda: KedaConfig = KedaConfig()
    argo_rollouts: ArgoRolloutsConfig = ArgoRolloutsConfig()
    efs_csi_driver: EfsCsiDriverConfig = EfsCsiDriverConfig()
    secrets_store_csi_driver: SecretsStoreCsiDriverConfig = SecretsStoreCsiDriverConfig()
    aws_load_balancer_controller: AwsLoadBalancerControllerConfig = AwsLoadBalancerControllerConfig()
    metrics_server: MetricsServerConfig = MetricsServerConfig()
    cluster_autoscaler: ClusterAutoscalerConfig = ClusterAutoscalerConfig()
    image_prepull: ImagePrepullConfig = ImagePrepullConfig()
    """Pull the pinned vLLM image on every GPU node ahead of scale-up."""
    ebs_csi_driver: EbsCsiDriverConfig = EbsCsiDriverConfig()
    """EBS volumes for Prometheus (EKS managed add-on; no chart)."""
    karpenter: KarpenterConfig = KarpenterConfig()
    """Karpenter's controller for the GPU groups with `provisioner: karpenter` (mode eks)."""
    leader_worker_set: LeaderWorkerSetConfig = LeaderWorkerSetConfig()
    """The LeaderWorkerSet controller for models whose replicas span nodes."""


def _fill_addon_defaults(addons: Any, mode: str) -> Any:
    """`enabled: null` → the default for the cluster mode, before the models are built (they are frozen)."""
    index = 0 if mode == "eks" else 1
    if isinstance(addons, AddonsConfig):
        updates = {
            name: getattr(addons, name).model_copy(update={"enabled": defaults[index]})
            for name, defaults in ADDON_DEFAULTS.items()
            if getattr(addons, name).enabled is None
        }
        return addons.model_copy(update=updates)
    if not isinstance(addons, dict):
        return addons  # the schema reports the wrong type
    filled = dict(addons)
    for name, defaults in ADDON_DEFAULTS.items():
        entry = filled.get(name)
        if entry is None:
            filled[name] = {"enabled": defaults[index]}
        elif isinstance(entry, dict) and entry.get("enabled") is None:
            filled[name] = {**entry, "enabled": defaults[index]}
        elif isinstance(entry, AddonConfig) and entry.enabled is None:
            filled[name] = entry.model_copy(update={"enabled": defaults[index]})
    return filled


class PlatformConfig(StrictModel):
    cluster: ClusterConfig = ClusterConfig()
    node_groups: NodeGroupsConfig
    models: Annotated[list[ModelConfig], Field(min_length=1)]
    storage: StorageConfig = StorageConfig()
    security: SecurityConfig = SecurityConfig()
    ingress: IngressConfig = IngressConfig()
    monitoring: MonitoringConfig = MonitoringConfig()
    addons: AddonsConfig = AddonsConfig()
    router: RouterConfig = RouterConfig()
    tenants: list[TenantConfig] = []
    """Teams with their own keys, allowed served names and limits (docs/security.md, "Tenants").
    Empty: each model has its one key, `models[].api_key_secret`."""

    @model_validator(mode="before")
    @classmethod
    def _addon_defaults_follow_cluster_mode(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        cluster = data.get("cluster")
        mode = cluster.get("mode", "eks") if isinstance(cluster, dict) else getattr(cluster, "mode", "eks")
        if mode not in ("eks", "existing"):
            return data  # ClusterConfig reports the bad mode
        return {**data, "addons": _fill_addon_defaults(data.get("addons", {}), mode)}

    def serving_images(self) -> tuple[str, ...]:
        """Every model's vLLM image (ModelConfig.serving_image), each once, in model order; the pinned
        vLLM image alone for a stack without models (the image pre-pull has one to pull)."""
        images = dict.fromkeys(model.serving_image for model in self.models)
        return tuple(images) or (VLLM_IMAGE.reference,)

    def served_names(self, model: ModelConfig) -> list[str]:
        """Every `model` a client may name in a request to reach `model`'s replicas: its
        `openai_model_name` first, then its LoRA adapters (unique across the stack, validated)."""
        return [model.openai_model_name, *model.adapter_names]

    def routing_policy(self, model: ModelConfig) -> RoutingPolicy | None:
        """The router's policy for `model` (its `router_policy`, else `router.default_policy`);
        None when the router is off."""
        if not self.router.enabled:
            return None
        return model.router_policy or self.router.default_policy

    def _served_names_unique(self) -> None:
        # One endpoint routes by the request's `model`: a name served twice would be ambiguous.
        owners: dict[str, str] = {}
        for index, model in enumerate(self.models):
            name_at: tuple[str | int, ...] = (
                "models",
                index,
                "served_model_name" if model.served_model_name else "name",
            )
            if model.openai_model_name in owners:
                raise ConfigProblem(
                    f"'{model.openai_model_name}' is already served by {owners[model.openai_model_name]}; "
                    "every served model name and LoRA adapter name must be unique",
                    at=name_at,
                )
            owners[model.openai_model_name] = f"model '{model.name}'"
            for adapter_index, adapter in enumerate(model.lora.adapters if model.lora else []):
                if adapter.name in owners:
                    raise ConfigProblem(
                        f"'{adapter.name}' is already served by {owners[adapter.name]}; every served "
                        "model name and LoRA adapter name must be unique: rename the adapter",
                        at=("models", index, "lora", "adapters", adapter_index, "name"),
                        value=adapter.name,
                    )
                owners[adapter.name] = f"an adapter of model '{model.name}'"

    @model_validator(mode="after")
    def _tenants_name_served_names(self) -> PlatformConfig:
        from domain.config.tenants import tenant_problems

        problems = tenant_problems(self)
        if problems:
            raise problems[0]
        return self

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
                    f"one replica needs {model.gpus_per_replica} GPUs on one node, but "
                    f"{', '.join(too_small)} in group '{model.gpu_group}' "
                    f"{'has' if len(too_small) == 1 else 'have'} fewer; use at most {largest} GPUs per "
                    "replica or an instance type with more GPUs per node",
                    at=("models", index, "gpus_per_replica"),
                )
            keda_missing = model.autoscaling.backend == "keda" and not self.addons.keda.enabled
            if model.autoscaling.enabled and keda_missing:
                raise ConfigProblem(
                    "autoscaling backend 'keda' needs the KEDA add-on; set addons.keda: true or use "
                    "backend 'hpa'",
                    at=("models", index, "autoscaling", "backend"),
                )
            if model.scales_to_zero and not self.router.enabled:
                raise ConfigProblem(
                    "a model at zero replicas needs something in front of it to hold its requests while "
                    "it wakes and to count them (the signal that wakes it); that is the router, which "
                    "is off: set router.enabled: true, or min_replicas: 1",
                    at=("models", index, "autoscaling", "min_replicas"),
                )
        self._served_names_unique()
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
