"""One ModelService per model, as the real program renders it under mocks, for every stack in stacks/."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from components import guardrails, scheduling, vllm_pod
from components import preload as preload_paths
from components.rollouts import peak_replicas, uses_canary, workload_reference
from components.scheduling import gpu_group_node_selector, gpu_group_tolerations
from domain.capacity import plan_platform
from domain.config import PlatformConfig
from domain.config.loader import stack_file_for
from domain.labels import model_selector_labels
from domain.versions import VLLM_VERSION
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import TEST_STACKS_DIR, model_workloads, rendered

BUILT_IN_GROUPS = {
    "",
    "apps",
    "policy",
    "autoscaling",
    "networking.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
    "rbac.authorization.k8s.io",
}

# --- helpers -----------------------------------------------------------------------------------------


def config_of(result: RenderResult) -> PlatformConfig:
    path = None if result.stack in ("dev", "staging", "prod") else Path(result.stack_file)
    return load_stack(result.stack, stack_file=path)


def render_variant(tmp_path: Path, edit: Callable[[dict[str, Any]], None], base: str = "dev") -> RenderResult:
    """Render `base` with `edit` applied to its `vllm-platform:*` values (keys without the prefix)."""
    document = yaml.safe_load(stack_file_for(base).read_text())
    values = {
        key.removeprefix("vllm-platform:"): value
        for key, value in document["config"].items()
        if key.startswith("vllm-platform:")
    }
    edit(values)
    document["config"] = {
        **{k: v for k, v in document["config"].items() if not k.startswith("vllm-platform:")},
        **{f"vllm-platform:{key}": value for key, value in values.items()},
    }
    path = tmp_path / f"Pulumi.{base}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return rendered(base, path)


def one(result: RenderResult, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = result.find(kind, name, namespace)
    assert len(found) == 1, f"expected one {kind} {namespace}/{name}, found {len(found)}"
    return found[0]


def deployment(result: RenderResult, model_name: str) -> dict[str, Any]:
    """The model's workload: its Deployment, or its Rollout (same pod template) for a canary model."""
    found = model_workloads(result, f"vllm-{model_name}")
    assert len(found) == 1, f"expected one Deployment or Rollout vllm-{model_name}/vllm, found {len(found)}"
    return found[0]


def pod_spec(result: RenderResult, model_name: str) -> dict[str, Any]:
    return deployment(result, model_name)["spec"]["template"]["spec"]


def container(spec: dict[str, Any], name: str = "vllm") -> dict[str, Any]:
    return next(c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name)


def volume(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in spec["volumes"] if v["name"] == name)


def mount(spec: dict[str, Any], container_name: str, volume_name: str) -> dict[str, Any]:
    return next(m for m in container(spec, container_name)["volumeMounts"] if m["name"] == volume_name)


def model_namespace_objects(result: RenderResult) -> list[dict[str, Any]]:
    """Objects in the models' namespaces (`vllm-<model>`; the router's `vllm-router` is not one)."""
    from domain.labels import ROUTER_NAMESPACE

    def in_model_namespace(namespace: str) -> bool:
        return namespace.startswith("vllm-") and namespace != ROUTER_NAMESPACE

    return [
        obj
        for obj in result.kubernetes_objects
        if in_model_namespace(str(obj["metadata"].get("namespace", "")))
        or (obj["kind"] == "Namespace" and in_model_namespace(obj["metadata"]["name"]))
    ]


def as_int(value: Any) -> Any:
    """Pulumi's mock wire format carries numbers as floats; the API server reads integral ones as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: as_int(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_int(item) for item in value]
    return value


# --- namespace -------------------------------------------------------------------------------------------


def test_every_model_gets_a_labelled_namespace_with_gpu_quota_and_limit_range(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    for model in config.models:
        namespace = one(stack_render, "Namespace", model.namespace)
        assert namespace["metadata"]["labels"]["vllm-platform/model"] == model.name
        quota = one(stack_render, "ResourceQuota", "gpu-quota", model.namespace)
        expected = (peak_replicas(model) + 1) * model.gpus_per_replica
        assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": str(expected)}
        limits = one(stack_render, "LimitRange", "container-defaults", model.namespace)["spec"]["limits"]
        assert "cpu" not in limits[0].get("default", {}), "a default CPU limit would throttle vLLM"


def test_quota_admits_a_rollout_at_max_replicas(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        hard = int(
            one(stack_render, "ResourceQuota", "gpu-quota", model.namespace)["spec"]["hard"][
                "requests.nvidia.com/gpu"
            ]
        )
        # Every replica (and a canary's extra pod at its peak) plus one pod created while an old one drains.
        assert hard >= (peak_replicas(model) + 1) * model.gpus_per_replica


# --- the vLLM pod ---------------------------------------------------------------------------------------


def test_gpu_request_equals_limit_equals_tp(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        resources = container(pod_spec(stack_render, model.name))["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
        assert resources["limits"]["nvidia.com/gpu"] == str(model.tensor_parallel_size)
        args = container(pod_spec(stack_render, model.name))["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == str(model.tensor_parallel_size)


def test_cpu_and_memory_come_from_model_resources(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        resources = container(pod_spec(stack_render, model.name))["resources"]
        expected = model.resources
        assert resources["requests"]["cpu"] == vllm_pod.cores(expected.cpu_request_cores)
        assert resources["requests"]["memory"] == f"{expected.memory_request_gib:g}Gi"
        assert resources["limits"]["memory"] == f"{expected.memory_limit_gib:g}Gi"
        assert ("cpu" in resources["limits"]) == (expected.cpu_limit_cores is not None)


def test_every_vllm_pod_has_memory_backed_dev_shm_even_with_tp1(stack_render: RenderResult) -> None:
    models = config_of(stack_render).models
    assert any(model.tensor_parallel_size == 1 for model in models), "a TP=1 model must be covered"
    for model in models:
        spec = pod_spec(stack_render, model.name)
        shm = volume(spec, "dshm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{model.resources.shm_size_gib:g}Gi"}
        assert mount(spec, "vllm", "dshm")["mountPath"] == "/dev/shm"


def test_tolerations_match_the_model_gpu_group_exactly(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        spec = pod_spec(stack_render, model.name)
        group = config.node_groups.gpu[model.gpu_group]
        assert spec["tolerations"] == gpu_group_tolerations(group)
        assert spec["nodeSelector"] == gpu_group_node_selector(model.gpu_group)


def test_startup_probe_budget_comes_from_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import domain.capacity

    planned = domain.capacity.plan_platform
    distinctive_budget = 4321

    def plan_with_budget(config: PlatformConfig):
        plan = planned(config)
        return dataclasses.replace(
            plan,
            models={
                name: dataclasses.replace(model_plan, startup_budget_seconds=distinctive_budget)
                for name, model_plan in plan.models.items()
            },
        )

    monkeypatch.setattr(domain.capacity, "plan_platform", plan_with_budget)
    result = render_variant(tmp_path, lambda values: None)
    model = config_of(rendered("dev")).models[0]
    probe = container(pod_spec(result, model.name))["startupProbe"]
    period = model.startup.probe_period_seconds
    assert probe["periodSeconds"] == period
    assert probe["failureThreshold"] == math.ceil(distinctive_budget / period)


def test_startup_probe_covers_the_planned_budget_in_every_stack(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    plan = plan_platform(config)
    for model in config.models:
        probe = container(pod_spec(stack_render, model.name))["startupProbe"]
        assert (
            probe["failureThreshold"] * probe["periodSeconds"]
            >= plan.models[model.name].startup_budget_seconds
        )


def test_all_probes_use_health_and_none_guesses_an_initial_delay(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        server = container(pod_spec(stack_render, model.name))
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert server[kind]["httpGet"] == {"path": "/health", "port": "http"}, kind
            assert "initialDelaySeconds" not in server[kind], kind


def test_pods_drain_before_they_are_killed(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        spec = pod_spec(stack_render, model.name)
        server = container(spec)
        drain = model.drain
        assert server["lifecycle"]["preStop"]["sleep"]["seconds"] == drain.pre_stop_sleep_seconds
        args = server["args"]
        assert args[args.index("--shutdown-timeout") + 1] == str(drain.shutdown_timeout_seconds)
        assert (
            spec["terminationGracePeriodSeconds"]
            > drain.pre_stop_sleep_seconds + drain.shutdown_timeout_seconds
        )


def test_hpa_owns_replicas_so_deployment_omits_them() -> None:
    result = rendered("prod")
    models = [m for m in config_of(result).models if m.autoscaling.enabled and m.autoscaling.backend == "hpa"]
    assert models, "prod must keep an HPA-scaled model for this test to mean something"
    for model in models:
        assert "replicas" not in deployment(result, model.name)["spec"]
        hpa = one(result, "HorizontalPodAutoscaler", "vllm", model.namespace)["spec"]
        assert hpa["scaleTargetRef"] == workload_reference(model, "vllm")


def test_keda_owns_replicas_so_deployment_omits_them() -> None:
    result = rendered("prod")
    models = [
        m for m in config_of(result).models if m.autoscaling.enabled and m.autoscaling.backend == "keda"
    ]
    assert models, "prod must keep a KEDA-scaled model for this test to mean something"
    assert any(not m.scales_to_zero for m in models) and any(m.scales_to_zero for m in models)
    for model in models:
        # A to-zero model is created at zero (issue 40); Pulumi ignores the field after that
        # (tests/test_deploy_pulumi.py), so KEDA's count stands either way.
        expected = {"replicas": 0} if model.scales_to_zero else {}
        spec = deployment(result, model.name)["spec"]
        assert {key: spec[key] for key in spec if key == "replicas"} == expected, model.name
        scaled = one(result, "ScaledObject", "vllm", model.namespace)["spec"]
        assert scaled["scaleTargetRef"]["name"] == "vllm"
        assert result.find("HorizontalPodAutoscaler", namespace=model.namespace) == []


def test_a_to_zero_model_sets_replicas_at_creation_only() -> None:
    """Its workload is created at 0 (not the API server's default 1, which started a replica on the
    first `up`, issue 40), and `pulumi up` ignores the field afterwards: the options as the engine
    receives them."""
    result = rendered("prod")
    for model in config_of(result).models:
        (record,) = [
            r
            for r in result.resources
            if r.is_kubernetes_object
            and r.inputs["kind"] in ("Deployment", "Rollout")
            and r.inputs["metadata"].get("namespace") == model.namespace
        ]
        if model.scales_to_zero:
            assert (record.inputs["spec"]["replicas"], record.ignore_changes) == (0, ("spec.replicas",))
        else:
            assert "replicas" not in record.inputs["spec"] and record.ignore_changes == (), model.name


def test_fixed_replicas_are_set_when_autoscaling_is_off(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        spec = deployment(stack_render, model.name)["spec"]
        if not model.autoscaling.enabled:
            assert spec["replicas"] == model.replicas
        elif model.scales_to_zero:
            assert spec["replicas"] == 0  # at creation only (test_keda_owns_replicas_...)
        else:
            assert "replicas" not in spec


def test_rollout_strategy_follows_the_replica_floor(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        strategy = deployment(stack_render, model.name)["spec"]["strategy"]
        if uses_canary(model):  # tests/test_rollouts.py
            assert set(strategy) == {"canary"}
            continue
        rolling = strategy["rollingUpdate"]
        floor = model.autoscaling.min_replicas if model.autoscaling.enabled else model.replicas
        expected = (
            {"maxSurge": 0, "maxUnavailable": 1} if floor >= 2 else {"maxSurge": 1, "maxUnavailable": 0}
        )
        assert rolling == expected


def test_replicas_spread_softly_across_zones(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        constraints = pod_spec(stack_render, model.name)["topologySpreadConstraints"]
        zone = next(c for c in constraints if c["topologyKey"] == "topology.kubernetes.io/zone")
        assert zone["whenUnsatisfiable"] == "ScheduleAnyway"
        assert zone["labelSelector"] == {"matchLabels": model_selector_labels(model.name)}


def test_containers_run_without_privileges_or_capabilities(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        spec = pod_spec(stack_render, model.name)
        for item in spec["containers"] + spec["initContainers"]:
            context = item["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, item["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, item["name"]
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}, item["name"]
            assert context["readOnlyRootFilesystem"] is True, item["name"]
            assert "runAsUser" not in context or context["runAsUser"] != 0, item["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] >= 10000
        assert "fsGroup" not in spec["securityContext"], "a recursive chown of the weights at every start"
        assert spec["automountServiceAccountToken"] is False


def test_non_root_user_gets_a_name_and_a_writable_home(stack_render: RenderResult) -> None:
    # PyTorch Inductor calls getpass.getuser() at `import vllm`; without a passwd entry it needs USER.
    for model in config_of(stack_render).models:
        spec = pod_spec(stack_render, model.name)
        for item in spec["containers"] + spec["initContainers"]:
            env = {e["name"]: e.get("value") for e in item["env"]}
            assert env["USER"] and env["HOME"], item["name"]
            writable = {m["mountPath"] for m in item["volumeMounts"] if not m.get("readOnly")}
            assert env["HOME"] in writable, item["name"]


def test_read_only_root_leaves_writable_home_tmp_and_caches(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        spec = pod_spec(stack_render, model.name)
        env = {e["name"]: e.get("value") for e in container(spec)["env"]}
        mounted = {m["mountPath"]: m for m in container(spec)["volumeMounts"]}
        for path in (env["HOME"], env["TMPDIR"], "/dev/shm"):
            assert path in mounted and not mounted[path].get("readOnly"), path
        assert env["VLLM_CACHE_ROOT"].startswith(preload_paths.SHARED_ROOT + "/")
        assert not mounted[preload_paths.SHARED_ROOT].get("readOnly"), "the compile cache is written there"


def test_jit_kernel_caches_live_beside_the_compile_cache_not_in_the_fresh_home(
    stack_render: RenderResult,
) -> None:
    # Lab H200, vLLM 0.26.0: 100-130 s of every start went to FlashInfer JIT in a fresh HOME.
    for model in config_of(stack_render).models:
        env = {e["name"]: e.get("value") for e in container(pod_spec(stack_render, model.name))["env"]}
        cache_root = env["VLLM_CACHE_ROOT"]
        jit_dirs = [env["FLASHINFER_WORKSPACE_BASE"], env["TRITON_CACHE_DIR"]]
        assert all(path.startswith(cache_root + "/") for path in jit_dirs), (model.name, jit_dirs)
        assert not any(path.startswith(env["HOME"]) for path in jit_dirs)
        assert len(set(jit_dirs)) == 2
        assert "XDG_CACHE_HOME" not in env, "outlines' SQLite cache must not move onto the NFS volume"


def test_python_bytecode_is_kept_beside_the_compile_cache(stack_render: RenderResult) -> None:
    # issue 24: the upstream image has no .pyc and a read-only root; every process compiled vLLM from
    # source (lab H200: 57 s before the engine without bytecode, 25 s with it read from the cache).
    for model in config_of(stack_render).models:
        env = {e["name"]: e.get("value") for e in container(pod_spec(stack_render, model.name))["env"]}
        prefix = env["PYTHONPYCACHEPREFIX"]
        assert prefix == env["VLLM_CACHE_ROOT"] + "/pycache", (model.name, prefix)
        assert "PYTHONDONTWRITEBYTECODE" not in env


def test_service_links_off_so_the_vllm_service_cannot_shadow_vllm_port(stack_render: RenderResult) -> None:
    # A Service named `vllm` would inject VLLM_PORT=tcp://...; vLLM reads VLLM_PORT as an integer.
    for model in config_of(stack_render).models:
        assert one(stack_render, "Service", "vllm", model.namespace)
        assert pod_spec(stack_render, model.name)["enableServiceLinks"] is False


def test_weights_come_offline_from_the_preloaded_copy(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        spec = pod_spec(stack_render, model.name)
        server = container(spec)
        env = {e["name"]: e.get("value") for e in server["env"]}
        assert env["HF_HUB_OFFLINE"] == "1"
        local = config.node_groups.gpu[model.gpu_group].local_nvme.enabled
        assert server["args"][0] == preload_paths.served_model_path(model, local)
        assert volume(spec, "models")["persistentVolumeClaim"] == {
            "claimName": preload_paths.MODEL_VOLUME_CLAIM
        }


def test_model_volume_is_an_rwx_claim_on_the_efs_storage_class(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        claim = one(stack_render, "PersistentVolumeClaim", preload_paths.MODEL_VOLUME_CLAIM, model.namespace)[
            "spec"
        ]
        assert claim["accessModes"] == ["ReadWriteMany"]
        assert claim["storageClassName"] == preload_paths.MODEL_VOLUME_STORAGE_CLASS == "efs-sc"
        assert (
            one(stack_render, "StorageClass", claim["storageClassName"])["provisioner"] == "efs.csi.aws.com"
        )
        assert claim["resources"]["requests"]["storage"] == f"{config.storage.model_volume_size_gib}Gi"


def test_every_vllm_pod_uses_the_serving_priority_class_created_once(stack_render: RenderResult) -> None:
    priority = one(stack_render, "PriorityClass", scheduling.SERVING_PRIORITY_CLASS)
    assert priority["value"] == scheduling.SERVING_PRIORITY_VALUE
    assert priority["globalDefault"] is False
    for model in config_of(stack_render).models:
        assert pod_spec(stack_render, model.name)["priorityClassName"] == scheduling.SERVING_PRIORITY_CLASS


def test_service_account_carries_the_irsa_role_from_the_aws_layer(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        account = one(stack_render, "ServiceAccount", "vllm", model.namespace)
        reads_aws = (
            model.source.s3_bucket is not None
            or config.security.secret_store.provider == "aws-secrets-manager"
        )
        arn = account["metadata"].get("annotations", {}).get("eks.amazonaws.com/role-arn")
        if reads_aws:
            assert arn and arn.startswith("arn:aws:iam::") and ":role/" in arn
        else:
            assert arn is None
        assert pod_spec(stack_render, model.name)["serviceAccountName"] == "vllm"


def test_existing_clusters_get_no_irsa_annotation(existing_mode_render: RenderResult) -> None:
    account = one(existing_mode_render, "ServiceAccount", "vllm", "vllm-qwen2-5-7b")
    assert "eks.amazonaws.com/role-arn" not in account["metadata"].get("annotations", {})


# --- the preloader ----------------------------------------------------------------------------------


def test_a_mirrored_preloader_image_is_the_one_every_pod_pulls(existing_mode_render: RenderResult) -> None:
    # tests/stacks/Pulumi.existing.yaml points storage.preloader_image at a private mirror.
    config = config_of(existing_mode_render)
    assert config.storage.preloader_image == "registry.internal.example.com/mirror/model-cache:0.1.0"
    for model in config.models:
        preload = container(pod_spec(existing_mode_render, model.name), "model-cache")
        assert preload["image"] == config.storage.preloader_image


def test_preload_init_container_speaks_the_model_cache_cli(stack_render: RenderResult) -> None:
    from model_cache.cli import build_parser
    from model_cache.s3_source import parse_s3_uri

    from domain.versions import MODEL_CACHE_IMAGE, VLLM_VERSION

    config = config_of(stack_render)
    plan = plan_platform(config)
    for model in config.models:
        preload = container(pod_spec(stack_render, model.name), "model-cache")
        assert preload["image"] == config.storage.preloader_image == MODEL_CACHE_IMAGE.reference
        assert preload["command"] == ["model-cache"]
        parsed = build_parser().parse_args(preload["args"])  # the preloader's own parser
        assert parsed.command == "preload"
        assert (parsed.model_name, parsed.revision) == (model.name, model.source.revision)
        if model.source.s3_uri is not None:
            # The prefix the preloader reads is exactly the one the config (and the IAM policy) name.
            assert parse_s3_uri(parsed.source, parsed.revision) == (
                model.source.s3_bucket,
                model.source.s3_prefix,
            )
        else:
            assert parsed.source == f"hf://{model.source.huggingface_repo}"
        assert str(parsed.shared_root) == preload_paths.SHARED_ROOT
        local = config.node_groups.gpu[model.gpu_group].local_nvme.enabled
        assert (str(parsed.local_root) if parsed.local_root else None) == (
            preload_paths.LOCAL_ROOT if local else None
        )
        assert parsed.compile_cache_gpu_type == plan.models[model.name].gpu_model
        assert parsed.compile_cache_vllm_version == VLLM_VERSION


def test_vllm_serves_the_directory_the_preloader_fills(stack_render: RenderResult) -> None:
    from model_cache.layout import compile_cache_dir, revision_dir

    config = config_of(stack_render)
    plan = plan_platform(config)
    for model in config.models:
        spec = pod_spec(stack_render, model.name)
        local = config.node_groups.gpu[model.gpu_group].local_nvme.enabled
        root = Path(preload_paths.LOCAL_ROOT if local else preload_paths.SHARED_ROOT)
        assert container(spec)["args"][0] == str(revision_dir(root, model.name, model.source.revision))
        env = {e["name"]: e.get("value") for e in container(spec)["env"]}
        expected_cache = compile_cache_dir(
            Path(preload_paths.SHARED_ROOT), model.name, plan.models[model.name].gpu_model, VLLM_VERSION
        )
        assert env["VLLM_CACHE_ROOT"] == str(expected_cache)


def test_local_nvme_is_the_directory_the_node_bootstrap_creates(stack_render: RenderResult) -> None:
    from domain.node_user_data import MODEL_CACHE_DIRECTORY

    config = config_of(stack_render)
    for model in config.models:
        nvme = config.node_groups.gpu[model.gpu_group].local_nvme
        assert nvme.enabled
        spec = pod_spec(stack_render, model.name)
        assert volume(spec, "local-models")["hostPath"] == {
            "path": f"{nvme.mount_path}/{MODEL_CACHE_DIRECTORY}",
            "type": "Directory",
        }
        assert mount(spec, "model-cache", "local-models")["mountPath"] == preload_paths.LOCAL_ROOT
        assert mount(spec, "vllm", "local-models")["readOnly"] is True


def test_without_local_nvme_vllm_serves_from_the_shared_volume(tmp_path: Path) -> None:
    def no_nvme(values: dict[str, Any]) -> None:
        values["node_groups"]["gpu"]["l40s"]["local_nvme"] = {"enabled": False}

    result = render_variant(tmp_path, no_nvme)
    model = config_of(rendered("dev")).models[0]
    spec = pod_spec(result, model.name)
    assert "local-models" not in {v["name"] for v in spec["volumes"]}
    assert "--local-root" not in container(spec, "model-cache")["args"]
    assert container(spec)["args"][0] == f"{preload_paths.SHARED_ROOT}/{model.name}/{model.source.revision}"


# --- around the pod ------------------------------------------------------------------------------------


def test_service_selects_the_model_pods_on_the_server_port(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        service = one(stack_render, "Service", "vllm", model.namespace)["spec"]
        assert service["selector"] == model_selector_labels(model.name)
        assert service["ports"] == [
            {"name": "http", "port": model.vllm.port, "targetPort": "http", "protocol": "TCP"}
        ]


def test_pdb_lets_a_drain_evict_a_pod_stuck_loading(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        pdb = one(stack_render, "PodDisruptionBudget", "vllm", model.namespace)["spec"]
        assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
        assert pdb["selector"] == {"matchLabels": model_selector_labels(model.name)}


def test_pdb_never_blocks_a_node_drain_at_the_fewest_replicas(stack_render: RenderResult) -> None:
    for model in config_of(stack_render).models:
        pdb = one(stack_render, "PodDisruptionBudget", "vllm", model.namespace)["spec"]
        floor = model.autoscaling.min_replicas if model.autoscaling.enabled else model.replicas
        if "minAvailable" in pdb:
            assert pdb["minAvailable"] == model.min_available < floor
        else:
            assert pdb["maxUnavailable"] == 1 and model.min_available >= floor


def test_pdb_keeps_the_configured_minimum_when_replicas_allow_it() -> None:
    from domain.config import ModelConfig

    base = {
        "name": "m",
        "gpu_group": "g",
        "architecture": {"preset": "llama-3.1-8b"},
        "source": {"s3_uri": "s3://bucket/m/r1/", "revision": "r1"},
    }
    roomy = ModelConfig.model_validate({**base, "replicas": 3, "min_available": 2})
    single = ModelConfig.model_validate({**base, "replicas": 1, "min_available": 1})
    assert guardrails.pod_disruption_budget_spec(roomy)["minAvailable"] == 2
    assert "maxUnavailable" not in guardrails.pod_disruption_budget_spec(roomy)
    assert guardrails.pod_disruption_budget_spec(single)["maxUnavailable"] == 1
    assert "minAvailable" not in guardrails.pod_disruption_budget_spec(single)


def test_ingress_has_tls_long_idle_timeout_and_alb_health_check() -> None:
    result = rendered("prod")
    config = config_of(result)
    for model in config.models:
        if model.scales_to_zero:  # no own Ingress (tests/test_scale_to_zero.py)
            continue
        ingress = one(result, "Ingress", "vllm", model.namespace)
        annotations = ingress["metadata"]["annotations"]
        prefix = "alb.ingress.kubernetes.io"
        assert annotations[f"{prefix}/load-balancer-attributes"] == (
            f"idle_timeout.timeout_seconds={config.ingress.idle_timeout_seconds}"
        )
        assert annotations[f"{prefix}/target-type"] == "ip"
        assert annotations[f"{prefix}/healthcheck-path"] == "/health"
        assert annotations[f"{prefix}/listen-ports"] == '[{"HTTPS": 443}]'
        assert annotations[f"{prefix}/scheme"] == "internet-facing"
        assert annotations[f"{prefix}/certificate-arn"] == config.ingress.certificate_arn
        drain_seconds = model.drain.pre_stop_sleep_seconds + model.drain.shutdown_timeout_seconds
        assert annotations[f"{prefix}/target-group-attributes"] == (
            f"deregistration_delay.timeout_seconds={drain_seconds}"
        )
        spec = ingress["spec"]
        assert spec["ingressClassName"] == "alb"
        assert spec["tls"] == [{"hosts": [model.ingress_host]}]
        assert spec["rules"][0]["host"] == model.ingress_host
        # vLLM's key does not guard /metrics, /tokenize or admin routes: only /v1 is published.
        assert [path["path"] for path in spec["rules"][0]["http"]["paths"]] == ["/v1"]
        # A canary's ALB forwards through the weighted action Argo Rollouts keeps (tests/test_rollouts.py).
        port = "use-annotation" if uses_canary(model) else "http"
        assert spec["rules"][0]["http"]["paths"][0]["backend"] == {
            "service": {"name": "vllm", "port": {"name": port}}
        }
        assert (
            one(result, "Namespace", model.namespace)["metadata"]["labels"][
                "elbv2.k8s.aws/pod-readiness-gate-inject"
            ]
            == "enabled"
        )


def test_ingress_without_certificate_or_cidrs_leaves_them_to_the_controller() -> None:
    annotations = one(rendered("dev"), "Ingress", "vllm", "vllm-qwen2-5-7b")["metadata"]["annotations"]
    assert "alb.ingress.kubernetes.io/certificate-arn" not in annotations
    assert "alb.ingress.kubernetes.io/inbound-cidrs" not in annotations
    assert annotations["alb.ingress.kubernetes.io/scheme"] == "internal"


def test_inbound_cidrs_restrict_the_load_balancer(tmp_path: Path) -> None:
    def cidrs(values: dict[str, Any]) -> None:
        values["ingress"]["inbound_cidrs"] = ["203.0.113.0/24", "198.51.100.0/24"]

    ingress = one(render_variant(tmp_path, cidrs), "Ingress", "vllm", "vllm-qwen2-5-7b")
    assert ingress["metadata"]["annotations"]["alb.ingress.kubernetes.io/inbound-cidrs"] == (
        "203.0.113.0/24,198.51.100.0/24"
    )


def test_ingress_off_means_no_ingress_and_no_public_url(tmp_path: Path) -> None:
    def ingress_off(values: dict[str, Any]) -> None:
        values["ingress"] = {"enabled": False}

    result = render_variant(tmp_path, ingress_off)
    assert result.find("Ingress") == []
    assert result.outputs["model_endpoints"]["qwen2-5-7b"] == {
        "in_cluster": "http://vllm.vllm-qwen2-5-7b.svc.cluster.local:8000"
    }


def test_model_endpoints_give_in_cluster_and_ingress_urls(stack_render: RenderResult) -> None:
    endpoints = stack_render.outputs["model_endpoints"]
    for model in config_of(stack_render).models:
        in_cluster = f"http://vllm.{model.namespace}.svc.cluster.local:{model.vllm.port}"
        if model.scales_to_zero:  # reached through the router only (docs/autoscaling.md)
            assert endpoints[model.name] == {"in_cluster": in_cluster}
            continue
        assert endpoints[model.name] == {"in_cluster": in_cluster, "ingress": f"https://{model.ingress_host}"}


def test_serving_objects_pass_the_kubernetes_openapi_schema_strictly(stack_render: RenderResult) -> None:
    version = f"{config_of(stack_render).cluster.kubernetes_version}.0"
    checked = 0
    for obj in [*model_namespace_objects(stack_render), *stack_render.find("PriorityClass")]:
        group = obj["apiVersion"].rpartition("/")[0]
        if group not in BUILT_IN_GROUPS:
            continue  # a custom resource (SecretProviderClass, ScaledObject): not in Kubernetes' OpenAPI
        kubernetes_validate.validate(as_int(obj), version, strict=True)
        checked += 1
    assert checked >= 10 * len(config_of(stack_render).models)


def test_ingress_enabled_without_a_hostname_is_rejected_at_validate_time(tmp_path: Path) -> None:
    from domain.config import ConfigError

    document = yaml.safe_load(stack_file_for("dev").read_text())
    del document["config"]["vllm-platform:ingress"]["domain"]
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as caught:
        load_stack("dev", stack_file=path)
    assert "models[0].ingress_host" in str(caught.value) and "ingress.domain" in str(caught.value)


def test_existing_mode_renders_the_same_serving_unit(existing_mode_render: RenderResult) -> None:
    config = load_stack("existing", stack_file=TEST_STACKS_DIR / "Pulumi.existing.yaml")
    for model in config.models:
        assert deployment(existing_mode_render, model.name)["spec"]["template"]["spec"]["containers"]
        assert one(existing_mode_render, "PodDisruptionBudget", "vllm", model.namespace)


def test_s3_uri_not_ending_in_the_revision_is_rejected_at_validate_time(tmp_path: Path) -> None:
    from domain.config import ConfigError

    document = yaml.safe_load(stack_file_for("prod").read_text())
    source = document["config"]["vllm-platform:models"][0]["source"]
    source["s3_uri"] = "s3://vllm-prod-model-weights/meta-llama/Llama-3.1-8B-Instruct/"
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as caught:
        load_stack("prod", stack_file=path)
    message = str(caught.value)
    assert (
        "models[0].source.s3_uri" in message
        and f"must end with the revision '{source['revision']}'" in message
    )


def test_preload_source_is_the_parent_of_the_revision_prefix() -> None:
    from domain.config import ModelConfig

    base = {"name": "m", "gpu_group": "g", "architecture": {"preset": "llama-3.1-8b"}}
    nested = ModelConfig.model_validate(
        {**base, "source": {"s3_uri": "s3://bkt/org/m/r1/", "revision": "r1"}}
    )
    top = ModelConfig.model_validate({**base, "source": {"s3_uri": "s3://bkt/r1", "revision": "r1"}})
    hub = ModelConfig.model_validate({**base, "source": {"huggingface_repo": "org/m", "revision": "abc"}})
    assert preload_paths.preload_source(nested.source) == "s3://bkt/org/m/"
    assert preload_paths.preload_source(top.source) == "s3://bkt/"
    assert preload_paths.preload_source(hub.source) == "hf://org/m"
