"""Issue 15's other findings, as the rendered stacks fix them (docs/security.md lists each one)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.cluster_addons import EFS_STORAGE_CLASS
from components.vllm_pod import KEEP_ALIVE_ENV
from infra.aws.karpenter import karpenter_node_role_name, runs_karpenter
from infra.render import RenderResult
from tests.conftest import rendered
from tests.test_addons_cluster import release
from tests.test_aws_layer import EKS_STACKS, one
from tests.test_serving_render import config_of, container, pod_spec, render_variant

PSA = "pod-security.kubernetes.io"


def _policy(render: RenderResult, type_: str, name: str) -> dict[str, Any]:
    policy = one(render, type_, name)["policy"]
    return json.loads(policy) if isinstance(policy, str) else policy


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_efs_takes_only_tls_iam_mounts_by_the_node_role_and_never_root(stack: str) -> None:
    render = rendered(stack)
    statements = {
        s["Sid"]: s
        for s in _policy(render, "aws:efs/fileSystemPolicy:FileSystemPolicy", "aws-storage-efs")["Statement"]
    }
    deny = statements["DenyInsecureTransport"]
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    allow = statements["MountAndWriteByClusterNodesThroughMountTargets"]
    # Only the node role (the mocks name a role's ARN after its resource): the EFS CSI node plugin
    # mounts with the node's identity; no pod role, no account-wide grant.
    # With Karpenter pools, also the role of the nodes Karpenter launches (infra/aws/karpenter.py).
    roles = ["arn:aws:iam::123456789012:role/aws-nodes-role"]
    if runs_karpenter(config := config_of(render)):
        roles.append(f"arn:aws:iam::123456789012:role/{karpenter_node_role_name(config.cluster.name)}")
    assert allow["Principal"]["AWS"] == roles
    assert set(allow["Action"]) == {"elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite"}
    # No statement grants root access, so root on a client is squashed.
    assert not any("ClientRootAccess" in json.dumps(s) for s in statements.values() if s["Effect"] == "Allow")
    [storage_class] = render.find("StorageClass", EFS_STORAGE_CLASS)
    assert storage_class["mountOptions"] == ["tls", "iam"]


def test_the_alb_tls_policy_has_no_cbc_suites(stack_render: RenderResult) -> None:
    for ingress in stack_render.find("Ingress"):
        policy = ingress["metadata"]["annotations"]["alb.ingress.kubernetes.io/ssl-policy"]
        # AWS's "-Res-" policies are the restricted variants: TLS 1.2 with GCM suites only, and TLS 1.3.
        assert policy == "ELBSecurityPolicy-TLS13-1-2-Res-2021-06"


def test_vllm_keeps_connections_open_longer_than_the_load_balancer(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        env = {e["name"]: e.get("value") for e in container(pod_spec(stack_render, model.name))["env"]}
        assert int(env[KEEP_ALIVE_ENV]) > config.ingress.idle_timeout_seconds


def test_only_the_preloader_gets_iam_credentials(stack_render: RenderResult) -> None:
    config = config_of(stack_render)
    for model in config.models:
        (workload,) = [
            obj
            for kind in ("Deployment", "Rollout")
            for obj in stack_render.find(kind, "vllm", model.namespace)
        ]
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations["eks.amazonaws.com/skip-containers"] == "vllm"


def test_model_namespaces_enforce_restricted_pod_security_unless_nvme_needs_a_host_path(
    stack_render: RenderResult,
) -> None:
    config = config_of(stack_render)
    for model in config.models:
        [namespace] = stack_render.find("Namespace", model.namespace)
        labels = namespace["metadata"]["labels"]
        nvme = config.node_groups.gpu[model.gpu_group].local_nvme.enabled
        uses_host_path = any("hostPath" in v for v in pod_spec(stack_render, model.name)["volumes"])
        assert nvme == uses_host_path
        assert labels[f"{PSA}/enforce"] == ("privileged" if nvme else "restricted")
        assert labels[f"{PSA}/warn"] == labels[f"{PSA}/audit"] == "restricted"
        assert labels[f"{PSA}/enforce-version"] == f"v{config.cluster.kubernetes_version}"


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_the_alb_class_admits_only_platform_namespaces_into_the_stack_group(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    params = release(render, "aws-load-balancer-controller")["values"]["ingressClassParams"]
    assert params["create"] is True
    platform_namespaces = {"matchLabels": {"app.kubernetes.io/part-of": "vllm-platform"}}
    assert params["spec"]["namespaceSelector"] == platform_namespaces
    assert params["spec"]["group"] == {"name": f"{config.cluster.name}-models"}
    assert params["spec"]["scheme"] == config.ingress.scheme
    for model in config.models:
        [namespace] = render.find("Namespace", model.namespace)
        assert namespace["metadata"]["labels"]["app.kubernetes.io/part-of"] == "vllm-platform"


def test_a_waf_acl_is_attached_when_configured(tmp_path: Any) -> None:
    arn = "arn:aws:wafv2:us-west-2:123456789012:regional/webacl/llm-rate-limit/0a1b2c3d"

    def waf(values: dict[str, Any]) -> None:
        values["ingress"] = {**values.get("ingress", {}), "wafv2_acl_arn": arn}

    for ingress in render_variant(tmp_path, waf).find("Ingress"):
        assert ingress["metadata"]["annotations"]["alb.ingress.kubernetes.io/wafv2-acl-arn"] == arn


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_kms_keys_have_explicit_policies_and_the_bucket_key_works_only_through_s3(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    for name in ("aws-eks-secrets", "aws-storage-bucket"):
        statements = _policy(render, "aws:kms/key:Key", name)["Statement"]
        assert statements[0]["Principal"] == {"AWS": "arn:aws:iam::123456789012:root"}
    bucket_key = _policy(render, "aws:kms/key:Key", "aws-storage-bucket")["Statement"]
    [only_s3] = [s for s in bucket_key if s["Effect"] == "Deny"]
    assert "kms:Decrypt" in only_s3["Action"] and only_s3["Principal"] == {"AWS": "*"}
    assert only_s3["Condition"] == {
        "StringNotEquals": {"kms:ViaService": f"s3.{config.cluster.region}.amazonaws.com"}
    }


@pytest.mark.parametrize("stack", EKS_STACKS)
def test_vpc_flow_logs_are_on_by_default(stack: str) -> None:
    render = rendered(stack)
    config = config_of(render)
    flow_log = one(render, "aws:ec2/flowLog:FlowLog", "aws-network-flow-logs")
    assert flow_log["trafficType"] == "ALL"
    assert flow_log["logDestinationType"] == "cloud-watch-logs"
    group = one(render, "aws:cloudwatch/logGroup:LogGroup", "aws-network-flow-logs")
    assert group["retentionInDays"] == config.cluster.vpc_flow_log_retention_days
    role = one(render, "aws:iam/role:Role", "aws-network-flow-logs")
    trust = json.loads(role["assumeRolePolicy"])
    assert trust["Statement"][0]["Principal"] == {"Service": "vpc-flow-logs.amazonaws.com"}


def test_vpc_flow_logs_can_be_switched_off(tmp_path: Any) -> None:
    def off(values: dict[str, Any]) -> None:
        values["cluster"] = {**values["cluster"], "vpc_flow_logs": False}

    assert render_variant(tmp_path, off).aws("aws:ec2/flowLog:FlowLog") == []
