"""The router's in-flight requests as an autoscaling signal (issue 18 item 3): the series the pinned
router exports, the `model` label its PodMonitor gives each model router's series, the adapter's
external rule, the HPA's External metric, the KEDA trigger, and the validate-time errors.

The queries' values on router-shaped series are proven by promtool in
tests/test_autoscaling_promtool.py (tests/promtool/adapter_queries_test.yml).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.adapter_rules import (
    LABEL_MATCHERS,
    ROUTER_RUNNING_REQUESTS,
    SERIES,
    SIGNALS,
    adapter_external_query,
    adapter_external_rule,
    adapter_external_rules,
    adapter_rules,
    keda_query,
)
from components.autoscaling import hpa_spec
from components.rollouts import workload_reference
from domain import router_metrics
from domain.labels import ROUTER_NAMESPACE
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import STACKS
from tests.support.charts import require_charts
from tests.test_addons_cluster import as_int, config_error, release, render_variant
from tests.test_schema_validation import schema_problems

SIGNAL = SIGNALS[ROUTER_RUNNING_REQUESTS]
EXTERNAL_APISERVICE = "v1beta1.external.metrics.k8s.io"


def _router_signal(target: float = 4, backend: str = "hpa", model: int = 0):
    def edit(values: dict[str, Any]) -> None:
        values["models"][model]["autoscaling"] = {
            "enabled": True,
            "backend": backend,
            "max_replicas": 2,
            "metrics": [
                {"metric": "vllm:num_requests_waiting", "target_average_value": 5},
                {"metric": ROUTER_RUNNING_REQUESTS, "target_average_value": target},
            ],
        }
        # Room for a rolling update's surge pod beside two replicas (validate refuses a group that
        # has none: issue 40).
        values["node_groups"]["gpu"]["l40s"]["max_size"] = 3
        if backend == "hpa":
            # KEDA (on by default in mode eks) would serve external.metrics.k8s.io too.
            values.setdefault("addons", {})["keda"] = False

    return edit


# --- the series ----------------------------------------------------------------------------------


def test_the_signal_is_a_gauge_the_pinned_router_exports_per_worker() -> None:
    """The recording is a real single-model vllm-router 0.1.17's /metrics (bench/router/run.sh)."""
    text = router_metrics.RECORDED_EXPOSITION.read_text()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))
    assert types == dict(router_metrics.EXPORTED_FAMILIES)
    assert types[ROUTER_RUNNING_REQUESTS] == "gauge"
    samples = re.findall(rf"^{ROUTER_RUNNING_REQUESTS}\{{(.*)\}} ", text, flags=re.MULTILINE)
    assert samples and all(re.fullmatch(r'worker="http://[^"]+"', labels) for labels in samples)
    # No `model` label of its own: the PodMonitor's target label is the only one.
    assert 'model="' not in text


def test_the_signal_is_external_and_summed_per_model() -> None:
    assert SIGNAL.exporter == "router" and SIGNAL.external and SIGNAL.per_pod == "sum"
    assert [signal.series for signal in SIGNALS.values() if signal.external] == [ROUTER_RUNNING_REQUESTS]


# --- the adapter rule and the queries ------------------------------------------------------------


def test_the_external_rule_is_not_namespaced_and_reads_the_router_namespace() -> None:
    rule = adapter_external_rule(SIGNAL)
    assert rule == {
        "seriesQuery": f'{ROUTER_RUNNING_REQUESTS}{{namespace="{ROUTER_NAMESPACE}",model!=""}}',
        # prometheus-adapter would otherwise add namespace="<the HPA's namespace>" (the model's).
        "resources": {"namespaced": False},
        "name": {"matches": f"^{ROUTER_RUNNING_REQUESTS}$", "as": "vllm_router_running_requests"},
        "metricsQuery": f'sum({SERIES}{{namespace="{ROUTER_NAMESPACE}",{LABEL_MATCHERS}}})',
    }
    assert re.fullmatch(rule["name"]["matches"], SIGNAL.series)


def test_the_adapter_query_and_the_keda_query_are_the_models_router_total() -> None:
    expected = f'sum({ROUTER_RUNNING_REQUESTS}{{namespace="vllm-router",model="llama-3-1-8b"}})'
    rule = adapter_external_rule(SIGNAL)
    assert adapter_external_query(rule, selector={"model": "llama-3-1-8b"}) == expected
    assert (
        keda_query(SIGNAL, namespace="vllm-llama-3-1-8b", deployment_name="vllm", model_name="llama-3-1-8b")
        == expected
    )
    with pytest.raises(ValueError, match="per model"):
        keda_query(SIGNAL, namespace="vllm-m", deployment_name="vllm")


def test_selector_labels_become_matchers_sorted_by_key_as_the_adapter_parses_them() -> None:
    query = adapter_external_query(adapter_external_rule(SIGNAL), selector={"model": "m", "b": "x"})
    assert query == f'sum({ROUTER_RUNNING_REQUESTS}{{namespace="vllm-router",b="x",model="m"}})'


def test_per_pod_and_external_rules_stay_apart() -> None:
    model = load_stack("prod").models[0]
    autoscaling = model.autoscaling.model_copy(
        update={
            "metrics": [
                m.model_copy(update={"metric": series})
                for m, series in zip(
                    model.autoscaling.metrics * 2,
                    ["vllm:num_requests_waiting", ROUTER_RUNNING_REQUESTS],
                    strict=False,
                )
            ]
        }
    )
    models = [model.model_copy(update={"autoscaling": autoscaling})]
    assert [rule["name"]["as"] for rule in adapter_rules(models)] == ["vllm_num_requests_waiting"]
    assert adapter_external_rules(models) == [adapter_external_rule(SIGNAL)]


def test_the_hpa_metric_is_external_with_the_models_selector_and_an_average_target() -> None:
    model = load_stack("prod").models[0]
    autoscaling = model.autoscaling.model_copy(
        update={
            "metrics": [
                model.autoscaling.metrics[0].model_copy(
                    update={"metric": ROUTER_RUNNING_REQUESTS, "target_average_value": 2.5}
                )
            ]
        }
    )
    spec = hpa_spec(autoscaling, workload_reference(model, "vllm"), model_name=model.name)
    assert spec["metrics"] == [
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "vllm_router_running_requests",
                    "selector": {"matchLabels": {"model": model.name}},
                },
                "target": {"type": "AverageValue", "averageValue": "2500m"},
            },
        }
    ]
    with pytest.raises(ValueError, match="per model"):
        hpa_spec(autoscaling, workload_reference(model, "vllm"))


# --- as the program renders it -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hpa_render(tmp_path_factory: pytest.TempPathFactory) -> RenderResult:
    """dev (router on, KEDA off) with its model on the HPA backend, scaling on queue and router load."""
    return render_variant(tmp_path_factory.mktemp("router-hpa"), _router_signal(target=4))


def test_rendered_hpa_holds_the_models_router_requests_per_replica_at_the_target(
    hpa_render: RenderResult,
) -> None:
    [hpa] = [as_int(obj) for obj in hpa_render.find("HorizontalPodAutoscaler")]
    model = load_stack("dev").models[0]
    assert hpa["metadata"]["namespace"] == model.namespace
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "vllm_num_requests_waiting"},
                "target": {"type": "AverageValue", "averageValue": "5"},
            },
        },
        {
            "type": "External",
            "external": {
                "metric": {
                    "name": "vllm_router_running_requests",
                    "selector": {"matchLabels": {"model": model.name}},
                },
                "target": {"type": "AverageValue", "averageValue": "4"},
            },
        },
    ]
    assert schema_problems(hpa, load_stack("dev").cluster.kubernetes_version) == []


def test_rendered_adapter_serves_the_external_rule_and_registers_the_external_api(
    hpa_render: RenderResult,
) -> None:
    rules = release(hpa_render, "prometheus-adapter")["values"]["rules"]
    assert rules["external"] == [adapter_external_rule(SIGNAL)]
    assert [rule["name"]["as"] for rule in rules["custom"]] == ["vllm_num_requests_waiting"]
    require_charts()  # the rest reads what the adapter chart renders from those values
    adapter = [item for item in hpa_render.chart_objects if item.release == "prometheus-adapter"]
    [config_map] = [item.object for item in adapter if item.kind == "ConfigMap"]
    config = yaml.safe_load(next(iter(config_map["data"].values())))
    assert config["externalRules"] == [adapter_external_rule(SIGNAL)]
    assert EXTERNAL_APISERVICE in {item.name for item in adapter if item.kind == "APIService"}
    # Nobody else registers it in this stack (KEDA is off: validation requires it).
    owners = {
        item.release
        for item in hpa_render.chart_objects
        if item.kind == "APIService" and item.name == EXTERNAL_APISERVICE
    }
    assert owners == {"prometheus-adapter"}


def test_keda_trigger_sums_the_models_router_series(tmp_path: Path) -> None:
    result = render_variant(tmp_path, _router_signal(target=6, backend="keda"), base="prod")
    model = load_stack("prod").models[0]
    [scaled_object] = [
        obj for obj in result.find("ScaledObject") if obj["metadata"]["namespace"] == model.namespace
    ]
    [trigger] = [t for t in scaled_object["spec"]["triggers"] if t["name"] == "vllm_router_running_requests"]
    assert trigger["metricType"] == "AverageValue"
    assert trigger["metadata"]["threshold"] == "6"
    assert trigger["metadata"]["query"] == (
        f'sum({ROUTER_RUNNING_REQUESTS}{{namespace="vllm-router",model="{model.name}"}})'
    )
    # A KEDA model needs no adapter rule: the external API stays KEDA's.
    assert release(result, "prometheus-adapter")["values"]["rules"]["external"] == []


@pytest.mark.parametrize("stack", STACKS)
def test_no_shipped_stack_scales_on_the_router_by_default(stack: str) -> None:
    """vLLM's own queue and KV signals lead (docs/autoscaling.md); the router signal is opt-in."""
    config = load_stack(stack)
    assert adapter_external_rules(config.models) == []
    assert all(
        m.metric != ROUTER_RUNNING_REQUESTS for model in config.models for m in model.autoscaling.metrics
    )


# --- validate-time errors ------------------------------------------------------------------------

WHERE = f'vllm-platform:models[0].autoscaling.metrics[1].metric = "{ROUTER_RUNNING_REQUESTS}"'


def _then(*edits: Any):
    def edit(values: dict[str, Any]) -> None:
        for each in edits:
            each(values)

    return edit


@pytest.mark.parametrize(
    ("edit", "base", "fix"),
    [
        (lambda v: v.__setitem__("router", {"enabled": False}), "dev", "set router.enabled: true"),
        (lambda v: v.__setitem__("monitoring", {"enabled": False}), "dev", "set monitoring.enabled: true"),
        (
            lambda v: v.__setitem__(
                "monitoring",
                {
                    **v.get("monitoring", {}),
                    "prometheus": "existing",
                    "existing_prometheus_url": "http://prometheus.observability.svc:9090",
                    "existing_prometheus_operator": False,
                },
            ),
            "dev",
            "monitoring.existing_prometheus_operator: false",
        ),
        (lambda v: v["addons"].__setitem__("keda", True), "prod", "use backend: keda for this model"),
    ],
    ids=["router-off", "monitoring-off", "no-pod-monitor", "hpa-with-keda"],
)
def test_the_router_signal_without_its_path_is_rejected_naming_the_key_and_the_fix(
    tmp_path: Path, edit: Any, base: str, fix: str
) -> None:
    message = config_error(tmp_path, _then(_router_signal(), edit), base=base)
    assert WHERE in message and fix in message
