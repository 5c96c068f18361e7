"""Karpenter GPU pools (issue 41): the NodePool and EC2NodeClass each pool renders, the serving pods'
protection, the add-ons that follow the pool's nodes, and the AWS pieces under Pulumi mocks and moto.

The objects are checked against the pinned chart's CRD schemas in tests/test_custom_resources.py and
applied to a real API server (CEL rules included) with the real Karpenter in
tests/test_deploy_karpenter.py; here, what they must say.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from components.gpu_addons import device_plugin_values, image_prepull_daemonset_spec
from components.karpenter import DO_NOT_DISRUPT_ANNOTATION, ec2_node_class, node_pool
from domain.config.cluster import GpuNodeGroupConfig, NodeGroupsConfig
from domain.config.platform import ImagePrepullConfig, NvidiaDevicePluginConfig
from domain.gpu_nodes import gpu_node_labels
from domain.labels import GPU_GROUP_LABEL
from infra.aws.karpenter import (
    INTERRUPTION_EVENTS,
    controller_policy,
    interruption_queue_policy,
    karpenter_node_role_name,
)
from infra.aws.node_groups import node_group_specs
from infra.aws.policies import AwsLocation
from infra.render import PLACEHOLDER_ACCOUNT_ID, RenderResult
from tests.conftest import rendered

LOCATION = AwsLocation(partition="aws", region="us-west-2", account_id=PLACEHOLDER_ACCOUNT_ID)


def _pool(**karpenter: Any) -> GpuNodeGroupConfig:
    return GpuNodeGroupConfig.model_validate(
        {
            "provisioner": "karpenter",
            "instance_types": ["p5.4xlarge", "p5.48xlarge"],
            "max_size": 2,
            "labels": {"vllm-platform/provisioner": "karpenter"},
            "karpenter": karpenter,
        }
    )


def _render_path(render: RenderResult, kind: str, name: str) -> dict[str, Any]:
    (obj,) = render.find(kind, name)
    return obj


# ---------------------------------------------------------------- the NodePool


def test_node_pool_launches_only_the_groups_types_in_the_given_capacity_types() -> None:
    pool = node_pool("h100", _pool(capacity_types=["spot", "on-demand"]))
    requirements = {r["key"]: r for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert requirements["node.kubernetes.io/instance-type"]["values"] == ["p5.4xlarge", "p5.48xlarge"]
    assert requirements["karpenter.sh/capacity-type"]["values"] == ["spot", "on-demand"]
    assert all(r["operator"] == "In" for r in requirements.values())


def test_node_pool_carries_the_taints_and_labels_a_managed_group_would() -> None:
    group = _pool()
    template = node_pool("h100", group)["spec"]["template"]
    assert template["metadata"]["labels"] == gpu_node_labels("h100", group)
    assert template["metadata"]["labels"][GPU_GROUP_LABEL] == "h100"
    assert template["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]


def test_node_pool_limit_is_in_gpus_max_size_times_the_largest_node_unless_set() -> None:
    assert node_pool("h100", _pool())["spec"]["limits"] == {"nvidia.com/gpu": "16"}
    assert node_pool("h100", _pool(max_gpus=8))["spec"]["limits"] == {"nvidia.com/gpu": "8"}


def test_node_pool_disruption_removes_only_empty_nodes_and_never_bounds_a_serving_pods_drain() -> None:
    spec = node_pool("h100", _pool(consolidate_after_seconds=120, expire_after_hours=None))["spec"]
    assert spec["disruption"] == {
        "consolidationPolicy": "WhenEmpty",
        "consolidateAfter": "120s",
        "budgets": [{"nodes": "10%"}],
    }
    assert spec["template"]["spec"]["expireAfter"] == "Never"
    # terminationGracePeriod would let drift and expiry delete do-not-disrupt pods (validate refuses it).
    assert "terminationGracePeriod" not in spec["template"]["spec"]


def test_node_pool_points_at_its_own_ec2_node_class_or_the_named_one() -> None:
    ref = node_pool("h100", _pool())["spec"]["template"]["spec"]["nodeClassRef"]
    assert ref == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "h100"}
    named = _pool(node_class={"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"})
    ref = node_pool("h100", named)["spec"]["template"]["spec"]["nodeClassRef"]
    assert ref == {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}


# ---------------------------------------------------------------- the EC2NodeClass


def test_ec2_node_class_uses_the_nvidia_ami_alias_discovery_tags_and_the_node_role() -> None:
    spec = ec2_node_class("h100", _pool(ami_version="v20261105"), "vllm-prod", "vllm-prod-karpenter-node")[
        "spec"
    ]
    assert spec["amiSelectorTerms"] == [{"alias": "al2023@v20261105"}]
    assert spec["role"] == "vllm-prod-karpenter-node"
    discovery = [{"tags": {"karpenter.sh/discovery": "vllm-prod"}}]
    assert spec["subnetSelectorTerms"] == discovery and spec["securityGroupSelectorTerms"] == discovery
    assert spec["metadataOptions"]["httpTokens"] == "required"
    assert spec["metadataOptions"]["httpPutResponseHopLimit"] == 1


def test_ec2_node_class_assembles_the_nvme_model_cache_as_the_managed_groups_do() -> None:
    spec = ec2_node_class("h100", _pool(), "vllm-prod", "role")["spec"]
    assert "MOUNT_PATH=/mnt/nvme\n" in spec["userData"]
    assert "kind: NodeConfig" in spec["userData"]
    (root,) = spec["blockDeviceMappings"]
    assert root["rootVolume"] is True and root["ebs"]["throughput"] == 1000


def test_ec2_node_class_names_reservations_and_the_placement_group() -> None:
    group = _pool(
        capacity_types=["reserved", "on-demand"],
        capacity_reservation_ids=["cr-0123456789abcdef0"],
        placement_group="vllm-prod-h100",
    )
    spec = ec2_node_class("h100", group, "vllm-prod", "role")["spec"]
    assert spec["capacityReservationSelectorTerms"] == [{"id": "cr-0123456789abcdef0"}]
    assert spec["placementGroupSelector"] == {"name": "vllm-prod-h100"}
    assert "capacityReservationSelectorTerms" not in ec2_node_class("h100", _pool(), "c", "role")["spec"]


# ---------------------------------------------------------------- config


def test_reserved_needs_a_reservation_and_karpenters_order() -> None:
    with pytest.raises(ValidationError, match="capacity_reservation_ids"):
        _pool(capacity_types=["reserved"])
    with pytest.raises(ValidationError, match="in that order"):
        _pool(capacity_types=["on-demand", "reserved"], capacity_reservation_ids=["cr-1"])


def test_a_pool_keeps_no_minimum_of_nodes() -> None:
    with pytest.raises(ValidationError, match="min_size must be 0"):
        GpuNodeGroupConfig.model_validate(
            {"provisioner": "karpenter", "instance_types": ["g6e.xlarge"], "min_size": 1}
        )


def test_a_pool_and_a_managed_group_may_live_together_with_labels_of_their_own() -> None:
    groups = NodeGroupsConfig.model_validate(
        {"gpu": {"managed": {"instance_types": ["g6e.xlarge"]}, "pool": _pool().model_dump()}}
    )
    specs = {spec.name for spec in node_group_specs("vllm-dev", groups)}
    assert specs == {"system", "managed"}, "a pool is no managed node group"


# ---------------------------------------------------------------- the rendered staging stack


@pytest.fixture(scope="module")
def staging() -> RenderResult:
    return rendered("staging")


def test_staging_serves_a_model_on_a_karpenter_pool(staging: RenderResult) -> None:
    pool = _render_path(staging, "NodePool", "l40s")
    assert pool["spec"]["template"]["spec"]["requirements"][0]["values"] == ["g6e.12xlarge", "g6e.24xlarge"]
    node_class = _render_path(staging, "EC2NodeClass", "l40s")
    assert node_class["spec"]["role"] == karpenter_node_role_name("vllm-staging")
    assert not [r for r in staging.aws("aws:eks/nodeGroup:NodeGroup") if r.name == "aws-nodes-l40s"]


def test_only_pods_on_a_pool_carry_do_not_disrupt(staging: RenderResult) -> None:
    annotations = {
        deployment["metadata"]["namespace"]: deployment["spec"]["template"]["metadata"]["annotations"]
        for deployment in staging.find("Deployment")
        if deployment["metadata"]["name"] == "vllm"
    }
    assert annotations["vllm-qwen2-5-7b-tp2"][DO_NOT_DISRUPT_ANNOTATION] == "true"  # on the l40s pool
    assert DO_NOT_DISRUPT_ANNOTATION not in annotations["vllm-llama-3-1-8b"]  # on the managed h200 group


def test_device_plugin_and_image_prepull_follow_the_pools_nodes() -> None:
    groups = {"pool": _pool(), "managed": GpuNodeGroupConfig(instance_types=["g6e.xlarge"])}
    pool_labels = node_pool("pool", groups["pool"])["spec"]["template"]["metadata"]["labels"]

    def selects_pool(affinity: dict[str, Any]) -> bool:
        terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        return all(
            pool_labels.get(expression["key"]) in expression["values"]
            for term in terms
            for expression in term["matchExpressions"]
        )

    assert selects_pool(device_plugin_values(groups, NvidiaDevicePluginConfig(enabled=True))["affinity"])
    prepull = image_prepull_daemonset_spec(groups, ImagePrepullConfig(enabled=True))
    assert selects_pool(prepull["template"]["spec"]["affinity"])


def test_the_karpenter_chart_runs_with_this_clusters_queue_and_irsa_role(staging: RenderResult) -> None:
    [deployment] = [
        item.object
        for item in staging.chart_objects
        if item.release == "karpenter" and item.kind == "Deployment"
    ]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CLUSTER_NAME"] == "vllm-staging"
    assert env["INTERRUPTION_QUEUE"] == "vllm-staging"
    [account] = [
        item.object
        for item in staging.chart_objects
        if item.release == "karpenter" and item.kind == "ServiceAccount"
    ]
    assert account["metadata"]["name"] == "karpenter"
    assert "eks.amazonaws.com/role-arn" in account["metadata"]["annotations"]


# ---------------------------------------------------------------- the AWS layer (Pulumi mocks)


def test_staging_builds_the_interruption_queue_and_its_five_rules(staging: RenderResult) -> None:
    [queue] = staging.aws("aws:sqs/queue:Queue")
    assert queue.inputs["name"] == "vllm-staging"
    assert queue.inputs["sqsManagedSseEnabled"] is True
    rules = staging.aws("aws:cloudwatch/eventRule:EventRule")
    patterns = sorted(json.loads(rule.inputs["eventPattern"])["detail-type"][0] for rule in rules)
    assert patterns == sorted(detail for _, detail in INTERRUPTION_EVENTS.values())
    targets = staging.aws("aws:cloudwatch/eventTarget:EventTarget")
    assert len(targets) == len(rules)


def test_staging_tags_subnets_and_security_group_for_discovery(staging: RenderResult) -> None:
    tags = [t.inputs for t in staging.aws("aws:ec2/tag:Tag") if t.inputs["key"] == "karpenter.sh/discovery"]
    assert {t["value"] for t in tags} == {"vllm-staging"}
    assert len(tags) == 3 + 1  # one private subnet per zone, the cluster security group


def test_controller_may_pass_only_the_pools_node_role() -> None:
    statements = {s["Sid"]: s for s in controller_policy(LOCATION, "vllm-prod")["Statement"]}
    assert statements["AllowPassingInstanceRole"]["Resource"] == (
        f"arn:aws:iam::{PLACEHOLDER_ACCOUNT_ID}:role/vllm-prod-karpenter-node"
    )
    assert statements["AllowInterruptionQueueActions"]["Resource"].endswith(":vllm-prod")
    for sid in ("AllowScopedDeletion", "AllowScopedEC2LaunchTemplateAccessActions"):
        assert statements[sid]["Condition"]["StringEquals"] == {
            "aws:ResourceTag/kubernetes.io/cluster/vllm-prod": "owned"
        }


def test_node_role_name_fits_iam() -> None:
    assert len(karpenter_node_role_name("c" * 40)) <= 64


# ---------------------------------------------------------------- the same documents in moto


@mock_aws
def test_aws_accepts_the_policies_queue_and_rules() -> None:
    """moto's IAM policy validator, SQS and EventBridge take the documents as the stack writes them."""
    iam = boto3.client("iam", region_name="us-west-2")
    iam.create_policy(
        PolicyName="karpenter", PolicyDocument=json.dumps(controller_policy(LOCATION, "vllm-prod"))
    )
    sqs = boto3.client("sqs", region_name="us-west-2")
    url = sqs.create_queue(QueueName="vllm-prod", Attributes={"MessageRetentionPeriod": "300"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(interruption_queue_policy(arn))})
    events = boto3.client("events", region_name="us-west-2")
    for kind, (source, detail_type) in INTERRUPTION_EVENTS.items():
        events.put_rule(
            Name=kind, EventPattern=json.dumps({"source": [source], "detail-type": [detail_type]})
        )
        events.put_targets(Rule=kind, Targets=[{"Id": "KarpenterInterruptionQueueTarget", "Arn": arn}])
    assert len(events.list_rules()["Rules"]) == len(INTERRUPTION_EVENTS)
    policy = json.loads(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"]["Policy"]
    )
    assert policy["Statement"][1]["Effect"] == "Deny"


# ---------------------------------------------------------------- the KWOK provider's instance types


def test_kwok_instance_types_declare_the_pools_gpus_and_efa_in_each_zone_and_capacity_type() -> None:
    from infra.stack_checks import load_stack
    from tests.cluster.karpenter import instance_types
    from tests.cluster.nodes import availability_zones

    config = load_stack("staging")
    types = {entry["name"]: entry for entry in instance_types(config)}
    assert set(types) == {"g6e.12xlarge", "g6e.24xlarge"}
    assert types["g6e.12xlarge"]["resources"]["nvidia.com/gpu"] == "4"
    assert types["g6e.24xlarge"]["resources"]["vpc.amazonaws.com/efa"] == "2"
    offered = {
        tuple(r["values"][0] for r in offering["Requirements"])
        for offering in types["g6e.12xlarge"]["offerings"]
    }
    zones = availability_zones(config)
    assert offered == {(capacity, zone) for capacity in ("spot", "on-demand") for zone in zones}


# ---------------------------------------------------------------- the plan


def test_plan_tells_where_a_replicas_node_comes_from_and_how_long_it_takes() -> None:
    from domain.capacity.plan import plan_platform
    from infra.stack_checks import load_stack

    plan = plan_platform(load_stack("staging"))
    pool = plan.models["qwen2-5-7b-tp2"]
    assert pool.node_source is not None and pool.node_source.provisioner == "karpenter"
    assert pool.node_source.instance_types == (("g6e.12xlarge", 4), ("g6e.24xlarge", 4))
    assert pool.node_source.capacity_types == ("spot", "on-demand")
    assert pool.node_source.gpu_limit == 8
    assert pool.node_source.new_node_seconds == pool.serving.new_node.seconds()
    node_steps = [step.name for step in pool.serving.new_node.steps if step.stage == "node"]
    assert node_steps[0] == "Karpenter batches the pending pod and creates a NodeClaim"
    managed = plan.models["llama-3-1-8b"]
    assert managed.node_source is not None and managed.node_source.provisioner == "managed"
    assert next(s.name for s in managed.serving.new_node.steps if s.stage == "node") == (
        "the Cluster Autoscaler sees the pending pod"
    )
    # A to-zero model on a pool expects the new-node wake: a pool keeps no node without pods.
    assert pool.wake.expected_case == "new_node"
