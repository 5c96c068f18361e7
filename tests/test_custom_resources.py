"""Every custom resource the stack creates, ours and (with the charts in the cache) the charts',
validates against the CRD schema of the pinned chart that installs it: a real JSON-schema validator
over the CRD's openAPIV3Schema. The CRDs come from the pinned charts' data (tests/support/charts.py,
`$VLLM_PLATFORM_CHART_DATA`), so this runs in CI with no network and no chart templates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
import pytest

from infra.render import RenderResult
from tests.conftest import EXAMPLE_STACKS, STACKS, TEST_STACKS_DIR, rendered
from tests.support.charts import data_crds, require_charts

ALL_STACKS = [*STACKS, *EXAMPLE_STACKS, "existing"]
# `existing` is of tests/stacks/; the shipped `multinode` holds the LeaderWorkerSet (issue 42).
TEST_STACK_FILES = {"existing": "Pulumi.existing.yaml"}


def _render(stack: str) -> RenderResult:
    file = TEST_STACK_FILES.get(stack)
    return rendered(stack, TEST_STACKS_DIR / file if file else None)


def _schema_for(obj: Mapping[str, Any]) -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    crd = data_crds().get((group, obj["kind"]))
    assert crd is not None, f"no pinned chart defines {obj['kind']}.{group}"
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert entry.get("served", True), f"{obj['kind']}.{group}/{version} is not served by the pinned chart"
    return entry["schema"]["openAPIV3Schema"]


def _custom_resources(result: RenderResult) -> list[dict[str, Any]]:
    builtin = (
        "v1",
        "apps/",
        "batch/",
        "policy/",
        "rbac.",
        "networking.k8s.io/",
        "storage.k8s.io/",
        "scheduling.k8s.io/",
        "autoscaling/",
        "apiextensions.k8s.io/",
        "apiregistration.k8s.io/",
        "admissionregistration.k8s.io/",
        "coordination.k8s.io/",
        "node.k8s.io/",
        "discovery.k8s.io/",
    )
    return [obj for obj in result.all_kubernetes_objects if not obj["apiVersion"].startswith(builtin)]


@pytest.mark.parametrize("stack", ALL_STACKS)
def test_every_custom_resource_validates_against_its_pinned_crd_schema(stack: str) -> None:
    resources = _custom_resources(_render(stack))
    assert any(obj in resources for obj in _render(stack).kubernetes_objects), "ours must be among them"
    problems = []
    for obj in resources:
        schema = _schema_for(obj)
        validator = jsonschema.Draft7Validator(schema)
        for error in validator.iter_errors(obj):
            where = ".".join(str(part) for part in error.absolute_path)
            problems.append(f"{obj['kind']} {obj['metadata'].get('name')}: {where}: {error.message}")
    assert not problems, "\n".join(problems)


def test_the_crd_check_catches_a_misspelt_field() -> None:
    (pod_monitor,) = [m for m in _render("prod").find("PodMonitor") if m["metadata"]["name"] == "vllm"]
    broken = {**pod_monitor, "spec": {**pod_monitor["spec"], "podMetricsEndpoints": [{"port": 8000}]}}
    errors = list(jsonschema.Draft7Validator(_schema_for(broken)).iter_errors(broken))
    assert errors, "a numeric port name must fail the PodMonitor schema"


def test_the_pinned_charts_crds_were_found() -> None:
    kinds = {kind for _, kind in data_crds()}
    assert {
        "PodMonitor",
        "ServiceMonitor",
        "Prometheus",
        "ScaledObject",
        "SecretProviderClass",
        "PrometheusRule",
        "Rollout",
        "AnalysisTemplate",
        "IngressClassParams",
        "TargetGroupBinding",
    } <= kinds


def test_the_chart_data_crds_are_the_ones_the_cached_charts_install() -> None:
    """With the charts in the cache: the CRDs the prod render expands (crds/ and templates) have the
    same served versions and schemas as the chart data the CI checks read."""
    require_charts()
    rendered_crds = [
        o for o in _render("prod").deployed_chart_objects if o["kind"] == "CustomResourceDefinition"
    ]
    assert rendered_crds
    for crd in rendered_crds:
        key = (crd["spec"]["group"], crd["spec"]["names"]["kind"])
        assert key in data_crds(), f"the chart data lacks {key}"
        schemas = {v["name"]: v.get("schema") for v in crd["spec"]["versions"]}
        assert schemas == {v["name"]: v.get("schema") for v in data_crds()[key]["spec"]["versions"]}, key
