"""What the pinned vLLM accepts of a model's engine settings: quantization methods and FP8 on its GPU,
tuning profiles, LoRA on its architecture and runtime loading, reserved served names, a checkpoint's
own quantization. Each reads the pinned vLLM's tables (infra/data/vllm-<version>-*.json)."""

from __future__ import annotations

import difflib
import json
from functools import cache

from domain.catalogue.gpu_instances import GpuInstanceType, gpu_instance_types, lookup_instance_type
from domain.catalogue.tuning_profiles import tuning_profiles
from domain.config.errors import Problem
from domain.config.platform import PlatformConfig
from domain.versions import VLLM_VERSION
from domain.vllm_flags import SNAPSHOT_DIR

QUANTIZATION_METHODS_FILE = SNAPSHOT_DIR / f"vllm-{VLLM_VERSION}-quantization-methods.json"
LORA_ARCHITECTURES_FILE = SNAPSHOT_DIR / f"vllm-{VLLM_VERSION}-lora-architectures.json"
CONTENT_PART_TYPES_FILE = SNAPSHOT_DIR / f"vllm-{VLLM_VERSION}-chat-content-part-types.json"


@cache
def pinned_quantization_methods() -> tuple[str, ...]:
    """vLLM's own list (vllm.model_executor.layers.quantization.QUANTIZATION_METHODS), snapshotted by
    scripts/snapshot-vllm-quantization.py and compared with the real vLLM by tests/e2e."""
    return tuple(json.loads(QUANTIZATION_METHODS_FILE.read_text())["methods"])


def quantization_problems(config: PlatformConfig) -> list[Problem]:
    methods = pinned_quantization_methods()
    problems = []
    for index, model in enumerate(config.models):
        method = model.vllm.quantization
        if method is None or method in methods:
            continue
        close = difflib.get_close_matches(method, methods, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        problems.append(
            Problem(
                ("models", index, "vllm", "quantization"),
                method,
                (
                    f"vLLM {VLLM_VERSION} has no quantization method '{method}': {hint}"
                    f"one of {', '.join(methods)}; or leave it unset to follow the checkpoint"
                ),
            )
        )
    return problems


def fp8_weight_methods() -> frozenset[str]:
    """The pinned vLLM's `--quantization` methods that store the linear layers' weights in FP8: every
    name with `fp8` in it (fp8 and its online shorthands fp8_per_tensor/_per_channel/_per_block,
    fbgemm_fp8, deepseek_v4_fp8, mxfp8, modelopt_mxfp8), and `modelopt`, which vLLM 0.32.0 maps to
    its ModelOptFp8Config."""
    methods = pinned_quantization_methods()
    return frozenset(m for m in methods if "fp8" in m) | frozenset({"modelopt"} & set(methods))


def _fp8_gpus() -> str:
    gpus = {instance.gpu.name: instance.gpu for instance in gpu_instance_types().values()}
    return ", ".join(name for name, gpu in gpus.items() if gpu.fp8)


def _first_gpu_without_fp8(config: PlatformConfig, gpu_group: str) -> GpuInstanceType | None:
    group = config.node_groups.gpu.get(gpu_group)
    if group is None:
        return None  # the group reference is reported by the config's own checks
    return next((instance for instance in group.gpu_instances if not instance.gpu.fp8), None)


def _fp8_weights_text(gpu_group: str, instance: GpuInstanceType) -> str:
    return (
        f"FP8 weights need FP8 tensor cores (compute capability >= 8.9: {_fp8_gpus()}); gpu_group "
        f"'{gpu_group}' runs {instance.gpu.name} ({instance.name}, "
        f"compute capability {instance.gpu.compute_capability}), where vLLM {VLLM_VERSION} falls back "
        "to weight-only FP8 (W8A16 Marlin), which it warns may degrade compute-heavy workloads"
    )


def fp8_weight_problems(config: PlatformConfig) -> list[Problem]:
    """FP8 weights (`vllm.quantization`) only on GPUs with FP8 tensor cores.

    vLLM computes in FP8 (W8A8) only from compute capability 8.9; on Ampere (A100, A10G) it starts
    anyway but keeps the activations in 16 bits (weight-only FP8 Marlin), a different kernel whose
    speed nobody here measured and that vLLM itself warns about. The stack says FP8 to gain
    throughput (the FP8 profile of issue 27 was measured W8A8 on H200), so it is refused there; an
    FP8 *checkpoint* (architecture.weight_dtype: fp8, quantization unset) is left to vLLM, since such
    a model may have no other checkpoint. `kv_cache_dtype: fp8` is a different setting (the KV
    cache's storage) and is not checked here.
    """
    fp8_methods = fp8_weight_methods()
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        method = model.vllm.quantization
        if method not in fp8_methods or _quantization_from_profile(model.vllm.tuning_profile, method):
            continue  # a profile's FP8 is reported by tuning_profile_problems, at the profile's key
        instance = _first_gpu_without_fp8(config, model.gpu_group)
        if instance is None:
            continue
        problems.append(
            Problem(
                ("models", index, "vllm", "quantization"),
                method,
                f"'{method}' quantises the weights to FP8. {_fp8_weights_text(model.gpu_group, instance)}; "
                "fix: remove vllm.quantization "
                "to serve the checkpoint's 16-bit weights, use an int4 AWQ/GPTQ checkpoint "
                "(architecture.weight_dtype: int4) to save memory, or move the model to a gpu_group of "
                "FP8 GPUs",
            )
        )
    return problems


def _quantization_from_profile(profile_name: str | None, method: str | None) -> bool:
    if profile_name is None:
        return False
    return tuning_profiles()[profile_name].setting_values().get("quantization") == method


def tuning_profile_problems(config: PlatformConfig) -> list[Problem]:
    """A platform check: a profile measured on one GPU must not silently tune a model on another, nor
    quantise weights to FP8 on a GPU without FP8 tensor cores (fp8_weight_problems)."""
    problems: list[Problem] = []
    for index, model in enumerate(config.models):
        name = model.vllm.tuning_profile
        group = config.node_groups.gpu.get(model.gpu_group)
        if name is None or group is None:
            continue  # the group reference is reported by the config's own checks
        profile = tuning_profiles()[name]
        for instance_type in group.instance_types:
            instance = lookup_instance_type(instance_type)
            if instance is not None and instance.gpu.name not in profile.gpus:
                method = profile.setting_values().get("quantization")
                fp8 = (
                    f"; it sets vllm.quantization: {method}. {_fp8_weights_text(model.gpu_group, instance)}"
                    if method in fp8_weight_methods() and not instance.gpu.fp8
                    else ""
                )
                problems.append(
                    Problem(
                        path=("models", index, "vllm", "tuning_profile"),
                        value=name,
                        message=(
                            f"profile {name!r} was measured on {', '.join(profile.gpus)}, but gpu_group "
                            f"{model.gpu_group!r} runs {instance.gpu.name} ({instance_type}){fp8}; choose "
                            f"a profile measured on {instance.gpu.name} or set the vllm settings explicitly"
                        ),
                    )
                )
                break
    return problems


@cache
def pinned_lora_architectures() -> dict[str, list[str]]:
    """Model classes by whether the pinned vLLM serves LoRA adapters on them (vLLM's `supports_lora`),
    snapshotted by scripts/snapshot-vllm-lora-architectures.py and compared with the real vLLM by
    tests/e2e."""
    return json.loads(LORA_ARCHITECTURES_FILE.read_text())


def lora_architecture_problems(config: PlatformConfig) -> list[Problem]:
    """`lora` only on a model class the pinned vLLM serves adapters for (docs/lora.md)."""
    problems = []
    for index, model in enumerate(config.models):
        if model.lora is None:
            continue
        known = pinned_lora_architectures()
        architecture_class = model.architecture.resolved().get("architecture_class")
        at = ("models", index, "architecture", "architecture_class")
        if architecture_class is None:
            problems.append(
                Problem(
                    at,
                    None,
                    (
                        "lora needs the model class, to check that vLLM serves adapters for it: set "
                        "architecture.architecture_class to config.json's architectures[0] (e.g. "
                        "LlamaForCausalLM), or use a preset"
                    ),
                )
            )
        elif architecture_class in known["no_lora"]:
            problems.append(
                Problem(
                    at,
                    architecture_class,
                    (
                        f"vLLM {VLLM_VERSION} serves no LoRA adapters on {architecture_class} (it does not "
                        "implement SupportsLoRA; the LoRA column of vLLM's supported-models page): remove "
                        "lora or serve the adapter merged into a model of its own"
                    ),
                )
            )
        elif architecture_class not in known["supports_lora"] + known["not_importable_here"]:
            # A class the CPU build cannot import (CUDA-only or image-processing dependencies) passes:
            # unknown is not "no", and the GPU image's vLLM still refuses at start if it must.
            close = difflib.get_close_matches(architecture_class, known["supports_lora"], n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            problems.append(
                Problem(
                    at,
                    architecture_class,
                    (
                        f"vLLM {VLLM_VERSION} has no model class {architecture_class} that serves LoRA "
                        f"adapters: {hint}use the name in config.json's architectures"
                    ),
                )
            )
    return problems


def runtime_loading_problems(config: PlatformConfig) -> list[Problem]:
    """`lora.runtime_loading` (with tenants it is refused by the tenants' own check): the load routes
    need the operator key (issue 34), and vLLM 0.32.0 refuses runtime loading beside more than one
    API-server process (each process would hold its own adapter list)."""
    problems = []
    for index, model in enumerate(config.models):
        if model.lora is None or not model.lora.runtime_loading or config.tenants:
            continue
        at = ("models", index, "lora", "runtime_loading")
        if model.api_server_count > 1:
            count = model.api_server_count
            why = (
                f"vllm.extra_args sets --api-server-count {count}): remove --api-server-count"
                if model.vllm.api_server_count_flag is not None
                else f"vLLM runs one per data-parallel rank, {count}): set --api-server-count 1 in "
                "vllm.extra_args"
            )
            problems.append(
                Problem(
                    at,
                    True,
                    f"vLLM {VLLM_VERSION} refuses runtime LoRA loading with more than one API-server "
                    f"process ({why}, or list the adapters in lora.adapters and set runtime_loading: false",
                )
            )
        elif config.security.operator_key_secret is None:
            problems.append(
                Problem(
                    at,
                    True,
                    "the routes that load and unload adapters answer only the operator key, and the "
                    "stack has none: set security.operator_key_secret (a secret-store reference), or "
                    "set runtime_loading: false",
                )
            )
    return problems


@cache
def pinned_content_part_types() -> tuple[str, ...]:
    """The `type`s of the pinned vLLM's chat content parts, as scripts/snapshot-vllm-routes.py read
    them from vllm.entrypoints.chat_utils (compared with the real vLLM by tests/e2e)."""
    return tuple(json.loads(CONTENT_PART_TYPES_FILE.read_text())["content_part_types"])


def reserved_served_names() -> frozenset[str]:
    """Names vLLM 0.32.0 would apply to a chat request for another name: on chat it picks an adapter
    whose name equals a content part's type cut at its first `_` (`_get_active_default_mm_loras`),
    so `text` or `image` would answer requests for the base (issue 34)."""
    types = pinned_content_part_types()
    return frozenset(types) | frozenset(t.split("_")[0] for t in types)


def reserved_served_name_problems(config: PlatformConfig) -> list[Problem]:
    reserved = reserved_served_names()
    problems = []
    for index, model in enumerate(config.models):
        base_key = "served_model_name" if model.served_model_name is not None else "name"
        names: list[tuple[tuple[str | int, ...], str]] = [
            (("models", index, base_key), model.openai_model_name)
        ]
        for position, adapter in enumerate(model.lora.adapters if model.lora else []):
            names.append((("models", index, "lora", "adapters", position, "name"), adapter.name))
        for at, name in names:
            if name in reserved:
                problems.append(
                    Problem(
                        at,
                        name,
                        f"'{name}' is a chat content-part type of vLLM {VLLM_VERSION} "
                        f"({', '.join(sorted(reserved))}): vLLM applies an adapter of that name to any chat "
                        "request with such a part, whatever model it names; choose another name",
                    )
                )
    return problems


_INT4_CHECKPOINT_METHODS = frozenset(
    {"awq", "awq_marlin", "auto_awq", "gptq", "gptq_marlin", "auto_gptq", "gptq_bitblas", "marlin"}
)
"""`--quantization` methods that read a checkpoint already quantised to 4 bits (qweight/qzeros/scales
tensors and its quantization_config); vLLM cannot apply them to 16-bit weights."""
_SIXTEEN_BIT = ("bfloat16", "float16", "float32")


def checkpoint_quantization_problems(config: PlatformConfig) -> list[Problem]:
    """`vllm.quantization` against the checkpoint's own format (architecture.weight_dtype, where the
    stack or its preset knows it): AWQ/GPTQ need an int4 checkpoint, and FP8 methods quantise 16-bit
    (or read FP8) weights, never int4 ones (issue 34)."""
    problems = []
    for index, model in enumerate(config.models):
        method = model.vllm.quantization
        checkpoint = model.architecture.resolved().get("weight_dtype")
        if (
            method is None
            or checkpoint is None
            or _quantization_from_profile(model.vllm.tuning_profile, method)
        ):
            continue
        at = ("models", index, "vllm", "quantization")
        if method in _INT4_CHECKPOINT_METHODS and checkpoint != "int4":
            problems.append(
                Problem(
                    at,
                    method,
                    f"'{method}' reads a checkpoint quantised to int4, but this checkpoint's weights are "
                    f"{checkpoint} (architecture.weight_dtype): vLLM fails at load; remove vllm.quantization "
                    "to serve the checkpoint as it is, or point source at an int4 AWQ/GPTQ checkpoint "
                    "(and set architecture.weight_dtype: int4)",
                )
            )
        elif method in fp8_weight_methods() and checkpoint not in (*_SIXTEEN_BIT, "fp8"):
            problems.append(
                Problem(
                    at,
                    method,
                    f"'{method}' quantises 16-bit weights to FP8 (or reads an FP8 checkpoint), but this "
                    f"checkpoint's weights are {checkpoint} (architecture.weight_dtype): vLLM cannot "
                    "requantise them; remove vllm.quantization to follow the checkpoint's own "
                    "quantization_config, or serve a 16-bit checkpoint",
                )
            )
    return problems
