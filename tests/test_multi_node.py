"""Replicas larger than one node (issue 42): the parallelism config and what `validate` refuses, the
vLLM multi-node arguments of leader and worker, the LeaderWorkerSet and its EFA wiring, and the AWS
layer of a multi-node group (under Pulumi mocks: nothing here reaches AWS).

The stack is stacks/Pulumi.multinode.yaml (Llama-3.1-405B over two p5.48xlarge), varied.
"""

from __future__ import annotations

import base64
import math
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import server_auth
from components.gpu_addons import GPU_ADDONS_NAMESPACE, IMAGE_PREPULL_NAME
from components.helm.lock import load_lock
from components.leader_worker_set import (
    EFA_RESOURCE,
    LWS_API_VERSION,
    LWS_KIND,
    RESTART_POLICY,
    STARTUP_POLICY,
    WORKER_INDEX_LABEL,
)
from components.multi_node_addons import efa_device_plugin_values, lws_controller_values
from components.vllm_arguments import (
    LEADER_WORKER_SET_NAME,
    NodeRole,
    build_server_arguments,
    validation_node_roles,
)
from components.vllm_pod import SERVER_NAME
from domain.capacity.plan import plan_platform
from domain.capacity.time_to_serve import group_join_timeout_seconds
from domain.catalogue.efa_interfaces import efa_instance_types, max_efa_interfaces
from domain.config import ConfigError
from domain.config.loader import STACKS_DIR
from domain.node_user_data import EFA_MEMLOCK_DROP_IN, efa_memlock_script
from domain.versions import LWS_CONTROLLER_IMAGE, VLLM_EFA_IMAGE, VLLM_IMAGE
from domain.vllm_flags import check_server_arguments
from infra.images import inventory
from infra.render import RenderResult, render_stack
from infra.stack_checks import load_stack
from tests.conftest import rendered
from tests.support.charts import data_values, require_chart_data
from tests.support.stack_files import on_an_existing_cluster

MULTINODE_STACK = STACKS_DIR / "Pulumi.multinode.yaml"
NAMESPACE = "vllm-llama-3-1-405b"


def multinode_render() -> RenderResult:
    return rendered("multinode", MULTINODE_STACK)


def stack_data() -> dict[str, Any]:
    return yaml.safe_load(MULTINODE_STACK.read_text())


def problems_of(tmp_path: Path, change) -> str:
    """Validate the multinode stack after `change(config)`; the error message (it must fail)."""
    data = stack_data()
    change(data["config"])
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        load_stack("multinode", stack_file=path)
    return str(caught.value)


def model_of(config: dict[str, Any]) -> dict[str, Any]:
    return config["vllm-platform:models"][0]


def group_of(config: dict[str, Any]) -> dict[str, Any]:
    return config["vllm-platform:node_groups"]["gpu"]["h100"]


# --- config and validate ------------------------------------------------------------------------


def test_the_multinode_stack_validates_and_derives_tensor_by_node_and_pipeline_by_nodes() -> None:
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    (model,) = config.models
    assert model.is_multi_node and model.nodes_per_replica == 2
    assert (model.tensor_parallel_size, model.pipeline_parallel_size, model.data_parallel_size) == (8, 2, 1)
    assert model.gpus_per_group == 16


def test_a_one_node_model_keeps_tensor_parallel_over_its_gpus() -> None:
    config = load_stack("prod")
    for model in config.models:
        assert not model.is_multi_node
        assert model.tensor_parallel_size == model.gpus_per_replica
        assert model.pipeline_parallel_size == 1


@pytest.mark.parametrize(
    ("change", "key_path", "fragment"),
    [
        pytest.param(
            lambda c: model_of(c)["parallelism"].update(tensor_parallel_size=4),
            "models[0].parallelism",
            "tensor 4 × pipeline 2 × data 1 = 8 GPUs, but one replica has 16",
            id="product-does-not-match-the-gpus",
        ),
        pytest.param(
            lambda c: model_of(c)["parallelism"].update(tensor_parallel_size=16, pipeline_parallel_size=1),
            "models[0].parallelism.tensor_parallel_size",
            "tensor_parallel_across_nodes: true to mean it",
            id="tensor-parallel-across-nodes-unasked",
        ),
        pytest.param(
            lambda c: (
                group_of(c).update(instance_types=["g6e.4xlarge"], max_size=2)
                or model_of(c).update(gpus_per_replica=1)
                or model_of(c)["parallelism"].update(tensor_parallel_size=1, pipeline_parallel_size=2)
            ),
            "node_groups.gpu.h100.instance_types",
            "has no EFA",
            id="group-without-efa",
        ),
        pytest.param(
            lambda c: group_of(c).update(min_size=0, desired_size=1, max_size=1),
            "node_groups.gpu.h100.max_size",
            "needs 2 nodes for one replica",
            id="max-size-below-one-replica",
        ),
        pytest.param(
            lambda c: (
                model_of(c).update(gpus_per_replica=4)
                or model_of(c)["parallelism"].update(tensor_parallel_size=4, pipeline_parallel_size=2)
            ),
            "models[0].gpus_per_replica",
            "one pod per node holding every GPU of it",
            id="pod-not-a-whole-node",
        ),
        pytest.param(
            lambda c: (
                model_of(c)["parallelism"].update(
                    tensor_parallel_size=6,
                    pipeline_parallel_size=1,
                    data_parallel_size=1,
                )
                or model_of(c)["parallelism"].update(tensor_parallel_across_nodes=True)
            ),
            "models[0].parallelism",
            "= 6 GPUs, but one replica has 16",
            id="product-short-with-across-nodes",
        ),
        pytest.param(
            lambda c: (
                group_of(c).update(max_size=4)
                or model_of(c)["parallelism"].update(
                    nodes_per_replica=4,
                    data_parallel_size=2,
                    tensor_parallel_size=8,
                    pipeline_parallel_size=2,
                )
            ),
            "models[0].parallelism",
            "each data-parallel rank must lie on one node, whole: tensor 8 × pipeline 2",
            id="data-parallel-rank-spanning-nodes",
        ),
        pytest.param(
            lambda c: model_of(c)["parallelism"].update(expert_parallel=True),
            "models[0].parallelism.expert_parallel",
            "expert parallelism is for MoE models",
            id="expert-parallel-on-dense",
        ),
        pytest.param(
            lambda c: (
                group_of(c).update(max_size=3)
                or model_of(c)["parallelism"].update(
                    nodes_per_replica=3, tensor_parallel_size=3, pipeline_parallel_size=8
                )
            ),
            "models[0].parallelism.tensor_parallel_size",
            "choose a divisor",
            id="tensor-group-does-not-tile-a-node",
        ),
        pytest.param(
            lambda c: model_of(c).update(autoscaling={"enabled": True, "max_replicas": 2}),
            "models[0].autoscaling.max_replicas",
            "holds at most 1 replicas",
            id="autoscaled-groups-beyond-the-group",
        ),
    ],
)
def test_validate_refuses_a_topology_that_cannot_work(
    tmp_path: Path, change, key_path: str, fragment: str
) -> None:
    message = problems_of(tmp_path, change)
    assert f"vllm-platform:{key_path}" in message, message
    assert fragment in message, message


def test_heads_that_do_not_divide_over_tensor_parallelism_are_refused(tmp_path: Path) -> None:
    # 405B has 128 query heads and 8 KV heads: tensor parallel 16 across both nodes splits them, but
    # a model of 120 heads (8 KV heads) does not split over 16.
    def change(config: dict[str, Any]) -> None:
        model = model_of(config)
        model["architecture"].update(num_attention_heads=120, num_key_value_heads=8, hidden_size=15360)
        model["parallelism"].update(
            tensor_parallel_size=16, pipeline_parallel_size=1, tensor_parallel_across_nodes=True
        )

    message = problems_of(tmp_path, change)
    assert "num_attention_heads 120 is not divisible by 16" in message, message


def test_experts_that_do_not_divide_over_the_expert_parallel_ranks_are_refused(tmp_path: Path) -> None:
    def change(config: dict[str, Any]) -> None:
        model = model_of(config)
        model["architecture"].update(num_experts=12, num_experts_per_token=2, moe_intermediate_size=2048)
        model["parallelism"].update(expert_parallel=True)

    message = problems_of(tmp_path, change)
    assert "vllm-platform:models[0].parallelism.expert_parallel" in message
    assert "12 experts do not divide over 8 expert-parallel ranks" in message, message


def test_pipeline_parallelism_on_one_node_is_refused_by_the_schema(tmp_path: Path) -> None:
    def change(config: dict[str, Any]) -> None:
        model_of(config)["parallelism"] = {"pipeline_parallel_size": 2}

    message = problems_of(tmp_path, change)
    assert "models[0].parallelism.pipeline_parallel_size" in message
    assert "across nodes only" in message


def test_tensor_parallel_size_on_one_node_must_be_the_pods_gpus(tmp_path: Path) -> None:
    def change(config: dict[str, Any]) -> None:
        model_of(config)["parallelism"] = {"tensor_parallel_size": 4}

    message = problems_of(tmp_path, change)
    assert "vllm-platform:models[0].parallelism.tensor_parallel_size" in message
    assert "tensor parallel over its gpus_per_replica 8 GPUs" in message


def test_replica_bound_counts_whole_groups(tmp_path: Path) -> None:
    message = problems_of(tmp_path, lambda c: model_of(c).update(replicas=2))
    assert "vllm-platform:models[0].replicas" in message
    assert "holds at most 1 replicas" in message, message


# --- the EFA table ------------------------------------------------------------------------------


def test_every_instance_type_with_efa_here_is_one_the_efa_device_plugin_chart_supports() -> None:
    """The device plugin's own list of EFA instance types (its chart's values, read from the pinned
    chart data) must contain every row of our table: a row it lacks is a typo or a wrong claim."""
    require_chart_data()
    entry = load_lock()["aws-efa-k8s-device-plugin"]
    supported = set(data_values(entry)["supportedInstanceLabels"]["values"])
    assert set(efa_instance_types()) <= supported, set(efa_instance_types()) - supported
    assert max_efa_interfaces("p5.48xlarge") == 32 and max_efa_interfaces("g6e.2xlarge") == 0


# --- the vLLM arguments -------------------------------------------------------------------------


def test_leader_and_worker_arguments_pass_the_pinned_vllm_flag_check() -> None:
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    (model,) = config.models
    roles = validation_node_roles(model)
    assert [role.leader for role in roles if role] == [True, False]
    for role in roles:
        arguments = build_server_arguments(model, "/mnt/models/x/r", node_role=role)
        assert check_server_arguments(arguments) == [], arguments
    leader, worker = (build_server_arguments(model, "/m", node_role=role) for role in roles)
    assert "--headless" in worker and "--headless" not in leader
    # The same command but for the role: the worker's is the leader's plus --headless, rank 1.
    assert [t for t in worker if t != "--headless"] == [("1" if t == "0" else t) for t in leader]


def test_a_multi_node_model_cannot_be_built_without_its_role() -> None:
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    with pytest.raises(ValueError, match="pass its node_role"):
        build_server_arguments(config.models[0], "/m")


def test_the_leader_address_the_check_assumes_is_the_one_lws_gives_the_rendered_set() -> None:
    assert LEADER_WORKER_SET_NAME == SERVER_NAME
    (lws,) = multinode_render().find(LWS_KIND, SERVER_NAME, NAMESPACE)
    assert lws["metadata"]["name"] == LEADER_WORKER_SET_NAME


# --- the LeaderWorkerSet ------------------------------------------------------------------------


def autoscaled_render(tmp_path: Path, **autoscaling: Any) -> RenderResult:
    """The multinode stack with its model autoscaled (`autoscaling` over enabled: true), KEDA and the
    Prometheus Adapter on, and a group that keeps its two nodes (min_size 2)."""
    data = stack_data()
    config = data["config"]
    model_of(config).pop("replicas", None)
    model_of(config)["autoscaling"] = {"enabled": True, **autoscaling}
    group_of(config)["min_size"] = 2
    config["vllm-platform:addons"] = {"keda": True, "prometheus_adapter": True}
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return render_stack("multinode", stack_file=path, allow_missing_charts=True)


def _lws() -> dict[str, Any]:
    (lws,) = multinode_render().find(LWS_KIND, SERVER_NAME, NAMESPACE)
    return lws


def _server(template: dict[str, Any]) -> dict[str, Any]:
    return template["spec"]["containers"][0]


def test_one_leader_worker_set_replaces_the_deployment_of_a_multi_node_model() -> None:
    render = multinode_render()
    assert render.find("Deployment", SERVER_NAME, NAMESPACE) == []
    lws = _lws()
    assert lws["apiVersion"] == LWS_API_VERSION
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == RESTART_POLICY == "RecreateGroupAfterStart"
    assert lws["spec"]["startupPolicy"] == STARTUP_POLICY == "LeaderCreated"
    assert lws["spec"]["replicas"] == 1
    assert lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxUnavailable": 1,
        "maxSurge": 0,
    }


def test_leader_and_worker_run_the_rendered_arguments_with_the_lws_variables() -> None:
    template = _lws()["spec"]["leaderWorkerTemplate"]
    leader, worker = _server(template["leaderTemplate"]), _server(template["workerTemplate"])
    for server in (leader, worker):
        args = server["args"]
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert args[args.index("--master-addr") + 1] == "$(LWS_LEADER_ADDRESS)"
        assert args[args.index("--nnodes") + 1] == "2"
        assert args[args.index("--tensor-parallel-size") + 1] == "8"
        assert args[args.index("--pipeline-parallel-size") + 1] == "2"
        assert args[args.index("--distributed-executor-backend") + 1] == "mp"
    assert [t for t in worker["args"] if t != "--headless"] == leader["args"]
    assert "--headless" in worker["args"]
    # The same arguments with the values LWS's webhook gives the variables pass the flag check.
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    (model,) = config.models
    address = f"{SERVER_NAME}-0.{SERVER_NAME}.{model.namespace}"
    for server, rank in ((leader, "0"), (worker, "1")):
        expanded = [
            t.replace("$(LWS_WORKER_INDEX)", rank).replace("$(LWS_LEADER_ADDRESS)", address)
            for t in server["args"]
        ]
        assert check_server_arguments(expanded) == []


def test_members_wait_for_each_other_through_the_plans_start_up_skew_not_torchs_600_s() -> None:
    """Issue 50: with PyTorch's default (600 s) a warm member gave up at vLLM's rendezvous while a
    member on a new node was still launching, pulling and copying. Both roles carry the plan's
    `--distributed-timeout-seconds` (new-node minus warm-node time, times the safety factor, plus the
    rendezvous allowance) and the gloo groups' timeout no shorter."""
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    (model,) = config.models
    plan = plan_platform(config).models[model.name]
    skew = plan.serving.new_node.seconds() - plan.serving.warm_node.seconds()
    assert skew > 600  # a new p5 node's launch, image pull and 810 GB copy: the case it is for
    expected = math.ceil(skew * model.startup.safety_factor) + model.startup.group_rendezvous_seconds
    assert plan.group_join_timeout_seconds == expected
    template = _lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        args = _server(template[role])["args"]
        assert args[args.index("--distributed-timeout-seconds") + 1] == str(expected)
        assert int(args[args.index("--cpu-distributed-timeout-seconds") + 1]) == max(expected, 1800)
    # Never below PyTorch's own default, and nothing on a one-node model.
    assert (
        group_join_timeout_seconds(
            model, plan.startup, replace(plan.serving, new_node=plan.serving.warm_node)
        )
        == 600
    )
    dev = load_stack("dev")
    assert plan_platform(dev).models[dev.models[0].name].group_join_timeout_seconds is None


def test_every_member_asks_for_all_the_nodes_efa_devices_and_carries_the_efa_environment() -> None:
    template = _lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        server = _server(template[role])
        assert server["resources"]["requests"][EFA_RESOURCE] == "32"
        assert server["resources"]["limits"][EFA_RESOURCE] == "32"
        assert server["resources"]["limits"]["nvidia.com/gpu"] == "8"
        env = {e["name"]: e.get("value") for e in server["env"]}
        assert env["NCCL_NET"] == "AWS Libfabric" and env["FI_PROVIDER"] == "efa"
        # p5's EFA has RDMA read (GPUDirect through libfabric); no huge pages (not requested: issue 50).
        assert env["FI_EFA_USE_DEVICE_RDMA"] == "1" and env["FI_EFA_USE_HUGE_PAGE"] == "0"
        # Each member offers the others its pod IP for vLLM's queues between nodes (the e2e test
        # shows a group without it never forms where vLLM cannot guess an address).
        (host,) = [e for e in server["env"] if e["name"] == "VLLM_HOST_IP"]
        assert host["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        anti = template[role]["spec"]["affinity"]["podAntiAffinity"]
        assert (
            anti["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
            == "kubernetes.io/hostname"
        )
        # The shared model cache is preloaded on every node of the group.
        assert [c["name"] for c in template[role]["spec"]["initContainers"]]


def test_readiness_is_the_leaders_api_and_workers_serve_none() -> None:
    template = _lws()["spec"]["leaderWorkerTemplate"]
    leader, worker = _server(template["leaderTemplate"]), _server(template["workerTemplate"])
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(leader)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "ports"} & set(worker)


def test_service_and_router_select_group_leaders_only() -> None:
    render = multinode_render()
    (service,) = render.find("Service", SERVER_NAME, NAMESPACE)
    assert service["spec"]["selector"][WORKER_INDEX_LABEL] == "0"
    routers = [d for d in render.find("Deployment") if d["metadata"]["namespace"] == "vllm-router"]
    arguments = [
        a for d in routers for c in d["spec"]["template"]["spec"]["containers"] for a in c.get("args", [])
    ]
    assert f"{WORKER_INDEX_LABEL}=0" in arguments


def test_group_members_may_reach_each_other_through_the_network_policies() -> None:
    render = multinode_render()
    (policy,) = render.find("NetworkPolicy", "allow-group-members", NAMESPACE)
    pods = policy["spec"]["podSelector"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": pods}]}]
    assert policy["spec"]["egress"] == [{"to": [{"podSelector": pods}]}]


def test_the_gpu_quota_counts_every_node_of_a_group() -> None:
    (quota,) = multinode_render().find("ResourceQuota", None, NAMESPACE)
    # One group (2 nodes × 8 GPUs) plus one group being replaced.
    assert quota["spec"]["hard"]["requests.nvidia.com/gpu"] == "32"


def test_one_node_stacks_render_no_leader_worker_set_and_no_multi_node_addons() -> None:
    render = rendered("prod")
    assert render.find(LWS_KIND) == []
    assert not [r for r in render.helm_releases if r["name"] in ("lws", "aws-efa-k8s-device-plugin")]


# --- the add-ons ----------------------------------------------------------------------------------


def test_the_lws_controller_and_efa_plugin_are_released_with_values_from_config() -> None:
    releases = {r["name"]: r for r in multinode_render().helm_releases}
    lws = releases["lws"]
    assert lws["namespace"] == "lws-system"
    assert lws["values"] == lws_controller_values()
    assert lws["values"]["image"]["manager"]["tag"] == LWS_CONTROLLER_IMAGE.tag != "main"
    efa = releases["aws-efa-k8s-device-plugin"]
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    assert efa["values"] == efa_device_plugin_values(config)
    assert efa["values"]["supportedInstanceLabels"] == {
        "keys": ["vllm-platform/gpu-group"],
        "values": ["h100"],
    }
    assert efa["values"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ]
    assert ".dkr.ecr.us-west-2.amazonaws.com/" in efa["values"]["image"]["repository"]


def test_a_cluster_that_runs_its_own_lws_controller_gets_no_lws_release_but_still_the_set(
    tmp_path: Path,
) -> None:
    data = stack_data()
    config = data["config"]
    config["vllm-platform:addons"] = {"leader_worker_set": False}
    # A cluster of its own (mode existing): in mode eks nothing else would install LWS, and validate
    # refuses it (tests/bad-stacks/eks-multi-node-without-the-lws-controller.yaml).
    on_an_existing_cluster(
        config, name="own-lws", context="own-lws", ingress_cidrs=["10.0.200.0/24", "10.0.201.0/24"]
    )
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    render = render_stack("multinode", stack_file=path, allow_missing_charts=True)
    names = [r["name"] for r in render.helm_releases]
    assert "lws" not in names and "aws-efa-k8s-device-plugin" in names, names
    assert len(render.find(LWS_KIND, SERVER_NAME, NAMESPACE)) == 1
    assert load_stack("multinode", stack_file=MULTINODE_STACK).addons.leader_worker_set.enabled is True


# --- the AWS layer (Pulumi mocks) ---------------------------------------------------------------


def _aws(render: RenderResult, type_: str, name: str) -> dict[str, Any]:
    (inputs,) = [r.inputs for r in render.aws(type_) if r.name == name]
    return inputs


def test_a_multi_node_group_gets_every_efa_interface_one_zone_and_a_cluster_placement_group() -> None:
    render = multinode_render()
    template = _aws(render, "aws:ec2/launchTemplate:LaunchTemplate", "aws-nodes-h100")
    interfaces = template["networkInterfaces"]
    assert len(interfaces) == 32
    assert [(i["networkCardIndex"], i["deviceIndex"]) for i in interfaces] == [(0, 0)] + [
        (c, 1) for c in range(1, 32)
    ]
    assert interfaces[0]["interfaceType"] == "efa"
    assert {i["interfaceType"] for i in interfaces[1:]} == {"efa-only"}
    placement = _aws(render, "aws:ec2/placementGroup:PlacementGroup", "aws-nodes-h100-placement")
    assert placement["strategy"] == "cluster"
    assert template["placement"]["groupName"]
    group = _aws(render, "aws:eks/nodeGroup:NodeGroup", "aws-nodes-h100")
    system = _aws(render, "aws:eks/nodeGroup:NodeGroup", "aws-nodes-system")
    assert len(group["subnetIds"]) == 1 and len(system["subnetIds"]) == 2
    assert group["subnetIds"][0] in system["subnetIds"]


def test_efa_nodes_carry_the_cluster_group_and_an_all_traffic_self_referencing_group() -> None:
    render = multinode_render()
    ingress = _aws(
        render, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "aws-nodes-efa-self-ingress"
    )
    egress = _aws(
        render, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "aws-nodes-efa-self-egress"
    )
    for rule in (ingress, egress):
        assert rule["ipProtocol"] == "-1"
        assert rule["referencedSecurityGroupId"] == rule["securityGroupId"]
    template = _aws(render, "aws:ec2/launchTemplate:LaunchTemplate", "aws-nodes-h100")
    for interface in template["networkInterfaces"]:
        assert ingress["securityGroupId"] in interface["securityGroups"]
        assert len(interface["securityGroups"]) == 2  # and EKS's cluster security group


def test_one_node_groups_keep_their_plain_launch_template() -> None:
    render = rendered("prod")
    for resource in render.aws("aws:ec2/launchTemplate:LaunchTemplate"):
        assert "networkInterfaces" not in resource.inputs and "placement" not in resource.inputs
    assert render.aws("aws:ec2/placementGroup:PlacementGroup") == []


# --- the plan -------------------------------------------------------------------------------------


def test_the_plan_sizes_each_gpu_by_its_largest_pipeline_stage() -> None:
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    plan = plan_platform(config).models["llama-3-1-405b"]
    assert plan.fits
    # 405B in BF16 is ~810 GB: half the layers on each node, split over 8 GPUs, is ~50 GB per GPU;
    # on one node (TP 8, no pipeline) it would be twice that and could not fit an 80 GB H100.
    assert 45e9 < plan.weight_bytes_per_gpu < 56e9


def test_the_pinned_lws_crd_schema_refuses_what_the_controller_would_not_know() -> None:
    """The CRD check (tests/test_custom_resources.py) over the LeaderWorkerSet is not vacuous: a restart
    policy LWS v0.10.0 does not define fails it."""
    import jsonschema

    from tests.test_custom_resources import _schema_for

    require_chart_data()
    lws = _lws()
    broken = {
        **lws,
        "spec": {
            **lws["spec"],
            "leaderWorkerTemplate": {**lws["spec"]["leaderWorkerTemplate"], "restartPolicy": "Always"},
        },
    }
    assert list(jsonschema.Draft7Validator(_schema_for(lws)).iter_errors(lws)) == []
    assert list(jsonschema.Draft7Validator(_schema_for(broken)).iter_errors(broken))


def test_the_real_pinned_vllm_parser_accepts_the_rendered_leader_and_worker_arguments() -> None:
    """vLLM 0.32.0's own `vllm serve` parser (the CPU build's venv, as tests/test_tensor_parallel.py
    uses it) over the rendered arguments, the LWS variables expanded as the kubelet would."""
    from tests.support.vllm_server import check_many_with_real_vllm

    template = _lws()["spec"]["leaderWorkerTemplate"]
    address = f"{SERVER_NAME}-0.{SERVER_NAME}.{NAMESPACE}"
    lists = [
        [
            t.replace("$(LWS_WORKER_INDEX)", rank).replace("$(LWS_LEADER_ADDRESS)", address)
            for t in _server(template[role])["args"]
        ]
        for role, rank in (("leaderTemplate", "0"), ("workerTemplate", "1"))
    ]
    assert check_many_with_real_vllm(lists) == [None, None]


# --- autoscaling whole groups ---------------------------------------------------------------------


def test_keda_scales_whole_groups_through_the_leader_worker_set_and_counts_leaders_only(
    tmp_path: Path,
) -> None:
    render = autoscaled_render(
        tmp_path, backend="keda", min_replicas=0, max_replicas=1, wake_hold_seconds=1200
    )
    (lws,) = render.find(LWS_KIND, SERVER_NAME, NAMESPACE)
    # Created at zero: a to-zero group boots no GPU node on the first `up` (the count is KEDA's after).
    assert lws["spec"]["replicas"] == 0
    (scaled,) = render.find("ScaledObject", None, NAMESPACE)
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "name": SERVER_NAME,
    }
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["name"] != "router_demand"]
    assert queries
    for query in queries:
        # Leaders are `<name>-<group>`, workers `<name>-<group>-<worker>`: only leaders match.
        assert f'pod=~"{SERVER_NAME}-[0-9]+"' in query, query
        assert f'pod=~"{SERVER_NAME}-.+"' not in query, query


def test_an_hpa_scales_the_leader_worker_set_and_no_up_resets_its_count(tmp_path: Path) -> None:
    render = autoscaled_render(tmp_path, backend="hpa", min_replicas=1, max_replicas=1)
    (lws,) = render.find(LWS_KIND, SERVER_NAME, NAMESPACE)
    # The HPA owns spec.replicas (the LWS's /scale): `up` leaves it unset, so it never resets a count.
    assert "replicas" not in lws["spec"]
    (hpa,) = render.find("HorizontalPodAutoscaler", None, NAMESPACE)
    assert hpa["spec"]["scaleTargetRef"]["kind"] == LWS_KIND
    assert hpa["spec"]["scaleTargetRef"]["apiVersion"] == LWS_API_VERSION


def test_the_wake_of_a_group_waits_for_its_members_at_the_rendezvous() -> None:
    config = load_stack("multinode", stack_file=MULTINODE_STACK)
    (model,) = config.models
    plan = plan_platform(config).models[model.name]
    for case in (plan.serving.warm_node, plan.serving.new_node):
        (step,) = [s for s in case.steps if s.name == "the group's members join the leader's engine"]
        assert step.seconds == model.startup.group_rendezvous_seconds
    one_node = load_stack("dev")
    for case_plan in plan_platform(one_node).models.values():
        assert not [s for s in case_plan.serving.warm_node.steps if "rendezvous" in s.source]


# --- a multi-node group on a Karpenter pool ------------------------------------------------------------


def karpenter_pool_render(tmp_path: Path) -> RenderResult:
    data = stack_data()
    config = data["config"]
    group_of(config)["provisioner"] = "karpenter"
    group_of(config)["karpenter"] = {"expire_after_hours": None}  # a group pool's nodes never expire
    config["vllm-platform:addons"] = {"karpenter": {"enabled": True}}
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return render_stack("multinode", stack_file=path, allow_missing_charts=True)


def test_a_multi_node_karpenter_pool_launches_where_a_managed_multi_node_group_does(tmp_path: Path) -> None:
    """One subnet (one zone), a cluster placement group of the AWS layer's, the EFA security group
    beside the discovered ones; no managed group for it; every member asks for the EFA devices (what
    makes Karpenter attach EFA interfaces) and is not disrupted by Karpenter."""
    render = karpenter_pool_render(tmp_path)
    (node_class,) = render.find("EC2NodeClass", "h100")
    spec = node_class["spec"]
    placement = _aws(render, "aws:ec2/placementGroup:PlacementGroup", "aws-nodes-h100-placement")
    assert placement["strategy"] == "cluster"
    assert spec["placementGroupSelector"]["name"]
    (subnet,) = spec["subnetSelectorTerms"]
    system = _aws(render, "aws:eks/nodeGroup:NodeGroup", "aws-nodes-system")
    assert subnet["id"] == system["subnetIds"][0]
    ingress = _aws(
        render, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "aws-nodes-efa-self-ingress"
    )
    terms = spec["securityGroupSelectorTerms"]
    assert {"id": ingress["securityGroupId"]} in terms
    assert {"tags": {"karpenter.sh/discovery": "vllm-multinode"}} in terms
    assert "aws-nodes-h100" not in [r.name for r in render.aws("aws:eks/nodeGroup:NodeGroup")]
    (lws,) = render.find(LWS_KIND, SERVER_NAME, NAMESPACE)
    for role in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"][role]
        assert _server(template)["resources"]["requests"][EFA_RESOURCE] == "32"
        assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"


def test_a_one_node_karpenter_pool_keeps_its_discovered_subnets_and_no_placement_group() -> None:
    (node_class,) = rendered("staging").find("EC2NodeClass", "l40s")
    spec = node_class["spec"]
    assert spec["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "vllm-staging"}}]
    assert "placementGroupSelector" not in spec


# --- data and expert parallelism across nodes --------------------------------------------------------


def _moe_data_parallel(config: dict[str, Any], *, expert_parallel: bool) -> None:
    """DeepSeek-V2-Lite (64 routed experts) over the two nodes as two data-parallel ranks of tensor 8."""
    model = model_of(config)
    model["architecture"] = {"preset": "deepseek-v2-lite"}
    model["parallelism"] = {
        "nodes_per_replica": 2,
        "data_parallel_size": 2,
        "expert_parallel": expert_parallel,
    }
    model["vllm"] = {"max_model_len": 8192, "max_num_seqs": 64}


def _load_changed(tmp_path: Path, change) -> Any:
    data = stack_data()
    change(data["config"])
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_stack("multinode", stack_file=path)


def test_data_parallel_ranks_are_left_to_vllm_to_infer_from_the_node_rank(tmp_path: Path) -> None:
    """vLLM 0.32.0 infers a node's data-parallel ranks from --node-rank and uses --master-addr as the
    data-parallel address (engine/arg_utils.py): the pods carry `--data-parallel-size` and nothing
    per node but the rank LWS gives; `validate` (which ran in load_stack) had the pinned parser accept
    the leader's and the worker's arguments."""
    config = _load_changed(tmp_path, lambda c: _moe_data_parallel(c, expert_parallel=True))
    (model,) = config.models
    assert (model.tensor_parallel_size, model.pipeline_parallel_size, model.data_parallel_size) == (8, 1, 2)
    for leader in (True, False):
        args = build_server_arguments(model, "/m", node_role=NodeRole.in_pod(leader=leader))
        assert args[args.index("--data-parallel-size") + 1] == "2"
        assert args[args.index("--pipeline-parallel-size") + 1] == "1"
        assert args[args.index("--node-rank") + 1] == "$(LWS_WORKER_INDEX)"
        assert "--enable-expert-parallel" in args
        assert not {
            "--data-parallel-start-rank",
            "--data-parallel-size-local",
            "--data-parallel-address",
        } & set(args)
        assert ("--headless" in args) is not leader
    for role in validation_node_roles(model):
        assert role is not None
        arguments = build_server_arguments(model, "/m", node_role=role)
        assert check_server_arguments(arguments) == [], arguments


def test_expert_parallelism_over_data_ranks_gives_each_gpu_its_share_of_the_experts(tmp_path: Path) -> None:
    with_ep = plan_platform(_load_changed(tmp_path, lambda c: _moe_data_parallel(c, expert_parallel=True)))
    without = plan_platform(_load_changed(tmp_path, lambda c: _moe_data_parallel(c, expert_parallel=False)))
    (ep,), (tp_only,) = with_ep.models.values(), without.models.values()
    # Without expert parallelism each rank holds every expert, split over its 8 tensor ranks; with it,
    # half of them (32 of 64 per rank), so the routed experts' bytes per GPU halve.
    assert ep.weight_bytes_per_gpu < tp_only.weight_bytes_per_gpu
    assert (ep.data_parallel_size, ep.expert_parallel) == (2, True)
    assert ep.kv_cache.tokens > tp_only.kv_cache.tokens  # the memory freed goes to the KV cache


def test_a_tenants_default_share_counts_every_data_parallel_engine_of_a_group(tmp_path: Path) -> None:
    """The default share of a tenant on a shared model splits the engine slots at the fewest replicas
    (issue 40). A data-parallel group runs `data_parallel_size` engines, each with `max_num_seqs`
    slots, behind its leader's one API: counting one engine per group would admit half of what the
    group serves at once."""
    from domain.config.tenants import default_max_concurrent_requests

    def shared_by_two_tenants(config: dict[str, Any]) -> None:
        _moe_data_parallel(config, expert_parallel=True)
        served = model_of(config)["served_model_name"]
        config["vllm-platform:tenants"] = [
            {"name": name, "models": [served], "api_key_secrets": [{"name": f"vp/multinode/{name}"}]}
            for name in ("search", "research")
        ]

    config = _load_changed(tmp_path, shared_by_two_tenants)
    (model,) = config.models
    groups = model.replicas
    assert groups >= 1 and model.data_parallel_size == 2
    expected = groups * 2 * model.vllm.max_num_seqs // 2
    assert default_max_concurrent_requests(config, model) == expected
    tenants = server_auth.tenants_document(config, model)["tenants"]
    # The leader runs an API-server process per data-parallel rank (vLLM 0.32.0's default, issue 49),
    # and the two count one share together: the pod's share is the limit over the fewest groups.
    assert model.api_server_count == 2
    assert tenants["research"]["max_in_flight"] == server_auth.in_flight_share(expected, model)
    assert server_auth.in_flight_share(expected, model) == -(-expected // groups)


def test_libfabric_is_told_to_use_device_rdma_only_where_the_efa_device_has_it() -> None:
    """Issue 50: `FI_EFA_USE_DEVICE_RDMA=1` on an EFA device without RDMA read (g5/g6/g6e) aborts the
    provider (fi_efa(7)); the catalogue says which types have it, every EFA type is classified."""
    from components.leader_worker_set import efa_environment
    from domain.catalogue.efa_interfaces import efa_instance_types, supports_device_rdma

    assert {t for t in efa_instance_types() if supports_device_rdma(t)} == {
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
    }
    assert not any(
        supports_device_rdma(t) for t in ("g5.48xlarge", "g6.48xlarge", "g6e.48xlarge", "m7i.large")
    )
    for rdma, expected in ((True, "1"), (False, "0")):
        env = {e["name"]: e["value"] for e in efa_environment(rdma)}
        assert env["FI_EFA_USE_DEVICE_RDMA"] == expected and env["FI_EFA_USE_HUGE_PAGE"] == "0"
        assert [e["name"] for e in efa_environment(rdma)] == sorted(env)


def test_an_efa_group_tells_the_cluster_autoscaler_its_efa_interfaces_to_scale_from_zero() -> None:
    """Issue 50: with no node to look at, the Cluster Autoscaler knows only the resources the node-template
    tags name; a group's pods request every EFA interface (Pulumi mocks: the rendered Auto Scaling tags)."""
    from tests.test_aws_layer import autoscaler_tags_of

    prefix = "k8s.io/cluster-autoscaler/node-template/resources"
    tags = autoscaler_tags_of(multinode_render(), "h100")
    assert tags[f"{prefix}/vpc.amazonaws.com/efa"] == "32" and tags[f"{prefix}/nvidia.com/gpu"] == "8"
    # A GPU group without multi-node models promises no EFA.
    assert not [key for key in autoscaler_tags_of(rendered("prod"), "h200") if key.endswith("/efa")]


@pytest.mark.parametrize(
    ("groups", "min_available", "max_unavailable"), [(1, 1, 1), (2, 1, 1), (3, 1, 2), (3, 2, 1), (3, 3, 1)]
)
def test_a_groups_budget_counts_groups_not_pods(
    groups: int, min_available: int, max_unavailable: int
) -> None:
    """Issue 50: three groups with min_available 2 rendered minAvailable 2 over six pods whose workers
    are always Ready, so a drain could take one member of every group. Now at most (groups -
    min_available) pods at a time (each takes at most one group), one when that would allow none."""
    from components.guardrails import pod_disruption_budget_spec

    (model,) = load_stack("multinode", stack_file=MULTINODE_STACK).models
    varied = model.model_copy(update={"replicas": groups, "min_available": min_available})
    spec = pod_disruption_budget_spec(varied)
    assert spec["maxUnavailable"] == max_unavailable and "minAvailable" not in spec
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_a_worker_outlives_its_leaders_whole_drain() -> None:
    """Issue 50: a group's pods stop together; a worker that stopped after the preStop sleep alone
    took a rank from the leader's engine while the leader's streams were still finishing."""
    from components.probes import termination_grace_period_seconds

    template = _lws()["spec"]["leaderWorkerTemplate"]
    leader_pod, worker_pod = template["leaderTemplate"]["spec"], template["workerTemplate"]["spec"]
    (model,) = load_stack("multinode", stack_file=MULTINODE_STACK).models
    leader_drain = model.drain.pre_stop_sleep_seconds + model.drain.shutdown_timeout_seconds
    assert _server(template["leaderTemplate"])["lifecycle"]["preStop"]["sleep"]["seconds"] < leader_drain
    assert _server(template["workerTemplate"])["lifecycle"]["preStop"]["sleep"]["seconds"] == leader_drain
    assert leader_pod["terminationGracePeriodSeconds"] == termination_grace_period_seconds(model.drain)
    assert worker_pod["terminationGracePeriodSeconds"] > leader_drain
    assert worker_pod["terminationGracePeriodSeconds"] >= leader_pod["terminationGracePeriodSeconds"]


def _on_a_pool(config: dict[str, Any], **pool: Any) -> None:
    group_of(config)["provisioner"] = "karpenter"
    group_of(config)["karpenter"] = pool
    config["vllm-platform:addons"] = {"karpenter": {"enabled": True}}


def test_nodes_that_go_away_on_their_own_are_refused_for_groups(tmp_path: Path) -> None:
    """Issue 50: spot and Karpenter's forceful expiry each stop a whole group (and every group of a
    pool expires together); refused with the key and the fix."""
    spot = problems_of(tmp_path, lambda c: group_of(c).update(capacity_type="spot"))
    assert "node_groups.gpu.h100.capacity_type" in spot and "use on_demand" in spot
    pool_spot = problems_of(
        tmp_path, lambda c: _on_a_pool(c, capacity_types=["spot", "on-demand"], expire_after_hours=None)
    )
    assert "karpenter.capacity_types" in pool_spot and "remove spot" in pool_spot
    expiring = problems_of(tmp_path, lambda c: _on_a_pool(c))  # the default: 720 h
    assert "karpenter.expire_after_hours = 720" in expiring and "expire_after_hours: null" in expiring
    data = stack_data()
    _on_a_pool(data["config"], expire_after_hours=None)
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_stack("multinode", stack_file=path).models


def test_a_groups_members_share_a_zone_and_groups_do_not_have_to() -> None:
    """Issue 50: in mode `existing` the deploy test found every group split across zones (EFA does
    not cross them). Required pod affinity on the zone, over the model's pods of the member's own
    group (LWS's group-key label, added to the selector by matchLabelKeys)."""
    template = _lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        (term,) = template[role]["spec"]["affinity"]["podAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "topology.kubernetes.io/zone"
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        assert "leaderworkerset.sigs.k8s.io/group-key" not in term["labelSelector"]["matchLabels"]


# --- the serving image: EFA userspace (issue 50) -------------------------------------------------


def test_a_multi_node_model_runs_the_pinned_efa_image_by_default_and_a_one_node_model_the_stock_one() -> None:
    template = _lws()["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        assert _server(template[role])["image"] == VLLM_EFA_IMAGE.reference
    efa = VLLM_EFA_IMAGE.efa
    assert efa is not None and VLLM_IMAGE.efa is None
    # What NCCL loads between nodes, recorded with the pin (serving-image/README.md).
    assert (efa.libfabric_version, efa.aws_ofi_nccl_version, efa.nccl_version) == (
        "2.6.0amzn1.0",
        "1.21.1",
        "2.29.7",
    )
    for model in load_stack("prod").models:
        assert model.serving_image == VLLM_IMAGE.reference


def test_the_image_prepull_pulls_the_efa_image_where_a_multi_node_model_runs() -> None:
    (daemonset,) = multinode_render().find("DaemonSet", IMAGE_PREPULL_NAME, GPU_ADDONS_NAMESPACE)
    pulls = daemonset["spec"]["template"]["spec"]["initContainers"]
    assert [c["image"] for c in pulls] == [VLLM_EFA_IMAGE.reference]
    # The inventory a mirror copies lists the image the members themselves pull.
    (use,) = [u for u in inventory(multinode_render()) if u.reference == VLLM_EFA_IMAGE.reference]
    assert f"LeaderWorkerSet {NAMESPACE}/{SERVER_NAME}" in use.users


def test_a_multi_node_model_on_an_image_not_known_to_carry_efa_is_refused(tmp_path: Path) -> None:
    message = problems_of(tmp_path, lambda c: model_of(c).update(image=VLLM_IMAGE.reference))
    assert "models[0].image" in message
    assert "not known to carry them" in message and VLLM_EFA_IMAGE.reference in message
    assert "image_carries_efa: true" in message


@pytest.mark.parametrize(
    ("image", "acknowledged"),
    [
        pytest.param(VLLM_EFA_IMAGE.reference, False, id="the-pinned-efa-image-by-tag"),
        pytest.param(f"{VLLM_EFA_IMAGE.reference}@sha256:{'a' * 64}", False, id="the-same-tag-by-digest"),
        pytest.param(
            "registry.example.com/mirror/vllm-openai-efa:0.32.0-1", True, id="a-mirror-said-to-carry-efa"
        ),
    ],
)
def test_a_multi_node_model_accepts_an_image_known_or_said_to_carry_efa(
    tmp_path: Path, image: str, acknowledged: bool
) -> None:
    data = stack_data()
    model_of(data["config"]).update(image=image, image_carries_efa=acknowledged)
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (model,) = load_stack("multinode", stack_file=path).models
    assert model.serving_image == image


def test_a_mirror_of_the_efa_image_without_the_acknowledgement_is_refused(tmp_path: Path) -> None:
    mirror = "registry.example.com/mirror/vllm-openai-efa:0.32.0-1"
    message = problems_of(tmp_path, lambda c: model_of(c).update(image=mirror))
    assert "models[0].image" in message and "image_carries_efa" in message


# --- locked memory on EFA nodes (issue 50) -------------------------------------------------------


def _memlock_scripts(user_data: str) -> list[str]:
    """The user-data scripts that write the containerd drop-in raising locked memory."""
    from tests.test_aws_layer import _parts

    # A launch template's is base64; an EC2NodeClass's is the MIME text itself.
    plain = user_data.startswith("Content-Type:")
    encoded = base64.b64encode(user_data.encode()).decode() if plain else user_data
    return [
        text
        for content_type, text in _parts(encoded)
        if content_type == "text/x-shellscript" and EFA_MEMLOCK_DROP_IN in text
    ]


def test_a_managed_efa_group_gives_containerd_and_so_its_members_unlimited_locked_memory() -> None:
    """libfabric's EFA provider needs unlimited locked memory and the members run as non-root with every
    capability dropped: the node's containerd carries LimitMEMLOCK=infinity, which runc hands to every
    container whose spec names no RLIMIT_MEMLOCK (Pulumi mocks: the rendered launch template)."""
    from tests.test_aws_layer import _node_config

    render = multinode_render()
    user_data = _aws(render, "aws:ec2/launchTemplate:LaunchTemplate", "aws-nodes-h100")["userData"]
    (script,) = _memlock_scripts(user_data)
    assert "[Service]\nLimitMEMLOCK=infinity\n" in script
    assert "systemctl daemon-reload" in script
    # Our NodeConfig leaves nodeadm's base runtime spec alone: no rlimit of ours replaces its list.
    assert "baseRuntimeSpec" not in _node_config(user_data)["spec"].get("containerd", {})
    (member,) = [_server(_lws()["spec"]["leaderWorkerTemplate"]["workerTemplate"])]
    assert member["securityContext"]["runAsNonRoot"] is True
    assert member["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_a_gpu_group_without_multi_node_models_keeps_the_default_locked_memory() -> None:
    render = rendered("prod")
    for template in render.aws("aws:ec2/launchTemplate:LaunchTemplate"):
        if template.inputs.get("userData"):
            assert _memlock_scripts(template.inputs["userData"]) == []


def test_a_karpenter_pool_of_a_multi_node_model_raises_locked_memory_in_its_node_class(
    tmp_path: Path,
) -> None:
    (node_class,) = karpenter_pool_render(tmp_path).find("EC2NodeClass", "h100")
    (script,) = _memlock_scripts(node_class["spec"]["userData"])
    assert "LimitMEMLOCK=infinity" in script
    (one_node,) = rendered("staging").find("EC2NodeClass", "l40s")
    assert _memlock_scripts(one_node["spec"]["userData"]) == []


def test_bottlerocket_efa_nodes_keep_their_own_unlimited_locked_memory(tmp_path: Path) -> None:
    """Bottlerocket makes RLIMIT_MEMLOCK unlimited where an EFA device is attached unless the setting
    max-locked-memory is given (schnauzer's oci_defaults helper): our settings never give it."""
    data = stack_data()
    group_of(data["config"]).update(ami_type="BOTTLEROCKET_x86_64_NVIDIA", local_nvme={"enabled": False})
    path = tmp_path / "Pulumi.multinode.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    render = render_stack("multinode", stack_file=path, allow_missing_charts=True)
    user_data = _aws(render, "aws:ec2/launchTemplate:LaunchTemplate", "aws-nodes-h100")["userData"]
    settings = base64.b64decode(user_data).decode()
    assert "[settings.container-runtime]" in settings
    assert "oci-defaults" not in settings and "locked-memory" not in settings


def test_the_memlock_script_passes_bash_and_shellcheck(tmp_path: Path) -> None:
    from tests.test_model_cache_release import shellcheck

    path = tmp_path / "efa-memlock.sh"
    path.write_text(efa_memlock_script())
    subprocess.run(["bash", "-n", str(path)], check=True)
    result = shellcheck(path)
    assert result.returncode == 0, result.stdout
