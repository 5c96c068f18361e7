"""The startup budget: phases from the model's size and storage speeds; the probe allows exactly it."""

from __future__ import annotations

import math

from domain.capacity import plan_platform
from domain.capacity.startup import PHASES, plan_startup
from domain.config.engine import StartupConfig
from infra.render import RenderResult
from infra.stack_checks import load_stack
from tests.conftest import model_workloads

GIB = 1 << 30


def test_budget_is_the_sum_of_the_phases_times_the_safety_factor() -> None:
    startup = StartupConfig(
        image_pull_seconds=100,
        shared_volume_mib_per_second=200,
        weight_load_mib_per_second=1000,
        engine_start_seconds=50,
        compile_seconds=150,
        safety_factor=1.5,
    )
    plan = plan_startup(startup, 20 * GIB, local_nvme=True)
    assert dict(plan.phases) == {
        "image_pull": 100,
        "copy_to_nvme": 20 * 1024 / 200,
        "load_weights": 20 * 1024 / 1000,
        "engine_start": 50,
        "compile": 150,
    }
    one_node_phases = [name for name in PHASES if name not in ("allreduce_jit", "group_rendezvous")]
    assert [name for name, _ in plan.phases] == one_node_phases
    assert plan.budget_seconds == math.ceil((100 + 102.4 + 20.48 + 50 + 150) * 1.5)


def test_a_tensor_parallel_pod_also_budgets_the_all_reduce_kernel_build() -> None:
    # 2026-11-29 lab: the first TP=2 start built FlashInfer's trtllm all-reduce kernels for 174 s.
    startup = StartupConfig(allreduce_jit_seconds=180, safety_factor=1.5)
    single = plan_startup(startup, 10 * GIB, local_nvme=True)
    parallel = plan_startup(startup, 10 * GIB, local_nvme=True, tensor_parallel_size=2)
    assert [name for name, _ in parallel.phases] == [name for name in PHASES if name != "group_rendezvous"]
    assert dict(parallel.phases)["allreduce_jit"] == 180
    assert parallel.expected_seconds == single.expected_seconds + 180
    assert parallel.budget_seconds == math.ceil(parallel.expected_seconds * 1.5)


def test_without_local_nvme_vllm_reads_the_weights_from_the_shared_volume() -> None:
    startup = StartupConfig(shared_volume_mib_per_second=250, weight_load_mib_per_second=2000)
    plan = dict(plan_startup(startup, 10 * GIB, local_nvme=False).phases)
    assert plan["copy_to_nvme"] == 0
    assert plan["load_weights"] == 10 * 1024 / 250


def test_a_larger_model_gets_a_longer_budget_from_its_checkpoint_size() -> None:
    plan = plan_platform(load_stack("prod"))
    small, large = plan.models["llama-3-1-8b"], plan.models["llama-3-1-70b"]
    assert large.startup_budget_seconds > small.startup_budget_seconds
    load = dict(large.startup.phases)["load_weights"] / dict(small.startup.phases)["load_weights"]
    assert math.isclose(load, large.parameters / small.parameters, rel_tol=0.01)


def test_the_serving_units_startup_probe_allows_exactly_the_planned_budget(
    stack_render: RenderResult,
) -> None:
    config = load_stack(stack_render.stack)
    plan = plan_platform(config)
    for model in config.models:
        [deployment] = model_workloads(stack_render, model.namespace)
        [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
        probe = container["startupProbe"]
        allowed = probe["failureThreshold"] * probe["periodSeconds"]
        budget = plan.models[model.name].startup_budget_seconds
        assert budget <= allowed < budget + probe["periodSeconds"], (model.name, allowed, budget)
        assert probe["periodSeconds"] == model.startup.probe_period_seconds


def test_a_multi_node_group_budgets_its_rendezvous_after_its_slowest_member() -> None:
    """Members start in parallel: a group of two is one member's phases plus the rendezvous (issue 42)."""
    startup = StartupConfig()
    member = plan_startup(startup, 10 * GIB, local_nvme=True, tensor_parallel_size=8)
    group = plan_startup(startup, 10 * GIB, local_nvme=True, tensor_parallel_size=8, nodes_per_replica=2)
    assert [name for name, _ in group.phases] == list(PHASES)
    assert group.expected_seconds == member.expected_seconds + startup.group_rendezvous_seconds
    assert group.budget_seconds == math.ceil(group.expected_seconds * startup.safety_factor)
