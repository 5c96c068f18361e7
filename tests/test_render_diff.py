"""scripts/render-diff.py: the pull-request comment that shows what a change does to the rendered stacks."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from infra.render import RenderResult, write_render
from tests.conftest import REPO_ROOT, rendered
from tests.support.charts import require_charts

SCRIPT = REPO_ROOT / "scripts" / "render-diff.py"


def _diff(base: Path, head: Path, *extra: str) -> str:
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), str(base), str(head), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return completed.stdout


def _changed_dev_render() -> RenderResult:
    """dev with a longer grace period, a changed Deployment selector and the Service gone."""
    result = copy.deepcopy(rendered("dev"))
    deployment = next(
        r
        for r in result.resources
        if r.is_kubernetes_object
        and r.inputs["kind"] == "Deployment"
        and r.inputs["metadata"]["name"] == "vllm"
    )
    deployment.inputs["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 200.0
    deployment.inputs["spec"]["selector"]["matchLabels"]["tier"] = "gold"
    result.resources = [
        r
        for r in result.resources
        if not (
            r.is_kubernetes_object
            and r.inputs["kind"] == "Service"
            and r.inputs["metadata"]["name"] == "vllm"
        )
    ]
    return result


def test_identical_renders_produce_a_no_change_comment(tmp_path: Path) -> None:
    write_render(rendered("dev"), tmp_path / "base" / "dev")
    write_render(rendered("dev"), tmp_path / "head" / "dev")
    comment = _diff(tmp_path / "base", tmp_path / "head")
    assert comment.startswith("<!-- vllm-platform render-diff -->\n## Rendered changes")
    assert "No change to any rendered Kubernetes object, Helm release or AWS resource." in comment


def test_changes_are_listed_per_stack_with_deletions_and_replacements_first(tmp_path: Path) -> None:
    write_render(rendered("dev"), tmp_path / "base" / "dev")
    write_render(_changed_dev_render(), tmp_path / "head" / "dev")
    comment = _diff(tmp_path / "base", tmp_path / "head")
    unchanged = (
        len(rendered("dev").kubernetes_objects)
        + len(rendered("dev").deployed_chart_objects)
        + len(rendered("dev").helm_releases)
        + len(rendered("dev").aws_resources)
        - 2
    )
    assert f"| dev | 0 | 1 | 1 | {unchanged} |" in comment
    warnings = comment.index("### ⚠️ Deletions and replacements")
    assert comment.index("- **dev**: deletes Service vllm-qwen2-5-7b/vllm") > warnings
    assert (
        "- **dev**: Deployment vllm-qwen2-5-7b/vllm changes `spec.selector` (replaced, not updated in place)"
        in comment
    )
    # Integers stay integers in the diff (the render's mocks carry numbers as floats).
    assert "-      terminationGracePeriodSeconds: 150\n+      terminationGracePeriodSeconds: 200" in comment
    assert "+      tier: gold" in comment


def test_a_stack_added_by_the_pull_request_shows_as_all_added(tmp_path: Path) -> None:
    write_render(rendered("dev"), tmp_path / "base" / "dev")
    write_render(rendered("dev"), tmp_path / "head" / "dev")
    write_render(rendered("staging"), tmp_path / "head" / "staging")
    comment = _diff(tmp_path / "base", tmp_path / "head")
    total = (
        len(rendered("staging").kubernetes_objects)
        + len(rendered("staging").deployed_chart_objects)
        + len(rendered("staging").helm_releases)
        + len(rendered("staging").aws_resources)
    )
    assert f"| staging | {total} | 0 | 0 | 0 |" in comment


def test_a_long_diff_is_cut_to_fit_a_comment_and_says_so(tmp_path: Path) -> None:
    write_render(rendered("prod"), tmp_path / "head" / "prod")
    (tmp_path / "base").mkdir()
    comment = _diff(tmp_path / "base", tmp_path / "head", "--max-chars", "5000")
    assert len(comment) <= 5000
    assert "**Diff truncated** to fit a comment" in comment
    assert comment.count("```") % 2 == 0
    assert comment.count("<details>") == comment.count("</details>")


def test_two_single_renders_are_compared_as_one_stack(tmp_path: Path) -> None:
    write_render(rendered("dev"), tmp_path / "before")
    write_render(_changed_dev_render(), tmp_path / "after")
    assert "| after | 0 | 1 | 1 |" in _diff(tmp_path / "before", tmp_path / "after")


def _with_chart_object(
    result: RenderResult, kind: str, name: str, change: Callable[[dict], None]
) -> RenderResult:
    require_charts()
    changed = copy.deepcopy(result)
    (item,) = [item for item in changed.chart_objects if item.kind == kind and item.name == name]
    change(item.object)
    return changed


def test_a_chart_object_change_shows_as_the_object_with_its_release(tmp_path: Path) -> None:
    def bump(daemonset: dict) -> None:
        daemonset["spec"]["template"]["spec"]["containers"][0]["image"] += "-bumped"

    write_render(rendered("dev"), tmp_path / "base" / "dev")
    write_render(
        _with_chart_object(rendered("dev"), "DaemonSet", "dcgm-exporter", bump), tmp_path / "head" / "dev"
    )
    comment = _diff(tmp_path / "base", tmp_path / "head")
    assert "DaemonSet kube-system/dcgm-exporter (chart release dcgm-exporter)" in comment
    assert "-bumped" in comment


def test_webhook_certificates_a_chart_generates_at_render_are_not_a_change(tmp_path: Path) -> None:
    def regenerate(secret: dict) -> None:
        secret["data"] = {key: "bmV3IGJ5dGVz" for key in secret["data"]}

    write_render(rendered("dev"), tmp_path / "base" / "dev")
    head = _with_chart_object(rendered("dev"), "Secret", "aws-load-balancer-tls", regenerate)
    write_render(head, tmp_path / "head" / "dev")
    assert "No change to any rendered" in _diff(tmp_path / "base", tmp_path / "head")


def _prod_with_steps(steps: list[int]) -> RenderResult:
    """prod with the first canary model's Rollout going through `steps` (as the program writes them)."""
    result = copy.deepcopy(rendered("prod"))
    rollout = next(r for r in result.resources if r.is_kubernetes_object and r.inputs["kind"] == "Rollout")
    canary = rollout.inputs["spec"]["strategy"]["canary"]
    analysis = canary["steps"][1]
    canary["steps"] = [step for weight in steps for step in ({"setWeight": weight}, analysis)]
    return result


def test_a_change_to_a_rollouts_steps_is_summarised_as_the_steps_before_and_after(tmp_path: Path) -> None:
    write_render(rendered("prod"), tmp_path / "base" / "prod")
    write_render(_prod_with_steps([5, 25, 60]), tmp_path / "head" / "prod")
    comment = _diff(tmp_path / "base", tmp_path / "head")
    [line] = [line for line in comment.splitlines() if line.startswith("- **prod**: Rollout")]
    assert line.endswith(
        "`10% → analysis (vllm-canary) → 50% → analysis (vllm-canary) → 100%` → "
        "`5% → analysis (vllm-canary) → 25% → analysis (vllm-canary) → 60% → analysis (vllm-canary) → 100%`"
    )
    assert "### Canary rollout steps" in comment


def test_switching_a_model_to_canary_shows_its_steps_and_unchanged_steps_show_nothing(tmp_path: Path) -> None:
    write_render(rendered("prod"), tmp_path / "base" / "prod")
    write_render(rendered("prod"), tmp_path / "head" / "prod")
    assert "Canary rollout steps" not in _diff(tmp_path / "base", tmp_path / "head")
    empty = tmp_path / "empty" / "prod"
    write_render(copy.deepcopy(rendered("dev")), empty)
    comment = _diff(tmp_path / "empty", tmp_path / "head")
    assert "(new canary): `10% → analysis (vllm-canary) → 50% → analysis (vllm-canary) → 100%`" in comment
