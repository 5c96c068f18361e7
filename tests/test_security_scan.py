"""checkov (pinned, own venv: scripts/setup-checkov.sh) over every stack's rendered manifests.

Zero failed checks outside checkov/skips.yaml, and no stale skip in it. Helm releases are values for
upstream charts, not manifests, so checkov does not see them; their values are covered by our own
tests of the add-on components and by the policy pack's helm-charts-pinned rule (docs/checks.md).
checkov has no checks for Argo Rollouts' Rollout: a canary model's Rollout carries the very pod
template its Deployment would, so that template is scanned as that Deployment. Nor for LWS's
LeaderWorkerSet: a multi-node model's leader and worker templates are scanned as two Deployments,
`<set>-leader` and `<set>-worker` (the multinode example stack is scanned with the shipped ones).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from components.leader_worker_set import LWS_KIND
from infra.render import write_render
from tests.conftest import EXAMPLE_STACKS, REPO_ROOT, STACKS, TEST_STACKS_DIR, rendered
from tests.support.charts import require_charts

RENDERED_STACKS = {
    **dict.fromkeys((*STACKS, *EXAMPLE_STACKS)),
    "existing": TEST_STACKS_DIR / "Pulumi.existing.yaml",
}
POD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod")


def _load_gate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkov_gate", REPO_ROOT / "scripts" / "checkov_gate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


gate = _load_gate()


CANARY = "canary"  # a deliberately insecure manifest scanned in the same run: the gate must catch it
CANARY_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: privileged, namespace: vllm-canary}
spec:
  containers:
  - name: c
    image: busybox:1.37
    securityContext: {privileged: true}
"""


@dataclass(frozen=True)
class Scan:
    findings: list  # failed checks on the stacks' manifests
    canary_findings: list
    summary: dict
    checked: set[tuple[str, str]]  # (stack, checkov resource id) of every object checkov looked at
    expected_pods: set[tuple[str, str]]


CHART_OBJECTS = "+charts"


@pytest.fixture(scope="module")
def scan(tmp_path_factory: pytest.TempPathFactory) -> Scan:
    """One checkov run over the manifests `vllm-platform render` writes for every stack."""
    directories: dict[str, Path] = {}
    expected_pods = set()
    for stack, stack_file in RENDERED_STACKS.items():
        out = tmp_path_factory.mktemp(f"render-{stack}")
        result = rendered(stack, stack_file)
        write_render(result, out)
        directories[stack] = out / "kubernetes"
        templates = [
            (r["metadata"], r["spec"]["selector"], r["spec"]["template"]) for r in result.find("Rollout")
        ]
        for lws in result.find(LWS_KIND):
            for role in ("leader", "worker"):
                template = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
                metadata = {**lws["metadata"], "name": f"{lws['metadata']['name']}-{role}"}
                templates.append((metadata, {"matchLabels": template["metadata"]["labels"]}, template))
        for metadata, selector, template in templates:
            as_deployment = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": metadata,
                "spec": {"selector": selector, "template": template},
            }
            (out / "kubernetes" / metadata["namespace"] / f"deployment-{metadata['name']}.yaml").write_text(
                yaml.safe_dump(as_deployment, sort_keys=False)
            )
            expected_pods.add((stack, f"Deployment.{metadata['namespace']}.{metadata['name']}"))
        # The charts' objects (charts/<release>/...) are scanned as this stack's too, when the chart
        # cache holds the charts (tests/support/charts.py).
        if (out / "charts").is_dir():
            directories[f"{stack}{CHART_OBJECTS}"] = out / "charts"
        for obj in result.kubernetes_objects:
            if obj["kind"] in POD_KINDS:
                metadata = obj["metadata"]
                expected_pods.add(
                    (stack, f"{obj['kind']}.{metadata.get('namespace', 'default')}.{metadata['name']}")
                )
    canary = tmp_path_factory.mktemp(CANARY)
    (canary / "pod-privileged.yaml").write_text(CANARY_POD)
    directories[CANARY] = canary
    report = gate.run_checkov(directories)

    def label(finding: gate.Finding) -> str:
        return finding.file.split("/")[0].removesuffix(CHART_OBJECTS)

    return Scan(
        findings=[f for f in report.failed if label(f) != CANARY],
        canary_findings=[f for f in report.failed if label(f) == CANARY],
        summary=report.summary,
        checked={(label(f), f.resource) for f in [*report.failed, *report.passed]},
        expected_pods=expected_pods,
    )


def test_no_failed_check_outside_the_reviewed_skip_list(scan: Scan) -> None:
    new = [str(finding) for finding in gate.unskipped(scan.findings, gate.load_skips())]
    assert new == [], "fix the object, or add a skip with its reason to checkov/skips.yaml after review"


def test_every_skip_is_still_needed(scan: Scan) -> None:
    require_charts()  # skips for chart objects can only be judged with the charts rendered
    assert [str(skip) for skip in gate.stale(scan.findings, gate.load_skips())] == []


def test_checkov_scanned_every_workload_of_every_stack(scan: Scan) -> None:
    assert scan.summary["checkov_version"] == "3.3.30"
    assert scan.summary["parsing_errors"] == 0
    assert scan.expected_pods, "the stacks render workloads"
    assert scan.expected_pods <= scan.checked


def test_the_gate_catches_a_privileged_container(scan: Scan) -> None:
    new = gate.unskipped(scan.canary_findings, gate.load_skips())
    assert "CKV_K8S_16" in {finding.check_id for finding in new}  # Container should not be privileged


def test_every_skip_names_a_kubernetes_check_and_gives_a_reason() -> None:
    skips = gate.load_skips()
    assert skips
    for skip in skips:
        assert re.fullmatch(r"CKV2?_K8S_\d+", skip.check), skip
        assert len(skip.reason.split()) >= 8, (
            f"{skip.check}: say why it does not apply and what covers the risk"
        )
    assert len({(s.check, s.resources) for s in skips}) == len(skips)


def test_skips_cover_only_their_check_and_resources() -> None:
    finding = gate.Finding("CKV_K8S_11", "CPU limits should be set", "Deployment.vllm-m.vllm", "dev/x.yaml")
    other = gate.Finding("CKV_K8S_11", "CPU limits should be set", "Deployment.kube-system.dns", "dev/y.yaml")
    skip = gate.Skip("CKV_K8S_11", "reason", ("Deployment.vllm-*.vllm",))
    assert gate.unskipped([finding, other], [skip]) == [other]
    assert gate.stale([other], [skip]) == [skip]
    assert gate.stale([finding], [skip]) == []
