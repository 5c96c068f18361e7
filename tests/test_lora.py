"""LoRA adapters (issue 25): config, vLLM flags, preloader wiring, IAM, capacity and the lora test stack.

The real vLLM serving a real PEFT adapter is in tests/e2e/test_lora.py; the preloader fetching
adapters from a real S3 API in model-cache/tests/test_preload_s3.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from components.preload import preload_arguments
from components.vllm_arguments import build_server_arguments, lora_environment
from domain.architecture import ModelShape
from domain.capacity.lora import lora_gpu_bytes, lora_slot_bytes
from domain.capacity.plan import plan_model
from domain.config import ConfigError, ModelConfig
from domain.engine_checks import lora_architecture_problems, pinned_lora_architectures
from domain.vllm_flags import check_server_arguments
from infra.aws.irsa import service_account_role_specs
from infra.aws.policies import AwsLocation, model_access_policy
from infra.render import PLACEHOLDER_ACCOUNT_ID
from infra.stack_checks import load_stack
from tests.conftest import TEST_STACKS_DIR, model_workloads, rendered

LORA_STACK = TEST_STACKS_DIR / "Pulumi.lora.yaml"
LOCATION = AwsLocation(partition="aws", region="us-east-1", account_id=PLACEHOLDER_ACCOUNT_ID)


def a_model(**fields: Any) -> ModelConfig:
    base: dict[str, Any] = {
        "name": "m",
        "served_model_name": "org/base",
        "gpu_group": "g",
        "source": {"s3_uri": "s3://bucket/m/r1/", "revision": "r1"},
        "architecture": {"preset": "llama-3.1-8b"},
        "api_key_secret": {"name": "vllm-platform/test/m/api-key"},
    }
    return ModelConfig.model_validate({**base, **fields})


ADAPTERS = [
    {
        "name": "support-bot",
        "rank": 16,
        "source": {"s3_uri": "s3://adapters/m/support/v3/", "revision": "v3"},
    },
    {"name": "sql", "rank": 8, "source": {"huggingface_repo": "acme/sql-lora", "revision": "abc123"}},
]


def lora_stack(tmp_path: Path, edit: Any) -> Path:
    document = yaml.safe_load(LORA_STACK.read_text())
    edit(document["config"])
    path = tmp_path / "Pulumi.lora.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def rejection(tmp_path: Path, edit: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_stack("lora", stack_file=lora_stack(tmp_path, edit))
    return str(caught.value)


def first_model(config: dict[str, Any]) -> dict[str, Any]:
    return config["vllm-platform:models"][0]


# --- config ------------------------------------------------------------------------------------------


def test_served_names_are_the_model_name_then_its_adapters() -> None:
    config = load_stack("lora", stack_file=LORA_STACK)
    model = config.models[0]
    assert config.served_names(model) == ["meta-llama/Llama-3.1-8B-Instruct", "support-bot", "sql-writer"]


def test_adapter_rank_above_max_lora_rank_names_the_key(tmp_path: Path) -> None:
    message = rejection(tmp_path, lambda c: first_model(c)["lora"]["adapters"][0].update(rank=32))
    assert "models[0].lora.adapters[0].rank" in message
    assert "larger than max_lora_rank 16" in message


def test_adapter_named_like_another_served_model_is_refused(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        first_model(config)["lora"]["adapters"][1]["name"] = "support-bot"

    assert "models[0].lora.adapters[1].name" in rejection(tmp_path, edit)

    def clash(config: dict[str, Any]) -> None:
        second = {**first_model(config), "name": "other", "served_model_name": "sql-writer"}
        second.pop("lora")
        config["vllm-platform:models"].append(second)

    message = rejection(tmp_path, clash)
    assert "models[1].served_model_name" in message and "already served by an adapter" in message


def test_max_lora_rank_must_be_one_vllm_offers(tmp_path: Path) -> None:
    message = rejection(tmp_path, lambda c: first_model(c)["lora"].update(max_lora_rank=24))
    assert "models[0].lora.max_lora_rank" in message and "16" in message


def test_cpu_cache_smaller_than_gpu_slots_is_refused(tmp_path: Path) -> None:
    message = rejection(tmp_path, lambda c: first_model(c)["lora"].update(max_cpu_loras=2))
    assert "models[0].lora.max_cpu_loras" in message and "below max_loras 4" in message


def test_lora_on_a_model_class_without_lora_in_the_pinned_vllm_is_refused(tmp_path: Path) -> None:
    without = pinned_lora_architectures()["no_lora"]
    assert without, "the snapshot lists model classes without LoRA"

    def edit(config: dict[str, Any]) -> None:
        first_model(config)["architecture"]["architecture_class"] = without[0]

    message = rejection(tmp_path, edit)
    assert "models[0].architecture.architecture_class" in message and "serves no LoRA adapters" in message


def test_every_preset_architecture_is_in_the_lora_snapshot() -> None:
    from domain.catalogue.model_shapes import model_shape_presets

    known = pinned_lora_architectures()
    for preset in model_shape_presets().values():
        architecture_class = preset.architecture["architecture_class"]
        assert architecture_class in known["supports_lora"] + known["no_lora"], preset.name


def test_lora_without_a_model_class_asks_for_one() -> None:
    config = load_stack("lora", stack_file=LORA_STACK)
    shape = config.models[0].architecture.resolved()
    numbers = {k: v for k, v in shape.items() if k != "architecture_class"}
    model = config.models[0].model_copy(
        update={"architecture": type(config.models[0].architecture)(**numbers)}
    )
    problems = lora_architecture_problems(config.model_copy(update={"models": [model]}))
    assert [p.path for p in problems] == [("models", 0, "architecture", "architecture_class")]


def test_adapters_with_a_flag_in_extra_args_point_at_the_lora_block(tmp_path: Path) -> None:
    message = rejection(tmp_path, lambda c: first_model(c)["vllm"].update(extra_args=["--max-loras", "8"]))
    assert "models[0].vllm.extra_args[0]" in message and "lora block" in message


# --- serving -----------------------------------------------------------------------------------------


def test_lora_flags_are_vllms_own_and_pass_its_parser_snapshot() -> None:
    model = a_model(lora={"adapters": ADAPTERS, "max_loras": 2, "max_lora_rank": 16, "max_cpu_loras": 6})
    arguments = build_server_arguments(model, "/mnt/local-models/m/r1", adapter_root="/mnt/local-models")
    start = arguments.index("--enable-lora")
    assert arguments[start : start + 7] == [
        "--enable-lora",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "16",
        "--max-cpu-loras",
        "6",
    ]
    modules = arguments[arguments.index("--lora-modules") + 1 :][:2]
    assert modules == [
        "support-bot=/mnt/local-models/.lora-adapters/m/support-bot/v3",
        "sql=/mnt/local-models/.lora-adapters/m/sql/abc123",
    ]
    assert check_server_arguments(arguments) == []


def test_without_lora_no_lora_flag_and_runtime_loading_stays_off() -> None:
    plain = build_server_arguments(a_model(), "/mnt/models/m/r1")
    assert not [token for token in plain if "lora" in token]
    assert lora_environment(a_model(lora={"adapters": ADAPTERS})) == []
    opened = a_model(lora={"runtime_loading": True})
    assert lora_environment(opened) == [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}]
    assert "--lora-modules" not in build_server_arguments(opened, "/mnt/models/m/r1")


def test_lora_with_nothing_to_serve_is_refused() -> None:
    with pytest.raises(ValueError, match="serves nothing"):
        a_model(lora={"max_loras": 2})


def test_preloader_gets_each_adapter_with_its_parent_prefix_and_rank() -> None:
    arguments = preload_arguments(a_model(lora={"adapters": ADAPTERS}), "L40S", local_nvme=True)
    adapters = [arguments[i + 1 : i + 5] for i, token in enumerate(arguments) if token == "--adapter"]
    assert adapters == [
        ["support-bot", "s3://adapters/m/support/", "v3", "16"],
        ["sql", "hf://acme/sql-lora", "abc123", "8"],
    ]


def test_rendered_pod_preloads_adapters_and_serves_them_from_the_same_place() -> None:
    (workload,) = model_workloads(rendered("lora", LORA_STACK))
    spec = workload["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (server,) = [c for c in spec["containers"] if c["name"] == "vllm"]
    root = "/mnt/local-models" if "--local-root" in init["args"] else "/mnt/models"
    modules = server["args"][server["args"].index("--lora-modules") + 1 :][:2]
    assert modules == [
        f"support-bot={root}/.lora-adapters/llama-3-1-8b/support-bot/v3",
        f"sql-writer={root}/.lora-adapters/llama-3-1-8b/sql-writer/5f1c0a3d9e2b4c6a8f0e1d2c3b4a59687f6e5d4c",
    ]
    assert init["args"].count("--adapter") == 2
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in {e["name"] for e in server["env"]}


def test_an_adapter_revision_change_changes_the_pod_template(tmp_path: Path) -> None:
    def bump(config: dict[str, Any]) -> None:
        adapter = first_model(config)["lora"]["adapters"][0]
        adapter["source"] = {"s3_uri": "s3://acme-adapters/llama-3.1-8b/support-bot/v4/", "revision": "v4"}

    before = model_workloads(rendered("lora", LORA_STACK))[0]["spec"]["template"]
    after = model_workloads(rendered("lora", lora_stack(tmp_path, bump)))[0]["spec"]["template"]
    assert before != after  # a new ReplicaSet: rolled (or canaried) like any other change


def test_adapter_s3_uri_must_end_with_its_revision(tmp_path: Path) -> None:
    def edit(config: dict[str, Any]) -> None:
        first_model(config)["lora"]["adapters"][0]["source"]["revision"] = "v4"

    message = rejection(tmp_path, edit)
    assert (
        "models[0].lora.adapters[0].source.s3_uri" in message and "must end with the revision 'v4'" in message
    )


# --- IAM ---------------------------------------------------------------------------------------------


def test_model_role_reads_its_adapter_prefixes_and_nothing_beside_them() -> None:
    config = load_stack("lora", stack_file=LORA_STACK)
    (spec,) = [
        s
        for s in service_account_role_specs(config, LOCATION)
        if s.service_account.namespace.startswith("vllm-")
    ]
    assert spec.policy is not None
    statements = {s["Sid"]: s for s in spec.policy["Statement"]}
    assert statements["ReadAdapterObjects"]["Resource"] == [
        "arn:aws:s3:::acme-adapters/llama-3.1-8b/support-bot/v3/*"
    ]
    assert statements["ListAdapterPrefixes0"]["Condition"]["StringLike"]["s3:prefix"] == [
        "llama-3.1-8b/support-bot/v3/",
        "llama-3.1-8b/support-bot/v3/*",
    ]


def test_adapter_prefix_without_a_trailing_slash_is_refused() -> None:
    with pytest.raises(ValueError, match="must end in '/'"):
        model_access_policy(
            location=LOCATION, s3_bucket=None, s3_prefix=None, adapter_s3_prefixes=(("b", "org/adapter"),)
        )


# --- capacity ----------------------------------------------------------------------------------------


def test_lora_slot_bytes_of_llama_8b_rank_16() -> None:
    shape = ModelShape.from_values(a_model().architecture.resolved())
    # Per layer (in + out of each slice): q 8192, k 5120, v 5120, o 8192, gate/up/down 18432 each;
    # embeddings and LM head 2 × (128256 + 4096); rank 16; bf16.
    per_layer = 8192 + 5120 + 5120 + 8192 + 3 * 18432
    expected = 16 * (32 * per_layer + 2 * (128256 + 4096)) * 2
    assert lora_slot_bytes(shape, 1, 16, 2) == expected
    assert lora_gpu_bytes(shape, 1, 4, 16, 2) == 4 * expected
    # Tensor parallelism splits the sharded side of each slice, not the rank.
    assert lora_slot_bytes(shape, 2, 16, 2) < expected


def test_plan_sets_lora_slots_aside_before_the_kv_cache() -> None:
    config = load_stack("lora", stack_file=LORA_STACK)
    model = config.models[0]
    with_lora = plan_model(model, config, model.gpu_group)
    without = plan_model(model.model_copy(update={"lora": None}), config, model.gpu_group)
    shape = ModelShape.from_values(model.architecture.resolved())
    slots = lora_gpu_bytes(shape, 1, 4, 16, 2)
    assert with_lora.memory.lora_bytes == slots
    assert without.memory.kv_cache_bytes - with_lora.memory.kv_cache_bytes == slots
    assert with_lora.lora_cpu_cache_bytes == 8 * lora_slot_bytes(shape, 1, 16, 2)


# --- observability -----------------------------------------------------------------------------------


def test_serving_dashboard_shows_the_adapters_by_the_labels_vllm_exports() -> None:
    from components.dashboards import dashboard_expressions, vllm_serving_dashboard
    from domain.vllm_metrics import LORA_REQUESTS_INFO, check_metric_name

    # Exported only with --enable-lora, with these labels (tests/e2e/test_lora.py reads them).
    assert check_metric_name(LORA_REQUESTS_INFO) is None
    lora_queries = [
        expr for _, expr in dashboard_expressions(vllm_serving_dashboard()) if LORA_REQUESTS_INFO in expr
    ]
    assert len(lora_queries) == 2
    assert {"running_lora_adapters", "waiting_lora_adapters"} == {
        label
        for expr in lora_queries
        for label in ("running_lora_adapters", "waiting_lora_adapters")
        if label in expr
    }
