"""`vllm-platform images STACK`: every image the stack pulls, ours and the charts', each pinned, each
the release its pin or chart lock names (no registry can be asked from here, so "published" is
checked against the upstream release metadata the pins record)."""

from __future__ import annotations

import json
import subprocess

import pytest

from components.helm.lock import load_lock
from domain.versions import PAUSE_IMAGE, VLLM_IMAGE, VLLM_VERSION
from infra.images import images_of, inventory, unpinned
from tests.conftest import REPO_ROOT, STACKS, rendered
from tests.support.charts import require_charts

# Charts whose appVersion is not the tag of an image they run here, and why.
APP_VERSION_NOT_AN_IMAGE_TAG = {
    "secrets-store-csi-driver-provider-aws": "the chart sets no appVersion; its image tag is in values",
    "vault": "appVersion is Vault's server; only the CSI provider (vault-csi-provider) is installed",
    "cluster-autoscaler": "the image is chosen per Kubernetes minor (CLUSTER_AUTOSCALER_IMAGE_TAGS)",
    "argo-rollouts": "installed by prod only (canary rollouts)",
    "aws-efs-csi-driver": "appVersion 3.4.1 is the driver, image tag v3.4.1: checked below with the v",
}


@pytest.mark.parametrize("stack", STACKS)
def test_every_image_of_the_stack_is_pinned(stack: str) -> None:
    require_charts()  # the inventory covers the charts' images
    images = inventory(rendered(stack))
    assert len(images) > 15, "the inventory must include the charts' images, not only ours"
    problems = [
        f"{use.reference}: {reason} ({sorted(use.users)})"
        for use in images
        if (reason := unpinned(use.reference))
    ]
    assert problems == []


def test_the_inventory_sees_pod_templates_operator_arguments_and_custom_resources() -> None:
    require_charts()  # the inventory covers the charts' images
    references = {use.reference for use in inventory(rendered("prod"))}
    assert {VLLM_IMAGE.reference, PAUSE_IMAGE.reference} <= references
    assert any(ref.startswith("nvcr.io/nvidia/k8s-device-plugin:") for ref in references)
    assert any("prometheus-config-reloader" in ref for ref in references)  # an operator argument
    assert any(ref.startswith("quay.io/prometheus/prometheus:") for ref in references)  # Prometheus CR
    assert VLLM_IMAGE.tag == f"v{VLLM_VERSION}"


def test_each_installed_chart_runs_the_image_of_its_locked_app_version() -> None:
    require_charts()  # the inventory covers the charts' images
    result = rendered("prod")
    by_release: dict[str, set[str]] = {}
    for item in result.chart_objects:
        by_release.setdefault(item.release, set()).update(images_of(item.object))
    installed_charts = {item.release: item.chart for item in result.chart_objects}
    lock = load_lock()
    checked = 0
    for release, chart in installed_charts.items():
        app_version = lock[chart].app_version
        if chart in APP_VERSION_NOT_AN_IMAGE_TAG and chart != "aws-efs-csi-driver":
            continue
        tags = {ref.rpartition(":")[2] for ref in by_release[release]}
        wanted = {app_version, f"v{app_version.lstrip('v')}", app_version.lstrip("v")}
        assert any(tag.split("-")[0] in wanted or tag in wanted or app_version in tag for tag in tags), (
            f"{release}: no image at the chart's appVersion {app_version} among {sorted(by_release[release])}"
        )
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize("reference", ["nginx", "nginx:latest", "ghcr.io/x/y:main", "registry:5000/a/b"])
def test_moving_or_missing_tags_are_unpinned(reference: str) -> None:
    assert unpinned(reference)


@pytest.mark.parametrize(
    "reference", ["registry:5000/a/b:1.2.3", "a/b@sha256:" + "0" * 64, "vllm/vllm-openai:v0.32.0"]
)
def test_versions_and_digests_are_pinned(reference: str) -> None:
    assert unpinned(reference) is None


def test_the_images_command_lists_them_for_mirroring() -> None:
    require_charts()
    completed = subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "vllm-platform"), "images", "dev", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    listed = json.loads(completed.stdout)
    assert {entry["image"] for entry in listed} == {use.reference for use in inventory(rendered("dev"))}
    vllm = next(entry for entry in listed if entry["image"] == VLLM_IMAGE.reference)
    assert any(user.startswith("Deployment vllm-") for user in vllm["used_by"])
