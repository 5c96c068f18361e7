"""validate/render/preview reject a model that cannot start, with the numbers and a fix that works."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.capacity import plan_platform
from domain.config import ConfigError, PlatformConfig
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT

MODELS = "vllm-platform:models"
GROUPS = "vllm-platform:node_groups"


def _write(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> Path:
    document = yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    document = copy.deepcopy(document)
    mutate(document["config"])
    path = tmp_path / "Pulumi.capacity.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _load(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> PlatformConfig:
    return load_stack("capacity", stack_file=_write(tmp_path, mutate))


def _rejected(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, mutate)
    return caught.value


def _model(config: dict[str, Any]) -> dict[str, Any]:
    return config[MODELS][0]


def _on_group(name: str, instance_type: str) -> Callable[[dict[str, Any]], None]:
    def mutate(config: dict[str, Any]) -> None:
        config[GROUPS]["gpu"] = {
            name: {"instance_types": [instance_type], "min_size": 0, "desired_size": 1, "max_size": 2}
        }
        _model(config)["gpu_group"] = name

    return mutate


def test_llama_70b_in_bf16_on_one_l40s_is_rejected_with_the_sizes_and_fixes(tmp_path: Path) -> None:
    def mutate(config: dict[str, Any]) -> None:
        _model(config)["architecture"] = {"preset": "llama-3.1-70b"}

    error = _rejected(tmp_path, mutate)
    [problem] = error.problems
    assert problem.key_path() == "vllm-platform:models[0].gpus_per_replica"
    assert problem.value == 1
    assert "131.4 GiB of weights per GPU" in problem.message
    assert "0.9 × 44.5 GiB" in problem.message
    assert "gpus_per_replica: 4" in problem.message and "g6e.12xlarge" in problem.message
    assert "more memory per GPU" in problem.message


def test_the_suggested_tensor_parallelism_for_70b_on_l40s_starts(tmp_path: Path) -> None:
    def mutate(config: dict[str, Any]) -> None:
        _on_group("l40s", "g6e.12xlarge")(config)
        _model(config)["architecture"] = {"preset": "llama-3.1-70b"}
        _model(config)["gpus_per_replica"] = 4

    config = _load(tmp_path, mutate)
    assert plan_platform(config).models[_model_name(config)].fits


def _model_name(config: PlatformConfig) -> str:
    return config.models[0].name


def test_a_131072_token_context_on_an_l4_is_rejected_with_a_max_model_len_that_fits(tmp_path: Path) -> None:
    def mutate(config: dict[str, Any]) -> None:
        _on_group("l4", "g6.xlarge")(config)
        _model(config)["architecture"] = {"preset": "llama-3.1-8b"}
        _model(config)["vllm"]["max_model_len"] = 131072
        # A g6.xlarge offers pods 3.9 cores and 13 GiB (4 vCPUs, 16 GiB less the kubelet's share).
        _model(config)["resources"] = {
            "cpu_request_cores": 3,
            "memory_request_gib": 12,
            "memory_limit_gib": 12,
            "shm_size_gib": 2,
        }

    error = _rejected(tmp_path, mutate)
    [problem] = error.problems
    assert problem.key_path() == "vllm-platform:models[0].vllm.max_model_len"
    assert problem.value == 131072
    assert "cannot hold one request of max_model_len 131072 tokens" in problem.message
    assert "16.0 GiB per GPU" in problem.message  # 131072 tokens × 128 KiB
    suggested = re.search(r"vllm\.max_model_len: (\d+)", problem.message)
    assert suggested is not None

    def apply_fix(config: dict[str, Any]) -> None:
        mutate(config)
        _model(config)["vllm"]["max_model_len"] = int(suggested.group(1))

    fixed = _load(tmp_path, apply_fix)
    assert plan_platform(fixed).models[_model_name(fixed)].fits


def test_heads_that_do_not_divide_across_the_gpus_are_rejected_with_the_counts_that_do(
    tmp_path: Path,
) -> None:
    def mutate(config: dict[str, Any]) -> None:
        _on_group("l40s", "g6e.48xlarge")(config)  # 8 GPUs per node
        _model(config)["gpus_per_replica"] = 8  # Qwen2.5-7B has 28 attention heads

    error = _rejected(tmp_path, mutate)
    [problem] = error.problems
    assert problem.key_path() == "vllm-platform:models[0].gpus_per_replica"
    assert "num_attention_heads 28 is not divisible by 8 GPUs" in problem.message
    assert "gpus_per_replica one of 1, 2, 4" in problem.message


def test_a_max_model_len_beyond_the_models_context_is_rejected(tmp_path: Path) -> None:
    def mutate(config: dict[str, Any]) -> None:
        _model(config)["vllm"]["max_model_len"] = 65536  # Qwen2.5-7B: 32768 positions

    error = _rejected(tmp_path, mutate)
    assert [p.key_path() for p in error.problems] == ["vllm-platform:models[0].vllm.max_model_len"]
    assert "at most 32768 tokens" in error.problems[0].message


def test_a_model_without_architecture_is_told_the_presets(tmp_path: Path) -> None:
    error = _rejected(tmp_path, lambda config: _model(config).pop("architecture"))
    assert [p.key_path() for p in error.problems] == ["vllm-platform:models[0].architecture"]
    assert "llama-3.1-8b" in error.problems[0].message and "deepseek-v2-lite" in error.problems[0].message


def test_an_unknown_preset_lists_the_known_ones_and_the_closest(tmp_path: Path) -> None:
    error = _rejected(
        tmp_path, lambda config: _model(config).__setitem__("architecture", {"preset": "qwen2.5-7B"})
    )
    [problem] = error.problems
    assert problem.key_path() == "vllm-platform:models[0].architecture.preset"
    assert "did you mean 'qwen2.5-7b'?" in problem.message and "mixtral-8x7b" in problem.message


def test_numbers_without_a_preset_must_be_complete(tmp_path: Path) -> None:
    error = _rejected(
        tmp_path,
        lambda config: _model(config).__setitem__(
            "architecture", {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28}
        ),
    )
    [problem] = error.problems
    assert problem.key_path() == "vllm-platform:models[0].architecture.intermediate_size"
    assert "intermediate_size, vocab_size" in problem.message


def test_explicit_numbers_plan_the_same_as_the_preset_they_copy(tmp_path: Path) -> None:
    numbers = {
        "num_hidden_layers": 28,
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "intermediate_size": 18944,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "qkv_bias": True,
    }
    explicit = _load(tmp_path, lambda config: _model(config).__setitem__("architecture", numbers))
    preset = load_stack("dev")
    assert (
        plan_platform(explicit).models[_model_name(explicit)]
        == plan_platform(preset).models[_model_name(preset)]
    )


def test_a_field_set_next_to_a_preset_overrides_it(tmp_path: Path) -> None:
    config = _load(tmp_path, lambda c: _model(c)["architecture"].__setitem__("num_hidden_layers", 14))
    halved = plan_platform(config).models[_model_name(config)]
    full = plan_platform(load_stack("dev")).models[_model_name(config)]
    assert halved.kv_cache_bytes_per_token * 2 == full.kv_cache_bytes_per_token
