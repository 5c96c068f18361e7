"""Tier 2 of the deploy tests (issue 33): the real Pulumi engine and Kubernetes provider deploy a
prod-shaped stack (tests/stacks/Pulumi.cluster.yaml) to a real control plane with KWOK GPU nodes.

The lifecycle, in order (one module-scoped run; each test checks one step):
    preview (empty cluster) → up (the to-zero model created at zero replicas) →
    preview --expect-no-changes → refresh --expect-no-changes →
    scale the to-zero model's Deployment through /scale as KEDA does → up --expect-no-changes →
    change two models' revisions: preview --diff (kept as an artefact) → up (the scaled model keeps
    KEDA's count) → destroy
Everything runs inside a loopback-only network namespace (tests/cluster/README.md). The AWS layer
is not exercised here: mode `existing` creates no AWS resources (it stays under Pulumi mocks and
moto, tests/test_aws_layer.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
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
from tests.cluster.placement import (
    GPU_DAEMONSETS,
    node_groups_by_node,
    pending_pods,
    pods_by_owner,
    vllm_pods,
)
from tests.cluster.pulumi_project import write_project

pytestmark = pytest.mark.cluster

ARTEFACTS = REPO / "out" / "deploy-tests"
CANARY_MODEL = "llama-3-1-8b"
"""Canary rollout, Prometheus Adapter HPA, a LoRA adapter: its revision changes in the last step."""
SCALED_MODEL = "qwen2-5-7b-tp2"
"""A Deployment on KEDA down to zero replicas: created at zero, then scaled through /scale as KEDA
would, and its revision changed with the canary's."""
SCALED_REPLICAS = 2
GPU_QUOTA = "requests.nvidia.com/gpu"
NEW_REVISION = "1111111111111111111111111111111111111111"
OPERATION_TIMEOUT_SECONDS = 900


def namespace_of(model: str) -> str:
    return f"vllm-{model}"


PROVIDER_DELETE_PANIC = "pkg/await/condition.(*Deleted).Satisfied"
"""pulumi-resource-kubernetes v4's delete awaiter dereferencing an object it no longer has (a nil
pointer panic in await/condition/deleted.go): the provider exits and `destroy` fails mid-way."""


class Deployer:
    """Runs tests/cluster/pulumi_project.py inside the cluster's namespace (one engine run each)."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.results: dict[str, dict[str, Any]] = {}

    def run(self, step: str, operation: str, *flags: str) -> dict[str, Any]:
        result = self._run_once(step, operation, *flags)
        if operation == "destroy" and not result["ok"] and PROVIDER_DELETE_PANIC in result["error"]:
            # The pinned Kubernetes provider crashed in its delete awaiter (an upstream race, seen
            # once in CI beside the main lane): the delete itself was sent, and destroy is idempotent,
            # so it is run once more; the first attempt's error stays in the result.
            first = result["error"]
            result = self._run_once(step, operation, *flags)
            result["retried_after_provider_panic"] = first[-4000:]
        return result

    def _run_once(self, step: str, operation: str, *flags: str) -> dict[str, Any]:
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        completed = self.cluster.netns.run(
            [
                sys.executable,
                "-m",
                "tests.cluster.pulumi_project",
                str(self.workdir),
                operation,
                *flags,
                f"--pulumi-root={tools.tools_cache()}",
                f"--kubeconfig={self.cluster.kubeconfig}",
            ],
            timeout=OPERATION_TIMEOUT_SECONDS,
            env=environment,
            check=False,
            cwd=REPO,
        )
        lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
        result = (
            json.loads(lines[-1])
            if lines
            else {
                "operation": operation,
                "ok": False,
                "summary": {},
                "output": "",
                "error": f"exit {completed.returncode}: {completed.stderr[-4000:]}",
            }
        )
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        (ARTEFACTS / f"{step}.txt").write_text(result["output"] + "\n" + result["error"])
        self.results[step] = result
        return result


def _changed_revision_stack(path: Path) -> None:
    """The stack file with the canary and the scaled model at a new revision (weights and their S3
    prefix)."""
    document = yaml.safe_load(CLUSTER_STACK_FILE.read_text())
    for model in document["config"]["vllm-platform:models"]:
        if model["name"] in (CANARY_MODEL, SCALED_MODEL):
            old = model["source"]["revision"]
            model["source"]["revision"] = NEW_REVISION
            model["source"]["s3_uri"] = model["source"]["s3_uri"].replace(old, NEW_REVISION)
    path.write_text(yaml.safe_dump(document, sort_keys=False))


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory):
    require_cluster_tools(("rollouts-controller", "pulumi", "pulumi-resource-kubernetes"))
    require_chart_cache()
    workdir = tmp_path_factory.mktemp("tier2")
    config = load_stack("cluster", stack_file=CLUSTER_STACK_FILE)
    with cluster_for(config, workdir / "cluster") as cluster:
        project = workdir / "project"
        write_project(project, CLUSTER_STACK_FILE, tools.program("pulumi-resource-kubernetes").parent)
        deployer = Deployer(cluster, project)
        observed: dict[str, Any] = {"config": config}
        start_rollouts_controller(cluster)

        deployer.run("1-preview", "preview")
        try:
            _deploy_and_change(cluster, deployer, project, observed)
        finally:
            deployer.run("8-destroy", "destroy")
            observed["after_destroy"] = _leftovers(cluster)
        yield deployer.results, observed


def _deploy_and_change(cluster: Cluster, deployer: Deployer, project: Path, observed: dict[str, Any]) -> None:
    """Steps 2-7; each runs only if the one it builds on succeeded (the tests name what did not run)."""
    if not deployer.run("2-up", "up")["ok"]:
        return
    # Bounded; pods still pending after it fail the placement tests, with the scheduler's reason.
    with contextlib.suppress(ClusterError):
        cluster.wait_for("every pod Running", lambda: not pending_pods(cluster), timeout=180)
    observed["pods_after_up"] = cluster.get("pods")
    observed["pending_after_up"] = pending_pods(cluster)
    observed["groups"] = node_groups_by_node(cluster)
    observed["owners"] = pods_by_owner(cluster)
    namespace = namespace_of(SCALED_MODEL)
    observed["to_zero_after_up"] = _scaled_model_state(cluster)
    deployer.run("3-preview-no-changes", "preview", "--expect-no-changes")
    deployer.run("4-refresh-no-changes", "refresh", "--expect-no-changes")
    # `kubectl scale` writes the /scale subresource, as KEDA (and the HPA controller) does.
    cluster.kubectl("scale", "deployment/vllm", "-n", namespace, f"--replicas={SCALED_REPLICAS}")
    with contextlib.suppress(ClusterError):  # bounded; test_vllm_pods_run_on_their_gpu_group reports it
        cluster.wait_for(
            f"{SCALED_REPLICAS} pods of {SCALED_MODEL} Running",
            lambda: _scaled_model_state(cluster)["running"] == SCALED_REPLICAS,
            timeout=120,
        )
    observed["vllm_pods"] = vllm_pods(cluster)
    deployer.run("5-up-after-autoscaler", "up", "--expect-no-changes")
    observed["scaled_replicas"] = _scaled_model_state(cluster)["replicas"]
    _changed_revision_stack(project / "Pulumi.cluster.yaml")
    deployer.run("6-preview-revision-diff", "preview", "--diff")
    if deployer.run("7-up-revision", "up")["ok"]:
        observed["canary"] = _canary_state(cluster)
        observed["scaled_after_revision"] = _scaled_model_state(cluster)


def _scaled_model_state(cluster: Cluster) -> dict[str, Any]:
    """SCALED_MODEL's Deployment: spec.replicas, its pods, which revision each Running one has."""
    namespace = namespace_of(SCALED_MODEL)
    deployment = cluster.get("deployment", namespace=namespace, name="vllm")
    pods = [p for p in cluster.get("pods", namespace=namespace) if not p["metadata"].get("deletionTimestamp")]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    return {
        "replicas": deployment["spec"].get("replicas"),
        "pods": len(pods),
        "running": len(running),
        "new_revision_running": sum(NEW_REVISION in json.dumps(p["spec"]["initContainers"]) for p in running),
        "replicasets": {
            rs["metadata"]["name"]: rs["status"].get("replicas", 0)
            for rs in cluster.get("replicasets", namespace=namespace)
        },
    }


def _canary_state(cluster: Cluster) -> dict[str, Any]:
    namespace = namespace_of(CANARY_MODEL)
    # In the canary's namespace: cluster-wide, the scaled model's two ReplicaSets already made two.
    with contextlib.suppress(ClusterError):  # bounded; the canary test reports what it found
        cluster.wait_for(
            "the canary ReplicaSet's pod Running",
            lambda: (
                len(cluster.get("replicasets", namespace=namespace)) >= 2
                and sum(
                    p["status"].get("phase") == "Running" for p in cluster.get("pods", namespace=namespace)
                )
                >= 2
            ),
            timeout=120,
        )
    return {
        "quota_checks": _quota_checks(cluster, namespace),
        "rollout": cluster.get("rollout", namespace=namespace, name="vllm"),
        "replicasets": cluster.get("replicasets", namespace=namespace),
        "pods": cluster.get("pods", namespace=namespace),
        "quota": cluster.get("resourcequota", namespace=namespace),
        "analysis_templates": cluster.get("analysistemplate", namespace=namespace),
    }


def _quota_checks(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """With the canary's pod running: a pod asking for the GPUs the quota has left is admitted, one
    asking for one more is refused (server-side dry runs through the real quota admission)."""
    quota = cluster.get("resourcequota", namespace=namespace, name="gpu-quota")["status"]
    left = int(quota["hard"][GPU_QUOTA]) - int(quota["used"][GPU_QUOTA])

    def try_pod(gpus: int):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"quota-probe-{gpus}", "namespace": namespace},
            "spec": {
                "containers": [
                    {
                        "name": "probe",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": {"nvidia.com/gpu": str(gpus)},
                            "limits": {"nvidia.com/gpu": str(gpus)},
                        },
                    }
                ]
            },
        }
        return cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(pod), check=False
        )

    within, beyond = try_pod(left) if left > 0 else None, try_pod(left + 1)
    return {
        "left": left,
        "within_admitted": within is None or within.returncode == 0,
        "beyond_refused": beyond.returncode != 0 and "exceeded quota" in beyond.stderr,
        "beyond_message": beyond.stderr,
    }


def _leftovers(cluster: Cluster) -> dict[str, Any]:
    ours = {namespace_of(model) for model in ("llama-3-1-8b", "qwen2-5-7b-tp2")} | {
        "vllm-router",
        "monitoring",
    }

    def gone():
        return not ours & {ns["metadata"]["name"] for ns in cluster.get("namespaces")}

    # Bounded; what is left after it is reported by test_destroy_leaves_nothing_of_ours.
    with contextlib.suppress(ClusterError):
        cluster.wait_for("our namespaces to be deleted", gone, timeout=180, interval=2)
    return {
        "namespaces": [ns["metadata"]["name"] for ns in cluster.get("namespaces")],
        "managed": cluster.get_selected("all", "app.kubernetes.io/managed-by=pulumi"),
    }


def _step(results: dict[str, Any], step: str) -> dict[str, Any]:
    assert step in results, f"step {step} did not run (an earlier step failed: {sorted(results)})"
    result = results[step]
    assert result["ok"], f"{step}: {result['error'][-3000:]}"
    return result


def test_preview_on_an_empty_cluster_plans_every_resource(lifecycle):
    results, _ = lifecycle
    summary = _step(results, "1-preview")["summary"]
    assert summary.get("create", 0) > 100, summary


def test_up_deploys_the_stack(lifecycle):
    results, observed = lifecycle
    _step(results, "2-up")
    assert observed["pods_after_up"]
    assert not observed["pending_after_up"]


def test_second_preview_and_refresh_show_no_changes(lifecycle):
    results, _ = lifecycle
    _step(results, "3-preview-no-changes")
    _step(results, "4-refresh-no-changes")


def test_the_first_up_creates_a_to_zero_model_at_zero_replicas(lifecycle):
    # Created at the default 1, the model's first `up` started a replica (on EKS, a GPU node) and
    # waited for it, before KEDA took it back to zero (issue 40). No KEDA operator runs here.
    results, observed = lifecycle
    _step(results, "2-up")
    state = observed["to_zero_after_up"]
    assert state["replicas"] == 0, state
    assert state["pods"] == 0 and set(state["replicasets"].values()) <= {0}, state


def test_up_leaves_the_autoscalers_replicas_alone(lifecycle):
    results, observed = lifecycle
    _step(results, "5-up-after-autoscaler")
    assert observed["scaled_replicas"] == SCALED_REPLICAS


def test_an_update_of_the_to_zero_model_keeps_the_count_keda_set(lifecycle):
    # The revision change sends the whole Deployment: spec.replicas, ignored, is KEDA's (kubectl
    # scale's) field by then, and the provider leaves it out of the apply.
    results, observed = lifecycle
    _step(results, "7-up-revision")
    state = observed["scaled_after_revision"]
    assert state["replicas"] == SCALED_REPLICAS, state
    assert state["new_revision_running"] == SCALED_REPLICAS, state


def test_vllm_pods_run_on_their_gpu_group(lifecycle):
    _, observed = lifecycle
    config = observed["config"]
    pods = observed["vllm_pods"]
    assert {pod["metadata"]["labels"]["vllm-platform/model"] for pod in pods} == {
        m.name for m in config.models
    }
    for pod in pods:
        model = next(m for m in config.models if m.name == pod["metadata"]["labels"]["vllm-platform/model"])
        assert observed["groups"][pod["spec"]["nodeName"]] == model.gpu_group


def test_gpu_daemonsets_run_on_every_gpu_node_and_nowhere_else(lifecycle):
    _, observed = lifecycle
    config = observed["config"]
    gpu_nodes = {node for node, group in observed["groups"].items() if group in config.node_groups.gpu}
    for daemonset in GPU_DAEMONSETS:
        assert {pod["spec"]["nodeName"] for pod in observed["owners"].get(daemonset, [])} == gpu_nodes


def test_revision_change_preview_shows_the_rollout_diff(lifecycle):
    results, _ = lifecycle
    output = _step(results, "6-preview-revision-diff")["output"]
    assert NEW_REVISION in output
    assert re.search(r"~ .*kubernetes:argoproj.io/v1alpha1:Rollout", output), output[-3000:]


def test_revision_change_starts_a_canary_that_fits_the_gpu_quota(lifecycle):
    results, observed = lifecycle
    _step(results, "7-up-revision")
    canary = observed["canary"]
    images_and_revisions = json.dumps(canary["rollout"]["spec"]["template"])
    assert NEW_REVISION in images_and_revisions
    assert canary["analysis_templates"]
    running = [pod for pod in canary["pods"] if pod["status"].get("phase") == "Running"]
    assert len(running) == 2, [pod["metadata"]["name"] for pod in canary["pods"]]


def test_gpu_quota_admits_what_is_left_beside_the_canary_and_refuses_one_more(lifecycle):
    _, observed = lifecycle
    checks = observed["canary"]["quota_checks"]
    assert checks["within_admitted"]
    assert checks["beyond_refused"], checks["beyond_message"]


def test_destroy_leaves_nothing_of_ours(lifecycle):
    results, observed = lifecycle
    _step(results, "8-destroy")
    leftovers = observed["after_destroy"]
    assert not {"vllm-router", "monitoring", "vllm-llama-3-1-8b", "vllm-qwen2-5-7b-tp2"} & set(
        leftovers["namespaces"]
    ), leftovers["namespaces"]
    assert not leftovers["managed"]
