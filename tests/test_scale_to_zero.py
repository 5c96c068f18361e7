"""Scale to zero (issue 35): the config, the wake the plan predicts, the router's hold, KEDA's demand
trigger (checked by promtool on synthetic router series) and what validate refuses or warns about.

The running chain (a real router holding requests in front of a real vLLM started on demand) is
tests/e2e/test_scale_to_zero.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from components.adapter_rules import router_demand_query
from components.autoscaling import ROUTER_DEMAND_TRIGGER
from components.router_layout import model_router_container_name
from domain.capacity.plan import plan_model, scale_to_zero_warnings
from domain.capacity.wake import (
    HOLD_BACKOFF_MULTIPLIER,
    HOLD_INITIAL_BACKOFF_MS,
    HOLD_MAX_BACKOFF_MS,
    hold_attempts,
    wake_problems,
)
from domain.config.autoscaling import AutoscalingConfig
from infra.stack_checks import config_warnings, load_stack
from tests.conftest import rendered
from tests.test_autoscaling_promtool import promtool

PROD_TO_ZERO = "qwen2-5-7b-tp2"


def _prod_model(name: str = PROD_TO_ZERO):
    config = load_stack("prod")
    index, model = next((i, m) for i, m in enumerate(config.models) if m.name == name)
    return config, index, model


def _held_seconds(attempts: int) -> float:
    """What vllm-router waits over `attempts` attempts with the hold's backoff (no jitter)."""
    backoff, total = HOLD_INITIAL_BACKOFF_MS / 1000, 0.0
    for _ in range(attempts - 1):
        total += backoff
        backoff = min(backoff * HOLD_BACKOFF_MULTIPLIER, HOLD_MAX_BACKOFF_MS / 1000)
    return total


def test_keda_is_the_default_backend_and_only_it_may_scale_to_zero() -> None:
    assert AutoscalingConfig().backend == "keda"
    assert AutoscalingConfig(enabled=True, min_replicas=0).min_replicas == 0
    # Through the stack loader this becomes models[i].autoscaling.min_replicas (tests/bad-stacks/).
    with pytest.raises(ValidationError, match="set backend: keda"):
        AutoscalingConfig(enabled=True, backend="hpa", min_replicas=0)


@pytest.mark.parametrize("hold_seconds", [30, 112, 240, 955, 3600])
def test_the_model_routers_attempts_hold_a_request_the_whole_hold(hold_seconds: int) -> None:
    held = _held_seconds(hold_attempts(hold_seconds))
    # At least the hold, and at most one longest backoff more.
    assert hold_seconds <= held < hold_seconds + HOLD_MAX_BACKOFF_MS / 1000


def test_prod_to_zero_model_wakes_on_a_new_node_and_the_router_holds_it_longer() -> None:
    config, _, model = _prod_model()
    assert model.scales_to_zero and config.node_groups.gpu[model.gpu_group].min_size == 0
    wake = plan_model(model, config, model.gpu_group).wake
    assert wake.expected_case == "new_node"
    names = [step.name for step in wake.new_node]
    assert "the GPU node boots and registers its GPUs" in names
    assert wake.seconds("warm_node") < wake.seconds("new_node") == wake.expected_seconds
    assert wake.hold_seconds == 5 * math.ceil(wake.expected_seconds * model.startup.safety_factor / 5)
    assert wake.warm_replica_gpu_hours_per_day == 24 * model.gpus_per_replica
    assert wake_problems(model, 0, config, wake) == []


def test_a_model_that_keeps_replicas_is_not_held_and_keeps_the_common_retries() -> None:
    args = _router_args("llama-3-1-8b")
    config, _, _ = _prod_model()
    assert args[args.index("--retry-max-retries") + 1] == str(config.router.max_retries)
    assert "--retry-max-backoff-ms" not in args


def _router_args(model_name: str) -> list[str]:
    (deployment,) = rendered("prod").find("Deployment", namespace="vllm-router")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    (container,) = [c for c in containers if c["name"] == f"route-{model_name}"]
    return list(container["args"])


def test_the_to_zero_models_router_renders_the_hold() -> None:
    config, _, model = _prod_model()
    assert model_router_container_name(model) == f"route-{PROD_TO_ZERO}"
    args = _router_args(PROD_TO_ZERO)
    hold = plan_model(model, config, model.gpu_group).wake.hold_seconds
    assert args.count("--retry-max-retries") == 1
    assert args[args.index("--retry-max-retries") + 1] == str(hold_attempts(hold))
    assert args[args.index("--retry-max-backoff-ms") + 1] == str(HOLD_MAX_BACKOFF_MS)
    assert args[args.index("--retry-jitter-factor") + 1] == "0"
    assert _held_seconds(int(args[args.index("--retry-max-retries") + 1])) >= hold


def test_the_to_zero_scaled_object_wakes_on_router_demand_and_goes_to_zero_after_the_idle_window() -> None:
    _, _, model = _prod_model()
    (scaled,) = rendered("prod").find("ScaledObject", "vllm", model.namespace)
    spec = scaled["spec"]
    assert spec["minReplicaCount"] == 0
    assert spec["cooldownPeriod"] == model.autoscaling.keda_polling_interval_seconds
    demand, *others = spec["triggers"]
    assert demand["name"] == ROUTER_DEMAND_TRIGGER
    assert demand["metadata"]["activationThreshold"] == "0" and demand["metadata"]["threshold"] == "1"
    assert demand["metadata"]["query"] == router_demand_query(PROD_TO_ZERO, 900)
    assert [t["name"] for t in others] == ["vllm_num_requests_waiting", "vllm_kv_cache_usage_perc"]
    # A model that keeps replicas gets neither.
    (kept,) = rendered("prod").find("ScaledObject", "vllm", "vllm-llama-3-1-70b")
    assert "cooldownPeriod" not in kept["spec"]
    assert ROUTER_DEMAND_TRIGGER not in [t["name"] for t in kept["spec"]["triggers"]]


def test_a_to_zero_model_has_no_own_hostname_and_the_registrar_lists_it_asleep() -> None:
    render = rendered("prod")
    assert render.find("Ingress", namespace=f"vllm-{PROD_TO_ZERO}") == []
    assert render.find("Ingress", namespace="vllm-llama-3-1-8b") != []
    (config_map,) = render.find("ConfigMap", namespace="vllm-router")
    workers = {w["model_id"]: w for w in json.loads(config_map["data"]["registrar.json"])["workers"]}
    assert workers["Qwen/Qwen2.5-7B-Instruct"]["scale_to_zero"] is True
    assert workers["meta-llama/Llama-3.1-8B-Instruct"]["scale_to_zero"] is False


def test_no_ready_replica_alerts_at_zero_only_while_a_replica_is_wanted() -> None:
    (rule,) = rendered("prod").find("PrometheusRule")
    alerts = [
        r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "ModelNoReadyReplica"
    ]
    by_model = {r["labels"]["model"]: r["expr"] for r in alerts}
    assert "kube_deployment_spec_replicas" in by_model[PROD_TO_ZERO]
    assert "kube_deployment_spec_replicas" not in by_model["llama-3-1-8b"]


def test_validate_warns_when_the_group_of_a_to_zero_model_keeps_idle_nodes() -> None:
    config, _, model = _prod_model()
    assert scale_to_zero_warnings(config) == []
    group = config.node_groups.gpu[model.gpu_group].model_copy(update={"min_size": 1})
    groups = config.node_groups.model_copy(update={"gpu": {**config.node_groups.gpu, model.gpu_group: group}})
    kept = config.model_copy(update={"node_groups": groups})
    lines = config_warnings(kept, stack_file="stacks/Pulumi.prod.yaml")
    (line,) = [line for line in lines if "min_size" in line]
    assert line.startswith(
        "stacks/Pulumi.prod.yaml: warning: vllm-platform:node_groups.gpu.l40s.min_size = 1"
    )
    gpus = kept.node_groups.gpu[model.gpu_group].min_gpus_per_node
    assert f"{24 * gpus} GPU-hours a day idle" in line and "set min_size: 0" in line


def test_timeouts_shorter_than_the_hold_are_refused() -> None:
    config, index, model = _prod_model()
    short = config.model_copy(
        update={
            "router": config.router.model_copy(update={"request_timeout_seconds": 60}),
            "ingress": config.ingress.model_copy(update={"idle_timeout_seconds": 60}),
        }
    )
    wake = plan_model(short.models[index], short, model.gpu_group).wake
    paths = [p.path for p in wake_problems(short.models[index], index, short, wake)]
    assert paths == [("router", "request_timeout_seconds"), ("ingress", "idle_timeout_seconds")]


DEMAND_WINDOW_SECONDS = 300
HELD = 'error_type="no_available_workers"'


def test_the_demand_query_reads_one_from_the_first_held_request_and_zero_after_the_idle_window(
    tmp_path: Path,
) -> None:
    """promtool evaluates the rendered query on router series as the PodMonitor labels them: nothing
    until minute 3, then a held request's attempts (a new series), then served requests, then
    silence; another model's router and a same-named series outside vllm-router do not count."""
    query = router_demand_query("m", DEMAND_WINDOW_SECONDS)
    rules = {"groups": [{"name": "demand", "rules": [{"record": "demand", "expr": query}]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    labels = 'namespace="vllm-router",model="m",route="/v1/chat/completions"'
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # Held attempts appear at minute 3 and stop at 5 (the replica is Ready).
                    {
                        "series": f"vllm_router_request_errors_total{{{labels},{HELD}}}",
                        "values": "_ _ _ 6 30 30x20",
                    },
                    # Served from minute 5 to 8, then nothing.
                    {
                        "series": f"vllm_router_requests_total{{{labels}}}",
                        "values": "_ _ _ _ _ 1 5 9 12 12x20",
                    },
                    {
                        "series": 'vllm_router_requests_total{namespace="vllm-router",model="other"}',
                        "values": "0+10x25",
                    },
                    {
                        "series": 'vllm_router_requests_total{namespace="elsewhere",model="m"}',
                        "values": "0+10x25",
                    },
                ],
                "promql_expr_test": [
                    {"expr": "demand", "eval_time": "2m", "exp_samples": [{"labels": "demand", "value": 0}]},
                    {"expr": "demand", "eval_time": "3m", "exp_samples": [{"labels": "demand", "value": 1}]},
                    {"expr": "demand", "eval_time": "8m", "exp_samples": [{"labels": "demand", "value": 1}]},
                    # Last change at minute 8; the window is 5 minutes.
                    {"expr": "demand", "eval_time": "13m", "exp_samples": [{"labels": "demand", "value": 0}]},
                    {"expr": "demand", "eval_time": "20m", "exp_samples": [{"labels": "demand", "value": 0}]},
                ],
            }
        ],
    }
    (tmp_path / "demand_test.yml").write_text(yaml.safe_dump(tests))
    assert promtool("check", "rules", "rules.yml", cwd=tmp_path).returncode == 0
    result = promtool("test", "rules", "demand_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
