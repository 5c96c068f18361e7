"""Shared fixtures: the real Pulumi program rendered under recording mocks, once per stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.render import RenderResult, render_stack
from tests.support.charts import CHART_DATA_SKIP_REASON, CHARTS_SKIP_REASON

REPO_ROOT = Path(__file__).resolve().parents[1]
STACKS = ("dev", "staging", "prod")
"""The three environments of one program."""
EXAMPLE_STACKS = ("multinode",)
"""Shipped stacks beside the environments: `multinode` serves a model larger than one node (issue 42,
docs/multi-node.md)."""
TEST_STACKS_DIR = Path(__file__).resolve().parent / "stacks"

_cache: dict[tuple[str, str | None], RenderResult] = {}


def rendered(stack: str, stack_file: Path | None = None) -> RenderResult:
    """Render a stack once per test session (the program is deterministic).

    Chart releases are expanded when the chart cache holds the pinned charts; without them only
    their values are rendered, and tests that need chart objects call
    tests.support.charts.require_charts() (a tampered cache fails the render).
    """
    key = (stack, str(stack_file) if stack_file else None)
    if key not in _cache:
        _cache[key] = render_stack(stack, stack_file=stack_file, allow_missing_charts=True)
    return _cache[key]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say how many tests were skipped for want of the charts or their data, and what to do."""
    skipped = terminalreporter.stats.get("skipped", [])
    for reason in (CHARTS_SKIP_REASON, CHART_DATA_SKIP_REASON):
        count = sum(1 for report in skipped if reason in str(report.longrepr))
        if count:
            terminalreporter.write_line(f"{count} tests skipped: {reason}", yellow=True)


WORKLOAD_KINDS = ("Deployment", "Rollout")
"""What runs a model's vLLM pods: a Deployment, or an Argo Rollouts Rollout (rollout.strategy canary)."""


def model_workloads(result: RenderResult, namespace: str | None = None) -> list[dict[str, Any]]:
    """The `vllm` Deployments and Rollouts of a render (of one model namespace when given)."""
    return [obj for kind in WORKLOAD_KINDS for obj in result.find(kind, "vllm", namespace)]


@pytest.fixture(params=STACKS)
def stack_render(request: pytest.FixtureRequest) -> RenderResult:
    """Parametrised over every stack in stacks/."""
    return rendered(request.param)


@pytest.fixture
def existing_mode_render() -> RenderResult:
    return rendered("existing", TEST_STACKS_DIR / "Pulumi.existing.yaml")
