"""What does not fit, on the real control plane (issue 33, item 6; issue 40, item 5).

The stack is tests/stacks/Pulumi.cluster.yaml, varied; the cluster has its groups as small as the
variant "as the cluster is" says, while the objects applied are the full `vllm-platform render` of a
variant that fits (as test_deploy_render_apply.py applies prod's). In one cluster:

- **A GPU group too small for min_replicas**: the 8B model as a Deployment autoscaled from 9
  replicas (one GPU each) on one 8-GPU H200 node. The real HPA controller scales it to 9, the real
  scheduler places 8 and leaves the ninth Pending with its reason, and `vllm-platform validate` of
  the stack with the group as the cluster has it refuses `min_replicas` with the number that fits.
- **A rolling update's surge with no GPU set free** (issue 40): the TP=2 Qwen, autoscaled 1..2, at
  its 2 replicas on one 4-GPU L40S node. A new revision's surge pod (maxSurge 1: the model may run
  one replica) stays Pending with "Insufficient nvidia.com/gpu" and no old pod may go, so the
  update stalls; `validate` refuses that stack at `rollout.replace_in_place` and names the fix, and
  the fix (the same revision with `rollout.replace_in_place: true`) completes the update on the
  same cluster.
- **The router's zone spread** (issue 40): three zones, the two system nodes in two of them and the
  H200 node alone in the third (tests/cluster/nodes.py places nodes as the stack's subnets do), and
  three router replicas: all three run, on system nodes, because the spread counts only zones of
  nodes the router tolerates (`nodeTaintsPolicy: Honor`).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config import load_stack_config
from domain.labels import ROUTER_NAMESPACE
from tests.cluster.control_plane import Cluster, ClusterError
from tests.cluster.fixtures import (
    CLUSTER_STACK_FILE,
    REPO,
    cluster_for,
    render_objects,
    require_chart_cache,
    require_cluster_tools,
)
from tests.cluster.placement import pending_pods

pytestmark = pytest.mark.cluster

MODEL = "llama-3-1-8b"
MIN_REPLICAS = 9
GPUS_PER_NODE = 8  # p5en.48xlarge (domain/catalogue/gpu_instances.yaml)
SURGE_MODEL = "qwen2-5-7b-tp2"
"""TP=2 on g6e.12xlarge (4 GPUs): one node holds its 2 replicas and nothing more."""
SURGE_NAMESPACE = f"vllm-{SURGE_MODEL}"
SURGE_MAX_REPLICAS = 2
NEW_REVISION = "2222222222222222222222222222222222222222"
ROUTER_REPLICAS = 3
ZONES = 3
SYSTEM_NODES = 2


def _variant(
    path: Path,
    *,
    h200_nodes: int,
    l40s_nodes: int,
    revision: str | None = None,
    replace_in_place: bool = False,
) -> Path:
    """The cluster stack with MODEL on a Deployment autoscaled from MIN_REPLICAS, SURGE_MODEL autoscaled
    1..SURGE_MAX_REPLICAS on a rolling update (at `revision`, replaced in place if asked), three zones
    with two system nodes, three router replicas, and the GPU groups at the given sizes."""
    document = yaml.safe_load(CLUSTER_STACK_FILE.read_text())
    config = document["config"]
    config["vllm-platform:cluster"]["availability_zone_count"] = ZONES
    groups = config["vllm-platform:node_groups"]
    groups["system"].update(min_size=SYSTEM_NODES, desired_size=SYSTEM_NODES, max_size=SYSTEM_NODES)
    groups["gpu"]["h200"].update(min_size=1, desired_size=1, max_size=h200_nodes)
    groups["gpu"]["l40s"].update(min_size=1, desired_size=1, max_size=l40s_nodes)
    config["vllm-platform:router"]["replicas"] = ROUTER_REPLICAS
    for model in config["vllm-platform:models"]:
        if model["name"] == MODEL:
            model.pop("rollout", None)
            model["autoscaling"].update(min_replicas=MIN_REPLICAS, max_replicas=MIN_REPLICAS + 2)
        if model["name"] == SURGE_MODEL:
            model["autoscaling"].update(min_replicas=1, max_replicas=SURGE_MAX_REPLICAS)
            if replace_in_place:
                model["rollout"] = {"replace_in_place": True}
            if revision:
                old = model["source"]["revision"]
                model["source"]["revision"] = revision
                model["source"]["s3_uri"] = model["source"]["s3_uri"].replace(old, revision)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _validate(stack_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", "validate", "cluster", "--file", str(stack_file)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _surge_deployment(workdir: Path, stack_file: Path) -> dict[str, Any] | str:
    """SURGE_MODEL's Deployment as `render` writes it for `stack_file`, or why the render failed."""
    try:
        objects = render_objects("cluster", workdir, stack_file=stack_file)
    except AssertionError as error:  # render_objects asserts on the CLI's exit code
        return f"render of {stack_file.name} failed: {error}"
    (deployment,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"].get("namespace") == SURGE_NAMESPACE
    ]
    return deployment


def _surge_state(cluster: Cluster) -> dict[str, Any]:
    deployment = cluster.get("deployment", namespace=SURGE_NAMESPACE, name="vllm")
    pods = [
        p
        for p in cluster.get("pods", namespace=SURGE_NAMESPACE)
        if not p["metadata"].get("deletionTimestamp")
    ]
    return {
        "status": deployment.get("status", {}),
        "generation": deployment["metadata"]["generation"],
        "strategy": deployment["spec"]["strategy"],
        "running": sum(p["status"].get("phase") == "Running" for p in pods),
        "pending": {n: r for n, r in pending_pods(cluster).items() if n.startswith(f"{SURGE_NAMESPACE}/")},
        "revisions": sorted(
            {
                "new" if NEW_REVISION in yaml.safe_dump(p["spec"]["initContainers"]) else "old"
                for p in pods
                if p["status"].get("phase") == "Running"
            }
        ),
    }


def _stalled(cluster: Cluster) -> dict[str, Any] | None:
    """The surge pod of the new revision exists and the scheduler has said why it cannot place it."""
    state = _surge_state(cluster)
    said = [reason for reason in state["pending"].values() if "0/" in reason]
    return state if state["status"].get("updatedReplicas") == 1 and said else None


def _updated(cluster: Cluster) -> dict[str, Any] | None:
    """Every replica of the new revision Running, none of the old left."""
    state = _surge_state(cluster)
    status = state["status"]
    done = (
        status.get("observedGeneration") == state["generation"]
        and status.get("replicas") == status.get("updatedReplicas") == SURGE_MAX_REPLICAS
        and status.get("availableReplicas") == SURGE_MAX_REPLICAS
        and state["revisions"] == ["new"]
        and state["running"] == SURGE_MAX_REPLICAS
    )
    return state if done else None


@pytest.fixture(scope="module")
def too_small(tmp_path_factory):
    require_cluster_tools()
    require_chart_cache()
    workdir = tmp_path_factory.mktemp("too-small")
    fits = _variant(workdir / "Pulumi.fits.yaml", h200_nodes=2, l40s_nodes=2)
    as_the_cluster_is = _variant(workdir / "Pulumi.one-node.yaml", h200_nodes=1, l40s_nodes=1)
    fixed_as_the_cluster_is = _variant(
        workdir / "Pulumi.one-node-in-place.yaml",
        h200_nodes=1,
        l40s_nodes=1,
        revision=NEW_REVISION,
        replace_in_place=True,
    )
    objects = render_objects("cluster", workdir / "render", stack_file=fits)
    new_revision = _surge_deployment(
        workdir / "render-new-revision",
        _variant(
            workdir / "Pulumi.fits-new-revision.yaml", h200_nodes=2, l40s_nodes=2, revision=NEW_REVISION
        ),
    )
    in_place = _surge_deployment(
        workdir / "render-in-place",
        _variant(
            workdir / "Pulumi.fits-in-place.yaml",
            h200_nodes=2,
            l40s_nodes=2,
            revision=NEW_REVISION,
            replace_in_place=True,
        ),
    )
    observed: dict[str, Any] = {
        "validate": _validate(as_the_cluster_is),
        "validate_fixed": _validate(fixed_as_the_cluster_is),
        "in_place_render": in_place,
    }
    # The nodes come from the stack as the cluster has it, which `validate` refuses: parsed, not checked.
    nodes_config = load_stack_config("cluster", stack_file=as_the_cluster_is)
    with cluster_for(nodes_config, workdir / "cluster") as cluster:
        cluster.apply_in_dependency_order(objects)

        def scaled_and_placed():
            pods = cluster.get_selected("pods", f"vllm-platform/model={MODEL}")
            router = [p for p in cluster.get("pods", namespace=ROUTER_NAMESPACE) if p["status"].get("phase")]
            return (
                len(pods) >= MIN_REPLICAS
                and sum(p["status"].get("phase") == "Running" for p in pods) >= 8
                and len(router) >= ROUTER_REPLICAS
            )

        # Bounded; the tests below report what did not happen.
        with contextlib.suppress(ClusterError):
            cluster.wait_for(
                f"{MIN_REPLICAS} pods of {MODEL}, 8 of them Running, and the router's pods",
                scaled_and_placed,
                timeout=180,
            )
        with contextlib.suppress(ClusterError):  # the router's pods Running, or the reason they are not
            cluster.wait_for(
                "the router's pods Running",
                lambda: not [n for n in pending_pods(cluster) if n.startswith(f"{ROUTER_NAMESPACE}/")],
                timeout=30,
            )
        observed["pending"] = pending_pods(cluster)
        observed["pods"] = cluster.get_selected("pods", f"vllm-platform/model={MODEL}")
        observed["nodes"] = cluster.get("nodes")
        observed["router_pods"] = cluster.get("pods", namespace=ROUTER_NAMESPACE)
        _roll_out_the_surge_model(cluster, observed, new_revision, in_place)
        yield observed


def _roll_out_the_surge_model(
    cluster: Cluster,
    observed: dict[str, Any],
    new_revision: dict[str, Any] | str,
    in_place: dict[str, Any] | str,
) -> None:
    """At its max replicas (scaled through /scale as KEDA would), a new revision; then the fix."""
    try:
        cluster.kubectl("scale", "deployment/vllm", "-n", SURGE_NAMESPACE, f"--replicas={SURGE_MAX_REPLICAS}")
        observed["at_max"] = cluster.wait_for(
            f"{SURGE_MAX_REPLICAS} pods of {SURGE_MODEL} Running",
            lambda: (state := _surge_state(cluster))["running"] == SURGE_MAX_REPLICAS and state,
            timeout=120,
        )
        assert isinstance(new_revision, dict), new_revision
        cluster.apply_objects([new_revision])
        observed["stalled"] = cluster.wait_for(
            "the surge pod's scheduling verdict", lambda: _stalled(cluster)
        )
        if isinstance(in_place, str):
            observed["fix_error"] = in_place
            return
        result = cluster.apply_objects([in_place])
        observed["fix_apply"] = result.stdout + result.stderr
        observed["fixed"] = cluster.wait_for(
            f"every replica of {SURGE_MODEL} at the new revision", lambda: _updated(cluster), timeout=180
        )
    except (ClusterError, AssertionError) as error:
        observed["surge_error"] = str(error)
        observed["surge_last"] = _surge_state(cluster)


def test_the_scheduler_leaves_what_does_not_fit_pending_with_its_reason(too_small):
    pods = too_small["pods"]
    pending = {
        name: reason for name, reason in too_small["pending"].items() if name.startswith(f"vllm-{MODEL}/")
    }
    assert len(pods) == MIN_REPLICAS, "the HPA controller did not scale the Deployment to min_replicas"
    assert len(pending) == MIN_REPLICAS - GPUS_PER_NODE, pending
    assert all("Insufficient nvidia.com/gpu" in reason for reason in pending.values()), pending


def test_validate_had_said_so_for_the_group_as_the_cluster_has_it(too_small):
    validate = too_small["validate"]
    output = validate.stdout + validate.stderr
    assert validate.returncode == 2, output
    assert f"autoscaling.min_replicas = {MIN_REPLICAS}" in output
    assert f"holds at most {GPUS_PER_NODE} replicas" in output
    assert "Traceback" not in output


def test_a_surge_pod_with_no_free_gpu_set_stalls_the_rolling_update(too_small):
    assert "stalled" in too_small, (too_small.get("surge_error"), too_small.get("surge_last"))
    stalled = too_small["stalled"]
    assert stalled["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    # The old replicas keep serving and none may go: the update cannot progress.
    assert stalled["revisions"] == ["old"] and stalled["running"] == SURGE_MAX_REPLICAS
    (reason,) = stalled["pending"].values()
    assert "Insufficient nvidia.com/gpu" in reason, reason


def test_validate_refuses_that_surge_for_the_group_as_the_cluster_has_it(too_small):
    output = too_small["validate"].stdout + too_small["validate"].stderr
    assert "vllm-platform:models[1].rollout.replace_in_place = false" in output, output
    assert "a rolling update surges one pod of 2 GPU(s)" in output
    assert "node group 'l40s' has 4 GPUs (max_size 1 × 4 per node)" in output
    assert "set rollout.replace_in_place: true" in output


def test_the_fix_validate_names_completes_the_update_on_the_same_cluster(too_small):
    assert "fixed" in too_small, (
        too_small.get("fix_error") or too_small.get("surge_error"),
        too_small.get("surge_last"),
    )
    assert too_small["fixed"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # And `validate` has nothing more to say about the surge (the 8B's replicas stay refused).
    output = too_small["validate_fixed"].stdout + too_small["validate_fixed"].stderr
    keys = [line.split(" =")[0].strip() for line in output.splitlines() if line.startswith("  vllm-")]
    assert keys == [
        "vllm-platform:models[0].autoscaling.min_replicas",
        "vllm-platform:models[0].autoscaling.max_replicas",
    ], output


def test_the_router_spreads_over_the_zones_of_the_nodes_it_may_run_on(too_small):
    zones: dict[str, set[str]] = defaultdict(set)
    groups = {}
    for node in too_small["nodes"]:
        labels = node["metadata"]["labels"]
        groups[node["metadata"]["name"]] = labels["eks.amazonaws.com/nodegroup"]
        zones[labels["topology.kubernetes.io/zone"]].add(labels["eks.amazonaws.com/nodegroup"])
    # What makes the case: a zone whose only node is a GPU node the router may not run on.
    assert len(zones) == ZONES and any(found == {"h200"} for found in zones.values()), dict(zones)
    pods = too_small["router_pods"]
    pending = {n: r for n, r in too_small["pending"].items() if n.startswith(f"{ROUTER_NAMESPACE}/")}
    assert not pending, "\n".join(f"{name}: {reason}" for name, reason in pending.items())
    assert len(pods) == ROUTER_REPLICAS
    assert {groups[pod["spec"]["nodeName"]] for pod in pods} == {"system"}
