"""The `vllm serve` arguments built from typed settings, and their check at validate time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.vllm_arguments import build_server_arguments, flag_name
from domain.config import ConfigError, ModelConfig
from domain.config.loader import stack_file_for
from domain.vllm_flags import check_server_arguments
from infra.cli import EXIT_INVALID_CONFIG, main
from infra.stack_checks import load_stack
from tests.conftest import STACKS

MODEL_PATH = "/mnt/local-models/m/r1"


def a_model(**fields: Any) -> ModelConfig:
    base: dict[str, Any] = {
        "name": "m",
        "gpu_group": "g",
        "source": {"s3_uri": "s3://bucket/m/r1/", "revision": "r1"},
        "architecture": {"preset": "llama-3.1-8b"},
        "api_key_secret": {"name": "vllm-platform/test/m/api-key"},
    }
    return ModelConfig.model_validate({**base, **fields})


def value_of(arguments: list[str], flag: str) -> str:
    assert arguments.count(flag) == 1, f"{flag} appears {arguments.count(flag)} times in {arguments}"
    return arguments[arguments.index(flag) + 1]


def test_model_path_is_the_first_argument_not_model_flag() -> None:
    arguments = build_server_arguments(a_model(), MODEL_PATH)
    assert arguments[0] == MODEL_PATH
    assert "--model" not in arguments


def test_typed_settings_become_their_flags() -> None:
    model = a_model(
        served_model_name="org/Model-7B",
        gpus_per_replica=4,
        vllm={
            "gpu_memory_utilization": 0.92,
            "max_model_len": 32768,
            "max_num_seqs": 48,
            "port": 8080,
            "max_num_batched_tokens": 4096,
            "dtype": "bfloat16",
            "kv_cache_dtype": "fp8",
            "quantization": "fp8",
            "enable_chunked_prefill": True,
            "enforce_eager": True,
        },
        drain={"shutdown_timeout_seconds": 240},
    )
    arguments = build_server_arguments(model, MODEL_PATH)
    assert value_of(arguments, "--served-model-name") == "org/Model-7B"
    assert value_of(arguments, "--port") == "8080"
    assert value_of(arguments, "--host") == "0.0.0.0"
    assert value_of(arguments, "--tensor-parallel-size") == "4"
    assert value_of(arguments, "--gpu-memory-utilization") == "0.92"
    assert value_of(arguments, "--max-model-len") == "32768"
    assert value_of(arguments, "--max-num-seqs") == "48"
    assert value_of(arguments, "--max-num-batched-tokens") == "4096"
    assert value_of(arguments, "--dtype") == "bfloat16"
    assert value_of(arguments, "--kv-cache-dtype") == "fp8"
    assert value_of(arguments, "--quantization") == "fp8"
    assert value_of(arguments, "--shutdown-timeout") == "240"
    assert {"--enable-prefix-caching", "--enable-chunked-prefill", "--enforce-eager"} <= set(arguments)
    assert check_server_arguments(arguments) == []


def test_served_model_name_defaults_to_the_model_name() -> None:
    assert value_of(build_server_arguments(a_model(), MODEL_PATH), "--served-model-name") == "m"


def test_switched_off_settings_use_the_negated_flags() -> None:
    arguments = build_server_arguments(
        a_model(vllm={"enable_prefix_caching": False, "enable_chunked_prefill": False}), MODEL_PATH
    )
    assert "--no-enable-prefix-caching" in arguments and "--enable-prefix-caching" not in arguments
    assert "--no-enable-chunked-prefill" in arguments
    assert "--enforce-eager" not in arguments
    assert check_server_arguments(arguments) == []


def test_unset_optional_settings_leave_vllm_defaults() -> None:
    arguments = build_server_arguments(a_model(), MODEL_PATH)
    for flag in (
        "--max-num-batched-tokens",
        "--quantization",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--enforce-eager",
    ):
        assert flag not in arguments


def test_api_key_is_never_a_server_argument() -> None:
    arguments = build_server_arguments(a_model(), MODEL_PATH)
    assert not any(flag_name(token) == "--api-key" for token in arguments)
    assert not any("api-key" in token for token in arguments)


def test_extra_args_come_last_verbatim() -> None:
    extras = [
        "--disable-uvicorn-access-log",
        "--compilation-config",
        '{"cudagraph_capture_sizes": [1, 2, 4]}',
    ]
    arguments = build_server_arguments(a_model(vllm={"extra_args": extras}), MODEL_PATH)
    assert arguments[-len(extras) :] == extras
    assert check_server_arguments(arguments) == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_renders_arguments_the_pinned_vllm_parser_accepts(stack: str) -> None:
    config = load_stack(stack)
    for model in config.models:
        assert check_server_arguments(build_server_arguments(model, MODEL_PATH)) == [], model.name


# --- validate time ------------------------------------------------------------------------------------


def stack_with_extra_args(tmp_path: Path, extra_args: list[str], model_index: int = 0) -> Path:
    document = yaml.safe_load(stack_file_for("dev").read_text())
    document["config"]["vllm-platform:models"][model_index].setdefault("vllm", {})["extra_args"] = extra_args
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def problems_for(tmp_path: Path, extra_args: list[str]) -> str:
    with pytest.raises(ConfigError) as caught:
        load_stack("dev", stack_file=stack_with_extra_args(tmp_path, extra_args))
    return str(caught.value)


def test_disable_log_requests_in_extra_args_is_rejected_at_validate_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = stack_with_extra_args(tmp_path, ["--disable-log-requests"])
    assert main(["validate", "dev", "--file", str(path)]) == EXIT_INVALID_CONFIG
    message = capsys.readouterr().err
    assert "vllm-platform:models[0].vllm.extra_args" in message
    assert "--disable-log-requests" in message
    assert "does not accept" in message and "--enable-log-requests" in message


@pytest.mark.parametrize(
    ("extra", "fix"),
    [
        (["--max-model-len", "4096"], "set vllm.max_model_len instead"),
        (["--max_model_len=4096"], "set vllm.max_model_len instead"),
        (["--tensor-parallel-size", "2"], "set gpus_per_replica instead"),
        (["-tp", "2"], "set gpus_per_replica instead"),
        (["--no-enable-prefix-caching"], "set vllm.enable_prefix_caching instead"),
        (["--shutdown-timeout", "30"], "set drain.shutdown_timeout_seconds instead"),
        (["--served-model-name", "x"], "set served_model_name instead"),
        (["--port", "9000"], "set vllm.port instead"),
    ],
)
def test_extra_args_that_duplicate_a_typed_setting_name_the_setting(
    tmp_path: Path, extra: list[str], fix: str
) -> None:
    message = problems_for(tmp_path, ["--disable-uvicorn-access-log", *extra])
    assert "vllm-platform:models[0].vllm.extra_args[1]" in message
    assert fix in message


def test_api_key_in_extra_args_is_rejected_pointing_at_the_secret_store(tmp_path: Path) -> None:
    message = problems_for(tmp_path, ["--api-key", "sk-123"])
    assert "models[0].vllm.extra_args[0]" in message
    assert "api_key_secret" in message and "VLLM_API_KEY" in message


def test_pipeline_or_data_parallel_in_extra_args_is_rejected(tmp_path: Path) -> None:
    message = problems_for(tmp_path, ["--pipeline-parallel-size", "2", "-dp", "2"])
    assert "models[0].vllm.extra_args[0]" in message and "models[0].vllm.extra_args[2]" in message
    assert "parallelism block" in message and "pipeline_parallel_size" in message


def test_unknown_flag_in_extra_args_gets_the_parser_suggestion(tmp_path: Path) -> None:
    message = problems_for(tmp_path, ["--enable-prefix-cachin"])
    assert "models[0].vllm.extra_args" in message


def test_accepted_extra_args_pass_validation(tmp_path: Path) -> None:
    config = load_stack("dev", stack_file=stack_with_extra_args(tmp_path, ["--disable-uvicorn-access-log"]))
    assert config.models[0].vllm.extra_args == ["--disable-uvicorn-access-log"]


@pytest.mark.parametrize(
    ("token", "name"),
    [
        ("--max_model_len=8", "--max-model-len"),
        ("-tp", "-tp"),
        ("4096", None),
        ("-1", None),
        ("--x.y", "--x.y"),
    ],
)
def test_flag_names_follow_vllms_spelling_rules(token: str, name: str | None) -> None:
    assert flag_name(token) == name
