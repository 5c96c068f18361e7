"""A GPU group too small for a model's min_replicas, on the real control plane (issue 33, item 6).

The stack is tests/stacks/Pulumi.cluster.yaml with the 8B model as a Deployment autoscaled from 9
replicas (one GPU each): a group of two 8-GPU H200 nodes holds them. The cluster has only one of
those nodes. The real HPA controller scales the Deployment to its minimum, the real scheduler places
the 8 that fit and leaves the ninth Pending with its reason, and `vllm-platform validate` of the same
stack with the group as the cluster has it refuses `min_replicas` with the number that fits.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import yaml

from infra.config import load_stack_config
from tests.cluster.control_plane import ClusterError
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
GPUS_PER_NODE = 8  # p5en.48xlarge (infra/catalogue/gpu_instances.yaml)


def _variant(path, *, h200_nodes: int):
    """The cluster stack with MODEL on a Deployment autoscaled from MIN_REPLICAS, and the h200 group
    at `h200_nodes` nodes."""
    document = yaml.safe_load(CLUSTER_STACK_FILE.read_text())
    config = document["config"]
    config["vllm-platform:node_groups"]["gpu"]["h200"].update(min_size=1, desired_size=1, max_size=h200_nodes)
    for model in config["vllm-platform:models"]:
        if model["name"] == MODEL:
            model.pop("rollout", None)
            model["autoscaling"].update(min_replicas=MIN_REPLICAS, max_replicas=MIN_REPLICAS + 2)
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def too_small(tmp_path_factory):
    require_cluster_tools()
    require_chart_cache()
    workdir = tmp_path_factory.mktemp("too-small")
    fits = _variant(workdir / "Pulumi.fits.yaml", h200_nodes=2)
    as_the_cluster_is = _variant(workdir / "Pulumi.one-node.yaml", h200_nodes=1)
    objects = render_objects("cluster", workdir / "render", stack_file=fits)
    validate = subprocess.run(
        [sys.executable, "-m", "infra.cli", "validate", "cluster", "--file", str(as_the_cluster_is)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The nodes come from the stack as the cluster has it, which `validate` refuses: parsed, not checked.
    nodes_config = load_stack_config("cluster", stack_file=as_the_cluster_is)
    with cluster_for(nodes_config, workdir / "cluster") as cluster:
        cluster.apply_in_dependency_order(objects)

        def scaled_and_placed():
            pods = cluster.get_selected("pods", f"vllm-platform/model={MODEL}")
            return len(pods) >= MIN_REPLICAS and sum(p["status"].get("phase") == "Running" for p in pods) >= 8

        # Bounded; the tests below report what did not happen.
        with contextlib.suppress(ClusterError):
            cluster.wait_for(
                f"{MIN_REPLICAS} pods of {MODEL}, 8 of them Running", scaled_and_placed, timeout=180
            )
        pending = {
            name: reason
            for name, reason in pending_pods(cluster).items()
            if name.startswith(f"vllm-{MODEL}/")
        }
        yield validate, pending, cluster.get_selected("pods", f"vllm-platform/model={MODEL}")


def test_the_scheduler_leaves_what_does_not_fit_pending_with_its_reason(too_small):
    _, pending, pods = too_small
    assert len(pods) == MIN_REPLICAS, "the HPA controller did not scale the Deployment to min_replicas"
    assert len(pending) == MIN_REPLICAS - GPUS_PER_NODE, pending
    assert all("Insufficient nvidia.com/gpu" in reason for reason in pending.values()), pending


def test_validate_had_said_so_for_the_group_as_the_cluster_has_it(too_small):
    validate, _, _ = too_small
    output = validate.stdout + validate.stderr
    assert validate.returncode == 2, output
    assert f"autoscaling.min_replicas = {MIN_REPLICAS}" in output
    assert f"holds at most {GPUS_PER_NODE} replicas" in output
    assert "Traceback" not in output
