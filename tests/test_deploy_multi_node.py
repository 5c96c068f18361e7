"""A multi-node model on the real control plane, with the real LeaderWorkerSet controller (issue 42).

The stack is stacks/Pulumi.multinode.yaml (Llama-3.1-405B over two p5.48xlarge nodes per
replica, one LeaderWorkerSet group each) moved onto the fixture's cluster: mode `existing`, the
fixture's context, the GPU group at four nodes (room for a second group), system nodes big enough
for the router. The KWOK nodes declare what the pods ask for: 8 GPUs and 32 `vpc.amazonaws.com/efa`
each (tests/cluster/nodes.py), over two zones (mode `existing` has no placement group of ours), so
that a group split across zones would show (issue 50).

What runs: the API server (with webhook admission on), etcd, the scheduler, the controllers and KWOK
as in every deploy test; LWS's controller v0.10.0 as a process (tests/cluster/lws.py, from
$VLLM_PLATFORM_LWS_TOOLS, by default ../shared/tools/lws: the test is skipped, saying so, without it);
the real Pulumi engine and Kubernetes provider deploying the stack (tests/cluster/pulumi_project.py).

Webhooks, deliberately:
- LWS's own are required (API defaults, the LWS_* variables), so the API server keeps its webhook
  admission plugins on (`cluster_for(..., webhook_admission=True)`; every other deploy test keeps
  them off) and the test registers webhook configurations of ours calling the controller at
  https://127.0.0.1:19443 with the fixture CA's bundle.
- The stack leaves LWS's chart out (`addons.leader_worker_set: false`, what a cluster that runs its
  own controller sets). The chart's webhook configurations point at the in-cluster Service
  `lws-webhook-service`, which the API server dials at a Service IP no one answers in the network
  namespace: with admission on they would refuse the LeaderWorkerSet the same `up` creates. The chart
  has no value that leaves them out, the charts are never patched, and deleting them after `up` is too
  late (the set is created in the same `up`). Its controller Deployment would be only KWOK's anyway.
- Nothing else in this stack registers a webhook: monitoring is off (kube-prometheus-stack's operator
  webhooks and Prometheus Adapter's APIService), KEDA, Argo Rollouts and the AWS Load Balancer
  Controller are off as mode `existing` defaults them; the add-ons installed (NVIDIA device plugin,
  DCGM exporter, EFA device plugin, Secrets Store CSI driver with its AWS provider) register none.
  `test_the_only_webhooks_after_up_are_the_tests_own` checks it on the live cluster.

Steps (one module-scoped run; each test checks one):
    up → the group Running (leader and worker, one per node, on the GPU group) →
    preview --expect-no-changes →
    /scale of the LeaderWorkerSet 1 -> 2 (a second whole group) -> 1, as KEDA's operator or the HPA
    controller would write it, with the Eviction API at two groups between (one group down at a time) →
    a worker pod deleted: its whole group recreated (RecreateGroupAfterStart: new leader too) →
    the pre-flight's objects (`vllm-platform preflight`) applied on the two free GPU nodes, then deleted →
    a second group whose worker stays Pending while its leader reports a restart: left alone, then formed →
    KEDA's real operator (tests/cluster/control_plane.py) given the model's ScaledObject as
    components/autoscaling.py renders it for a to-zero group (its target the LeaderWorkerSet), the
    triggers swapped for KEDA's `kubernetes-workload` scaler since this cluster runs no Prometheus
    (demand = pods labelled `vllm-platform-test/demand`): no demand -> the set at 0 groups; a demand
    pod -> one whole group; the pod gone -> 0 again (KEDA's own 0 <-> 1 path through /scale; the
    1 -> N path reads its metrics adapter, which does not run here) →
    destroy: nothing of ours left.
The times are written to out/deploy-tests/multi-node.json (docs/multi-node.md quotes them).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.autoscaling import KEDA_API_VERSION, scaled_object_spec
from components.leader_worker_set import (
    CANARY_SET,
    EFA_RESOURCE,
    LWS_KIND,
    SET_NAME_LABEL,
    WORKER_INDEX_LABEL,
)
from components.preflight import NAME as PREFLIGHT_NAME
from components.preflight import preflight_namespace, preflight_objects
from components.rollouts import ANALYSIS_RUN_KIND, CANARY_SERVICE, STABLE_SERVICE, workload_reference
from components.vllm_pod import SERVER_NAME
from domain.config.autoscaling import AutoscalingConfig
from domain.config.loader import STACKS_DIR
from domain.config.models import ModelConfig
from domain.config.platform import PlatformConfig
from infra.render import render_stack
from infra.stack_checks import load_stack
from tests.cluster import tools
from tests.cluster.control_plane import (
    KEDA_NAMESPACE,
    Cluster,
    ClusterError,
    start_keda_operator,
    start_rollouts_controller,
)
from tests.cluster.fixtures import REPO, cluster_for, require_chart_cache, require_cluster_tools
from tests.cluster.lws import CONFIGURATION_NAME, install_lws_api, missing_reason, start_lws_controller
from tests.cluster.pulumi_project import write_project
from tests.support.charts import data_crds
from tests.support.stack_files import on_an_existing_cluster
from tests.test_deploy_pulumi import Deployer

pytestmark = pytest.mark.cluster

ARTEFACTS = REPO / "out" / "deploy-tests"
MULTINODE_STACK_FILE = STACKS_DIR / "Pulumi.multinode.yaml"
MODEL = "llama-3-1-405b"
NAMESPACE = f"vllm-{MODEL}"
GPU_GROUP = "h100"
GPU_NODES = 4
"""Two groups of two: the scaled-out step needs a second group's nodes."""
LWS = SERVER_NAME
"""The LeaderWorkerSet and its Service are named as a one-node model's Deployment is."""
GROUP_SIZE = 2
GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
NODE_GROUP_LABEL = "eks.amazonaws.com/nodegroup"
WAIT_SECONDS = 180


def _cluster_stack(path: Path) -> Path:
    """The multinode example on the fixture's cluster (the module's docstring says what changes)."""
    document = yaml.safe_load(MULTINODE_STACK_FILE.read_text())
    config = document["config"]
    on_an_existing_cluster(
        config,
        name="kwok-multinode",
        context="kwok-admin",
        ingress_cidrs=["10.20.200.0/24", "10.20.201.0/24"],
    )
    groups = config["vllm-platform:node_groups"]
    groups["system"] = {"instance_types": ["m7i.2xlarge"], "min_size": 3, "desired_size": 3, "max_size": 3}
    groups["gpu"][GPU_GROUP]["max_size"] = GPU_NODES
    config["vllm-platform:addons"] = {"leader_worker_set": False, "secrets_store_csi_driver": True}
    config["vllm-platform:monitoring"] = {"enabled": False}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _group_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        pod
        for pod in cluster.get("pods", namespace=NAMESPACE)
        if WORKER_INDEX_LABEL in pod["metadata"].get("labels", {})
        and not pod["metadata"].get("deletionTimestamp")
    ]


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")]


def _groups_running(cluster: Cluster, groups: int) -> list[dict[str, Any]] | None:
    """Every pod of `groups` whole groups Running, and no other group pod; else None."""
    pods = _group_pods(cluster)
    running = _running(pods)
    return running if len(pods) == len(running) == groups * GROUP_SIZE else None


def _endpoint_pods(cluster: Cluster) -> list[str]:
    """The pods behind the model's Service (its EndpointSlices' ready endpoints)."""
    slices = cluster.get_selected("endpointslices", f"kubernetes.io/service-name={LWS}")
    return sorted(
        endpoint["targetRef"]["name"]
        for item in slices
        if item["metadata"]["namespace"] == NAMESPACE
        for endpoint in item.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready") and endpoint.get("targetRef")
    )


def _leader_names(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods if p["metadata"]["labels"][WORKER_INDEX_LABEL] == "0")


def _snapshot(cluster: Cluster, pods: list[dict[str, Any]]) -> dict[str, Any]:
    with contextlib.suppress(ClusterError):  # bounded; the tests report what was found
        cluster.wait_for(
            "the Service's endpoints to be the leaders",
            lambda: _endpoint_pods(cluster) == _leader_names(pods),
            timeout=60,
        )
    return {
        "pods": pods,
        "endpoints": _endpoint_pods(cluster),
        "services": cluster.get("services", namespace=NAMESPACE),
    }


@pytest.fixture(scope="module")
def multi_node_run(tmp_path_factory):
    require_cluster_tools(("pulumi", "pulumi-resource-kubernetes"))
    reason = missing_reason()
    if reason:
        pytest.skip(f"the multi-node deploy test needs the LeaderWorkerSet controller: {reason}")
    require_chart_cache()
    workdir = tmp_path_factory.mktemp("multi-node")
    stack_file = _cluster_stack(workdir / "Pulumi.cluster.yaml")
    config = load_stack("cluster", stack_file=stack_file)
    observed: dict[str, Any] = {"times": {}}
    with cluster_for(config, workdir / "cluster", webhook_admission=True) as cluster:
        project = workdir / "project"
        write_project(project, stack_file, tools.program("pulumi-resource-kubernetes").parent)
        deployer = Deployer(cluster, project)
        start = time.monotonic()
        install_lws_api(cluster)
        start_lws_controller(cluster)
        observed["times"]["lws_controller_ready_seconds"] = round(time.monotonic() - start, 1)
        observed["nodes"] = {n["metadata"]["name"]: n for n in cluster.get("nodes")}
        try:
            _run(cluster, deployer, observed)
            if "recovery" in observed:
                _preflight_beside_the_group(cluster, config, observed)
                _a_member_restarts_while_another_is_pending(cluster, observed)
                _canary_beside_the_stable_group(cluster, workdir, observed)
                _keda_drives_whole_groups(cluster, config.models[0], observed)
        finally:
            start = time.monotonic()
            deployer.run("multi-node-9-destroy", "destroy")
            observed["times"]["destroy_seconds"] = round(time.monotonic() - start, 1)
            observed["after_destroy"] = _leftovers(cluster)
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        (ARTEFACTS / "multi-node.json").write_text(json.dumps(observed["times"], indent=2))
        yield deployer.results, observed


def _run(cluster: Cluster, deployer: Deployer, observed: dict[str, Any]) -> None:
    times = observed["times"]
    start = time.monotonic()
    if not deployer.run("multi-node-1-up", "up")["ok"]:
        return
    times["up_seconds"] = round(time.monotonic() - start, 1)
    observed["webhook_configurations"] = {
        kind: [item["metadata"]["name"] for item in cluster.get(kind)]
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
    }
    observed["lws"] = cluster.get("leaderworkerset", namespace=NAMESPACE, name=LWS)
    start = time.monotonic()
    try:
        pods = cluster.wait_for(
            "one whole group Running", lambda: _groups_running(cluster, 1), timeout=WAIT_SECONDS
        )
    except ClusterError as error:
        observed["group_error"] = f"{error}; pods: {_group_pods(cluster)}"
        return
    times["group_running_after_up_seconds"] = round(time.monotonic() - start, 1)
    # `up` does not wait for a custom resource's pods, and goes on creating other objects: the group's
    # own time is read from the API server's clock (whole seconds).
    times["group_ready_after_set_created_seconds"] = _ready_after(observed["lws"], pods)
    observed["one_group"] = _snapshot(cluster, pods)

    start = time.monotonic()
    deployer.run("multi-node-2-preview-no-changes", "preview", "--expect-no-changes")
    times["preview_seconds"] = round(time.monotonic() - start, 1)

    # 1 -> 2 -> 1 through /scale, the autoscaler's path (KEDA's operator, the HPA controller).
    for step, groups in (("scale_out", 2), ("scale_in", 1)):
        start = time.monotonic()
        cluster.kubectl("scale", f"leaderworkerset/{LWS}", "-n", NAMESPACE, f"--replicas={groups}")
        try:
            pods = cluster.wait_for(
                f"{groups} whole groups Running",
                lambda n=groups: _groups_running(cluster, n),
                timeout=WAIT_SECONDS,
            )
        except ClusterError as error:
            observed[f"{step}_error"] = f"{error}; pods: {_group_pods(cluster)}"
            return
        times[f"{step}_to_{groups}_seconds"] = round(time.monotonic() - start, 1)
        if step == "scale_out":
            observed["evictions"] = _evictions_across_two_groups(cluster, pods)
        observed[step] = {
            **_snapshot(cluster, pods),
            "scale": json.loads(
                cluster.kubectl(
                    "get",
                    "--raw",
                    f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NAMESPACE}/leaderworkersets/{LWS}/scale",
                ).stdout
            ),
        }

    # A worker lost: the whole group comes back, leader included.
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    worker = next(name for name in before if name != f"{LWS}-0")
    start = time.monotonic()
    cluster.kubectl("delete", "pod", worker, "-n", NAMESPACE, "--wait=false")

    def recreated() -> list[dict[str, Any]] | None:
        running = _groups_running(cluster, 1)
        if not running or {p["metadata"]["uid"] for p in running} & set(before.values()):
            return None
        return running

    try:
        pods = cluster.wait_for("the group recreated, every member new", recreated, timeout=WAIT_SECONDS)
    except ClusterError as error:
        observed["recovery_error"] = f"{error}; pods: {_group_pods(cluster)}"
        return
    times["group_recreated_after_worker_deleted_seconds"] = round(time.monotonic() - start, 1)
    observed["recovery"] = {"deleted": worker, "before": before, **_snapshot(cluster, pods)}


def _preflight_beside_the_group(cluster: Cluster, config: PlatformConfig, observed: dict[str, Any]) -> None:
    """`vllm-platform preflight`'s objects for the model, applied as a user would (`kubectl apply`),
    on the two GPU nodes the group leaves free; then its namespace deleted, as the docs say, before the
    canary needs those nodes."""
    model = config.models[0]
    objects = preflight_objects(config, model)
    namespace = preflight_namespace(model)
    start = time.monotonic()
    applied = cluster.apply_objects(objects)
    observed["preflight"] = {"apply": {"returncode": applied.returncode, "stderr": applied.stderr}}
    if applied.returncode != 0:
        return

    def placed() -> list[dict[str, Any]] | None:
        # KWOK runs a pod whose restartPolicy is Never to completion at once (Succeeded): placed and
        # started is what this control plane can show; what the script reports is for real nodes.
        pods = cluster.get("pods", namespace=namespace)
        started = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") != "Pending"]
        return pods if len(started) == GROUP_SIZE == len(pods) else None

    try:
        pods = cluster.wait_for("the pre-flight's pods placed and started", placed, timeout=WAIT_SECONDS)
    except ClusterError as error:
        observed["preflight"]["error"] = f"{error}; pods: {cluster.get('pods', namespace=namespace)}"
        return
    observed["times"]["preflight_placed_seconds"] = round(time.monotonic() - start, 1)
    observed["preflight"]["pods"] = pods
    observed["preflight"]["job"] = cluster.get("job", namespace=namespace, name=PREFLIGHT_NAME)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    with contextlib.suppress(ClusterError):
        cluster.wait_for(
            "the pre-flight's pods gone",
            lambda: not cluster.get("pods", namespace=namespace),
            timeout=WAIT_SECONDS,
        )
    observed["preflight"]["left"] = [p["metadata"]["name"] for p in cluster.get("pods", namespace=namespace)]


HELD_OBSERVATION_SECONDS = 10
"""How long the test watches a group that LWS must leave alone (bounded; LWS reacts to a pod's status
change within a second on this control plane: tests/test_deploy_multi_node.py's recreation step)."""


def _group_uids(cluster: Cluster, group: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in _group_pods(cluster)
        if p["metadata"]["labels"][GROUP_INDEX_LABEL] == group
    }


def _a_member_restarts_while_another_is_pending(cluster: Cluster, observed: dict[str, Any]) -> None:
    """Issue 50: a second group whose worker stays Pending (its only free node cordoned, as a node still
    launching or an image still pulling), while its leader's container restarts (restartCount 1, what
    the kubelet reports when vLLM exits at its rendezvous timeout). RESTART_POLICY
    (RecreateGroupAfterStart) must leave the group alone while a member is Pending, then let it form
    once the node comes, and not recreate it in a loop. The restart is written into the pod's status as
    the kubelet would (KWOK runs no containers); the decisions are LWS v0.10.0's own."""
    in_use = {p["spec"]["nodeName"] for p in _group_pods(cluster)}
    free = sorted(
        name
        for name, node in observed["nodes"].items()
        if node["metadata"]["labels"].get(NODE_GROUP_LABEL) == GPU_GROUP and name not in in_use
    )
    record: dict[str, Any] = {"free_nodes": free}
    observed["restart_while_pending"] = record
    if len(free) < GROUP_SIZE:
        record["error"] = f"fewer than {GROUP_SIZE} free GPU nodes: {free}"
        return
    held_node = free[1]
    cluster.kubectl("cordon", held_node)
    try:
        cluster.kubectl("scale", f"leaderworkerset/{LWS}", "-n", NAMESPACE, "--replicas=2")

        def leader_running_worker_pending() -> dict[str, Any] | None:
            pods = {p["metadata"]["name"]: p for p in _group_pods(cluster)}
            leader, worker = pods.get(f"{LWS}-1"), pods.get(f"{LWS}-1-1")
            if not leader or not worker or leader["status"].get("phase") != "Running":
                return None
            return leader if worker["status"].get("phase") == "Pending" else None

        leader = cluster.wait_for(
            "group 1's leader Running and its worker Pending",
            leader_running_worker_pending,
            timeout=WAIT_SECONDS,
        )
        before = _group_uids(cluster, "1")
        index = next(
            i for i, c in enumerate(leader["status"]["containerStatuses"]) if c["name"] == SERVER_NAME
        )
        patch = [{"op": "replace", "path": f"/status/containerStatuses/{index}/restartCount", "value": 1}]
        cluster.kubectl(
            "patch",
            "pod",
            f"{LWS}-1",
            "-n",
            NAMESPACE,
            "--subresource=status",
            "--type=json",
            "-p",
            json.dumps(patch),
        )
        status = cluster.get("pod", namespace=NAMESPACE, name=f"{LWS}-1")["status"]
        record["restart_count_written"] = status["containerStatuses"][index].get("restartCount")
        record["leader_status"] = status
        seen = []
        for _ in range(HELD_OBSERVATION_SECONDS):  # bounded watch: the group must stay as it is
            time.sleep(1)
            seen.append(_group_uids(cluster, "1"))
        record["held"] = all(uids == before for uids in seen)
        record["before"] = before
    except ClusterError as error:
        record["error"] = f"{error}; pods: {_group_pods(cluster)}"
        return
    finally:
        cluster.kubectl("uncordon", held_node)
    try:
        cluster.wait_for(
            "two whole groups Running", lambda: _groups_running(cluster, 2), timeout=WAIT_SECONDS
        )
        formed = _group_uids(cluster, "1")
        settled = []
        for _ in range(HELD_OBSERVATION_SECONDS):
            time.sleep(1)
            settled.append(_group_uids(cluster, "1"))
        record["formed"] = formed
        record["stable_after_forming"] = all(uids == formed for uids in settled)
        record["recreated_once"] = set(formed.values()) != set(before.values())
        cluster.kubectl("scale", f"leaderworkerset/{LWS}", "-n", NAMESPACE, "--replicas=1")
        cluster.wait_for("one whole group Running", lambda: _groups_running(cluster, 1), timeout=WAIT_SECONDS)
    except ClusterError as error:
        record["error"] = f"{error}; pods: {_group_pods(cluster)}"


def _evict(cluster: Cluster, pod: str) -> dict[str, Any]:
    """The Eviction API, as `kubectl drain` and node-group upgrades call it."""
    body = json.dumps(
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": NAMESPACE}}
    )
    result = cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction",
        "-f",
        "-",
        input=body,
        check=False,
    )
    return {"pod": pod, "returncode": result.returncode, "stderr": result.stderr.strip()}


def _evictions_across_two_groups(cluster: Cluster, pods: list[dict[str, Any]]) -> dict[str, Any]:
    """Two groups Running: a worker of group 0 evicted (its whole group recreated by LWS), then at once
    the leader of group 1, as a drain of two nodes holding members of both would ask; then, with group 0
    back, group 1's worker. The model's PDB (components/guardrails.py, counted in groups) must let
    only one group be down at a time."""
    by_group: dict[str, dict[str, str]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        by_group.setdefault(labels[GROUP_INDEX_LABEL], {})[labels[WORKER_INDEX_LABEL]] = pod["metadata"][
            "name"
        ]

    def budget_allows_one() -> bool:
        status = cluster.get("poddisruptionbudget", namespace=NAMESPACE, name=LWS).get("status", {})
        return status.get("disruptionsAllowed") == 1

    try:
        cluster.wait_for("the budget to allow one eviction", budget_allows_one, timeout=WAIT_SECONDS)
    except ClusterError as error:
        return {"error": str(error)}
    before = {pod["metadata"]["uid"] for pod in pods}

    def group_0_recreated() -> list[dict[str, Any]] | None:
        running = _groups_running(cluster, 2)
        if not running:
            return None
        group_0 = [p for p in running if p["metadata"]["labels"][GROUP_INDEX_LABEL] == "0"]
        return running if not {p["metadata"]["uid"] for p in group_0} & before else None

    first = _evict(cluster, by_group["0"]["1"])
    second = _evict(cluster, by_group["1"]["0"])
    pdb = cluster.get("poddisruptionbudget", namespace=NAMESPACE, name=LWS)
    try:
        cluster.wait_for("group 0 recreated, both groups Running", group_0_recreated, timeout=WAIT_SECONDS)
        cluster.wait_for("the budget to allow one eviction again", budget_allows_one, timeout=WAIT_SECONDS)
        third = _evict(cluster, by_group["1"]["1"])
        cluster.wait_for(
            "two whole groups Running again", lambda: _groups_running(cluster, 2), timeout=WAIT_SECONDS
        )
    except ClusterError as error:
        return {"first": first, "second": second, "pdb": pdb, "error": str(error)}
    return {"first": first, "second": second, "third": third, "pdb": pdb}


DEMAND_LABEL = "vllm-platform-test/demand"
KEDA_POLLING_SECONDS = 5
"""autoscaling.keda_polling_interval_seconds's minimum; a to-zero ScaledObject's cooldown is one poll."""


NEW_REVISION = "5206a32e0bd3067aef1ce90f5528ade7d866253f"


def _canary_stack(path: Path) -> Path:
    """The cluster's stack with a candidate at 10 % (docs/multi-node.md, "Canary"): monitoring and Argo
    Rollouts on, as `validate` asks of a canary, and the shared volume sized for both revisions."""
    document = yaml.safe_load(_cluster_stack(path).read_text())
    config = document["config"]
    model = config["vllm-platform:models"][0]
    prefix = model["source"]["s3_uri"].rstrip("/").rsplit("/", 1)[0]
    model["rollout"] = {
        "strategy": "canary",
        "canary": {
            "candidate": {
                "source": {"s3_uri": f"{prefix}/{NEW_REVISION}/", "revision": NEW_REVISION},
                "vllm": {"max_num_seqs": 96},
                "weight": 10,
            }
        },
    }
    config["vllm-platform:addons"]["argo_rollouts"] = True
    config["vllm-platform:monitoring"] = {"enabled": True}
    config["vllm-platform:storage"]["model_volume_size_gib"] = 2000
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _set_pods(cluster: Cluster, set_name: str) -> list[dict[str, Any]]:
    return [p for p in _group_pods(cluster) if p["metadata"]["labels"].get(SET_NAME_LABEL) == set_name]


def _service_endpoints(cluster: Cluster, service: str) -> list[str]:
    slices = cluster.get_selected("endpointslices", f"kubernetes.io/service-name={service}")
    return sorted(
        endpoint["targetRef"]["name"]
        for item in slices
        if item["metadata"]["namespace"] == NAMESPACE
        for endpoint in item.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready") and endpoint.get("targetRef")
    )


def _canary_beside_the_stable_group(cluster: Cluster, workdir: Path, observed: dict[str, Any]) -> None:
    """What the candidate adds to the deployed model, as rendered (its LeaderWorkerSet, the stable and
    canary Services, the AnalysisRun of this weight), applied beside the stable group: the candidate's
    group placed whole on the free nodes, each Service on its own set's leaders, Argo Rollouts' real
    controller running the AnalysisRun; then the candidate removed (an abort), the stable group untouched.

    Applied, not `pulumi up`: a canary needs monitoring, and kube-prometheus-stack's admission webhooks
    would refuse objects here (the module's docstring). The objects are the render's own."""
    times = observed["times"]
    reason = tools.missing_reason(["rollouts-controller"])
    if reason:
        observed["canary_skipped"] = reason
        return
    render = render_stack(
        "cluster", stack_file=_canary_stack(workdir / "Pulumi.canary.yaml"), allow_missing_charts=True
    )
    added = [
        *render.find(LWS_KIND, CANARY_SET, NAMESPACE),
        *render.find("Service", STABLE_SERVICE, NAMESPACE),
        *render.find("Service", CANARY_SERVICE, NAMESPACE),
        *render.find(ANALYSIS_RUN_KIND, None, NAMESPACE),
    ]
    observed["canary_objects"] = added
    crds = [crd for (group, _), crd in data_crds().items() if group == "argoproj.io"]
    cluster.apply_objects(crds)
    cluster.wait_established([crd["metadata"]["name"] for crd in crds])
    start_rollouts_controller(cluster)
    stable_before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _set_pods(cluster, LWS)}
    start = time.monotonic()
    applied = cluster.apply_objects(added)
    if applied.returncode != 0:
        observed["canary_error"] = f"the candidate's objects were refused: {applied.stderr}"
        return

    def candidate_running() -> list[dict[str, Any]] | None:
        pods = _set_pods(cluster, CANARY_SET)
        return pods if len(pods) == len(_running(pods)) == GROUP_SIZE else None

    def judged() -> dict[str, Any] | None:
        runs = cluster.get("analysisruns.argoproj.io", namespace=NAMESPACE)
        measured = [
            run
            for run in runs
            if any(result.get("measurements") for result in run.get("status", {}).get("metricResults", []))
        ]
        return measured[0] if measured else None

    try:
        pods = cluster.wait_for(
            "the candidate's whole group Running", candidate_running, timeout=WAIT_SECONDS
        )
        times["canary_group_running_seconds"] = round(time.monotonic() - start, 1)
        with contextlib.suppress(ClusterError):
            cluster.wait_for(
                "each Service on its own set's leaders",
                lambda: (
                    _service_endpoints(cluster, CANARY_SERVICE) == [f"{CANARY_SET}-0"]
                    and _service_endpoints(cluster, STABLE_SERVICE) == [f"{LWS}-0"]
                ),
                timeout=60,
            )
        observed["canary"] = {
            "pods": pods,
            "stable_pods": _set_pods(cluster, LWS),
            "stable_before": stable_before,
            "endpoints": {
                name: _service_endpoints(cluster, name) for name in (LWS, STABLE_SERVICE, CANARY_SERVICE)
            },
            "services": cluster.get("services", namespace=NAMESPACE),
        }
        observed["canary"]["analysis_run"] = cluster.wait_for(
            "Argo Rollouts' controller to take a measurement of the AnalysisRun", judged, timeout=WAIT_SECONDS
        )
        times["canary_analysis_measured_after_apply_seconds"] = round(time.monotonic() - start, 1)
        start = time.monotonic()
        for kind, name in ((f"leaderworkerset/{CANARY_SET}", None), ("analysisruns.argoproj.io", "--all")):
            cluster.kubectl("delete", kind, *([name] if name else []), "-n", NAMESPACE, "--wait=false")
        cluster.wait_for(
            "the candidate's group gone", lambda: not _set_pods(cluster, CANARY_SET), timeout=WAIT_SECONDS
        )
        times["canary_removed_seconds"] = round(time.monotonic() - start, 1)
        observed["canary"]["stable_after"] = {
            p["metadata"]["name"]: p["metadata"]["uid"] for p in _set_pods(cluster, LWS)
        }
    except ClusterError as error:
        observed["canary_error"] = f"{error}; pods: {_group_pods(cluster)}"


def _scaled_object(model: ModelConfig) -> dict[str, Any]:
    """The model's ScaledObject as the stack renders it for min_replicas 0 (target: the
    LeaderWorkerSet), its Prometheus triggers swapped for one KEDA scaler that needs no Prometheus:
    the count of demand pods in the namespace (active above 0, one group per pod)."""
    autoscaling = AutoscalingConfig(
        enabled=True,
        backend="keda",
        min_replicas=0,
        max_replicas=1,
        keda_polling_interval_seconds=KEDA_POLLING_SECONDS,
    )
    spec = scaled_object_spec(
        autoscaling,
        workload_reference(model, LWS),
        NAMESPACE,
        "http://prometheus.invalid:9090",
        model_name=model.name,
    )
    spec["triggers"] = [
        {
            "type": "kubernetes-workload",
            "name": "demand",
            "metricType": "AverageValue",
            "metadata": {"podSelector": f"{DEMAND_LABEL}=yes", "value": "1", "activationValue": "0"},
        }
    ]
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {"name": LWS, "namespace": NAMESPACE},
        "spec": spec,
    }


def _demand_pod() -> dict[str, Any]:
    """A pod the namespace's `restricted` Pod Security admits, on a system node (KWOK runs it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "demand", "namespace": NAMESPACE, "labels": {DEMAND_LABEL: "yes"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "demand",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {
                        "requests": {"cpu": "10m", "memory": "16Mi"},
                        "limits": {"cpu": "10m", "memory": "16Mi"},
                    },
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def _set_replicas(cluster: Cluster) -> int | None:
    return cluster.get("leaderworkerset", namespace=NAMESPACE, name=LWS)["spec"].get("replicas")


def _keda_drives_whole_groups(cluster: Cluster, model: ModelConfig, observed: dict[str, Any]) -> None:
    reason = tools.missing_reason(["keda-operator"])
    if reason:
        observed["keda_skipped"] = reason
        return
    times = observed["times"]
    crds = [crd for (group, _), crd in data_crds().items() if group == "keda.sh"]
    cluster.apply_objects(
        [*crds, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KEDA_NAMESPACE}}]
    )
    cluster.wait_established([crd["metadata"]["name"] for crd in crds])
    start_keda_operator(cluster)
    scaled_object = _scaled_object(model)
    observed["keda_scaled_object"] = scaled_object
    start = time.monotonic()
    applied = cluster.apply_objects([scaled_object])
    if applied.returncode != 0:
        observed["keda_error"] = f"the ScaledObject was refused: {applied.stderr}"
        return

    def at_zero() -> bool:
        return _set_replicas(cluster) == 0 and not _group_pods(cluster)

    try:
        cluster.wait_for("KEDA to scale the set to 0 groups (no demand)", at_zero, timeout=WAIT_SECONDS)
        times["keda_to_zero_seconds"] = round(time.monotonic() - start, 1)
        start = time.monotonic()
        created = cluster.apply_objects([_demand_pod()])
        if created.returncode != 0:
            observed["keda_error"] = f"the demand pod was refused: {created.stderr}"
            return
        pods = cluster.wait_for(
            "KEDA to wake one whole group", lambda: _groups_running(cluster, 1), timeout=WAIT_SECONDS
        )
        times["keda_wake_one_group_seconds"] = round(time.monotonic() - start, 1)
        observed["keda_woken"] = {**_snapshot(cluster, pods), "replicas": _set_replicas(cluster)}
        start = time.monotonic()
        cluster.kubectl("delete", "pod", "demand", "-n", NAMESPACE, "--wait=false")
        cluster.wait_for("KEDA to scale the set back to 0 groups", at_zero, timeout=WAIT_SECONDS)
        times["keda_back_to_zero_seconds"] = round(time.monotonic() - start, 1)
    except ClusterError as error:
        observed["keda_error"] = f"{error}; replicas: {_set_replicas(cluster)}; pods: {_group_pods(cluster)}"
    finally:
        with contextlib.suppress(ClusterError, subprocess.SubprocessError):
            observed["keda_status"] = cluster.get("scaledobjects.keda.sh", namespace=NAMESPACE, name=LWS).get(
                "status", {}
            )
        # Gone before destroy: KEDA's finalizer and its HPA go with the ScaledObject.
        cluster.kubectl("delete", "scaledobjects.keda.sh", LWS, "-n", NAMESPACE, "--timeout=60s", check=False)


def _timestamp(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _ready_after(lws: dict[str, Any], pods: list[dict[str, Any]]) -> float:
    """Seconds from the LeaderWorkerSet's creation to its last member's Ready condition."""
    ready = max(
        _timestamp(condition["lastTransitionTime"])
        for pod in pods
        for condition in pod["status"].get("conditions", [])
        if condition["type"] == "Ready" and condition["status"] == "True"
    )
    return (ready - _timestamp(lws["metadata"]["creationTimestamp"])).total_seconds()


def _leftovers(cluster: Cluster) -> dict[str, Any]:
    ours = {NAMESPACE, "vllm-router"}

    def gone():
        return not ours & {ns["metadata"]["name"] for ns in cluster.get("namespaces")}

    with contextlib.suppress(ClusterError):  # bounded; test_destroy_leaves_nothing_of_ours reports it
        cluster.wait_for("our namespaces to be deleted", gone, timeout=WAIT_SECONDS, interval=2)
    return {
        "namespaces": sorted(ours & {ns["metadata"]["name"] for ns in cluster.get("namespaces")}),
        "managed": cluster.get_selected("all", "app.kubernetes.io/managed-by=pulumi"),
        "leader_worker_sets": cluster.get("leaderworkersets"),
        "group_pods": [p["metadata"]["name"] for p in cluster.get_selected("pods", WORKER_INDEX_LABEL)],
    }


def _step(results: dict[str, Any], step: str) -> dict[str, Any]:
    assert step in results, f"step {step} did not run (an earlier step failed: {sorted(results)})"
    result = results[step]
    assert result["ok"], f"{step}: {result['error'][-3000:]}"
    return result


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == SERVER_NAME)


def _check_whole_groups(observed: dict[str, Any], pods: list[dict[str, Any]], groups: int) -> None:
    """`groups` groups of a leader and a worker, one pod per node, every node of the GPU group."""
    nodes = observed["nodes"]
    assert len(pods) == groups * GROUP_SIZE
    by_group: dict[str, list[str]] = {}
    for pod in pods:
        labels = pod["metadata"]["labels"]
        by_group.setdefault(labels[GROUP_INDEX_LABEL], []).append(labels[WORKER_INDEX_LABEL])
    assert sorted(by_group) == [str(index) for index in range(groups)], by_group
    assert all(sorted(indexes) == ["0", "1"] for indexes in by_group.values()), by_group
    placed = [pod["spec"]["nodeName"] for pod in pods]
    assert len(set(placed)) == len(placed), f"two members on one node: {placed}"
    assert {nodes[name]["metadata"]["labels"][NODE_GROUP_LABEL] for name in placed} == {GPU_GROUP}
    # The GPU nodes span two zones (mode existing: no placement group); each group stays in one
    # (issue 50: the zone affinity within a group, LWS's group-key through matchLabelKeys).
    for group in {p["metadata"]["labels"][GROUP_INDEX_LABEL] for p in pods}:
        members = [p["spec"]["nodeName"] for p in pods if p["metadata"]["labels"][GROUP_INDEX_LABEL] == group]
        zones = {nodes[name]["metadata"]["labels"]["topology.kubernetes.io/zone"] for name in members}
        assert len(zones) == 1, (group, members, zones)
    for pod in pods:
        resources = _container(pod)["resources"]
        node = nodes[pod["spec"]["nodeName"]]["status"]["allocatable"]
        assert resources["requests"]["nvidia.com/gpu"] == node["nvidia.com/gpu"] == "8"
        assert resources["requests"][EFA_RESOURCE] == node[EFA_RESOURCE] == "32"


def test_the_gpu_nodes_span_two_zones_and_every_group_stays_in_one(multi_node_run):
    """Issue 50: in mode `existing` all three groups of a stack were split across zones. Here the GPU
    nodes span two zones; every whole-group check (_check_whole_groups) also holds each group to one,
    and two groups Running at once are in different zones only because neither fits beside the other."""
    _, observed = multi_node_run
    gpu_zones = {
        node["metadata"]["labels"]["topology.kubernetes.io/zone"]
        for node in observed["nodes"].values()
        if node["metadata"]["labels"].get(NODE_GROUP_LABEL) == GPU_GROUP
    }
    assert len(gpu_zones) == 2, gpu_zones
    assert "scale_out_error" not in observed, observed.get("scale_out_error")
    _check_whole_groups(observed, observed["scale_out"]["pods"], groups=2)


def test_up_creates_the_leader_worker_set(multi_node_run):
    results, observed = multi_node_run
    _step(results, "multi-node-1-up")
    spec = observed["lws"]["spec"]
    assert spec["replicas"] == 1
    assert spec["leaderWorkerTemplate"]["size"] == GROUP_SIZE
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupAfterStart"


def test_a_whole_group_runs_one_pod_per_node_on_the_gpu_group(multi_node_run):
    _, observed = multi_node_run
    assert "group_error" not in observed, observed.get("group_error")
    _check_whole_groups(observed, observed["one_group"]["pods"], groups=1)


def test_the_pods_carry_the_lws_variables_the_rendered_arguments_use(multi_node_run):
    _, observed = multi_node_run
    assert "group_error" not in observed, observed.get("group_error")
    pods = {p["metadata"]["labels"][WORKER_INDEX_LABEL]: p for p in observed["one_group"]["pods"]}
    leader, worker = pods["0"], pods["1"]
    for index, pod in pods.items():
        container = _container(pod)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["LWS_LEADER_ADDRESS"] == f"{LWS}-0.{LWS}-0.{NAMESPACE}", env
        assert env["LWS_GROUP_SIZE"] == str(GROUP_SIZE)
        assert env["LWS_WORKER_INDEX"] == index
        command = " ".join([*container.get("command", []), *container.get("args", [])])
        assert "--nnodes 2" in command and "--node-rank $(LWS_WORKER_INDEX)" in command, command
        assert "--master-addr $(LWS_LEADER_ADDRESS)" in command, command
    assert "--headless" not in _container(leader)["args"] and "--headless" in _container(worker)["args"]


def test_the_leader_address_names_a_headless_service_of_its_group(multi_node_run):
    """DNS publishes `<hostname>.<subdomain>` only for a headless Service named as the subdomain; the
    model's own ClusterIP Service `vllm` must not be it (components/leader_worker_set.py
    SUBDOMAIN_POLICY). No DNS server runs here: the test checks what DNS would read."""
    _, observed = multi_node_run
    assert "group_error" not in observed, observed.get("group_error")
    services = {s["metadata"]["name"]: s for s in observed["one_group"]["services"]}
    for pod in observed["one_group"]["pods"]:
        env = {e["name"]: e.get("value") for e in _container(pod)["env"]}
        hostname, subdomain, namespace = env["LWS_LEADER_ADDRESS"].split(".")
        assert (hostname, namespace) == (f"{LWS}-0", NAMESPACE), env
        assert subdomain in services, (subdomain, sorted(services))
        headless = services[subdomain]["spec"]
        assert headless["clusterIP"] == "None", headless
        assert headless["selector"] == {
            "leaderworkerset.sigs.k8s.io/name": LWS,
            GROUP_INDEX_LABEL: pod["metadata"]["labels"][GROUP_INDEX_LABEL],
        }, headless
        if pod["metadata"]["labels"][WORKER_INDEX_LABEL] == "0":
            assert (pod["spec"].get("hostname"), pod["spec"].get("subdomain")) == (hostname, subdomain)
    assert services[LWS]["spec"]["clusterIP"] != "None"  # the model's own Service, for requests


def test_the_models_service_sends_requests_to_leaders_only(multi_node_run):
    _, observed = multi_node_run
    assert "group_error" not in observed, observed.get("group_error")
    assert observed["one_group"]["endpoints"] == [f"{LWS}-0"]
    if "scale_out" in observed:
        assert observed["scale_out"]["endpoints"] == [f"{LWS}-0", f"{LWS}-1"]


def test_second_preview_shows_no_changes(multi_node_run):
    results, _ = multi_node_run
    _step(results, "multi-node-2-preview-no-changes")


def test_scale_subresource_adds_and_removes_whole_groups(multi_node_run):
    _, observed = multi_node_run
    for step in ("scale_out", "scale_in"):
        assert f"{step}_error" not in observed, observed.get(f"{step}_error")
    _check_whole_groups(observed, observed["scale_out"]["pods"], groups=2)
    _check_whole_groups(observed, observed["scale_in"]["pods"], groups=1)
    # What an autoscaler reads back from /scale: the groups, and the leaders' selector.
    scale = observed["scale_out"]["scale"]
    assert scale["spec"]["replicas"] == 2 and scale["status"]["replicas"] == 2
    assert f"{WORKER_INDEX_LABEL}=0" in scale["status"]["selector"], scale["status"]
    assert observed["scale_in"]["endpoints"] == [f"{LWS}-0"]


def test_the_eviction_api_takes_one_group_at_a_time(multi_node_run):
    """Issue 50: the budget counts groups. With two groups Running, a worker of one is evicted (201,
    and LWS takes its whole group down); the other group's leader, asked for at once, is refused
    (429: the budget is spent while a group is down); once the first group serves again, the second's
    worker may go. A drain of nodes holding members of both groups therefore never has both down."""
    _, observed = multi_node_run
    assert "scale_out_error" not in observed, observed.get("scale_out_error")
    evictions = observed["evictions"]
    assert "error" not in evictions, evictions
    assert evictions["pdb"]["spec"]["maxUnavailable"] == 1
    assert evictions["first"]["returncode"] == 0, evictions["first"]
    assert evictions["second"]["returncode"] != 0
    assert "disruption budget" in evictions["second"]["stderr"], evictions["second"]
    assert evictions["third"]["returncode"] == 0, evictions["third"]


def test_a_member_restarting_while_another_is_pending_does_not_recreate_the_group_in_a_loop(multi_node_run):
    """Issue 50: the leader's container restarted (restartCount 1) while its worker was Pending: LWS
    left the group as it was for the whole watch; once the worker's node came the group formed (LWS
    may recreate it once, now that nothing is Pending and the count never resets) and then stayed."""
    _, observed = multi_node_run
    record = observed["restart_while_pending"]
    assert "error" not in record, record.get("error")
    assert record["restart_count_written"] == 1, record.get("leader_status")
    assert record["held"] is True, record
    assert record["stable_after_forming"] is True, record


def test_a_deleted_worker_recreates_its_whole_group(multi_node_run):
    _, observed = multi_node_run
    assert "recovery_error" not in observed, observed.get("recovery_error")
    recovery = observed["recovery"]
    _check_whole_groups(observed, recovery["pods"], groups=1)
    names = {p["metadata"]["name"]: p["metadata"]["uid"] for p in recovery["pods"]}
    assert set(names) == set(recovery["before"]), "the same group, by name"
    assert not set(names.values()) & set(recovery["before"].values()), "leader and worker both new"
    assert recovery["endpoints"] == [f"{LWS}-0"]


def test_kedas_operator_scales_the_set_by_whole_groups_to_zero_and_back(multi_node_run):
    _, observed = multi_node_run
    if "keda_skipped" in observed:
        pytest.skip(f"KEDA's operator could not be built here: {observed['keda_skipped']}")
    assert "recovery" in observed, "an earlier step failed; KEDA's step did not run"
    assert "keda_error" not in observed, (observed.get("keda_error"), observed.get("keda_status"))
    target = observed["keda_scaled_object"]["spec"]["scaleTargetRef"]
    assert target == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": LWS}
    woken = observed["keda_woken"]
    assert woken["replicas"] == 1
    _check_whole_groups(observed, woken["pods"], groups=1)
    assert woken["endpoints"] == [f"{LWS}-0"]
    for step in ("keda_to_zero_seconds", "keda_wake_one_group_seconds", "keda_back_to_zero_seconds"):
        assert step in observed["times"], observed["times"]


def _canary(observed: dict[str, Any]) -> dict[str, Any]:
    if "canary_skipped" in observed:
        pytest.skip(f"the canary step needs Argo Rollouts' controller: {observed['canary_skipped']}")
    assert "canary_error" not in observed, observed.get("canary_error")
    assert "canary" in observed, "the canary step did not run (an earlier step failed)"
    return observed["canary"]


def test_the_preflight_job_is_admitted_and_places_one_pod_per_free_gpu_node_in_one_zone(multi_node_run):
    """The pre-flight's objects pass the API server's admission (PodSecurity `restricted` on its
    namespace, the Job, the headless Service, the NetworkPolicy) and the real scheduler puts its two
    pods on the two GPU nodes the group left free, one each, in one zone, with the group's requests."""
    _, observed = multi_node_run
    assert "recovery" in observed, "the group did not come back; the pre-flight step did not run"
    preflight = observed["preflight"]
    assert preflight["apply"]["returncode"] == 0, preflight["apply"]["stderr"]
    assert "error" not in preflight, preflight.get("error")
    pods = preflight["pods"]
    group_nodes = {p["spec"]["nodeName"] for p in observed["recovery"]["pods"]}
    nodes = [p["spec"]["nodeName"] for p in pods]
    assert len(set(nodes)) == GROUP_SIZE and not set(nodes) & group_nodes
    for name in nodes:
        node = observed["nodes"][name]
        assert node["metadata"]["labels"][NODE_GROUP_LABEL] == GPU_GROUP
    zones = {observed["nodes"][n]["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
    assert len(zones) == 1
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"{PREFLIGHT_NAME}-0", f"{PREFLIGHT_NAME}-1"]
    assert {p["spec"]["subdomain"] for p in pods} == {PREFLIGHT_NAME}
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"][EFA_RESOURCE] == "32"
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        env = {e["name"] for e in container["env"]}
        assert "JOB_COMPLETION_INDEX" in env  # the Job controller's, the script's node rank
    assert preflight["job"]["spec"]["completionMode"] == "Indexed"
    assert preflight["left"] == []


def test_a_canary_candidate_runs_as_a_whole_group_beside_the_stable_one(multi_node_run):
    _, observed = multi_node_run
    canary = _canary(observed)
    _check_whole_groups(observed, canary["pods"], groups=1)
    placed = {p["spec"]["nodeName"] for p in canary["pods"]} | {
        p["spec"]["nodeName"] for p in canary["stable_pods"]
    }
    assert len(placed) == 2 * GROUP_SIZE  # four nodes: no candidate member beside a stable one
    for pod in canary["pods"]:
        args = " ".join(_container(pod)["args"])
        assert f"/{NEW_REVISION} " in args and "--max-num-seqs 96" in args, args
        env = {e["name"]: e.get("value") for e in _container(pod)["env"]}
        assert env["LWS_LEADER_ADDRESS"] == f"{CANARY_SET}-0.{CANARY_SET}-0.{NAMESPACE}", env
    services = {s["metadata"]["name"]: s for s in canary["services"]}
    assert services[f"{CANARY_SET}-0"]["spec"]["clusterIP"] == "None"  # its group's own, from LWS


def test_stable_and_canary_services_send_to_their_own_sets_leaders(multi_node_run):
    _, observed = multi_node_run
    endpoints = _canary(observed)["endpoints"]
    assert endpoints[STABLE_SERVICE] == [f"{LWS}-0"]
    assert endpoints[CANARY_SERVICE] == [f"{CANARY_SET}-0"]
    assert endpoints[LWS] == sorted([f"{LWS}-0", f"{CANARY_SET}-0"])  # the root Service: both sets' leaders


def test_argo_rollouts_controller_runs_the_rendered_analysis_run(multi_node_run):
    """No Prometheus runs here: the measurement is an Error naming the rendered address, which shows
    Argo's own controller took up the stack's AnalysisRun and ran its Prometheus query."""
    _, observed = multi_node_run
    run = _canary(observed)["analysis_run"]
    (rendered,) = [o for o in observed["canary_objects"] if o["kind"] == ANALYSIS_RUN_KIND]
    assert run["metadata"]["name"] == rendered["metadata"]["name"]
    assert run["metadata"]["name"].startswith("vllm-canary-10-")
    assert run["status"]["phase"] in ("Running", "Error"), run["status"]
    results = {result["name"]: result for result in run["status"]["metricResults"]}
    assert set(results) <= {metric["name"] for metric in rendered["spec"]["metrics"]}
    measurement = next(m for result in results.values() for m in result.get("measurements", []))
    assert measurement["phase"] == "Error", measurement
    address = rendered["spec"]["metrics"][0]["provider"]["prometheus"]["address"]
    host = address.split("//", 1)[1].split(":", 1)[0]
    assert host in measurement.get("message", ""), measurement


def test_removing_the_candidate_leaves_the_stable_group_untouched(multi_node_run):
    _, observed = multi_node_run
    canary = _canary(observed)
    assert canary["stable_after"] == canary["stable_before"]  # same pods, same UIDs
    assert "canary_removed_seconds" in observed["times"]


def test_the_only_webhooks_after_up_are_the_tests_own(multi_node_run):
    results, observed = multi_node_run
    _step(results, "multi-node-1-up")
    assert observed["webhook_configurations"] == {
        "mutatingwebhookconfigurations": [CONFIGURATION_NAME],
        "validatingwebhookconfigurations": [CONFIGURATION_NAME],
    }


def test_destroy_leaves_nothing_of_ours(multi_node_run):
    results, observed = multi_node_run
    _step(results, "multi-node-9-destroy")
    assert observed["after_destroy"] == {
        "namespaces": [],
        "managed": [],
        "leader_worker_sets": [],
        "group_pods": [],
    }
