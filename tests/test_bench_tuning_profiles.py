"""Tuning profiles: measured engine settings a model opts into, with explicit settings winning."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.catalogue.tuning_profiles import tuning_profiles
from domain.config import ConfigError, VllmEngineConfig
from domain.engine_checks import tuning_profile_problems
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT

PROFILE = "h200-throughput"


def _stack_with(tmp_path: Path, stack: str, edit) -> Path:
    document = yaml.safe_load((REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    document = copy.deepcopy(document)
    edit(document["config"])
    path = tmp_path / f"Pulumi.{stack}-edited.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def _model(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(model for model in config["vllm-platform:models"] if model["name"] == name)


def test_profile_fills_every_setting_the_model_leaves_unset() -> None:
    profile = tuning_profiles()[PROFILE]
    engine = VllmEngineConfig(tuning_profile=PROFILE)
    for key, value in profile.setting_values().items():
        assert getattr(engine, key) == value, key
    assert engine.tuning_profile == PROFILE


def test_setting_in_the_model_wins_over_its_profile() -> None:
    profile = tuning_profiles()[PROFILE]
    assert profile.setting_values()["kv_cache_dtype"] != "auto", "the test needs a profile that changes it"
    engine = VllmEngineConfig(tuning_profile=PROFILE, kv_cache_dtype="auto", max_num_batched_tokens=4096)
    assert engine.kv_cache_dtype == "auto"
    assert engine.max_num_batched_tokens == 4096


def test_profile_extra_args_are_appended_unless_the_model_sets_that_flag() -> None:
    profile = tuning_profiles()[PROFILE]
    assert profile.extra_args, "the test needs a profile with extra args"
    flag = profile.extra_args[0].flag

    plain = VllmEngineConfig(tuning_profile=PROFILE, extra_args=["--enable-log-requests"])
    assert plain.extra_args[0] == "--enable-log-requests"
    assert plain.extra_args[1:] == [token for entry in profile.extra_args for token in entry.args]

    own_spelling = "--" + flag.removeprefix("--").replace("-", "_") + "=1"
    overridden = VllmEngineConfig(tuning_profile=PROFILE, extra_args=[own_spelling])
    others = [token for entry in profile.extra_args[1:] for token in entry.args]
    assert overridden.extra_args == [own_spelling, *others]


def test_engine_without_profile_keeps_the_plain_defaults() -> None:
    assert VllmEngineConfig().kv_cache_dtype == "auto"
    assert VllmEngineConfig().extra_args == []


def test_unknown_profile_is_rejected_with_key_path_and_known_names(tmp_path: Path) -> None:
    path = _stack_with(
        tmp_path, "prod", lambda c: _model(c, "llama-3-1-8b")["vllm"].update(tuning_profile="h200-thruput")
    )
    with pytest.raises(ConfigError) as caught:
        load_stack("prod", stack_file=path)
    message = str(caught.value)
    assert "vllm-platform:models[0].vllm.tuning_profile" in message
    assert '"h200-thruput"' in message
    assert PROFILE in message and "tuning_profiles.yaml" in message


@pytest.mark.parametrize("name", sorted(tuning_profiles()))
def test_every_profile_setting_is_a_valid_engine_setting(name: str) -> None:
    profile = tuning_profiles()[name]
    settings = profile.setting_values()
    unknown = set(settings) - set(VllmEngineConfig.model_fields)
    assert not unknown, f"{name}: not VllmEngineConfig fields: {unknown}"
    assert "tuning_profile" not in settings and "extra_args" not in settings
    VllmEngineConfig(**settings)  # raises on a value the schema rejects


@pytest.mark.parametrize("name", sorted(tuning_profiles()))
def test_profile_extra_args_leave_typed_flags_to_the_typed_settings(name: str) -> None:
    from components.vllm_arguments import reserved_flag_problems

    args = [token for entry in tuning_profiles()[name].extra_args for token in entry.args]
    assert reserved_flag_problems(args, at=("extra_args",)) == []


@pytest.mark.parametrize("name", sorted(tuning_profiles()))
def test_profile_gpus_are_catalogue_gpu_models(name: str) -> None:
    from domain.catalogue.gpu_instances import gpu_instance_types

    known = {instance.gpu.name for instance in gpu_instance_types().values()}
    assert set(tuning_profiles()[name].gpus) <= known


def test_profile_on_a_group_of_another_gpu_is_reported(tmp_path: Path) -> None:
    path = _stack_with(
        tmp_path,
        "prod",
        lambda c: _model(c, "qwen2-5-7b-tp2").setdefault("vllm", {}).update(tuning_profile=PROFILE),
    )
    # `validate` runs the check (domain/engine_checks.py) and reports it with the key path and the fix.
    with pytest.raises(ConfigError) as caught:
        load_stack("prod", stack_file=path)
    problems = [p for p in caught.value.problems if p.path[-1] == "tuning_profile"]
    assert len(problems) == 1
    assert problems[0].key_path() == "vllm-platform:models[2].vllm.tuning_profile"
    assert "L40S" in problems[0].message and "H200" in problems[0].message


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_h200_8b_model_uses_the_h200_profile_and_passes_its_gpu_check(stack: str) -> None:
    config = load_stack(stack)
    model = next(model for model in config.models if model.name == "llama-3-1-8b")
    assert model.vllm.tuning_profile == PROFILE
    assert model.vllm.kv_cache_dtype == tuning_profiles()[PROFILE].setting_values()["kv_cache_dtype"]
    assert tuning_profile_problems(config) == []


@pytest.mark.parametrize("name", sorted(tuning_profiles()))
def test_a_profile_with_fp8_weights_is_measured_only_on_gpus_with_fp8_tensor_cores(name: str) -> None:
    # So the GPU check above also keeps FP8 weights off GPUs without FP8 (domain/engine_checks.py).
    from domain.catalogue.gpu_instances import gpu_instance_types
    from domain.engine_checks import fp8_weight_methods

    profile = tuning_profiles()[name]
    if profile.setting_values().get("quantization") in fp8_weight_methods():
        gpus = {instance.gpu.name: instance.gpu for instance in gpu_instance_types().values()}
        assert all(gpus[gpu].fp8 for gpu in profile.gpus), profile.gpus


@pytest.fixture
def catalogue_with_an_fp8_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The real catalogue plus one FP8-weight profile measured on H200, loaded the real way."""
    from domain.catalogue import tuning_profiles as catalogue

    document = yaml.safe_load(catalogue.CATALOGUE_FILE.read_text())
    document["profiles"]["test-h200-fp8"] = {
        "summary": "FP8 weights on H200 (test data)",
        "gpus": ["H200"],
        "measured_by": "tests/test_bench_tuning_profiles.py",
        "settings": {"quantization": {"value": "fp8", "why": "test data: FP8 weights, W8A8 on Hopper"}},
    }
    path = tmp_path / "tuning_profiles.yaml"
    path.write_text(yaml.safe_dump(document))
    monkeypatch.setattr(catalogue, "CATALOGUE_FILE", path)
    catalogue.tuning_profiles.cache_clear()
    yield "test-h200-fp8"
    catalogue.tuning_profiles.cache_clear()


def test_an_fp8_profile_on_a100_is_one_problem_at_the_profile_naming_fp8(
    tmp_path: Path, catalogue_with_an_fp8_profile: str
) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["vllm-platform:node_groups"]["gpu"]["l40s"]["instance_types"] = ["p4de.24xlarge"]
        config["vllm-platform:models"][0]["vllm"]["tuning_profile"] = catalogue_with_an_fp8_profile

    with pytest.raises(ConfigError) as caught:
        load_stack("dev", stack_file=_stack_with(tmp_path, "dev", edit))
    (problem,) = caught.value.problems
    assert problem.key_path() == "vllm-platform:models[0].vllm.tuning_profile"
    assert problem.value == catalogue_with_an_fp8_profile
    assert "it sets vllm.quantization: fp8. FP8 weights need FP8 tensor cores" in problem.message
    assert "A100-80GB (p4de.24xlarge, compute capability 8.0)" in problem.message


def test_an_fp8_profile_on_h200_passes(tmp_path: Path, catalogue_with_an_fp8_profile: str) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["vllm-platform:node_groups"]["gpu"]["l40s"]["instance_types"] = ["p5en.48xlarge"]
        config["vllm-platform:models"][0]["vllm"]["tuning_profile"] = catalogue_with_an_fp8_profile

    config = load_stack("dev", stack_file=_stack_with(tmp_path, "dev", edit))
    assert config.models[0].vllm.quantization == "fp8"


def test_fp8_weight_profile_is_the_throughput_profile_plus_fp8_weights_and_is_opt_in() -> None:
    # issue 27: measured as bench/serving's `profile-fp8w` (the stack's arguments + --quantization fp8).
    profiles = tuning_profiles()
    bf16, fp8 = profiles[PROFILE], profiles["h200-throughput-fp8"]
    assert fp8.setting_values() == {**bf16.setting_values(), "quantization": "fp8"}
    assert [extra.args for extra in fp8.extra_args] == [extra.args for extra in bf16.extra_args]
    assert fp8.gpus == ["H200"] and fp8.measured_by == bf16.measured_by
    engine = VllmEngineConfig(tuning_profile="h200-throughput-fp8")
    assert engine.quantization == "fp8" and VllmEngineConfig(tuning_profile=PROFILE).quantization is None
    for stack in ("dev", "staging", "prod"):
        text = (REPO_ROOT / "stacks" / f"Pulumi.{stack}.yaml").read_text()
        assert "h200-throughput-fp8" not in text, f"{stack} opts into FP8 weights: keep it opt-in"
