"""Every Kubernetes object `vllm-platform render` writes validates with kubernetes-validate --strict
against the OpenAPI schemas of the stack's own Kubernetes version (cluster.kubernetes_version).

Unknown kinds fail, except the custom resources on the reviewed allow-list below; their fields are
checked here instead (kubernetes-validate ships schemas for built-in kinds only): Argo Rollouts'
Rollout and AnalysisTemplate against the CRD schemas of the pinned chart (tests/support/
argo_rollouts_crds.py), a Rollout's pod template also as the Deployment it replaces.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError, all_versions

from domain.versions import DEFAULT_KUBERNETES_VERSION, SUPPORTED_KUBERNETES_VERSIONS
from infra.render import read_yaml_documents, write_render
from infra.stack_checks import load_stack
from tests.conftest import EXAMPLE_STACKS, STACKS, TEST_STACKS_DIR, rendered
from tests.support.argo_rollouts_crds import crd_schema_problems, strict
from tests.support.charts import data_crds

RENDERED_STACKS = {
    **dict.fromkeys((*STACKS, *EXAMPLE_STACKS)),
    "existing": TEST_STACKS_DIR / "Pulumi.existing.yaml",
}
CustomResourceCheck = Callable[[dict[str, Any]], list[str]]


def _spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _secret_provider_class_problems(obj: dict[str, Any]) -> list[str]:
    spec = _spec(obj)
    problems = []
    if spec.get("provider") not in ("aws", "vault", "azure", "gcp"):
        problems.append(f"spec.provider {spec.get('provider')!r} is not a Secrets Store CSI provider")
    objects_text = (spec.get("parameters") or {}).get("objects")
    if not isinstance(objects_text, str):
        return [*problems, "spec.parameters.objects must be a YAML string (the provider parses it)"]
    try:
        objects = yaml.safe_load(objects_text)
    except yaml.YAMLError as error:
        return [*problems, f"spec.parameters.objects is not valid YAML: {error}"]
    if not isinstance(objects, list) or not objects:
        return [*problems, "spec.parameters.objects must list at least one secret"]
    for index, entry in enumerate(objects):
        if not isinstance(entry, dict) or not entry.get("objectName"):
            problems.append(f"spec.parameters.objects[{index}] has no objectName")
        elif spec.get("provider") == "vault" and not (entry.get("secretPath") and entry.get("secretKey")):
            problems.append(
                f"spec.parameters.objects[{index}]: the Vault provider needs secretPath and secretKey"
            )
    if spec.get("provider") == "vault" and not (
        spec["parameters"].get("vaultAddress") and spec["parameters"].get("roleName")
    ):
        problems.append("the Vault provider needs spec.parameters.vaultAddress and roleName")
    for index, secret_object in enumerate(spec.get("secretObjects") or []):
        if not secret_object.get("secretName") or not secret_object.get("data"):
            problems.append(f"spec.secretObjects[{index}] needs secretName and data")
    return problems


def _scaled_object_problems(obj: dict[str, Any]) -> list[str]:
    spec = _spec(obj)
    problems = []
    if not (spec.get("scaleTargetRef") or {}).get("name"):
        problems.append("spec.scaleTargetRef.name is missing")
    triggers = spec.get("triggers")
    if not isinstance(triggers, list) or not triggers:
        problems.append("spec.triggers must list at least one trigger")
    for index, trigger in enumerate(triggers or []):
        if not trigger.get("type") or not isinstance(trigger.get("metadata"), dict):
            problems.append(f"spec.triggers[{index}] needs type and metadata")
        elif trigger["type"] == "prometheus" and not all(
            trigger["metadata"].get(key) for key in ("serverAddress", "query", "threshold")
        ):
            problems.append(
                f"spec.triggers[{index}]: a prometheus trigger needs serverAddress, query and threshold"
            )
    low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    if not (isinstance(low, int | float) and isinstance(high, int | float) and low <= high):
        problems.append(f"minReplicaCount {low} / maxReplicaCount {high} must be numbers with min <= max")
    return problems


def _monitor_problems(endpoints_key: str) -> CustomResourceCheck:
    def check(obj: dict[str, Any]) -> list[str]:
        spec = _spec(obj)
        problems = []
        if not isinstance(spec.get("selector"), dict):
            problems.append("spec.selector is missing (an empty selector must be written as {})")
        endpoints = spec.get(endpoints_key)
        if not isinstance(endpoints, list) or not endpoints:
            problems.append(f"spec.{endpoints_key} must list at least one endpoint")
        for index, endpoint in enumerate(endpoints or []):
            if not any(endpoint.get(key) is not None for key in ("port", "portNumber", "targetPort")):
                problems.append(f"spec.{endpoints_key}[{index}] names no port")
        return problems

    return check


def _prometheus_rule_problems(obj: dict[str, Any]) -> list[str]:
    groups = _spec(obj).get("groups")
    if not isinstance(groups, list) or not groups:
        return ["spec.groups must list at least one group"]
    problems = []
    for g, group in enumerate(groups):
        if not group.get("name") or not group.get("rules"):
            problems.append(f"spec.groups[{g}] needs name and rules")
        for r, rule in enumerate(group.get("rules") or []):
            if not rule.get("expr") or bool(rule.get("alert")) == bool(rule.get("record")):
                problems.append(f"spec.groups[{g}].rules[{r}] needs expr and exactly one of alert/record")
    return problems


def _rollout_problems(obj: dict[str, Any]) -> list[str]:
    """The CRD's schema keeps the pod template's own fields unchecked (preserve-unknown-fields); the
    template is a PodTemplateSpec, checked strictly as a Deployment's."""
    as_deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": obj["metadata"],
        "spec": {key: _spec(obj)[key] for key in ("selector", "template")},
    }
    problems = schema_problems(as_deployment, DEFAULT_KUBERNETES_VERSION)
    template = [f"as a Deployment: {problem}" for problem in problems]
    return [*crd_schema_problems(obj), *template]


def _leader_worker_set_problems(obj: dict[str, Any]) -> list[str]:
    """The pinned LWS CRD's schema, and each of its two pod templates checked strictly as a
    Deployment's template (kubernetes-validate), as for a Rollout (issue 42)."""
    import jsonschema

    from tests.support.argo_rollouts_crds import strict
    from tests.support.charts import data_crds

    crd = data_crds()[("leaderworkerset.x-k8s.io", "LeaderWorkerSet")]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
    validator = jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))
    body = {key: value for key, value in obj.items() if key != "metadata"}
    problems = [
        f"{'.'.join(str(part) for part in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(body)
    ]
    group = _spec(obj).get("leaderWorkerTemplate") or {}
    for role in ("leaderTemplate", "workerTemplate"):
        template = group.get(role)
        if not isinstance(template, dict):
            problems.append(f"spec.leaderWorkerTemplate.{role} is missing")
            continue
        labels = (template.get("metadata") or {}).get("labels") or {}
        as_deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": obj["metadata"],
            "spec": {"selector": {"matchLabels": labels}, "template": template},
        }
        problems += [
            f"{role} as a Deployment's template: {problem}"
            for problem in schema_problems(as_deployment, DEFAULT_KUBERNETES_VERSION)
        ]
    return problems


def _schema_checked_elsewhere(obj: dict[str, Any]) -> list[str]:
    """Chart-made custom resources: tests/test_chart_objects.py validates them (and ours) against the
    openAPIV3Schema of the pinned chart's CRD."""
    return []


def _karpenter_schema_problems(obj: dict[str, Any]) -> list[str]:
    """The pinned karpenter chart's CRD schema, strictly (unknown fields refused as the API server's
    field validation does)."""
    group, _, version = str(obj["apiVersion"]).partition("/")
    crd = data_crds()[(group, str(obj["kind"]))]
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    validator = jsonschema.Draft7Validator(strict(served["schema"]["openAPIV3Schema"]))
    body = {key: value for key, value in obj.items() if key != "metadata"}
    return [
        f"{'.'.join(str(part) for part in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(body)
    ]


# Reviewed: custom resources whose CRDs come with the pinned add-on charts. Each has field checks.
ALLOWED_CUSTOM_RESOURCES: dict[tuple[str, str], CustomResourceCheck] = {
    ("monitoring.coreos.com/v1", "Prometheus"): _schema_checked_elsewhere,
    ("monitoring.coreos.com/v1", "Alertmanager"): _schema_checked_elsewhere,
    ("elbv2.k8s.aws/v1beta1", "IngressClassParams"): _schema_checked_elsewhere,
    ("secrets-store.csi.x-k8s.io/v1", "SecretProviderClass"): _secret_provider_class_problems,
    ("keda.sh/v1alpha1", "ScaledObject"): _scaled_object_problems,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _monitor_problems("endpoints"),
    ("monitoring.coreos.com/v1", "PodMonitor"): _monitor_problems("podMetricsEndpoints"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _prometheus_rule_problems,
    ("argoproj.io/v1alpha1", "Rollout"): _rollout_problems,
    ("argoproj.io/v1alpha1", "AnalysisTemplate"): crd_schema_problems,
    # Karpenter pools (issue 41): the pinned karpenter chart's CRDs; their CEL rules run on the real
    # API server in tests/test_deploy_karpenter.py.
    ("karpenter.sh/v1", "NodePool"): _karpenter_schema_problems,
    ("karpenter.k8s.aws/v1", "EC2NodeClass"): _karpenter_schema_problems,
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): _leader_worker_set_problems,
}


@dataclass(frozen=True)
class Verdict:
    path: str
    obj: dict[str, Any]
    problems: list[str]
    has_schema: bool


def _validate(obj: dict[str, Any], kubernetes_version: str) -> Verdict:
    """kubernetes-validate's strict verdict on one object; a kind without a schema is a problem
    unless it is an allow-listed custom resource."""
    try:
        validated = kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except ValidationError as error:
        where = ".".join(str(part) for part in error.path) or "(root)"
        return Verdict("", obj, [f"{where}: {error.message}"], True)
    except SchemaNotFoundError as error:
        if (obj.get("apiVersion"), obj.get("kind")) in ALLOWED_CUSTOM_RESOURCES:
            return Verdict("", obj, [], False)
        message = f"{error.message}; not a built-in kind nor on the reviewed custom-resource allow-list"
        return Verdict("", obj, [message], False)
    # kubernetes-validate falls back to an older schema for a version it lacks: insist on the exact one.
    if validated != kubernetes_version:
        return Verdict(
            "",
            obj,
            [f"validated against Kubernetes {validated}, not the cluster's {kubernetes_version}"],
            True,
        )
    return Verdict("", obj, [], True)


def schema_problems(obj: dict[str, Any], kubernetes_version: str) -> list[str]:
    return _validate(obj, kubernetes_version).problems


def kubernetes_version_of(stack: str) -> str:
    return load_stack(stack, stack_file=RENDERED_STACKS[stack]).cluster.kubernetes_version


@functools.cache
def stack_verdicts(stack: str) -> tuple[Verdict, ...]:
    """Every file `vllm-platform render` writes for the stack, read back and validated (once a session)."""
    version = kubernetes_version_of(stack)
    verdicts = []
    with tempfile.TemporaryDirectory() as out:
        out_dir = Path(out)
        write_render(rendered(stack, RENDERED_STACKS[stack]), out_dir)
        # Ours (kubernetes/) and every object the charts render (charts/<release>/).
        written = [*(out_dir / "kubernetes").rglob("*.yaml"), *(out_dir / "charts").rglob("*.yaml")]
        for path in sorted(written):
            for document in read_yaml_documents(path):
                verdict = _validate(document, version)
                verdicts.append(
                    Verdict(str(path.relative_to(out_dir)), document, verdict.problems, verdict.has_schema)
                )
    return tuple(verdicts)


def test_kubernetes_validate_ships_strict_schemas_for_every_supported_version() -> None:
    shipped = {".".join(version.split(".")[:2]) for version in all_versions()}
    assert set(SUPPORTED_KUBERNETES_VERSIONS) <= shipped
    assert DEFAULT_KUBERNETES_VERSION in SUPPORTED_KUBERNETES_VERSIONS


@pytest.mark.parametrize("stack", RENDERED_STACKS)
def test_every_rendered_object_matches_the_strict_schema_of_the_clusters_version(stack: str) -> None:
    verdicts = stack_verdicts(stack)
    assert verdicts, "the render wrote no Kubernetes objects"
    problems = [
        f"{v.path} ({v.obj.get('kind')} {v.obj.get('metadata', {}).get('name')}): {problem}"
        for v in verdicts
        for problem in v.problems
    ]
    assert problems == []


@pytest.mark.parametrize("stack", RENDERED_STACKS)
def test_allow_listed_custom_resources_have_the_fields_their_controllers_need(stack: str) -> None:
    problems = [
        f"{v.path}: {problem}"
        for v in stack_verdicts(stack)
        if (check := ALLOWED_CUSTOM_RESOURCES.get((v.obj.get("apiVersion"), v.obj.get("kind")))) is not None
        for problem in check(v.obj)
    ]
    assert problems == []


def test_custom_resources_the_stacks_render_are_all_on_the_allow_list() -> None:
    seen = {
        (v.obj["apiVersion"], v.obj["kind"])
        for stack in RENDERED_STACKS
        for v in stack_verdicts(stack)
        if not v.has_schema
    }
    assert seen <= set(ALLOWED_CUSTOM_RESOURCES)
    # SecretProviderClass renders in every stack today: the allow-list path is exercised for real.
    assert ("secrets-store.csi.x-k8s.io/v1", "SecretProviderClass") in seen


# --- the check itself can fail -------------------------------------------------------------------------

DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "vllm", "namespace": "vllm-m"},
    "spec": {
        "selector": {"matchLabels": {"app": "vllm"}},
        "template": {
            "metadata": {"labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0"}]},
        },
    },
}


def test_a_valid_deployment_passes_the_schema_check() -> None:
    assert schema_problems(DEPLOYMENT, DEFAULT_KUBERNETES_VERSION) == []


def test_an_unknown_field_fails_strict_validation() -> None:
    typo = {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "replica": 2}}
    problems = schema_problems(typo, DEFAULT_KUBERNETES_VERSION)
    assert len(problems) == 1 and "'replica' was unexpected" in problems[0]


def test_a_wrongly_typed_field_fails_validation() -> None:
    wrong = {**DEPLOYMENT, "spec": {**DEPLOYMENT["spec"], "replicas": "two"}}
    assert schema_problems(wrong, DEFAULT_KUBERNETES_VERSION)[0].startswith("spec.replicas:")


def test_a_kind_without_schema_fails_unless_allow_listed() -> None:
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert (
        "not a built-in kind nor on the reviewed custom-resource allow-list"
        in schema_problems(unknown, DEFAULT_KUBERNETES_VERSION)[0]
    )
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "m"}}
    assert schema_problems(monitor, DEFAULT_KUBERNETES_VERSION) == []


def test_a_kind_removed_from_the_clusters_version_fails() -> None:
    # autoscaling/v2beta2 HPAs were removed in Kubernetes 1.26.
    old_hpa = {
        "apiVersion": "autoscaling/v2beta2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "h"},
    }
    assert schema_problems(old_hpa, DEFAULT_KUBERNETES_VERSION)


def test_secret_provider_class_without_objects_is_reported() -> None:
    spc = {
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClass",
        "metadata": {"name": "k"},
        "spec": {"provider": "aws", "parameters": {}},
    }
    assert _secret_provider_class_problems(spc) == [
        "spec.parameters.objects must be a YAML string (the provider parses it)"
    ]
    spc["spec"]["parameters"]["objects"] = (
        "- objectName: vllm-platform/dev/m/api-key\n  objectType: secretsmanager\n"
    )
    assert _secret_provider_class_problems(spc) == []


def test_vault_secret_provider_class_needs_path_and_key() -> None:
    spc = {
        "spec": {
            "provider": "vault",
            "parameters": {
                "vaultAddress": "https://v:8200",
                "roleName": "r",
                "objects": "- objectName: api-key\n",
            },
        }
    }
    assert _secret_provider_class_problems(spc) == [
        "spec.parameters.objects[0]: the Vault provider needs secretPath and secretKey"
    ]


def test_scaled_object_without_target_or_triggers_is_reported() -> None:
    assert _scaled_object_problems({"spec": {}}) == [
        "spec.scaleTargetRef.name is missing",
        "spec.triggers must list at least one trigger",
    ]
    prometheus = {"type": "prometheus", "metadata": {"serverAddress": "http://p:9090", "query": "q"}}
    assert _scaled_object_problems(
        {"spec": {"scaleTargetRef": {"name": "vllm"}, "triggers": [prometheus]}}
    ) == ["spec.triggers[0]: a prometheus trigger needs serverAddress, query and threshold"]


def test_monitors_and_rules_without_their_essentials_are_reported() -> None:
    assert _monitor_problems("podMetricsEndpoints")(
        {"spec": {"podMetricsEndpoints": [{"path": "/metrics"}]}}
    ) == [
        "spec.selector is missing (an empty selector must be written as {})",
        "spec.podMetricsEndpoints[0] names no port",
    ]
    assert _prometheus_rule_problems({"spec": {"groups": [{"name": "g", "rules": [{"record": "r"}]}]}}) == [
        "spec.groups[0].rules[0] needs expr and exactly one of alert/record"
    ]
