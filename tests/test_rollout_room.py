"""GPU room for a rollout's extra pods (issue 40, item 5): a rolling update's surge pod and a canary's
extra pods need free GPU sets in the model's group while every model there runs its max replicas,
or the update stalls with the new pod Pending. `validate` refuses such a stack with fixes that work.

The same stall on the real scheduler: tests/test_deploy_capacity.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import probes, rollouts
from domain.config import ConfigError
from infra.stack_checks import load_stack

BAD_STACKS = Path(__file__).resolve().parent / "bad-stacks"
SURGE_STACK = BAD_STACKS / "rolling-surge-without-a-free-gpu.yaml"
"""Two TP=2 models fill an l40s group of 2 × 4 GPUs; the first may run one replica, so it surges."""
SURGE_KEY = "vllm-platform:models[0].rollout.replace_in_place"


def _edited(tmp_path: Path, source: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    document = yaml.safe_load(source.read_text())
    edit(document["config"])
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _problems(stack_file: Path) -> dict[str, str]:
    try:
        load_stack("bad", stack_file=stack_file)
    except ConfigError as error:
        return {problem.key_path(): problem.message for problem in error.problems}
    return {}


def _first_model(config: dict[str, Any]) -> dict[str, Any]:
    return config["vllm-platform:models"][0]


def test_a_surge_with_no_free_gpu_set_beside_the_groups_models_is_refused() -> None:
    message = _problems(SURGE_STACK)[SURGE_KEY]
    # Each model alone fits the group with room to spare: only the sum of both leaves none.
    assert "its models hold 8 (qwen-chat: 2 × 2, qwen-batch: 2 × 2): no node has 2 free" in message
    assert "Insufficient nvidia.com/gpu" in message


@pytest.mark.parametrize(
    "fix",
    [
        pytest.param(lambda c: _first_model(c).update(rollout={"replace_in_place": True}), id="in-place"),
        pytest.param(lambda c: _first_model(c)["autoscaling"].update(max_replicas=1), id="fewer-replicas"),
        pytest.param(
            lambda c: c["vllm-platform:node_groups"]["gpu"]["l40s"].update(max_size=3), id="larger-group"
        ),
    ],
)
def test_every_fix_the_surge_message_names_passes_validate(
    tmp_path: Path, fix: Callable[[dict[str, Any]], None]
) -> None:
    message = _problems(SURGE_STACK)[SURGE_KEY]
    assert (
        "Fix: set rollout.replace_in_place: true (maxUnavailable 1 instead of the surge: no GPU beyond the "
        "replicas' own, but a model at one replica is down while its new pod starts); or lower "
        "models[0].autoscaling.max_replicas to 1; or raise node_groups.gpu.l40s.max_size to 3"
    ) in message
    assert _problems(_edited(tmp_path, SURGE_STACK, fix)) == {}


def test_replace_in_place_swaps_the_surge_for_max_unavailable(tmp_path: Path) -> None:
    def in_place(config: dict[str, Any]) -> None:
        _first_model(config)["rollout"] = {"replace_in_place": True}

    surging = load_stack("dev").models[0]
    assert probes.replica_floor(surging) == 1
    assert probes.rollout_strategy(surging).as_spec()["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    model = load_stack("bad", stack_file=_edited(tmp_path, SURGE_STACK, in_place)).models[0]
    assert probes.rollout_strategy(model).as_spec()["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_a_model_that_never_runs_below_two_replicas_is_replaced_in_place_and_needs_no_room(
    tmp_path: Path,
) -> None:
    def floor_of_two(config: dict[str, Any]) -> None:
        _first_model(config)["autoscaling"].update(min_replicas=2, max_replicas=2)

    config = load_stack("bad", stack_file=_edited(tmp_path, SURGE_STACK, floor_of_two))
    assert rollouts.group_room(config, config.models[0]).free_sets == 0  # the group is still full
    assert probes.rollout_strategy(config.models[0]).max_surge == 0


def test_room_is_whole_gpu_sets_left_on_one_node(tmp_path: Path) -> None:
    # One 4-GPU node: a TP=2 model at one replica leaves 2 GPUs, room for one more TP=2 pod; a TP=1
    # model beside it takes one of them, and no TP=2 pod fits in what is left.
    def one_node(config: dict[str, Any]) -> None:
        config["vllm-platform:node_groups"]["gpu"]["l40s"]["max_size"] = 1
        first, second = config["vllm-platform:models"]
        first["autoscaling"].update(max_replicas=1)
        first["rollout"] = {"replace_in_place": True}
        second.update(gpus_per_replica=1, replicas=1, min_available=0)

    config = load_stack("bad", stack_file=_edited(tmp_path, SURGE_STACK, one_node))
    tp2, tp1 = config.models
    room = rollouts.group_room(config, tp2)
    assert (room.gpus, room.held_gpus, room.free_sets) == (4, 3, 0)
    assert rollouts.group_room(config, tp1).free_sets == 1


def test_the_canary_shortfall_offers_plain_rolling_only_where_its_surge_fits(tmp_path: Path) -> None:
    # prod's h200 group: 4 × 8 GPUs. The 8B canary at its max 8 holds 8; the 70B (TP=2) at 11 holds
    # 22: 2 GPUs are left, one TP=2 set. The 70B canary needs two more pods (at 10 %, 10 stable + 2
    # canary, and one draining); a rolling update's surge needs one, which fits.
    def seventy_b_at_eleven(config: dict[str, Any]) -> None:
        config["vllm-platform:models"][1]["autoscaling"]["max_replicas"] = 11

    prod = Path(__file__).resolve().parents[1] / "stacks" / "Pulumi.prod.yaml"
    stack = _edited(tmp_path, prod, seventy_b_at_eleven)
    message = _problems(stack)["vllm-platform:models[1].rollout.strategy"]
    assert "the canary runs up to 13 pods at once" in message
    assert "the group's other models hold llama-3-1-8b: 8 × 1" in message
    assert (
        "no room to surge: lower models[1].autoscaling.max_replicas to 10, raise "
        "node_groups.gpu.h200.max_size to 5, or use rollout.strategy: rolling"
    ) in message
    assert message.endswith("or use rollout.strategy: rolling")

    def rolling(config: dict[str, Any]) -> None:
        config["vllm-platform:models"][1]["rollout"] = {"strategy": "rolling"}

    assert _problems(_edited(tmp_path, stack, rolling)) == {}
