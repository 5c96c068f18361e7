"""The offline chart render (components/helm/engine.py) does what helm.v4.Chart does at `pulumi up`:
Helm's own engine, the stack's Capabilities, CRDs in, hooks flagged, namespaces defaulted.

tests/data/charts/engine-probe is a small chart whose templates each show one of these.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from components.helm.engine import ChartRenderError, crd_api_versions, render_chart
from infra.render import builtin_api_versions, write_render
from tests.conftest import REPO_ROOT, rendered
from tests.support.charts import require_charts

PROBE = Path(__file__).parent / "data" / "charts" / "engine-probe"


def _render(**changes: object) -> dict[tuple[str, str], object]:
    arguments: dict = {
        "release": "probe",
        "namespace": "team-a",
        "values": {},
        "kubernetes_version": "1.34",
        **changes,
    }
    return {(item.kind, item.name): item for item in render_chart(PROBE, **arguments)}


def test_templates_see_the_stacks_kubernetes_version_and_api_versions() -> None:
    plain = _render()[("ConfigMap", "probe-capabilities")].object["data"]
    assert plain["kubeVersion"] == "v1.34.0"
    assert plain["hasMonitoring"] == "false"
    with_crds = _render(kubernetes_version="v1.33.2", api_versions={"monitoring.coreos.com/v1"})
    data = with_crds[("ConfigMap", "probe-capabilities")].object["data"]
    assert data["kubeVersion"] == "v1.33.2" and data["hasMonitoring"] == "true"


def test_built_in_api_versions_come_from_the_kubernetes_version() -> None:
    data = _render(api_versions=builtin_api_versions("1.34"))[("ConfigMap", "probe-capabilities")].object[
        "data"
    ]
    assert data["hasApiRegistration"] == "true"
    assert "policy/v1/PodDisruptionBudget" in builtin_api_versions("1.32")
    assert "policy/v1beta1" not in builtin_api_versions("1.35")


def test_the_api_version_snapshot_matches_kubernetes_validates_schemas() -> None:
    script = REPO_ROOT / "scripts" / "snapshot-kubernetes-api-versions.py"
    completed = subprocess.run([sys.executable, str(script), "--check"], check=False)
    assert completed.returncode == 0, f"regenerate it: {script.relative_to(REPO_ROOT)}"


def test_hooks_are_flagged_and_not_written_as_deployed_objects(tmp_path: Path) -> None:
    objects = _render()
    assert objects[("Job", "probe-hook")].is_hook
    assert not objects[("ConfigMap", "probe-capabilities")].is_hook
    # The real stacks' renders: the chart objects written are exactly the non-hook ones.
    require_charts()
    result = rendered("dev")
    write_render(result, tmp_path)
    written = list((tmp_path / "charts").rglob("*.yaml"))
    assert len(written) == len(result.deployed_chart_objects) > 0


def test_namespaced_objects_get_the_release_namespace_and_cluster_scoped_ones_none() -> None:
    objects = _render(cluster_scoped_kinds={"Widget"})
    assert objects[("ConfigMap", "probe-capabilities")].namespace == "team-a"
    assert objects[("ConfigMap", "probe-capabilities")].object["data"]["releaseNamespace"] == "team-a"
    assert objects[("ClusterRole", "probe-reader")].namespace is None
    assert objects[("Widget", "probe-widget")].namespace is None
    # Without knowing the CRD's scope the custom kind would be namespaced: the render passes it in.
    assert _render()[("Widget", "probe-widget")].namespace == "team-a"


def test_crds_are_rendered_and_give_their_api_versions_and_scope() -> None:
    objects = _render()
    crd = objects[("CustomResourceDefinition", "widgets.example.com")]
    assert crd.template.endswith("crds/widgets.yaml")
    versions, cluster_scoped = crd_api_versions(objects.values())  # type: ignore[arg-type]
    assert {"example.com/v1", "example.com/v1/Widget"} <= versions
    assert cluster_scoped == {"Widget"}


def test_list_objects_are_their_items_and_a_bare_equals_sign_is_text() -> None:
    objects = _render()
    assert ("ServiceAccount", "probe-listed") in objects
    assert not any(kind == "List" for kind, _ in objects)
    assert objects[("ConfigMap", "probe-capabilities")].object["data"]["equals"] == "="


def test_notes_are_not_objects() -> None:
    assert all(not item.template.endswith("NOTES.txt") for item in _render().values())  # type: ignore[attr-defined]


def test_a_chart_that_fails_to_render_names_the_release_and_the_chart() -> None:
    with pytest.raises(ChartRenderError) as caught:
        render_chart(
            PROBE, release="probe", namespace="team-a", values={"fail": True}, kubernetes_version="1.34"
        )
    assert "release probe (chart engine-probe)" in str(caught.value)
    assert "fail was set" in str(caught.value)


def test_renders_of_the_same_inputs_are_cached_but_not_shared() -> None:
    first = _render()[("ConfigMap", "probe-capabilities")]
    first.object["data"]["kubeVersion"] = "changed by a caller"  # type: ignore[attr-defined]
    again = _render()[("ConfigMap", "probe-capabilities")]
    assert again.object["data"]["kubeVersion"] == "v1.34.0"  # type: ignore[attr-defined]


def test_the_prod_render_expands_every_release_into_objects() -> None:
    require_charts()
    result = rendered("prod")
    releases = {release["name"] for release in result.helm_releases}
    with_objects = {item.release for item in result.chart_objects}
    assert releases == with_objects
    summary = json.dumps(sorted(releases))
    assert "kube-prometheus-stack" in summary and "nvidia-device-plugin" in summary
