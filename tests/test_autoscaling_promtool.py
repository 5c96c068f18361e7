"""The generated PromQL, checked by promtool (Debian's `prometheus` package; scripts/setup-test-tools.sh).

Each adapter rule (custom and external), with its placeholders filled the way prometheus-adapter
fills them, and each KEDA trigger query becomes a recording rule: `promtool check rules` parses them, and
`promtool test rules` on synthetic series (tests/promtool/) proves the values the HPA and KEDA see.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.adapter_rules import (
    SIGNALS,
    adapter_external_query,
    adapter_external_rules,
    adapter_query,
    adapter_rules,
    external_metric_selector,
    hpa_signals,
    keda_query,
)
from domain.config.models import ModelConfig
from infra.stack_checks import load_stack
from tests.conftest import STACKS

FIXTURES = Path(__file__).resolve().parent / "promtool"
RULES_FILE = "adapter-recording-rules.yml"
# The model, namespace and pods tests/promtool/adapter_queries_test.yml writes series for.
NAMESPACE = "vllm-llama-3-1-70b"
DEPLOYMENT = "vllm"
PODS = ["vllm-6c5d8b7f9-a1b2c", "vllm-6c5d8b7f9-x9y8z"]
MODEL = "llama-3-1-70b"
"""Its name: the `model` label the router PodMonitor gives its router's series, and the HPA's selector."""


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("promtool")
    assert executable, (
        "promtool is missing: apt-get install prometheus (scripts/setup-test-tools.sh installs it)"
    )
    return subprocess.run([executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def recording_rules(models: list[ModelConfig]) -> dict[str, Any]:
    """The adapter's rules and KEDA's trigger queries for NAMESPACE/PODS, as Prometheus recording rules."""
    rules = adapter_rules(models)
    external = adapter_external_rules(models)
    return {
        "groups": [
            {
                "name": "adapter-discovery",
                "rules": [
                    # The selector the adapter lists series with must parse as PromQL too.
                    {"record": f"adapter_series:{rule['name']['as']}", "expr": rule["seriesQuery"]}
                    for rule in [*rules, *external]
                ],
            },
            {
                "name": "adapter",
                "rules": [
                    {
                        "record": f"adapter:{rule['name']['as']}",
                        "expr": adapter_query(rule, namespace=NAMESPACE, pods=PODS),
                    }
                    for rule in rules
                ],
            },
            {
                "name": "keda",
                "rules": [
                    {
                        "record": f"keda:{signal.custom_metric_name}",
                        "expr": keda_query(
                            signal, namespace=NAMESPACE, deployment_name=DEPLOYMENT, model_name=MODEL
                        ),
                    }
                    for signal in hpa_signals(models)
                ],
            },
            {
                "name": "adapter-external",
                "rules": [
                    {
                        "record": f"adapter_external:{rule['name']['as']}",
                        "expr": adapter_external_query(rule, selector=external_metric_selector(MODEL)),
                    }
                    for rule in external
                ],
            },
        ]
    }


def _models_using_every_signal() -> list[ModelConfig]:
    model = load_stack("prod").models[0]
    autoscaling = model.autoscaling.model_copy(
        update={
            "metrics": [
                model.autoscaling.metrics[0].model_copy(update={"metric": series}) for series in SIGNALS
            ]
        }
    )
    return [model.model_copy(update={"autoscaling": autoscaling})]


def _write_rules(directory: Path, models: list[ModelConfig]) -> Path:
    path = directory / RULES_FILE
    path.write_text(yaml.safe_dump(recording_rules(models), sort_keys=False))
    return path


CHECKED = [stack for stack in STACKS if adapter_rules(load_stack(stack).models)]


@pytest.mark.parametrize("case", [*CHECKED, "every-signal"])
def test_every_generated_query_passes_promtool_check_rules(tmp_path: Path, case: str) -> None:
    models = _models_using_every_signal() if case == "every-signal" else load_stack(case).models
    path = _write_rules(tmp_path, models)
    result = promtool("check", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in recording_rules(models)["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_the_rule_check_catches_a_broken_query(tmp_path: Path) -> None:
    rules = recording_rules(load_stack("prod").models)
    rules["groups"][1]["rules"][0]["expr"] = rules["groups"][1]["rules"][0]["expr"].replace(
        ") by (pod)", " by (pod)"
    )
    path = tmp_path / RULES_FILE
    path.write_text(yaml.safe_dump(rules))
    assert promtool("check", "rules", str(path), cwd=tmp_path).returncode != 0


def test_synthetic_series_give_the_per_pod_values_and_averages_the_autoscalers_use(tmp_path: Path) -> None:
    models = _models_using_every_signal()
    assert NAMESPACE in {model.namespace for model in load_stack("prod").models}
    assert {signal.series for signal in hpa_signals(models)} == set(SIGNALS)
    _write_rules(tmp_path, models)
    shutil.copy(FIXTURES / "adapter_queries_test.yml", tmp_path)
    result = promtool("test", "rules", "adapter_queries_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_a_wrong_expectation_fails_the_promtool_test(tmp_path: Path) -> None:
    """The fixture's numbers are really compared (a changed aggregation would fail the test above)."""
    _write_rules(tmp_path, _models_using_every_signal())
    fixture = (FIXTURES / "adapter_queries_test.yml").read_text()
    (tmp_path / "adapter_queries_test.yml").write_text(fixture.replace("value: 0.65", "value: 0.6"))
    result = promtool("test", "rules", "adapter_queries_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "avg(adapter:dcgm_fi_prof_pipe_tensor_active)" in result.stdout + result.stderr


def _leaders_test(tmp_path: Path, *, leaders_only: bool) -> subprocess.CompletedProcess[str]:
    """A LeaderWorkerSet `vllm` with two groups of two: leaders `vllm-0`, `vllm-1`, workers `vllm-0-1`,
    `vllm-1-1`. Workers carry a KV gauge here (a scrape of a headless member would give one); the
    trigger must count the leaders' engines only: 0.75 + 0 = 0.75."""
    signal = SIGNALS["vllm:kv_cache_usage_perc"]
    query = keda_query(signal, namespace=NAMESPACE, deployment_name=DEPLOYMENT, leaders_only=leaders_only)
    rules = {"groups": [{"name": "keda", "rules": [{"record": "keda:groups", "expr": query}]}]}
    (tmp_path / RULES_FILE).write_text(yaml.safe_dump(rules, sort_keys=False))
    gauges = {"vllm-0": "0.75", "vllm-0-1": "0.25", "vllm-1": "0", "vllm-1-1": "0.25"}
    test = {
        "rule_files": [RULES_FILE],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'vllm:kv_cache_usage_perc{{namespace="{NAMESPACE}",pod="{pod}",'
                        'container="vllm",job="vllm",engine="0"}',
                        "values": f"{value}x5",
                    }
                    for pod, value in gauges.items()
                ],
                "promql_expr_test": [
                    {
                        "expr": "keda:groups",
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "keda:groups", "value": 0.75}],
                    }
                ],
            }
        ],
    }
    (tmp_path / "leaders_test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    return promtool("test", "rules", "leaders_test.yml", cwd=tmp_path)


def test_a_leader_worker_sets_triggers_count_its_group_leaders_only(tmp_path: Path) -> None:
    result = _leaders_test(tmp_path, leaders_only=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # The one-node form (every pod of the workload) would count the workers too: 1.25, not 0.75.
    one_node = _leaders_test(tmp_path, leaders_only=False)
    assert one_node.returncode != 0
    assert "1.25" in one_node.stdout + one_node.stderr
