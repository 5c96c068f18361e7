"""The AWS layer (mode `eks`): the real program under mocks, plus its pure builders.

Render-based tests read the inputs each AWS resource was given, as `pulumi up` would send them.
"""

from __future__ import annotations

import base64
import email
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config import PlatformConfig, stack_file_for
from domain.config.cluster import GpuNodeGroupConfig, ImagePullConfig, TaintConfig
from domain.config.tenants import model_key_secrets
from domain.node_user_data import (
    CONTAINERD_ROOT,
    IMAGE_VOLUME_DEVICE,
    MIME_BOUNDARY,
    MODEL_CACHE_DIRECTORY,
    al2023_user_data,
    containerd_volume_script,
    local_nvme_script,
)
from domain.service_accounts import (
    AWS_LOAD_BALANCER_CONTROLLER,
    CLUSTER_AUTOSCALER,
    EBS_CSI_CONTROLLER,
    EFS_CSI_CONTROLLER,
    KARPENTER,
    ROUTER_SERVICE_ACCOUNT,
    ServiceAccountRef,
    alertmanager_service_account,
    grafana_service_account,
    model_service_account,
)
from infra.aws.addons import addons_after_nodes, addons_before_nodes
from infra.aws.cluster import admin_principals, kubeconfig, principal_resource_name
from infra.aws.irsa import IAM_ROLE_NAME_MAX, iam_role_name, service_account_role_specs
from infra.aws.karpenter import runs_karpenter
from infra.aws.network import nat_gateway_count, subnet_layout
from infra.aws.node_groups import (
    autoscaler_tags,
    eks_taints,
    gpu_block_devices,
    gpu_node_labels,
    gpu_user_data,
    node_group_specs,
    system_ami_type,
)
from infra.aws.policies import (
    AwsLocation,
    cluster_autoscaler_policy,
    irsa_trust_policy,
    load_balancer_controller_policy,
    model_access_policy,
    tls_only_bucket_policy,
    to_json,
    with_model_bucket_decrypt,
)
from infra.render import PLACEHOLDER_ACCOUNT_ID, PLACEHOLDER_CLUSTER_SECURITY_GROUP_ID, RenderResult
from infra.stack_checks import load_stack
from tests.conftest import rendered

LOCATION = AwsLocation(partition="aws", region="us-east-1", account_id=PLACEHOLDER_ACCOUNT_ID)
EKS_STACKS = ("dev", "staging", "prod")
# The mocks run as this IAM user (infra/render.py); the stack makes it a cluster admin.
RENDER_DEPLOYER_ARN = f"arn:aws:iam::{PLACEHOLDER_ACCOUNT_ID}:user/render"


# ---------------------------------------------------------------- helpers


def config_of(render: RenderResult) -> PlatformConfig:
    return load_stack(render.stack, stack_file=Path(render.stack_file))


def one(render: RenderResult, type_: str, name: str) -> dict[str, Any]:
    matches = [r.inputs for r in render.aws(type_) if r.name == name]
    assert len(matches) == 1, f"expected one {type_} named {name}, found {len(matches)}"
    return matches[0]


def managed_gpu_groups(config: PlatformConfig) -> list[tuple[str, GpuNodeGroupConfig]]:
    """The GPU groups that are EKS managed node groups (a Karpenter pool is a NodePool instead)."""
    return [(name, group) for name, group in config.node_groups.gpu.items() if not group.is_karpenter_pool]


def node_group(render: RenderResult, group: str) -> dict[str, Any]:
    return one(render, "aws:eks/nodeGroup:NodeGroup", f"aws-nodes-{group}")


def launch_template(render: RenderResult, group: str) -> dict[str, Any]:
    return one(render, "aws:ec2/launchTemplate:LaunchTemplate", f"aws-nodes-{group}")


def cluster(render: RenderResult) -> dict[str, Any]:
    return one(render, "aws:eks/cluster:Cluster", "aws-eks-cluster")


def irsa_roles(render: RenderResult) -> dict[str, dict[str, Any]]:
    """IRSA roles by the service account (`ns/name`) their trust policy names."""
    roles = {}
    for role in render.aws("aws:iam/role:Role"):
        trust = json.loads(role.inputs["assumeRolePolicy"])
        statement = trust["Statement"][0]
        if "Federated" not in statement["Principal"]:
            continue
        subjects = [
            value for key, value in statement["Condition"]["StringEquals"].items() if key.endswith(":sub")
        ]
        assert len(subjects) == 1, role.name
        roles[subjects[0].removeprefix("system:serviceaccount:").replace(":", "/")] = role.inputs | {
            "_name": role.name
        }
    return roles


def inline_policy(render: RenderResult, role_resource_name: str) -> dict[str, Any]:
    return json.loads(one(render, "aws:iam/rolePolicy:RolePolicy", role_resource_name)["policy"])


def autoscaler_tags_of(render: RenderResult, group: str) -> dict[str, str]:
    tags = {}
    for tag in render.aws("aws:autoscaling/tag:Tag"):
        if tag.name.startswith(f"aws-nodes-{group}-"):
            tags[tag.inputs["tag"]["key"]] = tag.inputs["tag"]["value"]
            assert tag.inputs["tag"]["propagateAtLaunch"] is False
            assert f"aws-nodes-{group}" in tag.inputs["autoscalingGroupName"]
    return tags


@pytest.fixture(scope="module")
def public_endpoint_render(tmp_path_factory: pytest.TempPathFactory) -> RenderResult:
    """dev, with a public API endpoint for two CIDRs and two extra cluster admins."""
    document = yaml.safe_load(stack_file_for("dev").read_text())
    cluster_config = document["config"]["vllm-platform:cluster"]
    cluster_config.update(
        endpoint_public_access=True,
        public_access_cidrs=["203.0.113.0/24", "198.51.100.7/32"],
        admin_principal_arns=[
            f"arn:aws:iam::{PLACEHOLDER_ACCOUNT_ID}:role/platform-admins",
            RENDER_DEPLOYER_ARN,
        ],
    )
    path = tmp_path_factory.mktemp("stacks") / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    return rendered("dev", path)


# ---------------------------------------------------------------- modes


def test_existing_mode_creates_no_aws_resources(existing_mode_render: RenderResult) -> None:
    assert existing_mode_render.aws_resources == []
    assert not [r for r in existing_mode_render.resources if r.type == "pulumi:providers:aws"]
    assert not [r for r in existing_mode_render.components if r.type.startswith("vllm-platform:aws:")]
    # The Kubernetes layer still renders.
    assert existing_mode_render.kubernetes_objects


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_eks_mode_builds_the_aws_layer_from_sub_components_through_one_regional_provider(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    components = {r.type for r in render.components}
    assert {
        "vllm-platform:aws:AwsInfrastructure",
        "vllm-platform:aws:Network",
        "vllm-platform:aws:EksCluster",
        "vllm-platform:aws:NodeGroups",
        "vllm-platform:aws:ModelStorage",
        "vllm-platform:aws:ServiceAccountRoles",
        "vllm-platform:aws:ManagedAddons",
    } <= components
    providers = [r for r in render.resources if r.type == "pulumi:providers:aws"]
    assert [p.inputs["region"] for p in providers] == [config.cluster.region]
    assert render.outputs["cluster_name"] == config.cluster.name
    assert render.outputs["model_bucket"] == config.storage.model_bucket_name
    assert render.outputs["efs_file_system_id"].startswith("fs-")


def test_kubeconfig_authenticates_through_aws_eks_get_token_for_this_cluster() -> None:
    render = rendered("prod")
    document = yaml.safe_load(render.outputs["kubeconfig"])
    args = document["users"][0]["user"]["exec"]["args"]
    assert document["users"][0]["user"]["exec"]["command"] == "aws"
    assert args[:2] == ["eks", "get-token"]
    assert args[args.index("--cluster-name") + 1] == "vllm-prod"
    assert args[args.index("--region") + 1] == "us-east-1"
    assert document["clusters"][0]["cluster"]["server"].startswith("https://")


# ---------------------------------------------------------------- network


@pytest.mark.parametrize(("stack", "expected_nat_gateways"), [("dev", 1), ("prod", 3)])
def test_nat_gateways_one_per_az_in_prod_and_single_in_dev(stack: str, expected_nat_gateways: int) -> None:
    render = rendered(stack)
    config = config_of(render)
    nat_gateways = render.aws("aws:ec2/natGateway:NatGateway")
    assert len(nat_gateways) == expected_nat_gateways
    assert len({nat.inputs["subnetId"] for nat in nat_gateways}) == expected_nat_gateways
    private_tables = [r for r in render.aws("aws:ec2/routeTable:RouteTable") if "-private-" in r.name]
    assert len(private_tables) == config.cluster.availability_zone_count
    targets = {table.inputs["routes"][0]["natGatewayId"] for table in private_tables}
    assert len(targets) == expected_nat_gateways


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_subnets_follow_the_layout_and_carry_the_load_balancer_tags(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    layout = subnet_layout(config.cluster.vpc_cidr, config.cluster.availability_zone_count)
    subnets = {r.name: r.inputs for r in render.aws("aws:ec2/subnet:Subnet")}
    cluster_tag = f"kubernetes.io/cluster/{config.cluster.name}"
    for index, cidr in enumerate(layout.private_cidrs):
        private = subnets[f"aws-network-private-{index}"]
        assert private["cidrBlock"] == cidr
        assert private["tags"][cluster_tag] == "shared"
        # No load balancer in the node subnets: a NetworkPolicy admitting it would admit every pod.
        assert "kubernetes.io/role/elb" not in private["tags"]
        assert "kubernetes.io/role/internal-elb" not in private["tags"]
    for index, cidr in enumerate(layout.internal_load_balancer_cidrs):
        internal = subnets[f"aws-network-internal-lb-{index}"]
        assert internal["cidrBlock"] == cidr
        assert internal["tags"]["kubernetes.io/role/internal-elb"] == "1"
        assert internal["tags"][cluster_tag] == "shared"
    for index, cidr in enumerate(layout.public_cidrs):
        public = subnets[f"aws-network-public-{index}"]
        assert public["cidrBlock"] == cidr
        assert public["tags"]["kubernetes.io/role/elb"] == "1"
        assert public["mapPublicIpOnLaunch"] is False
    assert len(subnets) == 3 * config.cluster.availability_zone_count
    zones = {s["availabilityZone"] for name, s in subnets.items() if "private" in name}
    assert len(zones) == config.cluster.availability_zone_count


def test_subnet_layout_gives_each_az_a_large_private_block_and_a_small_public_one() -> None:
    layout = subnet_layout("10.0.0.0/16", 3)
    assert layout.private_cidrs == ("10.0.0.0/18", "10.0.64.0/18", "10.0.128.0/18")
    assert layout.public_cidrs == ("10.0.192.0/20", "10.0.208.0/20", "10.0.224.0/20")
    # Internal ALBs: the last /20 is all that is free, so a /22 each.
    assert layout.internal_load_balancer_cidrs == ("10.0.240.0/22", "10.0.244.0/22", "10.0.248.0/22")
    assert subnet_layout("10.0.0.0/16", 2).private_cidrs == ("10.0.0.0/18", "10.0.64.0/18")


@pytest.mark.parametrize("vpc_cidr", ["10.0.0.0/16", "172.16.0.0/18", "192.168.16.0/20"])
@pytest.mark.parametrize("zones", [1, 2, 3, 4])
def test_subnet_layout_never_overlaps_and_stays_inside_the_vpc(vpc_cidr: str, zones: int) -> None:
    layout = subnet_layout(vpc_cidr, zones)
    vpc = ipaddress.IPv4Network(vpc_cidr)
    all_cidrs = layout.private_cidrs + layout.public_cidrs + layout.internal_load_balancer_cidrs
    networks = [ipaddress.IPv4Network(c) for c in all_cidrs]
    counts = {len(layout.private_cidrs), len(layout.public_cidrs), len(layout.internal_load_balancer_cidrs)}
    assert counts == {zones}
    assert all(ipaddress.IPv4Network(c).prefixlen <= 27 for c in layout.internal_load_balancer_cidrs)
    assert all(network.subnet_of(vpc) for network in networks)
    for i, first in enumerate(networks):
        for second in networks[i + 1 :]:
            assert not first.overlaps(second), (first, second)
    private_size = ipaddress.IPv4Network(layout.private_cidrs[0]).num_addresses
    public_size = ipaddress.IPv4Network(layout.public_cidrs[0]).num_addresses
    assert private_size >= 4 * public_size
    assert ipaddress.IPv4Network(layout.public_cidrs[0]).prefixlen <= 27  # ALBs need a /27 or larger


def test_subnet_layout_rejects_more_zones_than_it_can_place() -> None:
    with pytest.raises(ValueError, match="availability_zone_count must be 1 to 4"):
        subnet_layout("10.0.0.0/16", 5)


def test_nat_gateway_count_is_one_per_az_unless_single() -> None:
    assert nat_gateway_count(3, single_nat_gateway=False) == 3
    assert nat_gateway_count(3, single_nat_gateway=True) == 1


def test_s3_traffic_from_private_subnets_bypasses_the_nat_gateways() -> None:
    render = rendered("prod")
    endpoint = one(render, "aws:ec2/vpcEndpoint:VpcEndpoint", "aws-network-s3")
    assert endpoint["serviceName"] == "com.amazonaws.us-east-1.s3"
    assert endpoint["vpcEndpointType"] == "Gateway"
    assert len(endpoint["routeTableIds"]) == 3


# ---------------------------------------------------------------- cluster


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_api_endpoint_is_private_by_default(stack: str) -> None:
    vpc_config = cluster(rendered(stack))["vpcConfig"]
    assert vpc_config["endpointPrivateAccess"] is True
    assert vpc_config["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in vpc_config


def test_api_endpoint_is_public_only_for_the_configured_cidrs(public_endpoint_render: RenderResult) -> None:
    vpc_config = cluster(public_endpoint_render)["vpcConfig"]
    assert vpc_config["endpointPublicAccess"] is True
    assert vpc_config["endpointPrivateAccess"] is True
    assert vpc_config["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.7/32"]


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_cluster_runs_the_configured_version_logging_and_private_subnets(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    inputs = cluster(render)
    assert inputs["name"] == config.cluster.name
    assert inputs["version"] == config.cluster.kubernetes_version
    assert inputs["enabledClusterLogTypes"] == list(config.cluster.control_plane_logging)
    mount_subnets = {m.inputs["subnetId"] for m in render.aws("aws:efs/mountTarget:MountTarget")}
    assert set(inputs["vpcConfig"]["subnetIds"]) == mount_subnets  # both: the private subnets
    assert inputs["upgradePolicy"] == {"supportType": "STANDARD"}


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_secrets_are_envelope_encrypted_with_a_rotating_kms_key(stack: str) -> None:
    render = rendered(stack)
    encryption = cluster(render)["encryptionConfig"]
    assert encryption["resources"] == ["secrets"]
    assert ":key/" in encryption["provider"]["keyArn"]
    key = one(render, "aws:kms/key:Key", "aws-eks-secrets")
    assert key["enableKeyRotation"] is True
    grant = inline_policy(render, "aws-eks-secrets-key")["Statement"][0]
    assert grant["Resource"] == encryption["provider"]["keyArn"]
    assert {"kms:Encrypt", "kms:Decrypt"} <= set(grant["Action"])


def test_access_is_by_access_entries_only_with_admins_and_node_role(
    public_endpoint_render: RenderResult,
) -> None:
    render = public_endpoint_render
    access = cluster(render)["accessConfig"]
    assert access == {"authenticationMode": "API", "bootstrapClusterCreatorAdminPermissions": False}
    entries = {e.inputs["principalArn"]: e.inputs for e in render.aws("aws:eks/accessEntry:AccessEntry")}
    admins = [f"arn:aws:iam::{PLACEHOLDER_ACCOUNT_ID}:role/platform-admins", RENDER_DEPLOYER_ARN]
    for admin in admins:
        assert entries.pop(admin)["type"] == "STANDARD"
    # What is left is the node role, as EC2_LINUX.
    assert [entry["type"] for entry in entries.values()] == ["EC2_LINUX"]
    assert list(entries) == [node_group(render, "system")["nodeRoleArn"]]
    associations = render.aws("aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    assert sorted(a.inputs["principalArn"] for a in associations) == sorted(admins)
    for association in associations:
        assert association.inputs["policyArn"].endswith(":cluster-access-policy/AmazonEKSClusterAdminPolicy")
        assert association.inputs["accessScope"] == {"type": "cluster"}


def test_oidc_provider_serves_irsa_with_the_sts_audience() -> None:
    render = rendered("prod")
    providers = render.aws("aws:iam/openIdConnectProvider:OpenIdConnectProvider")
    assert len(providers) == 1
    inputs = providers[0].inputs
    assert inputs["clientIdLists"] == ["sts.amazonaws.com"]
    assert inputs["url"].startswith("https://oidc.eks.us-east-1.amazonaws.com/id/")
    assert len(inputs["thumbprintLists"]) == 1 and len(inputs["thumbprintLists"][0]) == 40


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_managed_addons_are_vpc_cni_kube_proxy_coredns_and_the_ebs_csi_driver_with_network_policy_enforced(
    stack: str,
) -> None:
    render = rendered(stack)
    addons = {a.inputs["addonName"]: a.inputs for a in render.aws("aws:eks/addon:Addon")}
    assert set(addons) == {"vpc-cni", "kube-proxy", "coredns", "aws-ebs-csi-driver"}
    assert addons["aws-ebs-csi-driver"]["serviceAccountRoleArn"].endswith("kube-system-ebs-csi-controller-sa")
    assert json.loads(addons["vpc-cni"]["configurationValues"]) == {"enableNetworkPolicy": "true"}
    assert cluster(render)["bootstrapSelfManagedAddons"] is False


def test_addons_split_into_before_and_after_nodes() -> None:
    assert [a.name for a in addons_before_nodes(network_policies=True)] == ["vpc-cni", "kube-proxy"]
    assert addons_before_nodes(network_policies=False)[0].configuration == {}
    assert [a.name for a in addons_after_nodes()] == ["coredns"]
    with_ebs = addons_after_nodes("arn:aws:iam::1:role/ebs")
    assert [a.name for a in with_ebs] == ["coredns", "aws-ebs-csi-driver"]


def test_kubeconfig_exec_names_cluster_and_region() -> None:
    document = json.loads(kubeconfig("c1", "eu-west-1", "https://x.example", "Q0E="))
    user = document["users"][0]["user"]["exec"]
    assert user["args"] == [
        "eks",
        "get-token",
        "--cluster-name",
        "c1",
        "--region",
        "eu-west-1",
        "--output",
        "json",
    ]
    assert document["current-context"] == "c1"
    assert document["clusters"][0]["cluster"]["certificate-authority-data"] == "Q0E="


def test_admin_principals_add_the_deployer_once() -> None:
    role = "arn:aws:iam::111122223333:role/admins"
    assert admin_principals([role, role], "arn:aws:iam::111122223333:role/ci") == [
        role,
        "arn:aws:iam::111122223333:role/ci",
    ]
    assert admin_principals([role], role) == [role]
    assert (
        principal_resource_name("arn:aws:iam::111122223333:role/team/admins")
        == "111122223333-role-team-admins"
    )
    with pytest.raises(ValueError, match="not an IAM principal ARN"):
        principal_resource_name("admins")


# ---------------------------------------------------------------- node groups


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_gpu_groups_carry_exactly_the_configured_taints_and_labels(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    effects = {
        "NoSchedule": "NO_SCHEDULE",
        "PreferNoSchedule": "PREFER_NO_SCHEDULE",
        "NoExecute": "NO_EXECUTE",
    }
    for name, group in managed_gpu_groups(config):
        inputs = node_group(render, name)
        assert inputs["taints"] == [
            {"key": t.key, "value": t.value, "effect": effects[t.effect]} for t in group.taints
        ]
        assert inputs["labels"] == {
            **group.labels,
            "vllm-platform/gpu-group": name,
            "nvidia.com/gpu.present": "true",
            "vllm-platform/gpu-model": group.gpu_model.name,
            "k8s.amazonaws.com/accelerator": f"nvidia-{group.gpu_model.name.lower()}",
        }
        assert inputs["instanceTypes"] == group.instance_types
        assert inputs["amiType"] == group.ami_type
        assert inputs["capacityType"] == group.capacity_type.upper()
        assert inputs["scalingConfig"] == {
            "minSize": group.min_size,
            "desiredSize": group.desired_size,
            "maxSize": group.max_size,
        }
        assert inputs["version"] == config.cluster.kubernetes_version


def test_prod_h200_group_keeps_its_config_label() -> None:
    assert node_group(rendered("prod"), "h200")["labels"]["workload-tier"] == "premium"


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_system_group_has_no_gpu_taint_or_gpu_labels(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    inputs = node_group(render, "system")
    assert not inputs.get("taints")
    assert not any(key.startswith(("vllm-platform/gpu", "nvidia.com/")) for key in inputs.get("labels", {}))
    assert inputs["instanceTypes"] == config.node_groups.system.instance_types
    assert inputs["amiType"] == "AL2023_x86_64_STANDARD"


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_launch_templates_size_encrypt_the_root_disk_and_require_imdsv2(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    sizes = {"system": config.node_groups.system.disk_size_gib}
    sizes.update({name: group.disk_size_gib for name, group in managed_gpu_groups(config)})
    for group, size in sizes.items():
        template = launch_template(render, group)
        (mapping,) = template["blockDeviceMappings"]
        assert mapping["deviceName"] == "/dev/xvda"
        assert mapping["ebs"]["volumeSize"] == size
        assert mapping["ebs"]["volumeType"] == "gp3"
        assert mapping["ebs"]["encrypted"] == "true"
        assert template["metadataOptions"]["httpTokens"] == "required"
        assert template["metadataOptions"]["httpPutResponseHopLimit"] == 1
        assert node_group(render, group)["launchTemplate"]["version"] == "1"


def _parts(user_data_b64: str) -> list[tuple[str, str]]:
    """(content type, text) of each part of an AL2023 MIME user-data document, in order."""
    message = email.message_from_bytes(base64.b64decode(user_data_b64))
    assert message.is_multipart()
    assert message.get_content_type() == "multipart/mixed"
    return [(part.get_content_type(), part.get_payload()) for part in message.get_payload()]


def _decoded_script(user_data_b64: str) -> str:
    """The first part: the NVMe script."""
    content_type, text = _parts(user_data_b64)[0]
    assert content_type == "text/x-shellscript"
    return text


def _node_config(user_data_b64: str) -> dict[str, Any]:
    """Our nodeadm NodeConfig: the last part, the only one nodeadm reads as configuration."""
    content_type, text = _parts(user_data_b64)[-1]
    assert content_type == "application/node.eks.aws"
    return yaml.safe_load(text)


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_gpu_nodes_assemble_local_nvme_at_the_configured_mount_path(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    for name, group in managed_gpu_groups(config):
        script = _decoded_script(launch_template(render, name)["userData"])
        mount_path = group.local_nvme.mount_path
        assert f"MOUNT_PATH={mount_path}\n" in script
        assert f"CACHE_DIR={mount_path}/{MODEL_CACHE_DIRECTORY}\n" in script
    assert "userData" not in launch_template(render, "system")


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_gpu_groups_carry_cluster_autoscaler_tags_to_scale_from_zero(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    prefix = "k8s.io/cluster-autoscaler"
    for name, group in managed_gpu_groups(config):
        tags = autoscaler_tags_of(render, name)
        assert tags[f"{prefix}/enabled"] == "true"
        assert tags[f"{prefix}/{config.cluster.name}"] == "owned"
        for key, value in node_group(render, name)["labels"].items():
            assert tags[f"{prefix}/node-template/label/{key}"] == value
        for taint in group.taints:
            assert tags[f"{prefix}/node-template/taint/{taint.key}"] == f"{taint.value}:{taint.effect}"
        assert tags[f"{prefix}/node-template/resources/nvidia.com/gpu"] == str(group.min_gpus_per_node)
    system_tags = autoscaler_tags_of(render, "system")
    assert not [key for key in system_tags if "/taint/" in key or "/resources/" in key]


def test_prod_h200_template_promises_eight_gpus_and_dev_l40s_one() -> None:
    gpu_tag = "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu"
    assert autoscaler_tags_of(rendered("prod"), "h200")[gpu_tag] == "8"
    assert autoscaler_tags_of(rendered("dev"), "l40s")[gpu_tag] == "1"


def test_node_role_has_the_worker_cni_ecr_and_ssm_policies() -> None:
    render = rendered("dev")
    attached = {
        a.inputs["policyArn"].rsplit("/", 1)[-1]
        for a in render.aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith("aws-nodes-")
    }
    assert attached == {
        "AmazonEKSWorkerNodePolicy",
        "AmazonEKS_CNI_Policy",
        "AmazonEC2ContainerRegistryReadOnly",
        "AmazonSSMManagedInstanceCore",
    }


def _gpu_group(**overrides: Any) -> GpuNodeGroupConfig:
    return GpuNodeGroupConfig.model_validate({"instance_types": ["p5.48xlarge"], **overrides})


def test_eks_taints_map_every_kubernetes_effect() -> None:
    taints = [
        TaintConfig(key="a", value="1", effect="NoSchedule"),
        TaintConfig(key="b", effect="PreferNoSchedule"),
        TaintConfig(key="c", value="x", effect="NoExecute"),
    ]
    assert eks_taints(taints) == [
        {"key": "a", "value": "1", "effect": "NO_SCHEDULE"},
        {"key": "b", "value": "", "effect": "PREFER_NO_SCHEDULE"},
        {"key": "c", "value": "x", "effect": "NO_EXECUTE"},
    ]


def test_platform_labels_win_over_config_labels_of_the_same_key() -> None:
    labels = gpu_node_labels("h100", _gpu_group(labels={"vllm-platform/gpu-group": "other", "team": "ml"}))
    assert labels == {
        "vllm-platform/gpu-group": "h100",
        "team": "ml",
        "nvidia.com/gpu.present": "true",
        "vllm-platform/gpu-model": "H100",
        "k8s.amazonaws.com/accelerator": "nvidia-h100",
    }


def test_autoscaler_tags_describe_labels_taints_and_gpus() -> None:
    tags = autoscaler_tags("c1", {"a": "b"}, [TaintConfig(key="nvidia.com/gpu", value="true")], 8)
    assert tags == {
        "k8s.io/cluster-autoscaler/enabled": "true",
        "k8s.io/cluster-autoscaler/c1": "owned",
        "k8s.io/cluster-autoscaler/node-template/label/a": "b",
        "k8s.io/cluster-autoscaler/node-template/taint/nvidia.com/gpu": "true:NoSchedule",
        "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/gpu": "8",
    }


def test_system_ami_type_follows_the_instance_architecture() -> None:
    assert system_ami_type(["m7i.large", "m6a.large"]) == "AL2023_x86_64_STANDARD"
    assert system_ami_type(["m7g.large", "c6gn.xlarge"]) == "AL2023_ARM_64_STANDARD"
    with pytest.raises(ValueError, match="mixes Graviton"):
        system_ami_type(["m7g.large", "m7i.large"])


def test_without_local_nvme_the_user_data_is_the_node_config_alone_and_nvme_is_refused_on_bottlerocket() -> (
    None
):
    parts = _parts(gpu_user_data("g", _gpu_group(local_nvme={"enabled": False})))
    assert [content_type for content_type, _ in parts] == ["application/node.eks.aws"]
    # Refused by the config itself (issue 34: it crashed `render` with a traceback from here).
    with pytest.raises(ValueError, match="implemented for AL2023 nodes only"):
        gpu_user_data("g", _gpu_group(ami_type="BOTTLEROCKET_x86_64_NVIDIA"))


def test_a_gpu_group_may_not_be_named_system() -> None:
    config = load_stack("dev")
    groups = config.node_groups.model_copy(update={"gpu": {"system": config.node_groups.gpu["l40s"]}})
    with pytest.raises(ValueError, match="taken by the system node group"):
        node_group_specs("c", groups)


def test_user_data_is_a_mime_document_whose_script_raids_formats_and_mounts_the_nvme_disks() -> None:
    text = al2023_user_data("/mnt/models")
    assert f'boundary="{MIME_BOUNDARY}"' in text
    script = _decoded_script(base64.b64encode(text.encode()).decode())
    assert script.startswith("#!/bin/bash\n")
    assert "Amazon EC2 NVMe Instance Storage" in script
    assert "mdadm --create" in script and "--level=0" in script
    assert 'mkfs.xfs -f -K "$DEVICE"' in script
    assert 'mount -o defaults,noatime "$DEVICE" "$MOUNT_PATH"' in script
    assert "MOUNT_PATH=/mnt/models\n" in script and "CACHE_DIR=/mnt/models/vllm-models\n" in script
    assert al2023_user_data("/mnt/models") == text  # deterministic: no random MIME boundary


def test_nvme_script_is_valid_bash_and_quotes_the_mount_path(tmp_path: Path) -> None:
    import shutil
    import subprocess

    script = local_nvme_script("/mnt/nvme/")
    assert "MOUNT_PATH=/mnt/nvme\n" in script
    bash = shutil.which("bash")
    assert bash is not None, "bash is needed to syntax-check the node script"
    path = tmp_path / "nvme.sh"
    path.write_text(script)
    result = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    with pytest.raises(ValueError, match="absolute path"):
        local_nvme_script("mnt")


# ---------------------------------------------------------------- storage


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_model_bucket_is_versioned_encrypted_private_and_tls_only(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    assert (
        one(render, "aws:s3/bucket:Bucket", "aws-storage-bucket")["bucket"]
        == config.storage.model_bucket_name
    )
    assert one(render, "aws:s3/bucketVersioning:BucketVersioning", "aws-storage-bucket")[
        "versioningConfiguration"
    ] == {"status": "Enabled"}
    (rule,) = one(
        render,
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws-storage-bucket",
    )["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    assert ":key/" in rule["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"]
    assert rule["bucketKeyEnabled"] is True
    block = one(render, "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "aws-storage-bucket")
    assert all(
        block[key] is True
        for key in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    )
    ownership = one(render, "aws:s3/bucketOwnershipControls:BucketOwnershipControls", "aws-storage-bucket")
    assert ownership["rule"] == {"objectOwnership": "BucketOwnerEnforced"}
    (deny,) = json.loads(one(render, "aws:s3/bucketPolicy:BucketPolicy", "aws-storage-bucket")["policy"])[
        "Statement"
    ]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [
        f"arn:aws:s3:::{config.storage.model_bucket_name}",
        f"arn:aws:s3:::{config.storage.model_bucket_name}/*",
    ]
    assert one(render, "aws:kms/key:Key", "aws-storage-bucket")["enableKeyRotation"] is True


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_efs_is_encrypted_with_a_mount_target_per_private_subnet_and_nfs_only_from_the_cluster(
    stack: str,
) -> None:
    render = rendered(stack)
    config = config_of(render)
    file_system = one(render, "aws:efs/fileSystem:FileSystem", "aws-storage-efs")
    assert file_system["encrypted"] is True
    assert file_system["throughputMode"] == config.storage.efs_throughput_mode
    mount_targets = render.aws("aws:efs/mountTarget:MountTarget")
    assert len(mount_targets) == config.cluster.availability_zone_count
    subnets = [m.inputs["subnetId"] for m in mount_targets]
    assert sorted(subnets) == sorted(cluster(render)["vpcConfig"]["subnetIds"])  # the private subnets
    public_subnets = {n.inputs["subnetId"] for n in render.aws("aws:ec2/natGateway:NatGateway")}
    assert not public_subnets & set(subnets)
    (rule,) = render.aws("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert rule.inputs["referencedSecurityGroupId"] == PLACEHOLDER_CLUSTER_SECURITY_GROUP_ID
    assert (rule.inputs["ipProtocol"], rule.inputs["fromPort"], rule.inputs["toPort"]) == ("tcp", 2049, 2049)
    assert "cidrIpv4" not in rule.inputs and "cidrIpv6" not in rule.inputs
    efs_group = one(render, "aws:ec2/securityGroup:SecurityGroup", "aws-storage-efs")
    assert not efs_group.get("ingress") and not efs_group.get("egress")
    assert {sg for m in mount_targets for sg in m.inputs["securityGroups"]} == {
        rule.inputs["securityGroupId"]
    }


# ---------------------------------------------------------------- IRSA


def _expected_accounts(config: PlatformConfig) -> set[str]:
    accounts = set()
    if config.addons.cluster_autoscaler.enabled:
        accounts.add(CLUSTER_AUTOSCALER.key)
    if config.addons.efs_csi_driver.enabled:
        accounts.add(EFS_CSI_CONTROLLER.key)
    if config.addons.aws_load_balancer_controller.enabled:
        accounts.add(AWS_LOAD_BALANCER_CONTROLLER.key)
    if config.addons.ebs_csi_driver.enabled:
        accounts.add(EBS_CSI_CONTROLLER.key)
    if runs_karpenter(config):
        accounts.add(KARPENTER.key)
    if config.security.secret_store.provider == "aws-secrets-manager":
        # Alertmanager and Grafana read their configuration and credential from Secrets Manager.
        if config.monitoring.alertmanager:
            accounts.add(alertmanager_service_account(config.monitoring.namespace).key)
        if config.monitoring.grafana:
            accounts.add(grafana_service_account(config.monitoring.namespace).key)
        # The router's wake gate reads the keys of the models that scale to zero (issue 40).
        if config.router.enabled and any(model.scales_to_zero for model in config.models):
            accounts.add(ROUTER_SERVICE_ACCOUNT.key)
    for model in config.models:
        uses_secrets_manager = config.security.secret_store.provider == "aws-secrets-manager"
        if model.source.s3_uri or uses_secrets_manager:
            accounts.add(model_service_account(model).key)
    return accounts


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_irsa_trust_policies_name_exactly_the_expected_service_accounts(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    roles = irsa_roles(render)
    assert set(roles) == _expected_accounts(config)
    oidc_url = one(render, "aws:iam/openIdConnectProvider:OpenIdConnectProvider", "aws-eks-oidc")["url"]
    host = oidc_url.removeprefix("https://")
    for account, role in roles.items():
        (statement,) = json.loads(role["assumeRolePolicy"])["Statement"]
        assert statement["Action"] == "sts:AssumeRoleWithWebIdentity"
        assert (
            statement["Principal"]["Federated"]
            == f"arn:aws:iam::{PLACEHOLDER_ACCOUNT_ID}:oidc-provider/{host}"
        )
        # StringEquals, not StringLike: no wildcard can widen the subject.
        assert statement["Condition"] == {
            "StringEquals": {
                f"{host}:sub": "system:serviceaccount:" + account.replace("/", ":"),
                f"{host}:aud": "sts.amazonaws.com",
            }
        }
        namespace, name = account.split("/")
        assert role["name"] == iam_role_name(config.cluster.name, ServiceAccountRef(namespace, name))


def test_prod_model_roles_read_only_their_own_prefix_and_secrets() -> None:
    render = rendered("prod")
    config = config_of(render)
    roles = irsa_roles(render)
    for model in config.models:
        role = roles[model_service_account(model).key]
        policy = inline_policy(render, role["_name"])
        statements = {s["Sid"]: s for s in policy["Statement"]}
        bucket, prefix = model.source.s3_bucket, model.source.s3_prefix
        assert statements["ListModelPrefix"]["Action"] == "s3:ListBucket"
        assert statements["ListModelPrefix"]["Resource"] == f"arn:aws:s3:::{bucket}"
        assert statements["ListModelPrefix"]["Condition"] == {
            "StringLike": {"s3:prefix": [prefix, f"{prefix}*"]}
        }
        assert statements["ReadModelObjects"]["Action"] == "s3:GetObject"
        assert statements["ReadModelObjects"]["Resource"] == f"arn:aws:s3:::{bucket}/{prefix}*"
        # The prod weights live in the stack's own SSE-KMS bucket.
        assert statements["DecryptModelObjects"]["Condition"] == {
            "StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}
        }
        # prod has tenants: a model's pods read the keys of the tenants allowed on it, no others.
        assert statements["ReadModelSecrets"]["Resource"] == [
            f"arn:aws:secretsmanager:us-east-1:{PLACEHOLDER_ACCOUNT_ID}:secret:{ref.name}-??????"
            for ref in model_key_secrets(config, model)
        ]
        assert set(statements) == {
            "ListModelPrefix",
            "ReadModelObjects",
            "DecryptModelObjects",
            "ReadModelSecrets",
        }
        others = [m.source.s3_prefix for m in config.models if m.name != model.name]
        assert not any(other in json.dumps(policy) for other in others)


def test_staging_with_vault_grants_no_secrets_manager_access() -> None:
    render = rendered("staging")
    for account, role in irsa_roles(render).items():
        if account.startswith("vllm-"):
            actions = json.dumps(inline_policy(render, role["_name"]))
            assert "secretsmanager" not in actions
            assert "s3:GetObject" in actions


def test_dev_huggingface_model_role_reads_only_its_api_key() -> None:
    render = rendered("dev")
    config = config_of(render)
    model = config.models[0]
    policy = inline_policy(render, irsa_roles(render)[model_service_account(model).key]["_name"])
    (statement,) = policy["Statement"]
    assert statement["Action"] == ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
    assert statement["Resource"] == [
        f"arn:aws:secretsmanager:us-west-2:{PLACEHOLDER_ACCOUNT_ID}:secret:vllm-platform/dev/{model.name}/api-key-??????"
    ]


def test_addon_roles_get_their_upstream_permissions() -> None:
    render = rendered("prod")
    roles = irsa_roles(render)
    efs = roles[EFS_CSI_CONTROLLER.key]["_name"]
    attached = [
        a.inputs["policyArn"]
        for a in render.aws("aws:iam/rolePolicyAttachment:RolePolicyAttachment")
        if a.name.startswith(efs)
    ]
    assert attached == ["arn:aws:iam::aws:policy/service-role/AmazonEFSCSIDriverPolicy"]
    lbc = inline_policy(render, roles[AWS_LOAD_BALANCER_CONTROLLER.key]["_name"])
    assert lbc == load_balancer_controller_policy()
    autoscaler = inline_policy(render, roles[CLUSTER_AUTOSCALER.key]["_name"])
    assert autoscaler == cluster_autoscaler_policy(LOCATION, "vllm-prod")


# ---------------------------------------------------------------- pure policy builders


def test_irsa_trust_policy_names_one_service_account_and_the_sts_audience() -> None:
    policy = irsa_trust_policy(
        "arn:aws:iam::1:oidc-provider/oidc.example/id/X", "https://oidc.example/id/X", "ns", "sa"
    )
    assert policy["Statement"][0]["Condition"] == {
        "StringEquals": {
            "oidc.example/id/X:sub": "system:serviceaccount:ns:sa",
            "oidc.example/id/X:aud": "sts.amazonaws.com",
        }
    }


def test_model_access_policy_scopes_s3_to_the_prefix_and_refuses_an_open_prefix() -> None:
    policy = model_access_policy(location=LOCATION, s3_bucket="b", s3_prefix="org/model/rev/")
    assert policy is not None
    list_statement, get_statement = policy["Statement"]
    assert list_statement["Condition"]["StringLike"]["s3:prefix"] == ["org/model/rev/", "org/model/rev/*"]
    assert get_statement["Resource"] == "arn:aws:s3:::b/org/model/rev/*"
    for prefix in ("", "org/model/rev"):
        with pytest.raises(ValueError, match="ending in '/'"):
            model_access_policy(location=LOCATION, s3_bucket="b", s3_prefix=prefix)
    assert model_access_policy(location=LOCATION, s3_bucket=None, s3_prefix=None) is None


def test_model_bucket_decrypt_is_added_only_through_s3() -> None:
    base = model_access_policy(location=LOCATION, s3_bucket="b", s3_prefix="p/")
    assert base is not None
    policy = with_model_bucket_decrypt(base, LOCATION, "arn:aws:kms:us-east-1:1:key/k")
    assert policy["Statement"][:2] == base["Statement"]
    assert policy["Statement"][2]["Action"] == "kms:Decrypt"
    assert (
        policy["Statement"][2]["Condition"]["StringEquals"]["kms:ViaService"] == "s3.us-east-1.amazonaws.com"
    )
    assert len(base["Statement"]) == 2  # the original is not modified


def test_cluster_autoscaler_may_change_only_this_clusters_groups() -> None:
    policy = cluster_autoscaler_policy(LOCATION, "c1")
    mutate = next(s for s in policy["Statement"] if "autoscaling:SetDesiredCapacity" in s["Action"])
    assert mutate["Condition"] == {"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/c1": "owned"}}
    describe_nodegroup = next(s for s in policy["Statement"] if s["Action"] == "eks:DescribeNodegroup")
    assert describe_nodegroup["Resource"] == f"arn:aws:eks:us-east-1:{PLACEHOLDER_ACCOUNT_ID}:nodegroup/c1/*"
    writes = [
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
        if not a.split(":")[1].startswith(("Describe", "Get"))
    ]
    assert sorted(writes) == [
        "autoscaling:SetDesiredCapacity",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
    ]


def test_tls_only_bucket_policy_denies_plain_http_for_bucket_and_objects() -> None:
    (statement,) = tls_only_bucket_policy("arn:aws:s3:::b")["Statement"]
    assert statement["Effect"] == "Deny" and statement["Principal"] == "*"
    assert statement["Resource"] == ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]


def test_load_balancer_controller_policy_is_well_formed_and_fits_an_inline_policy() -> None:
    policy = load_balancer_controller_policy()
    assert policy["Version"] == "2012-10-17"
    actions = {
        a
        for s in policy["Statement"]
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {
        "elasticloadbalancing:CreateLoadBalancer",
        "elasticloadbalancing:RegisterTargets",
        "ec2:CreateSecurityGroup",
        "iam:CreateServiceLinkedRole",
    } <= actions
    assert all(s["Effect"] == "Allow" for s in policy["Statement"])
    assert len(to_json(policy)) <= 10240  # IAM's limit for a role's inline policies


def test_iam_role_names_are_readable_and_at_most_64_characters() -> None:
    assert iam_role_name("vllm-prod", ServiceAccountRef("vllm-llama", "vllm")) == "vllm-prod-vllm-llama-vllm"
    long_name = iam_role_name("c" * 40, ServiceAccountRef("vllm-" + "m" * 40, "vllm"))
    assert len(long_name) == IAM_ROLE_NAME_MAX
    assert long_name == iam_role_name("c" * 40, ServiceAccountRef("vllm-" + "m" * 40, "vllm"))
    assert long_name != iam_role_name("c" * 40, ServiceAccountRef("vllm-" + "m" * 39 + "n", "vllm"))


def test_service_account_refs_are_namespace_and_name_pairs() -> None:
    model = load_stack("prod").models[0]
    assert model_service_account(model) == (f"vllm-{model.name}", "vllm")
    assert model_service_account(model).key == f"vllm-{model.name}/vllm"
    assert CLUSTER_AUTOSCALER.subject == "system:serviceaccount:kube-system:cluster-autoscaler"


def test_addon_roles_follow_the_addon_switches() -> None:
    config = load_stack("dev")
    switched_off = config.addons.aws_load_balancer_controller.model_copy(update={"enabled": False})
    config = config.model_copy(
        update={"addons": config.addons.model_copy(update={"aws_load_balancer_controller": switched_off})}
    )
    accounts = {spec.service_account for spec in service_account_role_specs(config, LOCATION)}
    assert AWS_LOAD_BALANCER_CONTROLLER not in accounts
    assert {EFS_CSI_CONTROLLER, CLUSTER_AUTOSCALER} <= accounts


def test_every_aws_resource_uses_the_stacks_regional_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """No resource may fall back to the default provider (and so to whatever region is ambient)."""
    import infra.render

    providers: dict[str, str] = {}
    make_mocks = infra.render._make_mocks

    def recording_providers(region: str, records: list[Any]) -> Any:
        mocks, monitor = make_mocks(region, records)
        new_resource = mocks.new_resource

        def new_resource_with_provider(args: Any) -> Any:
            if args.typ.startswith("aws:"):
                providers[f"{args.typ}::{args.name}"] = args.provider
            return new_resource(args)

        mocks.new_resource = new_resource_with_provider
        return mocks, monitor

    monkeypatch.setattr(infra.render, "_make_mocks", recording_providers)
    infra.render.render_stack("dev", allow_missing_charts=True)
    assert len(providers) == len(rendered("dev").aws_resources)
    assert {urn.split("::")[-2] for urn in providers.values()} == {"aws-provider"}


# ---------------------------------------------------------------- the vLLM image on a new node


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_gpu_nodes_pull_through_soci_parallel_mode_with_parallel_kubelet_pulls(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    for name, group in managed_gpu_groups(config):
        pull = group.image_pull
        node_config = _node_config(launch_template(render, name)["userData"])
        assert node_config["apiVersion"] == "node.eks.aws/v1alpha1" and node_config["kind"] == "NodeConfig"
        spec = node_config["spec"]
        assert spec["featureGates"] == {"FastImagePull": True}
        assert spec["kubelet"]["config"] == {
            "serializeImagePulls": False,
            "maxParallelImagePulls": pull.parallel_image_pulls,
        }
        containerd = spec["containerd"]["config"]
        assert containerd.splitlines() == [
            '[plugins."io.containerd.grpc.v1.cri"]',
            f"max_concurrent_downloads = {pull.max_concurrent_downloads}",
        ]
        # The pull is disk-bound in parallel mode: the root volume runs at the configured gp3 speed.
        (root,) = launch_template(render, name)["blockDeviceMappings"]
        assert root["ebs"]["throughput"] == pull.root_volume_throughput_mibps == 1000
        assert root["ebs"]["iops"] == pull.root_volume_iops == 16000
        assert "snapshotId" not in root["ebs"]


def test_node_config_leaves_out_what_is_switched_off() -> None:
    spec = _node_config(
        gpu_user_data(
            "g",
            _gpu_group(
                local_nvme={"enabled": False},
                image_pull={
                    "fast_image_pull": False,
                    "parallel_image_pulls": 1,
                    "max_concurrent_downloads": 3,
                },
            ),
        )
    )["spec"]
    assert "featureGates" not in spec and "kubelet" not in spec
    assert "max_concurrent_downloads = 3" in spec["containerd"]["config"]


def test_an_al2023_group_with_an_image_snapshot_mounts_it_as_containerds_root(tmp_path: Path) -> None:
    from tests.test_serving_render import render_variant

    snapshot = "snap-0123456789abcdef0"

    def with_snapshot(values: dict[str, Any]) -> None:
        values["node_groups"]["gpu"]["l40s"]["image_pull"] = {"image_snapshot_id": snapshot}

    render = render_variant(tmp_path, with_snapshot)
    template = launch_template(render, "l40s")
    root, image = template["blockDeviceMappings"]
    assert root["deviceName"] == "/dev/xvda" and "snapshotId" not in root["ebs"]
    assert image["deviceName"] == IMAGE_VOLUME_DEVICE
    assert image["ebs"]["snapshotId"] == snapshot
    assert image["ebs"]["encrypted"] == "true" and image["ebs"]["throughput"] == 1000
    kinds = [content_type for content_type, _ in _parts(template["userData"])]
    assert kinds == ["text/x-shellscript", "text/x-shellscript", "application/node.eks.aws"]
    volume_script = _parts(template["userData"])[1][1]
    assert f"DEVICE={IMAGE_VOLUME_DEVICE}\n" in volume_script and f"ROOT={CONTAINERD_ROOT}\n" in volume_script
    assert 'mount -o defaults,noatime "$DEVICE" "$ROOT"' in volume_script


def test_a_bottlerocket_group_gets_the_snapshot_as_its_data_volume_and_soci_settings_in_toml() -> None:
    import tomllib

    group = _gpu_group(
        ami_type="BOTTLEROCKET_x86_64_NVIDIA",
        local_nvme={"enabled": False},
        image_pull={"image_snapshot_id": "snap-0123456789abcdef0"},
    )
    (data,) = gpu_block_devices(group)
    assert data.device_name == "/dev/xvdb" and data.snapshot_id == "snap-0123456789abcdef0"
    assert data.mapping()["ebs"]["snapshot_id"] == "snap-0123456789abcdef0"
    settings = tomllib.loads(base64.b64decode(gpu_user_data("g", group)).decode())["settings"]
    assert settings["container-runtime"] == {"max-concurrent-downloads": 8, "snapshotter": "soci"}
    assert settings["container-runtime-plugins"]["soci-snapshotter"]["pull-mode"] == "parallel-pull-unpack"


def test_containerd_volume_script_is_valid_bash(tmp_path: Path) -> None:
    import shutil
    import subprocess

    bash = shutil.which("bash")
    assert bash is not None, "bash is needed to syntax-check the node script"
    path = tmp_path / "containerd-volume.sh"
    path.write_text(containerd_volume_script())
    result = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_user_data_with_nvme_and_image_settings_is_deterministic() -> None:
    text = al2023_user_data("/mnt/nvme", ImagePullConfig())
    assert al2023_user_data("/mnt/nvme", ImagePullConfig()) == text


@pytest.mark.parametrize(
    ("image_pull", "key", "message"),
    [
        (
            {"root_volume_throughput_mibps": 500},
            "root_volume_throughput_mibps",
            "pulls slower than a plain pull",
        ),
        (
            {"root_volume_throughput_mibps": 1000, "root_volume_iops": 3000},
            "root_volume_iops",
            "at least 4000",
        ),
        ({"image_snapshot_id": "ami-0123456789abcdef0"}, "image_snapshot_id", "snap-"),
    ],
)
def test_image_pull_settings_that_cannot_work_are_refused(
    image_pull: dict[str, Any], key: str, message: str
) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        _gpu_group(image_pull=image_pull)
    assert key in str(caught.value) and message in str(caught.value)
    # A slow volume is fine without SOCI's parallel mode.
    _gpu_group(
        image_pull={"fast_image_pull": False, "root_volume_throughput_mibps": 500, "root_volume_iops": 3000}
    )
