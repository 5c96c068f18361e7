"""The typed config: every stack validates; each kind of bad input gets one clear message."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config import ConfigError
from infra.stack_checks import load_stack
from tests.conftest import REPO_ROOT, STACKS

MODELS = "vllm-platform:models"
GROUPS = "vllm-platform:node_groups"
STORAGE = "vllm-platform:storage"


def _dev_document() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "stacks" / "Pulumi.dev.yaml").read_text())


def _load_mutated(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]) -> ConfigError:
    document = copy.deepcopy(_dev_document())
    mutate(document["config"])
    path = tmp_path / "Pulumi.broken.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(ConfigError) as caught:
        load_stack("broken", stack_file=path)
    return caught.value


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_file_validates(stack: str) -> None:
    config = load_stack(stack)
    assert config.models, "a stack deploys at least one model"
    assert config.cluster.name == f"vllm-{stack}"


def test_stack_defaults_are_filled_once_from_the_stack_name() -> None:
    config = load_stack("dev")
    model = config.models[0]
    assert config.storage.model_bucket_name == "vllm-dev-model-weights"
    assert model.api_key_secret is not None
    assert model.api_key_secret.name == f"vllm-platform/dev/{model.name}/api-key"
    assert model.ingress_host == f"{model.name}.dev.llm.example.com"


def test_gpu_groups_default_to_the_nvidia_taint() -> None:
    config = load_stack("prod")
    for group in config.node_groups.gpu.values():
        assert [str(taint) for taint in group.taints] == ["nvidia.com/gpu=true:NoSchedule"]


BAD_INPUTS: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    (
        "typo_in_a_nested_key",
        lambda c: c[MODELS][0]["vllm"].__setitem__("gpu_memory_utilisation", 0.8),
        "vllm-platform:models[0].vllm.gpu_memory_utilisation",
        "did you mean 'gpu_memory_utilization'?",
    ),
    (
        "typo_in_a_top_level_key",
        lambda c: c.__setitem__("vllm-platform:modles", []),
        "vllm-platform:modles",
        "did you mean 'models'?",
    ),
    (
        "model_name_not_dns_safe",
        lambda c: c[MODELS][0].__setitem__("name", "Qwen_7B"),
        'vllm-platform:models[0].name = "Qwen_7B"',
        "must be a DNS label",
    ),
    (
        "duplicate_model_names",
        lambda c: c[MODELS].append(copy.deepcopy(c[MODELS][0])),
        "vllm-platform:models[1].name",
        "duplicate model name (also models[0])",
    ),
    (
        "unknown_gpu_group",
        lambda c: c[MODELS][0].__setitem__("gpu_group", "h100"),
        'vllm-platform:models[0].gpu_group = "h100"',
        "node_groups.gpu defines: l40s",
    ),
    (
        "more_gpus_per_replica_than_any_node_has",
        lambda c: c[MODELS][0].__setitem__("gpus_per_replica", 2),
        "vllm-platform:models[0].gpus_per_replica = 2",
        "use at most 1 GPUs per replica or an instance type with more GPUs per node",
    ),
    (
        "gpu_memory_utilization_above_one",
        lambda c: c[MODELS][0]["vllm"].__setitem__("gpu_memory_utilization", 1.5),
        "vllm-platform:models[0].vllm.gpu_memory_utilization = 1.5",
        "must be greater than 0 and at most 1",
    ),
    (
        "gpu_memory_utilization_zero",
        lambda c: c[MODELS][0]["vllm"].__setitem__("gpu_memory_utilization", 0),
        "vllm-platform:models[0].vllm.gpu_memory_utilization = 0",
        "must be greater than 0 and at most 1",
    ),
    (
        "autoscaling_min_above_max",
        lambda c: c[MODELS][0].__setitem__(
            "autoscaling", {"enabled": True, "min_replicas": 3, "max_replicas": 2}
        ),
        "vllm-platform:models[0].autoscaling.min_replicas = 3",
        "raise max_replicas or lower min_replicas",
    ),
    (
        "node_group_min_above_max",
        lambda c: c[GROUPS]["gpu"]["l40s"].update(min_size=3, desired_size=3, max_size=2),
        "vllm-platform:node_groups.gpu.l40s.min_size = 3",
        "raise max_size",
    ),
    (
        "unknown_instance_type",
        lambda c: c[GROUPS]["gpu"]["l40s"].__setitem__("instance_types", ["g6e.2xlarg"]),
        'vllm-platform:node_groups.gpu.l40s.instance_types[0] = "g6e.2xlarg"',
        "did you mean g6e.2xlarge",
    ),
    (
        "mixed_gpu_models_in_one_group",
        lambda c: c[GROUPS]["gpu"]["l40s"].__setitem__("instance_types", ["g6e.2xlarge", "g5.2xlarge"]),
        "vllm-platform:node_groups.gpu.l40s.instance_types",
        "same GPU model (found A10G, L40S)",
    ),
    (
        "missing_source",
        lambda c: c[MODELS][0].pop("source"),
        "vllm-platform:models[0].source = (missing)",
        "required key is missing",
    ),
    (
        "source_without_location",
        lambda c: c[MODELS][0].__setitem__("source", {"revision": "main"}),
        "vllm-platform:models[0].source.s3_uri",
        "set exactly one of s3_uri",
    ),
    (
        "malformed_s3_uri",
        lambda c: c[MODELS][0].__setitem__("source", {"s3_uri": "s3://bucket-only", "revision": "r1"}),
        'vllm-platform:models[0].source.s3_uri = "s3://bucket-only"',
        "must look like s3://bucket/prefix/",
    ),
    (
        "public_endpoint_without_cidrs",
        lambda c: c["vllm-platform:cluster"].__setitem__("endpoint_public_access", True),
        "vllm-platform:cluster.public_access_cidrs",
        "needs the CIDRs allowed to reach it",
    ),
    (
        "gpu_group_without_taints",
        lambda c: c[GROUPS]["gpu"]["l40s"].__setitem__("taints", []),
        "vllm-platform:node_groups.gpu.l40s.taints = []",
        "at least 1 item",
    ),
    (
        "tuning_profile_measured_on_another_gpu",
        lambda c: c[MODELS][0]["vllm"].__setitem__("tuning_profile", "h200-throughput"),
        'vllm-platform:models[0].vllm.tuning_profile = "h200-throughput"',
        "choose a profile measured on L40S or set the vllm settings explicitly",
    ),
    (
        "untagged_preloader_image",
        lambda c: c.__setitem__(STORAGE, {"preloader_image": "registry.example.com/mirror/model-cache"}),
        'vllm-platform:storage.preloader_image = "registry.example.com/mirror/model-cache"',
        "has no tag",
    ),
    (
        "preloader_image_on_a_branch_tag",
        lambda c: c.__setitem__(STORAGE, {"preloader_image": "ghcr.io/example/model-cache:main"}),
        'vllm-platform:storage.preloader_image = "ghcr.io/example/model-cache:main"',
        "pin the image to a release version tag or a digest",
    ),
    (
        "preloader_image_with_a_short_digest",
        lambda c: c.__setitem__(STORAGE, {"preloader_image": "ghcr.io/example/model-cache@sha256:abc123"}),
        'vllm-platform:storage.preloader_image = "ghcr.io/example/model-cache@sha256:abc123"',
        "digest must be sha256: followed by 64 lowercase hex digits",
    ),
    (
        "keda_backend_without_the_keda_addon",
        lambda c: (
            c[MODELS][0].__setitem__("autoscaling", {"enabled": True, "backend": "keda"}),
            c.__setitem__("vllm-platform:addons", {"keda": False}),
        ),
        'vllm-platform:models[0].autoscaling.backend = "keda"',
        "set addons.keda: true",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "where", "fix"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_names_stack_file_key_value_and_fix(
    tmp_path: Path, case: str, mutate: Callable[[dict[str, Any]], None], where: str, fix: str
) -> None:
    error = _load_mutated(tmp_path, mutate)
    message = str(error)
    assert message.startswith(f"{tmp_path / 'Pulumi.broken.yaml'}: invalid config"), message
    assert where in message, message
    assert fix in message, message
    assert "Traceback" not in message


def test_unknown_key_error_lists_the_keys_that_would_work(tmp_path: Path) -> None:
    error = _load_mutated(tmp_path, lambda c: c[MODELS][0]["vllm"].__setitem__("max_len", 4096))
    assert "known keys here:" in str(error)
    assert "max_model_len" in str(error)


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    def two_mistakes(config: dict[str, Any]) -> None:
        config[MODELS][0]["vllm"]["gpu_memory_utilization"] = 2
        config[MODELS][0]["vllm"]["max_num_seqs"] = 0

    error = _load_mutated(tmp_path, two_mistakes)
    assert len(error.problems) == 2
    assert "(2 problems)" in str(error)


def test_missing_stack_file_is_a_config_error_not_a_traceback() -> None:
    with pytest.raises(ConfigError, match="stack file not found"):
        load_stack("does-not-exist")


def _undocumented_keys() -> list[str]:
    from domain.config.platform import PlatformConfig
    from domain.config.reference import _nested_model

    missing: list[str] = []
    seen: set[type] = set()

    def walk(model: type, prefix: str) -> None:
        for name, field in model.model_fields.items():
            inner, suffix = _nested_model(field.annotation)
            if not field.description and not (inner is not None and inner.__doc__):
                missing.append(f"{prefix}{name}")
            if inner is not None and inner not in seen:
                seen.add(inner)
                walk(inner, f"{prefix}{name}{suffix}.")

    walk(PlatformConfig, "")
    return missing


def test_every_config_key_has_a_description_for_the_reference() -> None:
    assert _undocumented_keys() == []


def test_readme_config_reference_is_generated_from_the_current_schema() -> None:
    from domain.config.reference import README, refreshed_readme

    text = README.read_text()
    assert text == refreshed_readme(text), "run: .venv/bin/python -m domain.config.reference --write"


@pytest.mark.parametrize(
    "image",
    [
        "registry.example.com/mirror/model-cache:0.1.0",
        "registry.internal:5000/ml/model-cache:v0.1.0",
        "ghcr.io/example/model-cache:0.1.0-mirror.1",
        "ghcr.io/example/model-cache@sha256:" + "0123456789abcdef" * 4,
        "ghcr.io/example/model-cache:0.1.0@sha256:" + "fedcba9876543210" * 4,
    ],
)
def test_a_mirrored_preloader_image_pinned_by_version_or_digest_is_accepted(
    tmp_path: Path, image: str
) -> None:
    document = _dev_document()
    document["config"][STORAGE] = {"preloader_image": image}
    path = tmp_path / "Pulumi.mirror.yaml"
    path.write_text(yaml.safe_dump(document))
    assert load_stack("mirror", stack_file=path).storage.preloader_image == image


def test_the_preloader_image_defaults_to_the_published_release() -> None:
    from domain.versions import MODEL_CACHE_IMAGE

    assert load_stack("dev").storage.preloader_image == MODEL_CACHE_IMAGE.reference


def _our_imports(path: Path) -> set[str]:
    """Every module of ours (`domain.*`, `components.*`, `infra.*`) a file imports, at the top or inside
    a function."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    ours = ("domain", "components", "infra")
    return {name for name in names if name in ours or name.startswith(tuple(f"{p}." for p in ours))}


def test_the_catalogue_imports_nothing_from_the_config_so_there_is_no_import_circle() -> None:
    # The config validates against the catalogue (instance types, model shapes, tuning profiles);
    # the catalogue is plain data with its schema and must not reach back (issue 27).
    catalogue = sorted((REPO_ROOT / "domain" / "catalogue").glob("*.py"))
    assert catalogue
    for path in catalogue:
        outside = {name for name in _our_imports(path) if not name.startswith("domain.catalogue")}
        assert not outside, f"{path.relative_to(REPO_ROOT)} imports {sorted(outside)}"


def _on_gpu_group(config: dict[str, Any], instance_types: list[str], **vllm: Any) -> None:
    config[GROUPS]["gpu"]["l40s"]["instance_types"] = instance_types
    config[MODELS][0]["vllm"].update(vllm)


def _loads(tmp_path: Path, mutate: Callable[[dict[str, Any]], None]):
    document = copy.deepcopy(_dev_document())
    mutate(document["config"])
    path = tmp_path / "Pulumi.edited.yaml"
    path.write_text(yaml.safe_dump(document))
    return load_stack("edited", stack_file=path)


@pytest.mark.parametrize("method", ["fp8", "fp8_per_block", "fbgemm_fp8", "modelopt"])
@pytest.mark.parametrize("instance_type", ["p4de.24xlarge", "g5.12xlarge"])  # A100, A10G
def test_fp8_weights_on_a_gpu_without_fp8_tensor_cores_are_refused(
    tmp_path: Path, method: str, instance_type: str
) -> None:
    error = _load_mutated(tmp_path, lambda c: _on_gpu_group(c, [instance_type], quantization=method))
    (problem,) = error.problems
    assert problem.key_path() == "vllm-platform:models[0].vllm.quantization"
    assert problem.value == method
    assert (
        "compute capability >= 8.9" in problem.message and "fix: remove vllm.quantization" in problem.message
    )


@pytest.mark.parametrize("instance_type", ["g6e.2xlarge", "g6.12xlarge", "p5.4xlarge"])  # L40S, L4, H100
def test_fp8_weights_on_fp8_gpus_pass(tmp_path: Path, instance_type: str) -> None:
    config = _loads(tmp_path, lambda c: _on_gpu_group(c, [instance_type], quantization="fp8"))
    assert config.models[0].vllm.quantization == "fp8"


def test_an_fp8_kv_cache_or_another_quantisation_on_a100_is_not_an_fp8_weight_problem(tmp_path: Path) -> None:
    config = _loads(tmp_path, lambda c: _on_gpu_group(c, ["p4de.24xlarge"], kv_cache_dtype="fp8"))
    assert config.models[0].vllm.kv_cache_dtype == "fp8"
    config = _loads(tmp_path, lambda c: _on_gpu_group(c, ["p4de.24xlarge"], quantization="experts_int8"))
    assert config.models[0].vllm.quantization == "experts_int8"


def test_fp8_tensor_cores_follow_the_compute_capability() -> None:
    from domain.catalogue.gpu_instances import gpu_instance_types

    gpus = {instance.gpu.name: instance.gpu for instance in gpu_instance_types().values()}
    assert {name for name, gpu in gpus.items() if gpu.fp8} == {"L4", "L40S", "H100", "H200", "B200"}
    assert {name for name, gpu in gpus.items() if not gpu.fp8} == {"A10G", "A100-40GB", "A100-80GB"}


def test_fp8_weight_methods_come_from_the_pinned_vllm_list() -> None:
    from domain.engine_checks import fp8_weight_methods, pinned_quantization_methods

    methods = fp8_weight_methods()
    assert {"fp8", "fp8_per_tensor", "fp8_per_channel", "fp8_per_block", "fbgemm_fp8", "modelopt"} <= methods
    assert methods <= set(pinned_quantization_methods())
    assert not {"awq", "awq_marlin", "gptq_marlin", "experts_int8", "compressed-tensors"} & methods
