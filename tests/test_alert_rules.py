"""The alert rules, checked by promtool (Debian's `prometheus` package) on series labelled like the
real exporters': vLLM's names and labels from the recorded /metrics of a real vLLM 0.32.0 server
(tests/data/vllm-metrics/exposition.txt; tests/e2e/test_recorded_metrics.py re-checks them against
a live one), DCGM's from the pinned exporter's counters and label template (domain/dcgm_metrics.py),
kube-state-metrics' from its docs at the pinned version (domain/kube_state_metrics.py).

Every alert has a case where it fires (with the labels it pages with) and one where it stays quiet.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.alert_rules import ALERT_RUNBOOKS, PROMETHEUS_RULE_NAME, alert_rule_groups
from domain import dcgm_metrics, kube_state_metrics, tenant_metrics, vllm_metrics
from domain.config import PlatformConfig
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT, STACKS, rendered
from tests.support.promql_names import EXPOSITION


def _groups(config: PlatformConfig) -> list[dict[str, Any]]:
    return alert_rule_groups(
        config.models,
        config.monitoring.alerts,
        dcgm_exporter=bool(config.addons.dcgm_exporter.enabled),
        tenants=config.tenants,
    )


MODEL = "llama-3-1-8b"
NAMESPACE = f"vllm-{MODEL}"
POD = "vllm-5f4c9d8b7-q1w2e"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\} ")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    executable = shutil.which("promtool")
    assert executable, "promtool is missing: apt-get install prometheus (scripts/setup-test-tools.sh)"
    return subprocess.run([executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def exported_label_sets(name: str) -> list[dict[str, str]]:
    """The label sets the real vLLM server exported for series `name` (fails if it exported none)."""
    sets = []
    for line in EXPOSITION.read_text().splitlines():
        match = _SAMPLE.match(line)
        if match and match["name"] == name:
            sets.append(dict(_LABEL.findall(match["labels"])))
    assert sets, (
        f"the recorded vLLM /metrics has no series {name}: renamed? "
        "re-run bench/metrics/capture_vllm_metrics.py"
    )
    return sets


def _series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def vllm_series(name: str, values: str, **overrides: str) -> dict[str, str]:
    """A vLLM series as the PodMonitor stores it: the server's own labels plus the target labels."""
    labels = {**exported_label_sets(name)[0], **overrides}
    labels.update(
        {
            "namespace": NAMESPACE,
            "pod": POD,
            "container": "vllm",
            "model": MODEL,
            "job": f"{NAMESPACE}/vllm",
            "instance": f"{POD}:8000",
        }
    )
    return {"series": _series(name, labels), "values": values}


def histogram_series(
    family: str, observed_seconds: float, per_minute: int, minutes: int
) -> list[dict[str, str]]:
    """Every bucket the server exports for `family`, with `per_minute` observations of `observed_seconds`."""
    series = []
    for labels in exported_label_sets(f"{family}_bucket"):
        le = labels["le"]
        counts = per_minute if le == "+Inf" or float(le) >= observed_seconds else 0
        series.append(vllm_series(f"{family}_bucket", f"0+{counts}x{minutes}", le=le))
    series.append(vllm_series(f"{family}_count", f"0+{per_minute}x{minutes}"))
    return series


def ksm_series(name: str, values: str, **labels: str) -> dict[str, str]:
    expected = kube_state_metrics.SERIES_LABELS[name]
    full = {"namespace": NAMESPACE, **labels}
    assert set(full) <= set(expected), f"{name} has no labels {set(full) - set(expected)}"
    full.update({"job": "kube-state-metrics", "instance": "10.0.3.7:8080"})
    return {"series": _series(name, full), "values": values}


GPU_LABELS = {
    "gpu": "3",
    "UUID": "GPU-0b1c6a2e-0000-0000-0000-000000000003",
    "pci_bus_id": "00000000:9A:00.0",
    "device": "nvidia3",
    "modelName": "NVIDIA H200",
    "Hostname": "ip-10-0-1-23",
    "DCGM_FI_DRIVER_VERSION": "570.124.06",
    "namespace": NAMESPACE,
    "pod": POD,
    "container": "vllm",
}


def dcgm_series(name: str, values: str) -> dict[str, str]:
    assert name in dcgm_metrics.EXPORTED_SERIES, f"the pinned DCGM exporter does not export {name}"
    assert set(GPU_LABELS) == set(dcgm_metrics.GPU_SERIES_LABELS)
    return {"series": _series(name, {**GPU_LABELS, "job": "dcgm-exporter"}), "values": values}


def tenant_series(name: str, values: str, **labels: str) -> dict[str, str]:
    """A series of the API-key middleware (domain/tenant_metrics.py) as the vLLM PodMonitor stores it."""
    assert tuple(labels) == tenant_metrics.SERIES_LABELS[name], (name, tuple(labels))
    target = {"namespace": NAMESPACE, "pod": POD, "container": "vllm", "job": f"{NAMESPACE}/vllm"}
    return {"series": _series(name, {**labels, **target, "instance": f"{POD}:8000"}), "values": values}


MODEL_LABELS = {"model": MODEL, "namespace": NAMESPACE}
GPU_ALERT_LABELS = {key: GPU_LABELS[key] for key in ("Hostname", "gpu", "UUID", "modelName")}

# alert -> (input series where it fires, labels it fires with, input series where it stays quiet)
CASES: dict[str, tuple[list[dict[str, str]], dict[str, str], list[dict[str, str]]]] = {
    "VllmTimeToFirstTokenHigh": (
        histogram_series(vllm_metrics.TIME_TO_FIRST_TOKEN_SECONDS, 5.0, 30, 30),
        {"severity": "warning", **MODEL_LABELS},
        histogram_series(vllm_metrics.TIME_TO_FIRST_TOKEN_SECONDS, 0.5, 30, 30),
    ),
    "VllmInterTokenLatencyHigh": (
        histogram_series(vllm_metrics.INTER_TOKEN_LATENCY_SECONDS, 0.5, 600, 30),
        {"severity": "warning", **MODEL_LABELS},
        histogram_series(vllm_metrics.INTER_TOKEN_LATENCY_SECONDS, 0.025, 600, 30),
    ),
    "VllmRequestErrorsHigh": (
        [
            vllm_series("http_requests_total", "0+90x30", status="2xx"),
            vllm_series("http_requests_total", "0+10x30", status="5xx"),
        ],
        {"severity": "critical", **MODEL_LABELS},
        [
            vllm_series("http_requests_total", "0+999x30", status="2xx"),
            vllm_series("http_requests_total", "0+1x30", status="5xx"),
        ],
    ),
    "VllmRequestsQueued": (
        [vllm_series(vllm_metrics.NUM_REQUESTS_WAITING, "0 3x30")],
        {"severity": "warning", **MODEL_LABELS},
        [vllm_series(vllm_metrics.NUM_REQUESTS_WAITING, "0 30-1x30")],  # draining
    ),
    "VllmKvCacheNearlyFull": (
        [vllm_series(vllm_metrics.KV_CACHE_USAGE, "0.97x30")],
        {"severity": "warning", "pod": POD, **MODEL_LABELS},
        [vllm_series(vllm_metrics.KV_CACHE_USAGE, "0.9x30")],
    ),
    "VllmPreempting": (
        [vllm_series(vllm_metrics.NUM_PREEMPTIONS, "0+3x30")],
        {"severity": "warning", **MODEL_LABELS},
        [vllm_series(vllm_metrics.NUM_PREEMPTIONS, "7x30")],
    ),
    "ModelNoReadyReplica": (
        [ksm_series(kube_state_metrics.DEPLOYMENT_AVAILABLE_REPLICAS, "0x30", deployment="vllm")],
        {"severity": "critical", **MODEL_LABELS},
        [ksm_series(kube_state_metrics.DEPLOYMENT_AVAILABLE_REPLICAS, "2x30", deployment="vllm")],
    ),
    "AutoscalerAtMaximum": (
        [
            ksm_series(kube_state_metrics.HPA_CURRENT_REPLICAS, "8x30", horizontalpodautoscaler="vllm"),
            ksm_series(kube_state_metrics.HPA_MAX_REPLICAS, "8x30", horizontalpodautoscaler="vllm"),
        ],
        {"severity": "warning", **MODEL_LABELS},
        [
            ksm_series(kube_state_metrics.HPA_CURRENT_REPLICAS, "5x30", horizontalpodautoscaler="vllm"),
            ksm_series(kube_state_metrics.HPA_MAX_REPLICAS, "8x30", horizontalpodautoscaler="vllm"),
        ],
    ),
    "ModelPreloaderFailing": (
        [
            ksm_series(
                kube_state_metrics.INIT_CONTAINER_WAITING_REASON,
                "1x30",
                pod=POD,
                uid="u1",
                container="model-cache",
                reason="CrashLoopBackOff",
            )
        ],
        {"severity": "warning", "pod": POD, **MODEL_LABELS},
        [
            ksm_series(
                kube_state_metrics.INIT_CONTAINER_WAITING_REASON,
                "0x30",
                pod=POD,
                uid="u1",
                container="model-cache",
                reason="CrashLoopBackOff",
            ),
            ksm_series(
                kube_state_metrics.INIT_CONTAINER_RESTARTS, "0x30", pod=POD, uid="u1", container="model-cache"
            ),
        ],
    ),
    # prod: tenant `search` may send 600 requests a minute, `research` have 16 in flight.
    "TenantNearRateLimit": (
        [tenant_series(tenant_metrics.TENANT_REQUESTS, "0+580x30", tenant="search", model=MODEL, code="200")],
        {"severity": "warning", "tenant": "search"},
        [tenant_series(tenant_metrics.TENANT_REQUESTS, "0+300x30", tenant="search", model=MODEL, code="200")],
    ),
    "TenantOverConcurrencyLimit": (
        [tenant_series(tenant_metrics.TENANT_REQUESTS_IN_FLIGHT, "20x30", tenant="research")],
        {"severity": "warning", "tenant": "research"},
        [tenant_series(tenant_metrics.TENANT_REQUESTS_IN_FLIGHT, "12x30", tenant="research")],
    ),
    "GpuXidError": (
        [dcgm_series(dcgm_metrics.XID_ERRORS, "0 0 79x28")],
        {"severity": "critical", **GPU_ALERT_LABELS},
        [dcgm_series(dcgm_metrics.XID_ERRORS, "0x30")],
    ),
    "GpuTemperatureHigh": (
        [dcgm_series(dcgm_metrics.GPU_TEMPERATURE, "91x30")],
        {"severity": "warning", **GPU_ALERT_LABELS},
        [dcgm_series(dcgm_metrics.GPU_TEMPERATURE, "78x30")],
    ),
    "GpuRowRemapFailure": (
        [dcgm_series(dcgm_metrics.ROW_REMAP_FAILURE, "0 1x29")],
        {"severity": "critical", **GPU_ALERT_LABELS},
        [dcgm_series(dcgm_metrics.ROW_REMAP_FAILURE, "0x30")],
    ),
    "GpuUncorrectableRowsRemapped": (
        [dcgm_series(dcgm_metrics.UNCORRECTABLE_REMAPPED_ROWS, "0x10 1x20")],
        {"severity": "warning", **GPU_ALERT_LABELS},
        [dcgm_series(dcgm_metrics.UNCORRECTABLE_REMAPPED_ROWS, "2x30")],
    ),
}
EVAL_TIME = "25m"


def prod_groups() -> list[dict[str, Any]]:
    return _groups(load_stack("prod"))


def _without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """promtool compares annotations too; their templates are checked by `check rules` instead."""
    stripped = copy.deepcopy(groups)
    for group in stripped:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return stripped


def _promtool_test(tmp_path: Path, groups: list[dict[str, Any]], tests: list[dict[str, Any]]) -> str:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": _without_annotations(groups)}))
    (tmp_path / "alerts_test.yml").write_text(
        yaml.safe_dump(
            {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False
        )
    )
    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    return result.stdout + result.stderr if result.returncode else ""


@pytest.mark.parametrize("stack", STACKS)
def test_every_stacks_rules_pass_promtool_check_rules(tmp_path: Path, stack: str) -> None:
    [rule] = rendered(stack).find("PrometheusRule", name=PROMETHEUS_RULE_NAME)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in rule["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout


def test_every_prod_alert_has_a_firing_and_a_quiet_case() -> None:
    alerts = {rule["alert"] for group in prod_groups() for rule in group["rules"]}
    assert alerts == set(CASES) == set(ALERT_RUNBOOKS)


@pytest.mark.parametrize("alert", list(CASES))
def test_alert_fires_on_the_real_exporters_series_and_stays_quiet_below_its_threshold(
    tmp_path: Path, alert: str
) -> None:
    firing, labels, quiet = CASES[alert]
    groups = [
        {"name": group["name"], "rules": [r for r in group["rules"] if r["alert"] == alert]}
        for group in prod_groups()
    ]
    groups = [group for group in groups if group["rules"]]
    tests = [
        {
            "name": f"{alert} fires",
            "interval": "1m",
            "input_series": firing,
            "alert_rule_test": [
                {"eval_time": EVAL_TIME, "alertname": alert, "exp_alerts": [{"exp_labels": labels}]}
            ],
        },
        {
            "name": f"{alert} stays quiet",
            "interval": "1m",
            "input_series": quiet,
            "alert_rule_test": [{"eval_time": EVAL_TIME, "alertname": alert, "exp_alerts": []}],
        },
    ]
    failure = _promtool_test(tmp_path, groups, tests)
    assert failure == "", failure


def test_the_promtool_test_catches_an_alert_that_does_not_fire(tmp_path: Path) -> None:
    """The cases are really evaluated: a threshold nobody reaches makes the firing case fail."""
    groups = prod_groups()
    for group in groups:
        for rule in group["rules"]:
            if rule["alert"] == "GpuTemperatureHigh":
                rule["expr"] = rule["expr"].replace("> 85", "> 95")
    firing, labels, _ = CASES["GpuTemperatureHigh"]
    tests = [
        {
            "name": "fires",
            "interval": "1m",
            "input_series": firing,
            "alert_rule_test": [
                {
                    "eval_time": EVAL_TIME,
                    "alertname": "GpuTemperatureHigh",
                    "exp_alerts": [{"exp_labels": labels}],
                }
            ],
        }
    ]
    assert "GpuTemperatureHigh" in _promtool_test(tmp_path, groups, tests)


def test_thresholds_come_from_each_models_slo() -> None:
    config = load_stack("prod")
    slo = config.models[0].slo.model_copy(update={"time_to_first_token_p95_seconds": 0.75})
    model = config.models[0].model_copy(update={"slo": slo})
    groups = _groups(config.model_copy(update={"models": [model, *config.models[1:]]}))
    [ttft] = [r for r in groups[0]["rules"] if r["alert"] == "VllmTimeToFirstTokenHigh"]
    assert ttft["expr"].endswith("> 0.75")
    assert ttft["for"] == "10m"


def test_only_autoscaled_models_get_the_autoscaler_alert_and_gpu_alerts_need_dcgm() -> None:
    dev = load_stack("dev")
    alerts = {rule["alert"] for group in _groups(dev) for rule in group["rules"]}
    assert "AutoscalerAtMaximum" not in alerts  # dev runs one fixed replica
    addons = dev.addons.model_copy(
        update={"dcgm_exporter": dev.addons.dcgm_exporter.model_copy(update={"enabled": False})}
    )
    groups = _groups(dev.model_copy(update={"addons": addons}))
    assert "vllm-platform.gpus" not in {group["name"] for group in groups}


def test_every_alert_has_a_runbook_line_in_the_operations_doc() -> None:
    doc = (REPO_ROOT / "docs" / "operations.md").read_text()
    for alert in ALERT_RUNBOOKS:
        assert re.search(rf'^\| `{alert}` <a id="{alert.lower()}"></a> \|', doc, re.MULTILINE), (
            f"no runbook row for {alert}"
        )
    for group in prod_groups():
        for rule in group["rules"]:
            assert rule["annotations"]["runbook_url"] == f"docs/operations.md#{rule['alert'].lower()}"
