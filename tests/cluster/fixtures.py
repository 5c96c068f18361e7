"""pytest helpers shared by the deploy tests: a cluster for a stack, the objects of a render."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.helm.cache import check_cache
from domain.config import PlatformConfig
from infra.render import read_yaml_documents
from tests.cluster import tools
from tests.cluster.control_plane import PROGRAMS, Cluster, start_cluster
from tests.cluster.netns import NetworkNamespace
from tests.cluster.nodes import stack_nodes

REPO = Path(__file__).resolve().parents[2]
CLUSTER_STACK_FILE = REPO / "tests" / "stacks" / "Pulumi.cluster.yaml"
"""The prod feature set in mode `existing`, for the real engine (tests/test_deploy_pulumi.py)."""


def require_cluster_tools(extra: tuple[str, ...] = ()) -> None:
    """Skip (with the reason in the run's summary) when a program could not be built here, or when
    this process may not create network namespaces."""
    reason = tools.missing_reason([*PROGRAMS, *extra])
    if reason:
        pytest.skip(f"cluster tests need the programs tools/build.sh builds; {reason}")
    if os.geteuid() != 0:
        pytest.skip("cluster tests create a network namespace (ip netns add), which needs root")


def require_chart_cache() -> None:
    problems = check_cache()
    if problems:
        pytest.skip(
            "cluster tests install the pinned charts; the chart cache is incomplete "
            f"({problems[0].message()}; run `vllm-platform charts pull` or set VLLM_PLATFORM_CHART_CACHE)"
        )


@contextlib.contextmanager
def cluster_for(
    config: PlatformConfig, workdir: Path, *, webhook_admission: bool = False
) -> Iterator[Cluster]:
    """A control plane with the stack's nodes at their groups' max sizes, torn down afterwards
    (`webhook_admission`: tests/cluster/control_plane.py `start_cluster`)."""
    with NetworkNamespace() as netns:
        yield start_cluster(netns, workdir, stack_nodes(config), webhook_admission=webhook_admission)


def render_objects(stack: str, out: Path, *, stack_file: Path | None = None) -> list[dict[str, Any]]:
    """`vllm-platform render` (the real CLI) into `out`; every object it wrote, ours and the charts'."""
    command = [sys.executable, "-m", "infra.cli", "render", stack, "--out", str(out)]
    if stack_file:
        command += ["--file", str(stack_file)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    objects = []
    for folder in ("kubernetes", "charts"):
        for path in sorted((out / folder).rglob("*.yaml")):
            objects.extend(read_yaml_documents(path))
    return objects
