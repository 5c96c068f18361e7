"""Cluster add-ons (EFS CSI, Secrets Store CSI + AWS provider, load balancer controller, metrics-server,
Cluster Autoscaler, KEDA): pinned charts, values from the typed config, the right set per cluster mode.

Also holds the helpers the other add-on and autoscaling tests import (stack variants, numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.cluster_addons import EFS_STORAGE_CLASS, IRSA_ANNOTATION
from components.helm.cache import chart_cache_dir
from domain import versions
from domain.config import ConfigError, PlatformConfig
from domain.config.loader import read_stack_file, stack_file_for
from domain.config.platform import AddonsConfig, KedaConfig
from domain.service_accounts import AWS_LOAD_BALANCER_CONTROLLER, CLUSTER_AUTOSCALER, EFS_CSI_CONTROLLER
from infra.aws.karpenter import runs_karpenter
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import STACKS, TEST_STACKS_DIR, rendered

# --- helpers shared by tests/test_addons_*.py and tests/test_autoscaling_*.py --------------------------

StackEdit = Callable[[dict[str, Any]], None]


def variant_stack_file(directory: Path, edit: StackEdit, base: str = "dev") -> Path:
    """`base`'s stack file with `edit` applied to its `vllm-platform:*` values (keys without the prefix)."""
    base_file = stack_file_for(base) if base in STACKS else TEST_STACKS_DIR / f"Pulumi.{base}.yaml"
    document = yaml.safe_load(base_file.read_text())
    prefix = "vllm-platform:"
    values = {
        key.removeprefix(prefix): value for key, value in document["config"].items() if key.startswith(prefix)
    }
    edit(values)
    others = {key: value for key, value in document["config"].items() if not key.startswith(prefix)}
    document["config"] = {**others, **{prefix + key: value for key, value in values.items()}}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"Pulumi.{base}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def render_variant(directory: Path, edit: StackEdit, base: str = "dev") -> RenderResult:
    return rendered(base, variant_stack_file(directory, edit, base))


def load_variant(directory: Path, edit: StackEdit, base: str = "dev") -> PlatformConfig:
    return load_stack(base, stack_file=variant_stack_file(directory, edit, base))


def config_error(directory: Path, edit: StackEdit, base: str = "dev") -> str:
    with pytest.raises(ConfigError) as caught:
        load_variant(directory, edit, base)
    return str(caught.value)


def config_of(result: RenderResult) -> PlatformConfig:
    """The config a render was made from (stack files are shown relative to the working directory)."""
    return load_stack(result.stack, stack_file=Path.cwd() / result.stack_file)


def as_int(value: Any) -> Any:
    """Pulumi's mock wire format carries numbers as floats; Helm and the API server read integral ones
    as ints."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: as_int(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_int(item) for item in value]
    return value


def release(result: RenderResult, name: str) -> dict[str, Any]:
    found = [r for r in result.helm_releases if r["name"] == name]
    assert len(found) == 1, (
        f"expected one Helm release {name}, found {[r['name'] for r in result.helm_releases]}"
    )
    return as_int(found[0])


def release_names(result: RenderResult) -> set[str]:
    return {r["name"] for r in result.helm_releases}


CHART_PINS = [pin for pin in vars(versions).values() if isinstance(pin, versions.ChartPin)]


# --- pins ----------------------------------------


def test_every_release_installs_the_cached_chart_of_its_pin(stack_render: RenderResult) -> None:
    pins = {pin.chart: pin for pin in CHART_PINS}
    assert stack_render.helm_releases
    for rendered_release in stack_render.helm_releases:
        chart_dir = Path(rendered_release["chart"])
        pin = pins.get(chart_dir.name)
        assert pin is not None, f"{rendered_release['chart']} has no ChartPin in domain/versions.py"
        # The chart cache's verified directory, never a chart repository: what deploys is what the
        # render expanded.
        assert chart_dir == chart_cache_dir() / f"{pin.chart}-{pin.version}" / pin.chart


def test_every_chart_pin_records_repository_source_and_date() -> None:
    assert len(CHART_PINS) >= 11
    for pin in CHART_PINS:
        # Karpenter publishes its charts only as OCI artifacts (public.ecr.aws/karpenter).
        assert pin.repository.startswith(("https://", "oci://")), pin
        # The EFA device plugin's Chart.yaml spells its version with a leading "v" (v0.5.30).
        version = pin.version.removeprefix("v")
        assert version[0].isdigit() and version.count(".") == 2, pin
        assert "https://" in pin.source, pin
        assert pin.pinned_on.startswith("20"), pin


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("addons.metrics_server", "chart_version"),
        ("addons.secrets_store_csi_driver", "aws_provider_chart_version"),
        ("monitoring", "chart_version"),
    ],
)
def test_a_stack_cannot_pick_a_chart_version_that_is_not_locked(
    tmp_path: Path, section: str, key: str
) -> None:
    def override(values: dict[str, Any]) -> None:
        top, *rest = section.split(".")
        values[top] = {rest[0]: {key: "3.13.0"}} if rest else {key: "70.0.0"}

    message = config_error(tmp_path, override)
    assert f"vllm-platform:{section}" in message
    assert f"{key} is no longer a setting" in message
    assert "charts.lock.yaml" in message and "domain/versions.py" in message


def test_cluster_autoscaler_image_matches_every_supported_kubernetes_minor() -> None:
    assert set(versions.CLUSTER_AUTOSCALER_IMAGE_TAGS) == set(versions.SUPPORTED_KUBERNETES_VERSIONS)
    for minor, tag in versions.CLUSTER_AUTOSCALER_IMAGE_TAGS.items():
        assert tag.startswith(f"v{minor}."), (minor, tag)


# --- which add-ons, per mode ----------------------------------------

EKS_ADDONS = {
    "aws-efs-csi-driver",
    "secrets-store-csi-driver",
    "aws-load-balancer-controller",
    "metrics-server",
    "cluster-autoscaler",
    "nvidia-device-plugin",
    "dcgm-exporter",
    "kube-prometheus-stack",
    "prometheus-adapter",
}


def test_eks_stacks_install_every_addon_the_serving_unit_needs(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    expected = set(EKS_ADDONS)
    if config.security.secret_store.provider == "aws-secrets-manager":
        expected.add("secrets-store-csi-driver-provider-aws")
    if config.security.secret_store.provider == "vault":
        expected.add("vault-csi-provider")
    if config.addons.keda.enabled:
        expected.add("keda")
    if config.addons.argo_rollouts.enabled:
        expected.add("argo-rollouts")
    if runs_karpenter(config):
        expected.add("karpenter")
    assert release_names(stack_render) == expected


def test_existing_mode_installs_only_the_gpu_and_monitoring_addons(
    existing_mode_render: RenderResult,
) -> None:
    # The cluster owner runs CSI drivers, the load balancer controller, metrics-server and node
    # autoscaling (they need IAM roles this stack only creates in mode eks); the GPU add-ons and
    # monitoring must be configured the way autoscaling reads them.
    assert release_names(existing_mode_render) == {
        "nvidia-device-plugin",
        "dcgm-exporter",
        "kube-prometheus-stack",
        "prometheus-adapter",
    }


def test_existing_mode_may_switch_on_an_addon_that_needs_no_eks_role(tmp_path: Path) -> None:
    config = load_variant(
        tmp_path, lambda v: v.__setitem__("addons", {"metrics_server": True}), base="existing"
    )
    assert config.addons.metrics_server.enabled is True
    assert config.addons.efs_csi_driver.enabled is False


@pytest.mark.parametrize("addon", ["aws_load_balancer_controller", "cluster_autoscaler"])
def test_existing_mode_rejects_addons_that_need_roles_only_eks_creates(tmp_path: Path, addon: str) -> None:
    message = config_error(
        tmp_path, lambda v: v.__setitem__("addons", {addon: {"enabled": True}}), base="existing"
    )
    assert f"vllm-platform:addons.{addon}.enabled = true" in message
    assert "mode 'existing'" in message and f"addons.{addon}: false" in message


def test_addon_true_is_short_for_enabled_true(tmp_path: Path) -> None:
    short = load_variant(tmp_path / "short", lambda v: v.__setitem__("addons", {"keda": True}))
    long = load_variant(tmp_path / "long", lambda v: v.__setitem__("addons", {"keda": {"enabled": True}}))
    assert short.addons.keda == long.addons.keda
    assert short.addons.keda.enabled is True


def test_keda_is_on_by_default_in_mode_eks_in_its_own_namespace_and_off_in_mode_existing() -> None:
    # The default autoscaling backend (issue 35); an existing cluster usually runs its own KEDA.
    assert "keda" in release_names(rendered("dev"))
    assert "keda" not in release_names(rendered("existing", TEST_STACKS_DIR / "Pulumi.existing.yaml"))
    keda = release(rendered("prod"), "keda")
    # helm.v4.Chart creates no namespace: the component does, before the release.
    assert keda["namespace"] == "keda" and rendered("prod").find("Namespace", "keda")


# --- values ----------------------------------------


def _role_names(result: RenderResult) -> set[str]:
    return {r.inputs.get("name", r.name) for r in result.aws("aws:iam/role:Role")}


@pytest.mark.parametrize(
    ("release_name", "account_path", "account"),
    [
        ("aws-efs-csi-driver", ("controller", "serviceAccount"), EFS_CSI_CONTROLLER),
        ("aws-load-balancer-controller", ("serviceAccount",), AWS_LOAD_BALANCER_CONTROLLER),
        ("cluster-autoscaler", ("rbac", "serviceAccount"), CLUSTER_AUTOSCALER),
    ],
)
def test_addons_that_call_aws_run_as_the_service_account_of_their_irsa_role(
    stack_render: RenderResult, release_name: str, account_path: tuple[str, ...], account: Any
) -> None:
    values = release(stack_render, release_name)["values"]
    for key in account_path:
        values = values[key]
    assert values["create"] is True
    assert values["name"] == account.name
    role_arn = values["annotations"][IRSA_ANNOTATION]
    assert role_arn.split(":role/")[1] in _role_names(stack_render), role_arn
    assert release(stack_render, release_name)["namespace"] == account.namespace


def test_load_balancer_controller_knows_cluster_region_and_vpc(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    values = release(stack_render, "aws-load-balancer-controller")["values"]
    vpc_ids = {r.name for r in stack_render.aws("aws:ec2/vpc:Vpc")}
    assert values["clusterName"] == config.cluster.name
    assert values["region"] == config.cluster.region
    assert values["vpcId"].startswith("vpc-") and len(vpc_ids) == 1
    assert values["replicaCount"] == config.addons.aws_load_balancer_controller.replicas


def test_cluster_autoscaler_discovers_the_groups_and_can_scale_gpu_nodes_down(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    values = release(stack_render, "cluster-autoscaler")["values"]
    assert values["cloudProvider"] == "aws"
    assert values["autoDiscovery"] == {"clusterName": config.cluster.name}
    assert values["awsRegion"] == config.cluster.region
    assert values["image"]["tag"] == versions.CLUSTER_AUTOSCALER_IMAGE_TAGS[config.cluster.kubernetes_version]
    # vLLM pods mount emptyDirs; without this their nodes would never be removed.
    assert values["extraArgs"]["skip-nodes-with-local-storage"] is False
    assert values["extraArgs"]["max-node-provision-time"] == "20m"


def test_efs_storage_class_provisions_access_points_on_the_stacks_file_system(
    stack_render: RenderResult,
) -> None:
    [storage_class] = stack_render.find("StorageClass", EFS_STORAGE_CLASS)
    assert storage_class["provisioner"] == "efs.csi.aws.com"
    assert storage_class["parameters"]["provisioningMode"] == "efs-ap"
    assert storage_class["parameters"]["fileSystemId"] == stack_render.outputs["efs_file_system_id"]
    assert storage_class["reclaimPolicy"] == "Retain"
    assert release(stack_render, "aws-efs-csi-driver")["values"]["storageClasses"] == []


def test_existing_mode_keeps_the_storage_class_for_the_clusters_own_efs_driver(
    existing_mode_render: RenderResult,
) -> None:
    [storage_class] = existing_mode_render.find("StorageClass", EFS_STORAGE_CLASS)
    assert storage_class["parameters"]["fileSystemId"] == "fs-0abc1234def567890"


def test_model_volume_claims_use_the_storage_class_the_addons_create(stack_render: RenderResult) -> None:
    claims = stack_render.find("PersistentVolumeClaim")
    assert claims
    assert {claim["spec"]["storageClassName"] for claim in claims} == {EFS_STORAGE_CLASS}


def test_secrets_store_driver_syncs_secrets_and_the_aws_provider_follows_the_secret_store(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    driver = release(stack_render, "secrets-store-csi-driver")["values"]
    assert driver["syncSecret"] == {"enabled": True}
    assert (
        driver["rotationPollInterval"]
        == f"{config.addons.secrets_store_csi_driver.rotation_poll_interval_seconds}s"
    )
    has_provider = "secrets-store-csi-driver-provider-aws" in release_names(stack_render)
    assert has_provider == (config.security.secret_store.provider == "aws-secrets-manager")
    if has_provider:
        provider = release(stack_render, "secrets-store-csi-driver-provider-aws")["values"]
        assert provider["secrets-store-csi-driver"] == {"install": False}, (
            "the driver is its own pinned release"
        )


def test_addon_defaults_follow_the_cluster_mode_for_configs_built_in_code() -> None:
    values = read_stack_file(TEST_STACKS_DIR / "Pulumi.existing.yaml")
    config = PlatformConfig.model_validate({**values, "addons": AddonsConfig(keda=KedaConfig(enabled=True))})
    assert config.cluster.mode == "existing"
    assert config.addons.efs_csi_driver.enabled is False
    assert config.addons.nvidia_device_plugin.enabled is True
    assert config.addons.keda.enabled is True


def test_vault_secret_store_installs_only_the_vault_csi_provider_pointing_at_the_configured_vault() -> None:
    stack_render = rendered("staging")
    config = config_of(stack_render)
    assert config.security.secret_store.provider == "vault"
    values = release(stack_render, "vault-csi-provider")["values"]
    assert values["server"]["enabled"] is False
    # The server's ServiceAccount and auth-delegator binding render even with the server off.
    assert values["server"]["authDelegator"] == {"enabled": False}
    assert values["injector"] == {"enabled": False}
    assert values["csi"]["enabled"] is True
    assert values["global"]["externalVaultAddr"] == config.security.secret_store.vault_address
