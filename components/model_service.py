"""One served model: its namespace and everything in it, from the typed config and the capacity plan.

    Namespace vllm-<model> (labels, GPU ResourceQuota, LimitRange, default-deny NetworkPolicies)
    ├── ServiceAccount vllm (IRSA role from the AWS layer)
    ├── SecretProviderClass vllm-api-key (→ synced Secret vllm-api-key), or with tenants
    │   vllm-tenant-keys (their keys as files); vllm-hf-token (gated HF repos)
    ├── ConfigMap vllm-platform-auth: the API-key middleware vLLM loads (components/server_auth.py)
    ├── PersistentVolumeClaim model-cache (RWX, EFS): weights per revision + vLLM compile cache
    ├── Deployment vllm: init container `model-cache preload` → vLLM server
    │   (or, with rollout.strategy canary, Rollout vllm with the same pod template, Services
    │   vllm-stable and vllm-canary, AnalysisTemplate vllm-canary: components/rollouts.py)
    ├── Service vllm, PodDisruptionBudget vllm, Ingress vllm (when ingress is on)
    └── HPA or KEDA ScaledObject vllm (components/autoscaling.py) when autoscaling is on

The manifests are built by pure functions elsewhere, `ModelService` only turns them into resources:
the pod template in vllm_pod (with preload, vllm_arguments, probes, secrets), each workload shape in
workloads (over that one template), Services and Ingress in exposure, quota, limit range, PDB and
labels in guardrails, placement in scheduling, NetworkPolicies in network_policy
(docs/architecture.md). docs/serving.md explains each choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as kubernetes

from components import canary_analysis, leader_worker_set, probes, rollouts, secrets, server_auth
from components.autoscaling import create_model_autoscaler, replicas_at_creation
from components.exposure import (
    in_cluster_url,
    ingress_annotations,
    ingress_spec,
    ingress_url,
    serves_own_hostname,
    service_spec,
    track_service_spec,
    uses_alb_traffic_split,
    web_acl_annotation,
)
from components.guardrails import (
    limit_range_spec,
    namespace_labels,
    pod_disruption_budget_spec,
    resource_quota_spec,
)
from components.monitoring import prometheus_url
from components.network_policy import model_network_policies, serving_peers
from components.preload import MODEL_VOLUME_CLAIM, MODEL_VOLUME_STORAGE_CLASS
from components.vllm_pod import SERVER_NAME, gib
from components.workloads import canary_leader_worker_set_spec, workload
from domain.capacity import ModelPlan
from domain.cluster_context import ClusterContext
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from domain.labels import model_labels
from domain.rollout_pods import uses_group_canary
from domain.service_accounts import model_service_account


@dataclass(frozen=True)
class ModelServiceArgs:
    config: PlatformConfig
    model: ModelConfig
    plan: ModelPlan
    """The model's capacity plan: startup budget and GPU model."""
    context: ClusterContext
    depends_on: Sequence[pulumi.Resource] = ()
    """What the objects need first: the PriorityClass, and the add-ons whose CRDs and webhooks they
    use (Secrets Store CSI driver for SecretProviderClass, AWS Load Balancer Controller)."""
    candidate_plan: ModelPlan | None = None
    """The plan of a multi-node canary's candidate (PlatformPlan.candidates), when there is one."""


class ModelService(pulumi.ComponentResource):
    """Everything one model needs to serve, in its own namespace `vllm-<model>`."""

    namespace: str
    deployment: pulumi.CustomResource
    """The workload running the pods: a Deployment, or an Argo Rollouts Rollout for a canary model."""
    autoscaler: pulumi.Resource | None
    deployment_name: str
    in_cluster_url: str
    ingress_url: str | None

    def __init__(self, name: str, args: ModelServiceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("vllm-platform:model_service:ModelService", name, None, opts)
        config, model, plan = args.config, args.model, args.plan
        namespace = model.namespace
        labels = model_labels(model.name)

        def meta(object_name: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
            return {"name": object_name, "namespace": namespace, "labels": {**labels, **(extra_labels or {})}}

        namespace_resource = kubernetes.core.v1.Namespace(
            f"{name}-namespace",
            metadata={"name": namespace, "labels": namespace_labels(config, model)},
            opts=pulumi.ResourceOptions(parent=self),
        )
        inside = pulumi.ResourceOptions(parent=self, depends_on=[namespace_resource])
        after_addons = pulumi.ResourceOptions(parent=self, depends_on=[namespace_resource, *args.depends_on])

        kubernetes.core.v1.ResourceQuota(
            f"{name}-gpu-quota", metadata=meta("gpu-quota"), spec=resource_quota_spec(model), opts=inside
        )
        kubernetes.core.v1.LimitRange(
            f"{name}-limit-range", metadata=meta("container-defaults"), spec=limit_range_spec(), opts=inside
        )
        peers = serving_peers(config, args.context.load_balancer_source_cidrs)
        for policy_name, policy_spec in model_network_policies(config, model, peers):
            kubernetes.networking.v1.NetworkPolicy(
                f"{name}-netpol-{policy_name}", metadata=meta(policy_name), spec=policy_spec, opts=inside
            )

        account = model_service_account(model)
        role_arn = args.context.role_arn_for(account.namespace, account.name)
        account_meta = meta(account.name)
        if role_arn is not None:
            account_meta["annotations"] = {"eks.amazonaws.com/role-arn": role_arn}
        kubernetes.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata=account_meta,
            automount_service_account_token=False,
            opts=inside,
        )

        store = config.security.secret_store
        region = config.cluster.region
        # (resource name suffix, SecretProviderClass name, spec): what the pods' CSI volumes mount.
        provider_class_specs: list[tuple[str, str, dict]] = []
        if secrets.uses_csi(store):
            if tenant_keys := secrets.tenant_key_files(config, model):
                spec = secrets.tenant_keys_provider_class_spec(store, tenant_keys, region)
                provider_class_specs.append(("tenant-keys", secrets.TENANT_KEYS_PROVIDER_CLASS, spec))
            if not config.tenants:
                spec = secrets.secret_provider_class_spec(
                    store, secrets.api_key_file(model), region, sync_to_secret=secrets.API_KEY_SECRET_NAME
                )
                provider_class_specs.append(("api-key", secrets.API_KEY_PROVIDER_CLASS, spec))
            if (token := secrets.hf_token_file(model)) is not None:
                spec = secrets.secret_provider_class_spec(store, token, region, sync_to_secret=None)
                provider_class_specs.append(("hf-token", secrets.HF_TOKEN_PROVIDER_CLASS, spec))
        provider_classes: list[pulumi.Resource] = [
            kubernetes.apiextensions.CustomResource(
                f"{name}-{suffix}-provider",
                api_version=secrets.SPC_API_VERSION,
                kind="SecretProviderClass",
                metadata=meta(class_name),
                spec=spec,
                opts=after_addons,
            )
            for suffix, class_name, spec in provider_class_specs
        ]

        auth_module = kubernetes.core.v1.ConfigMap(
            f"{name}-auth-middleware",
            metadata=meta(server_auth.CONFIG_MAP_NAME),
            data=server_auth.config_map_data(config, model),
            opts=inside,
        )

        claim = kubernetes.core.v1.PersistentVolumeClaim(
            f"{name}-model-volume",
            metadata=meta(MODEL_VOLUME_CLAIM),
            spec={
                "accessModes": ["ReadWriteMany"],
                "storageClassName": MODEL_VOLUME_STORAGE_CLASS,
                "resources": {"requests": {"storage": gib(config.storage.model_volume_size_gib)}},
            },
            opts=after_addons,
        )

        # How long `pulumi up` waits for the rollout before reporting it failed.
        rollout_timeout = probes.rollout_timeout_seconds(model, plan.startup_budget_seconds)
        workload_meta = {
            **meta(SERVER_NAME),
            "annotations": {"pulumi.com/timeoutSeconds": str(rollout_timeout)},
        }
        workload_opts = pulumi.ResourceOptions(
            parent=self,
            depends_on=[namespace_resource, claim, auth_module, *provider_classes, *args.depends_on],
            # Set at creation only: afterwards the count is KEDA's (replicas_at_creation).
            ignore_changes=["spec.replicas"] if replicas_at_creation(model) is not None else None,
        )
        api_version, kind, workload_spec = workload(config, model, plan, account.name)
        deployment: pulumi.CustomResource
        if kind == "Deployment":
            deployment = kubernetes.apps.v1.Deployment(
                f"{name}-deployment", metadata=workload_meta, spec=workload_spec, opts=workload_opts
            )
        elif kind == leader_worker_set.LWS_KIND:
            deployment = kubernetes.apiextensions.CustomResource(
                f"{name}-leader-worker-set",
                api_version=api_version,
                kind=kind,
                metadata=workload_meta,
                spec=workload_spec,
                opts=workload_opts,
            )
        else:
            # The analysis its steps run, against the Prometheus the PodMonitor feeds.
            kubernetes.apiextensions.CustomResource(
                f"{name}-canary-analysis",
                api_version=rollouts.ROLLOUTS_API_VERSION,
                kind=rollouts.ANALYSIS_TEMPLATE_KIND,
                metadata=meta(rollouts.ANALYSIS_TEMPLATE),
                spec=canary_analysis.analysis_template_spec(
                    model.rollout.canary.analysis, namespace, prometheus_url(config.monitoring)
                ),
                opts=after_addons,
            )
            deployment = kubernetes.apiextensions.CustomResource(
                f"{name}-rollout",
                api_version=api_version,
                kind=kind,
                metadata=workload_meta,
                spec=workload_spec,
                opts=workload_opts,
            )
        if uses_group_canary(model):
            self._group_canary(name, args, meta, workload_opts.depends_on, account.name, after_addons)
        kubernetes.core.v1.Service(
            f"{name}-service", metadata=meta(SERVER_NAME), spec=service_spec(model), opts=inside
        )
        if rollouts.uses_canary(model):
            # Argo pins a Rollout's selectors to the stable and canary ReplicaSets: `pulumi up` must not
            # undo it. A multi-node canary's are the stack's own (one LeaderWorkerSet each).
            argo_owned = None if uses_group_canary(model) else ["spec.selector"]
            for service_name in (rollouts.STABLE_SERVICE, rollouts.CANARY_SERVICE):
                kubernetes.core.v1.Service(
                    f"{name}-service-{service_name}",
                    metadata=meta(service_name),
                    spec=track_service_spec(model, service_name),
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[namespace_resource], ignore_changes=argo_owned
                    ),
                )
        kubernetes.policy.v1.PodDisruptionBudget(
            f"{name}-pdb", metadata=meta(SERVER_NAME), spec=pod_disruption_budget_spec(model), opts=inside
        )
        if serves_own_hostname(config, model):
            managed = (
                [
                    f'metadata.annotations["{rollouts.ALB_ACTION_ANNOTATION}"]',
                    f'metadata.annotations["{rollouts.MANAGED_ALB_ACTIONS_ANNOTATION}"]',
                ]
                if uses_alb_traffic_split(config, model) and not uses_group_canary(model)
                else []
            )
            kubernetes.networking.v1.Ingress(
                f"{name}-ingress",
                metadata={
                    **meta(SERVER_NAME),
                    "annotations": {
                        **ingress_annotations(config, model),
                        **web_acl_annotation(config.ingress, args.context.web_acl_arn),
                    },
                },
                spec=ingress_spec(config, model),
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[namespace_resource, *args.depends_on], ignore_changes=managed
                ),
            )

        # The HPA or KEDA ScaledObject that owns the Deployment's replicas (none when autoscaling is off).
        self.autoscaler = create_model_autoscaler(
            f"{name}-autoscaler",
            model,
            SERVER_NAME,
            namespace,
            config.monitoring,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[deployment, *args.depends_on]),
        )

        self.namespace = namespace
        self.deployment_name = SERVER_NAME
        self.in_cluster_url = in_cluster_url(model)
        self.ingress_url = ingress_url(config, model)
        self.deployment = deployment
        self.register_outputs(
            {
                "namespace": self.namespace,
                "in_cluster_url": self.in_cluster_url,
                "ingress_url": self.ingress_url,
            }
        )

    def _group_canary(
        self,
        name: str,
        args: ModelServiceArgs,
        meta: Callable[[str], dict[str, Any]],
        depends_on: Any,
        service_account: str,
        after_addons: pulumi.ResourceOptions,
    ) -> None:
        """A multi-node canary's candidate: its LeaderWorkerSet `vllm-canary` and, while it gets traffic,
        the AnalysisRun that judges this weight (docs/multi-node.md, "Canary")."""
        config, model = args.config, args.model
        if args.candidate_plan is None:
            return
        spec = canary_leader_worker_set_spec(config, model, args.candidate_plan, service_account)
        candidate = model.canary_candidate()
        if spec is None or candidate is None:
            return
        timeout = probes.rollout_timeout_seconds(candidate, args.candidate_plan.startup_budget_seconds)
        kubernetes.apiextensions.CustomResource(
            f"{name}-canary-leader-worker-set",
            api_version=leader_worker_set.LWS_API_VERSION,
            kind=leader_worker_set.LWS_KIND,
            metadata={
                **meta(leader_worker_set.CANARY_SET),
                "annotations": {"pulumi.com/timeoutSeconds": str(timeout)},
            },
            spec=spec,
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on),
        )
        if rollouts.group_canary_weight(model) == 0:
            return  # started, serving nothing: nothing to judge yet
        kubernetes.apiextensions.CustomResource(
            f"{name}-canary-analysis-run",
            api_version=rollouts.ROLLOUTS_API_VERSION,
            kind=rollouts.ANALYSIS_RUN_KIND,
            metadata=meta(canary_analysis.group_analysis_run_name(model)),
            spec=canary_analysis.group_analysis_run_spec(
                model.rollout.canary.analysis, model.namespace, prometheus_url(config.monitoring)
            ),
            opts=after_addons,
        )
