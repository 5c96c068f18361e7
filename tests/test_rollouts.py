"""Canary rollouts (issue 16): the rendered Rollout, its analysis and traffic split, and the objects
around the pods, which must hold for canary pods exactly as for stable ones.

The CRD-schema checks of these objects are in tests/test_schema_validation.py, the PromQL in
tests/test_rollouts_promtool.py, the bad settings in tests/bad-stacks/canary-*.yaml.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from components import rollouts, workloads
from components.monitoring import prometheus_url
from domain import rollout_pods
from domain.config.rollout import CanaryConfig
from domain.labels import model_selector_labels
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import model_workloads, rendered
from tests.support.argo_rollouts_crds import crd_schema_problems
from tests.support.charts import require_charts
from tests.test_serving_render import config_of, one, render_variant

ROLLOUT_API = "argoproj.io/v1alpha1"


def canary_models(result: RenderResult) -> list[Any]:
    return [model for model in config_of(result).models if rollouts.uses_canary(model)]


def rollout(result: RenderResult, namespace: str) -> dict[str, Any]:
    return one(result, "Rollout", "vllm", namespace)


@pytest.fixture(scope="module")
def prod() -> RenderResult:
    return rendered("prod")


def test_prod_ships_every_model_as_a_canary_and_dev_stays_rolling(prod: RenderResult) -> None:
    assert [m.name for m in canary_models(prod)] == [m.name for m in config_of(prod).models]
    assert not prod.find("Deployment", "vllm")
    dev = rendered("dev")
    assert not dev.find("Rollout") and not dev.find("AnalysisTemplate")
    assert [w["kind"] for w in model_workloads(dev)] == ["Deployment"]
    assert [r["name"] for r in prod.helm_releases if r["name"] == "argo-rollouts"] == ["argo-rollouts"]
    assert "argo-rollouts" not in {r["name"] for r in dev.helm_releases}


def test_default_steps_are_10_analysis_50_analysis_then_promotion(prod: RenderResult) -> None:
    for model in canary_models(prod):
        steps = rollout(prod, model.namespace)["spec"]["strategy"]["canary"]["steps"]
        assert [next(iter(step)) for step in steps] == ["setWeight", "analysis", "setWeight", "analysis"]
        assert [step["setWeight"] for step in steps if "setWeight" in step] == [10, 50]
        for step in steps[1::2]:
            assert step["analysis"]["templates"] == [{"templateName": "vllm-canary"}]
            assert step["analysis"]["args"] == [
                {"name": "canary-hash", "valueFrom": {"podTemplateHashValue": "Latest"}},
                {"name": "stable-hash", "valueFrom": {"podTemplateHashValue": "Stable"}},
            ]
        assert rollouts.describe_steps(model.rollout.canary) == "10% → analysis → 50% → analysis → 100%"


def test_the_split_is_made_at_the_alb_between_the_stable_and_canary_services(prod: RenderResult) -> None:
    for model in canary_models(prod):
        canary = rollout(prod, model.namespace)["spec"]["strategy"]["canary"]
        assert canary["stableService"] == "vllm-stable" and canary["canaryService"] == "vllm-canary"
        if model.scales_to_zero:
            # No own hostname (docs/autoscaling.md, "Scale to zero"): split by pod count behind the router,
            # and without dynamicStableScale, which Argo Rollouts refuses without traffic routing.
            assert "trafficRouting" not in canary and "dynamicStableScale" not in canary
            continue
        assert canary["dynamicStableScale"] is True
        assert canary["trafficRouting"] == {
            "alb": {"ingress": "vllm", "rootService": "vllm", "servicePort": model.vllm.port}
        }
        ingress = one(prod, "Ingress", "vllm", model.namespace)
        [path] = ingress["spec"]["rules"][0]["http"]["paths"]
        # The backend names the root Service and the action (the ALB's weighted forward).
        assert path["backend"] == {"service": {"name": "vllm", "port": {"name": "use-annotation"}}}
        action = json.loads(ingress["metadata"]["annotations"]["alb.ingress.kubernetes.io/actions.vllm"])
        assert action["type"] == "forward"
        weights = {group["serviceName"]: group["weight"] for group in action["forwardConfig"]["targetGroups"]}
        assert weights == {"vllm-stable": 100, "vllm-canary": 0}


def test_stable_canary_and_root_services_select_every_pod_of_the_model(prod: RenderResult) -> None:
    """Argo narrows the stable and canary selectors to one ReplicaSet's hash at run time (and Pulumi
    ignores that change); as rendered, all three select the model's pods on the same port."""
    for model in canary_models(prod):
        template_labels = rollout(prod, model.namespace)["spec"]["template"]["metadata"]["labels"]
        for name in ("vllm", "vllm-stable", "vllm-canary"):
            spec = one(prod, "Service", name, model.namespace)["spec"]
            assert spec["selector"] == model_selector_labels(model.name)
            assert spec["selector"].items() <= template_labels.items()
            assert [p["port"] for p in spec["ports"]] == [model.vllm.port]


def test_what_argo_rewrites_is_left_to_it_by_pulumi(prod: RenderResult) -> None:
    """Argo narrows the stable/canary selectors and rewrites the ALB action: `pulumi up` must not
    reset them mid-rollout (the options as the engine receives them)."""
    for model in canary_models(prod):
        if model.scales_to_zero:
            continue  # no Ingress, so no ALB action (the test above)
        ignored = {
            (r.inputs["kind"], r.inputs["metadata"]["name"]): r.ignore_changes
            for r in prod.resources
            if r.is_kubernetes_object and r.inputs["metadata"].get("namespace") == model.namespace
        }
        assert (
            ignored[("Service", "vllm-stable")] == ignored[("Service", "vllm-canary")] == ("spec.selector",)
        )
        assert ignored[("Service", "vllm")] == ()
        assert ignored[("Ingress", "vllm")] == (
            'metadata.annotations["alb.ingress.kubernetes.io/actions.vllm"]',
            'metadata.annotations["rollouts.argoproj.io/managed-alb-actions"]',
        )
        assert ignored[("Rollout", "vllm")] == ()


def test_the_rollout_carries_the_deployments_pod_template_and_deadlines(prod: RenderResult) -> None:
    """Consistency by construction: probes (with the planner's startup budget), drain, security,
    volumes and placement are those of the Deployment the model would have with `rolling`."""
    config = config_of(prod)
    from domain.capacity import plan_platform

    plan = plan_platform(config)
    for model in canary_models(prod):
        spec = rollout(prod, model.namespace)["spec"]
        rolling = model.model_copy(
            update={"rollout": model.rollout.model_copy(update={"strategy": "rolling"})}
        )
        deployment = workloads.deployment_spec(config, rolling, plan.models[model.name], "vllm")
        template = json.loads(json.dumps(deployment["template"]))
        for spread in template["spec"]["topologySpreadConstraints"]:
            spread["matchLabelKeys"] = ["rollouts-pod-template-hash"]
        assert spec["template"] == template
        assert spec["selector"] == deployment["selector"]
        assert spec["progressDeadlineSeconds"] == deployment["progressDeadlineSeconds"]
        assert spec["progressDeadlineAbort"] is True
        [server] = [c for c in spec["template"]["spec"]["containers"] if c["name"] == "vllm"]
        budget = plan.models[model.name].startup_budget_seconds
        probe = server["startupProbe"]
        assert probe["failureThreshold"] * probe["periodSeconds"] >= budget


def test_topology_spread_counts_one_revision_by_argos_hash_label(prod: RenderResult) -> None:
    for model in canary_models(prod):
        spreads = rollout(prod, model.namespace)["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {tuple(s["matchLabelKeys"]) for s in spreads} == {("rollouts-pod-template-hash",)}
    for workload in model_workloads(rendered("dev")):
        spreads = workload["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert {tuple(s["matchLabelKeys"]) for s in spreads} == {("pod-template-hash",)}


def test_pdb_and_network_policies_select_canary_pods_too(prod: RenderResult) -> None:
    for model in canary_models(prod):
        labels = rollout(prod, model.namespace)["spec"]["template"]["metadata"]["labels"]
        pdb = one(prod, "PodDisruptionBudget", "vllm", model.namespace)["spec"]
        assert pdb["selector"]["matchLabels"].items() <= labels.items()
        policies = prod.find("NetworkPolicy", namespace=model.namespace)
        assert policies
        for policy in policies:
            selected = policy["spec"]["podSelector"].get("matchLabels", {})
            assert selected.items() <= labels.items(), policy["metadata"]["name"]


def test_autoscalers_scale_the_rollout_which_leaves_replicas_to_them(prod: RenderResult) -> None:
    for model in canary_models(prod):
        assert model.autoscaling.enabled
        spec = rollout(prod, model.namespace)["spec"]
        # Only a to-zero model's Rollout carries replicas: 0, at creation (issue 40).
        assert spec.get("replicas", None) == (0 if model.scales_to_zero else None), model.name
        kind = "HorizontalPodAutoscaler" if model.autoscaling.backend == "hpa" else "ScaledObject"
        target = one(prod, kind, "vllm", model.namespace)["spec"]["scaleTargetRef"]
        assert target == {"apiVersion": ROLLOUT_API, "kind": "Rollout", "name": "vllm"}


def test_a_fixed_replica_canary_sets_its_replicas(tmp_path: Path) -> None:
    def canary(values: dict[str, Any]) -> None:
        values["models"][0]["rollout"] = {"strategy": "canary"}
        values["models"][0]["replicas"] = 2
        # Room for the canary's extra pod and for one pod still draining: 2 + 1 + 1.
        values["node_groups"]["gpu"]["l40s"]["max_size"] = 4
        values["addons"] = {"argo_rollouts": True}

    result = render_variant(tmp_path, canary)
    model = config_of(result).models[0]
    spec = rollout(result, model.namespace)["spec"]
    assert spec["replicas"] == 2
    assert crd_schema_problems(rollout(result, model.namespace)) == []


def test_gpu_quota_fits_stable_plus_canary_at_every_step(prod: RenderResult) -> None:
    for model in canary_models(prod):
        quota = int(
            one(prod, "ResourceQuota", "gpu-quota", model.namespace)["spec"]["hard"][
                "requests.nvidia.com/gpu"
            ]
        )
        for weight in model.rollout.canary.steps:
            stable, canary = rollout_pods.pods_at_weight(weight, model.max_replicas)
            # Plus one GPU set for a pod still terminating (components/probes.py gpu_quota).
            assert (stable + canary + 1) * model.gpus_per_replica <= quota, (model.name, weight)


@pytest.mark.parametrize(
    ("weight", "replicas", "expected"),
    [(10, 1, (1, 1)), (50, 1, (1, 1)), (10, 8, (8, 1)), (50, 8, (4, 4)), (10, 10, (9, 1)), (99, 4, (1, 4))],
)
def test_dynamic_stable_scale_adds_at_most_one_pod(
    weight: int, replicas: int, expected: tuple[int, int]
) -> None:
    assert rollout_pods.pods_at_weight(weight, replicas) == expected
    assert sum(expected) <= replicas + 1


def test_analysis_compares_canary_with_stable_pods_in_the_models_namespace(prod: RenderResult) -> None:
    config = config_of(prod)
    for model in canary_models(prod):
        template = one(prod, "AnalysisTemplate", "vllm-canary", model.namespace)["spec"]
        assert template["args"] == [{"name": "canary-hash"}, {"name": "stable-hash"}]
        names = [metric["name"] for metric in template["metrics"]]
        assert names == ["error-rate", "http-error-rate", "ttft-p95", "tpot-p95", "queue-depth"]
        analysis = model.rollout.canary.analysis
        for metric in template["metrics"]:
            assert metric["successCondition"] == "result[0] <= 1"
            assert metric["interval"] == f"{analysis.interval_seconds}s"
            assert metric["count"] == analysis.measurements
            assert metric["failureLimit"] == analysis.failure_limit
            prometheus = metric["provider"]["prometheus"]
            assert prometheus["address"] == prometheus_url(config.monitoring)
            query = prometheus["query"]
            assert f'namespace="{model.namespace}"' in query
            assert 'rollouts_pod_template_hash="{{args.canary-hash}}"' in query
            assert 'rollouts_pod_template_hash="{{args.stable-hash}}"' in query
            assert f"[{analysis.window_seconds}s]" in query


def test_the_pod_monitor_keeps_the_rollout_hash_on_every_series(prod: RenderResult) -> None:
    [monitor] = prod.find("PodMonitor", "vllm")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_label_rollouts_pod_template_hash"],
        "targetLabel": "rollouts_pod_template_hash",
    } in endpoint["relabelings"]


def test_argo_rollouts_controller_runs_two_replicas_with_only_the_alb_provider_rbac(
    prod: RenderResult,
) -> None:
    [release] = [r for r in prod.helm_releases if r["name"] == "argo-rollouts"]
    values = release["values"]
    assert values["controller"]["replicas"] == 2
    require_charts()  # the PDB and the controller are the chart's objects
    [pdb] = [
        obj
        for obj in prod.all_kubernetes_objects
        if obj["kind"] == "PodDisruptionBudget" and obj["metadata"].get("namespace") == "argo-rollouts"
    ]
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    [controller] = [
        obj
        for obj in prod.all_kubernetes_objects
        if obj["kind"] == "Deployment" and obj["metadata"].get("namespace") == "argo-rollouts"
    ]
    assert (
        pdb["spec"]["selector"]["matchLabels"].items()
        <= controller["spec"]["template"]["metadata"]["labels"].items()
    )
    assert values["dashboard"] == {"enabled": False}
    assert {name for name, on in values["providerRBAC"]["providers"].items() if on} == {
        "awsLoadBalancerController"
    }
    assert values["installCRDs"] is True and values["keepCRDs"] is True


def test_the_crd_check_rejects_what_argo_would_reject(prod: RenderResult) -> None:
    model = canary_models(prod)[0]
    good = rollout(prod, model.namespace)
    typo = json.loads(json.dumps(good))
    typo["spec"]["strategy"]["canary"]["trafficRouting"]["alb"]["servicePorts"] = 8000
    assert any("'servicePorts' was unexpected" in p for p in crd_schema_problems(typo))
    wrong = json.loads(json.dumps(good))
    wrong["spec"]["strategy"]["canary"]["steps"][0]["setWeight"] = "10%"
    assert any(p.startswith("spec.strategy.canary.steps.0.setWeight") for p in crd_schema_problems(wrong))
    template = json.loads(json.dumps(one(prod, "AnalysisTemplate", "vllm-canary", model.namespace)))
    template["spec"]["metrics"][0]["provider"]["prometheus"]["querry"] = "up"
    assert any("'querry' was unexpected" in p for p in crd_schema_problems(template))


def test_steps_must_increase_and_stay_below_100() -> None:
    assert CanaryConfig(steps=[5, 25, 60]).steps == [5, 25, 60]
    for steps, fragment in (([50, 10], "must increase"), ([10, 100], "below 100"), ([0], "above 0")):
        with pytest.raises(ValueError, match=fragment):
            CanaryConfig(steps=steps)


# --- checks over the config ------------------------------------------------------------------------


def _prod_with(**model_updates: Any) -> Any:
    """prod with its first model's canary analysis (or other fields) changed, unchecked."""
    config = load_stack("prod")
    model = config.models[0]
    if "analysis" in model_updates:
        canary = model.rollout.canary.model_copy(update={"analysis": model_updates.pop("analysis")})
        model_updates["rollout"] = model.rollout.model_copy(update={"canary": canary})
    return config.model_copy(update={"models": [model.model_copy(update=model_updates), *config.models[1:]]})


def _problems_at(config: Any) -> dict[str, str]:
    return {problem.key_path(): problem.message for problem in rollouts.rollout_problems(config)}


def test_prod_canaries_pass_every_rollout_check() -> None:
    assert rollouts.rollout_problems(load_stack("prod")) == []


def test_a_check_on_a_metric_of_the_wrong_type_is_refused() -> None:
    analysis = load_stack("prod").models[0].rollout.canary.analysis
    gauge = analysis.ttft_p95.model_copy(update={"metric": "vllm:num_requests_waiting"})
    problems = _problems_at(_prod_with(analysis=analysis.model_copy(update={"ttft_p95": gauge})))
    message = problems["vllm-platform:models[0].rollout.canary.analysis.ttft_p95.metric"]
    assert "ttft_p95 needs a histogram and vllm:num_requests_waiting is a gauge" in message


def test_a_window_shorter_than_two_scrapes_is_refused() -> None:
    key = "vllm-platform:models[0].rollout.canary.analysis.window_seconds"
    analysis = load_stack("prod").models[0].rollout.canary.analysis.model_copy(update={"window_seconds": 30})
    config = _prod_with(analysis=analysis)
    assert key not in _problems_at(config)  # two 15 s scrapes fit in 30 s
    slow_scrapes = config.model_copy(
        update={"monitoring": config.monitoring.model_copy(update={"scrape_interval_seconds": 30})}
    )
    assert "set window_seconds to at least 60" in _problems_at(slow_scrapes)[key]


def test_the_shared_volume_must_hold_the_old_and_the_new_revision() -> None:
    config = load_stack("prod")
    small = config.model_copy(
        update={"storage": config.storage.model_copy(update={"model_volume_size_gib": 200})}
    )
    message = _problems_at(small)["vllm-platform:storage.model_volume_size_gib"]
    assert "for canary models, the old one until the rollout ends" in message
    assert "raise model_volume_size_gib to at least" in message


def test_a_canary_needs_prometheus_and_the_alb() -> None:
    config = load_stack("prod")
    nginx = config.model_copy(update={"ingress": config.ingress.model_copy(update={"class_name": "nginx"})})
    assert "use ingress.class_name: alb" in _problems_at(nginx)["vllm-platform:models[0].rollout.strategy"]
    dark = config.model_copy(update={"monitoring": config.monitoring.model_copy(update={"enabled": False})})
    assert "monitoring.enabled is false" in _problems_at(dark)["vllm-platform:models[0].rollout.strategy"]


def test_the_room_check_counts_every_pod_it_names_including_the_draining_one() -> None:
    # 40 replicas of 2 GPUs at steps [10, 50]: stable + canary never exceed 40 (no extra canary pod),
    # and one pod more holds its GPUs while an old one drains: 41 pods, 82 GPUs (issue 24 item 7).
    config = load_stack("prod")
    model = config.models[1]
    assert model.gpus_per_replica == 2 and model.rollout.canary.steps == [10, 50]
    autoscaling = model.autoscaling.model_copy(update={"max_replicas": 40})
    config = _prod_with_model(config, 1, autoscaling=autoscaling)
    message = _problems_at(config)["vllm-platform:models[1].rollout.strategy"]
    assert "runs up to 41 pods at once (40 replicas plus one pod started while an old one drains)" in message
    assert "= 41 × 2 = 82 GPUs" in message
    assert "extra pod" not in message
    assert rollouts.peak_pods(config.models[1]) * 2 == 82


def test_the_room_check_names_the_canarys_extra_pod_when_a_step_adds_one() -> None:
    config = load_stack("prod")
    autoscaling = config.models[1].autoscaling.model_copy(update={"max_replicas": 19})
    config = _prod_with_model(config, 1, autoscaling=autoscaling)
    # weight 10 of 19 replicas: 18 stable + 2 canary; plus the draining pod: 21 pods of 2 GPUs.
    assert rollouts.peak_replicas(config.models[1]) == 20
    message = _problems_at(config)["vllm-platform:models[1].rollout.strategy"]
    assert (
        "runs up to 21 pods at once (19 replicas plus the canary's extra pod plus one pod started while "
        "an old one drains) = 21 × 2 = 42 GPUs" in message
    )


def _prod_with_model(config: Any, index: int, **updates: Any) -> Any:
    models = list(config.models)
    models[index] = models[index].model_copy(update=updates)
    return config.model_copy(update={"models": models})
