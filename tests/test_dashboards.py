"""The three Grafana dashboards: shipped as sidecar ConfigMaps in prod, every query valid PromQL for
Prometheus itself (`promtool check rules`), over the metrics the pinned exporters export
(tests/test_operations_metric_names.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import yaml

from components.adapter_rules import SIGNALS
from components.dashboards import DASHBOARDS, dashboard_expressions
from components.monitoring import GRAFANA_DASHBOARD_LABEL
from tests.conftest import rendered
from tests.support.promql_names import substitute_grafana_variables


def _dashboard_config_maps(stack: str) -> dict[str, dict]:
    label, value = GRAFANA_DASHBOARD_LABEL
    return {
        cm["metadata"]["name"]: cm
        for cm in rendered(stack).find("ConfigMap")
        if cm["metadata"].get("labels", {}).get(label) == value
    }


def test_prod_ships_the_serving_gpu_and_autoscaling_dashboards_to_grafanas_sidecar() -> None:
    config_maps = _dashboard_config_maps("prod")
    assert set(config_maps) == {f"vllm-platform-dashboard-{slug}" for slug in DASHBOARDS}
    uids = set()
    for config_map in config_maps.values():
        assert config_map["metadata"]["namespace"] == "monitoring"
        [(file, text)] = config_map["data"].items()
        dashboard = json.loads(text)
        assert file.endswith(".json")
        uids.add(dashboard["uid"])
        assert dashboard["panels"], file
        for panel in dashboard["panels"]:
            assert panel["targets"], (file, panel["title"])
            assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}
    assert len(uids) == len(DASHBOARDS)


def test_stacks_without_grafana_ship_no_dashboards() -> None:
    assert _dashboard_config_maps("dev") == {}


def test_every_dashboard_query_parses_as_promql_for_promtool(tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:{slug.replace('-', '_')}:{index}", "expr": substitute_grafana_variables(expr)}
        for slug, build in DASHBOARDS.items()
        for index, (_, expr) in enumerate(dashboard_expressions(build()))
    ]
    (tmp_path / "dashboards.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]})
    )
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus (scripts/setup-test-tools.sh)"
    result = subprocess.run(
        [promtool, "check", "rules", "dashboards.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_the_autoscaling_dashboard_shows_replicas_targets_and_every_signal_per_pod() -> None:
    dashboard = DASHBOARDS["autoscaling"]()
    queries = "\n".join(expr for _, expr in dashboard_expressions(dashboard))
    for series in (
        "kube_horizontalpodautoscaler_status_current_replicas",
        "kube_horizontalpodautoscaler_status_desired_replicas",
        "kube_horizontalpodautoscaler_spec_max_replicas",
        "kube_horizontalpodautoscaler_spec_target_metric",
        *SIGNALS,
    ):
        assert series in queries, series


def test_variable_queries_are_checked_too() -> None:
    dashboard = {
        "templating": {
            "list": [
                {
                    "name": "a",
                    "type": "query",
                    "query": {"query": "label_values(vllm:num_requests_waiting, namespace)"},
                },
                {"name": "b", "type": "query", "query": "label_values(pod)"},
                {"name": "c", "type": "query", "query": "query_result(sum(DCGM_FI_DEV_GPU_TEMP))"},
            ]
        }
    }
    assert [expr for _, expr in dashboard_expressions(dashboard)] == [
        "vllm:num_requests_waiting",
        "sum(DCGM_FI_DEV_GPU_TEMP)",
    ]
