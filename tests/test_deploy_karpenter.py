"""A Karpenter GPU pool on the real control plane, with the real Karpenter (issue 41).

The stack is tests/stacks/Pulumi.cluster.yaml with its L40S group turned into a Karpenter pool
(`provisioner: karpenter`, spot then on-demand, the KWOK provider's node class named as mode
`existing` names the cluster's own) and a consolidation delay of seconds, so the test takes minutes.
Its to-zero model (TP=2, KEDA) runs on that pool. Karpenter's KWOK provider runs as a process
(tests/cluster/karpenter.py) with an instance-types file generated from the stack's pool; the real
Pulumi engine and Kubernetes provider deploy the stack, as Tier 2 does.

Steps (one module-scoped run; each test checks one):
    up (the pool's NodePool; the model at zero, so no node and no NodeClaim) →
    preview --expect-no-changes →
    wake: the model's Deployment 0 -> 1 through /scale, as KEDA's operator does it (KEDA's own
    0 -> 1 on the router's held request is tests/test_deploy_scale_to_zero.py): pending pod →
    NodeClaim → KWOK node with the pool's GPUs → pod scheduled and Running, each step timed →
    drift: the NodePool's template changes under a serving pod; Karpenter marks the NodeClaim
    Drifted and reports the disruption blocked by the pod's karpenter.sh/do-not-disrupt; the node and
    the pod stay →
    back to zero: the empty node is removed after the pool's consolidateAfter →
    destroy: no NodePool and no NodeClaim left.
The times are written to out/deploy-tests/karpenter.json (docs/autoscaling.md quotes them).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.stack_checks import load_stack
from tests.cluster import tools
from tests.cluster.control_plane import Cluster, ClusterError, start_rollouts_controller
from tests.cluster.fixtures import (
    CLUSTER_STACK_FILE,
    REPO,
    cluster_for,
    require_chart_cache,
    require_cluster_tools,
)
from tests.cluster.karpenter import (
    KWOK_NODE_CLASS,
    install_karpenter_api,
    missing_reason,
    start_karpenter_kwok,
)
from tests.cluster.pulumi_project import write_project
from tests.test_deploy_pulumi import Deployer

pytestmark = pytest.mark.cluster

ARTEFACTS = REPO / "out" / "deploy-tests"
POOL = "l40s"
MODEL = "qwen2-5-7b-tp2"
NAMESPACE = f"vllm-{MODEL}"
CONSOLIDATE_AFTER_SECONDS = 15
NODEPOOL_LABEL = "karpenter.sh/nodepool"


def _pool_stack(path: Path) -> Path:
    document = yaml.safe_load(CLUSTER_STACK_FILE.read_text())
    groups = document["config"]["vllm-platform:node_groups"]["gpu"]
    groups[POOL] = {
        "provisioner": "karpenter",
        "instance_types": ["g6e.12xlarge", "g6e.24xlarge"],
        "min_size": 0,
        "max_size": 2,
        "labels": {"vllm-platform/provisioner": "karpenter"},
        "karpenter": {
            "capacity_types": ["spot", "on-demand"],
            "consolidate_after_seconds": CONSOLIDATE_AFTER_SECONDS,
            "node_class": KWOK_NODE_CLASS,
        },
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _pool_nodes(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.get_selected("nodes", f"{NODEPOOL_LABEL}={POOL}")


def _node_claims(cluster: Cluster) -> list[dict[str, Any]]:
    result = cluster.kubectl("get", "nodeclaims", "-o", "json", check=False)
    return json.loads(result.stdout)["items"] if result.returncode == 0 else []


def _model_pods(cluster: Cluster) -> list[dict[str, Any]]:
    return [
        pod
        for pod in cluster.get("pods", namespace=NAMESPACE)
        if pod["metadata"]["name"].startswith("vllm-") and pod["metadata"].get("deletionTimestamp") is None
    ]


def _running_pod(cluster: Cluster) -> dict[str, Any] | None:
    return next(
        (
            pod
            for pod in _model_pods(cluster)
            if pod["status"].get("phase") == "Running" and pod["spec"].get("nodeName")
        ),
        None,
    )


def _gpus(node: dict[str, Any]) -> int:
    return int(node["status"].get("allocatable", {}).get("nvidia.com/gpu", "0"))


def _blocked_by_do_not_disrupt(cluster: Cluster, node_name: str) -> list[str]:
    """Karpenter's DisruptionBlocked events on the node (or its NodeClaim) naming the annotation."""
    claims = {claim["metadata"]["name"] for claim in _node_claims(cluster)}
    return [
        event.get("message", "")
        for event in cluster.get("events")
        if event.get("involvedObject", {}).get("name") in {node_name, *claims}
        and "do-not-disrupt" in event.get("message", "")
    ]


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory):
    require_cluster_tools(("rollouts-controller", "pulumi", "pulumi-resource-kubernetes"))
    reason = missing_reason()
    if reason:
        pytest.skip(f"the Karpenter deploy test needs Karpenter's KWOK provider: {reason}")
    require_chart_cache()
    workdir = tmp_path_factory.mktemp("karpenter")
    stack_file = _pool_stack(workdir / "Pulumi.cluster.yaml")
    config = load_stack("cluster", stack_file=stack_file)
    observed: dict[str, Any] = {"times": {}}
    with cluster_for(config, workdir / "cluster") as cluster:
        project = workdir / "project"
        write_project(project, stack_file, tools.program("pulumi-resource-kubernetes").parent)
        deployer = Deployer(cluster, project)
        start_rollouts_controller(cluster)
        install_karpenter_api(cluster)
        start_karpenter_kwok(cluster, config)
        try:
            _run(cluster, deployer, observed)
        finally:
            deployer.run("karpenter-9-destroy", "destroy")
            with contextlib.suppress(ClusterError):
                cluster.wait_for(
                    "no NodeClaim left", lambda: not _node_claims(cluster), timeout=120, interval=2
                )
            observed["after_destroy"] = {
                "node_claims": [claim["metadata"]["name"] for claim in _node_claims(cluster)],
                "node_pools": json.loads(cluster.kubectl("get", "nodepools", "-o", "json").stdout)["items"],
                "pool_nodes": [node["metadata"]["name"] for node in _pool_nodes(cluster)],
            }
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        (ARTEFACTS / "karpenter.json").write_text(json.dumps(observed["times"], indent=2))
        yield deployer.results, observed


def _run(cluster: Cluster, deployer: Deployer, observed: dict[str, Any]) -> None:
    if not deployer.run("karpenter-1-up", "up")["ok"]:
        return
    observed["node_pool"] = json.loads(cluster.kubectl("get", "nodepool", POOL, "-o", "json").stdout)
    observed["at_rest"] = {
        "pool_nodes": _pool_nodes(cluster),
        "node_claims": _node_claims(cluster),
        "pods": _model_pods(cluster),
    }
    deployer.run("karpenter-2-preview-no-changes", "preview", "--expect-no-changes")

    # Wake: 0 -> 1 through /scale, as KEDA's operator does it.
    times = observed["times"]
    start = time.monotonic()
    cluster.kubectl("scale", "deployment/vllm", "-n", NAMESPACE, "--replicas=1")
    try:
        cluster.wait_for("the model's pod pending", lambda: _model_pods(cluster), timeout=60)
        times["pod_created_seconds"] = round(time.monotonic() - start, 1)
        cluster.wait_for("a NodeClaim for the pool", lambda: _node_claims(cluster), timeout=180)
        times["node_claim_seconds"] = round(time.monotonic() - start, 1)
        cluster.wait_for(
            "a pool node with GPUs", lambda: [n for n in _pool_nodes(cluster) if _gpus(n)], timeout=180
        )
        times["node_with_gpus_seconds"] = round(time.monotonic() - start, 1)
        pod = cluster.wait_for(
            "the model's pod Running on the pool", lambda: _running_pod(cluster), timeout=180
        )
        times["pod_running_seconds"] = round(time.monotonic() - start, 1)
    except ClusterError as error:
        observed["wake_error"] = str(error)
        return
    observed["serving_pod"] = pod
    observed["woken_nodes"] = _pool_nodes(cluster)
    observed["woken_claims"] = _node_claims(cluster)
    node_name = pod["spec"]["nodeName"]

    # Drift under a serving pod: a template change Karpenter must not act on while the pod serves.
    cluster.kubectl(
        "patch",
        "nodepool",
        POOL,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"template": {"metadata": {"labels": {"vllm-platform/drift-test": "1"}}}}}),
    )
    try:
        cluster.wait_for(
            "the NodeClaim marked Drifted",
            lambda: any(
                c["type"] == "Drifted" and c["status"] == "True"
                for claim in _node_claims(cluster)
                for c in claim.get("status", {}).get("conditions", [])
            ),
            timeout=180,
            interval=2,
        )
        observed["drifted"] = True
        observed["blocked"] = cluster.wait_for(
            "Karpenter reporting the disruption blocked by do-not-disrupt",
            lambda: _blocked_by_do_not_disrupt(cluster, node_name),
            timeout=300,
            interval=2,
        )
    except ClusterError as error:
        observed["drift_error"] = str(error)
    observed["after_drift"] = {"pod": _running_pod(cluster), "nodes": _pool_nodes(cluster)}

    # Back to zero: the pod goes, the node is empty, Karpenter removes it after consolidateAfter.
    start = time.monotonic()
    cluster.kubectl("scale", "deployment/vllm", "-n", NAMESPACE, "--replicas=0")
    try:
        cluster.wait_for("the model's pod gone", lambda: not _model_pods(cluster), timeout=180)
        times["pod_gone_seconds"] = round(time.monotonic() - start, 1)
        cluster.wait_for(
            "the empty pool node removed", lambda: not _pool_nodes(cluster), timeout=300, interval=2
        )
        times["empty_node_removed_seconds"] = round(time.monotonic() - start, 1)
        times["consolidate_after_seconds"] = CONSOLIDATE_AFTER_SECONDS
    except ClusterError as error:
        observed["to_zero_error"] = str(error)
    observed["after_zero"] = {"nodes": _pool_nodes(cluster), "claims": _node_claims(cluster)}


def _step(results: dict[str, Any], step: str) -> dict[str, Any]:
    assert step in results, f"step {step} did not run (an earlier step failed: {sorted(results)})"
    result = results[step]
    assert result["ok"], f"{step}: {result['error'][-3000:]}"
    return result


def test_up_creates_the_pools_node_pool_and_no_node_while_the_model_is_at_zero(pool_run):
    results, observed = pool_run
    _step(results, "karpenter-1-up")
    pool = observed["node_pool"]
    assert pool["spec"]["template"]["spec"]["nodeClassRef"] == KWOK_NODE_CLASS
    ready = {c["type"]: c["status"] for c in pool.get("status", {}).get("conditions", [])}
    assert ready.get("NodeClassReady") == "True", pool.get("status")
    assert observed["at_rest"] == {"pool_nodes": [], "node_claims": [], "pods": []}


def test_second_preview_shows_no_changes(pool_run):
    results, _ = pool_run
    _step(results, "karpenter-2-preview-no-changes")


def test_a_wake_goes_pending_pod_to_node_claim_to_gpu_node_to_running_pod(pool_run):
    _, observed = pool_run
    assert "wake_error" not in observed, observed.get("wake_error")
    times = observed["times"]
    assert times["pod_created_seconds"] <= times["node_claim_seconds"] <= times["node_with_gpus_seconds"]
    assert times["node_with_gpus_seconds"] <= times["pod_running_seconds"]
    [node] = observed["woken_nodes"]
    labels = node["metadata"]["labels"]
    assert labels[NODEPOOL_LABEL] == POOL
    assert labels["vllm-platform/gpu-group"] == POOL
    assert labels["node.kubernetes.io/instance-type"] in ("g6e.12xlarge", "g6e.24xlarge")
    assert labels["karpenter.sh/capacity-type"] == "spot", "spot is offered and cheaper: Karpenter takes it"
    assert _gpus(node) >= 2
    assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    assert observed["serving_pod"]["spec"]["nodeName"] == node["metadata"]["name"]


def test_a_node_that_holds_a_serving_pod_is_never_disrupted(pool_run):
    _, observed = pool_run
    assert "drift_error" not in observed, observed.get("drift_error")
    assert observed["drifted"] and observed["blocked"], observed
    pod = observed["after_drift"]["pod"]
    assert pod is not None and pod["metadata"]["uid"] == observed["serving_pod"]["metadata"]["uid"]
    assert [n["metadata"]["name"] for n in observed["after_drift"]["nodes"]] == [
        n["metadata"]["name"] for n in observed["woken_nodes"]
    ]


def test_back_at_zero_the_empty_node_is_removed_after_the_consolidation_delay(pool_run):
    _, observed = pool_run
    assert "to_zero_error" not in observed, observed.get("to_zero_error")
    assert observed["after_zero"] == {"nodes": [], "claims": []}
    times = observed["times"]
    assert times["empty_node_removed_seconds"] >= times["pod_gone_seconds"]


def test_destroy_leaves_no_node_pool_and_no_node_claim(pool_run):
    results, observed = pool_run
    _step(results, "karpenter-9-destroy")
    assert observed["after_destroy"] == {"node_claims": [], "node_pools": [], "pool_nodes": []}
